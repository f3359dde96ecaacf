"""ONNX entries of the indexing ops: Gather, OneHot, GatherND / ScatterND, ScatterElements,
ReverseSequence, Compress and GatherElements."""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes
from popart.onnx.elementwise import _less
from popart.onnx.table import Node, Value, _as_int32, _axis, _i32, _prod, _strides, onnx_fold, onnx_op

__all__: List[str] = []


@onnx_op("Gather")
def _gather(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n)
    idx = n.imp.static(n.proto.input[1])
    if idx is not None:
        d = x.shape[axis]
        idx = np.asarray(idx)
        if idx.size and (idx.min() < -d or idx.max() >= d):
            raise n.fail(f"indices out of range [-{d}, {d}) for axis {axis} of shape {x.shape}")
        idx_t: popxl.Tensor = popxl.constant(np.where(idx < 0, idx + d, idx).astype(np.int32))
    else:
        idx_t = n.x(1)  # popxl's gather also counts negative indices from the end
    return [ops.gather(x, idx_t, axis)]


@onnx_op("OneHot")
def _onehot(n: Node) -> List[Value]:
    indices = n.x(0)
    depth = n.static_int(1, "depth")
    if not 0 < depth <= np.iinfo(np.int32).max:
        raise n.fail(f"depth {depth} must be between 1 and {np.iinfo(np.int32).max}")
    values = n.x(2)
    axis = int(n.attr("axis", -1))
    if indices.dtype.is_floating_point:  # ONNX allows float indices; they are truncated
        indices = ops.cast(indices, dtypes.int32)
    return [ops.onehot(indices, popxl.constant(np.asarray(depth, np.int32)), values, axis)]


# indexing: gathers and scatters on a flattened view of the data -----------------------------------
# Every index (tuple) becomes a flat row number, so one popxl gather / scatter_reduce along axis 0
# does the work whatever the ranks involved.
def _wrap_negative(idx: popxl.Tensor, dims: np.ndarray) -> popxl.Tensor:
    """Negative indices counted from the end: idx + dims where idx < 0 (``dims`` broadcasts)."""
    return ops.where(_less(idx, _i32(0)), ops.add(idx, _i32(dims)), idx)


def _wrapped_indices(n: Node, idx: np.ndarray, dims: np.ndarray, what: str) -> np.ndarray:
    """Indices known at import (into axes of lengths ``dims``, which broadcasts) as int64 with
    negative values counted from the end; an index outside [-dim, dim) is an error."""
    idx = np.asarray(idx).astype(np.int64)
    if idx.size and ((idx < -dims).any() or (idx >= dims).any()):
        raise n.fail(f"{what} out of range for axes of lengths {np.asarray(dims).tolist()}")
    return np.where(idx < 0, idx + dims, idx)


def _index_input(n: Node, i: int, dims: np.ndarray, what: str) -> popxl.Tensor:
    """Input ``i`` (indices into axes of lengths ``dims``, broadcasting over its trailing axis) as
    int32 with negative values wrapped; checked against the range when known at import."""
    static = n.imp.static(n.proto.input[i]) if n.has(i) else None
    if static is None:
        return _wrap_negative(_as_int32(n.x(i)), dims)
    return _i32(_wrapped_indices(n, static, dims, what))


def _nd_rows(n: Node, data_shape: Tuple[int, ...], batch_dims: int) -> Tuple[popxl.Tensor, int]:
    """GatherND/ScatterND: the flat row of ``data`` viewed as [rows, slice] that each index tuple of
    input 1 names (shape ``indices.shape[:-1]``), and k, the tuple length. Rows count the batch
    dimensions first, then the k indexed dimensions."""
    ishape = n.shape(1)
    b = batch_dims
    if len(ishape) < 1 or not 0 <= b < min(len(ishape), len(data_shape)):
        raise n.fail(f"batch_dims {b} must be below the ranks of data {data_shape} and indices {ishape}")
    if tuple(ishape[:b]) != tuple(data_shape[:b]):
        raise n.fail(f"the first {b} dimensions of indices {ishape} and data {data_shape} must be equal")
    k = ishape[-1]
    if not 1 <= k <= len(data_shape) - b:
        raise n.fail(f"indices.shape[-1] = {k} must be between 1 and {len(data_shape) - b} for data {data_shape}")
    dims = np.asarray(data_shape[b:b + k], np.int64)
    idx = _index_input(n, 1, dims, "indices")
    rows = ops.sum(ops.mul(idx, _i32(_strides(dims))), [-1]) if k > 1 else ops.reshape(idx, tuple(ishape[:-1]))
    if b:
        # Each index tuple stays inside its batch: add the batch's first row.
        batch = np.indices(ishape[:-1])[:b]
        first = sum(int(s) * g for s, g in zip(_strides(data_shape[:b]), batch)) * _prod(dims)
        rows = ops.add(rows, _i32(first))
    return rows, k


