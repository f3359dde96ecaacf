"""Op table entries for sampling and (un)folding: GridSample, RoiAlign, MaxUnpool, Col2Im. Each reads
values at positions computed on the device (GridSample, RoiAlign) or known at import (MaxUnpool's
output layout, Col2Im's index map) with one flat-row gather or scatter: the input is viewed as
[positions, channels] so a single popxl gather / scatter_reduce along axis 0 does the work.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes
from popart.onnx.elementwise import _less, _round_half_even
from popart.onnx.indexing import _scatter_rows
from popart.onnx.nn import _kernel_shape
from popart.onnx.table import Node, Value, _as_int32, _i32, _prod, _scalar, _stack, _strides, onnx_op
from popart.rounding import _c, _f32  # coordinates and weights are computed in float32


# shared: positions-major views and coordinate helpers -------------------------------------------------
def _rows_view(x: popxl.Tensor) -> popxl.Tensor:
    """(N, C, *D) viewed as (N * prod(D), C): one row per position, so a gather of rows reads
    every channel at once."""
    nb, c = x.shape[:2]
    perm = (0,) + tuple(range(2, x.rank)) + (1,)
    return ops.reshape(ops.transpose(x, perm), (nb * _prod(x.shape[2:]), c))


def _to_index(v: popxl.Tensor) -> popxl.Tensor:
    """An integer-valued float tensor as int32 (rounded first: reflections carry tiny float error)."""
    return ops.cast(ops.floor(ops.add(v, _c(0.5))), dtypes.int32)


def _outside(v: popxl.Tensor, lo: float, hi: float) -> popxl.Tensor:
    return ops.logical_or(_less(v, _c(lo)), ops.greater(v, _c(hi)))


def _reflect(v: popxl.Tensor, lo: float, hi: float) -> popxl.Tensor:
    """``v`` mirrored at ``lo`` and ``hi`` until it lies between them: the reflection is periodic
    with period 2 (hi - lo), and within one period it is the tent lo + span - |m - span|."""
    span = hi - lo
    if span <= 0:  # a one-pixel axis with align_corners: everything reflects onto it
        return ops.add(ops.mul(v, _c(0.0)), _c(lo))
    period = _c(2 * span)
    t = ops.sub(v, _c(lo))
    m = ops.sub(t, ops.mul(ops.floor(ops.div(t, period)), period))
    return ops.sub(_c(lo + span), ops.abs(ops.sub(m, _c(span))))


# GridSample -----------------------------------------------------------------------------------------
# Modes by opset: opset 16 names them bilinear/bicubic and is 4-D only; opset 20 renamed them and
# allowed any number of spatial dimensions.
_GRID_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_GRID_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}
_CUBIC_A = -0.75  # the Keys cubic kernel parameter GridSample (like PyTorch) uses


def _cubic_weights(f: popxl.Tensor) -> List[popxl.Tensor]:
    """Weights of the taps at distances 1 + f, f, 1 - f, 2 - f from the sample (0 <= f < 1)."""
    a = _CUBIC_A

    def near(d: popxl.Tensor) -> popxl.Tensor:  # |d| <= 1: (a + 2) d^3 - (a + 3) d^2 + 1
        return ops.add(ops.mul(ops.mul(d, d), ops.sub(ops.mul(_c(a + 2), d), _c(a + 3))), _c(1.0))

    def far(d: popxl.Tensor) -> popxl.Tensor:  # 1 < |d| < 2: a d^3 - 5a d^2 + 8a d - 4a
        return ops.sub(ops.mul(ops.add(ops.mul(ops.sub(ops.mul(_c(a), d), _c(5 * a)), d), _c(8 * a)), d),
                       _c(4 * a))

    one = _c(1.0)
    return [far(ops.add(one, f)), near(f), near(ops.sub(one, f)), far(ops.sub(_c(2.0), f))]


def _grid_taps(u: popxl.Tensor, size: int, mode: str, padding: str, align: bool
               ) -> Tuple[List[popxl.Tensor], Optional[List[popxl.Tensor]], Optional[List[popxl.Tensor]]]:
    """Along one spatial axis of length ``size``: the taps of each sample at pixel coordinate
    ``u`` as (indices, weights, in-range masks), one entry per tap (weights None for nearest,
    masks None unless padding is zeros)."""
    # The valid coordinate range: pixel centres with align_corners, else pixel edges.
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        u = _round_half_even(u)
    if padding == "border":
        u = ops.where(_outside(u, lo, hi), ops.clip(u, 0.0, size - 1.0), u)
    elif padding == "reflection":
        u = ops.where(_outside(u, lo, hi), _reflect(u, lo, hi), u)
    weights: Optional[List[popxl.Tensor]] = None
    if mode == "nearest":
        positions = [u]
    else:
        base = ops.floor(u)
        f = ops.sub(u, base)
        if mode == "linear":
            positions, weights = [base, ops.add(base, _c(1.0))], [ops.sub(_c(1.0), f), f]
        else:
            positions = [ops.add(base, _c(float(k))) for k in (-1, 0, 1, 2)]
            weights = _cubic_weights(f)
    # Taps that fall off the image read the padding: 0 (masked), the border, or the reflection.
    masks = [ops.logical_not(_outside(p, -0.5, size - 0.5)) for p in positions] if padding == "zeros" else None
    if padding == "reflection":
        positions = [ops.where(_outside(p, lo, hi), _reflect(p, lo, hi), p) for p in positions]
    indices = [_to_index(ops.clip(p, 0.0, size - 1.0)) for p in positions]
    return indices, weights, masks


def _stack_taps(taps: Sequence[popxl.Tensor], axis: int, rank: int) -> popxl.Tensor:
    """The taps of one spatial axis stacked on a leading axis placed at ``axis`` of ``rank``
    leading tap axes, so that the axes' taps combine by broadcasting."""
    return ops.reshape(_stack(taps), (1,) * axis + (len(taps),) + (1,) * (rank - axis - 1) + taps[0].shape)


