"""Neural-network ops: matmul and softmax (the rest of the family arrives with the op library)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from popxl import dtypes
from popxl.op import OpDef, create_op, register
from popxl.ops.utils import broadcast_shapes, normalize_axes, same_dtype, spec
from popxl.tensor import Tensor

__all__ = ["matmul", "softmax"]


def _matmul_infer(specs, output_type, partials_type):
    a, b = specs
    dt = same_dtype(specs)
    if not (dt.is_floating_point or dt.is_int):
        raise TypeError(f"matmul needs numeric operands, got {dt.name}")
    if not a.shape or not b.shape:
        raise ValueError("matmul operands must have rank >= 1")
    sa = (1,) + a.shape if len(a.shape) == 1 else a.shape
    sb = b.shape + (1,) if len(b.shape) == 1 else b.shape
    if sa[-1] != sb[-2]:
        raise ValueError(f"contracted dimensions differ: {a.shape} @ {b.shape} ({sa[-1]} != {sb[-2]})")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    shape = batch + sa[-2:-1] + sb[-1:]
    if len(a.shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b.shape) == 1:
        shape = shape[:-1]
    return [spec(shape, output_type or dt)]


def _matmul_kernel(a, b, output_type, partials_type):
    out = np.matmul(a, b) if a.dtype.itemsize >= 4 else np.matmul(a.astype(np.float32), b.astype(np.float32))
    return out.astype(dtypes.ml_dtype(output_type) if output_type is not None else a.dtype)


register(OpDef("matmul", _matmul_infer, _matmul_kernel, family="nn"))


def matmul(lhs: Tensor, rhs: Tensor, available_memory_proportion: Optional[float] = None,
           output_type: Optional[dtypes.dtype] = None, partials_type: Optional[dtypes.dtype] = None) -> Tensor:
    """numpy.matmul semantics: batch dims broadcast, 1-D operands are promoted then squeezed."""
    if partials_type is not None and partials_type not in (dtypes.float16, dtypes.float32):
        raise ValueError(f"ops.matmul: partials_type must be float16 or float32, not {partials_type!r}")
    return create_op("matmul", [lhs, rhs], {"output_type": output_type, "partials_type": partials_type})[0]


def _softmax_infer(specs, axis):
    s = specs[0]
    if not s.dtype.is_floating_point:
        raise TypeError(f"softmax needs a floating point tensor, got {s.dtype.name}")
    return [spec(s.shape, s.dtype)]


def _softmax_kernel(x, axis):
    w = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    e = np.exp(w - np.max(w, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


register(OpDef("softmax", _softmax_infer, _softmax_kernel, family="nn"))


def softmax(t: Tensor, axis: int) -> Tensor:
    """exp(t) / sum(exp(t)) along ``axis`` (negative counts from the end)."""
    try:
        ax = normalize_axes(t.rank, axis)[0]
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.softmax: {e} (tensor {t.id!r} of shape {t.shape})") from None
    return create_op("softmax", [t], {"axis": ax})[0]
