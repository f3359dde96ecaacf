"""``GraphId`` (a record of popxl's core, ``popxl._pb``), ``Graph`` (PopART's view of a popxl.Graph) and ``TopoCons`` (its ordering
constraints). Every change goes through popxl's graph edit API (popxl/graph.py) and the call-site
helpers of popxl/ops/call.py."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple, Union

from popxl._pb import GraphId
from popxl.errors import popart_exception
from popxl.op import Op as XlOp
from popxl.ops.call import insert_graph_output, wrap_loop_body, graph_sites
from popxl.tensor import Constant, Variable

from popart._internal.ir._views import View, popxl_object, view_of


if TYPE_CHECKING:  # pragma: no cover
    from popart._internal.ir.ir import Ir
    from popart._internal.ir.op import Op
    from popart._internal.ir.tensor import Tensor

__all__ = ["GraphId", "Graph", "TopoCons"]


def _index(value: Any, size: int, what: str, where: str) -> int:
    i = operator.index(value)
    if not 0 <= i < size:
        raise popart_exception(f"{where}: {what} index {i} is out of range (there are {size}).")
    return i


class Graph(View):
    """PopART's ``Graph`` over a popxl.Graph: ids, inputs and outputs by index or id, ops by
    ``OpId``, and the edits popxl-addons makes (erasing ops, removing outputs, ordering)."""

    def __init__(self, graph: Any) -> None:
        super().__init__(graph)
        self._topo_cons: Optional[TopoCons] = None

    @property
    def id(self) -> GraphId:
        return GraphId(self._popxl.id)

    def getIr(self) -> "Ir":
        return view_of(self._popxl.ir)

    def __repr__(self) -> str:
        return f"<popart._internal.ir.Graph {self._popxl.id!r}>"

    def getGraphString(self) -> str:
        return str(self._popxl)

    # tensors --------------------------------------------------------------------------------------
    def _tensor(self, tensor_id: str, where: str) -> Any:
        try:
            return self._popxl.get_tensor(tensor_id)
        except KeyError:
            raise popart_exception(f"{where}: graph {self._popxl.id!r} has no tensor {tensor_id!r}.") from None

    def getTensor(self, tensor_id: str) -> "Tensor":
        return view_of(self._tensor(tensor_id, "Graph.getTensor"))

    def getTensors(self) -> List["Tensor"]:
        return [view_of(t) for t in self._popxl.tensors]

    def __contains__(self, tensor_id: str) -> bool:
        return any(t.id == tensor_id for t in self._popxl.tensors)

    # inputs and outputs ----------------------------------------------------------------------------
    def getInputIds(self) -> List[str]:
        return [t.id for t in self._popxl.inputs]

    def getOutputIds(self) -> List[str]:
        return [t.id for t in self._popxl.outputs]

    def getInputId(self, index: int) -> str:
        ins = self._popxl.inputs
        return ins[_index(index, len(ins), "input", f"Graph.getInputId ({self._popxl.id!r})")].id

    def getOutputId(self, index: int) -> str:
        outs = self._popxl.outputs
        return outs[_index(index, len(outs), "output", f"Graph.getOutputId ({self._popxl.id!r})")].id

    def getInputTensor(self, index: int) -> "Tensor":
        return self.getTensor(self.getInputId(index))

    def getOutputTensor(self, index: int) -> "Tensor":
        return self.getTensor(self.getOutputId(index))

    def hasInputId(self, tensor_id: str) -> bool:
        return tensor_id in self.getInputIds()

    def hasOutputId(self, tensor_id: str) -> bool:
        return tensor_id in self.getOutputIds()

    def getInputIndex(self, tensor_id: str) -> int:
        ids = self.getInputIds()
        if tensor_id not in ids:
            raise popart_exception(f"Graph.getInputIndex: {tensor_id!r} is not an input of graph "
                                   f"{self._popxl.id!r} (its inputs: {ids}).")
        return ids.index(tensor_id)

    def getOutputIndex(self, tensor_id: str) -> int:
        ids = self.getOutputIds()
        if tensor_id not in ids:
            raise popart_exception(f"Graph.getOutputIndex: {tensor_id!r} is not an output of graph "
                                   f"{self._popxl.id!r} (its outputs: {ids}).")
        return ids.index(tensor_id)

    def markAsOutput(self, *args: Any) -> None:
        """``markAsOutput(tensorId)`` appends an output; ``markAsOutput(index, tensorId, overwrite)``
        puts one at ``index`` (replacing the output there with ``overwrite``). Each call site of the
        graph gets the matching output at the same position.

        A graph that ``ops.repeat`` runs is, as in PopXL, the graph the loop's wrapper calls: the
        first new output makes the loop run a wrapper graph holding a call of this one (PopXL builds
        every loop that way; popxl builds the wrapper only now), so the new output is one of that
        call, not carried by the loop; ``LoopOp.addLoopOutput`` can then make the loop carry it.
        Both branches of a conditional must keep the same outputs, so a branch gets none alone."""
        g = self._popxl
        if len(args) == 1:
            index, tensor_id, overwrite = len(g.outputs), args[0], False
        elif len(args) == 3:
            index, tensor_id, overwrite = operator.index(args[0]), args[1], bool(args[2])
        else:
            raise TypeError("Graph.markAsOutput takes (tensorId) or (index, tensorId, overwrite).")
        t = self._tensor(tensor_id, "Graph.markAsOutput")
        if overwrite:
            g.replace_output(_index(index, len(g.outputs), "output", "Graph.markAsOutput"), t)
            return
        if not 0 <= index <= len(g.outputs):
            raise popart_exception(f"Graph.markAsOutput: index {index} is out of range for graph {g.id!r} "
                                   f"(0 to {len(g.outputs)}).")
        sites = _call_sites(g)
        for op in sites:
            if op.type == "if":
                raise NotImplementedError(
                    f"Graph.markAsOutput: graph {g.id!r} is a branch of the conditional {op.name!r}; both branches "
                    f"of a conditional must keep the same outputs, so one cannot get an output alone.")
        for op in sites:
            if op.type == "repeat":
                wrap_loop_body(op)
        insert_graph_output(g, index, t)

    def removeOutput(self, index_or_id: Union[int, str]) -> None:
        """Remove an output (by index or tensor id). Call sites lose the matching output, which must
        not be in use. An index past the last output removes the last one, as PopART's binding
        does: popxl-addons removes several outputs by their indices from before the first removal
        (``autodiff_with_accumulation``), which relies on it."""
        g = self._popxl
        if isinstance(index_or_id, str):
            index = self.getOutputIndex(index_or_id)
        else:
            index = operator.index(index_or_id)
            if index < 0 or not g.outputs:
                raise popart_exception(f"Graph.removeOutput ({g.id!r}): no output {index} to remove "
                                       f"(there are {len(g.outputs)}).")
            index = min(index, len(g.outputs) - 1)
        sites = _call_sites(g)
        for op in sites:
            if op.type == "if" or (op.type == "repeat" and index != len(g.outputs) - 1):
                raise NotImplementedError(
                    f"Graph.removeOutput({index}): graph {g.id!r} is called by {op.type} {op.name!r}: a loop "
                    f"body's outputs are carried into its inputs by position and both branches of a "
                    f"conditional must keep the same outputs, so only a loop body's last output can go.")
            out = op.outputs[index]
            if op.graph.readers(out) or out in op.graph.outputs:
                raise popart_exception(
                    f"Graph.removeOutput({index}): output {out.id!r} of the call of {g.id!r} ({op.name!r} in graph "
                    f"{op.graph.id!r}) is still used; remove its uses first.")
        g.remove_output(index)
        for op in sites:
            op.graph.remove_op_outputs(op, [index])

    # ops ------------------------------------------------------------------------------------------
    def getOps(self) -> List["Op"]:
        return [view_of(op) for op in self._popxl.schedule()]

    def getOpSchedule(self, requireOptimalSchedule: bool = True) -> List["Op"]:
        """The ops in the order they run (popxl's schedule is creation order, honouring every
        ordering constraint; ``requireOptimalSchedule`` changes nothing)."""
        return self.getOps()

    def getOpIds(self) -> List[int]:
        return [op.id for op in self._popxl.schedule()]

    def getOp(self, opid: int) -> "Op":
        return view_of(self._op_by_id(opid, "Graph.getOp"))

    def _op_by_id(self, opid: int, where: str) -> Any:
        for op in self._popxl.schedule():
            if op.id == opid:
                return op
        raise popart_exception(f"{where}: graph {self._popxl.id!r} has no op with id {opid!r}.")

    def eraseOp(self, opid: int) -> None:
        """Remove the op ``opid``. Outputs of it that other ops still read stay in the graph
        without a producer (as PopART leaves them) until those ops are erased too."""
        op = self._op_by_id(opid, "Graph.eraseOp")
        self._popxl.erase_op(op)
        if self._topo_cons is not None:
            self._topo_cons._forget(op)

    def getCalledGraphs(self) -> List["Graph"]:
        return [view_of(g) for g in self._popxl.called_graphs]

    def removeIsolatedTensors(self, retainUsedIOTensors: bool = False, retainAllIOTensors: bool = False,
                              retainVarTensors: bool = False, retainConstTensors: bool = False) -> None:
        """Drop tensors that no op makes or reads. Graph inputs and outputs always stay (popxl's
        call sites refer to them); variables, constants and remote (IO) tensors stay if asked."""
        g = self._popxl
        read = {id(t) for op in g.schedule() for t in op.inputs}
        ends = {id(t) for t in (*g.inputs, *g.outputs)}
        drop = []
        for t in g.tensors:
            if t.producer is not None or id(t) in read or id(t) in ends:
                continue
            if (retainVarTensors and isinstance(t, Variable)) or (retainConstTensors and isinstance(t, Constant)):
                continue
            if (retainUsedIOTensors or retainAllIOTensors) and t._remote_slot is not None:
                continue
            drop.append(t)
        g.remove_isolated(drop)

    # ordering -------------------------------------------------------------------------------------
    def topoCons(self) -> "TopoCons":
        if self._topo_cons is None:
            self._topo_cons = TopoCons(self._popxl)
        return self._topo_cons

    # autodiff -------------------------------------------------------------------------------------
    def setCanBeRecursivelyAutodiffed(self, value: bool) -> None:
        """False: autodiff of a graph calling this one needs this graph's gradient given in
        ``called_graphs_grad_info`` (it will not differentiate this graph itself)."""
        if not isinstance(value, bool):
            raise TypeError(f"Graph.setCanBeRecursivelyAutodiffed: expected a bool, not {value!r}.")
        self._popxl._can_be_recursively_autodiffed = value

    def canBeRecursivelyAutodiffed(self) -> bool:
        return self._popxl._can_be_recursively_autodiffed


def _call_sites(graph: Any) -> List[Any]:
    """The ops of ``graph``'s Ir that call it."""
    return graph_sites(graph)