@onnx_op("GridSample")
def _grid_sample(n: Node) -> List[Value]:
    x, grid = n.x(0), n.x(1)
    names = _GRID_MODES_20 if n.opset >= 20 else _GRID_MODES_16
    mode_attr = n.attr("mode", "linear" if n.opset >= 20 else "bilinear")
    if mode_attr not in names:
        raise n.fail(f"mode must be one of {list(names)} at opset {n.opset}, got {mode_attr!r}")
    mode = names[mode_attr]
    padding = n.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise n.fail(f"padding_mode must be 'zeros', 'border' or 'reflection', got {padding!r}")
    align = bool(n.attr("align_corners", 0))
    r = x.rank - 2
    if r < 1 or (n.opset < 20 and r != 2):
        raise n.fail(f"X must be (N, C, H, W){'' if n.opset < 20 else ' or have more spatial dimensions'}, "
                     f"got shape {x.shape}")
    if not x.dtype.is_floating_point:
        raise n.fail(f"X must be a float tensor, got {x.dtype.name}")
    nb, spatial, out = x.shape[0], x.shape[2:], grid.shape[1:-1]
    if grid.rank != r + 2 or grid.shape[0] != nb or grid.shape[-1] != r:
        raise n.fail(f"grid must have shape (N={nb}, *out, {r}) for X of shape {x.shape}, got {grid.shape}")
    g, one = _f32(grid), _c(1.0)
    strides = _strides(spatial)
    # Per spatial axis k of X: grid component r - 1 - k (the grid lists x (width) first).
    index, weight, mask = None, None, None
    for k, size in enumerate(spatial):
        comp = ops.reshape(ops.slice(g, start=r - 1 - k, stop=r - k, axis=grid.rank - 1), (nb,) + tuple(out))
        # Normalised [-1, 1] to pixel coordinates: onto the corner centres, or the corner edges.
        u = (ops.mul(ops.add(comp, one), _c((size - 1) / 2.0)) if align
             else ops.div(ops.sub(ops.mul(ops.add(comp, one), _c(float(size))), one), _c(2.0)))
        idx, ws, ms = _grid_taps(u, size, mode, padding, align)
        term = ops.mul(_stack_taps(idx, k, r), _i32(strides[k]))
        index = term if index is None else ops.add(index, term)
        if ws is not None:
            w = _stack_taps(ws, k, r)
            weight = w if weight is None else ops.mul(weight, w)
        if ms is not None:
            m = _stack_taps(ms, k, r)
            mask = m if mask is None else ops.logical_and(mask, m)
    assert index is not None, "X has a spatial axis (checked above)"
    # Each batch item reads its own image: add the first row of image n.
    batch = np.arange(nb, dtype=np.int64).reshape((nb,) + (1,) * len(out)) * _prod(spatial)
    index = ops.add(index, _i32(batch))
    taps = _prod(index.shape[:r])
    flat_shape = (taps, nb) + tuple(out)
    vals = ops.gather(_rows_view(x), ops.reshape(index, flat_shape), 0)  # (taps, N, *out, C)
    # Every spatial axis contributes to the index, weights and mask alike, so all three have the
    # full shape (taps per axis,) * r + (N, *out).
    if mask is not None:  # zeros padding: taps off the image read 0 (whatever the clamped row holds)
        vals = ops.where(ops.reshape(mask, flat_shape + (1,)), vals, _scalar(0.0, vals))
    if weight is None:
        y = ops.reshape(vals, vals.shape[1:])
    else:
        y = ops.sum(ops.mul(_f32(vals), ops.reshape(weight, flat_shape + (1,))), 0)
        y = y if y.dtype == x.dtype else ops.cast(y, x.dtype)
    # (N, *out, C) -> (N, C, *out)
    return [ops.transpose(y, (0, r + 1) + tuple(range(1, r + 1)))]


