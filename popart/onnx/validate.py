"""Checks an ONNX model must pass before import, each failing with an ``OnnxImportError`` that names
the node, tensor or initializer at fault and what was expected.

* Operator sets: the model's ai.onnx opset must lie between ``MIN_OPSET`` and the newest opset the
  installed ``onnx`` package defines (``newest_opset()``): beyond it no op definition exists to
  follow. Other ONNX domains likewise stop at the installed package's newest version, PopART's own
  (``ai.graphcore``) at version 1; every node's domain must be imported (by the model, or by the
  local function it belongs to), and an ai.onnx op must exist at the opset its node is read with.
* Single assignment: each tensor name is written once, by one graph input, initializer or node
  output (an initializer may also be listed as an input, as older exporters do); a node inside a
  subgraph may not write a name of an enclosing scope.
* Declared graph outputs are produced (by a node, an input or an initializer of the graph or, in a
  subgraph, of an enclosing scope).
* Tensor data (initializers, tensor attributes): a known element type popart supports, non-negative
  dims, data held in the model (not in a file never loaded), as many values as the dims say.

Element types popart lacks (strings, bfloat16, most float8 formats, float4, int4/int2, complex) are
named as such wherever they are met (``element_dtype``).
"""
from __future__ import annotations

import difflib
import functools
import math
import os
import resource
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, defs, numpy_helper

from popart.errors import OnnxImportError
from popart.losses import GRAPHCORE_DOMAIN

__all__ = ["MIN_OPSET", "newest_opset", "element_dtype", "element_type_name", "check_element_type",
           "tensor_array", "check_tensor", "model_opset", "check_graph", "unsupported_dtype_message",
           "check_tensor_size", "memory_limit", "check_text"]

MIN_OPSET = 11

# ONNX element types popart holds on the device (64-bit ones in their 32-bit counterparts), by the
# name messages use. float8: ONNX's FNUZ formats are popxl's float8_143 / float8_152.
_SUPPORTED: Dict[int, str] = {
    TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.DOUBLE: "float64",
    TensorProto.INT8: "int8", TensorProto.INT16: "int16", TensorProto.INT32: "int32", TensorProto.INT64: "int64",
    TensorProto.UINT8: "uint8", TensorProto.UINT16: "uint16", TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64", TensorProto.BOOL: "bool", TensorProto.FLOAT8E4M3FNUZ: "float8e4m3fnuz",
    TensorProto.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
}
_DEFAULT_DOMAINS = ("", "ai.onnx")


def newest_opset() -> int:
    """The newest ai.onnx opset the installed ``onnx`` package defines (the importer's upper bound)."""
    return int(defs.onnx_opset_version())


def element_type_name(elem_type: int) -> str:
    """ONNX element type ``elem_type`` as messages name it ("float32", "string", "bfloat16", ...)."""
    if elem_type in _SUPPORTED:
        return _SUPPORTED[elem_type]
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"{elem_type} (not an ONNX element type)"


def _unsupported_type_reason(elem_type: int) -> str:
    name = element_type_name(elem_type)
    if elem_type == TensorProto.UNDEFINED:
        return "the element type is undefined (0)"
    if "not an ONNX element type" in name:
        return f"element type {name}"
    return f"{name} tensors are not supported"


def _supported_list() -> str:
    return ", ".join(sorted(set(_SUPPORTED.values())))


def element_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of ONNX element type ``elem_type``; a ``ValueError`` saying "string tensors
    are not supported" (and so on) for a type popart lacks."""
    if elem_type not in _SUPPORTED:
        raise ValueError(f"{_unsupported_type_reason(elem_type)} (popart's element types: {_supported_list()})")
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def check_element_type(elem_type: int, what: str) -> np.dtype:
    """``element_dtype`` for ``what`` (an input, an initializer ...), failing with an OnnxImportError naming it."""
    try:
        return element_dtype(elem_type)
    except ValueError as e:
        raise OnnxImportError(f"{what} has element type {element_type_name(elem_type)}: {e}.") from None


def unsupported_dtype_message(dt: np.dtype) -> Optional[str]:
    """Why a NumPy array of dtype ``dt`` cannot become a device tensor ("string tensors are not
    supported"), or None if it can."""
    dt = np.dtype(dt)
    try:
        code = onnx.helper.np_dtype_to_tensor_dtype(dt)
    except (KeyError, TypeError, ValueError):
        return f"NumPy dtype {dt} has no ONNX element type"
    return None if code in _SUPPORTED else _unsupported_type_reason(code)


