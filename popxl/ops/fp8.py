"""The float8 family's shared pieces and the pow2-scaled casts between float8 and wider floats
(``pow2scale_cast_to_fp8`` / ``pow2scale_cast_from_fp8``); the pow2-scaled matmul and convolutions
live with their ops."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, register
from popxl.ops.utils import spec
from popxl.tensor import Tensor

__all__ = ["pow2scale_cast_to_fp8", "pow2scale_cast_from_fp8"]


FP8 = (dtypes.float8_143, dtypes.float8_152)


def check_log2_scale(s) -> None:
    if s.dtype is not dtypes.int32:
        raise TypeError(f"log2_scale must be an int32 tensor, got {s.dtype.name}")
    if math.prod(s.shape) != 1:
        raise ValueError(f"log2_scale must be a scalar, got shape {s.shape}")


def scale_value(s: np.ndarray, opname: str) -> float:
    v = int(np.asarray(s).reshape(-1)[0])
    if not -32 <= v < 32:
        raise ValueError(f"{opname}: log2_scale must be in [-32, 32), got {v}")
    return float(2.0 ** v)


def check_fp8_operands(specs) -> None:
    for i, s in enumerate(specs):
        if s.dtype not in FP8:
            raise TypeError(f"operand {i} must be float8_143 or float8_152, got {s.dtype.name}")


def _to_fp8_infer(specs, data_type):
    x, s = specs
    if data_type not in FP8:
        raise TypeError(f"data_type must be float8_143 or float8_152, not {data_type!r}")
    if not x.dtype.is_floating_point or x.dtype in FP8:
        raise TypeError(f"t must be float16/float32/float64, got {x.dtype.name}")
    check_log2_scale(s)
    return [spec(x.shape, data_type)]


def _to_fp8_kernel(x, s, data_type):
    fmt = dtypes.ml_dtype(data_type)
    v = x.astype(np.float64) * scale_value(s, "pow2scale_cast_to_fp8")
    limit = float(ml_dtypes.finfo(fmt).max)
    v = np.where(np.abs(v) > limit, np.nan, v)
    return v.astype(fmt)


def _from_fp8_infer(specs, data_type):
    x, s = specs
    if x.dtype not in FP8:
        raise TypeError(f"t must be float8_143 or float8_152, got {x.dtype.name}")
    if data_type not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"data_type must be float16 or float32, not {data_type!r}")
    check_log2_scale(s)
    return [spec(x.shape, data_type)]


def _from_fp8_kernel(x, s, data_type):
    return (x.astype(np.float64) * scale_value(s, "pow2scale_cast_from_fp8")).astype(dtypes.ml_dtype(data_type))


register(OpDef("pow2scale_cast_to_fp8", _to_fp8_infer, _to_fp8_kernel, grad=Grad.RAISE, family="nn",
               attributes={"data_type": "dtype"}))


register(OpDef("pow2scale_cast_from_fp8", _from_fp8_infer, _from_fp8_kernel, grad=Grad.RAISE, family="nn",
               attributes={"data_type": "dtype"}))


def pow2scale_cast_to_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """Scale a tensor by a power of two and round it to a float8 format.

    Rounding is to nearest, ties to even; values beyond the format's largest magnitude become NaN,
    as the host conversion does by default. Not differentiable.

    Args:
        t: A float16 or float32 tensor.
        log2_scale: A scalar int32 tensor with a value in [-32, 32): ``t`` is multiplied by
            ``2 ** log2_scale``.
        data_type: The float8 target, ``popxl.float8_143`` or ``popxl.float8_152``.

    Returns:
        A new tensor of ``t``'s shape in ``data_type``.

    Raises:
        TypeError: If ``t`` is not a Tensor, ``data_type`` is not a float8 type, or ``log2_scale``
            is not int32.
        ValueError: If ``log2_scale`` is not a scalar, or a tensor is not in the current graph.
    """
    return create_op("pow2scale_cast_to_fp8", [t, log2_scale], {"data_type": data_type})[0]


def pow2scale_cast_from_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """Decode a float8 tensor and scale it by a power of two. Not differentiable.

    Args:
        t: A float8 tensor.
        log2_scale: A scalar int32 tensor with a value in [-32, 32): the result is multiplied by
            ``2 ** log2_scale``.
        data_type: The target, ``popxl.float16`` or ``popxl.float32``.

    Returns:
        A new tensor of ``t``'s shape in ``data_type``.

    Raises:
        TypeError: If ``t`` is not a float8 Tensor, ``data_type`` is not float16 or float32, or
            ``log2_scale`` is not int32.
        ValueError: If ``log2_scale`` is not a scalar, or a tensor is not in the current graph.
    """
    return create_op("pow2scale_cast_from_fp8", [t, log2_scale], {"data_type": data_type})[0]
