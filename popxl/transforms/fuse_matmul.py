"""Matmul fusions that a Session applies to its Ir before compiling it (the graph then shows what
runs):

1. ``fuse_matmul_bias``: a float32 matmul followed at once by the addition of a row vector (a
   Linear layer's bias), the product read by nothing else, becomes one ``matmul_bias``: the GEMM
   starts from the bias rows instead of zeros, which saves a pass over the result.
2. ``fuse_weight_updates``: SGD's ``scaled_add_(w, g, b=-lr)`` (a = 1) of a gradient ``g`` that a
   called graph computes with a float32 matmul becomes ``matmul_update_`` in that graph: the GEMM
   accumulates straight into the weight (sgemm's C = b A B + C), the gradient is neither stored nor
   read back, and the update costs no pass of its own. The weight reaches the called graph as a
   by-reference input.

3. ``fuse_matmul_residual``: a ``matmul_bias`` whose product only an ``add`` of a tensor of the
   product's shape reads (a residual connection: ``(x @ W + b) + h``) becomes ``matmul_bias_add``:
   the GEMM starts from the bias plus that tensor, so the addition costs no pass of its own.

None changes a result beyond rounding (the sums are taken in another order); each rewrite is made
only where nothing else can observe the intermediate value.
"""
from __future__ import annotations

import bisect
from typing import List, NamedTuple, Optional

from popxl import dtypes
from popxl.analysis import ProgramFacts, reader_counts
from popxl.graph import Graph
from popxl.op import REGISTRY, Op, create_op
from popxl.ops.call import bind_site_input, mark_site_input_modified
from popxl.tensor import Tensor

__all__ = ["fuse_matmul", "fuse_matmul_bias", "fuse_matmul_residual", "fuse_weight_updates"]


def fuse_matmul(ir):
    """The three fusions, in place.

    Args:
        ir: The program rewritten.

    Returns:
        ``ir`` itself.
    """
    return fuse_weight_updates(fuse_matmul_residual(fuse_matmul_bias(ir)))


def _is_float32_matmul(op: Op) -> bool:
    return (op.type == "matmul" and op.attrs["output_type"] in (None, dtypes.float32)
            and op.outputs[0].dtype == dtypes.float32)


def _graphs(ir):
    """(graph, its reader counts, its outputs, ids of the static program's ops) for every graph the
    main graph reaches, for rewrites 1 and 3 (whose two ops must be both in the static program, see
    ``ProgramFacts.static``, or both out of it)."""
    ir._check_mutable()
    facts = ProgramFacts(ir)
    static = set(map(id, facts.static()[1]))
    for g in facts.graphs:
        yield g, reader_counts(g), g.outputs, static


def fuse_matmul_bias(ir):
    """Rewrite 1 above, in place, in every graph the main graph reaches. Both ops must be in the
    static program (see ``ProgramFacts.static``) or both out of it.

    Args:
        ir: The program rewritten.

    Returns:
        ``ir`` itself.
    """
    for g, readers, outputs, static in _graphs(ir):
        sched = g.schedule()
        pairs = []
        for mm, add in zip(sched, sched[1:]):
            if not _is_float32_matmul(mm) or add.type != "add" or (id(mm) in static) != (id(add) in static):
                continue
            product = mm.outputs[0]
            others = [t for t in add.inputs if t is not product]
            if (any(o is product for o in outputs) or readers.get(product) != 1 or len(others) != 1
                    or add.outputs[0].shape != product.shape):
                continue
            try:
                REGISTRY["matmul_bias"].infer([t.spec for t in (*mm.inputs, others[0])])
            except ValueError:
                continue  # not a row vector of the product's last dimension
            pairs.append((mm, add, others[0]))
        g.replace_each([([mm, add], lambda mm=mm, bias=bias: create_op("matmul_bias", [*mm.inputs, bias],
                                                                       name=mm.name)[0])
                        for mm, add, bias in pairs])
    return ir


def fuse_matmul_residual(ir):
    """Rewrite 3 above, in place, in every graph the main graph reaches; as for rewrite 1, both
    ops in the static program or both out of it.

    Args:
        ir: The program rewritten.

    Returns:
        ``ir`` itself.
    """
    for g, readers, outputs, static in _graphs(ir):
        pairs = []
        for mm in g.schedule():
            if mm.type != "matmul_bias" or mm.outputs[0].dtype != dtypes.float32:
                continue
            product = mm.outputs[0]
            add = next((op for op in g.readers(product)), None)
            if (add is None or add.type != "add" or readers.get(product) != 1 or any(o is product for o in outputs)
                    or (id(mm) in static) != (id(add) in static)):
                continue
            others = [t for t in add.inputs if t is not product]
            if len(others) != 1 or others[0].shape != product.shape or others[0].dtype != product.dtype:
                continue
            # the GEMM moves to the add: nothing in between may write what it reads
            order = g.schedule()
            if not all(op.opdef.pure for op in order[order.index(mm) + 1:order.index(add)]):
                continue
            pairs.append((mm, add, others[0]))
        order = g.schedule()
        g.replace_each([(sorted([mm, add], key=order.index), lambda mm=mm, residual=residual: create_op(
            "matmul_bias_add", [*mm.inputs, residual], name=mm.name)[0]) for mm, add, residual in pairs])
    return ir


class _Update(NamedTuple):
    parent: Graph
    update: Op          # scaled_add_(w, g, b) in parent
    call: Op            # the call computing g
    matmul: Op          # the callee's matmul making the callee output bound to g
    weight: Tensor      # w
    target: Optional[Tensor]  # the callee input bound to w at the call, if there is one


