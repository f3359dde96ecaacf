"""popxl-addons' quantisation ops: the decompression of 4-bit group-quantised weights, and the
choice of a float8 scaling bias from a histogram of the values' magnitudes.
"""
from __future__ import annotations

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, register
from popxl.ops.elementwise import cast
from popxl.ops.shape import concat
from popxl.ops.utils import spec
from popxl.tensor import Tensor, constant

__all__ = ["group_quantize_decompress", "fp8_mse_scale"]

_FAMILY = "addons"


# 4-bit group quantisation ------------------------------------------------------------------------------
def _decompress_infer(specs):
    t, scale, bias = specs
    what = "group_quantize_decompress"
    if len(t.shape) != 3 or t.dtype != dtypes.uint16:
        raise ValueError(f"{what}: the packed tensor must be uint16 of rank 3, (rows, groups, packed values), "
                         f"not {t.shape} {t.dtype.name}")
    want = (t.shape[0], t.shape[1], 1)
    for name, s in (("group_scale", scale), ("group_bias", bias)):
        if tuple(s.shape) != want:
            raise ValueError(f"{what}: {name} must have shape {want}, not {s.shape}")
        if not s.dtype.is_floating_point or s.dtype != scale.dtype:
            raise TypeError(f"{what}: group_scale and group_bias must be of one float dtype, not "
                            f"{scale.dtype.name} and {bias.dtype.name}")
    return [spec((t.shape[0], t.shape[1] * t.shape[2] * 4), scale.dtype)]


_NIBBLE_SHIFTS = (12, 8, 4, 0)  # the first value of each four sits in the highest bits


def _decompress_expand(op):
    t, scale, bias = op.inputs
    rows, groups, packed = t.shape

    def u16(v: int) -> Tensor:
        return constant(np.uint16(v), dtypes.uint16)

    nibbles = [create_op("bitwise_and", [create_op("bitshift_right", [t, u16(s)])[0] if s else t, u16(15)])[0]
               for s in _NIBBLE_SHIFTS]
    values = concat([n.reshape((rows, groups, packed, 1)) for n in nibbles], axis=3)
    values = cast(values.reshape((rows, groups, packed * 4)), scale.dtype)
    return (values * scale + bias).reshape((rows, groups * packed * 4))


register(OpDef("group_quantize_decompress", _decompress_infer, expand=_decompress_expand, grad=Grad.STOP,
               family=_FAMILY,
               attributes={}))


def group_quantize_decompress(t: Tensor, group_scale: Tensor, group_bias: Tensor) -> Tensor:
    """popxl-addons' ``GroupQuantizeDecompress``: 4-bit values to floats, per group ``v * scale + bias``.

    Args:
        t: (rows, groups, k) uint16, each holding four 4-bit values, the first in the highest bits.
        group_scale: (rows, groups, 1) each group's scale, a float dtype.
        group_bias: (rows, groups, 1) each group's bias, ``group_scale``'s dtype.

    Returns:
        A new (rows, groups * k * 4) tensor in ``group_scale``'s dtype.

    Raises:
        TypeError: If the scale and bias are not of one float dtype.
        ValueError: If ``t`` is not rank-3 uint16 or the shapes do not match.
    """
    return create_op("group_quantize_decompress", [t, group_scale, group_bias])[0]


# float8 scaling bias by histogram and mean squared error ----------------------------------------------
_N_LEVELS = 254  # magnitude bins bounded by 2^-126 .. 2^127
_N_BIASES = 62  # candidate scaling biases


def _fp8_infer(specs, min_fp32_exp_index, format_span, quantisation_error):
    what = "fp8_mse_scale"
    if specs[0].dtype not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"{what}: the input must be float16 or float32, not {specs[0].dtype.name}")
    for name, v in (("min_fp32_exp_index", min_fp32_exp_index), ("format_span", format_span)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _N_LEVELS:
            raise ValueError(f"{what}: {name} must be an int from 0 to {_N_LEVELS - 1}, not {v!r}")
    return [spec((), dtypes.int32)]


def _fp8_mse_scale(src, min_fp32_exp_index, format_span, quantisation_error):
    """popxl-addons' search, step for step in float32: the share of |src| in each binade
    [2^(c-126), 2^(c-125)) (c = 1 .. 253; the last bin is open above), and for each candidate
    bias b = 0 .. 61 the error of representing it: below the format's range (binades under
    min + b) each value costs its bound squared, inside it (the next ``format_span`` binades) the
    bound squared times ``quantisation_error``, above it the squared distance of its bound from the
    largest bound inside. The result is 31 - (first best b) - (number of ties) // 2."""
    levels = np.float32(2.0) ** np.arange(-126, 128, dtype=np.float32)
    # the bounds in the input's type (float16 turns the smallest into 0 and the largest into inf)
    with np.errstate(over="ignore"):
        bounds = levels.astype(src.dtype).astype(np.float64)
    counts = np.bincount(np.searchsorted(bounds, np.abs(src.astype(np.float64)).reshape(-1), side="right"),
                         minlength=_N_LEVELS + 1)
    share = (counts.astype(np.float32) / np.float32(max(src.size, 1)))[1:]
    limit = levels  # each binade's lower bound
    q = np.float32(quantisation_error)
    low, high = min_fp32_exp_index, min_fp32_exp_index + format_span
    with np.errstate(over="ignore", invalid="ignore"):
        errors = _errors(share, limit, q, low, high)
    best = errors.min()
    first = int(np.argmax(errors == best)) if not np.isnan(best) else 0
    ties = int(np.count_nonzero(errors == best))
    return np.array(31 - first - ties // 2, np.int32)


def _errors(share, limit, q, low, high):
    errors = np.zeros(_N_BIASES, np.float32)
    top = np.float32(0)  # the largest bound inside the range (kept from the previous bias, as on the IPU)
    for b in range(_N_BIASES):
        acc = np.float32(0)
        c = 1
        while c < min(low, _N_LEVELS):
            acc = np.float32(acc + share[c] * limit[c] * limit[c])
            c += 1
        while low <= c < min(high, _N_LEVELS):
            acc = np.float32(acc + share[c] * limit[c] * limit[c] * q)
            top = limit[c]
            c += 1
        while high <= c < _N_LEVELS:
            acc = np.float32(acc + share[c] * (top - limit[c]) * (top - limit[c]))
            c += 1
        errors[b] = acc
        low, high = low + 1, high + 1
    return errors


register(OpDef("fp8_mse_scale", _fp8_infer, _fp8_mse_scale, grad=Grad.STOP, family=_FAMILY,
               attributes={"min_fp32_exp_index": "int", "format_span": "int", "quantisation_error": "float"}))


def fp8_mse_scale(src: Tensor, min_fp32_exp_index: int, format_span: int, quantisation_error: float) -> Tensor:
    """popxl-addons' ``Fp8Scale``: the float8 scaling bias that represents ``src`` best.

    The bias whose squared error, estimated from a histogram of ``src``'s binades, is least
    (``Fp8FindBestScaleOp``). Not differentiable.

    Args:
        src: The values, float16 or float32.
        min_fp32_exp_index: The float8 format's lowest binade, as a float32 exponent index.
        format_span: The number of binades the format covers.
        quantisation_error: The relative squared error of a value inside the format's range.

    Returns:
        A new int32 scalar.

    Raises:
        TypeError: If ``src`` is not float16 / float32.
        ValueError: If the indices are not ints from 0 to 253.
    """
    return create_op("fp8_mse_scale", [src], {"min_fp32_exp_index": int(min_fp32_exp_index),
                                             "format_span": int(format_span),
                                             "quantisation_error": float(quantisation_error)})[0]
