"""``Op`` and its kinds callers test with ``isinstance`` (``CallOp``, ``LoopOp``, ``IfOp``,
``InitOp``, ``IpuCopyOp``, ``exchange.HostLoadOp`` ...): PopART's view of a popxl op.

Input and output indices are PopART's. For most ops they are the positions of the popxl op's
inputs and outputs. A ``CallOp``'s input ``i`` is its graph's input ``i`` (bound or not); a
``LoopOp``'s input ``i + 2`` is its graph's input ``i`` (PopART's loop inputs 0 and 1 are the trip
count and the condition, which popxl's ``repeat`` keeps as an attribute) and its output ``j`` is its
graph's output ``j``. popxl's repeat runs the user's graph directly (PopXL puts a wrapper graph in
between), so ``getCalledGraphs()`` of a LoopOp is that graph, until ``Graph.markAsOutput`` gives it
an output: the loop then runs a wrapper graph calling it, as in PopXL (``popxl.ops.call.wrap_loop_body``).

``cloneIntoGraph`` returns an op that is placed in its graph once it is connected: when ``setup()``
is called or one of its outputs is asked for (popxl ops are made whole, with their inputs).
"""
from __future__ import annotations

import operator
import re
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Type

from popxl.errors import popart_exception
from popxl.graph import op_called_graphs, storage_root, written_roots, Graph as XlGraph
from popxl.ops.call import bind_site_input, mark_site_input_modified, insert_graph_input, insert_graph_output
from popxl.tensor import Tensor as XlTensor

from popart._internal.ir._views import View, popxl_object, view_of
from popart._internal.ir.view import Region


if TYPE_CHECKING:  # pragma: no cover
    from popart._internal.ir.graph import Graph
    from popart._internal.ir.tensor import Tensor

__all__ = ["Op", "SubgraphOp", "CallOp", "LoopOp", "IfOp", "InitOp", "IpuCopyOp", "AddOp", "MulOp",
           "MulLhsInplaceOp", "MulRhsInplaceOp", "AccumulateOp", "AccumulatorScaleOp", "AccumulatorZeroOp",
           "exchange", "view_class", "register_view_class"]

# PopART's op types where they are not popxl's name in CamelCase.
_PB_TYPES = {"call": "Call", "repeat": "Loop", "if": "If", "matmul": "MatMul", "negate": "Neg",
             "host_load": "HostLoad", "host_store": "HostStore", "ipu_copy": "IpuCopy", "init": "Init",
             "remote_load": "RemoteLoad", "remote_load_": "RemoteLoadInplace", "remote_store": "RemoteStore"}


def _camel(name: str) -> str:
    words = re.split(r"_+", name.strip("_"))
    return "".join(w[:1].upper() + w[1:] for w in words) + ("Inplace" if name.endswith("_") else "")


class _Clone:
    """An op copied into a graph by ``cloneIntoGraph``, waiting for its inputs and output ids."""

    def __init__(self, source: Any, graph: Any) -> None:
        self.source, self.graph = source, graph
        self.inputs: Dict[int, Any] = {}
        self.output_ids: Dict[int, str] = {}
        self.source_ipu: Optional[int] = None
        self.id: int = next(graph.ir._op_ids)