class TopoCons:
    """Ordering constraints between ops of one graph: ``insert(before, after)`` makes ``before``
    run before ``after``, moving one of them in the schedule if needed (refused if data
    dependencies or earlier constraints forbid it). ``tied`` (run back to back) is recorded but
    not enforced."""

    def __init__(self, graph: Any) -> None:
        self._graph = graph
        self._pairs: List[Tuple[Any, Any, bool]] = []

    def _op(self, op: Any, where: str) -> Any:
        xl = popxl_object(op, XlOp)
        if xl.graph is not self._graph or xl not in self._graph.schedule():
            raise popart_exception(f"TopoCons.{where}: op {xl.name!r} is not an op of graph {self._graph.id!r}.")
        return xl

    def _live(self) -> List[Tuple[Any, Any, bool]]:
        ops = set(map(id, self._graph.schedule()))  # ops erased by other popxl edits drop out
        self._pairs = [p for p in self._pairs if id(p[0]) in ops and id(p[1]) in ops]
        return self._pairs

    def _forget(self, op: Any) -> None:
        self._pairs = [p for p in self._pairs if p[0] is not op and p[1] is not op]

    def insert(self, before: Any, after: Any, tied: bool = False) -> None:
        a, b = self._op(before, "insert"), self._op(after, "insert")
        if a is b:
            raise popart_exception(f"TopoCons.insert: an op cannot run before itself ({a.name!r}).")
        self._order(a, b)
        if not self.contains(a, b):
            self._pairs.append((a, b, bool(tied)))

    def _order(self, a: Any, b: Any) -> None:
        schedule = list(self._graph.schedule())
        if schedule.index(a) < schedule.index(b):
            return
        after_a = schedule[schedule.index(a) + 1] if schedule.index(a) + 1 < len(schedule) else None
        errors = []
        for op, to in ((a, b), (b, after_a)):  # move a up to just before b, or b down to just after a
            order = [o for o in schedule if o is not op]
            order.insert(order.index(to) if to is not None else len(order), op)
            broken = [(x, y) for x, y, _ in self._live() if order.index(x) > order.index(y)]
            if broken:
                errors.append(f"it would put {broken[0][1].name!r} before {broken[0][0].name!r}, against an "
                              f"earlier constraint")
                continue
            try:
                self._graph.move_op(op, to)
                return
            except ValueError as e:
                errors.append(str(e))
        raise popart_exception(f"TopoCons.insert: {a.name!r} cannot be made to run before {b.name!r}: "
                               + "; ".join(errors))

    def remove(self, before: Any, after: Any) -> None:
        a, b = self._op(before, "remove"), self._op(after, "remove")
        self._pairs = [p for p in self._live() if not (p[0] is a and p[1] is b)]

    def contains(self, before: Any, after: Any) -> bool:
        a, b = popxl_object_op(before), popxl_object_op(after)
        return any(p[0] is a and p[1] is b for p in self._live())

    def getBefores(self, op: Any) -> List["Op"]:
        x = popxl_object_op(op)
        return [view_of(p[0]) for p in self._live() if p[1] is x]

    def getAfters(self, op: Any) -> List["Op"]:
        x = popxl_object_op(op)
        return [view_of(p[1]) for p in self._live() if p[0] is x]

    @staticmethod
    def transferToSubgraph(replacementOp: Any, opRemaps: Dict[Any, Iterable[Any]], tied: bool = False) -> None:
        """Ops of a graph were copied into a subgraph that ``replacementOp`` (in that graph) calls:
        constraints between two copied ops now hold between their copies in the subgraph, and
        those between a copied op and another op of the graph hold for ``replacementOp``."""
        site = popxl_object_op(replacementOp)
        cons = view_of(site.graph).topoCons()
        remaps = {id(popxl_object_op(k)): [popxl_object_op(v) for v in vs] for k, vs in opRemaps.items()}
        for a, b, was_tied in list(cons._live()):
            if id(a) in remaps and id(b) in remaps:
                for new_a in remaps[id(a)]:
                    for new_b in remaps[id(b)]:
                        view_of(new_a.graph).topoCons().insert(new_a, new_b, was_tied)
            elif id(a) in remaps and b is not site:
                cons.insert(site, b, tied)
            elif id(b) in remaps and a is not site:
                cons.insert(a, site, tied)


def popxl_object_op(op: Any) -> Any:
    return popxl_object(op, XlOp)