class _Touches:
    """Where each storage of a graph is used: the schedule positions of the ops reading or
    writing a tensor of that root storage (``ProgramFacts.roots``), for the rewrite's "nothing
    touches the weight between" checks without rescanning the schedule for every candidate."""

    def __init__(self, graph: Graph, root) -> None:
        self.schedule = graph.schedule()
        self.readers = reader_counts(graph)
        self.position = {id(op): i for i, op in enumerate(self.schedule)}
        self.at: dict = {}
        for i, op in enumerate(self.schedule):
            for t in (*op.inputs, *op.outputs):
                where = self.at.setdefault(id(root[t]), [])
                if not where or where[-1] != i:
                    where.append(i)

    def between(self, storage: Tensor, first: int, last: int) -> bool:
        """Whether an op at a position in [first, last) uses ``storage`` (a root)."""
        where = self.at.get(id(storage), ())
        k = bisect.bisect_left(where, first)
        return k < len(where) and where[k] < last


def _find_update(facts: ProgramFacts, touches, pos: int, upd: Op) -> Optional[_Update]:
    """Rewrite 2's conditions for ``upd``: the call is the callee's only site (a ``call``, not a
    loop), the matmul's result is only that callee output and ``g`` only the update's operand, and
    nothing reads or writes the weight between the matmul and the update: neither the matmul nor a
    later op of the callee reads an input bound to it, no op between the call and the update touches
    it, and the call does not copy it back. ``touches(graph)``: that graph's ``_Touches``."""
    a, b = upd.attrs.get("a"), upd.attrs.get("b")
    if upd.type != "scaled_add_" or len(upd.inputs) != 2 or a is None or b is None or float(a) != 1.0:
        return None
    parent = upd.graph
    readers = touches(parent).readers
    w, g = upd.inputs
    call = g.producer
    if (call is None or call.type != "call" or call.graph is not parent or w.dtype != dtypes.float32
            or g.dtype != dtypes.float32 or w.shape != g.shape or readers.get(g) != 1
            or any(o is g for o in parent.outputs) or any(o is upd.outputs[0] for o in parent.outputs)):
        return None
    callee = call.attrs["graph"]
    out = callee.outputs[call.outputs.index(g)]
    mm = out.producer
    if (len(facts.sites[callee]) != 1 or mm is None or not _is_float32_matmul(mm) or mm.graph is not callee
            or sum(o is out for o in callee.outputs) != 1 or touches(callee).readers.get(out)):
        return None
    root = facts.roots[parent]
    bound_at = [i for i, t in zip(call.attrs["input_index"], call.inputs) if root[t] is root[w]]
    if len(bound_at) > 1 or any(i in call.attrs["modified"] for i in bound_at):
        return None
    croot, inner = facts.roots[callee], touches(callee)
    end = len(inner.schedule)
    if (any(inner.between(croot[callee.inputs[i]], inner.position[id(mm)], end) for i in bound_at)
            or any(callee.inputs[i] in callee.outputs for i in bound_at)):
        return None
    outer = touches(parent)
    if outer.between(root[w], outer.position[id(call)] + 1, pos):
        return None
    return _Update(parent, upd, call, mm, w, callee.inputs[bound_at[0]] if bound_at else None)


def fuse_weight_updates(ir):
    """Rewrite 2 above, in place, in every graph the main graph reaches. Returns ``ir``.

    Args:
        ir: The program rewritten.

    Returns:
        ``ir`` itself.
    """
    ir._check_mutable()
    facts = ProgramFacts(ir)
    found: List[_Update] = []
    indexes: dict = {}

    def touches(graph: Graph) -> _Touches:
        if graph not in indexes:
            indexes[graph] = _Touches(graph, facts.roots[graph])
        return indexes[graph]
    for parent in facts.graphs:
        for pos, op in enumerate(parent.schedule()):
            if op.type == "scaled_add_":
                u = _find_update(facts, touches, pos, op)
                if u is not None:
                    found.append(u)
    removed: dict = {}  # graph -> the ops it loses, removed once every rewrite is made (one pass each)
    dropped: dict = {}  # call site -> its outputs no longer computed
    for u in found:
        callee = u.call.attrs["graph"]
        target = u.target
        if target is None:  # the weight reaches the callee as a new by-reference input
            target = callee.add_input(u.weight.spec, u.weight.name, by_ref=True)
            bind_site_input(u.call, target, u.weight)
        else:  # the input already bound to it is not read after the matmul: update it in place
            callee.set_input_by_ref(target)
            mark_site_input_modified(u.call, callee.inputs.index(target))
        # the callee: the matmul adds into the weight instead of outputting the gradient
        k = [o is u.matmul.outputs[0] for o in callee.outputs].index(True)
        callee.remove_output(k)
        x, y = u.matmul.inputs
        callee.trace(lambda x=x, y=y, t=target, b=float(u.update.attrs["b"]): create_op(
            "matmul_update_", [x, y, t], {"b": b}, name=u.matmul.name), before=u.matmul)
        removed.setdefault(callee, []).append(u.matmul)
        # the parent: no update, no gradient output; readers of the update's result read w
        updated = u.update.outputs[0]
        for reader in u.parent.readers(updated):
            u.parent.replace_inputs(reader, [u.weight if t is updated else t for t in reader.inputs])
        removed.setdefault(u.parent, []).append(u.update)
        dropped.setdefault(u.call, []).append(u.update.inputs[1])
    for graph, ops in removed.items():
        graph.remove_ops(ops)
    for call, gone in dropped.items():
        call.graph.remove_op_outputs(call, [k for k, t in enumerate(call.outputs) if any(t is g for g in gone)])
    return ir
