"""Reductions over axes (sum, mean, prod, max, min, median, l1, l2, logsum, logsumexp, sumsquare) and
index/running/statistical reductions (argmax, argmin, cumsum, topk, histogram, lamb_square)."""
from __future__ import annotations

import builtins
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import convert, normalize_axes, spec
from popxl.tensor import Tensor

__all__ = ["argmax", "argmin", "cumsum", "histogram", "l1", "lamb_square", "l2", "logsum", "logsumexp", "max", "mean", "median", "min", "prod", "sum", "sumsquare", "topk"]


def _reduce_infer(specs, axis, keepdims):
    s = specs[0]
    if s.dtype.is_complex or s.dtype.name == "bool":
        raise TypeError(f"cannot reduce a {s.dtype.name} tensor")
    shape = [1 if i in axis else d for i, d in enumerate(s.shape)] if keepdims else \
        [d for i, d in enumerate(s.shape) if i not in axis]
    return [spec(shape, s.dtype)]


def _wide(fn: Callable) -> Callable:
    """Reduce floats in float64, as the native kernels do, and round once to the input dtype: a
    float32 mean of (max, max) is max, not the inf of a float32 sum."""
    def k(x, axis, keepdims):
        w = x.astype(np.float64) if x.dtype.kind == "f" else x
        return convert(fn(w, axis=axis, keepdims=keepdims), x.dtype)
    return k


def _extreme(fn: Callable) -> Callable:
    """max / min: over an empty axis the result is -inf / +inf, or the dtype's limit for integers
    (ONNX's ReduceMax / ReduceMin of an empty set), where NumPy raises."""
    def k(x, axis, keepdims):
        big = np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max
        small = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        return fn(x, axis=axis, keepdims=keepdims, initial=small if fn is np.max else big)
    return k


def _logsumexp(x, axis, keepdims):
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


_REDUCTIONS: Dict[str, tuple] = {
    "sum": (np.sum, "Sum over axes."),
    "mean": (np.mean, "Mean over axes."),
    "prod": (np.prod, "Product over axes."),
    "max": (_extreme(np.max), "Maximum over axes (-inf, or the dtype's lowest value, over an empty axis)."),
    "min": (_extreme(np.min), "Minimum over axes (+inf, or the dtype's largest value, over an empty axis)."),
    "median": (np.median, "Median over axes (mean of the two middle values for even counts)."),
    "l1": (lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims), "Sum of |x|."),
    "l2": (lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)), "sqrt(sum x^2)."),
    "logsum": (lambda x, axis, keepdims: np.log(np.sum(x, axis=axis, keepdims=keepdims)), "log(sum x)."),
    "logsumexp": (_logsumexp, "log(sum exp x), computed stably."),
    "sumsquare": (lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims), "Sum of x^2."),
}