def _element_positions(idx: popxl.Tensor, data_shape: Tuple[int, ...], axis: int,
                       grid_shape: Tuple[int, ...]) -> popxl.Tensor:
    """GatherElements-style flat positions into ``data``: the coordinates of each place of
    ``grid_shape`` with the ``axis`` coordinate replaced by ``idx`` (which broadcasts to
    ``grid_shape`` and is already wrapped to non-negative values)."""
    strides = _strides(data_shape)
    grid = np.indices(grid_shape)
    base = sum((int(strides[a]) * grid[a] for a in range(len(data_shape)) if a != axis),
               np.zeros(grid_shape, np.int64))
    return ops.add(_i32(base), ops.mul(idx, _i32(strides[axis])))


# Reductions by opset: ONNX added add/mul at opset 16 and max/min at 18.
_SCATTER_REDUCTION = {"none": "none", "add": "sum", "mul": "mul", "max": "max", "min": "min"}


def _scatter_reduction(n: Node) -> str:
    r = n.attr("reduction", "none")
    allowed = ["none"] + (["add", "mul"] if n.opset >= 16 else []) + (["max", "min"] if n.opset >= 18 else [])
    if r not in allowed:
        raise n.fail(f"reduction must be one of {allowed} at opset {n.opset}, got {r!r}")
    return _SCATTER_REDUCTION[r]


def _scatter_rows(data: popxl.Tensor, rows: popxl.Tensor, updates: popxl.Tensor, reduction: str) -> popxl.Tensor:
    """Scatter ``updates`` [U, S] into the rows ``rows`` [U] of ``data`` [R, S] with ``reduction``
    ("none", "sum", "mul", "max", "min"); returns the new [R, S]."""
    if data.dtype == dtypes.bool:  # scatter_reduce works on numbers: round-trip through int32
        y = _scatter_rows(ops.cast(data, dtypes.int32), rows, ops.cast(updates, dtypes.int32), reduction)
        return ops.cast(y, dtypes.bool)
    if reduction == "mul":
        # No multiplying scatter in popxl: give every update the product of all updates aimed at its
        # row (a [U, U] same-row mask; O(U^2 S) work), multiply the row by it, then write it back.
        # Updates sharing a row write the same value, so the plain write is well defined.
        u = rows.shape[0]
        same = ops.equal(ops.reshape(rows, (u, 1, 1)), ops.reshape(rows, (1, u, 1)))
        ones = popxl.constant(np.ones((), updates.dtype.as_numpy()))
        factor = ops.prod(ops.where(same, ops.reshape(updates, (1,) + updates.shape), ones), [1])
        updates, reduction = ops.mul(ops.gather(data, rows, 0), factor), "none"
    return ops.scatter_reduce(updates, rows, reduction, initial_values=data, axis=0)


# GatherND / ScatterND ---------------------------------------------------------------------------------
@onnx_op("GatherND")
def _gather_nd(n: Node) -> List[Value]:
    x = n.x(0)
    b = int(n.attr("batch_dims", 0)) if n.opset >= 12 else 0
    rows, k = _nd_rows(n, x.shape, b)
    tail = x.shape[b + k:]
    y = ops.gather(ops.reshape(x, (_prod(x.shape[:b + k]), _prod(tail))), rows, 0)
    return [ops.reshape(y, tuple(n.shape(1)[:-1]) + tuple(tail))]


@onnx_op("ScatterND")
def _scatter_nd(n: Node) -> List[Value]:
    x, upd = n.x(0), n.x(2)
    reduction = _scatter_reduction(n)
    rows, k = _nd_rows(n, x.shape, 0)
    want = tuple(n.shape(1)[:-1]) + tuple(x.shape[k:])
    if tuple(upd.shape) != want:
        raise n.fail(f"updates have shape {upd.shape}, expected indices.shape[:-1] + data.shape[k:] = {want}")
    r, s, u = _prod(x.shape[:k]), _prod(x.shape[k:]), _prod(n.shape(1)[:-1])
    y = _scatter_rows(ops.reshape(x, (r, s)), ops.reshape(rows, (u,)), ops.reshape(upd, (u, s)), reduction)
    return [ops.reshape(y, x.shape)]


