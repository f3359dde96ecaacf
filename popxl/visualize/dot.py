"""Graphviz DOT for graphs and programs: the source of the pictures and of ``Ir.dot_checkpoint``.

A picture shows each op as a box (its type, its name when that says more, its outputs typed
``name:dtype[shape]``); the values an op reads before any op makes them are nodes of their own:
graph inputs (ellipses), variables (blue), constants (gold) and host streams (red). A graph that
ops call, repeat or branch into is drawn once, as a cluster, with a dashed edge from every op that
calls it ("calls", "repeats x10", "then" / "else").

Large programs are kept readable by a node budget (``DrawOptions.max_nodes``): called graphs that
do not fit are drawn as a single "graph ... (N ops)" node; a graph too large by itself has the ops
of each name scope folded into one node, and what still does not fit is split into pages
(``DrawOptions.page``), a note saying which page this is and how to see the next.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import attrs

from popxl.visualize.listing import (format_attr, graph_streams, graph_title, is_main, shown_attrs, tensor_type,
                                     typed)
from popxl.graph import op_called_graphs, Graph
from popxl.ir import Ir
from popxl.streams import HostToDeviceStream
from popxl.tensor import Constant, Variable

if TYPE_CHECKING:  # pragma: no cover
    from popxl.graph import Graph
    from popxl.ir import Ir
    from popxl.op import Op
    from popxl.tensor import Tensor

__all__ = ["DrawOptions", "to_dot", "dot_checkpoint", "dot_checks", "DOT_CHECKS_ENV"]

DOT_CHECKS_ENV = "POPART_DOT_CHECKS"

# Fill colours by op family (popxl/ops/<family>.py), so a picture shows its structure at a glance.
_FAMILY_COLOURS = {"control": "#d0ebff", "host_io": "#ffc9c9", "var_updates": "#d3f9d8", "nn": "#fff4e6",
                   "reduce": "#f3f0ff", "shape": "#f1f3f5", "remote": "#ffe3e3", "collectives": "#e6fcf5"}
_VARIABLE, _CONSTANT, _STREAM, _INPUT = "#a5d8ff", "#ffec99", "#ff8787", "#ffffff"
_MAX_OUTPUT_LINES = 3
_MAX_CALL_EDGES = 2  # dashed "calls" edges drawn per graph; every call op names its graph anyway
_GRAPH_ATTRS = ("graph=", "then_graph=", "else_graph=")  # an op with more outputs lists the first ones and a count


@attrs.define
class DrawOptions:
    """How much of a program a picture shows.

    ``max_nodes``: the node budget (None: draw everything, as the ``.dot`` checkpoints do).
    ``depth``: how many levels of called graphs to draw as clusters (None: as many as fit).
    ``page``: which page of a graph too large for the budget (1-based).
    ``rankdir``: Graphviz's direction, "TB" (top to bottom) or "LR".
    """

    max_nodes: Optional[int] = 250
    depth: Optional[int] = None
    page: int = 1
    rankdir: str = "TB"

    def __attrs_post_init__(self) -> None:
        if self.max_nodes is not None and (not isinstance(self.max_nodes, int) or self.max_nodes < 10):
            raise ValueError(f"DrawOptions.max_nodes must be an int >= 10 or None, not {self.max_nodes!r}.")
        if self.depth is not None and (not isinstance(self.depth, int) or self.depth < 0):
            raise ValueError(f"DrawOptions.depth must be a non-negative int or None, not {self.depth!r}.")
        if not isinstance(self.page, int) or self.page < 1:
            raise ValueError(f"DrawOptions.page must be a positive int, not {self.page!r}.")
        if self.rankdir not in ("TB", "LR", "BT", "RL"):
            raise ValueError(f"DrawOptions.rankdir must be 'TB', 'LR', 'BT' or 'RL', not {self.rankdir!r}.")


def _quote(text: str) -> str:
    """``text`` as one DOT quoted string, whatever it holds (a name of the user's cannot end the
    string or add attributes)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def _html(text: str) -> str:
    """``text`` as character data inside one of our HTML-like labels."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


class _HtmlLabel(str):
    """An HTML-like label built by this module's own templates (every user-given text in it passed
    through ``_html``): the only value written into DOT unquoted."""


def _attrs_text(**kw: Any) -> str:
    return "[" + ", ".join(f"{k}=<{v}>" if isinstance(v, _HtmlLabel) else f"{k}={_quote(str(v))}"
                           for k, v in kw.items() if v is not None) + "]"


class _Item:
    """One node of the picture standing for one op, or for the ops of a folded name scope."""

    def __init__(self, node: str, ops: List["Op"], scope: Optional[str] = None) -> None:
        self.node, self.ops, self.scope = node, ops, scope


def _scope_of(op: "Op") -> Optional[str]:
    head, sep, _ = op.name.partition("/")
    return head if sep else None


class _Writer:
    """Collects DOT statements for a set of graphs, numbering nodes as it goes."""

    def __init__(self, options: DrawOptions) -> None:
        self.options = options
        self.lines: List[str] = []
        self.counter = 0
        self.cluster_of: Dict[str, str] = {}  # graph id -> the node a "calls" edge points at
        self.cluster_name: Dict[str, str] = {}
        self.bottom_of: Dict[str, str] = {}  # graph id -> an invisible node below all of it
        self.same_as: Dict[str, "Graph"] = {}  # graph id -> the graph of the same structure drawn for it
        self.collapsed: Dict[str, str] = {}  # graph id -> its stand-in node
        self.call_edges: List[Tuple[str, str, str]] = []  # (op node, graph id, label)

        self.placed: List[str] = []  # nodes of the graph being drawn

    def node_id(self) -> str:
        self.counter += 1
        return f"n{self.counter}"

    def node(self, depth: int, node: Optional[str] = None, **style: Any) -> str:
        node = node or self.node_id()
        self.emit(f"{node} {_attrs_text(**style)};", depth)
        self.placed.append(node)
        return node

    def emit(self, line: str, depth: int = 1) -> None:
        self.lines.append("  " * depth + line)

    # values that exist before any op: inputs, variables, constants, streams -----------------------
    def leaf(self, t: "Tensor", graph: "Graph", depth: int, note: str = "") -> str:

        label = typed(t)
        if isinstance(t, Variable):
            style = dict(shape="box", style="filled", fillcolor=_VARIABLE, label=f"{label}\nvariable")
        elif isinstance(t, Constant):
            style = dict(shape="box", style="filled", fillcolor=_CONSTANT, label=f"{label}\nconstant")
        elif t in graph.inputs:
            index = graph.inputs.index(t)
            by_ref = " by_ref" if graph.is_input_by_ref(t) else ""
            style = dict(shape="ellipse", style="filled", fillcolor=_INPUT, label=f"{label}\ninput {index}{by_ref}")
        else:  # made on another page
            style = dict(shape="ellipse", style="dashed", label=f"{label}{note}")
        return self.node(depth, tooltip=t.id, fontsize=10, **style)

    def stream_node(self, stream: Any, depth: int) -> str:

        way = "host->device" if isinstance(stream, HostToDeviceStream) else "device->host"
        return self.node(depth, shape="cds", style="filled", fillcolor=_STREAM, fontsize=10,
                         label=f"{stream.tensor_id}:{tensor_type(stream)}\n{way}", tooltip=f"stream {stream.tensor_id}")

    # ops ------------------------------------------------------------------------------------------
    def op_node(self, item: _Item, depth: int) -> None:
        if item.scope is not None:
            label = _HtmlLabel(f'<b>{_html(item.scope)}/</b><br/><font point-size="9">{len(item.ops)} ops: '
                               f'{_html(_op_types(item.ops))}</font>')
            self.node(depth, item.node, shape="box3d", style="filled", fillcolor="#e9ecef", label=label,
                      tooltip=f"name scope {item.scope}: {len(item.ops)} ops")
            return
        op = item.ops[0]
        rows = [f"<b>{_html(op.type)}</b>"]
        if op.name != op.type and op.name.rpartition("/")[2] != op.type:
            rows.append(f'<font point-size="9">{_html(op.name)}</font>')
        attrs_ = [a for a in shown_attrs(op) if not a.startswith(_GRAPH_ATTRS)]
        for called in _op_graphs(op):
            shown = self.same_as.get(called.id, called)
            rows.append(f'<font point-size="9" color="#1c7ed6">-&gt; {_html(graph_title(shown))}</font>')
        if attrs_:
            rows.append(f'<font point-size="9" color="#495057">{_html(", ".join(attrs_)[:60])}</font>')
        outs = [typed(t) for t in op.outputs]
        if len(outs) > _MAX_OUTPUT_LINES:
            outs = outs[:_MAX_OUTPUT_LINES] + [f"... {len(op.outputs) - _MAX_OUTPUT_LINES} more"]
        rows.extend(f'<font point-size="9">{_html(o)}</font>' for o in outs)
        colour = _FAMILY_COLOURS.get(op.opdef.family, "#ffffff")
        label = _HtmlLabel("<br/>".join(rows))
        self.node(depth, item.node, shape="box", style="rounded,filled", fillcolor=colour, label=label,
                  tooltip=_op_tooltip(op))


def _op_types(ops: Sequence["Op"]) -> str:
    counts: Dict[str, int] = {}
    for op in ops:
        counts[op.type] = counts.get(op.type, 0) + 1
    text = ", ".join(f"{n}x {t}" if n > 1 else t for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return text if len(text) <= 60 else text[:57] + "..."


def _op_tooltip(op: "Op") -> str:
    ins = ", ".join(typed(t) for t in op.inputs)
    outs = ", ".join(typed(t) for t in op.outputs)
    text = f"{outs} = {op.type}({ins})  at {_short_location(op.location)}"
    return text if len(text) <= 400 else text[:397] + "..."


def _short_location(location: str) -> str:
    """``file:line`` with the file relative to the current directory when it is below it, so that a
    picture drawn in a checkout does not carry the machine's absolute paths."""
    path, sep, line = location.rpartition(":")
    if not sep or not os.path.isabs(path):
        return location
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return location
    return location if rel.startswith("..") else f"{rel}:{line}"