class Op(View):
    """PopART's ``Op`` over a popxl op: its id and type, its tensors by index, the graphs it
    calls, and the edits PopART's Python allows (cloning into a graph and connecting)."""

    def __init__(self, op: Any = None) -> None:
        super().__init__(op)
        self._clone: Optional[_Clone] = None
        self._disconnected = False

    @classmethod
    def _cloned(cls, source: Any, graph: Any) -> "Op":
        view = cls(None)
        view._clone = _Clone(source, graph)
        return view

    def _xl(self) -> Any:
        """The popxl op (placing a cloned op in its graph first)."""
        if self._clone is not None:
            self._place(self._clone)
        return self._popxl

    _popxl_for_unwrap = _xl

    def __hash__(self) -> int:
        return hash(self._popxl) if self._clone is None else id(self)

    def __eq__(self, other: Any) -> bool:
        if self._clone is not None:
            return other is self
        return super().__eq__(other)

    def __repr__(self) -> str:
        if self._clone is not None:
            return f"<popart._internal.ir.{type(self).__name__} {self._clone.id} (clone of {self._clone.source.name!r})>"
        return f"<popart._internal.ir.{type(self).__name__} {self._popxl.id} {self._popxl.name!r}>"

    # identity ---------------------------------------------------------------------------------------
    @property
    def id(self) -> int:
        return self._clone.id if self._clone is not None else self._popxl.id

    def _source(self) -> Any:
        return self._clone.source if self._clone is not None else self._popxl

    _pb_type = ""  # the PopART type of a view class standing for one (the in-place variants)

    def opType(self) -> str:
        if self._pb_type:
            return self._pb_type
        t = self._source().type
        return _PB_TYPES.get(t, _camel(t))

    def name(self) -> str:
        return self._source().name

    def debugName(self) -> str:
        return f"{self.opType()}({self.name()})"

    def getGraph(self) -> "Graph":
        return view_of(self._clone.graph if self._clone is not None else self._popxl.graph)

    def getIr(self) -> Any:
        return self.getGraph().getIr()

    def getVirtualGraphId(self) -> int:
        return self._source().ipu

    def hasVirtualGraphId(self) -> bool:
        return True

    def canBeReplacedByIdentity(self) -> bool:
        """Whether PopART's OpToIdentity pattern turns the op into an identity (popxl-addons'
        all-reduces with identical inputs)."""
        src = self._source()
        return src.opdef.identity_when is not None and bool(src.opdef.identity_when(**src.attrs))

    def getCalledGraphs(self) -> List["Graph"]:
        return [view_of(g) for g in op_called_graphs(self._source())]

    # tensors by index ---------------------------------------------------------------------------------
    def _inputs(self) -> Dict[int, Any]:
        """PopART input index -> popxl tensor."""
        if self._clone is not None:
            return dict(sorted(self._clone.inputs.items()))
        return dict(enumerate(self._popxl.inputs))

    def _outputs(self) -> Dict[int, Any]:
        return dict(enumerate(self._xl().outputs))

    def _where(self, method: str) -> str:
        return f"Op.{method} ({self.opType()} {self.name()!r})"

    def inTensor(self, index: int) -> "Tensor":
        ins = self._inputs()
        i = operator.index(index)
        if i not in ins:
            raise popart_exception(f"{self._where('inTensor')}: no input at index {i} (inputs at {list(ins)}).")
        return view_of(ins[i])

    def outTensor(self, index: int) -> "Tensor":
        outs = self._outputs()
        i = operator.index(index)
        if i not in outs:
            raise popart_exception(f"{self._where('outTensor')}: no output at index {i} (it has {len(outs)}).")
        return view_of(outs[i])

    def inId(self, index: int) -> str:
        return self.inTensor(index).id

    def outId(self, index: int) -> str:
        return self.outTensor(index).id

    def hasInput(self, index: int) -> bool:
        return operator.index(index) in self._inputs()

    def hasOutput(self, index: int) -> bool:
        return operator.index(index) in self._outputs()

    def hasInputTensor(self, tensor: Any) -> bool:
        t = popxl_object(tensor, XlTensor)
        return any(v is t for v in self._inputs().values())

    def inIndex(self, tensor: Any) -> int:
        """The first input index at which ``tensor`` is connected."""
        t = popxl_object(tensor, XlTensor)
        for i, v in self._inputs().items():
            if v is t:
                return i
        raise popart_exception(f"{self._where('inIndex')}: {t.id!r} is not an input.")

    def outIndex(self, tensor: Any) -> int:
        t = popxl_object(tensor, XlTensor)
        for i, v in self._outputs().items():
            if v is t:
                return i
        raise popart_exception(f"{self._where('outIndex')}: {t.id!r} is not an output.")

    def getInputTensors(self) -> List["Tensor"]:
        return [view_of(t) for t in self._inputs().values()]

    def getOutputTensors(self) -> List["Tensor"]:
        return [view_of(t) for t in self._outputs().values()]

    def getInputIndexMap(self) -> Dict[int, "Tensor"]:
        return {i: view_of(t) for i, t in self._inputs().items()}

    def getOutputIndexMap(self) -> Dict[int, "Tensor"]:
        return {i: view_of(t) for i, t in self._outputs().items()}

    def inTensorCount(self) -> int:
        return len(self._inputs())

    def outTensorCount(self) -> int:
        return len(self._outputs())

    def modifies(self, index: int) -> List[Region]:
        """The regions of input ``index`` this op writes: all of it or none."""
        t = self.inTensor(index)._popxl
        written = id(storage_root(t)) in written_roots(self._xl())
        return [Region.getFull(t.shape) if written else Region.getEmpty(t.rank)]

    # edits --------------------------------------------------------------------------------------------
    def cloneIntoGraph(self, graph: Any) -> "Op":
        """A copy of this op (same kind, attributes, name and placement) for ``graph``: connect its
        inputs with ``connectInTensor`` and name its outputs with ``createAndConnectOutTensor``; it
        joins the graph (at the end of its schedule) at ``setup()`` or when an output is asked for."""
        return type(self)._cloned(self._xl(), popxl_object(graph, XlGraph))

    def connectInTensor(self, index: int, tensor_id: str, virtual_graph_id: Optional[int] = None) -> None:
        i = operator.index(index)
        if self._clone is None:
            self._connect_placed(i, tensor_id)
            return
        if i in self._clone.inputs:
            raise popart_exception(f"{self._where('connectInTensor')}: input {i} is already connected.")
        self._clone.inputs[i] = view_of(self._clone.graph)._tensor(tensor_id, self._where("connectInTensor"))
        if virtual_graph_id is not None:
            self._clone.source_ipu = operator.index(virtual_graph_id)

    def _connect_placed(self, index: int, tensor_id: str) -> None:
        if index in self._inputs():
            raise popart_exception(f"{self._where('connectInTensor')}: input {index} is already connected.")
        raise NotImplementedError(
            f"{self._where('connectInTensor')}: a popxl op in a graph has all its inputs from when it was made; "
            f"only call and loop ops can be connected to more (their graphs' unbound inputs).")

    def createAndConnectOutTensor(self, index: int, tensor_id: str) -> None:
        """Name output ``index`` ``tensor_id``. popxl makes an op's outputs with the op, so this
        sets the id its output will have (or gets, for an op already in its graph): the graph's
        prefix is added to an id without it, and a taken id gets a suffix."""
        i = operator.index(index)
        if not isinstance(tensor_id, str):
            raise TypeError(f"{self._where('createAndConnectOutTensor')}: the tensor id must be a str.")
        if self._clone is not None:
            if i in self._clone.output_ids:
                raise popart_exception(f"{self._where('createAndConnectOutTensor')}: output {i} is already connected.")
            self._clone.output_ids[i] = tensor_id
            return
        outs = self._popxl.outputs
        if not 0 <= i < len(outs):
            raise popart_exception(f"{self._where('createAndConnectOutTensor')}: no output {i}; the op has "
                                   f"{len(outs)} outputs, fixed by its kind and inputs.")
        _set_id(self._popxl.graph, outs[i], tensor_id)

    def setup(self) -> None:
        """Place a cloned op in its graph (its output shapes follow from its inputs)."""
        self._xl()

    def disconnectAllInputs(self) -> None:
        """Prepare ``Graph.eraseOp``: the op keeps reading its inputs until it is erased (a popxl op
        is never in a graph without them)."""
        if self._clone is not None:
            self._clone.inputs.clear()
        self._disconnected = True

    def disconnectAllOutputs(self) -> None:
        """Prepare ``Graph.eraseOp``: outputs still read when the op is erased stay in the graph
        without a producer (see ``Graph.eraseOp``)."""
        if self._clone is not None:
            self._clone.output_ids.clear()
        self._disconnected = True

    # placing a clone ----------------------------------------------------------------------------------
    def _clone_inputs(self, clone: _Clone) -> tuple:
        """(inputs, attrs) of the op to make: inputs connected at 0, 1, ... n-1."""
        indices = sorted(clone.inputs)
        if indices != list(range(len(indices))):
            raise popart_exception(f"{self._where('setup')}: inputs are connected at {indices}; a "
                                   f"{self.opType()} needs them at 0..{len(indices) - 1} without gaps.")
        return [clone.inputs[i] for i in indices], dict(clone.source.attrs)

    def _place(self, clone: _Clone) -> None:
        inputs, attrs = self._clone_inputs(clone)
        if clone.source_ipu is not None and "source" in attrs:
            attrs["source"] = clone.source_ipu
        names = [_name_in(clone.graph, clone.output_ids[j]) if j in clone.output_ids else t.name
                 for j, t in enumerate(clone.source.outputs)]
        extra = [j for j in clone.output_ids if j >= len(clone.source.outputs)]
        if extra:
            raise popart_exception(f"{self._where('setup')}: outputs {extra} were connected, but a "
                                   f"{self.opType()} has {len(clone.source.outputs)}.")
        try:
            new = clone.graph.add_op_copy(clone.source, inputs, attrs, output_names=names)
        except (TypeError, ValueError) as e:
            raise popart_exception(f"{self._where('setup')}: the cloned op does not fit its new inputs: {e}") from None
        new.id = clone.id
        for j, wanted in clone.output_ids.items():
            _set_id(clone.graph, new.outputs[j], wanted)
        new.__dict__["_pb_view"] = self
        self._popxl, self._clone = new, None

    # last in the class body: the method's name would hide the builtin in the annotations below it
    def str(self) -> str:
        return f"{self.id} ({self.opType()})"


