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


def host_fp8_mse_scale(src: np.ndarray, dtype: Optional[dtypes.dtype] = None) -> Tuple[float, int]:
    """The log2 scale in [-31, 31] minimising the mean squared error of a float8 round trip.
    Returns ``(mse, scale)``. Scaling by a power of two moves values without changing their
    relative rounding while they stay normal, so several scales often tie exactly: of those, the
    middle one is taken (the data sits mid-range, with the most headroom on both sides).

    Args:
        src: The data.
        dtype: The float8 format.

    Raises:
        RuntimeError: If ``dtype`` is not a float8 type.

    Returns:
        ``(mse, scale)``: the error and the log2 scale.
    """
    dt = _check(dtype or dtypes.float8_143, _FP8, "host_fp8_mse_scale")
    x = np.asarray(src, dtype=np.float64)
    x = x[np.isfinite(x)]  # no scale helps a NaN or an infinity: choose for the others
    errors = {}
    for s in range(-31, 32):
        codes = host_pow2scale_cast_to_fp8(x, dt, s, nan_on_overflow=False)
        back = host_pow2scale_cast_from_fp8(codes, dtypes.float64, -s)
        errors[s] = float(np.mean((back - x) ** 2)) if x.size else 0.0
    best = min(errors.values())
    tied = [s for s, e in errors.items() if e == best]
    return best, tied[len(tied) // 2]


def host_fp8_mse_scale_pb(src: np.ndarray, dtype: Optional[dtypes.dtype] = None) -> int:
    """Only the scale of ``host_fp8_mse_scale``.

    Args:
        src: The data.
        dtype: The float8 format.

    Returns:
        The log2 scale.

    Raises:
        RuntimeError: If ``dtype`` is not a float8 type.
    """
    return host_fp8_mse_scale(src, dtype)[1]
