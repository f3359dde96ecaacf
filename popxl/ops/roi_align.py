"""``roi_align``: bilinear pooling of boxes (Mask R-CNN's RoIAlign), and its gradient."""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.fp8 import FP8
from popxl.ops.utils import op_error, per_dim_ints, spec, wide_dtype
from popxl.tensor import Tensor

__all__ = ["roi_align"]


def _roi_align_infer(specs, output_size, spatial_scale, sampling_ratio):
    x, rois, bidx = specs
    if len(x.shape) != 4:
        raise ValueError(f"t must be (N, C, H, W), got shape {x.shape}")
    if not x.dtype.is_floating_point or x.dtype in FP8:
        raise TypeError(f"t must be float16/float32/float64, got {x.dtype.name}")
    if len(rois.shape) != 2 or rois.shape[1] != 4:
        raise ValueError(f"rois must be (R, 4) boxes x1, y1, x2, y2, got shape {rois.shape}")
    if rois.dtype is not x.dtype:
        raise TypeError(f"rois must have t's dtype {x.dtype.name}, got {rois.dtype.name}")
    if bidx.shape != (rois.shape[0],) or not bidx.dtype.is_int:
        raise ValueError(f"batch_index must be ({rois.shape[0]},) integers, got {bidx.shape} {bidx.dtype.name}")
    if len(output_size) != 2 or any(v < 1 for v in output_size):
        raise ValueError(f"output_size must be two positive ints (h, w), got {output_size}")
    if sampling_ratio < 0:
        raise ValueError(f"sampling_ratio must be >= 0, got {sampling_ratio}")
    return [spec((rois.shape[0], x.shape[1]) + tuple(output_size), x.dtype)]


def _bilinear_weights(pos: np.ndarray, size: int):
    """Low/high indices and weights of 1-D linear interpolation at ``pos`` (ONNX RoiAlign edge
    rules: outside [-1, size] contributes nothing, else clamped to the border)."""
    inside = (pos >= -1.0) & (pos <= size)
    p = np.clip(pos, 0.0, size)  # a position beyond the image (weight 0) reads the border
    lo = np.minimum(np.floor(p).astype(np.int64), size - 1)
    hi = np.minimum(lo + 1, size - 1)
    p = np.where(lo >= size - 1, lo, p)
    frac = p - lo
    return lo, hi, (1.0 - frac) * inside, frac * inside


# The most bilinear samples one box may take (both sides' counts multiplied): a box of billions of
# pixels sampled adaptively would otherwise run for hours or exhaust memory.
_ROI_MAX_SAMPLES = 2 ** 26


def _samples_per_bin(opname: str, ratio: int, extent: float, bins: int, box: int) -> int:
    """Samples per bin along a side of length ``extent`` (sampling_ratio, or adaptive); huge counts
    are capped at 2**62, which the sample limit then refuses."""
    if ratio > 0:
        return ratio
    if math.isnan(extent):
        raise ValueError(f"{opname}: box {box} has NaN coordinates; adaptive sampling (sampling_ratio 0) "
                         f"needs finite boxes")
    return int(min(math.ceil(extent / bins) if math.isfinite(extent) else math.inf, 2.0 ** 62))


def _roi_samples(opname: str, roi: np.ndarray, output_size, spatial_scale: float, sampling_ratio: int, box: int,
                 x_shape: Tuple[int, ...], image: int):
    """Sample positions of box ``box`` on image ``image`` of a batch ``x_shape``: ys (ph, gh) and
    xs (pw, gw), gh/gw samples per bin and side, and the image index (negative counts from the
    end). Errors naming the op ``opname`` (with the native kernel's messages) for NaN positions,
    too many samples and images out of range."""
    ph, pw = output_size
    x1, y1, x2, y2 = (float(v) * spatial_scale for v in roi.astype(np.float64))
    rh, rw = max(y2 - y1, 1.0), max(x2 - x1, 1.0)
    gh = _samples_per_bin(opname, sampling_ratio, rh, ph, box)
    gw = _samples_per_bin(opname, sampling_ratio, rw, pw, box)
    if float(ph) * gh * pw * gw > _ROI_MAX_SAMPLES:
        raise ValueError(f"{opname}: box {box} would take {gh} x {gw} samples in each of its {ph} x {pw} bins, "
                         f"more than 2**26 in all; give a smaller sampling_ratio (0 samples adaptively, by the "
                         f"box's size)")
    n = x_shape[0]
    if not -n <= image < n:
        raise IndexError(f"{opname}: batch_index[{box}] = {image} is out of range for a batch of {n} images")
    ys = y1 + (np.arange(ph)[:, None] + (np.arange(gh)[None, :] + 0.5) / gh) * (rh / ph)
    xs = x1 + (np.arange(pw)[:, None] + (np.arange(gw)[None, :] + 0.5) / gw) * (rw / pw)
    for axis, pos, size in (("y", ys, x_shape[2]), ("x", xs, x_shape[3])):
        bad = np.isnan(pos) if size else np.ones(pos.shape, bool)
        if bad.any():
            raise IndexError(f"{opname}: box {box} samples {axis} position {pos[bad].reshape(-1)[0]:f}, outside "
                             f"the image's {size} pixels")
    return ys, xs, gh, gw, image % n


