"""A typed text listing of graphs, in the spirit of ``jax.make_jaxpr``: what ``print(graph)`` and
``str(ir)`` show.

Every op is one line, ``outputs = type[attributes](inputs)``, each tensor written
``name:dtype[shape]``. An op that calls, repeats or branches into graphs has their bodies nested
below it (a body already listed is referred to, not repeated). The main graph starts with its
variables, constants and the host streams its ops move data through.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set

import numpy as np
from popxl.graph import Graph, op_called_graphs
from popxl.streams import Stream, HostToDeviceStream

if TYPE_CHECKING:  # pragma: no cover
    from popxl.graph import Graph
    from popxl.ir import Ir
    from popxl.op import Op
    from popxl.tensor import Tensor

__all__ = ["graph_listing", "ir_listing", "graph_title", "tensor_type", "typed", "format_attr",
           "shown_attrs", "graph_streams", "is_main"]

INDENT = "  "
MAX_ATTR_CHARS = 48  # longer attribute values are cut, the listing is for reading
MAX_CONSTANT_VALUES = 4  # constants this small show their value

# Attributes that say how a call binds its inputs: the nested body's signature already shows it.
_BINDING_ATTRS = {"input_index", "then_index", "else_index"}


def is_main(graph: "Graph") -> bool:
    return graph is graph.ir.main_graph


def graph_title(graph: "Graph") -> str:
    """The name a reader should see: the main graph's id is empty, so it is called ``main_graph``."""
    return "main_graph" if is_main(graph) else graph.id


def tensor_type(t: Any) -> str:
    """``float32[3,4]`` (``float32[]`` for a scalar): a Tensor's, a stream's or a TensorSpec's type."""
    return f"{t.dtype.name}[{','.join(str(d) for d in t.shape)}]"


def typed(t: "Tensor") -> str:
    return f"{t.name}:{tensor_type(t)}"


