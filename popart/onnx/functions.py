"""Function expansion: ONNX ops the table has no entry for, but whose definition is a function of
other ops, are replaced by that function's body before import.

Two kinds of definition are expanded: the model's own local functions (``ModelProto.functions``,
which exporters such as PyTorch's emit for modules), and the function bodies the ONNX standard
gives for many ops (Attention, RMSNormalization, RotaryEmbedding, Swish, AffineGrid ...; some are
generated for the node's attributes and input types, which shape inference supplies). A body may
call further functions; expansion repeats until every node is in the table or has no definition.

Each expanded node keeps the ai.onnx opset its body was written for: an entry reads the node's
opset to tell attribute forms from input forms (a Reduce op's axes, say).
"""
from __future__ import annotations

import itertools
from typing import Collection, Dict, List, Optional, Protocol, Sequence, Tuple, Union, cast

import onnx
from onnx import defs, helper

from popart.onnx.protos import op_key

__all__ = ["expand_functions"]

# Bodies calling bodies: a bound that only a recursive definition would reach.
_MAX_DEPTH = 8


def _default_opset(opsets: Sequence[onnx.OperatorSetIdProto], fallback: int) -> int:
    return next((int(o.version) for o in opsets if o.domain in ("", "ai.onnx")), fallback)


def _value_types(model: onnx.ModelProto) -> Dict[str, onnx.TypeProto]:
    """The type of every value shape inference can tell (context-dependent bodies need them)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an uninferable model: the declared types still help
        inferred = model
    g = inferred.graph
    types = {vi.name: vi.type for vi in itertools.chain(g.input, g.value_info, g.output)}
    for t in g.initializer:
        types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    return types


class _FunctionSchema(Protocol):
    """The members of an ONNX op schema (``onnx.defs.OpSchema``) that give the op's function body.
    onnx's type stub of OpSchema leaves them out; its run-time class has them (bodies are serialized
    FunctionProtos)."""

    has_function: bool
    function_opset_versions: Sequence[int]
    has_context_dependent_function: bool
    context_dependent_function_opset_versions: Sequence[int]

    def get_function_with_opset_version(self, version: int) -> Union[bytes, onnx.FunctionProto]: ...

    def get_context_dependent_function_with_opset_version(
            self, version: int, node: bytes, input_types: Sequence[bytes]) -> Union[bytes, onnx.FunctionProto]: ...


def _function_schema(node: onnx.NodeProto, opset: int) -> _FunctionSchema:
    """The schema of ``node``'s op at ``opset`` (onnx raises if there is none)."""
    # the stub's OpSchema lacks the function members (see _FunctionSchema)
    return cast(_FunctionSchema, defs.get_schema(node.op_type, opset, node.domain))


def _context_dependent(node: onnx.NodeProto, opset: int) -> bool:
    """Whether the standard body of ``node`` is generated for its input types."""
    try:
        return bool(_function_schema(node, opset).has_context_dependent_function)
    except Exception:
        return False


def _standard_body(node: onnx.NodeProto, opset: int,
                   types: Dict[str, onnx.TypeProto]) -> Optional[onnx.FunctionProto]:
    """The ONNX standard's function body for ``node`` at ``opset``, or None if it has none (or it
    needs an input type nobody knows)."""
    try:
        schema = _function_schema(node, opset)
    except Exception:
        return None
    body: Union[bytes, onnx.FunctionProto, None] = None
    if schema.has_context_dependent_function:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        present = [x for x in node.input]
        if versions and all(x == "" or x in types for x in present):
            # absent optional inputs are passed as empty types, as the schema expects
            arg_types = [types[x].SerializeToString() if x else b"" for x in present]
            try:
                body = schema.get_context_dependent_function_with_opset_version(
                    max(versions), node.SerializeToString(), arg_types)
            except Exception:
                body = None
    elif schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= opset]
        body = schema.get_function_with_opset_version(max(versions)) if versions else None
    if body is None:
        return None
    if isinstance(body, bytes):
        f = onnx.FunctionProto()
        f.ParseFromString(body)
        return f
    return body


def _attribute_defaults(node: onnx.NodeProto, opset: int,
                        local: Optional[onnx.FunctionProto]) -> Dict[str, onnx.AttributeProto]:
    """The values a body's attribute references take when ``node`` does not set them."""
    if local is not None:
        return {a.name: a for a in local.attribute_proto}
    try:
        schema = defs.get_schema(node.op_type, opset, node.domain)
    except Exception:
        return {}
    return {name: a.default_value for name, a in schema.attributes.items() if a.default_value.name}