def _roi_align_kernel(x, rois, batch_index, output_size, spatial_scale, sampling_ratio):
    w = wide_dtype(x.dtype)
    xf = x.astype(w)
    _, c, height, width = x.shape
    ph, pw = output_size
    out = np.zeros((rois.shape[0], c, ph, pw), w)
    for r in range(rois.shape[0]):
        ys, xs, gh, gw, image = _roi_samples("roi_align", rois[r], output_size, spatial_scale, sampling_ratio, r,
                                             x.shape, int(batch_index[r]))
        ylo, yhi, wyl, wyh = _bilinear_weights(ys.reshape(-1), height)
        xlo, xhi, wxl, wxh = _bilinear_weights(xs.reshape(-1), width)
        img = xf[image]
        val = sum(img[:, yi][:, :, xi] * (wy[:, None] * wx[None, :]).astype(w)
                  for yi, wy in ((ylo, wyl), (yhi, wyh)) for xi, wx in ((xlo, wxl), (xhi, wxh)))
        out[r] = val.reshape(c, ph, gh, pw, gw).mean(axis=(2, 4))
    return out.astype(x.dtype)


register(OpDef("roi_align", _roi_align_infer, _roi_align_kernel, family="nn",
               attributes={"output_size": "ints", "spatial_scale": "float", "sampling_ratio": "int"}))


def roi_align(t: Tensor, rois: Tensor, batch_index: Tensor, output_size: Tuple[int, int], spatial_scale: float,
              sampling_ratio: int) -> Tensor:
    """Average RoI align: a grid of bins over each box, each bin the mean of bilinear samples.

    Boxes are multiplied by ``spatial_scale`` with no half-pixel shift (ONNX RoiAlign-10's
    behaviour) and are at least 1x1. Samples more than one pixel outside the image count as 0.

    Args:
        t: The images, (N, C, H, W).
        rois: The boxes, (R, 4) as (x1, y1, x2, y2).
        batch_index: The image of each box, (R,) integers.
        output_size: The bin grid (h, w).
        spatial_scale: The factor from box coordinates to pixel coordinates.
        sampling_ratio: Samples per bin side; 0 picks ``ceil(box size / output size)``.

    Returns:
        A new tensor (R, C, h, w) of ``t``'s dtype.

    Raises:
        TypeError: If an argument is not a Tensor.
        ValueError: If the shapes disagree, a box would take more than 2 ** 26 samples, or a tensor
            is not in the current graph.
    """
    try:
        size = per_dim_ints(output_size, 2, "output_size", -1)
        if isinstance(sampling_ratio, bool) or not isinstance(sampling_ratio, (int, np.integer)):
            raise TypeError(f"sampling_ratio must be an int, not {sampling_ratio!r}")
    except (TypeError, ValueError) as e:
        raise op_error("roi_align", e) from None
    return create_op("roi_align", [t, rois, batch_index], {"output_size": size, "spatial_scale": float(spatial_scale),
                                                            "sampling_ratio": int(sampling_ratio)})[0]


def _bin_matrix(pos: np.ndarray, size: int) -> np.ndarray:
    """(bins, size): row b averages the bilinear samples pos[b, :] of a line of ``size`` pixels."""
    bins, per_bin = pos.shape
    lo, hi, w_lo, w_hi = _bilinear_weights(pos.reshape(-1), size)
    rows = np.repeat(np.arange(bins), per_bin)
    m = np.zeros((bins, size))
    np.add.at(m, (rows, lo), w_lo / per_bin)
    np.add.at(m, (rows, hi), w_hi / per_bin)
    return m


def _roi_align_grad_kernel(x, rois, batch_index, g, output_size, spatial_scale, sampling_ratio):
    """Each box's output is A_y @ image @ A_x^T per channel (bilinear sampling and bin averaging
    are separable), so the image gradient adds A_y^T @ g @ A_x to that box's image."""
    _, _, height, width = x.shape
    dx = np.zeros(x.shape, np.float64)
    for r in range(rois.shape[0]):
        ys, xs, _, _, image = _roi_samples("roi_align_grad", rois[r], output_size, spatial_scale, sampling_ratio, r,
                                           x.shape, int(batch_index[r]))
        ay, ax = _bin_matrix(ys, height), _bin_matrix(xs, width)
        dx[image] += np.einsum("ph,cpq,qw->chw", ay, g[r].astype(np.float64), ax)
    return dx.astype(x.dtype)


register(OpDef("roi_align_grad", lambda specs, **_: [specs[0]], _roi_align_grad_kernel, grad=Grad.RAISE,
               family="nn",
               attributes={"output_size": "ints", "spatial_scale": "float", "sampling_ratio": "int"}))


@grad_rule("roi_align")
def _roi_align_grad(ctx):  # the boxes and indices get no gradient
    return [create_op("roi_align_grad", [ctx.input(0), ctx.input(1), ctx.input(2), ctx.grad(0)], ctx.attrs)[0],
            None, None]
