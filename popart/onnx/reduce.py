"""ONNX entries of the reductions: the Reduce* ops, ArgMax / ArgMin, the cumulative sums and
products, TopK."""
from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes
from popart.onnx.shape import _ints_arg, _repeat_axis
from popart.onnx.table import Node, Value, _axis, _i32, onnx_fold, onnx_op

__all__: List[str] = []


# reductions -------------------------------------------------------------------------------------------
_REDUCE: Dict[str, Callable[..., popxl.Tensor]] = {
    "ReduceMean": ops.mean, "ReduceSum": ops.sum, "ReduceMax": ops.max, "ReduceMin": ops.min,
    "ReduceProd": ops.prod, "ReduceL1": ops.l1, "ReduceL2": ops.l2, "ReduceLogSumExp": ops.logsumexp,
    "ReduceSumSquare": ops.sumsquare, "ReduceLogSum": ops.logsum,
}


@onnx_op(*_REDUCE)
def _reduce(n: Node) -> List[Value]:
    x = n.x(0)
    # Axes moved from an attribute to an input: ReduceSum at opset 13, the others at opset 18.
    axes = _ints_arg(n, "axes", 13 if n.op_type == "ReduceSum" else 18)
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.rank))
    axes = sorted({_axis(a, x.rank, n, "axes") for a in axes})
    keep = bool(n.attr("keepdims", 1))
    if x.dtype == dtypes.bool and n.op_type in ("ReduceMax", "ReduceMin"):
        # Max of bools is "any", min is "all" (not any of the negations): counted as int32, which
        # also gives the right identity (False for max, True for min) over an empty set.
        probe = x if n.op_type == "ReduceMax" else ops.logical_not(x)
        count = ops.sum(ops.cast(probe, dtypes.int32), axes, keepdims=keep)
        hit = ops.greater(count, _i32(0))
        return [hit if n.op_type == "ReduceMax" else ops.logical_not(hit)]
    return [_REDUCE[n.op_type](x, axes, keepdims=keep)]


@onnx_op("ArgMax", "ArgMin")
def _argmax(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n)
    keep = bool(n.attr("keepdims", 1))
    fn = ops.argmax if n.op_type == "ArgMax" else ops.argmin
    if not n.attr("select_last_index", 0):
        return [fn(x, axis, keep)]
    # The last extreme index: search the reversed axis, then map the index back.
    d = x.shape[axis]
    idx = fn(ops.gather(x, np.arange(d - 1, -1, -1).tolist(), axis), axis, keep)
    return [ops.sub(popxl.constant(np.asarray(d - 1, idx.dtype.as_numpy())), idx)]


def _shift_in(x: popxl.Tensor, axis: int, k: int, fill: float) -> popxl.Tensor:
    """``x`` moved ``k`` places up ``axis``, the first ``k`` positions holding ``fill``."""
    length = x.shape[axis]
    k = min(k, length)
    head = popxl.constant(np.full(x.shape[:axis] + (k,) + x.shape[axis + 1:], fill, x.dtype.as_numpy()))
    if k == length:
        return head
    return ops.concat([head, ops.slice(x, start=[0], stop=[length - k], axis=[axis])], axis)


def _cumprod(x: popxl.Tensor, axis: int) -> popxl.Tensor:
    # log2(n) rounds of multiplying by the partial products 1, 2, 4 ... places back (popxl has no
    # cumulative product; log/exp would fail on zeros and negative values).
    y, step = x, 1
    while step < x.shape[axis]:
        y = ops.mul(y, _shift_in(y, axis, step, 1))
        step *= 2
    return y


@onnx_op("CumSum", "CumProd")
def _cumulative(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(n.static_int(1, "axis"), x.rank, n, scalar_axis=False)  # a scalar has no axis to run along
    flip = np.arange(x.shape[axis] - 1, -1, -1)
    reverse = bool(n.attr("reverse", 0))
    product = n.op_type == "CumProd"
    y = _repeat_axis(x, axis, flip) if reverse else x
    if n.attr("exclusive", 0):  # each position sees only those before it: shift the identity in
        y = _shift_in(y, axis, 1, 1 if product else 0)
    y = _cumprod(y, axis) if product else ops.cumsum(y, axis)
    return [_repeat_axis(y, axis, flip) if reverse else y]


@onnx_fold("CumSum", "CumProd")
def _cumulative_at_import(n: Node, x: np.ndarray, axis_input: np.ndarray) -> List[np.ndarray]:
    # ONNX's reference CumSum refuses the one-element 1-D axis the entry (and ONNX Runtime) take.
    axis = _axis(n.static_int(1, "axis"), x.ndim, n, scalar_axis=False)
    y = np.flip(x, axis) if n.attr("reverse", 0) else x
    identity = 1 if n.op_type == "CumProd" else 0
    if n.attr("exclusive", 0) and y.shape[axis]:  # each position sees only those before it
        first = np.full_like(np.take(y, [0], axis), identity)
        y = np.concatenate([first, np.delete(y, -1, axis)], axis)
    y = (np.cumprod if identity else np.cumsum)(y, axis, dtype=x.dtype)
    return [np.flip(y, axis) if n.attr("reverse", 0) else y]


@onnx_op("TopK")
def _topk(n: Node) -> List[Value]:
    x = n.x(0)
    k = n.static_int(1, "K")
    axis = _axis(int(n.attr("axis", -1)), x.rank, n)
    values, indices = ops.topk(x, k, axis, bool(n.attr("largest", 1)), bool(n.attr("sorted", 1)))
    return [values, indices]
