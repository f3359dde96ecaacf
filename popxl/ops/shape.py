"""Shape and data-movement ops: reshape, transpose, slice, concat, split, squeeze, subsample,
gather (plain, tied, grouped), scatter, scatter_reduce, dynamic slice/update, onehot, interpolate,
and Tensor indexing. View variants (``reshape_``, ``transpose_``, ``slice_``, ``flatten_``) alias
their input: lowering places them inside the input's storage, so writes through them are seen."""
from __future__ import annotations

import builtins
from typing import Any, Iterable, List, Optional, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import normalize_axes, spec
from popxl.tensor import Tensor, constant, shape_tuple

__all__ = ["concat", "concat_", "dynamic_slice", "dynamic_update", "dynamic_update_", "flatten", "flatten_", "gather",
           "groupedgather", "interpolate", "onehot", "reshape", "reshape_", "scatter", "scatter_reduce", "slice", "slice_",
           "split", "squeeze", "subsample", "tied_gather", "transpose", "transpose_"]

INT32_MAX = 2 ** 31 - 1
INT32_MIN = -(2 ** 31)


# reshape / flatten ----------------------------------------------------------------------------------
def _reshape_infer(specs, shape):
    s = specs[0]
    if int(np.prod(shape, dtype=np.int64)) != int(np.prod(s.shape, dtype=np.int64)):
        raise ValueError(f"cannot reshape {s.shape} ({int(np.prod(s.shape))} elements) to {shape}")
    return [spec(shape, s.dtype)]


def _reshape_view(x, shape):
    """``x`` reshaped as a view of the same memory; ValueError when that needs a copy. Never
    copies: the compiler learns a view's layout from a stand-in array whose data are not there."""
    if _RESHAPE_HAS_COPY:
        return np.reshape(x, shape, copy=False)  # ValueError rather than a copy
    view = x.view()
    try:
        view.shape = shape  # NumPy < 2.1: in place on a view, refused rather than copied
    except AttributeError as e:
        raise ValueError(f"cannot reshape {x.shape} with strides {x.strides} to {tuple(shape)} without a copy") from e
    return view


_RESHAPE_HAS_COPY = np.lib.NumpyVersion(np.__version__) >= "2.1.0"


register(OpDef("reshape", _reshape_infer, lambda x, shape: x.reshape(shape).copy(), view=_reshape_view, copy=True,
               family="shape"))
register(OpDef("reshape_", _reshape_infer, _reshape_view, view=_reshape_view, grad=Grad.STOP, family="shape"))