# ScatterElements / ReverseSequence -------------------------------------------------------------------
@onnx_op("ScatterElements")
def _scatter_elements(n: Node) -> List[Value]:
    x, upd = n.x(0), n.x(2)
    reduction = _scatter_reduction(n)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n, scalar_axis=False)
    ishape = n.shape(1)
    if len(ishape) != x.rank or tuple(upd.shape) != tuple(ishape):
        raise n.fail(f"indices {ishape} and updates {upd.shape} must have one shape, of the rank of data {x.shape}")
    if any(i > d for i, d in zip(ishape, x.shape)):
        raise n.fail(f"indices {ishape} may not be larger than data {x.shape} in any dimension")
    idx = _index_input(n, 1, np.asarray(x.shape[axis], np.int64), "indices")
    flat = ops.reshape(_element_positions(idx, x.shape, axis, tuple(ishape)), (_prod(ishape),))
    y = _scatter_rows(ops.reshape(x, (x.nelms, 1)), flat, ops.reshape(upd, (_prod(ishape), 1)), reduction)
    return [ops.reshape(y, x.shape)]


@onnx_op("ReverseSequence")
def _reverse_sequence(n: Node) -> List[Value]:
    x = n.x(0)
    t_axis, b_axis = int(n.attr("time_axis", 0)), int(n.attr("batch_axis", 1))
    if x.rank < 2 or {t_axis, b_axis} != {0, 1}:
        raise n.fail(f"needs rank >= 2 and time_axis/batch_axis 0 and 1 (one each), got {t_axis}/{b_axis} "
                     f"for shape {x.shape}")
    t, b = x.shape[t_axis], x.shape[b_axis]
    if tuple(n.shape(1)) != (b,):
        raise n.fail(f"sequence_lens must have shape ({b},), got {n.shape(1)}")

    def along(axis: int, v: popxl.Tensor) -> popxl.Tensor:  # v laid along ``axis`` of x's rank
        return ops.reshape(v, tuple(v.nelms if a == axis else 1 for a in range(x.rank)))

    lens = along(b_axis, _as_int32(n.x(1)))
    time = along(t_axis, _i32(np.arange(t)))
    # Time step i of a sequence of length L reads step L - 1 - i while i < L, else itself.
    src = ops.where(_less(time, lens), ops.sub(ops.sub(lens, _i32(1)), time), time)
    flat = _element_positions(src, x.shape, t_axis, x.shape)
    return [ops.gather(ops.reshape(x, (x.nelms,)), flat, 0)]


@onnx_op("Compress")
def _compress(n: Node) -> List[Value]:
    x = n.x(0)
    cond = np.asarray(n.static(1, "condition"))
    if cond.ndim != 1:
        raise n.fail(f"condition must be 1-D, got shape {cond.shape}")
    axis: Optional[int] = n.attr("axis")
    if axis is None:  # no axis: select from the flattened input
        x, axis = ops.reshape(x, (x.nelms,)), 0
    axis = _axis(int(axis), x.rank, n)
    keep = np.flatnonzero(cond.astype(bool))
    if keep.size and keep[-1] >= x.shape[axis]:
        raise n.fail(f"condition selects index {int(keep[-1])}, beyond the length {x.shape[axis]} of axis {axis}")
    return [ops.gather(x, _i32(keep), axis)]


def _gather_elements_axis(n: Node, data_shape: Tuple[int, ...], idx_shape: Tuple[int, ...]) -> int:
    """GatherElements' axis, checked with the shapes: indices of data's rank, no longer than data
    along the other axes (the output takes the indices' shape)."""
    if len(idx_shape) != len(data_shape):
        raise n.fail(f"indices rank {len(idx_shape)} differs from data rank {len(data_shape)}")
    axis = _axis(int(n.attr("axis", 0)), len(data_shape), n, scalar_axis=False)
    if any(i > d for a, (i, d) in enumerate(zip(idx_shape, data_shape)) if a != axis):
        raise n.fail(f"indices {tuple(idx_shape)} may not be longer than data {tuple(data_shape)} in an axis "
                     f"other than {axis}")
    return axis


@onnx_op("GatherElements")
def _gather_elements(n: Node) -> List[Value]:
    x, idx = n.x(0), n.x(1)
    axis = _gather_elements_axis(n, x.shape, idx.shape)
    idx = _index_input(n, 1, np.asarray(x.shape[axis], np.int64), "indices")
    return [ops.gather(ops.reshape(x, (x.nelms,)), _element_positions(idx, x.shape, axis, idx.shape), 0)]


@onnx_fold("GatherElements")
def _gather_elements_at_import(n: Node, data: np.ndarray, indices: np.ndarray) -> List[np.ndarray]:
    # ONNX's reference implementation picks with np.choose, which takes at most 32/64 choices (the
    # length of the axis): longer axes fell back to a path that read one index per row.
    axis = _gather_elements_axis(n, data.shape, indices.shape)
    idx = _wrapped_indices(n, indices, np.asarray(data.shape[axis], np.int64), "indices")
    # The output has the indices' shape: data is cut to it along the other axes.
    region = data[tuple(slice(None) if a == axis else slice(0, k) for a, k in enumerate(idx.shape))]
    return [np.take_along_axis(region, idx, axis)]
