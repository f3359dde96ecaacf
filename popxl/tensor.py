"""Tensors of the IR: `Tensor`, `Variable`, `Constant`, `TensorSpec` and their factories."""
from __future__ import annotations

import builtins
import operator
import collections.abc
from collections.abc import Mapping
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Literal, Optional, Sequence,
                    Tuple, Union)

import numpy as np

from popxl import dtypes
from popxl.context import get_current_context

if TYPE_CHECKING:  # pragma: no cover
    from popxl.graph import Graph
    from popxl.ir import Ir
    from popxl.op import Op
    from popxl.replica_grouping import ReplicaGrouping

__all__ = ["Tensor", "Variable", "Constant", "TensorSpec", "TensorByRef", "variable", "constant",
           "graph_input", "graph_output", "HostTensor", "HostScalarTensor", "ScalarType",
           "TensorLike"]

ScalarType = Union[int, float, builtins.bool]
HostScalarTensor = Union[ScalarType, np.ndarray, Iterable]
HostTensor = Union[np.ndarray, Iterable]


def __getattr__(name: str) -> Any:
    # PopXL's ``host_tensor_types``: the classes of host tensor data (isinstance checks), torch.Tensor
    # among them when torch is installed. Made on first use: importing torch takes seconds.
    if name == "host_tensor_types":
        types: Tuple[type, ...] = (np.ndarray, collections.abc.Iterable)
        try:
            import torch
        except ImportError:
            pass
        else:
            types += (torch.Tensor,)
        globals()[name] = types
        return types
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
TensorLike = Union["Tensor", HostScalarTensor]


INT64_MAX = 2 ** 63 - 1  # the native engine counts elements, bytes and loop iterations in int64