def _name_in(graph: Any, tensor_id: str) -> str:
    """The name part of a tensor id of ``graph`` (the id without the graph's prefix)."""
    prefix = graph._tensor_prefix
    return tensor_id[len(prefix):] if prefix and tensor_id.startswith(prefix) else tensor_id


def _set_id(graph: Any, t: Any, wanted: str) -> None:
    """Give ``t`` the id ``wanted`` when that id is free and carries the graph's prefix."""
    if t.id != wanted and wanted.startswith(graph._tensor_prefix) and _name_in(graph, wanted) and \
            all(other.id != wanted for other in graph.tensors):
        graph.rename(t, _name_in(graph, wanted))


class SubgraphOp(Op):
    """An op running a graph: input ``k`` of the op is the graph's input ``k - _offset``."""

    _offset = 0

    def getCalledGraph(self) -> "Graph":
        return view_of(self._source().attrs["graph"])

    def _graph_inputs(self) -> tuple:
        return self._source().attrs["graph"].inputs

    def _inputs(self) -> Dict[int, Any]:
        if self._clone is not None:
            return super()._inputs()
        op = self._popxl
        return {gi + self._offset: op.inputs[pos] for pos, gi in enumerate(op.attrs["input_index"])}

    def _graph_index(self, index: int, where: str) -> int:
        gi = operator.index(index) - self._offset
        n = len(self._graph_inputs())
        if not 0 <= gi < n:
            raise popart_exception(f"{self._where(where)}: op input {index} is not one of its graph's inputs "
                                   f"(op inputs {self._offset}..{self._offset + n - 1}).")
        return gi

    def opInToSubgraphInIndex(self, index: int) -> int:
        return self._graph_index(index, "opInToSubgraphInIndex")

    def subgraphInToOpInIndex(self, index: int) -> int:
        i = operator.index(index)
        if not 0 <= i < len(self._graph_inputs()):
            raise popart_exception(f"{self._where('subgraphInToOpInIndex')}: its graph has no input {i}.")
        return i + self._offset

    def opOutToSubgraphOutIndex(self, index: int) -> int:
        return operator.index(index)

    def subgraphOutToOpOutIndex(self, index: int) -> int:
        return operator.index(index)

    def _connect_placed(self, index: int, tensor_id: str) -> None:
        """Bind the called graph's input to a tensor of this op's graph at this call site."""
        where = self._where("connectInTensor")
        gi = self._graph_index(index, "connectInTensor")
        if index in self._inputs():
            raise popart_exception(f"{where}: input {index} is already connected.")
        op = self._popxl
        parent = view_of(op.graph)._tensor(tensor_id, where)
        graph_input = self._graph_inputs()[gi]
        if parent.spec != graph_input.spec:
            raise popart_exception(f"{where}: {tensor_id!r} ({parent.spec}) does not match graph input "
                                   f"{graph_input.id!r} ({graph_input.spec}).")
        bind_site_input(op, graph_input, parent)

    def addModified(self, index: int, regions: Iterable[Region]) -> None:
        """Mark op input ``index`` as written by the called graph (any non-empty region: popxl
        copies back whole tensors); the call then writes the changes back to it."""
        gi = self._graph_index(index, "addModified")
        if self._clone is not None:
            raise popart_exception(f"{self._where('addModified')}: call setup() on the cloned op first.")
        if operator.index(index) not in self._inputs():
            raise popart_exception(f"{self._where('addModified')}: input {index} is not connected.")
        if any(not r.isEmpty() for r in regions):
            mark_site_input_modified(self._popxl, gi)

    def _clone_inputs(self, clone: _Clone) -> tuple:
        """Inputs keyed by graph input: bind those connected, in graph order."""
        bound = sorted((self._graph_index(k, "setup"), t) for k, t in clone.inputs.items())
        index = tuple(gi for gi, _ in bound)
        attrs = dict(clone.source.attrs)
        attrs["input_index"] = index
        attrs["modified"] = tuple(i for i in attrs.get("modified", ()) if i in index)
        return [t for _, t in bound], attrs


