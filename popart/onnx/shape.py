"""ONNX entries of the shape and data-movement ops: Shape, Size, Reshape and the other views,
Concat, Split, Slice, Expand, Tile, Pad, Resize, DepthToSpace / SpaceToDepth, Trilu, EyeLike and
CenterCropPad."""
from __future__ import annotations

import math
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx

import popxl
import popxl.ops as ops
from popxl import dtypes
from popart.onnx.elementwise import _less
from popart.onnx.table import OPS, Entry, Node, Value, _axis, _prod, onnx_fold, onnx_op

__all__: List[str] = []


# shapes and data movement -----------------------------------------------------------------------------
@onnx_op("Shape")
def _shape(n: Node) -> List[Value]:
    s = np.asarray(n.shape(0), np.int64)
    if n.opset >= 15:
        start, end = n.attr("start", 0), n.attr("end")
        s = s[slice(start, end)]
    return [s]


@onnx_op("Size")
def _size(n: Node) -> List[Value]:
    return [np.asarray(_prod(n.shape(0)), np.int64)]


def _import_time_only(n: Node) -> List[Value]:
    # Reached only when an input is computed on the device: the importer folds the static case.
    raise n.fail("its inputs must be known at import (constants, initializers or shapes)")


for _t in ("Constant", "ConstantOfShape", "Range"):
    OPS[_t] = Entry(_import_time_only)


@onnx_op("Reshape")
def _reshape(n: Node) -> List[Value]:
    x = n.x(0)
    shape = n.static_ints(1, "shape")
    allowzero = n.opset >= 14 and n.attr("allowzero", 0)
    if not allowzero:
        if any(d == 0 and i >= x.rank for i, d in enumerate(shape)):
            raise n.fail(f"shape {shape} copies (0) a dimension beyond the input's rank {x.rank}")
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if shape.count(-1) > 1:
        raise n.fail(f"shape {shape} has more than one -1")
    if -1 in shape:
        known = _prod([d for d in shape if d != -1])
        if known == 0 or x.nelms % known:
            raise n.fail(f"cannot reshape {x.shape} to {shape}")
        shape[shape.index(-1)] = x.nelms // known
    return [ops.reshape(x, tuple(shape))]