def _resolve_shape(t: Tensor, shape: Iterable[int]) -> Tuple[int, ...]:
    shape = shape_tuple(shape, f"ops.reshape: shape for tensor {t.id!r}", min_dim=-1)
    if builtins.sum(d == -1 for d in shape) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"ops.reshape: shape {shape} may contain at most one -1 and no other negative "
                         f"entry (tensor {t.id!r} has shape {t.shape})")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        shape = tuple((t.nelms // known if known else 0) if d == -1 else d for d in shape)
    return shape


def reshape(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """A copy of a tensor with a new shape.

    Args:
        t: The tensor reshaped.
        shape: The new shape, with the same number of elements; one entry may be -1 (inferred).

    Returns:
        A new tensor of ``shape`` holding ``t``'s values in order.

    Raises:
        TypeError: If ``t`` is not a Tensor or ``shape`` is not a sequence of ints.
        ValueError: If the element counts differ, ``shape`` has more than one -1 or another negative
            entry, or ``t`` is not in the current graph.
    """
    return create_op("reshape", [t], {"shape": _resolve_shape(t, shape)})[0]


def reshape_(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """A tensor viewed with a new shape (an alias: writes through it change ``t``).

    Args:
        t: The tensor viewed.
        shape: The new shape, with the same number of elements; one entry may be -1 (inferred).

    Returns:
        An alias of ``t`` with shape ``shape``.

    Raises:
        TypeError: If ``t`` is not a Tensor or ``shape`` is not a sequence of ints.
        ValueError: If the element counts differ, ``shape`` has more than one -1 or another negative
            entry, or ``t`` is not in the current graph.
    """
    return create_op("reshape_", [t], {"shape": _resolve_shape(t, shape)})[0]


def flatten(t: Tensor) -> Tensor:
    """A 1-D copy of a tensor.

    Args:
        t: The tensor flattened.

    Returns:
        A new 1-D tensor of ``t.nelms`` elements.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return reshape(t, (t.nelms,))


def flatten_(t: Tensor) -> Tensor:
    """A tensor viewed as 1-D (an alias: writes through it change ``t``).

    Args:
        t: The tensor viewed.

    Returns:
        An alias of ``t`` of shape ``(t.nelms,)``.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return reshape_(t, (t.nelms,))


def squeeze(t: Tensor, axes: Optional[List[int]] = None) -> Tensor:
    """Drop dimensions of size 1.

    Args:
        t: The tensor squeezed.
        axes: The axes dropped (each of size 1); None drops every size-1 axis.

    Returns:
        A new tensor without those dimensions.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If an axis is repeated, out of range or not of size 1, or ``t`` is not in the
            current graph.
    """
    if axes is None:
        keep = [d for d in t.shape if d != 1]
    else:
        try:
            ax = normalize_axes(t.rank, axes)
        except (ValueError, TypeError) as e:
            raise type(e)(f"ops.squeeze: {e} (tensor {t.id!r} of shape {t.shape})") from None
        bad = [a for a in ax if t.shape[a] != 1]
        if bad:
            raise ValueError(f"ops.squeeze: axes {bad} of {t.id!r} {t.shape} do not have size 1")
        keep = [d for i, d in enumerate(t.shape) if i not in ax]
    return reshape(t, tuple(keep))


# transpose -----------------------------------------------------------------------------------------
def _transpose_infer(specs, permutation):
    s = specs[0]
    if sorted(permutation) != list(range(len(s.shape))):
        raise ValueError(f"permutation {permutation} is not a permutation of the {len(s.shape)} axes")
    return [spec([s.shape[p] for p in permutation], s.dtype)]


def _transpose_view(x, permutation):
    return x.transpose(permutation)


register(OpDef("transpose", _transpose_infer, lambda x, permutation: x.transpose(permutation).copy(order="C"),
               view=_transpose_view, copy=True, family="shape"))
register(OpDef("transpose_", _transpose_infer, _transpose_view, view=_transpose_view, grad=Grad.STOP,
               family="shape"))


def _perm(t: Tensor, permutation: Optional[Iterable[int]]) -> Tuple[int, ...]:
    if permutation is None:
        return tuple(reversed(range(t.rank)))
    perm = tuple(int(p) for p in permutation)
    bad = [p for p in perm if p >= t.rank or p < -t.rank]
    if bad:
        raise ValueError(f"ops.transpose: permutation {perm} has entries out of range for {t.id!r} of "
                         f"rank {t.rank}")
    return tuple(p % t.rank if t.rank else p for p in perm)


def transpose(t: Tensor, permutation: Optional[Tuple[int, ...]] = None) -> Tensor:
    """A copy of a tensor with its axes permuted.

    Args:
        t: The tensor transposed.
        permutation: The input axis of each output axis; None reverses the axes.

    Returns:
        A new tensor with permuted axes.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``permutation`` is not a permutation of ``t``'s axes, or ``t`` is not in the
            current graph.
    """
    return create_op("transpose", [t], {"permutation": _perm(t, permutation)})[0]


def transpose_(t: Tensor, permutation: Optional[Tuple[int, ...]] = None) -> Tensor:
    """A tensor viewed with its axes permuted (an alias: writes through it change ``t``).

    Args:
        t: The tensor viewed.
        permutation: The input axis of each output axis; None reverses the axes.

    Returns:
        An alias of ``t`` with permuted axes.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``permutation`` is not a permutation of ``t``'s axes, or ``t`` is not in the
            current graph.
    """
    return create_op("transpose_", [t], {"permutation": _perm(t, permutation)})[0]


# slice ---------------------------------------------------------------------------------------------
# The op's attributes are normalised per axis: range(start, stop, step) with step +-1 and no
# negative wrapping (stop == -1 with step -1 means "through index 0").
def _slice_index(starts, stops, steps):
    return tuple(builtins.slice(a, None if (b < 0) else b, c) for a, b, c in zip(starts, stops, steps))


def _slice_infer(specs, starts, stops, steps):
    s = specs[0]
    if not (len(starts) == len(stops) == len(steps) == len(s.shape)):
        raise ValueError("slice attributes must cover every axis")
    shape = [len(range(a, b, c)) for a, b, c in zip(starts, stops, steps)]
    return [spec(shape, s.dtype)]


def _slice_view(x, starts, stops, steps):
    return x[_slice_index(starts, stops, steps)]


register(OpDef("slice", _slice_infer, lambda x, **a: _slice_view(x, **a).copy(), view=_slice_view, copy=True,
               family="shape"))
register(OpDef("slice_", _slice_infer, _slice_view, view=_slice_view, grad=Grad.RAISE, family="shape"))


def _onnx_bounds(dim: int, start: int, stop: int, step: int) -> Tuple[int, int]:
    """ONNX Slice clamping of one axis."""
    if start < 0:
        start += dim
    if stop < 0:
        stop += dim
    if step > 0:
        return min(max(start, 0), dim), min(max(stop, 0), dim)
    return min(max(start, 0), dim - 1), min(max(stop, -1), dim - 1)


def _slice_attrs(t: Tensor, start, stop, step, axis) -> dict:
    def as_list(v):
        return None if v is None else ([int(v)] if isinstance(v, (int, np.integer)) else [int(x) for x in v])

    start, stop, step, axis = as_list(start), as_list(stop), as_list(step), as_list(axis)
    n = next(len(v) for v in (start, stop, step, axis, list(range(t.rank))) if v is not None)
    for nm, v in (("start", start), ("stop", stop), ("step", step), ("axis", axis)):
        if v is not None and len(v) != n:
            raise ValueError(f"ops.slice: {nm} has {len(v)} entries but other arguments have {n} "
                             f"(tensor {t.id!r} of shape {t.shape})")
    axis = list(range(n)) if axis is None else list(normalize_axes(t.rank, axis))
    step = [1] * n if step is None else step
    if any(s not in (1, -1) for s in step):
        raise ValueError(f"ops.slice: steps must be 1 or -1, got {step}; use ops.subsample for larger strides")
    start = [0 if s > 0 else -1 for s in step] if start is None else start
    stop = [INT32_MAX if s > 0 else INT32_MIN for s in step] if stop is None else stop
    starts, stops, steps = [0] * t.rank, list(t.shape), [1] * t.rank
    for a, b, c, ax in zip(start, stop, step, axis):
        starts[ax], stops[ax] = _onnx_bounds(t.shape[ax], a, b, c)
        steps[ax] = c
    return {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)}


def slice(t: Tensor, start: Optional[Union[int, List[int]]] = None, stop: Optional[Union[int, List[int]]] = None,
          step: Optional[Union[int, List[int]]] = None, axis: Optional[Union[int, List[int]]] = None) -> Tensor:
    """A copy of a slice of a tensor, as ONNX Slice (bounds are clamped; negative ones count from the end).

    Args:
        t: The tensor sliced.
        start: The first index per sliced axis (an int or a list); default 0, or the end when the
            step is negative.
        stop: The index past the last per sliced axis; default the end (the start when stepping
            backwards).
        step: 1 or -1 per sliced axis; default 1.
        axis: The axes sliced; default the first ``len(start)`` axes.

    Returns:
        A new tensor holding the slice (``t`` itself when start, stop and step are all None).

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If the lists have different lengths, a step is not 1 or -1, an axis is out of
            range, or ``t`` is not in the current graph.
    """
    if start is None and stop is None and step is None:
        return t
    return create_op("slice", [t], _slice_attrs(t, start, stop, step, axis))[0]


def slice_(t: Tensor, start: Optional[Union[int, List[int]]] = None, stop: Optional[Union[int, List[int]]] = None,
           step: Optional[Union[int, List[int]]] = None, axis: Optional[Union[int, List[int]]] = None) -> Tensor:
    """A slice of a tensor as a view (an alias: writes through it change ``t``).

    Args:
        t: The tensor sliced.
        start: The first index per sliced axis (an int or a list); default 0, or the end when the
            step is negative.
        stop: The index past the last per sliced axis; default the end (the start when stepping
            backwards).
        step: 1 or -1 per sliced axis; default 1.
        axis: The axes sliced; default the first ``len(start)`` axes.

    Returns:
        An alias of the selected region of ``t``.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If the lists have different lengths, a step is not 1 or -1, an axis is out of
            range, or ``t`` is not in the current graph.
    """
    if start is None and stop is None and step is None:
        return t
    return create_op("slice_", [t], _slice_attrs(t, start, stop, step, axis))[0]


# subsample -----------------------------------------------------------------------------------------
def _subsample_infer(specs, strides):
    s = specs[0]
    if any(st < 1 for st in strides):
        raise ValueError(f"strides must be >= 1, got {strides}")
    return [spec([-(-d // st) for d, st in zip(s.shape, strides)], s.dtype)]


def _subsample_view(x, strides):
    return x[tuple(builtins.slice(None, None, st) for st in strides)]


register(OpDef("subsample", _subsample_infer, lambda x, strides: _subsample_view(x, strides).copy(),
               view=_subsample_view, copy=True, family="shape"))


def subsample(t: Tensor, strides: Union[int, Iterable[int]]) -> Tensor:
    """Every n-th element along each axis.

    Args:
        t: The tensor subsampled.
        strides: The step per axis (a single int for axis 0; a short list is padded with 1).

    Returns:
        A new tensor of the selected elements.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If there are more strides than axes, a stride is below 1, or ``t`` is not in the
            current graph.
    """
    strides = [int(strides)] if isinstance(strides, (int, np.integer)) else [int(s) for s in strides]
    if len(strides) > t.rank:
        raise ValueError(f"ops.subsample: {len(strides)} strides for {t.id!r} of rank {t.rank}")
    strides += [1] * (t.rank - len(strides))
    return create_op("subsample", [t], {"strides": tuple(strides)})[0]


# concat --------------------------------------------------------------------------------------------
def _concat_infer(specs, axis):
    if not specs:
        raise ValueError("needs at least one tensor")
    if len({s.dtype for s in specs}) > 1:  # PopXL's words (its tests match them)
        raise TypeError("All inputs to a concat operation must have the same type: got "
                        + ", ".join(s.dtype.name for s in specs))
    dt = specs[0].dtype
    r = len(specs[0].shape)
    if any(len(s.shape) != r for s in specs):
        raise ValueError("all inputs must have the same rank")
    if r == 0:
        raise ValueError("cannot concatenate scalars")
    ax = normalize_axes(r, axis)[0]
    for s in specs:
        if [d for i, d in enumerate(s.shape) if i != ax] != [d for i, d in enumerate(specs[0].shape) if i != ax]:
            raise ValueError(f"shapes must match except on axis {ax}")
    shape = list(specs[0].shape)
    shape[ax] = builtins.sum(s.shape[ax] for s in specs)
    return [spec(shape, dt)]


register(OpDef("concat", _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis), family="shape"))


def concat(ts: Iterable[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an axis.

    Args:
        ts: The tensors joined: same dtype, same lengths on the other axes.
        axis: The axis joined along (negative counts from the end).

    Returns:
        A new tensor whose ``axis`` is the sum of the inputs' lengths.

    Raises:
        TypeError: If an input is not a Tensor, or the dtypes differ.
        ValueError: If no tensor is given, the other dimensions differ, ``axis`` is out of range, or
            a tensor is not in the current graph.
    """
    return create_op("concat", list(ts), {"axis": int(axis)})[0]


# gather --------------------------------------------------------------------------------------------
def _gather_kernel(x, idx, axis, zero_OOR):
    d = x.shape[axis]
    idx, valid = _wrap(idx, d)  # NumPy-style negative indices
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


register(OpDef("gather", _gather_infer, _gather_kernel, family="shape"))


def gather(t: Tensor, indices: Union[Tensor, List[int]], axis: int = 0,
           available_memory_proportion: Optional[float] = None, zero_OOR: bool = False) -> Tensor:
    """Take slices of a tensor at the given indices along an axis, as ``numpy.take``.

    The output shape is ``t.shape[:axis] + indices.shape + t.shape[axis + 1:]``. Negative indices
    count from the end; out-of-range ones give 0.

    Args:
        t: The tensor read.
        indices: Integer indices into ``axis`` (a tensor, or host data made a constant).
        axis: The axis indexed (negative counts from the end).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.
        zero_OOR: Out-of-range indices give 0 (they always do here).

    Returns:
        A new tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``indices`` is not integer.
        ValueError: If ``axis`` is out of range, or a tensor is not in the current graph.
    """
    if not isinstance(indices, Tensor):
        indices = constant(np.asarray(indices), dtypes.int32)
    ax = axis % t.rank if t.rank and -t.rank <= axis < t.rank else axis
    return create_op("gather", [t, indices], {"axis": int(ax), "zero_OOR": builtins.bool(zero_OOR)})[0]


# indexing ------------------------------------------------------------------------------------------
def getitem(t: Tensor, key: Any) -> Tensor:
    """``t[key]``: ints, slices, ``...`` and ``None`` as NumPy (negative indices count from the end);
    an integer tensor/array gathers on axis 0; a bool tensor/array zeroes the unselected elements."""
    from popxl.ops.elementwise import where

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


# helpers shared by the ops below ---------------------------------------------------------------------
def _axis_of(opname: str, rank: int, axis: int, what: str = "axis") -> int:
    """One axis normalised to 0..rank-1; errors name the op."""
    try:
        return normalize_axes(rank, axis)[0]
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.{opname}: {what}: {e}") from None


def _int_tensor(value: Any, dtype: dtypes.dtype = dtypes.int32) -> Tensor:
    """A Tensor as is; host data (lists, arrays, ints) as an integer constant."""
    return value if isinstance(value, Tensor) else constant(np.asarray(value), dtype)


def _need_int(s, what: str) -> None:
    if not s.dtype.is_int:
        raise TypeError(f"{what} must be an integer tensor, got {s.dtype.name}")


def _wrap(idx: np.ndarray, dim: int) -> Tuple[np.ndarray, np.ndarray]:
    """Indices as int64 with negatives counted from the end, and a mask of those in range. uint64
    indices beyond int64's range become its largest value (out of range) rather than wrapping to
    negative ones."""
    if idx.dtype == np.uint64:
        idx = np.minimum(idx, np.uint64(np.iinfo(np.int64).max))
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    return idx, (idx >= 0) & (idx < dim)


# concat_ --------------------------------------------------------------------------------------------
register(OpDef("concat_", _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis), family="shape"))


def concat_(ts: Iterable[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an axis: PopXL's in-place flavour of `concat`.

    Here the result is a new tensor holding the same values; it does not share storage with the
    inputs.

    Args:
        ts: The tensors joined: same dtype, same lengths on the other axes.
        axis: The axis joined along (negative counts from the end).

    Returns:
        A new tensor whose ``axis`` is the sum of the inputs' lengths.

    Raises:
        TypeError: If an input is not a Tensor, or the dtypes differ.
        ValueError: If no tensor is given, the other dimensions differ, ``axis`` is out of range, or
            a tensor is not in the current graph.
    """
    return create_op("concat_", list(ts), {"axis": int(axis)})[0]


# split ----------------------------------------------------------------------------------------------
def _split_infer(specs, axis, splits):
    s = specs[0]
    shapes = []
    for n in splits:
        shape = list(s.shape)
        shape[axis] = n
        shapes.append(spec(shape, s.dtype))
    return shapes


def _split_kernel(x, axis, splits):
    return tuple(np.split(x, np.cumsum(splits)[:-1], axis=axis))


register(OpDef("split", _split_infer, _split_kernel, family="shape"))


def split(t: Tensor, splits: Union[int, List[int]], axis: int = 0) -> List[Tensor]:
    """Cut a tensor into parts along an axis.

    Args:
        t: The tensor cut.
        splits: The number of equal parts (it must divide the axis length), or the list of part
            lengths (which must add up to it).
        axis: The axis cut along (negative counts from the end).

    Returns:
        A list of new tensors, in order along ``axis``.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If the parts do not fit the axis length, ``axis`` is out of range, or ``t`` is
            not in the current graph.
    """
    if t.rank == 0:
        raise ValueError(f"ops.split: cannot split the scalar {t.id!r}")
    ax = _axis_of("split", t.rank, axis)
    d = t.shape[ax]
    if isinstance(splits, (int, np.integer)):
        if splits <= 0 or d % splits:
            raise ValueError(f"ops.split: axis {ax} of {t.id!r} {t.shape} (length {d}) cannot be split into "
                             f"{splits} equal parts")
        parts = [d // int(splits)] * int(splits)
    else:
        parts = [int(n) for n in splits]
        if not parts or any(n < 0 for n in parts) or builtins.sum(parts) != d:
            raise ValueError(f"ops.split: part lengths {parts} must be non-negative and add up to the length "
                             f"{d} of axis {ax} of {t.id!r} {t.shape}")
    return list(create_op("split", [t], {"axis": ax, "splits": tuple(parts)}))


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


register(OpDef("scatter", _scatter_infer, _scatter_kernel, family="shape"))


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


register(OpDef("scatter_reduce", _scatter_reduce_infer, _scatter_reduce_kernel, family="shape"))


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
    if initial_values is None and axis_size is None:
        raise ValueError("ops.scatter_reduce: give initial_values or axis_size (the output's axis length)")
    ax = _axis_of("scatter_reduce", data.rank, axis)
    if axis_size is None:
        axis_size = initial_values.shape[ax]
    elif initial_values is not None and initial_values.rank == data.rank and initial_values.shape[ax] != axis_size:
        raise ValueError(f"ops.scatter_reduce: axis_size {axis_size} does not match initial_values "
                         f"{initial_values.shape} on axis {ax}")
    ins = [data, _int_tensor(indices)] + ([initial_values] if initial_values is not None else [])
    return create_op("scatter_reduce", ins, {"reduction": reduction, "axis": ax, "axis_size": int(axis_size),
                                             "enable_index_broadcast": builtins.bool(enable_index_broadcast)})[0]


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
               family="shape"))
register(OpDef("dynamic_update", _dynamic_update_infer, _dynamic_update_kernel, family="shape"))
register(OpDef("dynamic_update_", _dynamic_update_infer, _dynamic_update_kernel, inplace=0, grad=Grad.STOP,
               family="shape"))


def _dynamic_attrs(opname: str, t: Tensor, axes: Iterable[int], sizes: Iterable[int], no_overlap: bool) -> dict:
    try:
        ax = normalize_axes(t.rank, list(axes))
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.{opname}: {e} (tensor {t.id!r} of shape {t.shape})") from None
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


# tied_gather / groupedgather ------------------------------------------------------------------------
register(OpDef("tied_gather", _gather_infer, _gather_kernel, family="shape"))


def tied_gather(t: Tensor, indices: Tensor, axis: int = 0, available_memory_proportion: Optional[float] = None,
                zero_OOR: bool = False) -> Tensor:
    """Numerically `gather` (``numpy.take``); on the IPU it differs only in tile layout.

    Args:
        t: The tensor read.
        indices: Integer indices into ``axis`` (a tensor, or host data made a constant).
        axis: The axis indexed (negative counts from the end).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.
        zero_OOR: Out-of-range indices give 0 (they always do here).

    Returns:
        A new tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``indices`` is not integer.
        ValueError: If ``axis`` is out of range, or a tensor is not in the current graph.
    """
    return create_op("tied_gather", [t, _int_tensor(indices)],
                     {"axis": _axis_of("tied_gather", t.rank, axis), "zero_OOR": builtins.bool(zero_OOR)})[0]


def _grouped_gather_infer(specs, axis, group_size):
    t, idx = specs
    _need_int(idx, "indices")
    if len(t.shape) < 2 or len(idx.shape) < 1:
        raise ValueError("t needs a group dimension and at least one more; indices needs a group dimension")
    if t.shape[0] != group_size or idx.shape[0] != group_size:
        raise ValueError(f"the first dimension of t ({t.shape[0]}) and of indices ({idx.shape[0]}) must both "
                         f"equal group_size={group_size}")
    rest = list(t.shape[1:])
    return [spec([group_size] + rest[:axis] + list(idx.shape[1:]) + rest[axis + 1:], t.dtype)]


def _grouped_gather_kernel(t, idx, axis, group_size):
    return np.stack([_gather_kernel(t[g], idx[g], axis, True) for g in range(group_size)])


register(OpDef("groupedgather", _grouped_gather_infer, _grouped_gather_kernel, family="shape"))


def groupedgather(t: Tensor, indices: Tensor, axis: int = 0, group_size: Optional[int] = 1,
                  available_memory_proportion: Optional[float] = None, zero_OOR: bool = False) -> Tensor:
    """`gather` done separately in each group: dimension 0 of ``t`` and ``indices`` is the group.

    ``out[g] = gather(t[g], indices[g], axis)``; out-of-range indices give 0.

    Args:
        t: The tensor read, groups on dimension 0.
        indices: Integer indices, groups on dimension 0.
        axis: The axis indexed, counted within one group (``t.shape[1:]``).
        group_size: The number of groups (dimension 0 of both tensors).
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.
        zero_OOR: Out-of-range indices give 0 (they always do here).

    Returns:
        A new tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``indices`` is not integer.
        ValueError: If the group dimensions disagree with ``group_size``, ``axis`` is out of range,
            or a tensor is not in the current graph.
    """
    group_size = 1 if group_size is None else int(group_size)
    ax = _axis_of("groupedgather", builtins.max(t.rank - 1, 0), axis)
    return create_op("groupedgather", [t, _int_tensor(indices)], {"axis": ax, "group_size": group_size})[0]


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


register(OpDef("onehot", _onehot_infer, _onehot_kernel, family="shape"))


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
    from popxl.tensor import Constant

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
    out = None
    for p, w in zip(taps, weights):
        vals = np.take(a, np.clip(p, 0, n_in - 1).astype(np.int64), axis=axis)
        if mode == "nearest":
            return vals
        term = vals * w.reshape(bshape)
        out = term if out is None else out + term
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


register(OpDef("interpolate", _interpolate_infer, _interpolate_kernel, family="shape"))


def interpolate(t: Tensor, scale_factor: Optional[Tuple[float, ...]] = (1.0, 1.0, 1.0, 1.0),
                mode: Optional[str] = "nearest", nearest_mode: Optional[str] = "round_prefer_floor",
                coordinate_transformation_mode: Optional[str] = "half_pixel") -> Tensor:
    """Resize a tensor by scale factors, as ONNX Resize.

    Samples beyond the edges repeat the edge value.

    Args:
        t: The tensor resized.
        scale_factor: One factor per dimension; an output length is ``floor(length * factor)``.
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
    scale_factor = tuple(float(f) for f in scale_factor)
    return create_op("interpolate", [t], {
        "scale_factor": scale_factor, "mode": "nearest" if mode is None else mode,
        "nearest_mode": "round_prefer_floor" if nearest_mode is None else nearest_mode,
        "coordinate_transformation_mode": "half_pixel" if coordinate_transformation_mode is None
        else coordinate_transformation_mode})[0]


# gradients ------------------------------------------------------------------------------------------
def _broadcast_infer(specs, shape):
    broadcast = np.broadcast_shapes(tuple(specs[0].shape), tuple(shape))
    if broadcast != tuple(shape):
        raise ValueError(f"cannot broadcast {specs[0].shape} to {tuple(shape)}")
    return [spec(shape, specs[0].dtype)]


# Internal (not in PopXL's API): gradients of reductions spread values back with it. Lowered to a
# strided copy from a zero-stride view, so no engine needs a kernel.
register(OpDef("broadcast_to", _broadcast_infer, lambda x, shape: np.broadcast_to(x, shape).copy(),
               view=lambda x, shape: np.broadcast_to(x, shape), copy=True, grad=Grad.RAISE, family="shape"))


def broadcast_to(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """A copy of ``t`` broadcast (NumPy rules) to ``shape``."""
    shape = shape_tuple(shape, f"ops.broadcast_to: shape for tensor {t.id!r}")
    return t if t.shape == shape else create_op("broadcast_to", [t], {"shape": shape})[0]


def _into_zeros(ctx, view_op: str, g: Tensor) -> Tensor:
    """Zeros of the input's shape with ``g`` written into the region the forward op read
    (``view_op`` with the forward op's attributes must be an injective view)."""
    from popxl.ops.misc import init
    x = ctx.op.inputs[0]
    zeros = init(x.shape, x.dtype, name=f"zero_grad_{x.name}")
    region = create_op(view_op, [zeros], ctx.attrs)[0]
    create_op("copy_var_update_", [region, g])
    return zeros


@grad_rule("reshape")
def _reshape_grad(ctx):
    return [ctx.grad(0).reshape(ctx.op.inputs[0].shape)]


@grad_rule("transpose")
def _transpose_grad(ctx):
    inverse = tuple(int(i) for i in np.argsort(ctx.attrs["permutation"]))
    return [transpose(ctx.grad(0), inverse)]


@grad_rule("slice")
def _slice_grad(ctx):
    return [_into_zeros(ctx, "slice_", ctx.grad(0))]


@grad_rule("subsample")
def _subsample_grad(ctx):
    return [_into_zeros(ctx, "subsample_view", ctx.grad(0))]


register(OpDef("subsample_view", _subsample_infer, _subsample_view, view=_subsample_view, grad=Grad.RAISE,
               family="shape"))


@grad_rule("concat", "concat_")
def _concat_grad(ctx):
    axis = normalize_axes(ctx.op.outputs[0].rank, ctx.attrs["axis"])[0]
    sizes = [t.shape[axis] for t in ctx.op.inputs]
    if len(sizes) == 1:
        return [ctx.grad(0)]
    return list(create_op("split", [ctx.grad(0)], {"axis": axis, "splits": tuple(sizes)}))


@grad_rule("split")
def _split_grad(ctx):
    parts = [ctx.grad_or_zeros(i) for i in range(len(ctx.op.outputs))]
    return [parts[0] if len(parts) == 1 else create_op("concat", parts, {"axis": ctx.attrs["axis"]})[0]]


def _gather_grad_infer(specs, axis, size):
    g, idx = specs
    shape = list(g.shape[:axis]) + [size] + list(g.shape[axis + len(idx.shape):])
    return [spec(shape, g.dtype)]


def _gather_grad_kernel(g, idx, axis, size):
    """Sum the gathered gradients back into their rows (repeats add; out-of-range rows got 0)."""
    idx, valid = _wrap(idx, size)
    valid = valid.reshape(-1)
    rows = np.moveaxis(g, list(range(axis, axis + idx.ndim)), list(range(idx.ndim)))
    rows = rows.reshape((-1,) + rows.shape[idx.ndim:])
    wide = np.promote_types(g.dtype, np.float32)
    out = np.zeros((size,) + rows.shape[1:], wide)
    np.add.at(out, idx.reshape(-1)[valid], rows[valid].astype(wide))
    return np.moveaxis(out, 0, axis).astype(g.dtype)


# A dedicated op: the scatter-add of a gather's gradient is one pass, not a one-hot matmul.
register(OpDef("gather_grad", _gather_grad_infer, _gather_grad_kernel, grad=Grad.RAISE, family="shape"))


@grad_rule("gather", "tied_gather")
def _gather_grad(ctx):
    x, axis = ctx.op.inputs[0], ctx.attrs["axis"]
    return [create_op("gather_grad", [ctx.grad(0), ctx.input(1)], {"axis": axis, "size": x.shape[axis]})[0], None]


@grad_rule("dynamic_slice")
def _dynamic_slice_grad(ctx):
    from popxl.ops.misc import init
    x = ctx.op.inputs[0]
    zeros = init(x.shape, x.dtype, name=f"zero_grad_{x.name}")
    return [create_op("dynamic_update", [zeros, ctx.input(1), ctx.grad(0)], ctx.attrs)[0], None]


@grad_rule("dynamic_update")
def _dynamic_update_grad(ctx):
    from popxl.ops.misc import init
    g, index, upd = ctx.grad(0), ctx.input(1), ctx.op.inputs[2]
    cleared = create_op("dynamic_update", [g, index, init(upd.shape, upd.dtype, name="zero_update")], ctx.attrs)[0]
    return [cleared if ctx.needs(0) else None, None,
            create_op("dynamic_slice", [g, index], ctx.attrs)[0] if ctx.needs(2) else None]


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
register(OpDef("gather_elements", _gather_elements_infer, _gather_elements_kernel, grad=Grad.RAISE, family="shape"))


@grad_rule("scatter")
def _scatter_grad(ctx):
    """Places overwritten by ``values`` pass no gradient to ``t``; each value gets its place's."""
    from popxl.ops.misc import init
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
    from popxl.ops.elementwise import cast, equal
    from popxl.ops.misc import init
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


def _grouped_gather_grad_kernel(g, idx, axis, size, group_size):
    return np.stack([_gather_grad_kernel(g[i], idx[i], axis, size) for i in range(group_size)])


register(OpDef("groupedgather_grad", lambda specs, axis, size, group_size: [spec(
    [specs[0].shape[0]] + list(specs[0].shape[1:axis + 1]) + [size] +
    list(specs[0].shape[axis + len(specs[1].shape):]), specs[0].dtype)],
    _grouped_gather_grad_kernel, grad=Grad.RAISE, family="shape"))


@grad_rule("groupedgather")
def _grouped_gather_grad(ctx):
    x, a = ctx.op.inputs[0], ctx.attrs
    attrs = {"axis": a["axis"], "size": x.shape[1 + a["axis"]], "group_size": a["group_size"]}
    return [create_op("groupedgather_grad", [ctx.grad(0), ctx.input(1)], attrs)[0], None]


@grad_rule("onehot")
def _onehot_grad(ctx):
    """out = on where hot else off: d off = sum(g) over cold places, d on = over hot places."""
    g, values = ctx.grad(0), ctx.op.inputs[2]
    mask = create_op("onehot", [ctx.input(0), ctx.input(1), constant(np.array([0, 1]), values.dtype)], ctx.attrs)[0]
    hot = create_op("sum", [g * mask], {"axis": tuple(range(g.rank)), "keepdims": False})[0]
    total = create_op("sum", [g], {"axis": tuple(range(g.rank)), "keepdims": False})[0]
    return [None, None, create_op("concat", [(total - hot).reshape((1,)), hot.reshape((1,))], {"axis": 0})[0]]


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
               family="shape"))


@grad_rule("interpolate")
def _interpolate_grad(ctx):
    return [create_op("interpolate_grad", [ctx.input(0), ctx.grad(0)], ctx.attrs)[0]]
