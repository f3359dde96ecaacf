"""``expand_ops``: ops declared with ``OpDef.expand`` become the ops they run as. Every Session
applies it before compiling (as PopART applies its patterns), so the Ir then shows what runs.

popxl-addons' custom ops that span replicas (the tensor-parallel all-reduce, the sharded cross
entropy, the distributed layer norm, the strided collectives) are traced as one op each, so that
autodiff sees them whole and applies their own gradient rules; here each becomes local kernels and
the collectives of ``popxl.ops.collectives``, which the engines run.
"""
from __future__ import annotations

from typing import Any

from popxl.op import Op

__all__ = ["expand_ops"]


def expand_ops(ir: Any) -> Any:
    """Rewrite every op with an ``expand`` rule, in every graph of ``ir``, in place.

    The ops it traces take the op's place in the schedule and its output tensors, and keep its
    placement.

    Args:
        ir: The Ir rewritten.

    Returns:
        ``ir``.
    """
    for graph in ir._all_graphs():
        while True:
            pending = [op for op in graph.schedule() if op.opdef.expand is not None]
            if not pending:
                break
            for op in pending:
                _expand(graph, op)
    return ir


def _expand(graph: Any, op: Op) -> None:
    def build() -> Any:
        outs = op.opdef.expand(op)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    try:
        made = graph.replace_ops([op], build)
    except (TypeError, ValueError) as e:
        raise type(e)(f"expanding {op.type} {op.name!r} (created at {op.location}): {e}") from None
    for new in made:
        new.name = f"{op.name}/{new.name}"
        new.location = op.location
        new.ipu, new.tile_set, new.in_sequence = op.ipu, op.tile_set, op.in_sequence
        new.execution_context = op.execution_context
