"""Ops that pick or place values by index: gather (plain, tied, grouped), Tensor indexing (getitem),
scatter, scatter_reduce, dynamic slice / update and onehot, each followed by its gradient rule (and
the internal ops those rules use: gather_grad, gather_elements, groupedgather_grad)."""
from __future__ import annotations

import builtins
from typing import Any, Iterable, List, Optional, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register, user_location
from popxl.ops.elementwise import where, cast, equal
from popxl.ops.misc import init
from popxl.ops.shape import _axis_of, reshape
from popxl.ops.utils import normalize_axes, spec
from popxl.tensor import Tensor, constant, Constant

__all__ = ["dynamic_slice", "dynamic_update", "dynamic_update_", "gather", "groupedgather", "onehot", "scatter",
           "scatter_reduce", "tied_gather"]


# helpers shared by the ops below ---------------------------------------------------------------------
def _int_tensor(value: Any, dtype: dtypes.dtype = dtypes.int32) -> Tensor:
    """A Tensor as is; host data (lists, arrays, ints) as an integer constant."""
    return value if isinstance(value, Tensor) else constant(np.asarray(value), dtype)


def _need_int(s, what: str) -> None:
    if not s.dtype.is_int:
        raise TypeError(f"{what} must be an integer tensor, got {s.dtype.name}")


