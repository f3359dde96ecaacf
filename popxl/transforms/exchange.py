"""Exchange transforms: group host/remote transfers into one exchange, optionally on the IO tiles.

On an IPU, one merged exchange moves all its transfers in a single synchronised step. On a CPU
every transfer is a copy, so merging changes no value and no order; the grouping is recorded on
the ops (``op.exchange_group``) so programs and tools that inspect it see what PopXL would do.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Iterator, List

from popxl.context import get_current_context, in_sequence, io_tiles
from popxl.op import Op

__all__ = ["merge_exchange", "io_tile_exchange"]

EXCHANGE_OPS = ("host_load", "host_store", "remote_load", "remote_load_", "remote_store")
_groups = itertools.count(1)


@contextlib.contextmanager
def _collect() -> Iterator[List[Op]]:
    created: List[Op] = []
    ctx = get_current_context()
    handle = ctx.register_op_created_hook(created.append)
    try:
        yield created
    finally:
        ctx.remove_op_created_hook(handle)


@contextlib.contextmanager
def merge_exchange() -> Iterator[None]:
    """Merge the host and remote loads/stores created inside into one exchange. They must be free
    to reorder (create them under ``popxl.in_sequence(False)``).

    Returns:
        A context manager.
    """
    with _collect() as created:
        yield
    transfers = [op for op in created if op.type in EXCHANGE_OPS]
    if transfers:
        group = next(_groups)
        for op in transfers:
            op.exchange_group = group


@contextlib.contextmanager
def io_tile_exchange(verify_overlap: bool = True) -> Iterator[None]:
    """`merge_exchange` on the IO tiles with ``in_sequence(False)``. With ``verify_overlap``, at most
    one op other than the transfers (and ``init``) may be created inside, else RuntimeError: more
    would not overlap with compute on an IPU.

    Args:
        verify_overlap: Check that at most one other op is created inside.

    Returns:
        A context manager.

    Raises:
        RuntimeError: If ``verify_overlap`` and more than one other op was created inside.
    """
    with _collect() as created, io_tiles(), in_sequence(False), merge_exchange():
        yield
    if verify_overlap:
        others = [op for op in created if op.type not in EXCHANGE_OPS and op.type != "init"]
        if len(others) > 1:
            raise RuntimeError(
                "io_tile_exchange: more than one op besides the transfers was created inside (" +
                ", ".join(f"{op.type} {op.name!r} at {op.location}" for op in others) +
                "); such ops would not overlap with compute. Move them out, or pass verify_overlap=False.")
