"""hoist_invariants: move the computations of a loop body that do not change between iterations
(ops that read only unmodified weights, constants and each other) out of the body, so they run
once per call of the loop instead of once per iteration.

The motivating case is inference: ``fuse_conv`` folds batch norms into convolution weights with
ordinary ops on the variables, so that weight writes (``weightsFromHost``, ``writeWeights``) are
folded with no extra step. Inside the ``batchesPerStep`` loop that work would be repeated every
batch; hoisted, it is in the main graph before the loop, where lowering puts the ops that read
only unwritten weights into the static program, which engines run only after weight writes.

An op is hoisted when it is pure (no side effect, not control flow, not in place, not a view that
aliases its input), has at least one input, every input is invariant, and nothing impure reads
its outputs (an in-place op or a by-reference call would otherwise write the hoisted value, which
then lives across iterations). Invariant: a body input that the caller names as bound to a value
the loop does not carry, and that only pure ops read (so the body cannot write it), a constant,
or an output of a hoisted op. The values the body still reads become new body inputs (``bind``).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional

from popxl.graph import Graph
from popxl.op import Op, create_op
from popxl.tensor import Constant, Tensor

__all__ = ["hoist_invariants"]


def hoist_invariants(body: Graph, parent: Graph, bound: Mapping[Tensor, Tensor],
                     bind: Callable[[Tensor, str], Tensor], before: Optional[Op] = None) -> List[Op]:
    """Move the invariant ops of ``body`` into ``parent``: just before ``before`` (the loop op),
    or, without it, appended to ``parent`` now (the caller then creates the loop op afterwards).

    ``bound`` maps body inputs to the ``parent`` tensors they are bound to; name only inputs that
    hold the same value in every iteration as far as the caller knows (not carried). ``bind(t,
    name)`` makes ``parent`` tensor ``t`` a new input of ``body`` and returns it. Returns the
    hoisted ops (as they were in ``body``).

    Args:
        body: The loop body.
        parent: The graph the loop op is in.
        bound: Body input -> the parent tensor bound to it, for inputs invariant across iterations.
        bind: Makes a parent tensor a new input of ``body`` (given it and a name) and returns it.
        before: The op of ``parent`` the hoisted ops run before; None appends them.

    Returns:
        The hoisted ops.
    """
    body.ir._check_mutable()
    readers: Dict[str, List[Op]] = {}  # by tensor id
    for op in body.schedule():
        for t in op.inputs:
            readers.setdefault(t.id, []).append(op)
    outputs = {t.id for t in body.outputs}

    def only_pure_readers(t: Tensor) -> bool:
        return t.id not in outputs and all(r.opdef.pure for r in readers.get(t.id, []))

    invariant = {t.id for t in bound if only_pure_readers(t)}
    hoisted: List[Op] = []
    for op in body.schedule():
        if (op.opdef.pure and op.inputs and all(t.id in invariant or isinstance(t, Constant) for t in op.inputs)
                and all(only_pure_readers(t) for t in op.outputs)):
            hoisted.append(op)
            invariant.update(t.id for t in op.outputs)
    if not hoisted:
        return []

    # Trace the hoisted ops again in the parent, in body order (a topological order).
    outer: Dict[str, Tensor] = {t.id: p for t, p in bound.items()}

    def trace() -> None:
        for op in hoisted:
            ins = []
            for t in op.inputs:
                if t.id not in outer:
                    assert isinstance(t, Constant), "a hoisted op reads bound inputs, constants and hoisted values"
                    outer[t.id] = Constant._create(parent, t.name, t.spec, _host_data_value=t._host_data_value)
                ins.append(outer[t.id])
            new = create_op(op.opdef.name, ins, dict(op.attrs), name=op.name)
            for old, t in zip(op.outputs, new):
                outer[old.id] = t
    parent.trace(trace, before=before)

    # What the body still reads of them becomes inputs; the hoisted ops and values leave it.
    gone = {id(op) for op in hoisted}
    replaced: Dict[str, Tensor] = {}
    for op in hoisted:
        for t in op.outputs:
            if any(id(r) not in gone for r in readers.get(t.id, [])):
                replaced[t.id] = bind(outer[t.id], t.name)
    for op in body.schedule():
        if id(op) not in gone and any(t.id in replaced for t in op.inputs):
            body.replace_inputs(op, [replaced.get(t.id, t) for t in op.inputs])
    body.remove_ops(hoisted)
    return hoisted