def _wrap(idx: np.ndarray, dim: int, negative_from_end: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """Indices as int64 with negatives counted from the end (unless ``negative_from_end`` is False:
    then they are out of range, as PopART's zero_OOR has it), and a mask of those in range. uint64
    indices beyond int64's range become its largest value (out of range) rather than wrapping to
    negative ones."""
    if idx.dtype == np.uint64:
        idx = np.minimum(idx, np.uint64(np.iinfo(np.int64).max))
    idx = idx.astype(np.int64)
    if negative_from_end:
        idx = np.where(idx < 0, idx + dim, idx)
    return idx, (idx >= 0) & (idx < dim)


# gather --------------------------------------------------------------------------------------------
def _gather_kernel(x, idx, axis, zero_OOR):
    d = x.shape[axis]
    # NumPy-style negative indices, except with zero_OOR: then every index outside [0, d) gives 0
    # (vocabulary-sharded embeddings subtract their shard's offset and rely on it)
    idx, valid = _wrap(idx, d, negative_from_end=not zero_OOR)
    if d == 0:  # every index is out of range
        return np.zeros(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)
    out = np.take(x, np.where(valid, idx, 0), axis=axis)
    if not valid.all():  # out of range gives zeros (defined behaviour here)
        mask_shape = [1] * axis + list(idx.shape) + [1] * (x.ndim - axis - 1)
        out = np.where(valid.reshape(mask_shape), out, np.zeros((), x.dtype))
    return out


def _gather_infer(specs, axis, zero_OOR):
    t, idx = specs
    if not idx.dtype.is_int:
        raise TypeError(f"indices must be an integer tensor, got {idx.dtype.name}")
    if len(t.shape) == 0:
        raise ValueError("cannot gather from a scalar")
    ax = normalize_axes(len(t.shape), axis)[0]
    return [spec(t.shape[:ax] + idx.shape + t.shape[ax + 1:], t.dtype)]


register(OpDef("gather", _gather_infer, _gather_kernel, family="shape",
               attributes={"axis": "int", "zero_OOR": "bool"}))


def gather(t: Tensor, indices: Union[Tensor, List[int]], axis: int = 0,
           available_memory_proportion: Optional[float] = None, zero_OOR: bool = False) -> Tensor:
    """Take slices of a tensor at the given indices along an axis, as ``numpy.take``.

    The output shape is ``t.shape[:axis] + indices.shape + t.shape[axis + 1:]``. Negative indices
    count from the end unless ``zero_OOR`` is set; out-of-range ones give 0.

    Args:
        t: The tensor read.
        indices: Integer indices into ``axis`` (a tensor, or host data made a constant).
        axis: The axis indexed (negative counts from the end).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.
        zero_OOR: Every index outside ``[0, n)`` gives 0, negative ones included (as in PopART);
            without it, negative indices count from the end and others out of range give 0.

    Returns:
        A new tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``indices`` is not integer.
        ValueError: If ``axis`` is out of range, or a tensor is not in the current graph.
    """
    ax = axis % t.rank if t.rank and -t.rank <= axis < t.rank else axis
    return create_op("gather", [t, _int_tensor(indices)], {"axis": int(ax), "zero_OOR": builtins.bool(zero_OOR)})[0]


# tied_gather / groupedgather ------------------------------------------------------------------------
register(OpDef("tied_gather", _gather_infer, _gather_kernel, family="shape",
               attributes={"axis": "int", "zero_OOR": "bool"}))


def tied_gather(t: Tensor, indices: Tensor, axis: int = 0, available_memory_proportion: Optional[float] = None,
                zero_OOR: bool = False) -> Tensor:
    """Numerically `gather` (``numpy.take``); on the IPU it differs only in tile layout.

    Args:
        t: The tensor read.
        indices: Integer indices into ``axis`` (a tensor, or host data made a constant).
        axis: The axis indexed (negative counts from the end).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.
        zero_OOR: Every index outside ``[0, n)`` gives 0, negative ones included (as in PopART);
            without it, negative indices count from the end and others out of range give 0.

    Returns:
        A new tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``indices`` is not integer.
        ValueError: If ``axis`` is out of range, or a tensor is not in the current graph.
    """
    return create_op("tied_gather", [t, _int_tensor(indices)],
                     {"axis": _axis_of("tied_gather", t.rank, axis), "zero_OOR": builtins.bool(zero_OOR)})[0]


def _grouped_gather_infer(specs, axis, group_size, zero_OOR):
    t, idx = specs
    _need_int(idx, "indices")
    if len(t.shape) < 2 or len(idx.shape) < 1:
        raise ValueError("t needs a group dimension and at least one more; indices needs a group dimension")
    if t.shape[0] != group_size or idx.shape[0] != group_size:
        raise ValueError(f"the first dimension of t ({t.shape[0]}) and of indices ({idx.shape[0]}) must both "
                         f"equal group_size={group_size}")
    rest = list(t.shape[1:])
    return [spec([group_size] + rest[:axis] + list(idx.shape[1:]) + rest[axis + 1:], t.dtype)]


def _grouped_gather_kernel(t, idx, axis, group_size, zero_OOR):
    return np.stack([_gather_kernel(t[g], idx[g], axis, zero_OOR) for g in range(group_size)])


register(OpDef("groupedgather", _grouped_gather_infer, _grouped_gather_kernel, family="shape",
               attributes={"axis": "int", "group_size": "int", "zero_OOR": "bool"}))


def groupedgather(t: Tensor, indices: Tensor, axis: int = 0, group_size: Optional[int] = 1,
                  available_memory_proportion: Optional[float] = None, zero_OOR: bool = False) -> Tensor:
    """`gather` done separately in each group: dimension 0 of ``t`` and ``indices`` is the group.

    ``out[g] = gather(t[g], indices[g], axis, zero_OOR=zero_OOR)``.

    Args:
        t: The tensor read, groups on dimension 0.
        indices: Integer indices, groups on dimension 0.
        axis: The axis indexed, counted within one group (``t.shape[1:]``).
        group_size: The number of groups (dimension 0 of both tensors).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.
        zero_OOR: Every index outside ``[0, n)`` gives 0, negative ones included (as in PopART);
            without it, negative indices count from the end and others out of range give 0.

    Returns:
        A new tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``indices`` is not integer.
        ValueError: If the group dimensions disagree with ``group_size``, ``axis`` is out of range,
            or a tensor is not in the current graph.
    """
    group_size = 1 if group_size is None else int(group_size)
    ax = _axis_of("groupedgather", builtins.max(t.rank - 1, 0), axis)
    return create_op("groupedgather", [t, _int_tensor(indices)],
                     {"axis": ax, "group_size": group_size, "zero_OOR": builtins.bool(zero_OOR)})[0]


def _gather_grad_infer(specs, axis, size, zero_OOR):
    g, idx = specs
    shape = list(g.shape[:axis]) + [size] + list(g.shape[axis + len(idx.shape):])
    return [spec(shape, g.dtype)]


def _gather_grad_kernel(g, idx, axis, size, zero_OOR):
    """Sum the gathered gradients back into their rows (repeats add; out-of-range rows got 0)."""
    idx, valid = _wrap(idx, size, negative_from_end=not zero_OOR)
    valid = valid.reshape(-1)
    rows = np.moveaxis(g, list(range(axis, axis + idx.ndim)), list(range(idx.ndim)))
    rows = rows.reshape((-1,) + rows.shape[idx.ndim:])
    wide = np.promote_types(g.dtype, np.float32)
    out = np.zeros((size,) + rows.shape[1:], wide)
    np.add.at(out, idx.reshape(-1)[valid], rows[valid].astype(wide))
    return np.moveaxis(out, 0, axis).astype(g.dtype)


# A dedicated op: the scatter-add of a gather's gradient is one pass, not a one-hot matmul.
register(OpDef("gather_grad", _gather_grad_infer, _gather_grad_kernel, grad=Grad.RAISE, family="shape",
               attributes={"axis": "int", "size": "int", "zero_OOR": "bool"}))


@grad_rule("gather", "tied_gather")
def _gather_grad(ctx):
    x, axis = ctx.op.inputs[0], ctx.attrs["axis"]
    attrs = {"axis": axis, "size": x.shape[axis], "zero_OOR": ctx.attrs["zero_OOR"]}
    return [create_op("gather_grad", [ctx.grad(0), ctx.input(1)], attrs)[0], None]


def _grouped_gather_grad_kernel(g, idx, axis, size, group_size, zero_OOR):
    return np.stack([_gather_grad_kernel(g[i], idx[i], axis, size, zero_OOR) for i in range(group_size)])


register(OpDef("groupedgather_grad", lambda specs, axis, size, group_size, zero_OOR: [spec(
    [specs[0].shape[0]] + list(specs[0].shape[1:axis + 1]) + [size] +
    list(specs[0].shape[axis + len(specs[1].shape):]), specs[0].dtype)],
    _grouped_gather_grad_kernel, grad=Grad.RAISE, family="shape",
               attributes={"axis": "int", "size": "int", "group_size": "int", "zero_OOR": "bool"}))


@grad_rule("groupedgather")
def _grouped_gather_grad(ctx):
    x, a = ctx.op.inputs[0], ctx.attrs
    attrs = {"axis": a["axis"], "size": x.shape[1 + a["axis"]], "group_size": a["group_size"],
             "zero_OOR": a["zero_OOR"]}
    return [create_op("groupedgather_grad", [ctx.grad(0), ctx.input(1)], attrs)[0], None]


# indexing ------------------------------------------------------------------------------------------
def getitem(t: Tensor, key: Any) -> Tensor:
    """``t[key]``: ints, slices, ``...`` and ``None`` as NumPy (negative indices count from the end);
    an integer tensor/array gathers on axis 0; a bool tensor/array zeroes the unselected elements."""
    try:
        return _getitem(t, key)
    except (TypeError, IndexError) as e:
        if "(at " in str(e):  # raised by an op it made, which named the line already
            raise
        raise type(e)(f"{e} (at {user_location()})") from None


def _getitem(t: Tensor, key: Any) -> Tensor:
    if isinstance(key, (Tensor, np.ndarray, list)):
        kt = key if isinstance(key, Tensor) else constant(np.asarray(key))
        if kt.dtype is dtypes.bool:
            return where(kt, t, constant(0, t.dtype))
        if kt.dtype.is_int:
            return gather(t, kt)
        raise TypeError(f"Tensor index must be integer or bool, not {kt.dtype.name} (indexing {t.id!r}).")
    items = key if isinstance(key, tuple) else (key,)
    for k in items:
        if isinstance(k, (builtins.bool, np.bool_)) or not (
                isinstance(k, (int, np.integer, builtins.slice)) or k is None or k is Ellipsis):
            raise TypeError(f"Cannot index {t.id!r} with {k!r} ({type(k).__name__}): use ints, slices, "
                            f"..., None, or an integer/bool tensor.")
    if builtins.sum(k is Ellipsis for k in items) > 1:
        raise IndexError(f"an index of {t.id!r} can only have a single ellipsis")
    consuming = builtins.sum(1 for k in items if k is not None and k is not Ellipsis)
    if consuming > t.rank:
        raise IndexError(f"too many indices for {t.id!r} of shape {t.shape}: {consuming} given")
    fill = (builtins.slice(None),) * (t.rank - consuming)
    if Ellipsis in items:
        i = items.index(Ellipsis)
        items = items[:i] + fill + items[i + 1:]
    else:
        items = items + fill
    starts, stops, steps, strides, out_shape = [], [], [], [], []
    axis = 0
    for k in items:
        if k is None:
            out_shape.append(1)
            continue
        d = t.shape[axis]
        if isinstance(k, builtins.slice):
            a, b, c = k.indices(d)
            n = len(range(a, b, c))
            out_shape.append(n)
            if n == 0:
                a, b, c = 0, 0, 1
        else:
            k = int(k)
            if not -d <= k < d:
                raise IndexError(f"index {k} is out of bounds for axis {axis} of {t.id!r} with size {d}")
            a, b, c = k % d, k % d + 1, 1
        starts.append(a)
        stops.append(b)
        steps.append(1 if c > 0 else -1)
        strides.append(builtins.abs(c))
        axis += 1
    out = t
    if (tuple(starts), tuple(stops), tuple(steps)) != ((0,) * t.rank, t.shape, (1,) * t.rank):
        out = create_op("slice", [out], {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)})[0]
    if any(s != 1 for s in strides):
        out = create_op("subsample", [out], {"strides": tuple(strides)})[0]
    if tuple(out_shape) != out.shape:
        out = reshape(out, tuple(out_shape))
    return out