# tensor data ------------------------------------------------------------------------------------------
def check_tensor(t: TensorProto, what: str, any_type: bool = False) -> Optional[np.dtype]:
    """Check that ``t`` (``what``: "initializer 'w'", ...) holds data popart can read: a supported
    element type, non-negative dims, data in the model, as many values as its dims say. Returns the
    NumPy dtype. ``any_type``: a type popart lacks passes (returning None, its data unchecked): a
    Constant's value only needs one if it reaches the device (import-time values are computed by
    ONNX's reference implementation, which knows every type)."""
    dt = None if any_type and t.data_type not in _SUPPORTED else check_element_type(t.data_type, what)
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what} has dims {dims}: dimensions must not be negative.")
    if t.data_location == TensorProto.EXTERNAL:
        where = next((e.value for e in t.external_data if e.key == "location"), "?")
        raise OnnxImportError(
            f"{what} keeps its data in the external file {where!r}, which was not loaded. Pass the model's file "
            f"path (its external data is read from beside it) or call onnx.load_external_data_for_model(model, "
            f"base_dir) first.")
    if t.HasField("segment"):
        raise OnnxImportError(f"{what} is one segment of a tensor split across several TensorProtos; segmented "
                              f"tensors are not supported.")
    if dt is None:
        return None
    count = math.prod(dims)
    if t.HasField("raw_data") and len(t.raw_data) or not _typed_values(t):
        held = len(t.raw_data)
        if held != count * dt.itemsize:
            raise OnnxImportError(
                f"{what} has dims {dims} ({count} {element_type_name(t.data_type)} element(s), "
                f"{count * dt.itemsize} bytes) but its raw_data holds {held} bytes.")
        return dt
    field = onnx.helper.tensor_dtype_to_field(t.data_type)
    held = len(getattr(t, field))
    if held != count:
        raise OnnxImportError(f"{what} has dims {dims} ({count} element(s)) but its {field} holds {held} value(s).")
    return dt


def _typed_values(t: TensorProto) -> int:
    """How many values ``t`` holds in its typed fields (float_data, int32_data, ...)."""
    return sum(len(getattr(t, f)) for f in ("float_data", "int32_data", "string_data", "int64_data",
                                            "double_data", "uint64_data"))


def tensor_array(t: TensorProto, what: str) -> np.ndarray:
    """The NumPy value of ``t`` after ``check_tensor``."""
    check_tensor(t, what)
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # values the checks above cannot see (say, bytes that are no float8 codes)
        raise OnnxImportError(f"{what} could not be read: {e}") from None


