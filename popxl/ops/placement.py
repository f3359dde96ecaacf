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
    """Copy ``t`` to IPU ``destination``. ``source`` defaults to the IPU that produced ``t``."""
    if source is None:
        source = t.ipu
    if not isinstance(destination, int) or destination < 0:
        raise ValueError(f"ops.ipu_copy: destination must be a non-negative int, not {destination!r}.")
    with ipu(destination):
        return create_op("ipu_copy", [t], {"destination": destination, "source": int(source)})[0]


def io_tile_copy(t: Tensor) -> Tensor:
    """Copy ``t`` between the compute tiles and the IO tiles (to the other tile set)."""
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