# scatter --------------------------------------------------------------------------------------------
def _scatter_infer(specs, axis):
    t, idx, vals = specs
    _need_int(idx, "indices")
    if vals.dtype is not t.dtype:
        raise TypeError(f"values ({vals.dtype.name}) must have the dtype of t ({t.dtype.name})")
    if not (len(t.shape) == len(idx.shape) == len(vals.shape)) or len(t.shape) == 0:
        raise ValueError("t, indices and values must have the same rank (at least 1)")
    if idx.shape != vals.shape:
        raise ValueError(f"indices {idx.shape} and values {vals.shape} must have the same shape")
    if any(i > d for i, d in zip(idx.shape, t.shape)):
        raise ValueError(f"indices {idx.shape} may not be larger than t {t.shape} in any dimension")
    return [spec(t.shape, t.dtype)]


def _target_positions(idx, axis, dim):
    """Full coordinates into the output for every element of an index tensor used along ``axis``
    (ScatterElements style), and which of them are in range."""
    wrapped, ok = _wrap(idx, dim)
    coords = list(np.indices(idx.shape, sparse=False))
    coords[axis] = wrapped
    return tuple(c[ok] for c in coords), ok


def _scatter_kernel(t, idx, vals, axis):
    out = t.copy()
    where, ok = _target_positions(idx, axis, t.shape[axis])
    out[where] = vals[ok]
    return out


