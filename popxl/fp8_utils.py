"""Host-side float8 conversions with a power-of-two scale.

``host_pow2scale_cast_to_fp8(x, dt, s)`` stores ``x * 2**s`` rounded (to nearest even) in the
float8 format; ``host_pow2scale_cast_from_fp8(c, dt, s)`` returns ``decode(c) * 2**s``. So a
round trip uses opposite signs: ``from_fp8(to_fp8(x, s), -s) ~= x``. Float8 host arrays hold the
raw codes in the structured NumPy dtype ``dtypes.float8_xxx.as_numpy()``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import ml_dtypes
import numpy as np

from popxl import dtypes

__all__ = ["host_pow2scale_cast_to_fp8", "host_pow2scale_cast_from_fp8", "host_fp8_mse_scale",
           "host_fp8_mse_scale_pb"]

_FP8 = (dtypes.float8_143, dtypes.float8_152)
_WIDE = (dtypes.float16, dtypes.float32, dtypes.float64)


def _check(dt: dtypes.dtype, allowed, what: str) -> dtypes.dtype:
    if dt not in allowed:
        raise RuntimeError(f"{what}: dtype {dt!r} is not one of {[d.name for d in allowed]}.")
    return dt


def host_pow2scale_cast_to_fp8(src: np.ndarray, dtype: Optional[dtypes.dtype] = None, log2_scale: int = 0,
                               nan_on_overflow: bool = True) -> np.ndarray:
    """``src * 2**log2_scale`` as float8 codes (structured dtype). Values beyond the format's
    range become NaN if ``nan_on_overflow``, else saturate to +-max.

    Args:
        src: float16, float32 or float64 data.
        dtype: ``popxl.float8_143`` or ``popxl.float8_152``.
        log2_scale: The power of two ``src`` is multiplied by.
        nan_on_overflow: Turn values beyond the format's range into NaN (else saturate).

    Returns:
        The float8 codes, as an array of the format's structured dtype.

    Raises:
        RuntimeError: If ``dtype`` is not a float8 type.
    """
    dt = _check(dtype or dtypes.float8_143, _FP8, "host_pow2scale_cast_to_fp8")
    src = np.asarray(src)
    if src.dtype.kind != "f":
        raise RuntimeError(f"host_pow2scale_cast_to_fp8: source must be float16/32/64, not {src.dtype}.")
    fmt = dtypes.ml_dtype(dt)
    x = src.astype(np.float64) * np.exp2(log2_scale)
    limit = float(ml_dtypes.finfo(fmt).max)
    # The formats have no infinities: an infinite (or NaN) source is NaN; a finite value beyond the
    # range is NaN or saturates, as asked.
    over = np.isfinite(x) & (np.abs(x) > limit)
    x = np.where(over, np.nan if nan_on_overflow else np.sign(x) * limit, np.where(np.isfinite(x), x, np.nan))
    codes = x.astype(fmt)
    return np.ascontiguousarray(codes).view(np.uint8).view(dt.as_numpy()).reshape(src.shape)


def host_pow2scale_cast_from_fp8(src: np.ndarray, dtype: Optional[dtypes.dtype] = None,
                                 log2_scale: int = 0) -> np.ndarray:
    """Decode float8 codes (structured or uint8) to ``dtype`` (float16/32/64, default float32),
    times ``2**log2_scale``. The float8 format is taken from the structured dtype's field name.

    Args:
        src: float8 codes (structured or uint8).
        dtype: float16, float32 or float64.
        log2_scale: The power of two the result is multiplied by.

    Returns:
        The decoded values.

    Raises:
        RuntimeError: If ``dtype`` is not float16, float32 or float64.
    """
    out_dt = _check(dtype or dtypes.float32, _WIDE, "host_pow2scale_cast_from_fp8")
    src = np.asarray(src)
    names = src.dtype.names or ()
    fmt_dt = dtypes.float8_152 if "float8_152" in names else dtypes.float8_143
    if not names and src.dtype != np.uint8:
        raise RuntimeError(f"host_pow2scale_cast_from_fp8: source must hold float8 codes, not {src.dtype}.")
    values = np.ascontiguousarray(src).view(np.uint8).view(dtypes.ml_dtype(fmt_dt)).reshape(src.shape)
    return (values.astype(np.float64) * np.exp2(log2_scale)).astype(out_dt.as_numpy())


# The scale search of host_fp8_mse_scale: a model of the squared error built from a histogram of
# the data's binades, as PopXL's host routine computes it (and as popxl-addons' Fp8Scale op does on
# the device, fp8_mse_scale).
_SCALE_LIMIT = 31  # the float8 scaling bias is a 6-bit signed value: -31 .. 31
_FP32_EXP = (-126, 127)  # float32's normal binades, which index the histogram for either source type
_FP8_FORMATS = {  # float8 format: (exponent bits, mantissa bits, exponent bias); no infinities or NaN exponent
    "float8_143": (4, 3, 8),
    "float8_152": (5, 2, 16),
}


def _fp8_binades(dt: dtypes.dtype) -> Tuple[int, int]:
    """The lowest and highest binade (power of two) a float8 format reaches unscaled, its
    subnormals included."""
    exp_bits, man_bits, bias = _FP8_FORMATS[dt.name]
    return 1 - bias - man_bits, (1 << exp_bits) - 1 - bias


def _binade_counts(x: np.ndarray) -> np.ndarray:
    """Counts of |x| per float32 binade: slot 0 holds what is below 2**-126 (zeros included), slot
    e + 126 what lies in [2**(e-1), 2**e), the last slot what exceeds 2**126 (infinities). A NaN
    has frexp exponent 0, so it counts in [0.5, 1), as in PopXL."""
    lo, hi = _FP32_EXP
    counts = np.zeros(hi - lo + 1, np.float64)
    a = np.abs(x.astype(np.float64))
    tiny, huge = a < 2.0 ** lo, a > 2.0 ** (hi - 1)
    counts[0] += np.count_nonzero(tiny)
    counts[-1] += np.count_nonzero(huge)
    _, e = np.frexp(a[~(tiny | huge)])
    np.add.at(counts, e - lo, 1)
    return counts


def host_fp8_mse_scale(src: np.ndarray, dtype: Optional[dtypes.dtype] = None) -> Tuple[float, int]:
    """The log2 scale ``s`` in [-31, 31] for which casting ``src * 2**s`` to a float8 format loses
    the least, by PopXL's estimate of the mean squared error. Returns ``(error, s)``.

    The estimate works on binades: each value counts as the lower bound ``m`` of its power-of-two
    interval. For each scaling bias ``b`` (``s = -b``), the binades the format covers after scaling
    cost ``m**2`` times the relative rounding error ``2**(-2 * (k - p))`` (``p`` the format's
    mantissa bits, ``k`` the source's: 23 for float32, 10 for float16); the binades below it cost
    ``m**2`` (flushed to zero); the binades above it cost the squared distance from the bound of
    the ``(b + span)``-th float32 binade, as PopXL computes it. Each sum runs over the binade
    shares (count / size), low binades first, in float64. Among equal errors the median bias is
    taken. An empty ``src`` gives ``(0.0, 0)``.

    Args:
        src: The data, a float16 or float32 NumPy array (the source type sets the rounding error).
        dtype: ``popxl.float8_143`` (default) or ``popxl.float8_152``.

    Returns:
        ``(error, scale)``: the estimated error and the log2 scale.

    Raises:
        RuntimeError: If ``dtype`` is not a float8 type or ``src`` is not float16 / float32.
    """
    dt = _check(dtype or dtypes.float8_143, _FP8, "host_fp8_mse_scale")
    x = np.asarray(src)
    if x.dtype not in (np.float16, np.float32):
        raise RuntimeError(f"host_fp8_mse_scale: dtype {x.dtype} not currently supported; the data must be "
                           f"float16 or float32.")
    if x.size == 0:
        return 0.0, 0
    counts = _binade_counts(x.reshape(-1))
    share = counts / counts.sum()
    lo, hi = _FP32_EXP
    bounds = [2.0 ** e for e in range(lo, hi)]  # bounds[k]: the lower bound of histogram slot k + 1
    _, man_bits, _ = _FP8_FORMATS[dt.name]
    src_bits = 23 if x.dtype == np.float32 else 10
    rounding = 2.0 ** (-2.0 * (src_bits - man_bits))
    low, high = _fp8_binades(dt)
    span = high - low + 1
    first = max(low - _SCALE_LIMIT - lo, 0)  # the first binade kept by the smallest bias
    last = min(low + _SCALE_LIMIT - lo, hi - lo)
    used = [k for k in range(len(bounds)) if share[k + 1] != 0.0]  # zero shares add exact zeros
    errors: dict = {}
    for i in range(last - first + 1):
        start = first + i
        err = (bounds[0] / 2) ** 2 if start > 0 else 0.0
        for k in used:
            w = share[k + 1]
            if k < start:
                err += bounds[k] ** 2 * w
            elif k < start + span:
                err += bounds[k] ** 2 * w * rounding
            else:
                err += (bounds[i + span - 1] - bounds[k]) ** 2 * w
        errors.setdefault(err, []).append(i - _SCALE_LIMIT)
    best = min(errors)
    tied = sorted(errors[best])
    return float(best), -tied[len(tied) // 2]


def host_fp8_mse_scale_pb(src: np.ndarray, dtype: Optional[dtypes.dtype] = None) -> int:
    """Only the scale of ``host_fp8_mse_scale``. (PopXL computes this one with Poplar's own
    scale search, whose code is not public; here both use the binade model.)

    Args:
        src: The data.
        dtype: The float8 format.

    Returns:
        The log2 scale.

    Raises:
        RuntimeError: If ``dtype`` is not a float8 type.
    """
    return host_fp8_mse_scale(src, dtype)[1]