# RoiAlign -------------------------------------------------------------------------------------------
def _roi_axis_taps(start: popxl.Tensor, extent: popxl.Tensor, bins: int, grid: int, size: int
                   ) -> Tuple[popxl.Tensor, popxl.Tensor, popxl.Tensor, popxl.Tensor]:
    """Bilinear taps of the samples along one axis of every box: ``grid`` regularly spaced samples
    in each of ``bins`` bins of the box [start, start + extent) (both (R,)). Returns (low index,
    high index, low weight, high weight), each (R, bins * grid). A sample more than one pixel off
    the image contributes nothing; otherwise it is clamped onto the image."""
    offsets = ((np.arange(bins)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid) / bins).reshape(-1)
    count = start.shape[0]
    pos = ops.add(ops.reshape(start, (count, 1)),
                  ops.mul(ops.reshape(extent, (count, 1)), popxl.constant(offsets.astype(np.float32)[None, :])))
    inside = ops.logical_not(_outside(pos, -1.0, float(size)))
    pos = ops.clip(pos, 0.0, math.inf)
    low = ops.clip(ops.floor(pos), 0.0, size - 1.0)
    # At or past the last pixel both taps are that pixel, at the pixel itself.
    pos = ops.where(ops.logical_not(_less(low, _c(size - 1.0))), low, pos)
    frac = ops.where(inside, ops.sub(pos, low), _c(0.0))
    w_low = ops.where(inside, ops.sub(_c(1.0), frac), _c(0.0))
    high = ops.clip(ops.add(low, _c(1.0)), 0.0, size - 1.0)
    return _to_index(low), _to_index(high), w_low, frac


def _roi_align_composed(x: popxl.Tensor, rois: popxl.Tensor, batch: popxl.Tensor, out_hw: Tuple[int, int],
                        grid_hw: Tuple[int, int], scale: float, half_pixel: bool, mode: str) -> popxl.Tensor:
    """RoiAlign for boxes sharing one sampling grid (``grid_hw`` samples per bin and side): every
    sample's four bilinear taps are gathered from the (N * H * W, C) rows of ``x``."""
    _, _, h, w = x.shape
    (ph, pw), (gh, gw) = out_hw, grid_hw
    nr = rois.shape[0]
    box = ops.mul(_f32(rois), _c(scale))
    if half_pixel:
        box = ops.sub(box, _c(0.5))
    corner = [ops.reshape(ops.slice(box, start=k, stop=k + 1, axis=1), (nr,)) for k in range(4)]  # x1 y1 x2 y2
    extent_w, extent_h = ops.sub(corner[2], corner[0]), ops.sub(corner[3], corner[1])
    if not half_pixel:  # the legacy mode makes every box at least one pixel
        extent_w, extent_h = ops.maximum(extent_w, _c(1.0)), ops.maximum(extent_h, _c(1.0))
    ylo, yhi, wyl, wyh = _roi_axis_taps(corner[1], extent_h, ph, gh, h)
    xlo, xhi, wxl, wxh = _roi_axis_taps(corner[0], extent_w, pw, gw, w)
    first = ops.reshape(ops.mul(_as_int32(batch), _i32(h * w)), (nr, 1, 1))
    table = _rows_view(x)
    terms = []
    for yi, wy in ((ylo, wyl), (yhi, wyh)):
        for xi, wx in ((xlo, wxl), (xhi, wxh)):
            rows = ops.add(first, ops.add(ops.reshape(ops.mul(yi, _i32(w)), (nr, ph * gh, 1)),
                                          ops.reshape(xi, (nr, 1, pw * gw))))
            weight = ops.mul(ops.reshape(wy, (nr, ph * gh, 1, 1)), ops.reshape(wx, (nr, 1, pw * gw, 1)))
            terms.append(ops.mul(_f32(ops.gather(table, rows, 0)), weight))  # (R, ph*gh, pw*gw, C)
    c = x.shape[1]
    if mode == "avg":
        y = ops.add(ops.add(terms[0], terms[1]), ops.add(terms[2], terms[3]))
        y = ops.reshape(y, (nr, ph, gh, pw, gw, c))
        y = ops.div(ops.sum(y, [2, 4]), _c(float(gh * gw)))
    else:
        # ONNX's max mode (as onnxruntime): the largest weighted tap of each sample, then the
        # largest sample of each bin.
        y = ops.reshape(ops.maximum(*terms), (nr, ph, gh, pw, gw, c))
        y = ops.max(y, [2, 4])
    y = ops.transpose(y, (0, 3, 1, 2))
    return y if y.dtype == x.dtype else ops.cast(y, x.dtype)


