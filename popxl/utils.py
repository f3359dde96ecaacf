"""Host-data helpers: conversion of user data to NumPy arrays, and table printing."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from popxl import dtypes
from popxl.fp8_utils import host_pow2scale_cast_from_fp8, host_pow2scale_cast_to_fp8  # noqa: F401 (PopXL's utils has them too)

__all__ = ["check_int_range", "to_numpy", "table_to_string", "downcast_np_dtypes"]

# 64-bit host data and the 32-bit dtype it becomes when a call downcasts (PopXL's public name).
downcast_np_dtypes = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32),
                      np.dtype(np.float64): np.dtype(np.float32)}
_DOWNCAST = downcast_np_dtypes


def to_numpy(x: Any, dtype: Optional[dtypes.dtype] = None, downcast: bool = True, copy: bool = True,
             log2_scale: Optional[int] = None, nan_on_overflow: Optional[bool] = None) -> np.ndarray:
    """Convert host data (NumPy, torch, Python scalars and lists) to a C-contiguous array.

    Without ``dtype`` and with ``downcast``, 64-bit data becomes 32-bit. With a float8 ``dtype`` the
    data (float16/32/64) is cast with ``fp8_utils.host_pow2scale_cast_to_fp8``. A C-contiguous
    ``np.memmap`` that needs no conversion is returned as is (never copied).

    Args:
        x: The host data.
        dtype: The target dtype; default inferred from ``x``.
        downcast: Turn 64-bit data into 32-bit when ``dtype`` is not given.
        copy: Always copy (False allows returning ``x`` itself when no conversion is needed).
        log2_scale: For float8 targets: the power-of-two scale applied first.
        nan_on_overflow: For float8 targets: values too large for the format become NaN.

    Returns:
        A C-contiguous NumPy array.

    Raises:
        TypeError: If a float8 target is given data that is not float16/32/64.
        RuntimeError: If ``log2_scale`` or ``nan_on_overflow`` is given for a target that is not float8.
    """
    is_fp8 = dtype in (dtypes.float8_143, dtypes.float8_152)
    if (log2_scale is not None or nan_on_overflow is not None) and not is_fp8:
        raise RuntimeError("log2_scale and nan_on_overflow only apply to float8 dtypes.")
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.memmap):
        _check_memmap_in_place(x, dtype, downcast)
        return x
    if is_fp8 and dtype is not None:
        arr = np.asarray(x)
        if arr.dtype == dtype.as_numpy():
            return arr.copy(order="C") if copy else np.ascontiguousarray(arr).reshape(arr.shape)
        if arr.dtype.kind != "f":
            raise TypeError(f"Data for a {dtype.name} tensor must be float16/32/64 (to be cast), not {arr.dtype}.")
        return host_pow2scale_cast_to_fp8(arr, dtype, log2_scale or 0,
                                          True if nan_on_overflow is None else nan_on_overflow)
    arr = np.array(x, copy=True) if copy else np.asarray(x)
    if dtype is not None:
        target = dtype.as_numpy()
    elif downcast:
        target = _DOWNCAST.get(arr.dtype, arr.dtype)
    else:
        target = arr.dtype
    if arr.dtype != target:
        check_int_range(arr, target)
        arr = arr.astype(target)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def check_int_range(arr: np.ndarray, target: Any, what: str = "the data") -> None:
    """Refuse integer data that ``target`` (an integer dtype) cannot hold: casting would wrap it
    silently (2**40 as int32 is 0).

    Args:
        arr: The data.
        target: The integer dtype it is about to be cast to.
        what: How the data is named in the error.

    Raises:
        ValueError: If a value of ``arr`` is outside ``target``'s range.
    """
    target = np.dtype(target)
    if arr.dtype.kind not in "iub" or target.kind not in "iu" or not arr.size:
        return
    info = np.iinfo(target)
    low, high = arr.min(), arr.max()
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise ValueError(f"{what} ({arr.dtype}) holds {bad}, which {target} cannot hold (from {info.min} to "
                         f"{info.max}); casting would wrap it.")


def _check_memmap_in_place(x: np.memmap, dtype: Optional[dtypes.dtype], downcast: bool) -> None:
    """A np.memmap becomes a variable's host storage as it is (never copied), so it must need no
    conversion. The messages begin as PopXL's do (its tests match them)."""
    if dtype is not None and dtype.as_numpy() != x.dtype:
        raise ValueError(f"When passing a memory-mapped NumPy array, the `dtype` parameter must be None or the "
                         f"array's own dtype ({x.dtype}), not {dtype}: the array is used in place, not converted.")
    if not (x.flags.c_contiguous and x.flags.aligned):
        raise ValueError("When passing a memory-mapped NumPy array, it must already be in C-ordered and aligned "
                         "form: the array is used in place, not copied.")
    if downcast and x.dtype in _DOWNCAST:
        raise ValueError(f"When passing a memory-mapped NumPy array, the dtype {dtype} is not supported, as it "
                         f"requires downcasting its {x.dtype} data to {_DOWNCAST[x.dtype]}; pass downcast=False "
                         f"to keep the 64-bit array in place.")


def table_to_string(rows: Sequence[Sequence[Any]], delimiter: str = " | ", header: bool = True) -> str:
    """Format rows as an aligned text table; with ``header`` the first row is underlined.

    Args:
        rows: The table's rows (the first is the header when ``header``).
        delimiter: The text between columns.
        header: Underline the first row.

    Returns:
        The table as text.
    """
    rows = [[str(c) for c in r] for r in rows]
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    lines: List[str] = []
    for n, r in enumerate(rows):
        lines.append(delimiter.join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if header and n == 0:
            lines.append(delimiter.join("-" * w for w in widths[:len(r)]))
    return "\n".join(lines)
