"""The ONNX op table's framework: the table ``OPS`` (ONNX op type -> ``Entry``), the ``onnx_op`` and
``onnx_fold`` decorators that fill it, the ``Node`` an entry receives, and the small helpers every
family of entries uses. The entries live in family modules beside this one (``elementwise``,
``matmul``, ``nn``, ``reduce``, ``shape``, ``indexing``, ``random``, ``control``, ``recurrent``,
``signal``, ``sampling``, ``graphcore``), each importing this module; ``popart.onnx.ops`` imports
them all, so the table is complete once it is imported; the importer (``popart.onnx.importer``)
imports that, and none of them imports the importer: a node's entry reaches it as ``Node.imp``. Ops defined as functions of others are
expanded before import (``functions``).

An entry receives a ``Node`` (the node plus helpers to read its attributes and inputs) and returns
one value per output: a popxl Tensor, or a NumPy array when the output is known at import (Shape,
Size). Differences between opsets (attributes that became inputs, changed defaults) are handled
inside the entry. Where popxl has no op for an ONNX feature, the entry composes it from popxl ops.
Nodes whose inputs are all known at import never reach their entry: the importer folds them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt
import onnx

import popxl
import popxl.ops as ops
from popxl import dtypes

from popart.errors import OnnxImportError
from popart.onnx.protos import device_array, device_dtype, op_key
from popart.onnx.validate import element_dtype

if TYPE_CHECKING:  # pragma: no cover  (the importer, the top of popart.onnx, imports this module)
    from popart.onnx.importer import GraphImporter

__all__ = ["OPS", "Node", "Entry", "Value", "onnx_op", "onnx_fold"]

Value = Union[np.ndarray, popxl.Tensor]
Dims = Union[Sequence[int], npt.NDArray[np.integer]]  # a shape, or lengths of some axes


# The dtype kinds a single value read at import must have when asked for exactly, and its name.
_SCALAR_KINDS: Dict[type, Tuple[str, str]] = {int: ("iu", "an integer"), float: ("f", "a floating-point"),
                                              bool: ("b", "a boolean")}


class Node:
    """One ONNX node being lowered, with typed access to its attributes and inputs."""

    def __init__(self, importer: "GraphImporter", proto: onnx.NodeProto, index: int) -> None:
        self.imp = importer
        self.proto = proto
        self.index = index
        self.op_type = proto.op_type
        self.opset = importer.node_opset(index)
        self.entry: Entry = importer._ops[op_key(proto)]
        self._attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}

    def describe(self) -> str:
        return f"node {self.proto.name or f'<node {self.index}>'!r} ({self.op_type}, opset {self.opset})"

    def fail(self, message: str) -> OnnxImportError:
        return OnnxImportError(f"{self.describe()}: {message}")

    # attributes -----------------------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        v = self._attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    @overload
    def ints(self, name: str) -> Optional[List[int]]: ...

    @overload
    def ints(self, name: str, default: Sequence[int]) -> List[int]: ...

    def ints(self, name: str, default: Optional[Sequence[int]] = None) -> Optional[List[int]]:
        """Attribute ``name`` as a list of ints; ``default`` (None if not given) when the node has none."""
        v = self._attrs.get(name)
        return [int(i) for i in v] if v is not None else (list(default) if default is not None else None)

    # inputs ---------------------------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.proto.input)

    @property
    def n_outputs(self) -> int:
        return len(self.proto.output)

    def has(self, i: int) -> bool:
        return i < len(self.proto.input) and self.proto.input[i] != ""

    def x(self, i: int) -> popxl.Tensor:
        """Input ``i`` as a popxl Tensor."""
        if not self.has(i):
            raise self.fail(f"input {i} is required")
        return self.imp.tensor(self.proto.input[i])

    def xs(self) -> List[popxl.Tensor]:
        return [self.x(i) for i in range(self.n_inputs) if self.has(i)]

    def static(self, i: int, what: str) -> np.ndarray:
        """Input ``i`` as a NumPy array; it must be known at import."""
        if not self.has(i):
            raise self.fail(f"input {i} ({what}) is required")
        v = self.imp.static(self.proto.input[i])
        if v is None:
            raise self.fail(f"input {i} ({what}, tensor {self.proto.input[i]!r}) must be known at import "
                            f"(a constant, an initializer, or computed from shapes), but it is computed on the device")
        return v

    def optional_static(self, i: int, what: str) -> Optional[np.ndarray]:
        return self.static(i, what) if self.has(i) else None

    def static_ints(self, i: int, what: str) -> List[int]:
        """Input ``i``, known at import (a shape, axes, pads), as a flat list of ints."""
        values = [int(v) for v in np.asarray(self.static(i, what)).reshape(-1)]
        if any(not -2 ** 63 <= v < 2 ** 63 for v in values):  # a uint64 beyond int64 (or a float)
            raise self.fail(f"input {i} ({what}) holds {values}, beyond 64-bit integers")
        return values

    def optional_static_ints(self, i: int, what: str) -> Optional[List[int]]:
        return self.static_ints(i, what) if self.has(i) else None

    def single(self, value: Any, what: str, kind: type = int, exact: bool = False,
               index: Optional[int] = None) -> Any:
        """``value``, which must hold one element, as ``kind`` (int, float or bool). ``exact``: its
        dtype must already be of that kind (else any number converts). ``index``: the input it is,
        named in the error."""
        v = np.asarray(value)
        if v.size != 1 or v.dtype.kind not in (_SCALAR_KINDS[kind][0] if exact else "biuf"):
            problem = "must hold a single value" if v.size != 1 else "has the wrong type"
            where = f"input {index} ({what}) {problem}: " if index is not None else ""
            raise self.fail(f"{where}{what} must be {_SCALAR_KINDS[kind][1]} scalar, got {v.dtype} of shape {v.shape}")
        return kind(v.reshape(-1)[0])

    def static_int(self, i: int, what: str, exact: bool = False) -> int:
        """Input ``i``, a single value known at import (an axis, a count, a length), as an int."""
        return self.single(self.static(i, what), what, int, exact, i)

    def static_float(self, i: int, what: str) -> float:
        return self.single(self.static(i, what), what, float, index=i)

    def static_bool(self, i: int, what: str) -> bool:
        return self.single(self.static(i, what), what, bool, index=i)

    def shape(self, i: int) -> Tuple[int, ...]:
        """The shape of input ``i`` (known at import in every case)."""
        v = self.imp.static(self.proto.input[i])
        return tuple(v.shape) if v is not None else tuple(self.x(i).shape)

    def scalar(self, value: float, like: popxl.Tensor) -> popxl.Tensor:
        """A scalar constant of ``like``'s dtype."""
        return _scalar(value, like)