register(OpDef("scatter", _scatter_infer, _scatter_kernel, family="shape",
               attributes={"axis": "int"}))


def scatter(t: Tensor, indices: Tensor, values: Tensor, axis: int = 0,
            available_memory_proportion: Optional[float] = None) -> Tensor:
    """A copy of a tensor with values written where indices point along an axis (ONNX ScatterElements).

    ``out[..., indices[i, j], ...] = values[i, j]``: the index replaces the ``axis`` coordinate.
    Negative indices count from the end; out-of-range ones are ignored; when several indices hit
    one place, the last written wins.

    Args:
        t: The tensor written into (it is not modified).
        indices: Integer indices, of ``values``' shape and ``t``'s rank.
        values: The values written, of ``t``'s dtype.
        axis: The axis indexed (negative counts from the end).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If a tensor argument is not a Tensor, ``indices`` is not integer, or the dtypes
            of ``t`` and ``values`` differ.
        ValueError: If the ranks or shapes disagree, ``axis`` is out of range, or a tensor is not in
            the current graph.
    """
    indices = _int_tensor(indices)
    values = values if isinstance(values, Tensor) else constant(np.asarray(values), t.dtype)
    return create_op("scatter", [t, indices, values], {"axis": _axis_of("scatter", t.rank, axis)})[0]


# scatter_reduce -------------------------------------------------------------------------------------
_SCATTER_REDUCTIONS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "none": None}


def _scatter_index_shape(data_shape, idx_shape, axis, broadcast):
    """The shape indices are expanded to (the data's), or ValueError."""
    if tuple(idx_shape) == tuple(data_shape):
        return idx_shape
    if not broadcast:
        raise ValueError(f"indices {idx_shape} must have the shape of data {data_shape} "
                         f"(enable_index_broadcast is off)")
    ok = (len(idx_shape) == 1 and idx_shape[0] == data_shape[axis]) or (
        len(idx_shape) <= len(data_shape) and
        all(i in (1, d) for i, d in zip(idx_shape, data_shape)))
    if not ok:
        raise ValueError(f"indices {idx_shape} cannot be broadcast to data {data_shape} along axis {axis}")
    return data_shape


def _expand_indices(idx, data_shape, axis):
    if idx.shape == data_shape:
        return idx
    if idx.ndim == 1 and idx.shape[0] == data_shape[axis] and len(data_shape) > 1:
        idx = idx.reshape([1] * axis + [-1] + [1] * (len(data_shape) - axis - 1))
    else:
        idx = idx.reshape(idx.shape + (1,) * (len(data_shape) - idx.ndim))
    return np.broadcast_to(idx, data_shape)


def _scatter_reduce_infer(specs, reduction, axis, axis_size, enable_index_broadcast):
    data, idx = specs[:2]
    _need_int(idx, "indices")
    if not (data.dtype.is_floating_point or data.dtype.is_int):
        raise TypeError(f"data must be numeric, got {data.dtype.name}")
    if reduction not in _SCATTER_REDUCTIONS:
        raise ValueError(f"reduction must be one of {list(_SCATTER_REDUCTIONS)}, got {reduction!r}")
    if len(data.shape) == 0:
        raise ValueError("data must have at least one dimension")
    _scatter_index_shape(data.shape, idx.shape, axis, enable_index_broadcast)
    shape = list(data.shape)
    shape[axis] = axis_size
    if len(specs) > 2:
        init = specs[2]
        if init.dtype is not data.dtype:
            raise TypeError(f"initial_values ({init.dtype.name}) must have the dtype of data ({data.dtype.name})")
        if tuple(init.shape) != tuple(shape):
            raise ValueError(f"initial_values has shape {init.shape}, expected the output shape {tuple(shape)}")
    return [spec(shape, data.dtype)]


