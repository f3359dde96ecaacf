"""Helpers shared by op functions and shape rules (also public in PopXL as popxl.ops.utils)."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.op import create_op, user_location
from popxl.tensor import Tensor, TensorSpec, constant

__all__ = ["check_in_graph", "check_tensor_ipu_and_tile_set", "cast_if_needed", "handle_negative_axis",
           "broadcast_shapes", "normalize_axes", "same_dtype", "spec", "as_tensor", "convert_optional_float",
           "convert_optional_int", "convert_optional_dtype"]


def convert(x: np.ndarray, dtype: Any) -> np.ndarray:
    """``x`` as NumPy ``dtype``, as the engines convert values (reference kernels use this where
    NumPy's ``astype`` is undefined): floats going to an integer dtype are truncated toward zero and
    saturate at the dtype's limits, NaN giving 0 (NumPy gives whatever the CPU's conversion does).
    Everything else is ``astype``; integers to narrower integers wrap."""
    dt = np.dtype(dtype)
    x = np.asarray(x)
    if dt.kind not in "iu" or x.dtype.kind in "iub":
        return x.astype(dt)
    t = np.trunc(x.astype(np.float64))
    info = np.iinfo(dt)
    beyond = 2.0 ** (8 * dt.itemsize - (dt.kind == "i"))  # exact: the first value above info.max
    with np.errstate(invalid="ignore"):
        inside = (t >= info.min) & (t < beyond)
        out = np.where(inside, t, 0).astype(dt)
        out = np.where(t >= beyond, np.array(info.max, dt), out)
        return np.where(t < info.min, np.array(info.min, dt), out)


def check_in_graph(graph: Any, **tensors: Tensor) -> None:
    """TypeError if a value is not a Tensor, ValueError if it is not in ``graph``.

    Args:
        graph: The graph the tensors must belong to.
        **tensors: The values checked, by name (the names appear in the errors).

    Raises:
        TypeError: If a value is not a Tensor.
        ValueError: If a tensor belongs to another graph.
    """
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a popxl.Tensor, not {type(t).__name__}.")
        if t.graph is not graph:
            raise ValueError(f"{name} ({t.id!r}) is not in the current graph {graph.id!r}.")


def check_tensor_ipu_and_tile_set(**tensors: Tensor) -> None:
    """ValueError unless all tensors are on the same IPU and tile set.

    Args:
        **tensors: The tensors checked, by name.

    Raises:
        ValueError: If they are on different IPUs or tile sets.
    """
    places = {(t.ipu, t.tile_set) for t in tensors.values()}
    if len(places) > 1:
        raise ValueError("Tensors are on different IPUs or tile sets: " +
                         ", ".join(f"{k}={t.id!r} (ipu {t.ipu}, {t.tile_set})" for k, t in tensors.items()))


def cast_if_needed(t: Tensor, data_type: dtypes.dtype) -> Tensor:
    """A tensor in a given dtype: itself if it has it, else ``ops.cast`` of it.

    Args:
        t: The tensor.
        data_type: The dtype wanted.

    Returns:
        ``t`` or a cast copy.

    Raises:
        TypeError: If ``data_type`` is not a popxl dtype.
    """
    # ops.cast's op: that module (popxl.ops.elementwise.casts) is built on this one
    return t if t.dtype is data_type else create_op("cast", [t], {"data_type": data_type})[0]


def handle_negative_axis(t: Union[Tensor, TensorSpec, Sequence[int]], axis: int) -> int:
    """Map a possibly negative ``axis`` onto ``0..rank-1`` (ValueError when out of range).

    Args:
        t: A tensor, a spec or a shape.
        axis: The axis, negative counting from the end.

    Returns:
        The axis in ``0..rank-1``.

    Raises:
        ValueError: If ``axis`` is out of range.
    """
    rank = len(t.shape) if hasattr(t, "shape") else len(t)
    return normalize_axes(rank, axis)[0]


def normalize_axes(rank: int, axes: Union[None, int, Iterable[int]]) -> Tuple[int, ...]:
    """Normalise ``axes`` (None = all) for a tensor of ``rank``; ValueError if out of range or repeated.

    Args:
        rank: The tensor's rank.
        axes: An axis, axes, or None for all.

    Returns:
        The axes in ``0..rank-1``, sorted.

    Raises:
        ValueError: If an axis is out of range or repeated.
        TypeError: If an axis is not an int.
    """
    if axes is None:
        return tuple(range(rank))
    items = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    out = []
    for a in items:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"axis must be an int, not {a!r}")
        if not -max(rank, 1) <= a < max(rank, 1):
            raise ValueError(f"axis {a} is out of range for a tensor of rank {rank}")
        out.append(int(a) % max(rank, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {items}")
    return tuple(out)


def broadcast_shapes(*shapes: Sequence[int]) -> Tuple[int, ...]:
    """The NumPy broadcast of several shapes.

    Args:
        *shapes: The shapes.

    Returns:
        The broadcast shape.

    Raises:
        ValueError: If the shapes do not broadcast.
    """
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError("shapes " + ", ".join(str(tuple(s)) for s in shapes) + " cannot be broadcast together") from None


def same_dtype(specs: Sequence[TensorSpec]) -> dtypes.dtype:
    """The dtype shared by several tensor specs.

    Args:
        specs: The specs.

    Returns:
        Their dtype.

    Raises:
        TypeError: If the dtypes differ.
    """
    dts = {s.dtype for s in specs}
    if len(dts) > 1:
        raise TypeError("inputs must have the same dtype, got " + ", ".join(s.dtype.name for s in specs))
    return specs[0].dtype


def spec(shape: Iterable[int], dtype: dtypes.dtype, meta_shape: Iterable[int] = ()) -> TensorSpec:
    """A `TensorSpec` from a shape and dtype.

    Args:
        shape: The shape.
        dtype: The dtype.
        meta_shape: The unsharded shape, for a replica shard.

    Returns:
        The spec.
    """
    return TensorSpec(shape, dtype, meta_shape)


def as_tensor(value: Any, dtype: Optional[dtypes.dtype] = None, like: Optional[Tensor] = None) -> Tensor:
    """A Tensor as is, or a host value as a constant in the current graph (of ``dtype``, else
    ``like.dtype``, else NumPy's inferred dtype downcast to 32 bits).

    Args:
        value: A Tensor or host data.
        dtype: The constant's dtype.
        like: A tensor whose dtype the constant takes when ``dtype`` is None.

    Returns:
        A Tensor.
    """
    if isinstance(value, Tensor):
        return value
    if dtype is None and like is not None:
        dtype = like.dtype
    return constant(value, dtype=dtype)


# Optional op settings. PopXL wraps them in its C++ binding's optional types for PopART's op
# setters; here the plain Python value (or None) is the optional, checked and converted.
def convert_optional_float(v: Optional[float]) -> Optional[float]:
    """``v`` as a float, or None (unset).

    Args:
        v: A number or None.

    Returns:
        ``float(v)`` or None.
    """
    return _optional(v, float, (int, float, np.integer, np.floating), "a float")


def convert_optional_int(v: Optional[int]) -> Optional[int]:
    """``v`` as an int, or None (unset).

    Args:
        v: A number or None.

    Returns:
        ``int(v)`` or None.
    """
    return _optional(v, int, (int, np.integer), "an int")


def convert_optional_dtype(dt: Optional[dtypes.dtype]) -> Optional[dtypes.dtype]:
    """``dt`` (a popxl dtype), or None (unset).

    Args:
        dt: A popxl dtype or None.

    Returns:
        ``dt``.
    """
    if dt is not None and not isinstance(dt, dtypes.dtype):
        raise TypeError(f"convert_optional_dtype: expected a popxl dtype or None, not {dt!r}.")
    return dt


def _optional(v: Any, convert: Any, accepted: tuple, what: str) -> Any:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, accepted):
        raise TypeError(f"expected {what} or None, not {v!r}.")
    return convert(v)


# shared by the op families: errors, operand checks, per-dimension attributes ------------------------
def wide_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a kernel accumulates in: float32 for float8/float16, else the dtype itself."""
    return np.dtype(np.float32) if dt.itemsize < 4 or dt.kind != "f" else dt


def op_error(opname: str, e: Exception) -> Exception:
    return type(e)(f"ops.{opname}: {e} (at {user_location()})")


def tensor_shape_of(t: Any, what: str, opname: str) -> Tuple[int, ...]:
    if not isinstance(t, Tensor):
        raise TypeError(f"ops.{opname}: {what} must be a popxl.Tensor, not {type(t).__name__} ({t!r}) "
                        f"(at {user_location()})")
    return t.shape


def per_dim_ints(value: Any, n: int, what: str, neutral: int) -> Tuple[int, ...]:
    """``value`` as ``n`` ints: an int is repeated; None, () or an all-``neutral`` sequence of another
    length (the 2-D defaults used for a 1-D/3-D op) mean ``neutral`` everywhere."""
    if value is None:
        return (neutral,) * n
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{what} must be an int or a sequence of ints, not {value!r}") from None
    if any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in items):
        raise TypeError(f"{what} must contain ints, got {value!r}")
    if len(items) != n:
        if all(v == neutral for v in items):
            return (neutral,) * n
        raise ValueError(f"{what} needs {n} values for this tensor, got {len(items)}: {tuple(items)}")
    return tuple(int(v) for v in items)
