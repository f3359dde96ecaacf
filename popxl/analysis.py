"""Facts about a whole program that the transforms and the compiler both rely on: which graphs
run and which ops call them, which tensors share storage (views and in-place results), which
storages running a graph may write, and which main-graph ops compute from unchanging storage
alone. Reads the IR, never changes it."""
from __future__ import annotations

from typing import Dict, Iterable, List, Set, Tuple

from popxl.graph import Graph, op_called_graphs
from popxl.op import Op
from popxl.tensor import Constant, Tensor, Variable

__all__ = ["reachable_graphs", "ProgramFacts"]


def reachable_graphs(ir) -> List[Graph]:
    """The main graph and every graph it calls, directly or not, in breadth-first order."""
    order, todo, seen = [], [ir.main_graph], set()
    while todo:
        g = todo.pop(0)
        if id(g) in seen:
            continue
        seen.add(id(g))
        order.append(g)
        for op in g.schedule():
            todo.extend(op_called_graphs(op))
    return order


class ProgramFacts:
    """Facts about the graphs ``ir``'s main graph reaches.

    ``views``: copying view ops (``reshape``, ``transpose`` ...) that the compiler runs as views
    (``popxl.compiler.lower`` elides such copies); their results share their input's storage too.
    Change it with ``set_views``: the written sets stay valid, as views are only ever made of
    storages nothing writes.
    """

    def __init__(self, ir, views: Iterable[Op] = ()) -> None:
        self.ir = ir
        self.graphs: List[Graph] = reachable_graphs(ir)
        self.sites: Dict[Graph, List[Op]] = {g: [] for g in self.graphs}  # the ops calling each graph
        for h in self.graphs:
            for op in h.schedule():
                for sub in op_called_graphs(op):
                    if not self.sites[sub] or self.sites[sub][-1] is not op:  # an if may call one graph twice
                        self.sites[sub].append(op)
        self._written: Dict[Graph, Set[Tensor]] = {}
        self.set_views(views)

    def set_views(self, views: Iterable[Op]) -> None:
        self.views: Set[Op] = set(views)
        self.roots: Dict[Graph, Dict[Tensor, Tensor]] = {g: self._roots(g) for g in self.graphs}

    def is_view(self, op: Op) -> bool:
        """Whether ``op``'s output shares its input's storage: a view op, or a copy run as a view."""
        return op.opdef.view is not None and (not op.opdef.copy or op in self.views)

    def _roots(self, g: Graph) -> Dict[Tensor, Tensor]:
        """Each tensor of ``g`` -> the tensor owning its storage (views and in-place results share)."""
        root: Dict[Tensor, Tensor] = {t: t for t in g.tensors}
        for op in g.schedule():
            for k, out in enumerate(op.outputs):
                if k == 0 and self.is_view(op):
                    root[out] = root[op.inputs[0]]
                elif k == 0 and op.opdef.inplace is not None:
                    root[out] = root[op.inputs[op.opdef.inplace]]
        return root

    def written(self, g: Graph) -> Set[Tensor]:
        """Root storages of ``g``'s tensors that running ``g`` may write: the in-place input of each
        in-place op, and the parent tensors a call or repeat writes back (``site_writes``)."""
        if g not in self._written:
            root = self.roots[g]
            written = set()
            for op in g.schedule():
                if op.opdef.inplace is not None:
                    written.add(root[op.inputs[op.opdef.inplace]])
                elif op.type in ("call", "repeat"):
                    written.update(root[op.inputs[pos]] for pos in self.site_writes(op))
            self._written[g] = written
        return self._written[g]

    def site_writes(self, op: Op) -> List[int]:
        """Positions of the inputs a call or repeat op writes: its ``modified`` inputs (copied
        back) that the called graph writes or a repeat carries, and by-reference inputs the called
        graph writes (they may share the caller's storage). A modified input the graph does not
        write is copied back unchanged (or not at all, when aliased), which changes nothing."""
        sub, index, modified = op.attrs["graph"], op.attrs["input_index"], op.attrs["modified"]
        inner = self.written(sub)
        inputs = sub.inputs
        carried = len(sub.outputs) if op.type == "repeat" else 0
        positions = []
        for pos, i in enumerate(index):
            changed = inputs[i] in inner
            if (i in modified and (changed or i < carried)) or (changed and sub.is_input_by_ref(inputs[i])):
                positions.append(pos)
        return positions

    def static(self) -> Tuple[Set[Tensor], List[Op]]:
        """(static storages, static ops): storages whose contents change only when variables are
        written from the host, and the main-graph ops computing from them alone.

        Static storage: a variable (not remote) or constant that no op of the program writes, and
        the outputs of static ops that nothing writes. Static op: a pure main-graph op (see
        ``OpDef.pure``) with at least one input, every input a view of static storage and no
        output written (an op in ``views`` is not one: its result is static when its input is).
        A view shares its root's storage, so writing through a view writes the root; by-reference
        call inputs count as written only when the called graph writes them."""
        written: Set[Tensor] = set()
        for g in self.graphs:
            written |= self.written(g)
        roots: Set[Tensor] = {t for g in self.graphs for t in g.tensors
                 if (isinstance(t, Constant) or (isinstance(t, Variable) and t._remote_slot is None))
                 and t not in written}
        main = self.ir.main_graph
        root = self.roots[main]
        ops: List[Op] = []
        for op in main.schedule():
            if op in self.views:
                continue
            if (op.opdef.pure and op.inputs and all(root[t] in roots for t in op.inputs)
                    and not any(root[t] in written for t in op.outputs)):
                ops.append(op)
                roots.update(op.outputs)  # a pure op's outputs own their storage
        return roots, ops


def reader_counts(g: Graph) -> Dict[Tensor, int]:
    """How many op inputs of ``g`` each tensor is."""
    readers: Dict[Tensor, int] = {}
    for op in g.schedule():
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1
    return readers