def _identity_of(ufunc, dt: np.dtype):
    """The neutral start value of a reduction in dtype ``dt``."""
    if ufunc is np.add:
        return 0
    big = np.inf if dt.kind == "f" else np.iinfo(dt).max
    small = -np.inf if dt.kind == "f" else np.iinfo(dt).min
    return small if ufunc is np.maximum else big


def _scatter_reduce_kernel(data, idx, *init, reduction, axis, axis_size, enable_index_broadcast):
    shape = list(data.shape)
    shape[axis] = axis_size
    idx = _expand_indices(idx, data.shape, axis)
    where, ok = _target_positions(idx, axis, axis_size)
    src = data[ok]
    out = init[0].copy() if init else np.zeros(shape, data.dtype)
    ufunc = _SCATTER_REDUCTIONS[reduction]
    if ufunc is None:
        out[where] = src
    elif init:
        ufunc.at(out, where, src)
    else:  # only the scattered values take part; untouched places stay 0
        hit = np.zeros(shape, bool)
        hit[where] = True
        acc = np.full(shape, _identity_of(ufunc, data.dtype), data.dtype)
        ufunc.at(acc, where, src)
        out = np.where(hit, acc, out)
    return out


register(OpDef("scatter_reduce", _scatter_reduce_infer, _scatter_reduce_kernel, family="shape",
               attributes={"reduction": "str", "axis": "int", "axis_size": "int", "enable_index_broadcast": "bool"}))


def scatter_reduce(data: Tensor, indices: Tensor, reduction: str, initial_values: Optional[Tensor] = None,
                   axis: int = 0, axis_size: Optional[int] = None, enable_index_broadcast: int = True,
                   available_memory_proportion: Optional[float] = None) -> Tensor:
    """Reduce the elements of ``data`` into the places ``indices`` name along an axis.

    With ``initial_values`` the output starts from them and they take part in the reduction;
    without, places no index names are 0. ``indices`` has ``data``'s shape, or (with
    ``enable_index_broadcast``) a 1-D list of ``data.shape[axis]`` positions, or a shape that
    broadcasts once trailing dimensions are padded. Negative indices count from the end;
    out-of-range ones are ignored.

    Args:
        data: The values reduced.
        indices: Integer target positions along ``axis``.
        reduction: "sum", "max", "min", or "none" (plain writes; the last one wins).
        initial_values: The starting output, whose ``axis`` length sets the output's.
        axis: The axis reduced into (negative counts from the end).
        axis_size: The output's length along ``axis`` (needed without ``initial_values``).
        enable_index_broadcast: Allow ``indices`` of a shape that broadcasts to ``data``'s.
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.

    Returns:
        A new tensor of ``data``'s shape except ``axis``, and ``data``'s dtype.

    Raises:
        TypeError: If a tensor argument is not a Tensor or ``indices`` is not integer.
        ValueError: If ``reduction`` is unknown, neither ``axis_size`` nor ``initial_values`` gives
            the output length, the shapes disagree, or a tensor is not in the current graph.
    """
    ax = _axis_of("scatter_reduce", data.rank, axis)
    if axis_size is None:
        if initial_values is None:
            raise ValueError("ops.scatter_reduce: give initial_values or axis_size (the output's axis length)")
        axis_size = initial_values.shape[ax]
    elif initial_values is not None and initial_values.rank == data.rank and initial_values.shape[ax] != axis_size:
        raise ValueError(f"ops.scatter_reduce: axis_size {axis_size} does not match initial_values "
                         f"{initial_values.shape} on axis {ax}")
    ins = [data, _int_tensor(indices)] + ([initial_values] if initial_values is not None else [])
    return create_op("scatter_reduce", ins, {"reduction": reduction, "axis": ax, "axis_size": int(axis_size),
                                             "enable_index_broadcast": builtins.bool(enable_index_broadcast)})[0]


def _gather_elements_infer(specs, axis, data_shape):
    return [spec(data_shape or specs[1].shape, specs[0].dtype)]


def _gather_elements_kernel(g, idx, axis, data_shape):
    """out[i] = g at idx[i] along ``axis`` (other coordinates i's own); 0 where idx is out of range.
    With ``data_shape`` the indices are first expanded as scatter_reduce expands them."""
    if data_shape:
        idx = _expand_indices(idx, tuple(data_shape), axis)
    where, ok = _target_positions(idx, axis, g.shape[axis])
    out = np.zeros(idx.shape, g.dtype)
    out[ok] = g[where]
    return out


