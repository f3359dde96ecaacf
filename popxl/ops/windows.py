"""Sliding windows over the spatial axes, shared by convolutions and pools: explicit pads from
``pad_type`` / ``auto_pad`` (ONNX's rules), output sizes, and `windows`, which pads (or crops) the
spatial axes and returns a strided view of every receptive field, ``(N, C, *out, *kernel)`` (and
its transpose, `windows_adjoint`, for the gradients). Attributes reach the kernels fully resolved:
per-dimension strides/dilations, explicit ``pads = begins + ends``."""
from __future__ import annotations

import math
from typing import Any, Literal, Sequence, Tuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

PadType = Literal["not_set", "same_upper", "same_lower", "valid"]


PAD_TYPES = ("not_set", "same_upper", "same_lower", "valid")


def check_pad_type(pad_type: Any, what: str = "pad_type") -> str:
    if pad_type is None:
        return "not_set"
    if pad_type not in PAD_TYPES:
        raise ValueError(f"{what} must be one of {PAD_TYPES}, not {pad_type!r}")
    return pad_type


def resolve_pads(sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                  pads: Sequence[int], pad_type: str) -> Tuple[int, ...]:
    """Explicit ``begins + ends`` for a convolution/pool window (ONNX auto_pad rules): "same_*"
    keeps ceil(size/stride) outputs, the odd padding element going to the end (upper) or the
    beginning (lower); "valid" pads nothing; "not_set" keeps ``pads``."""
    r = len(sizes)
    if pad_type == "not_set":
        return tuple(pads)
    if pad_type == "valid":
        return (0,) * (2 * r)
    begins, ends = [], []
    for n, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-n // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
        small = total // 2
        begins.append(small if pad_type == "same_upper" else total - small)
        ends.append(total - begins[-1])
    return tuple(begins + ends)


def out_len(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool = False) -> int:
    span = n + pb + pe - ((k - 1) * d + 1)
    if span < 0:
        raise ValueError(f"the window (kernel {k}, dilation {d}) is larger than the padded input ({n + pb + pe})")
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + pb:  # the last window would start in the end padding: drop it
        out -= 1
    return out


def out_shape(sizes, kernel, strides, dilations, pads, ceil_mode=False) -> Tuple[int, ...]:
    r = len(sizes)
    return tuple(out_len(sizes[i], kernel[i], strides[i], dilations[i], pads[i], pads[r + i], ceil_mode)
                 for i in range(r))


def windows(x: np.ndarray, kernel, strides, dilations, pads, ceil_mode: bool = False, fill: float = 0.0):
    """Every receptive field of ``x`` (N, C, *S) as a view of shape (N, C, *out, *kernel).
    Negative pads crop. Positions outside ``x`` hold ``fill``."""
    r = x.ndim - 2
    out = out_shape(x.shape[2:], kernel, strides, dilations, pads, ceil_mode)
    widths, crops = [(0, 0), (0, 0)], [slice(None), slice(None)]
    for i in range(r):
        n, pb = x.shape[2 + i], pads[i]
        need = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1  # padded length used
        pe = need - n - pb
        widths.append((max(pb, 0), max(pe, 0)))
        crops.append(slice(max(-pb, 0), n - max(-pe, 0)))
    x = x[tuple(crops)]
    if any(w != (0, 0) for w in widths):
        x = np.pad(x, widths, constant_values=np.asarray(fill, dtype=x.dtype))
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    v = sliding_window_view(x, eff, axis=tuple(range(2, 2 + r)))
    return v[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
             + tuple(slice(None, None, d) for d in dilations)]


def windows_adjoint(dwin: np.ndarray, x_shape: Tuple[int, ...], kernel, strides, dilations, pads,
                     ceil_mode: bool = False) -> np.ndarray:
    """The transpose of `windows`: adds every window element back onto the input position it was
    read from (padding positions are dropped). Works for any pads/crops by taking the windows of
    an array of flat positions (0 marks padding)."""
    positions = np.arange(1, math.prod(x_shape) + 1, dtype=np.int64).reshape(x_shape)
    where = windows(positions, kernel, strides, dilations, pads, ceil_mode, fill=0)
    hit = where > 0
    out = np.zeros(math.prod(x_shape), dwin.dtype)
    np.add.at(out, where[hit] - 1, dwin[hit])
    return out.reshape(x_shape)


# How a windowed op's 4-D operands lie in memory (its ``layouts`` attribute, native engine only):
# NCHW, or channels-last where only such ops read and write the tensor (keep_channels_last).
LAYOUTS = ("nchw", "nhwc")
