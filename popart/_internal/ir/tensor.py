"""``Tensor``: PopART's view of a popxl.Tensor (producer, consumers, shape and type, which ops
modify it), with ``TensorInfo`` and ``Consumers``."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Iterable, List

from popxl.errors import popart_exception
from popxl.graph import storage_root, written_roots
from popxl.op import Op as XlOp
from popxl.tensor import Constant, Variable

from popart._internal.ir._views import View, popxl_object, view_of
from popart._internal.ir.view import Region


if TYPE_CHECKING:  # pragma: no cover
    from popart._internal.ir.graph import Graph
    from popart._internal.ir.op import Op

__all__ = ["Tensor", "TensorInfo", "Consumers"]

# PopART's names for the data types whose name is not simply popxl's in capitals.
_PB_TYPE_NAMES = {"float32": "FLOAT", "float64": "DOUBLE"}


class TensorInfo:
    """A tensor's data type and shape, as PopART's ``TensorInfo`` reports them."""

    def __init__(self, spec: Any) -> None:
        self._spec = spec

    def shape(self) -> List[int]:
        return list(self._spec.shape)

    def rank(self) -> int:
        return len(self._spec.shape)

    def nelms(self) -> int:
        n = 1
        for d in self._spec.shape:
            n *= d
        return n

    def dim(self, axis: int) -> int:
        return self._spec.shape[operator.index(axis)]

    def nbytes(self) -> int:
        return self.nelms() * self._spec.dtype.itemsize

    def dataType(self) -> str:
        name = self._spec.dtype.name
        return _PB_TYPE_NAMES.get(name, name.upper())

    def data_type_lcase(self) -> str:
        return self.dataType().lower()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TensorInfo) and self._spec == other._spec

    def __hash__(self) -> int:
        return hash(self._spec)

    def __repr__(self) -> str:
        return f"TensorInfo({self.dataType()}, {self.shape()})"


class Consumers:
    """The ops of a tensor's graph that read it."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def _readers(self) -> List[Any]:
        return self._tensor.graph.readers(self._tensor)

    def getOps(self) -> List["Op"]:
        return [view_of(op) for op in self._readers()]

    def getTotal(self) -> int:
        """How many times ops read the tensor (an op reading it twice counts twice)."""
        return sum(1 for op in self._readers() for t in op.inputs if t is self._tensor)


class Tensor(View):
    """PopART's ``Tensor`` over a popxl.Tensor."""

    @property
    def id(self) -> str:
        return self._popxl.id

    def __repr__(self) -> str:
        return f"<popart._internal.ir.Tensor {self._popxl.id!r}>"

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self._popxl.spec)

    @property
    def consumers(self) -> Consumers:
        return Consumers(self._popxl)

    def tensorType(self) -> str:
        """PopART's kind of tensor: "Variable", "Const" or "ActGrad" (any other value)."""
        if isinstance(self._popxl, Variable):
            return "Variable"
        return "Const" if isinstance(self._popxl, Constant) else "ActGrad"

    def getGraph(self) -> "Graph":
        return view_of(self._popxl.graph)

    def getIr(self) -> Any:
        return view_of(self._popxl.ir)

    def hasProducer(self) -> bool:
        return self._popxl.producer is not None

    def getProducer(self) -> "Op":
        producer = self._popxl.producer
        if producer is None:
            raise popart_exception(f"Tensor.getProducer: tensor {self._popxl.id!r} has no producer (it is a graph "
                                   f"input, a variable or a constant); check hasProducer() first.")
        return view_of(producer)

    def isGraphInput(self) -> bool:
        return any(t is self._popxl for t in self._popxl.graph.inputs)

    def isGraphOutput(self) -> bool:
        return any(t is self._popxl for t in self._popxl.graph.outputs)

    def getGraphInputIndex(self) -> int:
        return view_of(self._popxl.graph).getInputIndex(self._popxl.id)

    def getGraphOutputIndex(self) -> int:
        return view_of(self._popxl.graph).getOutputIndex(self._popxl.id)

    def modifiedRegionsByOps(self, ops: Iterable[Any], accessType: Any = None) -> List[Region]:
        """The regions of this tensor that ``ops`` write (in place, or a call writing back into
        it), directly or through a view: all of it or none (popxl tracks whole tensors)."""
        root = id(storage_root(self._popxl))
        written = any(root in written_roots(popxl_object(op, XlOp)) for op in ops)
        return [Region.getFull(self._popxl.shape) if written else Region.getEmpty(self._popxl.rank)]

    # last in the class body: the method's name would hide the builtin in the annotations below it
    def str(self) -> str:
        return self._popxl.id
