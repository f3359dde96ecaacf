"""interpolate (ONNX Resize with scales) and its gradient rule."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import spec
from popxl.tensor import Tensor

__all__ = ["interpolate"]


# interpolate ----------------------------------------------------------------------------------------
# ONNX Resize with scales, done one axis at a time (all modes are separable). Each axis maps its
# output positions to (fractional) input coordinates, then a mode turns each coordinate into a
# few input indices (clamped to the edges) with weights.
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_COORD_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize")
_INTERP_MODES = ("nearest", "linear", "cubic")
_CUBIC_A = -0.75


def _source_coords(n_in: int, n_out: int, scale: float, mode: str) -> np.ndarray:
    x = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return x / scale
    if n_out == 1:  # align_corners / tf_crop_and_resize (whole-input region)
        return np.full(1, 0.0 if mode == "align_corners" else 0.5 * (n_in - 1))
    # ONNX divides by the unrounded resized length, n_in * scale (not the floored n_out)
    return x * (n_in - 1) / (n_in * scale - 1)


def _nearest_taps(x: np.ndarray, nearest_mode: str):
    lo = np.floor(x)
    frac = x - lo
    pick = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
            "floor": np.zeros_like(frac, bool), "ceil": frac > 0}[nearest_mode]
    return [lo + pick], [np.ones_like(x)]


def _linear_taps(x: np.ndarray, n_in: int):
    x = np.clip(x, 0, n_in - 1)
    lo = np.floor(x)
    w = x - lo
    return [lo, lo + 1], [1 - w, w]


def _cubic_weight(d: np.ndarray) -> np.ndarray:
    """Keys cubic convolution kernel with a = -0.75 at distance d."""
    a, d = _CUBIC_A, np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _cubic_taps(x: np.ndarray):
    lo = np.floor(x)
    taps = [lo + k for k in (-1, 0, 1, 2)]
    return taps, [_cubic_weight(x - p) for p in taps]


def _resize_axis(a: np.ndarray, axis: int, n_out: int, scale: float, mode: str, nearest_mode: str,
                 coord_mode: str) -> np.ndarray:
    n_in = a.shape[axis]
    x = _source_coords(n_in, n_out, scale, coord_mode)
    if mode == "nearest":
        taps, weights = _nearest_taps(x, nearest_mode)
    elif mode == "linear":
        taps, weights = _linear_taps(x, n_in)
    else:
        taps, weights = _cubic_taps(x)
    bshape = [1] * a.ndim
    bshape[axis] = n_out

    def tap(p: np.ndarray) -> np.ndarray:
        return np.take(a, np.clip(p, 0, n_in - 1).astype(np.int64), axis=axis)
    if mode == "nearest":  # one tap, weight 1
        return tap(taps[0])
    out = tap(taps[0]) * weights[0].reshape(bshape)
    for p, w in zip(taps[1:], weights[1:]):
        out = out + tap(p) * w.reshape(bshape)
    return out


def _interpolate_infer(specs, scale_factor, mode, nearest_mode, coordinate_transformation_mode):
    s = specs[0]
    if len(scale_factor) != len(s.shape):
        raise ValueError(f"scale_factor has {len(scale_factor)} entries but the tensor has rank {len(s.shape)}")
    if any(not f > 0 for f in scale_factor):
        raise ValueError(f"scale factors must be positive, got {list(scale_factor)}")
    for what, value, allowed in (("mode", mode, _INTERP_MODES), ("nearest_mode", nearest_mode, _NEAREST_MODES),
                                 ("coordinate_transformation_mode", coordinate_transformation_mode, _COORD_MODES)):
        if value not in allowed:
            raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
    if mode != "nearest" and not s.dtype.is_floating_point:
        raise TypeError(f"mode {mode!r} needs a floating point tensor, got {s.dtype.name}")
    if not (s.dtype.is_floating_point or s.dtype.is_int):
        raise TypeError(f"needs a numeric tensor, got {s.dtype.name}")
    return [spec([int(np.floor(d * f)) for d, f in zip(s.shape, scale_factor)], s.dtype)]


def _interpolate_kernel(x, scale_factor, mode, nearest_mode, coordinate_transformation_mode):
    out = x if mode == "nearest" else x.astype(np.float64)
    for axis, (d, f) in enumerate(zip(x.shape, scale_factor)):
        n_out = int(np.floor(d * f))
        if n_out == d and f == 1.0:
            continue  # identity along this axis for every mode
        out = _resize_axis(out, axis, n_out, f, mode, nearest_mode, coordinate_transformation_mode)
    return out.astype(x.dtype, order="C")  # (np.ascontiguousarray makes a scalar 1-d)


register(OpDef("interpolate", _interpolate_infer, _interpolate_kernel, family="shape",
               attributes={"scale_factor": "floats", "mode": "str", "nearest_mode": "str", "coordinate_transformation_mode": "str"}))


_DEFAULT_SCALE = (1.0, 1.0, 1.0, 1.0)


def interpolate(t: Tensor, scale_factor: Optional[Tuple[float, ...]] = _DEFAULT_SCALE,
                mode: Optional[str] = "nearest", nearest_mode: Optional[str] = "round_prefer_floor",
                coordinate_transformation_mode: Optional[str] = "half_pixel") -> Tensor:
    """Resize a tensor by scale factors, as ONNX Resize.

    Samples beyond the edges repeat the edge value.

    Args:
        t: The tensor resized.
        scale_factor: One factor per dimension; an output length is ``floor(length * factor)``.
            None: the default.
        mode: "nearest", "linear" (multi-linear) or "cubic" (Keys kernel, a = -0.75).
        nearest_mode: How "nearest" rounds: round_prefer_floor, round_prefer_ceil, floor or ceil.
        coordinate_transformation_mode: How output positions map to input ones: half_pixel,
            pytorch_half_pixel, align_corners, asymmetric or tf_crop_and_resize.

    Returns:
        A new tensor of ``t``'s dtype and the scaled shape.

    Raises:
        TypeError: If ``t`` is not a Tensor, or is not floating point for a mode other than nearest.
        ValueError: If a mode is unknown, ``scale_factor`` does not have one entry per dimension, or
            ``t`` is not in the current graph.
    """
    scale_factor = tuple(float(f) for f in (_DEFAULT_SCALE if scale_factor is None else scale_factor))
    return create_op("interpolate", [t], {
        "scale_factor": scale_factor, "mode": "nearest" if mode is None else mode,
        "nearest_mode": "round_prefer_floor" if nearest_mode is None else nearest_mode,
        "coordinate_transformation_mode": "half_pixel" if coordinate_transformation_mode is None
        else coordinate_transformation_mode})[0]


def _interpolate_grad_kernel(x, g, scale_factor, mode, nearest_mode, coordinate_transformation_mode):
    """Resizing is linear and separable: along each axis out = M @ in for an (n_out, n_in) matrix
    M (the resize of the identity), so the gradient applies each M transposed."""
    out = g.astype(np.float64)
    for axis, (d, f) in enumerate(zip(x.shape, scale_factor)):
        n_out = int(np.floor(d * f))
        if n_out == d and f == 1.0:
            continue
        m = _resize_axis(np.eye(d), 0, n_out, f, mode, nearest_mode, coordinate_transformation_mode)
        out = np.moveaxis(np.tensordot(np.moveaxis(out, axis, -1), m, axes=([-1], [0])), -1, axis)
    return out.astype(x.dtype)


register(OpDef("interpolate_grad", lambda specs, **_: [specs[0]], _interpolate_grad_kernel, grad=Grad.RAISE,
               family="shape",
               attributes={"scale_factor": "floats", "mode": "str", "nearest_mode": "str", "coordinate_transformation_mode": "str"}))


@grad_rule("interpolate")
def _interpolate_grad(ctx):
    return [create_op("interpolate_grad", [ctx.input(0), ctx.grad(0)], ctx.attrs)[0]]
