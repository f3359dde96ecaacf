"""Shape and data-movement ops: reshape, transpose, slice, concat, squeeze, subsample, gather,
and Tensor indexing. View variants (``reshape_``, ``transpose_``, ``slice_``, ``flatten_``) alias
their input: lowering places them inside the input's storage, so writes through them are seen."""
from __future__ import annotations

import builtins
from typing import Any, Iterable, List, Optional, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, register
from popxl.ops.utils import normalize_axes, same_dtype, spec
from popxl.tensor import Tensor, constant

__all__ = ["concat", "flatten", "flatten_", "gather", "reshape", "reshape_", "slice", "slice_", "squeeze", "subsample", "transpose", "transpose_"]

INT32_MAX = 2 ** 31 - 1
INT32_MIN = -(2 ** 31)


# reshape / flatten ----------------------------------------------------------------------------------
def _reshape_infer(specs, shape):
    s = specs[0]
    if int(np.prod(shape, dtype=np.int64)) != int(np.prod(s.shape, dtype=np.int64)):
        raise ValueError(f"cannot reshape {s.shape} ({int(np.prod(s.shape))} elements) to {shape}")
    return [spec(shape, s.dtype)]


def _reshape_view(x, shape):
    return x.reshape(shape)


register(OpDef("reshape", _reshape_infer, lambda x, shape: x.reshape(shape).copy(), view=_reshape_view, copy=True,
               family="shape"))
register(OpDef("reshape_", _reshape_infer, _reshape_view, view=_reshape_view, grad=Grad.STOP, family="shape"))


def _resolve_shape(t: Tensor, shape: Iterable[int]) -> Tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if builtins.sum(d == -1 for d in shape) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"ops.reshape: shape {shape} may contain at most one -1 and no other negative "
                         f"entry (tensor {t.id!r} has shape {t.shape})")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        shape = tuple((t.nelms // known if known else 0) if d == -1 else d for d in shape)
    return shape


def reshape(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """A copy of t with a new shape; one entry may be -1 (inferred)."""
    return create_op("reshape", [t], {"shape": _resolve_shape(t, shape)})[0]


def reshape_(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """t viewed with a new shape (alias)."""
    return create_op("reshape_", [t], {"shape": _resolve_shape(t, shape)})[0]


def flatten(t: Tensor) -> Tensor:
    """A 1-D copy of t."""
    return reshape(t, (t.nelms,))


def flatten_(t: Tensor) -> Tensor:
    """t viewed as 1-D (alias)."""
    return reshape_(t, (t.nelms,))


def squeeze(t: Tensor, axes: Optional[List[int]] = None) -> Tensor:
    """Drop all size-1 dimensions, or the listed ones (each must have size 1)."""
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


register(OpDef("transpose", _transpose_infer, lambda x, permutation: np.ascontiguousarray(x.transpose(permutation)),
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
    """A copy of t with axes permuted (default: reversed)."""
    return create_op("transpose", [t], {"permutation": _perm(t, permutation)})[0]


def transpose_(t: Tensor, permutation: Optional[Tuple[int, ...]] = None) -> Tensor:
    """t viewed with axes permuted (alias)."""
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
    """A copy of a slice of t, ONNX Slice semantics (negative bounds count from the end)."""
    if start is None and stop is None and step is None:
        return t
    return create_op("slice", [t], _slice_attrs(t, start, stop, step, axis))[0]


def slice_(t: Tensor, start: Optional[Union[int, List[int]]] = None, stop: Optional[Union[int, List[int]]] = None,
           step: Optional[Union[int, List[int]]] = None, axis: Optional[Union[int, List[int]]] = None) -> Tensor:
    """A slice of t as a view (alias)."""
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
    """Every ``strides[i]``-th element along each axis (a short list is padded with 1)."""
    strides = [int(strides)] if isinstance(strides, (int, np.integer)) else [int(s) for s in strides]
    if len(strides) > t.rank:
        raise ValueError(f"ops.subsample: {len(strides)} strides for {t.id!r} of rank {t.rank}")
    strides += [1] * (t.rank - len(strides))
    return create_op("subsample", [t], {"strides": tuple(strides)})[0]


# concat --------------------------------------------------------------------------------------------
def _concat_infer(specs, axis):
    if not specs:
        raise ValueError("needs at least one tensor")
    dt = same_dtype(specs)
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
    """Join tensors along ``axis`` (same dtype, same other dims)."""
    return create_op("concat", list(ts), {"axis": int(axis)})[0]


# gather --------------------------------------------------------------------------------------------
def _gather_kernel(x, idx, axis, zero_OOR):
    d = x.shape[axis]
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)  # NumPy-style negative indices
    valid = (idx >= 0) & (idx < d)
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
    """numpy.take(t, indices, axis). Negative indices count from the end; out of range gives 0."""
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