def _adaptive_grid(rois: np.ndarray, out_hw: Tuple[int, int], scale: float, half_pixel: bool) -> List[Tuple[int, int]]:
    """sampling_ratio 0: each box's samples per bin and side, ceil(box size / bins), in float32 as
    onnxruntime computes it."""
    box = rois.astype(np.float32) * np.float32(scale)
    ext = np.stack([box[:, 3] - box[:, 1], box[:, 2] - box[:, 0]], 1)
    if not half_pixel:
        ext = np.maximum(ext, np.float32(1.0))
    g = np.ceil(ext / np.asarray(out_hw, np.float32)).astype(np.int64)
    return [(int(a), int(b)) for a, b in g]


@onnx_op("RoiAlign")
def _roi_align(n: Node) -> List[Value]:
    x, rois, batch = n.x(0), n.x(1), n.x(2)
    mode = n.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise n.fail(f"mode must be 'avg' or 'max', got {mode!r}")
    # The attribute arrived in opset 16 (default half_pixel); before, boxes were not shifted.
    ctm = n.attr("coordinate_transformation_mode", "half_pixel") if n.opset >= 16 else "output_half_pixel"
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise n.fail(f"coordinate_transformation_mode must be 'half_pixel' or 'output_half_pixel', got {ctm!r}")
    out_hw = (int(n.attr("output_height", 1)), int(n.attr("output_width", 1)))
    ratio = int(n.attr("sampling_ratio", 0))
    scale = float(n.attr("spatial_scale", 1.0))
    if x.rank != 4 or not x.dtype.is_floating_point:
        raise n.fail(f"X must be a float (N, C, H, W) tensor, got {x.dtype.name} {x.shape}")
    if rois.rank != 2 or rois.shape[1] != 4 or tuple(batch.shape) != (rois.shape[0],):
        raise n.fail(f"rois must be (R, 4) and batch_indices (R,), got {rois.shape} and {batch.shape}")
    if min(out_hw) < 1 or ratio < 0:
        raise n.fail(f"output_height/width must be >= 1 and sampling_ratio >= 0, got {out_hw} and {ratio}")
    half_pixel = ctm == "half_pixel"
    if mode == "avg" and not half_pixel:
        # popxl's roi_align is exactly this form (boxes unshifted and at least one pixel).
        r = rois if rois.dtype == x.dtype else ops.cast(rois, x.dtype)
        return [ops.roi_align(x, r, _as_int32(batch), out_hw, scale, ratio)]
    if ratio > 0:
        return [_roi_align_composed(x, rois, batch, out_hw, (ratio, ratio), scale, half_pixel, mode)]
    # An adaptive grid depends on each box's size, so the boxes must be known at import.
    static = n.imp.static(n.proto.input[1])
    if static is None:
        raise n.fail(f"sampling_ratio 0 (adaptive) with mode {mode!r} and {ctm} needs rois known at import")
    grids = _adaptive_grid(np.asarray(static), out_hw, scale, half_pixel)
    if len(set(grids)) == 1 and min(grids[0]) > 0:
        return [_roi_align_composed(x, rois, batch, out_hw, grids[0], scale, half_pixel, mode)]
    parts: List[popxl.Tensor] = []
    for i, g in enumerate(grids):  # boxes with different grids: one at a time
        if min(g) == 0:  # an empty box (half_pixel) has no samples: its bins are 0
            parts.append(popxl.constant(np.zeros((1, x.shape[1]) + out_hw, x.dtype.as_numpy())))
            continue
        one = [ops.slice(t, start=i, stop=i + 1, axis=0) for t in (rois, batch)]
        parts.append(_roi_align_composed(x, one[0], one[1], out_hw, g, scale, half_pixel, mode))
    return [ops.concat(parts, 0)]


