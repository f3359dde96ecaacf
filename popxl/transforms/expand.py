"""``expand_ops``: ops declared with ``OpDef.expand`` become the ops they run as. Every Session
applies it before compiling (as PopART applies its patterns), so the Ir then shows what runs.

popxl-addons' custom ops that span replicas (the tensor-parallel all-reduce, the sharded cross
entropy, the distributed layer norm, the strided collectives) are traced as one op each, so that
autodiff sees them whole and applies their own gradient rules; here each becomes local kernels and
the collectives of ``popxl.ops.collectives``, which the engines run.
"""
from __future__ import annotations

from typing import Any

from popxl.analysis import reachable_graphs
from popxl.errors import popart_exception
from popxl.op import Op, create_op

__all__ = ["expand_ops", "replace_by_identities", "refuse_unreplaced_identities"]


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
    expand = op.opdef.expand
    if expand is None:  # (only ops declared with one come here)
        return

    def build() -> Any:
        outs = expand(op)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    _replace(graph, op, build, "expanding")


def _replace(graph: Any, op: Op, build: Any, doing: str) -> None:
    try:
        made = graph.replace_ops([op], build)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{doing} {op.type} {op.name!r} (created at {op.location}): {e}") from None
    for new in made:
        new.name = f"{op.name}/{new.name}"
        new.location = op.location
        new.ipu, new.tile_set, new.in_sequence = op.ipu, op.tile_set, op.in_sequence
        new.execution_context = op.execution_context


def _is_identity(op: Op) -> bool:
    return op.opdef.identity_when is not None and op.opdef.identity_when(**op.attrs)


def replace_by_identities(graph: Any) -> None:
    """PopART's OpToIdentity pattern on one graph: each op whose ``OpDef.identity_when`` holds
    (popxl-addons' all-reduces with ``identical_inputs``) becomes an identity of its input, with
    the op's output tensor, name and placement.

    Args:
        graph: The popxl Graph rewritten in place.
    """
    for op in [op for op in graph.schedule() if _is_identity(op)]:
        _replace(graph, op, lambda op=op: create_op("identity", [op.inputs[0]], name="identity"),
                 "replacing by an identity")


def refuse_unreplaced_identities(ir: Any) -> None:
    """Refuse a program (the graphs its main graph runs) holding an op that only PopART's
    OpToIdentity pattern makes runnable (``OpDef.identity_when``). popxl-addons' ops refuse to be
    lowered so, and a PopXL Session applies only the Minimal patterns, which leave them.

    Raises:
        popart_exception: Naming the op, its graph and how to run the pattern.
    """
    for g in reachable_graphs(ir):
        for op in g.schedule():
            if _is_identity(op):
                where = "the main graph" if g is ir.main_graph else f"graph {g.id!r}"
                raise popart_exception(
                    f"Session: {op.type} {op.name!r} in {where} (at {op.location}) has identical_inputs=True: it "
                    f"runs only as the identity PopART's OpToIdentity pattern makes of it, and a Session applies "
                    f"the Minimal patterns, which do not include it. Run the pattern before creating the Session: "
                    f"ir._pb_ir.setPatterns(popart._internal.ir.patterns.Patterns("
                    f"popart._internal.ir.patterns.PatternsLevel.Default)) and ir._pb_ir.applyPreAliasPatterns(g) "
                    f"for each graph g (popxl_addons.patterns.apply_pre_alias_patterns(ir) does both; "
                    f"popxl_addons.autodiff runs it on the gradient graphs it makes).")