@onnx_op("Flatten")
def _flatten(n: Node) -> List[Value]:
    x = n.x(0)
    axis = int(n.attr("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise n.fail(f"axis {axis} is out of range for rank {x.rank}")
    lead = _prod(x.shape[:axis])
    return [ops.reshape(x, (lead, _prod(x.shape[axis:])))]


def _unsqueezed_shape(shape: Sequence[int], axes: Sequence[int], n: Node) -> Tuple[int, ...]:
    out_rank = len(shape) + len(axes)
    axes = sorted(_axis(a, out_rank, n, "axes") for a in axes)
    if len(set(axes)) != len(axes):
        raise n.fail(f"axes {axes} repeat an axis")
    dims = iter(shape)
    return tuple(1 if i in axes else next(dims) for i in range(out_rank))


def _ints_arg(n: Node, name: str, since_opset: int) -> Optional[List[int]]:
    """Ints (axes, split lengths) given as attribute ``name`` before ``since_opset`` and as input 1
    from then on."""
    return n.optional_static_ints(1, name) if n.opset >= since_opset else n.ints(name)


@onnx_op("Unsqueeze")
def _unsqueeze(n: Node) -> List[Value]:
    x = n.x(0)
    axes = _ints_arg(n, "axes", 13)
    if axes is None:
        raise n.fail("axes are required")
    return [ops.reshape(x, _unsqueezed_shape(x.shape, axes, n))]


@onnx_op("Squeeze")
def _squeeze(n: Node) -> List[Value]:
    x = n.x(0)
    given = _ints_arg(n, "axes", 13)
    if given is None:
        given = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {_axis(a, x.rank, n, "axes", scalar_axis=False) for a in given}
    bad = [a for a in axes if x.shape[a] != 1]
    if bad:
        raise n.fail(f"cannot squeeze axes {bad} of shape {x.shape}: their length is not 1")
    return [ops.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@onnx_op("Transpose")
def _transpose(n: Node) -> List[Value]:
    x = n.x(0)
    perm = n.ints("perm", list(range(x.rank))[::-1])
    return [ops.transpose(x, tuple(perm))]


@onnx_op("Concat")
def _concat(n: Node) -> List[Value]:
    xs = n.xs()
    if len({x.rank for x in xs}) > 1:
        raise n.fail(f"inputs must have one rank, got shapes {[tuple(x.shape) for x in xs]}")
    axis = _axis(int(n.attr("axis")), xs[0].rank, n, scalar_axis=False)
    xs = [x for x in xs if x.shape[axis] != 0] or xs[:1]
    return [ops.concat(xs, axis) if len(xs) > 1 else xs[0]]


@onnx_op("Split")
def _split(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n, scalar_axis=False)
    d = x.shape[axis]
    split = _ints_arg(n, "split", 13)
    if split is None:
        parts = int(n.attr("num_outputs", n.n_outputs))
        if n.opset >= 18 and n.attr("num_outputs") is not None:
            chunk = -(-d // parts)  # ceil: the last part may be smaller
            split = [min(chunk, d - i * chunk) for i in range(parts)]
        else:
            if d % parts:
                raise n.fail(f"axis {axis} of length {d} does not split into {parts} equal outputs")
            split = [d // parts] * parts
    return list(ops.split(x, split, axis))


@onnx_op("Slice")
def _slice(n: Node) -> List[Value]:
    x = n.x(0)
    starts, ends = n.static_ints(1, "starts"), n.static_ints(2, "ends")
    axes = n.optional_static_ints(3, "axes")
    axes = list(range(len(starts))) if axes is None else [_axis(a, x.rank, n, "axes") for a in axes]
    steps = n.optional_static_ints(4, "steps")
    steps = [1] * len(starts) if steps is None else steps
    if 0 in steps:
        raise n.fail("steps must not be 0")
    # Clamp the int64 "to the end" sentinels into the int range popxl takes.
    big = 2 ** 31 - 1
    starts = [max(min(s, big), -big) for s in starts]
    ends = [max(min(e, big), -big - 1) for e in ends]
    y = ops.slice(x, start=starts, stop=ends, step=[1 if s > 0 else -1 for s in steps], axis=axes)
    if any(abs(s) > 1 for s in steps):  # popxl slices with unit steps; take every k-th element after
        strides = [1] * x.rank
        for a, s in zip(axes, steps):
            strides[a] = abs(s)
        y = ops.subsample(y, strides)
    return [y]


def _repeat_axis(x: popxl.Tensor, axis: int, index: np.ndarray) -> popxl.Tensor:
    """Take positions ``index`` of ``axis`` (used to broadcast, tile and pad without new popxl ops)."""
    return ops.gather(x, popxl.constant(index.astype(np.int32)), axis)


@onnx_op("Expand")
def _expand(n: Node) -> List[Value]:
    x = n.x(0)
    shape = tuple(n.static_ints(1, "shape"))
    try:
        out = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        raise n.fail(f"cannot broadcast {x.shape} to {shape}") from None
    y = ops.reshape(x, (1,) * (len(out) - x.rank) + x.shape) if len(out) > x.rank else x
    for a, (have, want) in enumerate(zip(y.shape, out)):
        if have != want:
            y = _repeat_axis(y, a, np.zeros(want, np.int64))
    return [y]


@onnx_op("Tile")
def _tile(n: Node) -> List[Value]:
    x = n.x(0)
    repeats = n.static_ints(1, "repeats")
    if len(repeats) != x.rank or any(r < 0 for r in repeats):
        raise n.fail(f"repeats {repeats} must be {x.rank} non-negative ints")
    y = x
    for a, r in enumerate(repeats):
        if r != 1:
            y = _repeat_axis(y, a, np.tile(np.arange(x.shape[a]), r))
    return [y]


def _pad_index(d: int, before: int, after: int, mode: str) -> np.ndarray:
    """Source positions of a padded axis; out-of-range positions (constant mode) are masked later."""
    i = np.arange(-before, d + after)
    if mode == "edge":
        return np.clip(i, 0, d - 1)
    if mode == "reflect":
        if d == 1:
            return np.zeros_like(i)
        period = 2 * (d - 1)
        m = np.mod(i, period)
        return np.where(m < d, m, period - m)
    if mode == "wrap":
        return np.mod(i, d)
    return i


def _pad_steps(n: Node, shape: Sequence[int], pads: Sequence[int],
               mode: str) -> Iterator[Tuple[int, np.ndarray, Optional[np.ndarray]]]:
    """Padding axis by axis: for each padded axis, the positions to take along it and, in constant
    mode, where the taken values stand (a mask that broadcasts; None if every position does)."""
    r = len(shape)
    for a in range(r):
        before, after = int(pads[a]), int(pads[a + r])
        if before == 0 and after == 0:
            continue
        d = shape[a]
        if d == 0 and mode != "constant":
            raise n.fail(f"cannot {mode}-pad the empty axis {a}")
        index = _pad_index(d, before, after, mode)
        inside = (index >= 0) & (index < d)
        mask = inside.reshape([1] * a + [len(index)] + [1] * (r - a - 1)) if mode == "constant" else None
        yield a, np.clip(index, 0, max(d - 1, 0)), None if mask is None or mask.all() else mask


def _pad_tensor(x: popxl.Tensor, pads: Sequence[int], mode: str, value: Union[float, popxl.Tensor],
                n: Node) -> popxl.Tensor:
    """Pad ``x``; ``value`` (constant mode) is a number or a scalar tensor computed on the device."""
    y = x
    for a, positions, inside in _pad_steps(n, x.shape, pads, mode):
        y = _repeat_axis(y, a, positions)
        if inside is not None:
            fill = value if isinstance(value, popxl.Tensor) else n.scalar(value, y)
            y = ops.where(popxl.constant(inside), y, fill)
    return y


def _pad_args(n: Node, rank: int) -> Tuple[List[int], str]:
    """Pad's mode and its pads, [begin of every axis..., end of every axis...], for an input of
    ``rank`` (from opset 18 the pads may name some axes only)."""
    mode = n.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise n.fail(f"unknown mode {mode!r}")
    pads = n.static_ints(1, "pads")
    axes = n.optional_static_ints(3, "axes") if n.opset >= 18 else None
    if axes is not None:
        axes = [_axis(a, rank, n, "axes") for a in axes]
        if len(pads) != 2 * len(axes):
            raise n.fail(f"pads {pads} must have {2 * len(axes)} entries for axes {axes}")
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        raise n.fail(f"pads {pads} must have {2 * rank} entries for rank {rank}")
    return pads, mode


@onnx_op("Pad")
def _pad(n: Node) -> List[Value]:
    x = n.x(0)
    pads, mode = _pad_args(n, x.rank)
    value: Union[float, popxl.Tensor]
    if n.has(2) and n.imp.static(n.proto.input[2]) is None:
        # The pad value is computed on the device: a scalar tensor (it does not change any shape).
        v = n.x(2)
        value = ops.reshape(v if v.dtype == x.dtype else ops.cast(v, x.dtype), ())
    else:
        given = n.optional_static(2, "constant_value")
        value = 0.0 if given is None or given.size == 0 else given.reshape(-1)[0].item()
    return [_pad_tensor(x, pads, mode, value, n)]


@onnx_fold("Pad")
def _pad_at_import(n: Node, x: np.ndarray, *rest: Optional[np.ndarray]) -> List[np.ndarray]:
    # The positions the device takes (``_pad_index``); ONNX's reference refuses negative pads (crops).
    pads, mode = _pad_args(n, x.ndim)
    value = n.optional_static(2, "constant_value")
    fill = np.zeros((), x.dtype) if value is None or value.size == 0 else value.reshape(-1)[0].astype(x.dtype)
    y = x
    for a, positions, inside in _pad_steps(n, x.shape, pads, mode):
        y = np.take(y, positions, a) if y.shape[a] else \
            np.zeros(y.shape[:a] + positions.shape + y.shape[a + 1:], x.dtype)
        if inside is not None:
            y = np.where(inside, y, fill)
    return [np.asarray(y, x.dtype)]


@onnx_op("Resize")
def _resize(n: Node) -> List[Value]:
    x = n.x(0)
    mode = n.attr("mode", "nearest")
    ctm = n.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic"):
        raise n.fail(f"unknown mode {mode!r}")
    if mode == "cubic" and (float(n.attr("cubic_coeff_a", -0.75)) != -0.75 or n.attr("exclude_outside", 0)):
        raise n.fail("cubic mode is supported with cubic_coeff_a=-0.75 and exclude_outside=0 only")
    if ctm == "tf_crop_and_resize":
        raise n.fail("coordinate_transformation_mode 'tf_crop_and_resize' is not supported")
    if n.attr("antialias", 0):
        raise n.fail("antialias=1 is not supported")
    if n.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise n.fail("keep_aspect_ratio_policy other than 'stretch' is not supported")
    given_axes = n.ints("axes") if n.opset >= 18 else None
    axes = list(range(x.rank)) if given_axes is None else [_axis(a, x.rank, n, "axes") for a in given_axes]
    scales = n.optional_static(2, "scales")
    sizes = n.optional_static_ints(3, "sizes")
    if scales is not None and scales.size == 0:
        scales = None
    if scales is not None and not np.all(np.isfinite(scales) & (scales > 0)):
        raise n.fail(f"scales {scales.tolist()} must be finite and positive")
    if (scales is None) == (sizes is None):
        raise n.fail("exactly one of scales and sizes must be given")
    what, values = ("scales", scales.reshape(-1).tolist()) if scales is not None else ("sizes", sizes)
    if values is not None and len(values) != len(axes):
        of = f"attribute axes {given_axes}" if given_axes is not None else f"the rank-{x.rank} input"
        raise n.fail(f"{what} {values} must have {len(axes)} entries, one for each axis of {of}")
    factor = [1.0] * x.rank
    want = list(x.shape)
    if scales is not None:
        for a, s in zip(axes, scales.reshape(-1)):
            factor[a] = float(s)
            want[a] = int(math.floor(x.shape[a] * float(s)))
    elif sizes is not None:  # (one of the two is given: checked above)
        for a, s in zip(axes, sizes):
            want[a] = s
            f = float(s) / x.shape[a]
            # Resize by sizes uses scale = size / length; nudge it up by an ulp if the float
            # product rounds below the wanted size (popxl sizes its output as floor(length * scale)).
            while math.floor(x.shape[a] * f) < want[a]:
                f = float(np.nextafter(f, np.inf))
            factor[a] = f
    y = ops.interpolate(x, tuple(factor), mode=mode, nearest_mode=n.attr("nearest_mode", "round_prefer_floor"),
                        coordinate_transformation_mode=ctm)
    if tuple(y.shape) != tuple(want):
        raise n.fail(f"resized shape {y.shape} differs from the expected {tuple(want)}")
    return [y]


@onnx_op("DepthToSpace", "SpaceToDepth")
def _depth_space(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank != 4:
        raise n.fail(f"needs a 4-D (N, C, H, W) input, got shape {x.shape}")
    b = int(n.attr("blocksize"))
    nb, c, h, w = x.shape
    if n.op_type == "SpaceToDepth":
        y = ops.reshape(x, (nb, c, h // b, b, w // b, b))
        # DCR (the default) puts the block offsets before the channel, CRD after it (the mode
        # attribute arrived in opset 24; the inverse of DepthToSpace with the same mode).
        perm = (0, 3, 5, 1, 2, 4) if n.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
        y = ops.transpose(y, perm)
        return [ops.reshape(y, (nb, c * b * b, h // b, w // b))]
    if n.attr("mode", "DCR") == "DCR":
        y = ops.transpose(ops.reshape(x, (nb, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = ops.transpose(ops.reshape(x, (nb, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return [ops.reshape(y, (nb, c // (b * b), h * b, w * b))]


@onnx_op("Trilu")
def _trilu(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank < 2:
        raise n.fail(f"needs a tensor of rank >= 2, got shape {x.shape}")
    rows, cols = x.shape[-2:]
    upper = bool(n.attr("upper", 1))
    if n.has(1) and n.imp.static(n.proto.input[1]) is None:
        # k computed on the device (it does not change the shape): keep where col - row >= k
        # (upper) or <= k (lower), comparing against the constant grid of col - row.
        k_in = n.x(1)
        k_t = ops.reshape(k_in if k_in.dtype == dtypes.int32 else ops.cast(k_in, dtypes.int32), ())
        diag = popxl.constant((np.arange(cols)[None, :] - np.arange(rows)[:, None]).astype(np.int32))
        keep_t = ops.logical_not(_less(diag, k_t)) if upper else ops.logical_not(ops.greater(diag, k_t))
        return [ops.where(keep_t, x, n.scalar(0, x))]
    k = n.static_int(1, "k") if n.has(1) else 0
    keep = np.ones((rows, cols), np.bool_)
    keep = np.triu(keep, k) if upper else np.tril(keep, k)
    return [ops.where(popxl.constant(keep), x, n.scalar(0, x))]


# EyeLike / CenterCropPad / Hardmax / Compress ----------------------------------------------------------
@onnx_op("EyeLike")
def _eye_like(n: Node) -> List[Value]:
    shape = n.shape(0)
    if len(shape) != 2:
        raise n.fail(f"needs a 2-D input, got shape {shape}")
    if n.attr("dtype") is not None:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(n.attr("dtype"))))
    else:
        static = n.imp.static(n.proto.input[0])
        dt = static.dtype if static is not None else np.dtype(n.x(0).dtype.as_numpy())
    # Only the input's shape matters, which is known at import: the result is a constant.
    return [np.eye(shape[0], shape[1], int(n.attr("k", 0)), dtype=dt)]


@onnx_op("CenterCropPad")
def _center_crop_pad(n: Node) -> List[Value]:
    x = n.x(0)
    target = n.static_ints(1, "shape")
    axes = n.ints("axes", list(range(x.rank)))
    axes = [_axis(a, x.rank, n, "axes") for a in axes]
    if len(set(axes)) != len(axes) or len(target) != len(axes) or any(v < 0 for v in target):
        raise n.fail(f"shape {target} must hold one non-negative length per axis of {axes}")
    starts, stops, pads = [], [], [0] * (2 * x.rank)
    for a, want in zip(axes, target):
        d = x.shape[a]
        if want <= d:  # crop: the window starts at floor((d - want) / 2)
            starts.append((d - want) // 2)
            stops.append((d - want) // 2 + want)
        else:  # pad: an odd extra element goes after
            starts.append(0)
            stops.append(d)
            pads[a], pads[a + x.rank] = (want - d) // 2, (want - d + 1) // 2
    y = ops.slice(x, start=starts, stop=stops, axis=axes) if axes else x
    return [_pad_tensor(y, pads, "constant", 0, n) if any(pads) else y]
