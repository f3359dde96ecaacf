"""Tensors of the IR: `Tensor`, `Variable`, `Constant`, `TensorSpec` and their factories."""
from __future__ import annotations

import builtins
import operator
import collections.abc
from collections.abc import Mapping
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, Literal, Optional, Sequence,
                    Tuple, Type, TypeVar, Union)

import numpy as np

from popxl import _hooks, _pb, dtypes
from popxl.context import get_current_context
from popxl.logs import get_logger
from popxl.utils import to_numpy

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


def _lazy_attribute(name: str) -> Any:
    # PopXL's ``host_tensor_types``: the classes of host tensor data (isinstance checks), torch.Tensor
    # among them when torch is installed. Made on first use: importing torch takes seconds.
    if name == "host_tensor_types":
        types: Tuple[type, ...] = (np.ndarray, collections.abc.Iterable)
        try:
            import torch  # noqa: PLC0415  (optional, and seconds to import)
        except ImportError:
            pass
        else:
            types += (torch.Tensor,)
        globals()[name] = types
        return types
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:  # a module __getattr__ would make every unknown name Any to type checkers
    host_tensor_types: Tuple[type, ...]
else:
    __getattr__ = _lazy_attribute
TensorLike = Union["Tensor", HostScalarTensor]
_T = TypeVar("_T", bound="Tensor")


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
    """Shape, dtype and meta shape of a tensor: enough to make a graph input or a stream.

    A read-only mapping with keys ``shape``, ``dtype`` and ``meta_shape`` (so ``**spec`` works);
    hashable, and accepted by ``Ir.create_graph`` in place of a tensor.

    Args:
        shape: The tensor's shape.
        dtype: The tensor's dtype.
        meta_shape: The unsharded shape of a replica-sharded tensor; () otherwise.
    """

    __slots__ = ("_shape", "_dtype", "_meta_shape")

    def __init__(self, shape: Iterable[int], dtype: dtypes.dtype, meta_shape: Optional[Iterable[int]] = ()):
        self._shape = shape_tuple(shape)
        self._dtype = dtype
        self._meta_shape = shape_tuple(() if meta_shape is None else meta_shape, "meta_shape")  # None: none
        n = 1
        for d in self._shape:
            n *= d
        itemsize = dtype.itemsize if isinstance(dtype, dtypes.dtype) else 1
        if n * itemsize > INT64_MAX:
            raise ValueError(f"shape {self._shape} of {getattr(dtype, 'name', dtype)} holds {n} elements "
                             f"({n * itemsize} bytes): more than int64 can count ({INT64_MAX}).")

    @property
    def shape(self) -> Tuple[int, ...]:
        """The tensor's shape."""
        return self._shape

    @property
    def dtype(self) -> dtypes.dtype:
        """The tensor's dtype."""
        return self._dtype

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        """The unsharded shape of a replica-sharded tensor; () otherwise."""
        return self._meta_shape

    def to_dict(self) -> Dict[str, Any]:
        """The spec as a plain dict.

        Returns:
            ``{'shape': ..., 'dtype': ..., 'meta_shape': ...}``.
        """
        return {"shape": self._shape, "dtype": self._dtype, "meta_shape": self._meta_shape}

    def to_tuple(self) -> Tuple[Tuple[int, ...], dtypes.dtype, Tuple[int, ...]]:
        """The spec as a tuple.

        Returns:
            ``(shape, dtype, meta_shape)``.
        """
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
    """A value in a graph, made by ops and factories (never constructed directly).

    Operators trace ops: ``+ - * / % @`` and their reflected forms, unary ``-``, ``~``, ``& |``,
    ``**``, ``+=`` (in place) and ``t[key]``. Python numbers and arrays used as operands become
    constants of the tensor's dtype. ``==`` and hashing are by identity.

    Raises:
        RuntimeError: If constructed directly.
    """

    # NumPy must defer to our reflected operators (ndarray + Tensor -> Tensor.__radd__).
    __array_ufunc__ = None
    __iter__ = None
    __contains__ = None
    # (RemoteBuffer, offset, shards): set on a remote variable (its value lives in that slot, not
    # on chip) and on a replica-sharded variable's shard tensor (kept on chip, synced with the slot).
    _remote_slot: Optional[Tuple[Any, int, int]] = None
    _graph: "Graph"
    _spec: TensorSpec
    _producer: Optional["Op"]
    _id: str

    def __init__(self) -> None:
        raise RuntimeError(
            "popxl.Tensor cannot be constructed directly: create tensors with ops, "
            "popxl.variable, popxl.constant or popxl.graph_input.")

    @classmethod
    def _create(cls: Type[_T], graph: "Graph", name: str, spec: TensorSpec, producer: Optional["Op"] = None,
                **extra: Any) -> _T:
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
        """The tensor's unique name in its Ir (``<graph id>/<name>`` inside a subgraph)."""
        return self._id

    @property
    def _pb_tensor(self) -> Any:
        """This tensor as PopART's internal IR shows it (popart._internal.ir.Tensor, a view)."""
        return _pb.view_of(self)

    @classmethod
    def _from_pb_tensor(cls, pb_tensor: Any) -> "Tensor":
        """The popxl tensor a `popart._internal.ir.Tensor` shows (the same object every time)."""
        return _pb.popxl_object(pb_tensor, Tensor)

    @property
    def name(self) -> str:
        """The id without the graph's prefix."""
        prefix = self._graph._tensor_prefix
        return self._id[len(prefix):] if prefix and self._id.startswith(prefix) else self._id

    @property
    def scope(self) -> str:
        """The name scope part of the tensor's name."""
        return self.name.rpartition("/")[0]

    @property
    def graph(self) -> "Graph":
        """The graph the tensor belongs to."""
        return self._graph

    @property
    def ir(self) -> "Ir":
        """The Ir the tensor belongs to."""
        return self._graph.ir

    @property
    def producer(self) -> Optional["Op"]:
        """The op that made the tensor, or None for inputs, variables and constants."""
        return self._producer

    # spec ---------------------------------------------------------------------------------------
    @property
    def dtype(self) -> dtypes.dtype:
        """The tensor's element type."""
        return self._spec.dtype

    @property
    def shape(self) -> Tuple[int, ...]:
        """The tensor's shape (per replica)."""
        return self._spec.shape

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        """The unsharded shape of a replica-sharded tensor; () otherwise."""
        return self._spec.meta_shape

    @property
    def spec(self) -> TensorSpec:
        """The tensor's `TensorSpec` (shape, dtype, meta shape)."""
        return self._spec

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def nelms(self) -> int:
        """The number of elements."""
        return _nelms(self.shape)

    @property
    def location_info(self) -> Any:
        """Where the tensor is stored (PopXL's TensorLocation); None for ordinary on-chip tensors."""
        return getattr(self, "_location", None)

    @property
    def ipu(self) -> int:
        """The virtual IPU of the op that made the tensor (0 for tensors no op made)."""
        return self._producer.ipu if self._producer is not None else 0

    @property
    def tile_set(self) -> Literal["compute", "io"]:
        """The tile set, "compute" or "io", of the op that made the tensor."""
        return self._producer.tile_set if self._producer is not None else "compute"

    @property
    def in_sync_with_ipu(self) -> builtins.bool:
        """Whether the tensor is in sync with the device (always True here)."""
        return True

    def strides(self, shape: Optional[Iterable[int]] = None) -> Tuple[int, ...]:
        """Byte strides of a C-contiguous layout.

        Args:
            shape: The shape laid out; default this tensor's.

        Returns:
            One stride per dimension, in bytes.
        """
        shape = tuple(self.shape if shape is None else shape)
        item = self.dtype.itemsize
        out, acc = [], item
        for d in reversed(shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    # views and copies ---------------------------------------------------------------------------
    def transpose(self, permutation: Optional[Iterable[int]] = None) -> "Tensor":
        """A copy with its axes permuted (see `popxl.ops.transpose`).

        Args:
            permutation: The input axis of each output axis; None reverses them.

        Returns:
            A new tensor.

        Raises:
            ValueError: If ``permutation`` is not a permutation of the axes.
        """
        return _hooks.ops.transpose(self, permutation)

    def transpose_(self, permutation: Optional[Iterable[int]] = None) -> "Tensor":
        """A view with its axes permuted (see `popxl.ops.transpose_`).

        Args:
            permutation: The input axis of each output axis; None reverses them.

        Returns:
            An alias of this tensor: writes through it change this tensor. No gradient flows through it.

        Raises:
            ValueError: If ``permutation`` is not a permutation of the axes.
        """
        return _hooks.ops.transpose_(self, permutation)

    @property
    def T(self) -> "Tensor":
        """The tensor with its axes reversed: ``transpose()``."""
        return self.transpose()

    @property
    def T_(self) -> "Tensor":
        """A view with its axes reversed: ``transpose_()``."""
        return self.transpose_()

    def reshape(self, shape: Iterable[int]) -> "Tensor":
        """A copy with a new shape (see `popxl.ops.reshape`).

        Args:
            shape: The new shape; one entry may be -1.

        Returns:
            A new tensor.

        Raises:
            ValueError: If the element counts differ.
        """
        return _hooks.ops.reshape(self, shape)

    def reshape_(self, shape: Iterable[int]) -> "Tensor":
        """A view with a new shape (see `popxl.ops.reshape_`).

        Args:
            shape: The new shape; one entry may be -1.

        Returns:
            An alias of this tensor: writes through it change this tensor. No gradient flows through it.

        Raises:
            ValueError: If the element counts differ.
        """
        return _hooks.ops.reshape_(self, shape)

    def flatten(self) -> "Tensor":
        """A 1-D copy.

        Returns:
            A new tensor.
        """
        return _hooks.ops.flatten(self)

    def flatten_(self) -> "Tensor":
        """A 1-D view.

        Returns:
            An alias of this tensor: writes through it change this tensor. No gradient flows through it.
        """
        return _hooks.ops.flatten_(self)

    def detach(self) -> "Tensor":
        """A copy through which no gradient flows.

        Returns:
            A new tensor.
        """
        return _hooks.ops.detach(self)

    def detach_(self) -> "Tensor":
        """An alias through which no gradient flows.

        Returns:
            An alias of this tensor.
        """
        return _hooks.ops.detach_(self)

    def diag(self) -> "Tensor":
        """The diagonal of a matrix: ``flatten()[::shape[1] + 1]``.

        Returns:
            A new 1-D tensor.

        Raises:
            ValueError: If the tensor is not of rank 2.
        """
        if self.rank != 2:
            raise ValueError(f"Tensor.diag needs a rank-2 tensor; {self.id!r} has shape {self.shape}.")
        return self.flatten()[:: self.shape[1] + 1]

    def copy_to_ipu(self, destination: int, source: Optional[int] = None) -> "Tensor":
        """A copy of the tensor on another (virtual) IPU (see `popxl.ops.ipu_copy`).

        Args:
            destination: The IPU the copy lives on.
            source: The IPU the tensor lives on; default the IPU of its producer.

        Returns:
            A new tensor.

        Raises:
            ValueError: If the source IPU is not known.
        """
        return _hooks.ops.ipu_copy(self, destination, source)

    # operators ----------------------------------------------------------------------------------
    # Operators and the methods above trace ops, which popxl.ops defines, a layer above this module:
    # it sets popxl._hooks.ops (and .getitem) when it is imported, as `import popxl` does.
    def _ensure_tensor(self, value: Any) -> "Tensor":
        """Operator operands become constants of this tensor's dtype in this tensor's graph."""
        if isinstance(value, Tensor):
            return value
        arr = np.asarray(value)
        if arr.size == 0:
            raise ValueError(f"Cannot use an empty value {value!r} as an operand of {self.id!r}.")
        return constant(arr, dtype=self.dtype)

    def _binary(self, opname: str, other: Any, reflected: builtins.bool = False) -> "Tensor":
        other = self._ensure_tensor(other)
        fn = getattr(_hooks.ops, opname)
        return fn(other, self) if reflected else fn(self, other)

    def __add__(self, o: "TensorLike") -> "Tensor": return self._binary("add", o)
    def __radd__(self, o: "TensorLike") -> "Tensor": return self._binary("add", o, True)
    def __sub__(self, o: "TensorLike") -> "Tensor": return self._binary("sub", o)
    def __rsub__(self, o: "TensorLike") -> "Tensor": return self._binary("sub", o, True)
    def __mul__(self, o: "TensorLike") -> "Tensor": return self._binary("mul", o)
    def __rmul__(self, o: "TensorLike") -> "Tensor": return self._binary("mul", o, True)
    def __truediv__(self, o: "TensorLike") -> "Tensor": return self._binary("div", o)
    def __rtruediv__(self, o: "TensorLike") -> "Tensor": return self._binary("div", o, True)
    def __mod__(self, o: "TensorLike") -> "Tensor": return self._binary("fmod", o)
    def __rmod__(self, o: "TensorLike") -> "Tensor": return self._binary("fmod", o, True)
    def __matmul__(self, o: "TensorLike") -> "Tensor": return self._binary("matmul", o)
    def __rmatmul__(self, o: "TensorLike") -> "Tensor": return self._binary("matmul", o, True)
    def __and__(self, o: "TensorLike") -> "Tensor": return self._binary("logical_and", o)
    def __rand__(self, o: "TensorLike") -> "Tensor": return self._binary("logical_and", o, True)
    def __or__(self, o: "TensorLike") -> "Tensor": return self._binary("logical_or", o)
    def __ror__(self, o: "TensorLike") -> "Tensor": return self._binary("logical_or", o, True)

    # Comparisons are an extension (PopXL has none): `==` stays identity so tensors stay hashable.
    def __gt__(self, o: "TensorLike") -> "Tensor": return self._binary("greater", o)
    def __lt__(self, o: "TensorLike") -> "Tensor": return self._binary("greater", o, True)

    def __ge__(self, o: "TensorLike") -> "Tensor":
        o = self._ensure_tensor(o)
        return _hooks.ops.logical_or(_hooks.ops.greater(self, o), _hooks.ops.equal(self, o))

    def __le__(self, o: "TensorLike") -> "Tensor":
        o = self._ensure_tensor(o)
        return _hooks.ops.logical_or(_hooks.ops.greater(o, self), _hooks.ops.equal(self, o))

    def __iadd__(self, o: "TensorLike") -> "Tensor":
        _hooks.ops.add_(self, self._ensure_tensor(o))
        return self

    def __neg__(self) -> "Tensor":
        return _hooks.ops.negate(self)

    def __invert__(self) -> "Tensor":
        return _hooks.ops.logical_not(self)

    def __pow__(self, e: Union[float, int, "Tensor"]) -> "Tensor":
        return _hooks.ops.pow(self, e)

    def __rpow__(self, x: "TensorLike") -> "Tensor":  # the base becomes a constant of this tensor's dtype
        return _hooks.ops.pow(self._ensure_tensor(x), self)

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
        return _hooks.getitem(self, key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}[{self.id} {self.dtype!r} {self.shape}]"


class Variable(Tensor):
    """A tensor of the main graph that keeps its value on the device between runs, with a host copy.

    Made by `popxl.variable` and the remote / replica-sharded factories.
    """

    _host_data_value: np.ndarray
    _replica_grouping: "ReplicaGrouping"
    _retrieval_mode: Literal["one_per_group", "all_replicas"]

    @property
    def replica_grouping(self) -> "ReplicaGrouping":
        """How replicas share the variable's value (one value per group)."""
        return self._replica_grouping

    @property
    def retrieval_mode(self) -> Literal["one_per_group", "all_replicas"]:
        """"one_per_group" or "all_replicas": what ``Session.get_tensor_data`` returns."""
        return self._retrieval_mode

    @property
    def shape_on_replica(self) -> Tuple[int, ...]:
        """The shape on each replica (the shard's shape for a replica-sharded variable)."""
        return self.shape

    @property
    def _memmap_arr(self) -> Optional[np.memmap]:
        """The np.memmap the variable was made from (its host data, used in place), else None."""
        data = self._host_data_value
        return data if isinstance(data, np.memmap) else None

    @property
    def shape_on_host(self) -> Tuple[int, ...]:
        """The host value's shape: ``shape``, with a leading group axis when there are several groups."""
        groups = self._replica_grouping.num_groups
        return self.shape if groups == 1 else (groups, *self.shape)

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:  # type: ignore[override]
        """A copy of the variable on another (virtual) IPU.

        Args:
            dst: The IPU the copy lives on.
            src: The IPU the variable lives on.

        Returns:
            A new tensor.
        """
        return super().copy_to_ipu(dst, src)


class Constant(Tensor):
    """A tensor whose value is fixed when the program is traced. Made by `popxl.constant`."""

    _host_data_value: np.ndarray

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:  # type: ignore[override]
        """A copy of the constant on another (virtual) IPU.

        Args:
            dst: The IPU the copy lives on.
            src: The IPU the constant lives on.

        Returns:
            A new tensor.
        """
        return super().copy_to_ipu(dst, src)


# `TensorByRef` is Tensor as far as values go; as an annotation it marks by-reference inputs.
class _TensorByRefMeta(type):
    def __instancecheck__(cls, obj: Any) -> builtins.bool:
        return isinstance(obj, Tensor)


class TensorByRef(Tensor, metaclass=_TensorByRefMeta):
    """Annotate a traced function's parameter with this to make that graph input by-reference.

    In-place changes to such an input inside the graph are seen by the caller's tensor.

    Args:
        *args: Not accepted: the class is only an annotation.
        **kwargs: Not accepted.

    Raises:
        NotImplementedError: If called.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("TensorByRef is only an annotation for graph inputs; it cannot be called.")


def _host_data(data: Any, dtype: Optional[dtypes.dtype], downcast: builtins.bool,
               log2_scale: Optional[int], nan_on_overflow: Optional[builtins.bool]) -> np.ndarray:
    return to_numpy(data, dtype=dtype, downcast=downcast, copy=True, log2_scale=log2_scale,
                    nan_on_overflow=nan_on_overflow)


def variable(data: HostScalarTensor, dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
             downcast: builtins.bool = True, replica_grouping: Optional["ReplicaGrouping"] = None,
             retrieval_mode: Optional[Literal["one_per_group", "all_replicas"]] = None,
             log2_scale: Optional[int] = None, nan_on_overflow: Optional[builtins.bool] = None) -> Variable:
    """Create a variable in the main graph, initialised from host data.

    Without ``dtype`` and with ``downcast``, 64-bit data become 32-bit. A C-contiguous
    ``np.memmap`` of the right dtype is referenced, not copied; with a non-constant
    ``replica_grouping`` it is copied, with a warning (as in PopXL).

    Args:
        data: The initial value (array, number, nested list or torch tensor). With several replica
            groups, it has a leading axis with one value per group.
        dtype: The variable's dtype; default inferred from ``data``.
        name: The variable's name.
        downcast: Turn 64-bit host data into 32-bit when ``dtype`` is not given.
        replica_grouping: How replicas share the value; default one value for all.
        retrieval_mode: "one_per_group" (default) or "all_replicas".
        log2_scale: For float8 dtypes: the power-of-two scale applied when converting ``data``.
        nan_on_overflow: For float8 dtypes: turn values too large for the format into NaN.

    Returns:
        The new `Variable`.

    Raises:
        ValueError: If called outside the main graph, or the data do not fit the grouping or a memmap
            cannot be referenced.
        TypeError: If ``data`` cannot be converted to ``dtype``.
        RuntimeError: If ``log2_scale`` or ``nan_on_overflow`` is given for a dtype that is not float8.
    """
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
    copied_file = None
    if isinstance(data, np.memmap) and not rg.is_const:
        # As PopXL: the variable gets a copy of the data, so the file is neither read nor written
        # after this point. A read-only file's copy stays read-only: weights are not written back
        # to the host, as with any read-only memmap (PopXL's rule too).
        copied_file, writeable = str(data.filename or "its file"), data.flags.writeable
        data = np.array(data)
        data.flags.writeable = writeable
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
    var = Variable._create(g, name or "v", spec, _host_data_value=data,
                           _replica_grouping=rg, _retrieval_mode=retrieval_mode, **extra)
    if copied_file is not None:
        get_logger("popxl").warning(
            "Variable %s (%s): you have passed np.memmap data and a non-const replica grouping; the data "
            "is copied, so the variable neither reads nor writes %s.", var.id, what, copied_file)
    return var


def constant(data: HostScalarTensor, dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
             downcast: builtins.bool = True, log2_scale: Optional[int] = None,
             nan_on_overflow: Optional[builtins.bool] = None) -> Constant:
    """Create a constant in the current graph.

    Args:
        data: The value (array, number, nested list or torch tensor).
        dtype: The constant's dtype; default inferred from ``data``.
        name: The constant's name.
        downcast: Turn 64-bit host data into 32-bit when ``dtype`` is not given.
        log2_scale: For float8 dtypes: the power-of-two scale applied when converting ``data``.
        nan_on_overflow: For float8 dtypes: turn values too large for the format into NaN.

    Returns:
        The new `Constant`.

    Raises:
        TypeError: If ``data`` cannot be converted, or is float8 data without a ``dtype``.
        RuntimeError: If there is no current graph, or ``log2_scale`` or ``nan_on_overflow`` is given
            for a dtype that is not float8.
    """
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
    """Append an input to the current graph.

    Args:
        shape: The input's shape.
        dtype: The input's dtype.
        name: The input's name.
        by_ref: Make the input by-reference: in-place changes inside are seen by the caller.
        meta_shape: The unsharded shape, for a replica-sharded input.

    Returns:
        The new input tensor.

    Raises:
        RuntimeError: If there is no current graph.
        ValueError: If ``shape`` is not a shape.
    """
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
    """Append a tensor to the current graph's outputs.

    Args:
        t: A tensor of the current graph.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` belongs to another graph.
    """
    g = get_current_context().graph
    g.ir._check_mutable()
    if not isinstance(t, Tensor):
        raise TypeError(f"graph_output expects a popxl.Tensor, not {type(t).__name__}.")
    if t.graph is not g:
        raise ValueError(f"graph_output: tensor {t.id!r} is not in the current graph {g.id!r}.")
    g.add_output(t)
