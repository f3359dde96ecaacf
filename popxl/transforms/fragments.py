"""``order_weight_fragments``: where the main graph's weight-fragment ops run. Every Session
applies it before compiling.

PopART compiles ops made under ``_execution_context(WeightsFromHostFragment)`` into the program
that runs when weights go to the device, and ``WeightsToHostFragment`` ones into the program that
runs when they come back; their tensors live on the device in between. popxl-cpu has one program,
so the first kind runs at the start of every ``Session.run`` and the second at its end. For what
these fragments are used for, state loaded from a remote buffer into a tensor that the program
reads (and may change in place) and stored back (popxl-addons' ``seed_variable``), the results
are the same: each run starts from what the previous one stored, and whatever the host writes
between runs is what the next run loads.
"""
from __future__ import annotations

from typing import Any

from popxl.tensorlocation import ExecutionContext

__all__ = ["order_weight_fragments"]

_FROM_HOST, _TO_HOST = ExecutionContext.WeightsFromHostFragment, ExecutionContext.WeightsToHostFragment


def order_weight_fragments(ir: Any) -> Any:
    """Run the main graph's weight-fragment ops first (from host) and last (to host).

    Each kind keeps its own order. A from-host op may read only tensors that exist before the
    normal program (variables, constants, other from-host ops' outputs); no op outside the to-host
    fragment may read a to-host op's outputs.

    Args:
        ir: The Ir whose main graph is reordered.

    Returns:
        ``ir``.

    Raises:
        ValueError: If an op reads across the fragments' order, naming both ops.
    """
    graph = ir.main_graph
    ops = list(graph.schedule())
    parts = {ctx: [op for op in ops if op.execution_context is ctx] for ctx in (_FROM_HOST, _TO_HOST)}
    if not parts[_FROM_HOST] and not parts[_TO_HOST]:
        return ir
    made_by = {id(t): op for op in ops for t in op.outputs}
    for op in parts[_FROM_HOST]:
        for t in op.inputs:
            producer = made_by.get(id(t))
            if producer is not None and producer.execution_context is not _FROM_HOST:
                raise ValueError(
                    f"{op.type} {op.name!r} (at {op.location}) runs in the WeightsFromHostFragment, before the "
                    f"main program, but reads {t.id!r}, which {producer.type} {producer.name!r} of the main "
                    f"program makes.")
    for op in ops:
        if op.execution_context is _TO_HOST:
            continue
        for t in op.inputs:
            producer = made_by.get(id(t))
            if producer is not None and producer.execution_context is _TO_HOST:
                raise ValueError(
                    f"{op.type} {op.name!r} (at {op.location}) reads {t.id!r}, which {producer.type} "
                    f"{producer.name!r} makes in the WeightsToHostFragment, after the main program.")
    normal = [op for op in ops if op.execution_context not in (_FROM_HOST, _TO_HOST)]
    graph._ops[:] = parts[_FROM_HOST] + normal + parts[_TO_HOST]
    return ir
