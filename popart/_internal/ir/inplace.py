"""PopART's inplace pattern as the views show it: ``Ir.applyInplacePattern(graph)`` decides which
of the graph's ops PopART would turn into their in-place variants, and their views then have the
in-place class and type (``MulLhsInplaceOp`` / ``MulRhsInplaceOp``: a multiply whose result is
written over its left or right operand).

The decision only renames views: popxl's ops stay as they are, and lowering already writes an
elementwise result into an operand that dies there. It follows PopART's rules, with whole tensors
and data dependencies standing for its alias model:

- ops are tried in decreasing op id (the priorities of a multiply's two variants are equal), the
  left-operand variant first; an op is made in-place once;
- a variant needs an output with as many elements as the operand it overwrites, and no other
  operand that shares that operand's storage;
- the storage overwritten must not hold a variable or a constant (PopART's unmodifiable
  tensors) or a graph output, and no other op may write it;
- every other reader of that storage must be able to run before the op (none may depend on the
  op's result), and none of them may produce an output of the graph (PopART does not constrain
  such ops, as a call copies the outputs out only after the whole graph has run).
"""
from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple, Type

from popxl.graph import storage_root, written_roots
from popxl.tensor import Constant, Variable

from popart._internal.ir._views import view_of
from popart._internal.ir.op import MulLhsInplaceOp, MulRhsInplaceOp


__all__ = ["apply_inplace_pattern", "inplace_variant_classes"]


def _variants() -> Dict[str, Tuple[Type[Any], ...]]:
    return {"mul": (MulLhsInplaceOp, MulRhsInplaceOp)}  # the view class overwriting operand 0, 1


def inplace_variant_classes() -> Tuple[Type[Any], ...]:
    """The view classes of in-place variants."""
    return tuple(c for classes in _variants().values() for c in classes)


class _Storages:
    """Which tensors of a graph share storage (popxl's views and in-place ops, and the results of
    the ops made in-place joined to the operands they overwrite), with the tensors and the writing
    ops of each storage."""

    def __init__(self, graph: Any) -> None:
        self.parent: Dict[int, int] = {}
        self.members: Dict[int, List[Any]] = {}
        self.writers: Dict[int, Set[int]] = {}
        for t in graph.tensors:
            self.members.setdefault(id(storage_root(t)), []).append(t)

    def find(self, t: Any) -> int:
        k = id(storage_root(t))
        while self.parent.get(k, k) != k:
            k = self.parent[k]
        return k

    def join(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb
            self.members.setdefault(rb, []).extend(self.members.pop(ra, []))
            self.writers.setdefault(rb, set()).update(self.writers.pop(ra, set()))

    def add_writer(self, op: Any, t: Any) -> None:
        self.writers.setdefault(self.find(t), set()).add(id(op))


def _depends_on(op: Any, other: Any, position: Dict[int, int], schedule: List[Any]) -> bool:
    """Whether ``other`` reads, directly or not, what ``op`` makes (the schedule is topological)."""
    if position[id(other)] < position[id(op)]:
        return False
    made = {id(t) for t in op.outputs}
    for between in schedule[position[id(op)] + 1:position[id(other)] + 1]:
        if any(id(t) in made for t in between.inputs):
            if between is other:
                return True
            made.update(id(t) for t in between.outputs)
    return False


def apply_inplace_pattern(graph: Any) -> List[Any]:
    """Make the views of ``graph``'s ops that PopART's inplace pattern would make in-place have
    their in-place classes. Returns the ops made in-place now.

    Args:
        graph: A popxl Graph.

    Returns:
        The popxl ops whose views changed class.
    """
    variants = _variants()
    schedule = list(graph.schedule())
    position = {id(op): i for i, op in enumerate(schedule)}
    readers: Dict[int, List[Any]] = {}  # tensor -> the ops reading it
    for op in schedule:
        for t in op.inputs:
            readers.setdefault(id(t), []).append(op)
    storages = _Storages(graph)
    inplace_classes = inplace_variant_classes()
    for op in schedule:
        view = view_of(op)
        if isinstance(view, inplace_classes):  # made in-place before
            t = op.inputs[variants[op.type].index(type(view))]
            storages.join(op.outputs[0], t)
            storages.add_writer(op, t)
        for t in op.inputs:
            if id(storage_root(t)) in written_roots(op):
                storages.add_writer(op, t)

    outputs = {id(t) for t in graph.outputs}
    changed = []
    for op in sorted((op for op in schedule if op.type in variants), key=lambda o: o.id, reverse=True):
        if isinstance(view_of(op), inplace_classes):
            continue
        for index, cls in enumerate(variants[op.type]):
            if _can_overwrite(storages, readers, position, schedule, outputs, op, index):
                t = op.inputs[index]
                storages.join(op.outputs[0], t)
                storages.add_writer(op, t)
                view_of(op).__class__ = cls
                changed.append(op)
                break
    return changed


def _can_overwrite(storages: _Storages, readers: Dict[int, List[Any]], position: Dict[int, int],
                   schedule: List[Any], outputs: Set[int], op: Any, index: int) -> bool:
    t = op.inputs[index]
    if t.nelms != op.outputs[0].nelms:
        return False
    key = storages.find(t)
    if any(storages.find(u) == key for i, u in enumerate(op.inputs) if i != index):
        return False
    group = storages.members.get(key, [])
    if any(isinstance(u, (Variable, Constant)) or id(u) in outputs for u in group):
        return False
    if storages.writers.get(key, set()) - {id(op)}:
        return False
    for other in {id(r): r for u in group for r in readers.get(id(u), ())}.values():
        if other is op:
            continue
        if _depends_on(op, other, position, schedule):  # it reads what op makes: it cannot run first
            return False
        if any(id(o) in outputs for o in other.outputs):  # PopART puts no constraint on such an op
            return False
    return True