class CallOp(SubgraphOp):
    """``ops.call`` of a graph."""


class LoopOp(SubgraphOp):
    """``ops.repeat`` of a graph: op inputs from 2 are its graph's inputs, op outputs its outputs."""

    _offset = 2

    def getTripCountValue(self) -> int:
        return self._source().attrs["repeat_count"]

    def getNumExplicitInputs(self) -> int:
        """Trip count, condition and the loop-carried inputs (one per graph output)."""
        return 2 + len(self._source().attrs["graph"].outputs)

    def getNumImplicitInputs(self) -> int:
        return len(self._inputs()) - len(self._source().attrs["graph"].outputs)

    def addLoopInput(self, index: int, tensor_id: str, subgraph_tensor_id: str, overwrite: bool = False) -> None:
        """Give the loop input ``index``: ``tensor_id`` of this op's graph, seen by the loop's graph as
        the input ``index - 2`` named ``subgraph_tensor_id``. Without ``overwrite`` a new graph input
        is put there (the inputs from there move up one, as PopART's); an index below
        ``getNumExplicitInputs()`` makes it loop-carried, the output at ``index - 2`` now being carried
        into it (``addLoopOutput`` adds the output it pairs with). With ``overwrite`` the loop binds
        ``tensor_id`` to the graph input already at ``index - 2`` instead of what it bound there."""
        where = self._where("addLoopInput")
        op = self._xl()
        body = op.attrs["graph"]
        gi = operator.index(index) - self._offset
        parent = view_of(op.graph)._tensor(tensor_id, where)
        if overwrite:
            if not 0 <= gi < len(body.inputs):
                raise popart_exception(f"{where}: no input {index} to overwrite (its graph has inputs at op "
                                       f"indices {self._offset}..{self._offset + len(body.inputs) - 1}).")
            graph_input = body.inputs[gi]
            if parent.spec != graph_input.spec:
                raise popart_exception(f"{where}: {tensor_id!r} ({parent.spec}) does not match graph input "
                                       f"{graph_input.id!r} ({graph_input.spec}).")
            index_of = op.attrs["input_index"]
            if gi in index_of:
                inputs = list(op.inputs)
                inputs[index_of.index(gi)] = parent
                op.graph.replace_inputs(op, inputs)
            else:
                bind_site_input(op, graph_input, parent)
            _set_id(body, graph_input, subgraph_tensor_id)
            return
        if not 0 <= gi <= len(body.inputs):
            raise popart_exception(f"{where}: index {index} is out of range: a new input goes at op index "
                                   f"{self._offset} to {self._offset + len(body.inputs)}.")
        graph_input = insert_graph_input(body, gi, parent.spec, _name_in(body, subgraph_tensor_id))
        _set_id(body, graph_input, subgraph_tensor_id)
        bind_site_input(op, graph_input, parent)

    def addLoopOutput(self, index: int, tensor_id: str, subgraph_tensor_id: str, overwrite: bool = False) -> None:
        """Make ``subgraph_tensor_id`` (a tensor of the loop's graph) the graph's output ``index``,
        carried into its input ``index`` for the next iteration; the loop's output ``index``, its
        value after the last iteration (the input's initial value when the loop runs no
        iteration), is named ``tensor_id``. With ``overwrite`` it replaces the output there (same
        shape and type); without, it is put there and the outputs from there move up one, as in
        PopART, so graph input ``index`` must be (or be made, with ``addLoopInput``) its carried
        input of the same shape and type before the program is compiled."""
        where = self._where("addLoopOutput")
        op = self._xl()
        body = op.attrs["graph"]
        j = operator.index(index)
        inner = view_of(body)._tensor(subgraph_tensor_id, where)
        if overwrite:
            if not 0 <= j < len(body.outputs):
                raise popart_exception(f"{where}: no output {j} to overwrite (the loop has {len(body.outputs)}).")
            try:
                body.replace_output(j, inner)
            except ValueError as e:
                raise popart_exception(f"{where}: {e}") from None
        else:
            if not 0 <= j <= len(body.outputs):
                raise popart_exception(f"{where}: index {j} is out of range: a new output goes at 0 to "
                                       f"{len(body.outputs)}.")
            try:
                insert_graph_output(body, j, inner)
            except ValueError as e:
                raise popart_exception(f"{where}: {e}") from None
        _set_id(op.graph, op.outputs[j], tensor_id)