def _call_label(op: "Op", graph: "Graph") -> str:
    if op.type == "repeat":
        return f"repeats x{format_attr(op.attrs.get('repeat_count'))}"
    if op.type == "if":
        return "then" if op.attrs.get("then_graph") is graph else "else"
    return "calls"


def _graph_size(graph: "Graph") -> int:
    """Nodes the graph takes when drawn in full (ops, inputs, variables, constants, streams, outputs)."""
    return len(graph.ops) + len(graph.inputs) + len(graph.variables) + len(graph.constants) + \
        len(graph_streams(graph)) + len(graph.outputs)


def _items(graph: "Graph", writer: _Writer, budget: Optional[int]) -> List[_Item]:
    """The op nodes of ``graph``: one per op, or per name scope once there are more than ``budget``."""
    ops = list(graph.ops)
    if budget is None or len(ops) <= budget:
        return [_Item(writer.node_id(), [op]) for op in ops]
    items: List[_Item] = []
    by_scope: Dict[str, _Item] = {}
    for op in ops:
        scope = _scope_of(op)
        if scope is None:
            items.append(_Item(writer.node_id(), [op]))
        elif scope in by_scope:
            by_scope[scope].ops.append(op)
        else:
            by_scope[scope] = _Item(writer.node_id(), [op], scope)
            items.append(by_scope[scope])
    for item in items:  # a scope holding a single op is drawn as that op
        if item.scope is not None and len(item.ops) == 1:
            item.scope = None
    return items


