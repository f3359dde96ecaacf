"""Shape and data-movement ops that keep their input's values in place or in order: reshape,
flatten, squeeze, transpose, slice, subsample, concat, split, and the internal broadcast_to, each
followed by its gradient rule. View variants (``reshape_``, ``transpose_``, ``slice_``,
``flatten_``) alias their input: lowering places them inside the input's storage, so writes through
them are seen. Ops that pick or place values by index are in ``indexing``, interpolate in ``resize``."""
from __future__ import annotations

import builtins
from typing import Iterable, List, Optional, Tuple, Union

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register, user_location
from popxl.ops.misc import init
from popxl.ops.utils import normalize_axes, spec
from popxl.tensor import Tensor, shape_tuple

__all__ = ["concat", "concat_", "flatten", "flatten_", "reshape", "reshape_", "slice", "slice_", "split", "squeeze",
           "subsample", "transpose", "transpose_"]

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
               family="shape",
               attributes={"shape": "ints"}))
register(OpDef("reshape_", _reshape_infer, _reshape_view, view=_reshape_view, grad=Grad.STOP, family="shape",
               attributes={"shape": "ints"}))


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
            raise type(e)(f"ops.squeeze: {e} (tensor {t.id!r} of shape {t.shape}) (at {user_location()})") from None
        bad = [a for a in ax if t.shape[a] != 1]
        if bad:
            raise ValueError(f"ops.squeeze: axes {bad} of {t.id!r} {t.shape} do not have size 1")
        keep = [d for i, d in enumerate(t.shape) if i not in ax]
    return reshape(t, tuple(keep))


@grad_rule("reshape")
def _reshape_grad(ctx):
    return [ctx.grad(0).reshape(ctx.op.inputs[0].shape)]


# transpose -----------------------------------------------------------------------------------------
def _transpose_infer(specs, permutation):
    s = specs[0]
    if sorted(permutation) != list(range(len(s.shape))):
        raise ValueError(f"permutation {permutation} is not a permutation of the {len(s.shape)} axes")
    return [spec([s.shape[p] for p in permutation], s.dtype)]


def _transpose_view(x, permutation):
    return x.transpose(permutation)


register(OpDef("transpose", _transpose_infer, lambda x, permutation: x.transpose(permutation).copy(order="C"),
               view=_transpose_view, copy=True, family="shape",
               attributes={"permutation": "ints"}))
register(OpDef("transpose_", _transpose_infer, _transpose_view, view=_transpose_view, grad=Grad.STOP,
               family="shape",
               attributes={"permutation": "ints"}))


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


@grad_rule("transpose")
def _transpose_grad(ctx):
    inverse = tuple(int(i) for i in np.argsort(ctx.attrs["permutation"]))
    return [transpose(ctx.grad(0), inverse)]


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
               family="shape",
               attributes={"starts": "ints", "stops": "ints", "steps": "ints"}))
register(OpDef("slice_", _slice_infer, _slice_view, view=_slice_view, grad=Grad.RAISE, family="shape",
               attributes={"starts": "ints", "stops": "ints", "steps": "ints"}))


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


def _into_zeros(ctx, view_op: str, g: Tensor) -> Tensor:
    """Zeros of the input's shape with ``g`` written into the region the forward op read
    (``view_op`` with the forward op's attributes must be an injective view)."""
    x = ctx.op.inputs[0]
    zeros = init(x.shape, x.dtype, name=f"zero_grad_{x.name}")
    region = create_op(view_op, [zeros], ctx.attrs)[0]
    create_op("copy_var_update_", [region, g])
    return zeros


@grad_rule("slice")
def _slice_grad(ctx):
    return [_into_zeros(ctx, "slice_", ctx.grad(0))]


# subsample -----------------------------------------------------------------------------------------
def _subsample_infer(specs, strides):
    s = specs[0]
    if any(st < 1 for st in strides):
        raise ValueError(f"strides must be >= 1, got {strides}")
    return [spec([-(-d // st) for d, st in zip(s.shape, strides)], s.dtype)]


def _subsample_view(x, strides):
    return x[tuple(builtins.slice(None, None, st) for st in strides)]


register(OpDef("subsample", _subsample_infer, lambda x, strides: _subsample_view(x, strides).copy(),
               view=_subsample_view, copy=True, family="shape",
               attributes={"strides": "ints"}))


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


@grad_rule("subsample")
def _subsample_grad(ctx):
    return [_into_zeros(ctx, "subsample_view", ctx.grad(0))]


register(OpDef("subsample_view", _subsample_infer, _subsample_view, view=_subsample_view, grad=Grad.RAISE,
               family="shape",
               attributes={"strides": "ints"}))


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


register(OpDef("concat", _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis), family="shape",
               attributes={"axis": "int"}))


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


# concat_ --------------------------------------------------------------------------------------------
register(OpDef("concat_", _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis), family="shape",
               attributes={"axis": "int"}))


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


@grad_rule("concat", "concat_")
def _concat_grad(ctx):
    axis = normalize_axes(ctx.op.outputs[0].rank, ctx.attrs["axis"])[0]
    sizes = [t.shape[axis] for t in ctx.op.inputs]
    if len(sizes) == 1:
        return [ctx.grad(0)]
    return list(create_op("split", [ctx.grad(0)], {"axis": axis, "splits": tuple(sizes)}))


# split ----------------------------------------------------------------------------------------------
def _axis_of(opname: str, rank: int, axis: int, what: str = "axis") -> int:
    """One axis normalised to 0..rank-1; errors name the op."""
    try:
        return normalize_axes(rank, axis)[0]
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.{opname}: {what}: {e} (at {user_location()})") from None


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


register(OpDef("split", _split_infer, _split_kernel, family="shape",
               attributes={"axis": "int", "splits": "ints"}))


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


@grad_rule("split")
def _split_grad(ctx):
    parts = [ctx.grad_or_zeros(i) for i in range(len(ctx.op.outputs))]
    return [parts[0] if len(parts) == 1 else create_op("concat", parts, {"axis": ctx.attrs["axis"]})[0]]


# broadcast_to --------------------------------------------------------------------------------------
def _broadcast_infer(specs, shape):
    broadcast = np.broadcast_shapes(tuple(specs[0].shape), tuple(shape))
    if broadcast != tuple(shape):
        raise ValueError(f"cannot broadcast {specs[0].shape} to {tuple(shape)}")
    return [spec(shape, specs[0].dtype)]


# Internal (not in PopXL's API): gradients of reductions spread values back with it. Lowered to a
# strided copy from a zero-stride view, so no engine needs a kernel.
register(OpDef("broadcast_to", _broadcast_infer, lambda x, shape: np.broadcast_to(x, shape).copy(),
               view=lambda x, shape: np.broadcast_to(x, shape), copy=True, grad=Grad.RAISE, family="shape",
               attributes={"shape": "ints"}))


def broadcast_to(t: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """A copy of ``t`` broadcast (NumPy rules) to ``shape``."""
    shape = shape_tuple(shape, f"ops.broadcast_to: shape for tensor {t.id!r}")
    return t if t.shape == shape else create_op("broadcast_to", [t], {"shape": shape})[0]
