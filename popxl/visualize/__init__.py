"""Seeing what you built: a typed text listing of a graph (``print(graph)``, ``str(ir)``), a picture
of it (``graph._repr_svg_()`` in Jupyter, ``to_svg``), Graphviz DOT source (``to_dot``) and PopXL's
``.dot`` checkpoints (``Ir.dot_checkpoint``).

- ``listing``: one line per op, ``outputs = type[attrs](inputs)`` with ``name:dtype[shape]``
  everywhere, and the bodies of called / repeated / conditional graphs nested below their op.
- ``dot``: the DOT description shared by the pictures and the checkpoints (clusters for called
  graphs, variables / constants / streams marked, large graphs folded by name scope or paged).
- ``render``: DOT -> SVG in this process, through the Graphviz libraries that the pygraphviz
  wheel bundles (no system Graphviz needed).
"""
from popxl.visualize.dot import DrawOptions, dot_checkpoint, to_dot
from popxl.visualize.listing import graph_listing, ir_listing
from popxl.visualize.render import GraphvizUnavailable, to_svg

__all__ = ["graph_listing", "ir_listing", "to_dot", "to_svg", "dot_checkpoint", "DrawOptions",
           "GraphvizUnavailable"]
