"""Copies between IPUs and between tile sets. On one host these move no data between devices,
but they are real copies: the result is a new tensor placed where it was asked to be."""
from __future__ import annotations

from typing import Optional

from popxl.context import get_current_context, io_tiles, ipu
from popxl.op import Grad, OpDef, create_op, register
from popxl.ops.utils import spec
from popxl.tensor import Tensor

__all__ = ["io_tile_copy", "ipu_copy"]


def _copy_infer(specs, **_):
    s = specs[0]
    return [spec(s.shape, s.dtype, s.meta_shape)]


register(OpDef("ipu_copy", _copy_infer, lambda x, destination, source: x.copy(), view=lambda x, **_: x, copy=True,
               grad=Grad.STOP, family="placement"))
register(OpDef("io_tile_copy", _copy_infer, lambda x, to_io: x.copy(), view=lambda x, **_: x, copy=True,
               grad=Grad.STOP, family="placement"))


def ipu_copy(t: Tensor, destination: int, source: Optional[int] = None) -> Tensor:
    """Copy a tensor to another (virtual) IPU. Not differentiable.

    Args:
        t: The tensor copied.
        destination: The IPU the copy lives on.
        source: The IPU ``t`` lives on; default the IPU of the op that produced it.

    Returns:
        A new tensor equal to ``t``, placed on ``destination``.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``destination`` is not a non-negative int, or ``t`` is not in the current graph.
    """
    if source is None:
        source = t.ipu
    if not isinstance(destination, int) or destination < 0:
        raise ValueError(f"ops.ipu_copy: destination must be a non-negative int, not {destination!r}.")
    with ipu(destination):
        return create_op("ipu_copy", [t], {"destination": destination, "source": int(source)})[0]


def io_tile_copy(t: Tensor) -> Tensor:
    """Copy a tensor between the compute tiles and the IO tiles. Not differentiable.

    Args:
        t: The tensor copied.

    Returns:
        A new tensor equal to ``t``, on the other tile set.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    to_io = t.tile_set != "io"
    if to_io:
        with io_tiles():
            return create_op("io_tile_copy", [t], {"to_io": True})[0]
    ctx = get_current_context()
    prev, ctx.io_tile_set = ctx.io_tile_set, False
    try:
        return create_op("io_tile_copy", [t], {"to_io": False})[0]
    finally:
        ctx.io_tile_set = prev