def _instantiate(node: onnx.NodeProto, body: onnx.FunctionProto, prefix: str,
                 defaults: Dict[str, onnx.AttributeProto]) -> List[onnx.NodeProto]:
    """The body's nodes with its formal inputs/outputs renamed to the node's, its own values
    prefixed, and attribute references replaced by the node's attributes (or their defaults)."""
    rename = {formal: actual for formal, actual in zip(body.input, node.input)}
    rename.update({formal: "" for formal in list(body.input)[len(node.input):]})  # absent optional inputs
    rename.update({formal: actual for formal, actual in zip(body.output, node.output)})
    given = {a.name: a for a in node.attribute}

    def name(v: str) -> str:
        if v == "":
            return ""
        return rename.setdefault(v, f"{prefix}{v}")

    def instantiate_nodes(nodes: Sequence[onnx.NodeProto]) -> List[onnx.NodeProto]:
        out = []
        for inner in nodes:
            n = onnx.NodeProto()
            n.CopyFrom(inner)
            n.name = f"{prefix}{inner.name or inner.op_type}"
            n.input[:] = [name(v) for v in inner.input]
            n.output[:] = [name(v) for v in inner.output]
            attrs = []
            for a in inner.attribute:
                if a.ref_attr_name:
                    source = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if source is None:
                        continue  # unset and without a default: the inner op's own default applies
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(source)
                    a2.name = a.name
                    attrs.append(a2)
                elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    # subgraphs (If branches, Loop/Scan bodies) read the body's values by name
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(a)
                    for g in ([a2.g] if a2.type == onnx.AttributeProto.GRAPH else list(a2.graphs)):
                        instantiate_graph(g)
                    attrs.append(a2)
                else:
                    attrs.append(a)
            del n.attribute[:]
            n.attribute.extend(attrs)
            out.append(n)
        return out

    def instantiate_graph(g: onnx.GraphProto) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            vi.name = name(vi.name)
        for t in g.initializer:
            t.name = name(t.name)
        nodes = instantiate_nodes(g.node)
        del g.node[:]
        g.node.extend(nodes)

    return instantiate_nodes(body.node)


def expand_functions(model: onnx.ModelProto, supported: Collection[str],
                     opset: int) -> Tuple[onnx.ModelProto, List[int]]:
    """``model`` with every node whose op type is not in ``supported`` but has a function
    definition replaced by the definition's body; and the ai.onnx opset of each resulting node."""
    local = {(f.domain, f.name): f for f in model.functions}
    nodes = list(model.graph.node)
    node_opsets = [opset] * len(nodes)
    counter = itertools.count()
    for _ in range(_MAX_DEPTH):
        todo = [i for i, n in enumerate(nodes) if op_key(n) not in supported]
        if not todo:
            break
        current = onnx.ModelProto()
        current.CopyFrom(model)
        del current.graph.node[:]
        current.graph.node.extend(nodes)
        # Shape inference only for bodies generated from the types (onnx's C++ inference is the
        # least robust part of the package on malformed models, so it runs only when needed).
        needs_types = any((nodes[i].domain, nodes[i].op_type) not in local and _context_dependent(nodes[i], node_opsets[i])
                          for i in todo)
        types = _value_types(current) if needs_types else {}
        expanded, expanded_opsets, progress = [], [], False
        for i, n in enumerate(nodes):
            f = local.get((n.domain, n.op_type)) if op_key(n) not in supported else None
            body = f
            if body is None and op_key(n) not in supported:
                body = _standard_body(n, node_opsets[i], types)
            if body is None:
                expanded.append(n)
                expanded_opsets.append(node_opsets[i])
                continue
            progress = True
            prefix = f"{n.name or n.op_type}__{next(counter)}/"
            inner = _instantiate(n, body, prefix, _attribute_defaults(n, node_opsets[i], f))
            inner_opset = _default_opset(body.opset_import, node_opsets[i])
            expanded.extend(inner)
            expanded_opsets.extend([inner_opset] * len(inner))
        nodes, node_opsets = expanded, expanded_opsets
        if not progress:
            break
    if len(nodes) == len(model.graph.node) and all(a is b for a, b in zip(nodes, model.graph.node)):
        return model, node_opsets
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, node_opsets