def shape_tuple(shape: Iterable[Any], what: str = "shape", min_dim: int = 0) -> Tuple[int, ...]:
    """``shape`` as a tuple of Python ints, each from ``min_dim`` to int64's largest value. A
    dimension that is not an integer (2.5, "3") is a TypeError, not truncated."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, not {shape!r}.") from None
    try:
        dims = tuple(map(operator.index, dims))
    except TypeError:
        raise TypeError(f"{what} {dims!r} must hold ints only (a dimension is never rounded).") from None
    for d in dims:
        if not min_dim <= d <= INT64_MAX:
            low = "0" if min_dim == 0 else str(min_dim)
            raise ValueError(f"{what} {dims} has dimension {d}; dimensions must be from {low} to {INT64_MAX} (int64).")
    return dims


class TensorSpec(Mapping):
    """Shape, dtype and meta_shape of a tensor: enough to create a graph input or stream."""

    __slots__ = ("_shape", "_dtype", "_meta_shape")

    def __init__(self, shape: Tuple[int, ...], dtype: dtypes.dtype, meta_shape: Tuple[int, ...] = ()):
        self._shape = shape_tuple(shape)
        self._dtype = dtype
        self._meta_shape = shape_tuple(meta_shape, "meta_shape")
        n = 1
        for d in self._shape:
            n *= d
        itemsize = dtype.itemsize if isinstance(dtype, dtypes.dtype) else 1
        if n * itemsize > INT64_MAX:
            raise ValueError(f"shape {self._shape} of {getattr(dtype, 'name', dtype)} holds {n} elements "
                             f"({n * itemsize} bytes): more than int64 can count ({INT64_MAX}).")

    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    meta_shape = property(lambda self: self._meta_shape)

    def to_dict(self) -> Dict[str, Any]:
        return {"shape": self._shape, "dtype": self._dtype, "meta_shape": self._meta_shape}

    def to_tuple(self) -> Tuple[Tuple[int, ...], dtypes.dtype, Tuple[int, ...]]:
        return (self._shape, self._dtype, self._meta_shape)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("shape", "dtype", "meta_shape"))

    def __len__(self) -> int:
        return 3

    def __eq__(self, other: Any) -> builtins.bool:
        return isinstance(other, TensorSpec) and self.to_tuple() == other.to_tuple()

    def __hash__(self) -> int:
        return hash(self.to_tuple())

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self._shape}, dtype={self._dtype}, meta_shape={self._meta_shape})"


def _nelms(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


class Tensor:
    """A value in a graph. Made by ops and factories, never constructed directly."""

    # NumPy must defer to our reflected operators (ndarray + Tensor -> Tensor.__radd__).
    __array_ufunc__ = None
    __iter__ = None  # type: ignore[assignment]
    __contains__ = None  # type: ignore[assignment]
    # (RemoteBuffer, offset, shards): set on a remote variable (its value lives in that slot, not
    # on chip) and on a replica-sharded variable's shard tensor (kept on chip, synced with the slot).
    _remote_slot: Optional[Tuple[Any, int, int]] = None

    def __init__(self) -> None:
        raise RuntimeError(
            "popxl.Tensor cannot be constructed directly: create tensors with ops, "
            "popxl.variable, popxl.constant or popxl.graph_input.")

    @classmethod
    def _create(cls, graph: "Graph", name: str, spec: TensorSpec, producer: Optional["Op"] = None,
                **extra: Any) -> "Tensor":
        t = object.__new__(cls)
        t._graph = graph
        t._spec = spec
        t._producer = producer
        t._id = graph._new_tensor_id(get_current_context().scope_prefix + name)
        for k, v in extra.items():
            setattr(t, k, v)
        graph._tensors[t._id] = t
        return t

    # identity -----------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._id

    @property
    def _pb_tensor(self) -> Any:
        """This tensor as PopART's internal IR shows it (popart._internal.ir.Tensor, a view)."""
        from popart._internal.ir import view_of
        return view_of(self)

    @classmethod
    def _from_pb_tensor(cls, pb_tensor: Any) -> "Tensor":
        """The popxl tensor a `popart._internal.ir.Tensor` shows (the same object every time)."""
        from popart._internal.ir import popxl_object
        return popxl_object(pb_tensor, Tensor)

    @property
    def name(self) -> str:
        """The id without the graph's prefix."""
        prefix = self._graph._tensor_prefix
        return self._id[len(prefix):] if prefix and self._id.startswith(prefix) else self._id

    @property
    def scope(self) -> str:
        return self.name.rpartition("/")[0]

    @property
    def graph(self) -> "Graph":
        return self._graph

    @property
    def ir(self) -> "Ir":
        return self._graph.ir

    @property
    def producer(self) -> Optional["Op"]:
        return self._producer

    # spec ---------------------------------------------------------------------------------------
    @property
    def dtype(self) -> dtypes.dtype:
        return self._spec.dtype

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._spec.shape

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        return self._spec.meta_shape

    @property
    def spec(self) -> TensorSpec:
        return self._spec

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nelms(self) -> int:
        return _nelms(self.shape)

    @property
    def location_info(self) -> Any:
        return getattr(self, "_location", None)

    @property
    def ipu(self) -> int:
        return self._producer.ipu if self._producer is not None else 0

    @property
    def tile_set(self) -> Literal["compute", "io"]:
        return self._producer.tile_set if self._producer is not None else "compute"

    @property
    def in_sync_with_ipu(self) -> builtins.bool:
        return True

    def strides(self, shape: Optional[Iterable[int]] = None) -> Tuple[int, ...]:
        """Byte strides of a C-contiguous layout of ``shape`` (default: this tensor's shape), as a
        tuple like NumPy's ``ndarray.strides``."""
        shape = tuple(self.shape if shape is None else shape)
        item = self.dtype.itemsize
        out, acc = [], item
        for d in reversed(shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    # views and copies ---------------------------------------------------------------------------
    def transpose(self, permutation: Optional[Iterable[int]] = None) -> "Tensor":
        from popxl import ops
        return ops.transpose(self, permutation)

    def transpose_(self, permutation: Optional[Iterable[int]] = None) -> "Tensor":
        from popxl import ops
        return ops.transpose_(self, permutation)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    @property
    def T_(self) -> "Tensor":
        return self.transpose_()

    def reshape(self, shape: Iterable[int]) -> "Tensor":
        from popxl import ops
        return ops.reshape(self, shape)

    def reshape_(self, shape: Iterable[int]) -> "Tensor":
        from popxl import ops
        return ops.reshape_(self, shape)

    def flatten(self) -> "Tensor":
        from popxl import ops
        return ops.flatten(self)

    def flatten_(self) -> "Tensor":
        from popxl import ops
        return ops.flatten_(self)

    def detach(self) -> "Tensor":
        from popxl import ops
        return ops.detach(self)

    def detach_(self) -> "Tensor":
        from popxl import ops
        return ops.detach_(self)

    def diag(self) -> "Tensor":
        if self.rank != 2:
            raise ValueError(f"Tensor.diag needs a rank-2 tensor; {self.id!r} has shape {self.shape}.")
        return self.flatten()[:: self.shape[1] + 1]

    def copy_to_ipu(self, destination: int, source: Optional[int] = None) -> "Tensor":
        from popxl import ops
        return ops.ipu_copy(self, destination, source)

    # operators ----------------------------------------------------------------------------------
    def _ensure_tensor(self, value: Any) -> "Tensor":
        """Operator operands become constants of this tensor's dtype in this tensor's graph."""
        if isinstance(value, Tensor):
            return value
        arr = np.asarray(value)
        if arr.size == 0:
            raise ValueError(f"Cannot use an empty value {value!r} as an operand of {self.id!r}.")
        return constant(arr, dtype=self.dtype)

    def _binary(self, opname: str, other: Any, reflected: builtins.bool = False) -> "Tensor":
        from popxl import ops
        other = self._ensure_tensor(other)
        fn = getattr(ops, opname)
        return fn(other, self) if reflected else fn(self, other)

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._binary("div", o, True)
    def __mod__(self, o): return self._binary("fmod", o)
    def __rmod__(self, o): return self._binary("fmod", o, True)
    def __matmul__(self, o): return self._binary("matmul", o)
    def __rmatmul__(self, o): return self._binary("matmul", o, True)
    def __and__(self, o): return self._binary("logical_and", o)
    def __rand__(self, o): return self._binary("logical_and", o, True)
    def __or__(self, o): return self._binary("logical_or", o)
    def __ror__(self, o): return self._binary("logical_or", o, True)

    # Comparisons are an extension (PopXL has none): `==` stays identity so tensors stay hashable.
    def __gt__(self, o): return self._binary("greater", o)
    def __lt__(self, o): return self._binary("greater", o, True)

    def __ge__(self, o):
        from popxl import ops
        o = self._ensure_tensor(o)
        return ops.logical_or(ops.greater(self, o), ops.equal(self, o))

    def __le__(self, o):
        from popxl import ops
        o = self._ensure_tensor(o)
        return ops.logical_or(ops.greater(o, self), ops.equal(self, o))

    def __iadd__(self, o):
        from popxl import ops
        ops.add_(self, self._ensure_tensor(o))
        return self

    def __neg__(self):
        from popxl import ops
        return ops.negate(self)

    def __invert__(self):
        from popxl import ops
        return ops.logical_not(self)

    def __pow__(self, e):
        from popxl import ops
        return ops.pow(self, e)

    def __rpow__(self, x):  # the base becomes a constant of this tensor's dtype
        from popxl import ops
        return ops.pow(self._ensure_tensor(x), self)

    def __eq__(self, other: Any) -> builtins.bool:  # identity, as PopXL
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __len__(self) -> int:
        if not self.shape:
            raise ValueError(f"len() of scalar tensor {self.id!r} is undefined.")
        return self.shape[0]

    def __bool__(self) -> builtins.bool:
        return True

    def __getitem__(self, key: Any) -> "Tensor":
        from popxl.ops.shape import getitem
        return getitem(self, key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}[{self.id} {self.dtype!r} {self.shape}]"


class Variable(Tensor):
    """A tensor of the main graph that lives on the device between runs, with a host value."""

    @property
    def replica_grouping(self) -> "ReplicaGrouping":
        return self._replica_grouping

    @property
    def retrieval_mode(self) -> Literal["one_per_group", "all_replicas"]:
        return self._retrieval_mode

    @property
    def shape_on_replica(self) -> Tuple[int, ...]:
        return self.shape

    @property
    def shape_on_host(self) -> Tuple[int, ...]:
        groups = self._replica_grouping.num_groups
        return self.shape if groups == 1 else (groups, *self.shape)

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:  # type: ignore[override]
        return super().copy_to_ipu(dst, src)


class Constant(Tensor):
    """A tensor with a value fixed at trace time."""

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:  # type: ignore[override]
        return super().copy_to_ipu(dst, src)


# `TensorByRef` is Tensor as far as values go; as an annotation it marks by-reference inputs.
class _TensorByRefMeta(type):
    def __instancecheck__(cls, obj: Any) -> builtins.bool:
        return isinstance(obj, Tensor)


class TensorByRef(Tensor, metaclass=_TensorByRefMeta):
    """Annotate a traced function's parameter with this to make that graph input by-reference:
    in-place changes to it inside the graph are seen by the caller's tensor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("TensorByRef is only an annotation for graph inputs; it cannot be called.")


def _host_data(data: Any, dtype: Optional[dtypes.dtype], downcast: builtins.bool,
               log2_scale: Optional[int], nan_on_overflow: Optional[builtins.bool]) -> np.ndarray:
    from popxl.utils import to_numpy
    return to_numpy(data, dtype=dtype, downcast=downcast, copy=True, log2_scale=log2_scale,
                    nan_on_overflow=nan_on_overflow)


def variable(data: HostScalarTensor, dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
             downcast: builtins.bool = True, replica_grouping: Optional["ReplicaGrouping"] = None,
             retrieval_mode: Optional[Literal["one_per_group", "all_replicas"]] = None,
             log2_scale: Optional[int] = None, nan_on_overflow: Optional[builtins.bool] = None) -> Variable:
    """Create a variable in the main graph, initialised from host ``data``."""
    return _create_variable(data, dtype, name, downcast, replica_grouping, retrieval_mode, log2_scale,
                            nan_on_overflow)


def _create_variable(data: HostScalarTensor, dtype: Optional[dtypes.dtype], name: Optional[str],
                     downcast: builtins.bool, replica_grouping: Optional["ReplicaGrouping"],
                     retrieval_mode: Optional[str], log2_scale: Optional[int],
                     nan_on_overflow: Optional[builtins.bool], what: str = "popxl.variable",
                     check: Optional[Any] = None, **extra: Any) -> Variable:
    """Shared by every variable factory. ``check(spec, replica_grouping) -> spec`` runs before the
    variable exists (so a rejected call leaves the graph untouched) and may add a meta_shape or
    drop a leading axis of 1;
    ``extra`` becomes attributes of the new Variable (e.g. its remote buffer slot)."""
    ctx = get_current_context()
    g = ctx.graph
    g.ir._check_mutable()
    if g is not g.ir.main_graph:
        raise ValueError(
            f"{what} {name or ''!r}: variables can only be created in the main graph, not in "
            f"{g.id!r}. Create it under `with ir.main_graph:` and pass it to the subgraph as an input.")
    data = _host_data(data, dtype, downcast, log2_scale, nan_on_overflow)
    rg = replica_grouping if replica_grouping is not None else g.ir.replica_grouping()
    if retrieval_mode is None:
        retrieval_mode = "one_per_group"
    if retrieval_mode not in ("one_per_group", "all_replicas"):
        raise ValueError(f"retrieval_mode must be 'one_per_group' or 'all_replicas', not {retrieval_mode!r}.")
    shape = data.shape
    if rg.num_groups > 1:
        if not shape or shape[0] != rg.num_groups:
            raise ValueError(
                f"{what} {name!r}: with a replica grouping of {rg.num_groups} groups the data needs "
                f"a leading axis of {rg.num_groups} (one value per group); got shape {shape}.")
        shape = shape[1:]
    dt = dtype if dtype is not None else dtypes.from_numpy(data.dtype)
    spec = TensorSpec(shape, dt)
    if check is not None:
        spec = check(spec, rg)
        if spec.shape != shape:  # the check dropped a group axis of 1 (remote variables)
            data = data.reshape(spec.shape)
    return Variable._create(g, name or "v", spec, _host_data_value=data,
                            _replica_grouping=rg, _retrieval_mode=retrieval_mode, **extra)


def constant(data: HostScalarTensor, dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
             downcast: builtins.bool = True, log2_scale: Optional[int] = None,
             nan_on_overflow: Optional[builtins.bool] = None) -> Constant:
    """Create a constant in the current graph."""
    g = get_current_context().graph
    g.ir._check_mutable()
    arr = np.asarray(data) if not isinstance(data, np.ndarray) else data
    if dtype is None and arr.dtype.names is not None:
        raise TypeError("popxl.constant: float8 data needs an explicit dtype (float8_143 or float8_152).")
    data = _host_data(data, dtype, downcast, log2_scale, nan_on_overflow)
    dt = dtype if dtype is not None else dtypes.from_numpy(data.dtype)
    return Constant._create(g, name or "c", TensorSpec(data.shape, dt), _host_data_value=data)


def graph_input(shape: Iterable[int], dtype: dtypes.dtype, name: Optional[str] = None,
                by_ref: builtins.bool = False, meta_shape: Optional[Iterable[int]] = None) -> Tensor:
    """Append an input to the current graph and return it."""
    g = get_current_context().graph
    g.ir._check_mutable()
    if not isinstance(dtype, dtypes.dtype):
        raise TypeError(f"graph_input {name!r}: dtype must be a popxl dtype, not {dtype!r}.")
    try:
        spec = TensorSpec(shape, dtype, meta_shape or ())
    except (TypeError, ValueError) as e:
        raise type(e)(f"graph_input {name!r}: {e}") from None
    return g.add_input(spec, name or "input", by_ref=by_ref)


def graph_output(t: Tensor) -> None:
    """Mark ``t`` as the next output of the current graph."""
    g = get_current_context().graph
    g.ir._check_mutable()
    if not isinstance(t, Tensor):
        raise TypeError(f"graph_output expects a popxl.Tensor, not {type(t).__name__}.")
    if t.graph is not g:
        raise ValueError(f"graph_output: tensor {t.id!r} is not in the current graph {g.id!r}.")
    g.add_output(t)