def _make(opname: str, doc: str) -> Callable:
    def fn(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
        try:
            axes = normalize_axes(t.rank, axis) if t.rank else ()
        except (ValueError, TypeError) as e:
            raise type(e)(f"ops.{opname}: {e} (tensor {t.id!r} of shape {t.shape})") from None
        return create_op(opname, [t], {"axis": axes, "keepdims": bool(keepdims)})[0]
    fn.__name__ = fn.__qualname__ = opname
    fn.__doc__ = doc + " ``axis`` None reduces all axes; negative axes count from the end."
    return fn


for _name, (_fn, _doc) in _REDUCTIONS.items():
    register(OpDef(_name, _reduce_infer, _wide(_fn), family="reduce"))
    globals()[_name] = _make(_name, _doc)


# Index, running and statistical reductions ----------------------------------------------------------
# argmax/argmin, cumsum, topk, histogram, lamb_square. Each has a trace-time rule and a NumPy kernel.

def _numeric(s, what: str = "input") -> None:
    if not (s.dtype.is_floating_point or s.dtype.is_int):
        raise TypeError(f"{what} must be a numeric tensor, got {s.dtype.name}")


def _one_axis(opname: str, t: Tensor, dim: Optional[int]) -> Optional[int]:
    """Normalise one optional axis of ``t`` (None kept); errors name the op."""
    if dim is None:
        return None
    try:
        return normalize_axes(t.rank, int(dim) if isinstance(dim, (int, np.integer)) else dim)[0]
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.{opname}: {e} (tensor {t.id!r} of shape {t.shape})") from None


# argmax / argmin ------------------------------------------------------------------------------------
def _arg_infer(specs, dim, keepdim):
    s = specs[0]
    _numeric(s)
    if 0 in s.shape:
        raise ValueError("cannot take the index of an extreme value of an empty tensor")
    if dim is None:
        shape = [1] * len(s.shape) if keepdim else []
    elif len(s.shape) == 0:
        shape = []
    else:
        shape = [1 if i == dim else d for i, d in enumerate(s.shape)] if keepdim else \
            [d for i, d in enumerate(s.shape) if i != dim]
    return [spec(shape, dtypes.int32)]


def _arg_kernel(fn: Callable) -> Callable:
    def k(x, dim, keepdim):
        if x.ndim == 0:
            return np.zeros((), np.int32)
        if dim is None:
            r = np.asarray(fn(x.reshape(-1)))
            return r.reshape([1] * x.ndim if keepdim else []).astype(np.int32)
        return np.asarray(fn(x, axis=dim, keepdims=keepdim)).astype(np.int32)
    return k


register(OpDef("argmax", _arg_infer, _arg_kernel(np.argmax), grad=Grad.STOP, family="reduce"))
register(OpDef("argmin", _arg_infer, _arg_kernel(np.argmin), grad=Grad.STOP, family="reduce"))


def argmax(t: Tensor, dim: Optional[int] = 0, keepdim: Optional[bool] = False) -> Tensor:
    """Index (int32) of the largest value along ``dim``; the first one wins on ties.
    ``dim=None`` looks at the flattened tensor."""
    return create_op("argmax", [t], {"dim": _one_axis("argmax", t, dim), "keepdim": builtins.bool(keepdim)})[0]


def argmin(t: Tensor, dim: Optional[int] = 0, keepdim: Optional[bool] = False) -> Tensor:
    """Index (int32) of the smallest value along ``dim``; the first one wins on ties.
    ``dim=None`` looks at the flattened tensor."""
    return create_op("argmin", [t], {"dim": _one_axis("argmin", t, dim), "keepdim": builtins.bool(keepdim)})[0]


# cumsum ---------------------------------------------------------------------------------------------
def _cumsum_infer(specs, dim):
    s = specs[0]
    _numeric(s)
    if dim is None:
        return [spec([int(np.prod(s.shape, dtype=np.int64))], s.dtype)]
    return [spec(s.shape, s.dtype)]


def _cumsum_kernel(x, dim):
    wide = x.astype(np.float32) if x.dtype.kind == "f" and x.dtype.itemsize < 4 else x
    if dim is None or x.ndim == 0:
        out = np.cumsum(wide.reshape(-1)).reshape(-1 if dim is None else x.shape)
    else:
        out = np.cumsum(wide, axis=dim)
    return out.astype(x.dtype)


register(OpDef("cumsum", _cumsum_infer, _cumsum_kernel, family="reduce"))


def cumsum(t: Tensor, dim: Optional[int] = 0) -> Tensor:
    """Inclusive running sum along ``dim`` (negative counts from the end). ``dim=None`` sums the
    flattened tensor, giving a 1-D result. Integer sums wrap on overflow."""
    return create_op("cumsum", [t], {"dim": _one_axis("cumsum", t, dim)})[0]


# topk -----------------------------------------------------------------------------------------------
def _topk_infer(specs, k, axis, largest, sorted):
    s = specs[0]
    _numeric(s)
    if len(s.shape) == 0:
        raise ValueError("cannot take the top k of a scalar")
    if not 0 <= k <= s.shape[axis]:
        raise ValueError(f"k={k} must be between 0 and the size {s.shape[axis]} of axis {axis}")
    shape = list(s.shape)
    shape[axis] = k
    return [spec(shape, s.dtype), spec(shape, dtypes.int32)]


def _topk_kernel(x, k, axis, largest, sorted):
    n = x.shape[axis]
    if largest:
        # Descending order, lowest index first among equal values: a stable ascending sort of
        # the reversed axis, read backwards. NaN sorts as the largest value.
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    if not sorted:
        idx = np.sort(idx, axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int32)


register(OpDef("topk", _topk_infer, _topk_kernel, family="reduce"))


def topk(t: Tensor, k: int, axis: int, largest: bool, sorted: bool,
         available_memory_proportion: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) values along ``axis`` and their int32 indices.
    With ``sorted`` they come in order (best first); otherwise in their original index order.
    Equal values keep the lower index first; NaN counts as the largest value."""
    ax = _one_axis("topk", t, axis)
    values, indices = create_op("topk", [t], {"k": int(k), "axis": ax, "largest": builtins.bool(largest),
                                              "sorted": builtins.bool(sorted)})
    return values, indices


# histogram ------------------------------------------------------------------------------------------
def _histogram_infer(specs, levels, absolute_of_input):
    _numeric(specs[0])
    if any(not b > a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"levels must be strictly increasing, got {list(levels)}")
    if any(np.isnan(v) for v in levels):
        raise ValueError("levels must not contain NaN")
    return [spec([len(levels) + 1], dtypes.uint32)]


def _histogram_kernel(x, levels, absolute_of_input):
    v = x.astype(np.float64)
    v = np.abs(v) if absolute_of_input else v  # after the conversion: |INT_MIN| does not wrap
    # bin 0: v < levels[0]; bin i: levels[i-1] <= v < levels[i]; last bin: v >= levels[-1]
    bins = np.searchsorted(np.asarray(levels, np.float64), v.reshape(-1), side="right")
    return np.bincount(bins, minlength=len(levels) + 1).astype(np.uint32)


register(OpDef("histogram", _histogram_infer, _histogram_kernel, grad=Grad.STOP, family="reduce"))


def histogram(t: Tensor, levels: List[float], absolute_of_input: bool) -> Tensor:
    """Counts (uint32, ``len(levels) + 1`` bins) of the values of ``t`` (of |t| when
    ``absolute_of_input``): below ``levels[0]``, in each ``[levels[i-1], levels[i])``, and at or
    above ``levels[-1]``. ``levels`` must be strictly increasing. NaN values land in the last bin."""
    return create_op("histogram", [t], {"levels": tuple(float(v) for v in levels),
                                        "absolute_of_input": builtins.bool(absolute_of_input)})[0]


# lamb_square ----------------------------------------------------------------------------------------
def _lamb_square_infer(specs):
    _numeric(specs[0])
    return [spec([], dtypes.float32)]


register(OpDef("lamb_square", _lamb_square_infer,
               lambda x: np.asarray(np.sum(np.square(x.astype(np.float64))), np.float32),
               grad=Grad.STOP, family="reduce"))


def lamb_square(t: Tensor) -> Tensor:
    """Sum of the squares of all elements, as a float32 scalar (used for LAMB norms)."""
    return create_op("lamb_square", [t])[0]


# gradients ------------------------------------------------------------------------------------------
def _spread(ctx, t: Tensor) -> Tensor:
    """A reduction-output-shaped ``t`` broadcast back over the reduced axes to the input shape."""
    from popxl.ops.shape import broadcast_to
    x = ctx.op.inputs[0]
    keep = tuple(1 if i in ctx.attrs["axis"] else d for i, d in enumerate(x.shape))
    if t.shape != keep:
        t = t.reshape(keep)
    return broadcast_to(t, x.shape)


def _reduction_rule(local: Callable[..., Tensor]) -> Callable:
    """Rule of a reduction whose input gradient is ``local(ctx, g, x, y)``, with g and y (the
    output gradient and output) already spread back to the input shape."""
    def rule(ctx):
        return [local(ctx, _spread(ctx, ctx.grad(0)), ctx.input(0), _spread(ctx, ctx.output(0)))]
    return rule


def _count(ctx) -> int:
    shape = ctx.op.inputs[0].shape
    return int(np.prod([shape[a] for a in ctx.attrs["axis"]], dtype=np.int64))


def _at_extreme(ctx, g, x, y):  # every element equal to the result receives the full gradient
    from popxl.ops.elementwise import cast, equal
    return g * cast(equal(x, y), x.dtype)


_REDUCTION_GRADS: Dict[str, Callable] = {
    "sum": lambda ctx, g, x, y: g,
    "mean": lambda ctx, g, x, y: g * (1.0 / builtins.max(_count(ctx), 1)),
    "prod": lambda ctx, g, x, y: g * y / x,
    "max": _at_extreme,
    "min": _at_extreme,
    "median": _at_extreme,
    "l1": lambda ctx, g, x, y: g * create_op("sign", [x])[0],
    "l2": lambda ctx, g, x, y: g * x / y,
    "logsum": lambda ctx, g, x, y: g / create_op("exp", [y])[0],
    "logsumexp": lambda ctx, g, x, y: g * create_op("exp", [x - y])[0],
    "sumsquare": lambda ctx, g, x, y: g * x * 2.0,
}
for _name, _local in _REDUCTION_GRADS.items():
    grad_rule(_name)(_reduction_rule(_local))


@grad_rule("cumsum")
def _cumsum_grad(ctx):
    # d/dx_i of sum_j g_j * y_j with y_j = sum_{i<=j} x_i is sum_{j>=i} g_j = total - cumsum(g) + g.
    g, dim, shape = ctx.grad(0), ctx.attrs["dim"], ctx.op.inputs[0].shape
    axis = 0 if dim is None else dim
    if g.rank == 0:
        return [g]
    out = sum(g, [axis], keepdims=True) - cumsum(g, axis) + g
    return [out.reshape(shape) if out.shape != shape else out]


@grad_rule("topk")
def _topk_grad(ctx):  # the values' gradients go back to the places they were taken from
    from popxl.ops.misc import init
    from popxl.ops.shape import scatter
    x = ctx.op.inputs[0]
    zeros = init(x.shape, x.dtype, name="zero_grad_topk")
    return [scatter(zeros, ctx.output(1), ctx.grad_or_zeros(0), ctx.attrs["axis"])]
