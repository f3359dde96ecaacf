"""Reductions over axes (sum, mean, prod, max, min, median, l1, l2, logsum, logsumexp, sumsquare) and
index/running/statistical reductions (argmax, argmin, cumsum, topk, histogram, lamb_square)."""
from __future__ import annotations

import builtins
from typing import Callable, Iterable, List, Optional, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register, user_location
from popxl.ops.elementwise import cast, equal
from popxl.ops.indexing import scatter
from popxl.ops.misc import init
from popxl.ops.shape import broadcast_to
from popxl.ops.utils import convert, normalize_axes, spec
from popxl.tensor import Tensor

__all__ = ["argmax", "argmin", "cumsum", "histogram", "l1", "lamb_square", "l2", "logsum", "logsumexp", "max", "mean", "median", "min", "prod", "sum", "sumsquare", "topk"]


_REDUCE_ATTRS = {"axis": "ints", "keepdims": "bool"}  # every reduction over axes


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


def _reduce(opname: str, t: Tensor, axis: Optional[Union[int, Iterable[int]]], keepdims: bool) -> Tensor:
    try:
        axes = normalize_axes(t.rank, axis) if t.rank else ()
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.{opname}: {e} (tensor {t.id!r} of shape {t.shape}) (at {user_location()})") from None
    return create_op(opname, [t], {"axis": axes, "keepdims": builtins.bool(keepdims)})[0]


def _spread(ctx, t: Tensor) -> Tensor:
    """A reduction-output-shaped ``t`` broadcast back over the reduced axes to the input shape."""
    x = ctx.op.inputs[0]
    keep = tuple(1 if i in ctx.attrs["axis"] else d for i, d in enumerate(x.shape))
    if t.shape != keep:
        t = t.reshape(keep)
    return broadcast_to(t, x.shape)


def _reduction_rule(local: Callable[..., Tensor]) -> Callable:
    """The gradient rule of a reduction whose input gradient is ``local(ctx, g, x, y)``, with g and y
    (the output gradient and output) already spread back to the input shape. Use under ``@grad_rule``."""
    def rule(ctx):
        return [local(ctx, _spread(ctx, ctx.grad(0)), ctx.input(0), _spread(ctx, ctx.output(0)))]
    return rule


def _count(ctx) -> int:
    shape = ctx.op.inputs[0].shape
    return int(np.prod([shape[a] for a in ctx.attrs["axis"]], dtype=np.int64))


def _at_extreme(ctx, g, x, y):  # every element equal to the result receives the full gradient
    return g * cast(equal(x, y), x.dtype)


register(OpDef("sum", _reduce_infer, _wide(np.sum), family="reduce", attributes=_REDUCE_ATTRS))