# How a node is computed at import: its inputs (None where absent) in, one array per output out.
Fold = Callable[..., Sequence[Optional[np.ndarray]]]


class Entry:
    """How one ONNX op type is lowered. ``foldable``: a node whose inputs are all known at import
    is computed at import instead (all ops here are deterministic; only those whose import-time
    evaluation lacks features are not foldable), by ``fold(node, *inputs)`` when the op has one
    (``onnx_fold``), else by ONNX's reference implementation."""

    def __init__(self, fn: Callable[[Node], Sequence[Optional[Value]]], foldable: bool = True) -> None:
        self.fn = fn
        self.foldable = foldable
        self.fold: Optional[Fold] = None

    def __call__(self, n: Node) -> Sequence[Optional[Value]]:
        return self.fn(n)


OPS: Dict[str, Entry] = {}


def onnx_op(*op_types: str, foldable: bool = True) -> Callable:
    """Register the decorated function as the entry of each of ``op_types`` (``foldable=False``:
    never computed at import, for ops whose ONNX reference implementation misses features)."""
    def deco(fn: Callable[[Node], Sequence[Optional[Value]]]) -> Callable:
        for t in op_types:
            if t in OPS:
                raise RuntimeError(f"ONNX op {t} registered twice")
            OPS[t] = Entry(fn, foldable)
        return fn
    return deco