class IfOp(Op):
    """``ops.conditional``: input 0 is the condition, then the bindings of each branch."""

    def getThenGraph(self) -> "Graph":
        return view_of(self._source().attrs["then_graph"])

    def getElseGraph(self) -> "Graph":
        return view_of(self._source().attrs["else_graph"])


class AddOp(Op):
    """``ops.add``."""


class MulOp(Op):
    """``ops.mul``."""


class MulLhsInplaceOp(Op):
    """``ops.mul`` that PopART's inplace pattern writes over its left operand
    (``Ir.applyInplacePattern``; popxl's op is unchanged)."""

    _pb_type = "MulLhsInplace"


class MulRhsInplaceOp(Op):
    """``ops.mul`` that PopART's inplace pattern writes over its right operand
    (``Ir.applyInplacePattern``; popxl's op is unchanged)."""

    _pb_type = "MulRhsInplace"


class AccumulateOp(Op):
    """``ops.var_updates.accumulate_`` and its kinds (mean, square, moving averages)."""


class AccumulatorScaleOp(Op):
    """``ops.var_updates.accumulator_scale_``."""


class AccumulatorZeroOp(AccumulatorScaleOp):
    """``ops.var_updates.accumulator_zero_`` (a scale by zero, as in PopART)."""


class InitOp(Op):
    """``ops.init``: a new tensor filled with zeros (or left undefined)."""