def _op_graphs(op: "Op") -> List["Graph"]:
    return op_called_graphs(op)


def _draw_graph(writer: _Writer, graph: "Graph", depth: int, budget: Optional[int],
                paged: bool) -> List[Tuple["Op", "Graph"]]:
    """Write ``graph``'s nodes and edges; returns the (op, called graph) pairs it found."""
    options = writer.options
    items = _items(graph, writer, budget)
    pages = 1
    if paged and budget is not None and len(items) > budget:
        pages = -(-len(items) // budget)
        page = min(options.page, pages)
        shown = items[(page - 1) * budget: page * budget]
    else:
        page, shown = 1, items
    producer: Dict[int, Tuple[_Item, int]] = {}  # id(tensor) -> (item, its index among all items)
    for index, item in enumerate(items):
        for op in item.ops:
            for t in op.outputs:
                producer[id(t)] = (item, index)
    shown_ids = {id(item) for item in shown}
    leaves: Dict[int, str] = {}
    streams: Dict[str, str] = {}
    edges: Set[Tuple[str, str, str]] = set()
    found: List[Tuple["Op", "Graph"]] = []

    def source(t: "Tensor") -> str:
        made = producer.get(id(t))
        if made is not None and id(made[0]) in shown_ids:
            return made[0].node
        if id(t) not in leaves:
            note = ""
            if made is not None:
                note = f"\nfrom page {made[1] // budget + 1}" if budget else ""
            leaves[id(t)] = writer.leaf(t, graph, depth, note)
        return leaves[id(t)]

    for item in shown:
        writer.op_node(item, depth)
        inside = {id(t) for op in item.ops for t in op.outputs}
        for op in item.ops:
            for t in op.inputs:
                if id(t) in inside:
                    continue
                edges.add((source(t), item.node, typed(t)))
            stream = op.attrs.get("stream")
            if stream is not None and hasattr(stream, "tensor_id"):
                if stream.tensor_id not in streams:
                    streams[stream.tensor_id] = writer.stream_node(stream, depth)
                s = streams[stream.tensor_id]
                edges.add((s, item.node, "") if op.type == "host_load" else (item.node, s, ""))
            for called in _op_graphs(op):
                found.append((op, called))
                writer.call_edges.append((item.node, called.id, _call_label(op, called)))
    for index, t in enumerate(graph.outputs):
        if budget is not None and paged and pages > 1 and page != pages:
            break  # outputs are drawn on the last page
        node = writer.node(depth, shape="ellipse", style="filled", fillcolor="#f8f9fa", fontsize=10,
                           label=f"output {index}\n{typed(t)}", tooltip=t.id)
        edges.add((source(t), node, ""))
    for tail, head, label in sorted(edges):
        writer.emit(f"{tail} -> {head}" + (f" {_attrs_text(tooltip=label)}" if label else "") + ";", depth)
    if pages > 1:
        hint = f"page {page} of {pages} ({len(items)} nodes, {budget} a page)"
        if page < pages:
            hint += f"\nnext: DrawOptions(page={page + 1})"
        writer.node(depth, shape="note", style="filled", fillcolor="#fff9db", label=hint)
    # Invisible edges from the cluster's top anchor to the nodes nothing points at, and from the
    # nodes that point nowhere to a bottom anchor: clusters can then be stacked in rows.
    heads = {h for _, h, _ in edges}
    tails = {t for t, _, _ in edges}
    top, bottom = writer.cluster_of[graph.id], writer.bottom_of[graph.id]
    for node in writer.placed:
        if node not in heads:
            writer.emit(f"{top} -> {node} [style=invis];", depth)
        if node not in tails:
            writer.emit(f"{node} -> {bottom} [style=invis];", depth)
    writer.placed = []
    return found


def _structure(graph: "Graph", keys: Dict[str, Any]) -> Any:
    """What two graphs must share to be drawn as one: input, output and op types, attributes and
    the structure of the graphs they call (names and ids left out)."""
    if graph.id in keys:
        return keys[graph.id]
    keys[graph.id] = graph.id  # a graph that calls itself compares by id
    ops = tuple((op.type, tuple(tensor_type(t) for t in op.inputs), tuple(tensor_type(t) for t in op.outputs),
                 tuple(a for a in shown_attrs(op) if not a.startswith(_GRAPH_ATTRS)),
                 tuple(_structure(c, keys) for c in _op_graphs(op))) for op in graph.ops)
    key = (tuple((tensor_type(t), graph.is_input_by_ref(t)) for t in graph.inputs),
           tuple(tensor_type(t) for t in graph.outputs), ops)
    keys[graph.id] = key
    return key


def _roots(subject: Union["Graph", "Ir"]) -> List["Graph"]:

    if isinstance(subject, Graph):
        return [subject]
    ir = subject
    graphs = ir._all_graphs()
    called = {c.id for g in graphs for c in g.called_graphs}
    others = [g for g in graphs[1:] if g.id not in called]
    return others if others and not ir.main_graph.ops else [ir.main_graph] + others


def to_dot(subject: Union["Graph", "Ir"], options: Optional[DrawOptions] = None, title: Optional[str] = None) -> str:
    """Graphviz DOT source for a graph (with the graphs it calls) or a whole Ir."""

    if not isinstance(subject, (Graph, Ir)):
        raise TypeError(f"to_dot needs a popxl.Graph or popxl.Ir, not {type(subject).__name__}.")
    options = options or DrawOptions()
    writer = _Writer(options)
    roots = _roots(subject)
    budget = options.max_nodes
    # Which graphs get a cluster: breadth first from the roots while the budget lasts.
    # Graphs of the same structure as one already met (12 layers, 12 graphs) are drawn once.
    levels: Dict[str, int] = {}
    order: List["Graph"] = []
    by_structure: Dict[Any, "Graph"] = {}
    keys: Dict[str, Any] = {}
    frontier = list(roots)
    level = 0
    while frontier:
        nxt: List[Any] = []
        for g in frontier:
            if g.id in levels or g.id in writer.same_as:
                continue
            key = _structure(g, keys)
            if budget is not None and key in by_structure and not any(g is r for r in roots):
                writer.same_as[g.id] = by_structure[key]
                continue
            by_structure.setdefault(key, g)
            levels[g.id] = level
            order.append(g)
            nxt.extend(g.called_graphs)
        frontier, level = nxt, level + 1
    alike: Dict[str, int] = {}
    for rep in writer.same_as.values():
        alike[rep.id] = alike.get(rep.id, 0) + 1
    drawn: List["Graph"] = []
    used = 0
    for g in order:
        size = _graph_size(g)
        is_root = any(g is r for r in roots)
        within_depth = options.depth is None or levels[g.id] <= options.depth
        if is_root or (within_depth and (budget is None or used + size <= budget)):
            drawn.append(g)
            used += min(size, budget) if budget is not None else size
    drawn_ids = {g.id for g in drawn}
    name = title or (f"Ir[id={subject.id}]" if isinstance(subject, Ir) else graph_title(subject))
    writer.lines.append(f"digraph {_quote(name)} {{")
    writer.emit(f"graph {_attrs_text(rankdir=options.rankdir, compound='true', fontname='Helvetica', fontsize=11, newrank='true', label=name, labelloc='t', tooltip=name)};")
    writer.emit(f"node {_attrs_text(fontname='Helvetica', fontsize=11, margin='0.08,0.03', height=0.3)};")
    writer.emit(f"edge {_attrs_text(fontname='Helvetica', color='#495057', arrowsize=0.6)};")
    call_sites: Dict[str, int] = {}
    for g in drawn:
        for c in (c for op in g.ops for c in _op_graphs(op)):
            shown = writer.same_as.get(c.id, c)
            call_sites[shown.id] = call_sites.get(shown.id, 0) + 1
    for index, g in enumerate(drawn):
        writer.cluster_name[g.id] = f"cluster_{index}"
        writer.cluster_of[g.id] = writer.node_id()
        writer.bottom_of[g.id] = writer.node_id()
    for g in drawn:
        # A graph larger than the budget left after the others is folded by scope and paged.
        own_budget = None if budget is None else max(budget - (used - min(_graph_size(g), budget)), 10)
        writer.emit(f"subgraph {writer.cluster_name[g.id]} {{")
        label = f"{'main graph' if is_main(g) else 'graph'} {graph_title(g)}"
        if alike.get(g.id):
            label += f" and {alike[g.id]} like it"
        if call_sites.get(g.id, 0) > 1:
            label += f" ({call_sites[g.id]} call sites)"
        writer.emit(f"graph {_attrs_text(label=label, style='rounded', color='#868e96', fontsize=12, tooltip=graph_title(g))};", 2)
        for anchor in (writer.cluster_of[g.id], writer.bottom_of[g.id]):
            writer.emit(f"{anchor} {_attrs_text(shape='point', width=0.01, style='invis')};", 2)
        _draw_graph(writer, g, 2, own_budget, paged=True)
        writer.emit("}")
    # Clusters in rows, about as many rows as columns, so that many graphs make a square picture.
    columns = max(1, math.ceil(math.sqrt(len(drawn))))
    for above, below in zip(drawn, drawn[columns:]):
        writer.emit(f"{writer.bottom_of[above.id]} -> {writer.cluster_of[below.id]} [style=invis, weight=0];")
    writer.call_edges = [(node, writer.same_as[gid].id if gid in writer.same_as else gid, label)
                         for node, gid, label in writer.call_edges]
    for graph_id in dict.fromkeys(gid for _, gid, _ in writer.call_edges if gid not in drawn_ids):
        g = next(x for x in order if x.id == graph_id)
        writer.collapsed[graph_id] = writer.node(
            1, shape="component", style="filled", fillcolor="#e7f5ff",
            label=f"graph {graph_title(g)}\n({len(g.ops)} ops, not drawn)",
            tooltip=f"{graph_title(g)}: draw it on its own to see its ops")
    edges_to: Dict[str, int] = {}
    for op_node, graph_id, label in writer.call_edges:
        edges_to[graph_id] = edges_to.get(graph_id, 0) + 1
        if budget is not None and edges_to[graph_id] > _MAX_CALL_EDGES:
            continue
        if graph_id in writer.cluster_of:
            target, extra = writer.cluster_of[graph_id], dict(lhead=writer.cluster_name[graph_id])
        else:
            target, extra = writer.collapsed[graph_id], {}
        writer.emit(f"{op_node} -> {target} {_attrs_text(style='dashed', color='#1c7ed6', fontcolor='#1c7ed6', fontsize=9, label=label, constraint='false', **extra)};")
    writer.lines.append("}")
    return "\n".join(writer.lines) + "\n"


# PopXL's .dot checkpoints ----------------------------------------------------------------------------

def dot_checks() -> Optional[Set[str]]:
    """The checks ``POPART_DOT_CHECKS`` asks for, upper-cased (``:`` separates them); None when the
    variable is not set."""
    value = os.environ.get(DOT_CHECKS_ENV)
    if value is None:
        return None
    return {c.strip().upper() for c in value.split(":") if c.strip()}


def check_enabled(ir: "Ir", check: str) -> bool:
    """Whether ``check`` is asked for by ``POPART_DOT_CHECKS`` or by the Ir's own ``dotChecks``
    option (``ir._pb_ir.getSessionOptions().dotChecks``): by name (case-blind) or by ``ALL``."""
    checks = {c.upper() for c in ir._dot_checks} | (dot_checks() or set())
    return "ALL" in checks or check.upper() in checks


def dot_checkpoint(ir: "Ir", check: str, save_dir: Optional[Union[Path, str]] = None) -> Optional[Path]:
    """Write the whole program as Graphviz DOT to ``<dir>/<check>_all.dot`` if ``check`` is enabled.

    As in PopXL: the checks written are those ``POPART_DOT_CHECKS`` names (``:``-separated and
    case-blind, ``ALL`` for all of them) and those of the Ir's ``dotChecks`` option; when neither
    names any (the variable unset), the first checkpoint sets ``dotChecks`` to ``ALL``, so this and
    every later checkpoint, the Session's ``FINAL`` one included, are written. ``save_dir`` (the
    Ir's ``logDir`` option) becomes the directory of this Ir's later checkpoints too (default: the
    working directory). All graphs go into one file (PopART's ``<check>_all.dot``). Returns the
    path written, or None.
    """
    if not isinstance(check, str) or not check:
        raise ValueError(f"dot_checkpoint: check must be a non-empty str, not {check!r}.")
    if save_dir is not None:
        ir._dot_save_dir = Path(save_dir)
    if dot_checks() is None and not ir._dot_checks:
        ir._dot_checks = {"ALL"}
    if not check_enabled(ir, check):
        return None
    if any(c in check for c in "/\\\0") or check in (".", ".."):
        raise ValueError(f"dot_checkpoint: check {check!r} names a file in the save directory: it may not contain "
                         f"'/', '\\' or NUL, nor be '.' or '..'.")
    directory = ir._dot_save_dir or Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{check}_all.dot"
    path.write_text(to_dot(ir, DrawOptions(max_nodes=None), title=f"{check}: Ir[id={ir.id}]"))
    return path