# MaxUnpool ------------------------------------------------------------------------------------------
@onnx_op("MaxUnpool")
def _max_unpool(n: Node) -> List[Value]:
    x = n.x(0)
    kernel = _kernel_shape(n)
    r = len(kernel)
    strides = n.ints("strides", [1] * r)
    pads = n.ints("pads", [0] * (2 * r))
    if x.rank != r + 2 or len(strides) != r or len(pads) != 2 * r:
        raise n.fail(f"X {x.shape} must have {r} spatial dimensions, one per kernel_shape, strides and "
                     f"pads begin/end value")
    if tuple(n.shape(1)) != tuple(x.shape):
        raise n.fail(f"indices must have the shape of X {x.shape}, got {n.shape(1)}")
    # The shape MaxPool would have been given: the unpooled values' flat indices count in it.
    pooled_from = tuple(x.shape[:2]) + tuple(s * (d - 1) + k - pads[i] - pads[i + r]
                                             for i, (d, k, s) in enumerate(zip(x.shape[2:], kernel, strides)))
    if min(pooled_from) < 1:
        raise n.fail(f"kernel_shape {kernel}, strides {strides} and pads {pads} give an empty output")
    out = pooled_from
    if n.has(2):
        out = tuple(n.static_ints(2, "output_shape"))
        if len(out) != x.rank or out[:2] != pooled_from[:2] or any(o < p for o, p in zip(out, pooled_from)):
            raise n.fail(f"output_shape {list(out)} must keep N, C of X and be at least {list(pooled_from)}")
    # MaxPool's indices are flat positions in that whole tensor (batch and channel included).
    zeros = popxl.constant(np.zeros((_prod(pooled_from), 1), x.dtype.as_numpy()))
    rows = ops.reshape(_as_int32(n.x(1)), (x.nelms,))
    y = ops.reshape(_scatter_rows(zeros, rows, ops.reshape(x, (x.nelms, 1)), "none"), pooled_from)
    # A larger output_shape keeps each value's coordinates: the extra places, at the end of each
    # spatial axis, are 0 (as onnxruntime and ONNX's own tests have it).
    return [_zero_extend(y, out)]


def _zero_extend(y: popxl.Tensor, shape: Tuple[int, ...]) -> popxl.Tensor:
    """``y`` with zeros appended along each axis up to ``shape``."""
    for axis, (have, want) in enumerate(zip(y.shape, shape)):
        if want > have:
            extra = tuple(want - have if a == axis else d for a, d in enumerate(y.shape))
            y = ops.concat([y, popxl.constant(np.zeros(extra, y.dtype.as_numpy()))], axis)
    return y


# Col2Im ---------------------------------------------------------------------------------------------
@onnx_op("Col2Im")
def _col2im(n: Node) -> List[Value]:
    x = n.x(0)
    image, block = n.static_ints(1, "image_shape"), n.static_ints(2, "block_shape")
    r = len(image)
    dil = n.ints("dilations", [1] * r)
    strides = n.ints("strides", [1] * r)
    pads = n.ints("pads", [0] * (2 * r))
    if r < 1 or len(block) != r or len(dil) != r or len(strides) != r or len(pads) != 2 * r:
        raise n.fail(f"image_shape {image}, block_shape {block}, dilations, strides and pads must all "
                     f"have one value (pads two) per spatial dimension")
    if min(image + block + dil + strides) < 1 or min(pads) < 0:
        raise n.fail("image_shape, block_shape, dilations and strides must be positive and pads non-negative")
    padded = [image[i] + pads[i] + pads[i + r] for i in range(r)]
    counts = [(padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(r)]
    k, l = _prod(block), _prod(counts)
    if x.rank != 3 or x.shape[1] % k or x.shape[2] != l or min(counts) < 1:
        raise n.fail(f"input must be (N, C * {k}, {l}) for block_shape {block} and {counts} blocks, "
                     f"got {x.shape}")
    nb, c = x.shape[0], x.shape[1] // k
    # Column (block offset b, block l) lands at padded position l * stride + b * dilation per axis.
    offset = np.indices(block).reshape(r, k)
    start = np.indices(counts).reshape(r, l)
    pos = (offset[:, :, None] * np.asarray(dil)[:, None, None] + start[:, None, :] * np.asarray(strides)[:, None, None])
    target = np.tensordot(_strides(padded), pos, 1).reshape(k * l)  # flat padded position of each (b, l)
    cols = ops.transpose(ops.reshape(x, (nb * c, k * l)), (1, 0))  # (K * L, N * C)
    img = ops.scatter_reduce(cols, _i32(target), "sum", axis=0, axis_size=_prod(padded))
    img = ops.reshape(ops.transpose(img, (1, 0)), (nb, c) + tuple(padded))
    if any(pads):
        img = ops.slice(img, start=pads[:r], stop=[pads[i] + image[i] for i in range(r)], axis=list(range(2, 2 + r)))
    return [img]