# Internal: the gradient of the scattered values (each reads the gradient of the place it went to).
register(OpDef("gather_elements", _gather_elements_infer, _gather_elements_kernel, grad=Grad.RAISE, family="shape",
               attributes={"axis": "int", "data_shape": "ints"}))


@grad_rule("scatter")
def _scatter_grad(ctx):
    """Places overwritten by ``values`` pass no gradient to ``t``; each value gets its place's."""
    g, idx, values = ctx.grad(0), ctx.input(1), ctx.op.inputs[2]
    axis = ctx.attrs["axis"]
    cleared = create_op("scatter", [g, idx, init(values.shape, values.dtype, name="zero_values")], {"axis": axis})[0]
    picked = create_op("gather_elements", [g, idx], {"axis": axis, "data_shape": ()})[0]
    return [cleared if ctx.needs(0) else None, None, picked if ctx.needs(2) else None]


@grad_rule("scatter_reduce")
def _scatter_reduce_grad(ctx):
    """sum: each element gets its place's gradient, the initial values get all of it. max/min:
    the gradient goes to every element (and initial value) equal to its place's result. none:
    every writer gets its place's gradient and the initial values keep it where nothing wrote."""
    a, g = ctx.attrs, ctx.grad(0)
    data, idx = ctx.op.inputs[0], ctx.input(1)
    has_init = len(ctx.op.inputs) > 2

    def at_places(t: Tensor) -> Tensor:  # t (output-shaped) read at each element's place
        return create_op("gather_elements", [t, idx], {"axis": a["axis"], "data_shape": tuple(data.shape)})[0]

    d_data, d_init = at_places(g), g
    if a["reduction"] in ("max", "min"):
        out = ctx.output(0)
        d_data = d_data * cast(equal(ctx.input(0), at_places(out)), data.dtype)
        d_init = g * cast(equal(ctx.input(2), out), data.dtype) if has_init else None
    elif a["reduction"] == "none" and has_init:
        ones = init(data.shape, data.dtype, name="ones") + 1.0
        attrs = {**a, "reduction": "max"}
        hit = create_op("scatter_reduce", [ones, idx, init(g.shape, g.dtype, name="zeros")], attrs)[0]
        d_init = g * (1.0 - hit)
    return [d_data if ctx.needs(0) else None, None] + ([d_init if ctx.needs(2) else None] if has_init else [])


# dynamic_slice / dynamic_update ---------------------------------------------------------------------
# Offsets are read at run time from a 1-D integer tensor (one entry per listed axis). An offset
# that would put the region outside the tensor is clamped so the region stays inside.
def _dynamic_region(t_shape, idx_spec, axes, sizes):
    """Validate a dynamic region and return the region's shape."""
    _need_int(idx_spec, "index")
    if len(axes) != len(sizes):
        raise ValueError(f"axes {list(axes)} and sizes {list(sizes)} must have the same length")
    if tuple(idx_spec.shape) != (len(axes),):
        raise ValueError(f"index must be 1-D with one offset per axis, i.e. shape ({len(axes)},), "
                         f"got {idx_spec.shape}")
    shape = list(t_shape)
    for a, n in zip(axes, sizes):
        if not 0 <= n <= t_shape[a]:
            raise ValueError(f"size {n} on axis {a} must be between 0 and the axis length {t_shape[a]}")
        shape[a] = n
    return shape


def _dynamic_index(x_shape, offsets, axes, sizes) -> tuple:
    sl = [builtins.slice(None)] * len(x_shape)
    for a, n, off in zip(axes, sizes, np.asarray(offsets).reshape(-1).tolist()):
        start = min(max(int(off), 0), x_shape[a] - n)
        sl[a] = builtins.slice(start, start + n)
    return tuple(sl)


def _dynamic_slice_infer(specs, axes, sizes, no_overlap):
    t, idx = specs
    return [spec(_dynamic_region(t.shape, idx, axes, sizes), t.dtype)]


def _dynamic_update_infer(specs, axes, sizes, no_overlap):
    t, idx, upd = specs
    shape = _dynamic_region(t.shape, idx, axes, sizes)
    if upd.dtype is not t.dtype:
        raise TypeError(f"t_update ({upd.dtype.name}) must have the dtype of t ({t.dtype.name})")
    if tuple(upd.shape) != tuple(shape):
        raise ValueError(f"t_update has shape {upd.shape} but the updated region has shape {tuple(shape)}")
    return [spec(t.shape, t.dtype)]


