"""decompose_sum: rewrite every N-ary sum (``add_n``, which autodiff makes when a tensor's gradient
has several contributions) with more than two inputs into a balanced tree of binary ``add`` ops.
The values are the same; a tree frees partial sums sooner and needs no N-ary kernel."""
from __future__ import annotations

from popxl.graph import Graph
from popxl.op import Op

__all__ = ["decompose_sum"]


def decompose_sum(graph: Graph) -> Graph:
    """Replace, in place, each ``add_n`` of ``graph`` with more than two inputs by binary adds.
    Returns ``graph``."""
    from popxl.op import create_op
    graph.ir._check_mutable()
    for op in [op for op in graph._ops if op.type == "add_n" and len(op.inputs) > 2]:
        at = graph._ops.index(op)
        before = len(graph._ops)
        with graph:
            level = list(op.inputs)
            while len(level) > 2:
                nxt = [create_op("add", level[i:i + 2])[0] for i in range(0, len(level) - 1, 2)]
                level = nxt + (level[-1:] if len(level) % 2 else [])
            last: Op = create_op("add", level, return_op=True)
        made = graph._ops[before:]
        del graph._ops[before:]
        # the last add takes over the sum's output tensor, so every reader is unchanged
        (out,) = op.outputs
        graph._tensors.pop(last.outputs[0].id, None)
        out._producer = last
        last.outputs = (out,)
        graph._ops[at:at + 1] = made
    return graph