class IpuCopyOp(Op):
    """``ops.ipu_copy``: a tensor copied from one IPU to another."""

    def getSourceIpu(self, tensor_id: Optional[str] = None) -> int:
        return self._source().attrs["source"]

    def getDestIpu(self) -> int:
        return self._source().attrs["destination"]


# (the exchange ops' classes, in ``exchange``, register themselves: that module derives from this one)
_CLASSES: Dict[str, Type[Op]] = {
    "call": CallOp, "repeat": LoopOp, "if": IfOp, "init": InitOp, "ipu_copy": IpuCopyOp, "add": AddOp, "mul": MulOp,
    "accumulator_scale_": AccumulatorScaleOp, "accumulator_zero_": AccumulatorZeroOp,
    **{t: AccumulateOp for t in ("accumulate_", "accumulate_mean_", "accumulate_square_",
                                 "accumulate_moving_average_", "accumulate_moving_average_square_")},
}


def view_class(optype: str) -> Type[Op]:
    """The view class of a popxl op type (``Op`` for the kinds without one of their own)."""
    return _CLASSES.get(optype, Op)


def register_view_class(optype: str, cls: Type[Op]) -> None:
    """Make ``cls`` the view class of popxl op type ``optype`` (custom ops' PopART classes)."""
    known = _CLASSES.get(optype)
    if known is not None and known is not cls:
        raise RuntimeError(f"popxl op type {optype!r} already has the PopART view class {known.__name__}.")
    _CLASSES[optype] = cls
