"""Normalisations: ``softmax``, ``batch_norm_inference``, ``group_norm`` and ``layer_norm``, each
with its fused gradient op."""
from __future__ import annotations

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register, user_location
from popxl.ops.fp8 import FP8
from popxl.ops.utils import normalize_axes, op_error, spec, wide_dtype
from popxl.tensor import Tensor

__all__ = ["softmax", "batch_norm_inference", "group_norm", "layer_norm"]


def _softmax_infer(specs, axis):
    s = specs[0]
    if not s.dtype.is_floating_point:
        raise TypeError(f"softmax needs a floating point tensor, got {s.dtype.name}")
    if not s.shape:  # as PopART's Softmax: its axis must lie within the shape
        raise ValueError("softmax needs a tensor of rank >= 1, got a scalar")
    return [spec(s.shape, s.dtype)]


def _softmax_kernel(x, axis):
    if x.size == 0:  # nothing to normalise (an empty axis has no maximum)
        return x.copy()
    w = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    e = np.exp(w - np.max(w, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


register(OpDef("softmax", _softmax_infer, _softmax_kernel, family="nn",
               attributes={"axis": "int"}))


def softmax(t: Tensor, axis: int) -> Tensor:
    """``exp(t) / sum(exp(t))`` along an axis, computed stably.

    Args:
        t: A floating point tensor.
        axis: The axis normalised (negative counts from the end).

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor or not floating point, or ``axis`` is not an int.
        ValueError: If ``axis`` is out of range (a scalar has no axis), or ``t`` is not in the current
            graph.
    """
    try:
        ax = normalize_axes(t.rank, axis)[0]
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.softmax: {e} (tensor {t.id!r} of shape {t.shape}) (at {user_location()})") from None
    return create_op("softmax", [t], {"axis": ax})[0]


def _softmax_grad_infer(specs, axis):
    g, y = specs
    if g.shape != y.shape or g.dtype != y.dtype:
        raise ValueError(f"softmax_grad: the gradient ({g.dtype.name} {g.shape}) must match softmax's output "
                         f"({y.dtype.name} {y.shape})")
    return [spec(y.shape, y.dtype)]


def _softmax_grad_kernel(g, y, axis):
    """g * y - y * sum(g * y) along ``axis``: the gradient w.r.t. the logits of y = softmax(x)."""
    w = wide_dtype(y.dtype)
    gy = g.astype(w) * y.astype(w)
    return (gy - y.astype(w) * gy.sum(axis=axis, keepdims=True)).astype(y.dtype)


# One fused kernel: as a composite (mul, sum, mul, sub) it made four passes over attention's
# (batch, heads, seq, seq) probabilities.
register(OpDef("softmax_grad", _softmax_grad_infer, _softmax_grad_kernel, grad=Grad.RAISE, family="nn",
               attributes={"axis": "int"}))


@grad_rule("softmax")
def _softmax_grad(ctx):
    return [create_op("softmax_grad", [ctx.grad(0), ctx.output(0)], {"axis": ctx.attrs["axis"]})[0]]


def per_channel_check(x, params, names) -> None:
    if len(x.shape) < 2:
        raise ValueError(f"input must be (N, C, ...), got shape {x.shape}")
    if not x.dtype.is_floating_point or x.dtype in FP8:
        raise TypeError(f"needs a float16/float32/float64 tensor, got {x.dtype.name}")
    c = x.shape[1]
    for name, p in zip(names, params):
        if p.shape != (c,):
            raise ValueError(f"{name} must have shape ({c},) (one value per channel), got {p.shape}")
        if p.dtype is not x.dtype:
            raise TypeError(f"{name} must have the input's dtype {x.dtype.name}, got {p.dtype.name}")


def channel_column(p: np.ndarray, rank: int, dt) -> np.ndarray:
    """A per-channel parameter as ``dt``, shaped to broadcast over (N, C, *spatial)."""
    return p.astype(dt).reshape((1, -1) + (1,) * (rank - 2))


def _batch_norm_infer(specs, epsilon):
    per_channel_check(specs[0], specs[1:], ("scale", "bias", "mean", "var"))
    return [spec(specs[0].shape, specs[0].dtype)]


def _batch_norm_kernel(x, scale, bias, mean, var, epsilon):
    w = wide_dtype(x.dtype)
    ch = [channel_column(p, x.ndim, w) for p in (scale, bias, mean, var)]
    y = ch[0] * (x.astype(w) - ch[2]) / np.sqrt(ch[3] + w.type(epsilon)) + ch[1]
    return y.astype(x.dtype)


register(OpDef("batch_norm_inference", _batch_norm_infer, _batch_norm_kernel, family="nn",
               attributes={"epsilon": "float"}))


def batch_norm_inference(t: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor,
                         epsilon: float = 1e-5, momentum: float = 0.9) -> Tensor:
    """Normalise per channel with given statistics: ``scale * (t - mean) / sqrt(var + epsilon) + bias``.

    Args:
        t: The input, (N, C, ...).
        scale: Per-channel scale, (C,).
        bias: Per-channel shift, (C,).
        mean: Per-channel mean, (C,).
        var: Per-channel variance, (C,).
        epsilon: Added to the variance.
        momentum: Only matters for training; ignored.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If an argument is not a Tensor, or the dtypes differ.
        ValueError: If a parameter is not of shape (C,), or a tensor is not in the current graph.
    """
    return create_op("batch_norm_inference", [t, scale, bias, mean, var], {"epsilon": float(epsilon)})[0]


@grad_rule("batch_norm_inference")
def _batch_norm_grad(ctx):
    """y = scale * (x - mean) * r + bias with r = 1/sqrt(var + eps): gradients for all five inputs."""
    x, scale, mean, var, g = ctx.input(0), ctx.input(1), ctx.input(3), ctx.input(4), ctx.grad(0)
    c_shape = (1, x.shape[1]) + (1,) * (x.rank - 2)
    per_channel = (0,) + tuple(range(2, x.rank))

    def chan(t: Tensor) -> Tensor:
        return t.reshape(c_shape)

    def total(t: Tensor) -> Tensor:
        return create_op("sum", [t], {"axis": per_channel, "keepdims": False})[0]

    r = 1.0 / create_op("sqrt", [var + ctx.attrs["epsilon"]])[0]
    centred = x - chan(mean)
    g_scaled = g * chan(scale * r)
    return [g_scaled if ctx.needs(0) else None,
            total(g * centred) * r if ctx.needs(1) else None,
            total(g) if ctx.needs(2) else None,
            create_op("negate", [total(g_scaled)])[0] if ctx.needs(3) else None,
            total(g * centred) * scale * r * r * r * -0.5 if ctx.needs(4) else None]


def _group_norm_infer(specs, num_groups, eps):
    x = specs[0]
    per_channel_check(x, specs[1:], ("weight", "bias"))
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    if x.shape[1] % num_groups:
        raise ValueError(f"channels ({x.shape[1]}) are not divisible by num_groups ({num_groups})")
    return [spec(x.shape, x.dtype)]


def _grouped(x: np.ndarray, num_groups: int, dt) -> np.ndarray:
    """``x`` (N, C, ...) as (N, groups, values per group) in ``dt``; explicit sizes, as -1 cannot
    be inferred when N is 0."""
    return x.astype(dt).reshape(x.shape[0], num_groups, x.size // max(x.shape[0] * num_groups, 1))


def _group_norm_kernel(x, weight, bias, num_groups, eps):
    w = wide_dtype(x.dtype)
    g = _grouped(x, num_groups, w)
    mean = g.mean(axis=-1, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=-1, keepdims=True)
    y = ((g - mean) / np.sqrt(var + w.type(eps))).reshape(x.shape)
    return (y * channel_column(weight, x.ndim, w) + channel_column(bias, x.ndim, w)).astype(x.dtype)


register(OpDef("group_norm", _group_norm_infer, _group_norm_kernel, family="nn",
               attributes={"num_groups": "int", "eps": "float"}))


register(OpDef("layer_norm", lambda specs, eps: _group_norm_infer(specs, 1, eps),
               lambda x, weight, bias, eps: _group_norm_kernel(x, weight, bias, 1, eps), family="nn",
               attributes={"eps": "float"}))


def group_norm(t: Tensor, weight: Tensor, bias: Tensor, num_groups: int, eps: float = 1e-5) -> Tensor:
    """Group normalisation: the channels are split into groups, each normalised over its channels and all positions.

    The variance is the biased one, with ``eps`` added; then ``weight`` and ``bias`` scale and shift
    each channel.

    Args:
        t: The input, (N, C, ...).
        weight: Per-channel scale, (C,).
        bias: Per-channel shift, (C,).
        num_groups: The number of groups; it must divide C.
        eps: Added to the variance.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If an argument is not a Tensor, or the dtypes differ.
        ValueError: If ``num_groups`` does not divide C, a parameter is not of shape (C,), or a
            tensor is not in the current graph.
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
        raise op_error("group_norm", TypeError(f"num_groups must be an int, not {num_groups!r}"))
    return create_op("group_norm", [t, weight, bias], {"num_groups": int(num_groups), "eps": float(eps)})[0]


def layer_norm(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """Layer normalisation: `group_norm` with one group, so each sample is normalised over all its non-batch values.

    Args:
        t: The input, (N, C, ...).
        weight: Per-channel scale, (C,).
        bias: Per-channel shift, (C,).
        eps: Added to the variance.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If an argument is not a Tensor, or the dtypes differ.
        ValueError: If a parameter is not of shape (C,), or a tensor is not in the current graph.
    """
    return create_op("layer_norm", [t, weight, bias], {"eps": float(eps)})[0]


def _group_norm_grad_infer(specs, num_groups, eps):
    x, w = specs[0], specs[1]
    return [spec(x.shape, x.dtype), spec(w.shape, w.dtype), spec(w.shape, w.dtype)]


def _group_norm_grad_kernel(x, weight, g, num_groups, eps):
    """(dx, dweight, dbias) of group_norm, with the statistics recomputed from x."""
    w = wide_dtype(x.dtype)
    grouped = _grouped(x, num_groups, w)
    mean = grouped.mean(axis=-1, keepdims=True)
    inv_std = 1.0 / np.sqrt(((grouped - mean) ** 2).mean(axis=-1, keepdims=True) + w.type(eps))
    xhat = ((grouped - mean) * inv_std).reshape(x.shape)
    gw = g.astype(w)
    per_channel = (0,) + tuple(range(2, x.ndim))
    dweight, dbias = (gw * xhat).sum(axis=per_channel), gw.sum(axis=per_channel)
    dxhat = _grouped(gw * channel_column(weight, x.ndim, w), num_groups, w)
    xh = _grouped(xhat, num_groups, w)
    dx = (dxhat - dxhat.mean(axis=-1, keepdims=True) - xh * (dxhat * xh).mean(axis=-1, keepdims=True)) * inv_std
    return dx.reshape(x.shape).astype(x.dtype), dweight.astype(weight.dtype), dbias.astype(weight.dtype)


# One fused kernel for the three gradients of a normalisation (a composite would take ~15 ops).
register(OpDef("group_norm_grad", _group_norm_grad_infer, _group_norm_grad_kernel, grad=Grad.RAISE, family="nn",
               attributes={"num_groups": "int", "eps": "float"}))


@grad_rule("group_norm", "layer_norm")
def _group_norm_grad(ctx):
    groups = ctx.attrs.get("num_groups", 1)
    dx, dw, db = create_op("group_norm_grad", [ctx.input(0), ctx.input(1), ctx.grad(0)],
                           {"num_groups": groups, "eps": ctx.attrs["eps"]})
    return [dx, dw, db]