def format_attr(value: Any) -> str:
    """One attribute value, short enough for a line."""

    if isinstance(value, Graph):
        return graph_title(value)
    if isinstance(value, Stream):
        return value.tensor_id
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            text = np.array2string(value.reshape(-1), separator=",", threshold=8)
        else:
            text = f"array({value.dtype}[{','.join(map(str, value.shape))}])"
    elif isinstance(value, (list, tuple)):
        text = "(" + ",".join(format_attr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    elif isinstance(value, (str, int, bool)) or value is None:
        text = str(value)
    else:
        name = getattr(value, "name", None)
        text = name if isinstance(name, str) else repr(value)
    return text if len(text) <= MAX_ATTR_CHARS else text[:MAX_ATTR_CHARS - 3] + "..."


def shown_attrs(op: "Op") -> List[str]:
    """``key=value`` for the attributes worth reading (input bindings and empty ones left out)."""
    out = []
    for key, value in op.attrs.items():
        if key in _BINDING_ATTRS or value is None or (key == "modified" and not value):
            continue
        out.append(f"{key}={format_attr(value)}")
    return out


def _op_line(op: "Op") -> str:
    attrs = shown_attrs(op)
    head = op.type + (f"[{', '.join(attrs)}]" if attrs else "")
    ins = ", ".join(typed(t) for t in op.inputs)
    outs = ", ".join(typed(t) for t in op.outputs)
    return f"{outs} = {head}({ins})" if outs else f"{head}({ins})"


def graph_streams(graph: "Graph") -> List[Any]:
    """The streams the ops of ``graph`` load from or store to, in op order, each once."""
    seen: Dict[str, Any] = {}
    for op in graph.ops:
        stream = op.attrs.get("stream")
        if stream is not None and hasattr(stream, "tensor_id"):
            seen.setdefault(stream.tensor_id, stream)
    return list(seen.values())


def _constant_text(t: "Tensor") -> str:
    value = getattr(t, "_host_data_value", None)
    if value is not None and np.size(value) <= MAX_CONSTANT_VALUES:
        shown = np.array2string(np.asarray(value).reshape(-1), separator=",") if np.ndim(value) else str(value)
        return f"{typed(t)} = {shown}"
    return typed(t)


def _leaves(graph: "Graph") -> List[str]:
    """The lines for what the graph holds before any op runs: variables, constants, streams."""

    lines = []
    variables = graph.variables
    if variables:
        lines.append("variables: " + ", ".join(typed(v) for v in variables))
    constants = graph.constants
    if constants:
        lines.append("constants: " + ", ".join(_constant_text(c) for c in constants))
    streams = graph_streams(graph)
    if streams:
        lines.append("streams: " + ", ".join(
            f"{s.tensor_id}:{tensor_type(s)} ({'host->device' if isinstance(s, HostToDeviceStream) else 'device->host'})"
            for s in streams))
    return lines


def _signature(graph: "Graph") -> str:
    if is_main(graph):
        return ""
    return "(" + ", ".join(typed(t) + (" by_ref" if graph.is_input_by_ref(t) else "") for t in graph.inputs) + ")"


def _graph_lines(graph: "Graph", depth: int, listed: Set[str], stack: List[str]) -> List[str]:
    pad = INDENT * depth
    title = graph_title(graph)
    listed.add(graph.id)
    lines = [f"{pad}graph {title}{_signature(graph)} {{"]
    body = pad + INDENT
    lines.extend(body + line for line in _leaves(graph))
    for op in graph.ops:
        lines.append(body + _op_line(op))
        for called in _called(op):
            lines.extend(_nested(called, depth + 2, listed, stack))
    if not is_main(graph):
        lines.append(f"{body}return ({', '.join(typed(t) for t in graph.outputs)})")
    lines.append(pad + "}")
    return lines


def _nested(graph: "Graph", depth: int, listed: Set[str], stack: List[str]) -> List[str]:
    pad = INDENT * depth
    if graph.id in stack:  # a graph calling itself: say so instead of recursing forever
        return [f"{pad}graph {graph_title(graph)}: calls itself (see above)"]
    if graph.id in listed:
        return [f"{pad}graph {graph_title(graph)}: listed above"]
    stack.append(graph.id)
    try:
        return _graph_lines(graph, depth, listed, stack)
    finally:
        stack.pop()


def _called(op: "Op") -> Iterable["Graph"]:
    return op_called_graphs(op)


def graph_listing(graph: "Graph", nested: bool = True) -> str:
    """The listing of ``graph``; with ``nested`` the bodies of the graphs it calls follow their ops."""
    listed: Set[str] = set()
    if not nested:  # mark every called graph as listed so only references are written
        listed.update(g.id for g in graph.ir._all_graphs() if g is not graph)
    return "\n".join(_graph_lines(graph, 0, listed, [graph.id]))


def ir_listing(ir: "Ir", title: Optional[str] = None) -> str:
    """The listing of the whole program: the main graph with everything it calls nested, then the
    graphs no op calls (a gradient graph not called yet, say)."""
    listed: Set[str] = set()
    head = title or (f"{ir!r}: replication_factor={ir.replication_factor}, "
                     f"num_host_transfers={ir.num_host_transfers}")
    lines = [head]
    lines.extend(_graph_lines(ir.main_graph, 0, listed, [ir.main_graph.id]))
    rest = [g for g in ir._all_graphs() if g.id not in listed]
    # A graph only called from another uncalled graph is listed inside it, not again on its own.
    called_by_rest = {c.id for g in rest for c in g.called_graphs}
    for g in rest:
        if g.id not in listed and g.id not in called_by_rest:
            lines.extend(_nested(g, 0, listed, []))
    for g in rest:  # what is left calls itself in a cycle
        if g.id not in listed:
            lines.extend(_nested(g, 0, listed, []))
    return "\n".join(lines)