def onnx_fold(*op_types: str) -> Callable[[Fold], Fold]:
    """Register the decorated function as the import-time evaluation of each of ``op_types``
    (already in the table), in place of ONNX's reference implementation where that one computes
    something else than the entry does at run time."""
    def deco(fn: Fold) -> Fold:
        for t in op_types:
            OPS[t].fold = fn
        return fn
    return deco


def _scalar(value: float, like: popxl.Tensor) -> popxl.Tensor:
    """A scalar constant of ``like``'s dtype."""
    return popxl.constant(np.asarray(value, dtype=like.dtype.as_numpy()))


def _as_tensor(v: Value) -> popxl.Tensor:
    """``v`` as a tensor of the current graph (an import-time value becomes a constant)."""
    return v if isinstance(v, popxl.Tensor) else popxl.constant(device_array(np.asarray(v)))


@overload
def _stack(values: Sequence[popxl.Tensor], axis: int = 0) -> popxl.Tensor: ...


@overload
def _stack(values: Sequence[Value], axis: int = 0) -> Value: ...


def _stack(values: Sequence[Value], axis: int = 0) -> Value:
    """``values`` (all of one shape) stacked along a new ``axis``; a NumPy array if all are."""
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    if len(arrays) == len(values):
        return np.stack(arrays, axis)
    ts = [_as_tensor(v) for v in values]
    shape = tuple(ts[0].shape)
    parts = [ops.reshape(t, shape[:axis] + (1,) + shape[axis:]) for t in ts]
    return ops.concat(parts, axis) if len(parts) > 1 else parts[0]


@overload
def _unstack(v: popxl.Tensor, axis: int = 0) -> List[popxl.Tensor]: ...


@overload
def _unstack(v: np.ndarray, axis: int = 0) -> List[np.ndarray]: ...


def _unstack(v: Value, axis: int = 0) -> Union[List[np.ndarray], List[popxl.Tensor]]:
    """The slices of ``v`` along ``axis``, each without that axis (the inverse of ``_stack``)."""
    if isinstance(v, np.ndarray):
        return [np.asarray(np.take(v, i, axis)) for i in range(v.shape[axis])]
    d = v.shape[axis]
    rest = tuple(s for a, s in enumerate(v.shape) if a != axis)
    parts = ops.split(v, d, axis) if d > 1 else [v] * d  # one part needs no split op; ops.split refuses 0
    return [ops.reshape(p, rest) for p in parts]


def _i32(value: npt.ArrayLike) -> popxl.Tensor:
    return popxl.constant(np.asarray(value).astype(np.int32))


def _as_int32(t: popxl.Tensor) -> popxl.Tensor:
    return t if t.dtype == dtypes.int32 else ops.cast(t, dtypes.int32)


def _strides(shape: Dims) -> np.ndarray:
    """Row-major element strides of ``shape``."""
    return np.cumprod((tuple(shape[1:]) + (1,))[::-1])[::-1].astype(np.int64)


def _prod(shape: Dims) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _axis(axis: int, rank: int, n: Node, what: str = "axis", scalar_axis: bool = True) -> int:
    """``axis`` counted from 0, checked against ``rank``. ``scalar_axis``: a rank-0 tensor takes axis 0
    (as ops that see a scalar as one element do); else it has no axis."""
    if not -rank <= axis < (max(rank, 1) if scalar_axis else rank):
        raise n.fail(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _popxl_dtype_of_onnx(elem_type: int) -> dtypes.dtype:
    """The popxl dtype that holds values of ONNX element type ``elem_type`` on the device."""
    return dtypes.from_numpy(device_dtype(element_dtype(int(elem_type))))