def sum(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Sum over axes.

    Floats are summed in float64 and rounded once; integer sums wrap.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("sum", t, axis, keepdims)


@grad_rule("sum")
@_reduction_rule
def _sum_grad(ctx, g, x, y):
    return g


register(OpDef("mean", _reduce_infer, _wide(np.mean), family="reduce", attributes=_REDUCE_ATTRS))


def mean(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over axes.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("mean", t, axis, keepdims)


@grad_rule("mean")
@_reduction_rule
def _mean_grad(ctx, g, x, y):
    return g * (1.0 / builtins.max(_count(ctx), 1))


register(OpDef("prod", _reduce_infer, _wide(np.prod), family="reduce", attributes=_REDUCE_ATTRS))


def prod(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Product over axes.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("prod", t, axis, keepdims)


@grad_rule("prod")
@_reduction_rule
def _prod_grad(ctx, g, x, y):
    return g * y / x


register(OpDef("max", _reduce_infer, _wide(_extreme(np.max)), family="reduce", attributes=_REDUCE_ATTRS))


def max(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Maximum over axes.

    Over an empty axis the result is -inf, or the integer dtype's lowest value.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("max", t, axis, keepdims)


@grad_rule("max")
@_reduction_rule
def _max_grad(ctx, g, x, y):
    return _at_extreme(ctx, g, x, y)


register(OpDef("min", _reduce_infer, _wide(_extreme(np.min)), family="reduce", attributes=_REDUCE_ATTRS))


def min(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Minimum over axes.

    Over an empty axis the result is +inf, or the integer dtype's largest value.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("min", t, axis, keepdims)


@grad_rule("min")
@_reduction_rule
def _min_grad(ctx, g, x, y):
    return _at_extreme(ctx, g, x, y)


register(OpDef("median", _reduce_infer, _wide(np.median), family="reduce", attributes=_REDUCE_ATTRS))


def median(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Median over axes.

    With an even count, the mean of the two middle values.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("median", t, axis, keepdims)


@grad_rule("median")
@_reduction_rule
def _median_grad(ctx, g, x, y):
    return _at_extreme(ctx, g, x, y)


def _l1(x, axis, keepdims):
    return np.sum(np.abs(x), axis=axis, keepdims=keepdims)


register(OpDef("l1", _reduce_infer, _wide(_l1), family="reduce", attributes=_REDUCE_ATTRS))


def l1(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """L1 norm over axes: the sum of absolute values.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("l1", t, axis, keepdims)


@grad_rule("l1")
@_reduction_rule
def _l1_grad(ctx, g, x, y):
    return g * create_op("sign", [x])[0]


def _l2(x, axis, keepdims):
    return np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims))


register(OpDef("l2", _reduce_infer, _wide(_l2), family="reduce", attributes=_REDUCE_ATTRS))


def l2(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """L2 norm over axes: the square root of the sum of squares.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("l2", t, axis, keepdims)


@grad_rule("l2")
@_reduction_rule
def _l2_grad(ctx, g, x, y):
    return g * x / y


def _logsum(x, axis, keepdims):
    return np.log(np.sum(x, axis=axis, keepdims=keepdims))


register(OpDef("logsum", _reduce_infer, _wide(_logsum), family="reduce", attributes=_REDUCE_ATTRS))


def logsum(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Natural logarithm of the sum over axes.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("logsum", t, axis, keepdims)


@grad_rule("logsum")
@_reduction_rule
def _logsum_grad(ctx, g, x, y):
    return g / create_op("exp", [y])[0]


register(OpDef("logsumexp", _reduce_infer, _wide(_logsumexp), family="reduce", attributes=_REDUCE_ATTRS))


def logsumexp(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(t)))`` over axes, computed without overflow.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("logsumexp", t, axis, keepdims)


@grad_rule("logsumexp")
@_reduction_rule
def _logsumexp_grad(ctx, g, x, y):
    return g * create_op("exp", [x - y])[0]


def _sumsquare(x, axis, keepdims):
    return np.sum(x * x, axis=axis, keepdims=keepdims)


register(OpDef("sumsquare", _reduce_infer, _wide(_sumsquare), family="reduce", attributes=_REDUCE_ATTRS))


def sumsquare(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
    """Sum of squares over axes.

    Args:
        t: A numeric tensor.
        axis: The axis or axes reduced (negative ones count from the end); None reduces all.
        keepdims: Keep each reduced axis as a dimension of size 1.

    Returns:
        A new tensor of ``t``'s dtype, with the reduced axes removed (or kept as size 1).

    Raises:
        TypeError: If ``t`` is not a Tensor, its dtype is bool or complex, or ``axis`` is not an
            int or ints.
        ValueError: If an axis is out of range or repeated, or ``t`` is not in the current graph.
    """
    return _reduce("sumsquare", t, axis, keepdims)


@grad_rule("sumsquare")
@_reduction_rule
def _sumsquare_grad(ctx, g, x, y):
    return g * x * 2.0


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
        raise type(e)(f"ops.{opname}: {e} (tensor {t.id!r} of shape {t.shape}) (at {user_location()})") from None


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


register(OpDef("argmax", _arg_infer, _arg_kernel(np.argmax), grad=Grad.STOP, family="reduce",
               attributes={"dim": "int?", "keepdim": "bool"}))
register(OpDef("argmin", _arg_infer, _arg_kernel(np.argmin), grad=Grad.STOP, family="reduce",
               attributes={"dim": "int?", "keepdim": "bool"}))


def argmax(t: Tensor, dim: Optional[int] = 0, keepdim: Optional[bool] = False) -> Tensor:
    """Index of the largest value along an axis (the first one on ties).

    Args:
        t: A numeric tensor with at least one element.
        dim: The axis searched (negative counts from the end); None searches the flattened tensor.
        keepdim: Keep the searched axis as a dimension of size 1.

    Returns:
        An int32 tensor of indices. Not differentiable.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``t`` is empty, ``dim`` is out of range, or ``t`` is not in the current graph.
    """
    return create_op("argmax", [t], {"dim": _one_axis("argmax", t, dim), "keepdim": builtins.bool(keepdim)})[0]


def argmin(t: Tensor, dim: Optional[int] = 0, keepdim: Optional[bool] = False) -> Tensor:
    """Index of the smallest value along an axis (the first one on ties).

    Args:
        t: A numeric tensor with at least one element.
        dim: The axis searched (negative counts from the end); None searches the flattened tensor.
        keepdim: Keep the searched axis as a dimension of size 1.

    Returns:
        An int32 tensor of indices. Not differentiable.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``t`` is empty, ``dim`` is out of range, or ``t`` is not in the current graph.
    """
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


register(OpDef("cumsum", _cumsum_infer, _cumsum_kernel, family="reduce",
               attributes={"dim": "int?"}))


def cumsum(t: Tensor, dim: Optional[int] = 0) -> Tensor:
    """Inclusive running sum along an axis.

    Integer sums wrap on overflow.

    Args:
        t: A numeric tensor.
        dim: The axis summed along (negative counts from the end); None sums the flattened tensor.

    Returns:
        A tensor of ``t``'s shape and dtype (1-D when ``dim`` is None).

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``dim`` is out of range, or ``t`` is not in the current graph.
    """
    return create_op("cumsum", [t], {"dim": _one_axis("cumsum", t, dim)})[0]


@grad_rule("cumsum")
def _cumsum_grad(ctx):
    # d/dx_i of sum_j g_j * y_j with y_j = sum_{i<=j} x_i is sum_{j>=i} g_j = total - cumsum(g) + g.
    g, dim, shape = ctx.grad(0), ctx.attrs["dim"], ctx.op.inputs[0].shape
    axis = 0 if dim is None else dim
    if g.rank == 0:
        return [g]
    out = sum(g, [axis], keepdims=True) - cumsum(g, axis) + g
    return [out.reshape(shape) if out.shape != shape else out]


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


register(OpDef("topk", _topk_infer, _topk_kernel, family="reduce",
               attributes={"k": "int", "axis": "int", "largest": "bool", "sorted": "bool"}))


def topk(t: Tensor, k: int, axis: int, largest: bool, sorted: bool,
         available_memory_proportion: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) values along an axis, with their indices.

    Equal values keep the lower index first; NaN counts as the largest value. The gradient flows
    to the places the values were taken from.

    Args:
        t: A numeric tensor of rank 1 or more.
        k: How many values to take, at most the length of ``axis``.
        axis: The axis searched (negative counts from the end).
        largest: Take the largest values (True) or the smallest (False).
        sorted: Return the values best first (True) or in their original index order (False).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.

    Returns:
        ``(values, indices)``: ``values`` of ``t``'s dtype and int32 ``indices``, both of ``t``'s
        shape with ``k`` along ``axis``.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``t`` is a scalar, ``k`` is out of range, ``axis`` is out of range, or ``t``
            is not in the current graph.
    """
    ax = _one_axis("topk", t, axis)
    values, indices = create_op("topk", [t], {"k": int(k), "axis": ax, "largest": builtins.bool(largest),
                                              "sorted": builtins.bool(sorted)})
    return values, indices


@grad_rule("topk")
def _topk_grad(ctx):  # the values' gradients go back to the places they were taken from
    x = ctx.op.inputs[0]
    zeros = init(x.shape, x.dtype, name="zero_grad_topk")
    return [scatter(zeros, ctx.output(1), ctx.grad_or_zeros(0), ctx.attrs["axis"])]


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


register(OpDef("histogram", _histogram_infer, _histogram_kernel, grad=Grad.STOP, family="reduce",
               attributes={"levels": "floats", "absolute_of_input": "bool"}))


def histogram(t: Tensor, levels: List[float], absolute_of_input: bool) -> Tensor:
    """Count the values of a tensor in bins bounded by ``levels``.

    Bin 0 counts values below ``levels[0]``, bin ``i`` those in ``[levels[i-1], levels[i])``, and
    the last bin those at or above ``levels[-1]`` (NaN lands there too).

    Args:
        t: A numeric tensor.
        levels: The strictly increasing bin boundaries.
        absolute_of_input: Count ``|t|`` instead of ``t``.

    Returns:
        A uint32 tensor of ``len(levels) + 1`` counts. Not differentiable.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``levels`` is not strictly increasing or holds NaN, or ``t`` is not in the
            current graph.
    """
    return create_op("histogram", [t], {"levels": tuple(float(v) for v in levels),
                                        "absolute_of_input": builtins.bool(absolute_of_input)})[0]


# lamb_square ----------------------------------------------------------------------------------------
def _lamb_square_infer(specs):
    _numeric(specs[0])
    return [spec([], dtypes.float32)]


register(OpDef("lamb_square", _lamb_square_infer,
               lambda x: np.asarray(np.sum(np.square(x.astype(np.float64))), np.float32),
               grad=Grad.STOP, family="reduce",
               attributes={}))


def lamb_square(t: Tensor) -> Tensor:
    """Sum of the squares of all elements, as LAMB's norms use it.

    Args:
        t: A numeric tensor.

    Returns:
        A float32 scalar tensor. Not differentiable.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return create_op("lamb_square", [t])[0]