def _dynamic_update_kernel(t, idx, upd, axes, sizes, no_overlap):
    out = t.copy()
    out[_dynamic_index(t.shape, idx, axes, sizes)] = upd
    return out


register(OpDef("dynamic_slice", _dynamic_slice_infer,
               lambda t, idx, axes, sizes, no_overlap: t[_dynamic_index(t.shape, idx, axes, sizes)].copy(),
               family="shape",
               attributes={"axes": "ints", "sizes": "ints", "no_overlap": "bool"}))
register(OpDef("dynamic_update", _dynamic_update_infer, _dynamic_update_kernel, family="shape",
               attributes={"axes": "ints", "sizes": "ints", "no_overlap": "bool"}))
register(OpDef("dynamic_update_", _dynamic_update_infer, _dynamic_update_kernel, inplace=0, grad=Grad.STOP,
               family="shape",
               attributes={"axes": "ints", "sizes": "ints", "no_overlap": "bool"}))


def _dynamic_attrs(opname: str, t: Tensor, axes: Iterable[int], sizes: Iterable[int], no_overlap: bool) -> dict:
    try:
        ax = normalize_axes(t.rank, list(axes))
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.{opname}: {e} (tensor {t.id!r} of shape {t.shape}) (at {user_location()})") from None
    return {"axes": ax, "sizes": tuple(int(n) for n in sizes), "no_overlap": builtins.bool(no_overlap)}


def dynamic_slice(t: Tensor, index: Tensor, axes: List[int], sizes: List[int], no_overlap: bool) -> Tensor:
    """A copy of the region of a tensor that starts at run-time offsets.

    Offsets that would overrun are clamped so that the region stays inside ``t``.

    Args:
        t: The tensor read.
        index: A 1-D integer tensor of run-time offsets, one per entry of ``axes``.
        axes: The axes the region is offset along.
        sizes: The region's length along each of ``axes``.
        no_overlap: Whether regions of different calls never overlap (a gradient hint only).

    Returns:
        A new tensor of ``t``'s shape with ``sizes`` along ``axes``.

    Raises:
        TypeError: If a tensor argument is not a Tensor, or ``index`` is not integer.
        ValueError: If ``index``, ``axes`` and ``sizes`` disagree in length, an axis is out of
            range, a size exceeds its axis, or a tensor is not in the current graph.
    """
    index = _int_tensor(index, dtypes.uint32)
    return create_op("dynamic_slice", [t, index], _dynamic_attrs("dynamic_slice", t, axes, sizes, no_overlap))[0]


def dynamic_update(t: Tensor, index: Tensor, t_update: Tensor, axes: Iterable[int], sizes: Iterable[int],
                   no_overlap: bool) -> Tensor:
    """A copy of a tensor with the region at run-time offsets replaced (see `dynamic_slice`).

    Args:
        t: The tensor updated.
        index: A 1-D integer tensor of run-time offsets, one per entry of ``axes``.
        t_update: The new values, of the region's shape.
        axes: The axes the region is offset along.
        sizes: The region's length along each of ``axes``.
        no_overlap: Whether regions of different calls never overlap (a gradient hint only).

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If a tensor argument is not a Tensor, or ``index`` is not integer.
        ValueError: If ``index``, ``axes`` and ``sizes`` disagree in length, an axis is out of
            range, a size exceeds its axis, or a tensor is not in the current graph.
    """
    index = _int_tensor(index, dtypes.uint32)
    return create_op("dynamic_update", [t, index, t_update],
                     _dynamic_attrs("dynamic_update", t, axes, sizes, no_overlap))[0]


def dynamic_update_(t: Tensor, index: Tensor, t_update: Tensor, axes: Iterable[int], sizes: Iterable[int],
                    no_overlap: bool) -> Tensor:
    """`dynamic_update` in place: the region of ``t`` itself is overwritten.

    Args:
        t: The tensor updated.
        index: A 1-D integer tensor of run-time offsets, one per entry of ``axes``.
        t_update: The new values, of the region's shape.
        axes: The axes the region is offset along.
        sizes: The region's length along each of ``axes``.
        no_overlap: Whether regions of different calls never overlap (a gradient hint only).

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If a tensor argument is not a Tensor, or ``index`` is not integer.
        ValueError: If ``index``, ``axes`` and ``sizes`` disagree in length, an axis is out of
            range, a size exceeds its axis, or a tensor is not in the current graph.
    """
    index = _int_tensor(index, dtypes.uint32)
    return create_op("dynamic_update_", [t, index, t_update],
                     _dynamic_attrs("dynamic_update_", t, axes, sizes, no_overlap))[0]


