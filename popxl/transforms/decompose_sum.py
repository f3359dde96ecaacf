"""decompose_sum: rewrite every N-ary sum (``add_n``, which autodiff makes when a tensor's gradient
has several contributions) with more than two inputs into a balanced tree of binary ``add`` ops.
The values are the same; a tree frees partial sums sooner and needs no N-ary kernel."""
from __future__ import annotations

from popxl.graph import Graph
from popxl.op import create_op

__all__ = ["decompose_sum"]


def decompose_sum(graph: Graph) -> Graph:
    """Replace, in place, each ``add_n`` of ``graph`` with more than two inputs by binary adds.
    Returns ``graph``.

    Args:
        graph: The graph changed.

    Returns:
        ``graph`` itself.
    """
    graph.ir._check_mutable()
    for op in [op for op in graph.schedule() if op.type == "add_n" and len(op.inputs) > 2]:
        def tree(level=list(op.inputs)):
            while len(level) > 2:
                nxt = [create_op("add", level[i:i + 2])[0] for i in range(0, len(level) - 1, 2)]
                level = nxt + (level[-1:] if len(level) % 2 else [])
            return create_op("add", level)[0]
        graph.replace_ops([op], tree)  # the last add takes over the sum's output: readers unchanged
    return graph