def memory_limit() -> int:
    """The bytes this process can hold: the machine's physical memory, or less under an address
    space limit (``ulimit -v``)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return physical if soft == resource.RLIM_INFINITY else min(physical, soft)


def _size(nbytes: int) -> str:
    """``nbytes`` for people: "24.0 GiB"; exact integers throughout (a product of huge dims can be
    beyond a float's range)."""
    if nbytes < 1024:
        return f"{nbytes} bytes"
    for k, unit in enumerate(("KiB", "MiB", "GiB", "TiB", "PiB"), start=1):
        if nbytes < 1024 ** (k + 1):
            return f"{nbytes * 10 // 1024 ** k / 10:.1f} {unit}"
    return f"about 10**{len(str(nbytes)) - 1} bytes"


def check_tensor_size(what: str, shape: Sequence[int], dtype: np.dtype) -> None:
    """A tensor (``what``: a model input, a tensor a node makes) must have dims in int64's range
    and fit in memory, checked before anything is allocated for it."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what} has shape {tuple(dims)}: dimensions must not be negative.")
    if any(d >= 2 ** 63 for d in dims):  # even with no elements (another dim 0): shapes are int64
        raise OnnxImportError(f"{what} has shape {tuple(dims)}: dimensions must be below 2**63.")
    nbytes = math.prod(dims) * np.dtype(dtype).itemsize
    limit = memory_limit()
    if nbytes > limit:
        raise OnnxImportError(f"{what} has shape {tuple(dims)} of {np.dtype(dtype)}: {_size(nbytes)}, more than the "
                              f"{_size(limit)} of memory this process can use.")


# text ------------------------------------------------------------------------------------------------
def check_text(message: Any, path: str = "model") -> None:
    """Every string field of ``message`` (names, op types, domains ...) must be text: protobuf hands
    a string that is not valid UTF-8 back as bytes, which no name lookup expects."""
    for descriptor, value in message.ListFields():
        where = f"{path}.{descriptor.name}"
        repeated = _is_repeated(descriptor)
        if descriptor.type == descriptor.TYPE_STRING:
            for k, v in enumerate(value if repeated else [value]):
                if not isinstance(v, str):
                    raise OnnxImportError(f"{where}{f'[{k}]' if repeated else ''} is not valid UTF-8 text: "
                                          f"{bytes(v)[:60]!r}.")
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            if repeated:
                for k, item in enumerate(value):
                    check_text(item, f"{where}[{k}]")
            else:
                check_text(value, where)


def _is_repeated(descriptor: Any) -> bool:
    # protobuf 5.x+ names it is_repeated; ``label`` is gone from protobuf 7
    if hasattr(descriptor, "is_repeated"):
        return bool(descriptor.is_repeated)
    return descriptor.label == descriptor.LABEL_REPEATED


# operator sets ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _newest_versions() -> Dict[str, int]:
    """The newest version of every domain the installed onnx package defines, and popart's own."""
    newest: Dict[str, int] = {}
    for schema in defs.get_all_schemas_with_history():
        newest[schema.domain] = max(newest.get(schema.domain, 1), int(schema.since_version))
    newest[""] = newest_opset()
    newest["ai.onnx.ml"] = int(defs.onnx_ml_opset_version())
    newest[GRAPHCORE_DOMAIN] = 1
    return newest


@functools.lru_cache(maxsize=None)
def _introduced() -> Dict[str, int]:
    """The opset each ai.onnx op first appeared in."""
    first: Dict[str, int] = {}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain == "":
            first[schema.name] = min(first.get(schema.name, 10 ** 9), int(schema.since_version))
    return first


def _domain(name: str) -> str:
    return "" if name in _DEFAULT_DOMAINS else name


def _domain_label(domain: str) -> str:
    return "ai.onnx" if domain == "" else domain


def _imports(opsets: Iterable[onnx.OperatorSetIdProto], owner: str) -> Dict[str, int]:
    """domain -> version of an opset_import list, each version checked against what is known."""
    found: Dict[str, int] = {}
    newest = _newest_versions()
    for o in opsets:
        domain, version = _domain(o.domain), int(o.version)
        if domain in found and found[domain] != version:
            raise OnnxImportError(f"{owner} imports {_domain_label(domain)} twice, as versions {found[domain]} and "
                                  f"{version}; import each operator set once.")
        found[domain] = version
        if version < 1:
            raise OnnxImportError(f"{owner} imports {_domain_label(domain)} version {version}; versions start at 1.")
        if domain == "" and version > newest[""]:
            raise OnnxImportError(f"{owner} imports ai.onnx opset {version}, but the installed onnx package "
                                  f"({onnx.__version__}) defines opsets up to {newest['']}: no operator definition "
                                  f"exists for it. Supported opsets are {MIN_OPSET} to {newest['']}.")
        if domain in newest and version > newest[domain]:
            limit = (f"the installed onnx package ({onnx.__version__}) defines it up to version {newest[domain]}"
                     if domain != GRAPHCORE_DOMAIN else "popart defines version 1 only")
            raise OnnxImportError(f"{owner} imports {_domain_label(domain)} version {version}, but {limit}: no "
                                  f"operator definition exists for that version.")
    return found


def _check_default_opset(version: int, owner: str) -> None:
    if version < MIN_OPSET:
        raise OnnxImportError(f"{owner} uses ai.onnx opset {version}; supported opsets are {MIN_OPSET} to "
                              f"{newest_opset()}. Convert it with onnx.version_converter.convert_version(model, "
                              f"{MIN_OPSET}).")


def model_opset(model: onnx.ModelProto) -> int:
    """The model's ai.onnx opset, after checking every operator set the model and its local
    functions import, and that each node's domain is imported."""
    imports = _imports(model.opset_import, "the ONNX model")
    if "" not in imports:
        raise OnnxImportError("the ONNX model imports no version of the default (ai.onnx) operator set.")
    _check_default_opset(imports[""], "the ONNX model")
    local = {(f.domain, f.name) for f in model.functions}
    _check_domains(model.graph.node, imports, local, "the ONNX model")
    for f in model.functions:
        owner = f"local function {f.domain}.{f.name}" if f.domain else f"local function {f.name}"
        own = _imports(f.opset_import, owner)
        if "" in own:
            _check_default_opset(own[""], owner)
        # a body without imports of its own is read with the model's
        _check_domains(f.node, {**imports, **own}, local, owner)
    return imports[""]


def _check_domains(nodes: Iterable[onnx.NodeProto], imports: Mapping[str, int], local: set, owner: str) -> None:
    for i, node in enumerate(nodes):
        domain = _domain(node.domain)
        if domain not in imports and (node.domain, node.op_type) not in local:
            raise OnnxImportError(
                f"{describe(node, i)} is in domain {_domain_label(domain)!r}, which {owner} does not import "
                f"(its opset_import lists {', '.join(repr(_domain_label(d)) for d in imports) or 'nothing'}).")
        for g in _subgraphs(node):
            _check_domains(g.node, imports, local, owner)


# graph structure -------------------------------------------------------------------------------------
def describe(node: onnx.NodeProto, index: int) -> str:
    """A node as messages name it: its name (or position) and op type."""
    return f"node {node.name or f'<node {index}>'!r} ({node.op_type})"


def _subgraphs(node: onnx.NodeProto) -> List[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def check_graph(graph: onnx.GraphProto, node_opsets: Sequence[int], outer: Optional[Mapping[str, str]] = None,
                where: str = "") -> None:
    """Check ``graph`` (and every subgraph in it): single assignment, declared outputs produced,
    tensor attributes readable, ai.onnx ops defined at their opset (``node_opsets[i]`` for node
    ``i``). ``outer``: names the enclosing scopes define (name -> who writes it); ``where``: a
    prefix naming the subgraph in messages."""
    outer = dict(outer or {})
    writers: Dict[str, str] = {}

    def fail(message: str) -> OnnxImportError:
        return OnnxImportError(f"{where}{message}")

    for vi in graph.input:
        if not vi.name:
            raise fail("a graph input has an empty name.")
        if vi.name in writers:
            raise fail(f"graph input {vi.name!r} is declared twice.")
        writers[vi.name] = "a graph input"
    for t in graph.initializer:
        if not t.name:
            raise fail("an initializer has an empty name.")
        if writers.get(t.name, "a graph input") != "a graph input":
            raise fail(f"initializer {t.name!r} is defined twice; an ONNX graph assigns each tensor once.")
        writers[t.name] = "an initializer"
        check_tensor(t, f"{where}initializer {t.name!r}")
    if len(graph.sparse_initializer):
        names = [s.values.name for s in graph.sparse_initializer]
        raise fail(f"sparse initializers ({', '.join(map(repr, names))}) are not supported; store them dense.")
    for i, node in enumerate(graph.node):
        desc = describe(node, i)
        opset = node_opsets[i]
        _check_op_defined(node, desc, opset, where)
        _check_against_schema(node, desc, opset, where)
        _check_attributes(node, desc, where)
        for a in node.attribute:
            for k, g in enumerate(([a.g] if a.HasField("g") else []) + list(a.graphs)):
                label = f"attribute {a.name!r}" + (f"[{k}]" if len(a.graphs) else "")
                inner = f"{where}subgraph {g.name!r} ({label} of {desc}): "
                check_graph(g, [opset] * len(g.node), {**outer, **writers}, inner)
        for o in node.output:
            if not o:
                continue  # an optional output left out
            previous = writers.get(o) or outer.get(o)
            if previous is not None:
                scope = "" if o in writers else " in an enclosing graph"
                raise fail(f"tensor {o!r} is written by {desc} but also by {previous}{scope}; an ONNX graph assigns "
                           f"each tensor once (single static assignment).")
            writers[o] = desc
    for vi in graph.output:
        if not vi.name:
            raise fail("a graph output has an empty name.")
        if vi.name not in writers and vi.name not in outer:
            close = difflib.get_close_matches(vi.name, list(writers), n=3)
            hint = f" (similar names: {', '.join(map(repr, close))})" if close else ""
            raise fail(f"graph output {vi.name!r} is declared, but no node produces it and it is not a graph input "
                       f"or initializer{hint}.")


def _check_op_defined(node: onnx.NodeProto, desc: str, opset: int, where: str) -> None:
    """An ai.onnx op must exist at the opset its node is read with (ops ONNX does not define at
    all are reported as unsupported later, with the list of what is)."""
    if _domain(node.domain) != "":
        return
    first = _introduced().get(node.op_type)
    if first is not None and first > opset:
        raise OnnxImportError(f"{where}{desc}: ai.onnx opset {opset} has no {node.op_type} (it was introduced in "
                              f"opset {first}); declare opset {first} or later.")


def _attribute_type_name(code: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(code)
    except ValueError:
        return f"type {code}"


def _check_against_schema(node: onnx.NodeProto, desc: str, opset: int, where: str) -> None:
    """An ai.onnx node against its op's definition at ``opset``: input and output counts, and its
    attributes (known to the op, each once, of the declared type, the required ones present), so
    that entries read only what the definition allows."""
    if _domain(node.domain) != "":
        return
    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except defs.SchemaError:
        return  # no such op: reported as unsupported, with the list of those that are
    op = f"{node.op_type} (ai.onnx opset {opset})"

    def fail(message: str) -> OnnxImportError:
        return OnnxImportError(f"{where}{desc}: {message}")

    for what, count, low, high in (("input", len(node.input), schema.min_input, schema.max_input),
                                   ("output", len(node.output), schema.min_output, schema.max_output)):
        if not low <= count <= high:
            allowed = f"{low}" if low == high else f"{low} or more" if high >= 2 ** 31 - 1 else f"{low} to {high}"
            raise fail(f"has {count} {what}(s); {op} takes {allowed}.")
    formals = list(schema.inputs)
    for k, name in enumerate(node.input):
        formal = formals[min(k, len(formals) - 1)] if formals else None
        if not name and formal is not None and formal.option == defs.OpSchema.FormalParameterOption.Single:
            raise fail(f"input {k} ({formal.name!r}) is required, but its name is empty (an absent optional input).")
    seen = set()
    for a in node.attribute:
        if a.name in seen:
            raise fail(f"attribute {a.name!r} is given twice.")
        seen.add(a.name)
        spec = schema.attributes.get(a.name)
        if spec is None:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise fail(f"{op} has no attribute {a.name!r} (its attributes: {known}).")
        if a.ref_attr_name:
            continue  # a reference to an attribute of the enclosing function, resolved when it is expanded
        # OpSchema.AttrType is an IntEnum at run time; onnx's stub declares a class without __int__
        expected = int(spec.type)  # type: ignore[call-overload]
        if int(a.type) != expected:
            raise fail(f"attribute {a.name!r} must be of type {_attribute_type_name(expected)}, not "
                       f"{_attribute_type_name(a.type)}.")
    missing = sorted(name for name, spec in schema.attributes.items() if spec.required and name not in seen)
    if missing:
        raise fail(f"required attribute(s) {', '.join(map(repr, missing))} of {op} missing.")
    for a in node.attribute:
        if _OUTPUT_COUNTS.get(node.op_type) == a.name and a.i != len(node.output):
            raise fail(f"attribute {a.name!r} is {a.i}, but the node has {len(node.output)} output(s).")


# Attributes that give an op's output count. onnx 1.23's shape inference aborts the process on a
# Split whose num_outputs exceeds its outputs (onnx/onnx#8255), so they are checked first.
_OUTPUT_COUNTS = {"Split": "num_outputs"}


def _check_attributes(node: onnx.NodeProto, desc: str, where: str) -> None:
    for a in node.attribute:
        for k, text in enumerate([a.s] + list(a.strings)):
            try:
                text.decode()
            except UnicodeDecodeError:
                index = f"[{k - 1}]" if k else ""
                raise OnnxImportError(f"{where}{desc} attribute {a.name!r}{index} is not valid UTF-8 text: "
                                      f"{text[:60]!r}.") from None
        if a.type == onnx.AttributeProto.TENSOR or a.HasField("t"):
            check_tensor(a.t, f"{where}{desc} attribute {a.name!r}", any_type=True)
        for k, t in enumerate(a.tensors):
            check_tensor(t, f"{where}{desc} attribute {a.name!r}[{k}]", any_type=True)
        if a.HasField("sparse_tensor"):
            check_tensor(a.sparse_tensor.values, f"{where}{desc} attribute {a.name!r} (values)", any_type=True)
            check_tensor(a.sparse_tensor.indices, f"{where}{desc} attribute {a.name!r} (indices)", any_type=True)