@grad_rule("dynamic_slice")
def _dynamic_slice_grad(ctx):
    x = ctx.op.inputs[0]
    zeros = init(x.shape, x.dtype, name=f"zero_grad_{x.name}")
    return [create_op("dynamic_update", [zeros, ctx.input(1), ctx.grad(0)], ctx.attrs)[0], None]


@grad_rule("dynamic_update")
def _dynamic_update_grad(ctx):
    g, index, upd = ctx.grad(0), ctx.input(1), ctx.op.inputs[2]
    cleared = create_op("dynamic_update", [g, index, init(upd.shape, upd.dtype, name="zero_update")], ctx.attrs)[0]
    return [cleared if ctx.needs(0) else None, None,
            create_op("dynamic_slice", [g, index], ctx.attrs)[0] if ctx.needs(2) else None]


# onehot ---------------------------------------------------------------------------------------------
def _onehot_infer(specs, axis, num_classes):
    t, _, values = specs
    if not (t.dtype.is_int or t.dtype.is_floating_point):
        raise TypeError(f"t must hold numeric class indices, got {t.dtype.name}")
    if tuple(values.shape) != (2,):
        raise ValueError(f"values must have shape (2,) ([off, on]), got {values.shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    r = len(t.shape)
    if not -r - 1 <= axis <= r:
        raise ValueError(f"axis {axis} is out of range for an output of rank {r + 1}")
    shape = list(t.shape)
    shape.insert(axis % (r + 1), num_classes)
    return [spec(shape, values.dtype)]


def _onehot_kernel(t, _num_classes, values, axis, num_classes):
    if t.dtype.kind == "f":  # truncated in float64: NaN, infinite and huge indices are out of range
        i = np.trunc(t.astype(np.float64))
        i = np.where(i < 0, i + num_classes, i)
        ok = (i >= 0) & (i < num_classes)
        idx = np.where(ok, i, 0).astype(np.int64)
    else:
        idx, ok = _wrap(t, num_classes)
    ax = axis % (t.ndim + 1)
    classes = np.arange(num_classes).reshape([num_classes] + [1] * (t.ndim - ax))
    hot = (np.expand_dims(idx, ax) == classes) & np.expand_dims(ok, ax)
    return np.where(hot, values[1], values[0]).astype(values.dtype)


register(OpDef("onehot", _onehot_infer, _onehot_kernel, family="shape",
               attributes={"axis": "int", "num_classes": "int"}))


def onehot(t: Tensor, num_classes: Tensor, values: Tensor, axis: int) -> Tensor:
    """One-hot encoding as ONNX OneHot: a new axis holding ``values[1]`` at each index and ``values[0]`` elsewhere.

    Negative indices count from the end; out-of-range ones give a row of ``values[0]``.

    Args:
        t: Integer class indices.
        num_classes: A constant scalar tensor: the length of the new axis (its value fixes the shape).
        values: A 2-element tensor ``[off, on]``; it gives the output dtype.
        axis: Where the new axis goes (-1 = last).

    Returns:
        A new tensor of ``values``' dtype with one more axis than ``t``.

    Raises:
        TypeError: If a tensor argument is not a Tensor, or ``t`` is not numeric.
        ValueError: If ``num_classes`` is not a constant scalar, ``values`` does not have 2
            elements, ``axis`` is out of range, or a tensor is not in the current graph.
    """

    if not isinstance(num_classes, Tensor):
        num_classes = constant(np.asarray(num_classes), dtypes.int32)
    if not isinstance(num_classes, Constant):
        raise ValueError(f"ops.onehot: num_classes ({num_classes.id!r}) must be a constant so the output shape "
                         f"is known when tracing")
    depth = np.asarray(num_classes._host_data_value).reshape(-1)
    if depth.size != 1:
        raise ValueError(f"ops.onehot: num_classes must hold one value, got shape {num_classes.shape}")
    if not isinstance(values, Tensor):
        values = constant(np.asarray(values))
    return create_op("onehot", [t, num_classes, values], {"axis": int(axis), "num_classes": int(depth[0])})[0]


@grad_rule("onehot")
def _onehot_grad(ctx):
    """out = on where hot else off: d off = sum(g) over cold places, d on = over hot places."""
    g, values = ctx.grad(0), ctx.op.inputs[2]
    mask = create_op("onehot", [ctx.input(0), ctx.input(1), constant(np.array([0, 1]), values.dtype)], ctx.attrs)[0]
    hot = create_op("sum", [g * mask], {"axis": tuple(range(g.rank)), "keepdims": False})[0]
    total = create_op("sum", [g], {"axis": tuple(range(g.rank)), "keepdims": False})[0]
    return [None, None, create_op("concat", [(total - hot).reshape((1,)), hot.reshape((1,))], {"axis": 0})[0]]
