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
from popxl import _hooks
from popxl.visualize import render as _render
from popxl.visualize.dot import DrawOptions, dot_checkpoint, to_dot
from popxl.visualize.listing import graph_listing, ir_listing
from popxl.visualize.render import GraphvizUnavailable, to_svg

__all__ = ["graph_listing", "ir_listing", "to_dot", "to_svg", "dot_checkpoint", "DrawOptions",
           "GraphvizUnavailable"]

# str(graph), str(ir), Jupyter's pictures and Ir.dot_checkpoint (popxl's core, a layer below, calls them
# through popxl._hooks)
_hooks.graph_listing, _hooks.ir_listing = graph_listing, ir_listing
_hooks.repr_svg, _hooks.dot_checkpoint = _render.repr_svg, dot_checkpoint
