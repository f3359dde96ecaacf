"""Op table entries for signal processing: DFT, STFT, MelWeightMatrix and the Hann, Hamming and
Blackman windows. A DFT along one axis is a matmul with a constant matrix of cosines and sines
built in NumPy at import, so the transform length and axis must be known at import; complex values
are pairs (real, imaginary) in a trailing dimension of 2.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

import popxl
import popxl.ops as ops
from popart.onnx.table import Node, Value, _i32, _popxl_dtype_of_onnx, _prod, onnx_op


def _dft_matrix(rows: int, cols: int, length: int, complex_in: bool, complex_out: bool, inverse: bool,
                hermitian: bool) -> np.ndarray:
    """The matrix taking ``rows`` samples (pairs (re, im) when ``complex_in``, flattened) to ``cols``
    bins (pairs when ``complex_out``) of the DFT of size ``length``: bin k = sum_j x_j e^(s 2 pi i j k / length)
    with s = -1, or s = +1 and a 1/length factor when ``inverse``. ``hermitian``: the rows are the
    first half of a conjugate-symmetric spectrum, each standing for itself and its mirror (IRFFT)."""
    j = np.arange(rows)[:, None]
    k = np.arange(cols)[None, :]
    # Reduce j*k modulo length before scaling, so angles stay small and exact multiples of pi/2
    # land on exact zeros and ones after rounding off float64 noise.
    theta = 2 * np.pi * ((j * k) % length) / length
    cos, sin = np.cos(theta).round(15), np.sin(theta).round(15)
    sign = 1.0 if inverse else -1.0
    scale = np.ones((rows, 1))
    if hermitian:  # all bins but 0 and length/2 have a mirror image, which doubles their weight
        scale[1:] = 2.0
        if length % 2 == 0 and length // 2 < rows:
            scale[length // 2] = 1.0
    if inverse:
        scale = scale / length
    cos, sin = cos * scale, sin * scale
    # (a + ib)(cos + s i sin) = (a cos - s b sin) + i (b cos + s a sin)
    blocks = np.empty((rows, 2, cols, 2))
    blocks[:, 0, :, 0], blocks[:, 0, :, 1] = cos, sign * sin  # from a
    blocks[:, 1, :, 0], blocks[:, 1, :, 1] = -sign * sin, cos  # from b
    return blocks[:, :2 if complex_in else 1, :, :2 if complex_out else 1].reshape(
        rows * (2 if complex_in else 1), cols * (2 if complex_out else 1))


def _dft(n: Node, x: popxl.Tensor, axis: int, length: Optional[int], inverse: bool, onesided: bool) -> popxl.Tensor:
    """The DFT of ``x`` (trailing dimension 1: real, 2: complex) along ``axis``, zero-padded or
    truncated to ``length`` samples (None: the axis length, or 2 (m - 1) for an IRFFT of m bins).
    onesided keeps the first length // 2 + 1 bins of a forward transform; an inverse onesided
    transform (IRFFT) reads such bins and returns the real signal."""
    if not x.dtype.is_floating_point:
        raise n.fail(f"needs a floating-point input, got {x.dtype}")
    if x.rank < 2 or x.shape[-1] not in (1, 2):
        raise n.fail(f"input must have a trailing dimension of 1 (real) or 2 (complex), got shape {x.shape}")
    rank = x.rank
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise n.fail(f"axis {axis} is out of range for rank {rank} (the last dimension holds (re, im))")
    axis %= rank
    hermitian = inverse and onesided
    have = x.shape[axis]
    if length is None:
        length = 2 * (have - 1) if hermitian else have
    if length < 1:
        raise n.fail(f"dft_length must be >= 1, got {length}")
    needed = length // 2 + 1 if hermitian else length
    cols = length // 2 + 1 if onesided and not inverse else length
    used = min(have, needed)
    if used < have:  # truncation; padding is implicit, the matrix only has rows for the samples present
        x = ops.slice(x, start=0, stop=used, axis=axis)
    # Move the axis next to the (re, im) dimension and flatten the two into the matmul's inner dimension.
    perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    if perm != list(range(rank)):
        x = ops.transpose(x, tuple(perm))
    outer = tuple(x.shape[:-2])
    c_in, c_out = x.shape[-1], 1 if hermitian else 2
    m = _dft_matrix(used, cols, length, c_in == 2, c_out == 2, inverse, hermitian)
    y = ops.matmul(ops.reshape(x, (_prod(outer), used * c_in)),
                   popxl.constant(m.astype(x.dtype.as_numpy())))
    y = ops.reshape(y, outer + (cols, c_out))
    if perm != list(range(rank)):
        y = ops.transpose(y, tuple(int(p) for p in np.argsort(perm)))
    return y


@onnx_op("DFT")
def _dft_op(n: Node) -> List[Value]:
    if n.opset >= 20:
        axis = n.static_int(2, "axis", exact=True) if n.has(2) else -2
    else:
        axis = int(n.attr("axis", 1))
    length = n.static_int(1, "dft_length", exact=True) if n.has(1) else None
    return [_dft(n, n.x(0), axis, length, bool(n.attr("inverse", 0)), bool(n.attr("onesided", 0)))]


@onnx_op("STFT")
def _stft(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank != 3 or x.shape[-1] not in (1, 2):
        raise n.fail(f"signal must have shape [batch, length, 1 or 2], got {x.shape}")
    signal_length = x.shape[1]
    step = n.static_int(1, "frame_step", exact=True)
    window = n.x(2) if n.has(2) else None
    if window is not None and window.rank != 1:
        raise n.fail(f"window must be 1-D, got shape {window.shape}")
    if n.has(3):
        frame = n.static_int(3, "frame_length", exact=True)
        if window is not None and window.shape[0] != frame:
            raise n.fail(f"window length {window.shape[0]} differs from frame_length {frame}")
    else:
        frame = window.shape[0] if window is not None else signal_length
    if step < 1 or not 1 <= frame <= signal_length:
        raise n.fail(f"needs frame_step >= 1 and 1 <= frame_length <= signal length {signal_length}, "
                     f"got frame_step {step}, frame_length {frame}")
    frames = (signal_length - frame) // step + 1
    # Frame f holds samples f * step + [0, frame): one gather gives [batch, frames, frame, 1 or 2].
    index = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    y = ops.gather(x, _i32(index), 1)
    if window is not None:
        if window.dtype != x.dtype:
            raise n.fail(f"window dtype {window.dtype} differs from signal dtype {x.dtype}")
        y = ops.mul(y, ops.reshape(window, (1, 1, frame, 1)))
    return [_dft(n, y, 2, frame, False, bool(n.attr("onesided", 1)))]


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


@onnx_op("MelWeightMatrix")
def _mel_weight_matrix(n: Node) -> List[Value]:
    bands = n.static_int(0, "num_mel_bins", exact=True)
    length = n.static_int(1, "dft_length", exact=True)
    rate = n.static_int(2, "sample_rate", exact=True)
    lo, hi = n.static_float(3, "lower_edge_hertz"), n.static_float(4, "upper_edge_hertz")
    if bands < 1 or length < 1 or rate < 1 or not 0 <= lo < hi:
        raise n.fail(f"needs num_mel_bins, dft_length, sample_rate >= 1 and 0 <= lower_edge_hertz < "
                     f"upper_edge_hertz, got {bands}, {length}, {rate}, {lo}, {hi}")
    out = _popxl_dtype_of_onnx(n.attr("output_datatype", 1))
    spectrogram_bins = length // 2 + 1
    # Band edges evenly spaced in mel (bands + 2 steps between the two edges, as ONNX's reference
    # does), mapped to spectrogram bins floor((dft_length + 1) f / sample_rate).
    mel_lo, mel_hi = _hz_to_mel(np.array([lo, hi]))
    mel = mel_lo + np.arange(bands + 2) * (mel_hi - mel_lo) / (bands + 2)
    edges = np.floor((length + 1) * _mel_to_hz(mel) / rate).astype(np.int64)
    if edges[-2] >= spectrogram_bins or edges[-1] > spectrogram_bins:  # bins written: up to max(centre, right - 1)
        last = int(max(edges[-2], edges[-1] - 1))
        raise n.fail(f"the mel bands reach spectrogram bin {last}, beyond the {spectrogram_bins} bins of "
                     f"dft_length {length}: upper_edge_hertz {hi} is too high for sample_rate {rate}")
    left, centre, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    j = np.arange(spectrogram_bins)[:, None]
    # Triangles rising from left to a peak of 1 at centre, falling to 0 at right (an empty side
    # leaves just the peak).
    rising = (j - left) / np.maximum(centre - left, 1)
    falling = (right - j) / np.maximum(right - centre, 1)
    w = np.where(j == centre, 1.0, np.where((left <= j) & (j < centre), rising,
                                            np.where((centre < j) & (j < right), falling, 0.0)))
    return [w.astype(out.as_numpy())]


# windows (known at import: their only input is the length) ------------------------------------------
# Each window is sum_k (-1)^k a_k cos(2 pi k i / N) over i in [0, size), N = size when periodic
# (the window of a DFT frame) and size - 1 when symmetric.
_WINDOWS = {"HannWindow": (0.5, 0.5), "HammingWindow": (25 / 46, 21 / 46), "BlackmanWindow": (0.42, 0.5, 0.08)}


@onnx_op(*_WINDOWS)
def _window(n: Node) -> List[Value]:
    size = n.static_int(0, "size")
    if size < 0:
        raise n.fail(f"size must be >= 0, got {size}")
    out = _popxl_dtype_of_onnx(n.attr("output_datatype", 1))
    period = size if n.attr("periodic", 1) else size - 1
    i = np.arange(size, dtype=np.float64)
    w = np.zeros(size)
    for k, a in enumerate(_WINDOWS[n.op_type]):
        w += (-1) ** k * a * np.cos(2 * np.pi * k * i / period) if period else (-1) ** k * a
    return [w.astype(out.as_numpy())]
