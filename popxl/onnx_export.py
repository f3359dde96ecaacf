"""ONNX export of a ``popxl.Ir``, to open a program in Netron or run it elsewhere.

    model = popxl.export_onnx(ir, "program.onnx")

What becomes what:
- host-to-device streams that ``host_load`` reads are the model's inputs (one transfer's shape);
  every ``host_store`` writes a model output named after its stream (``<stream>__1`` ... when a
  stream is written more than once); variables and main-graph constants are initializers;
- an op with an ONNX equivalent becomes that op (``_ONNX`` below; in-place ops become their
  out-of-place ONNX op, as ONNX values are never written twice);
- every other op (var updates, losses, collectives, remote buffers, random ops ...) is a node of
  the custom domain ``ai.graphcore`` (PopART's) with popxl's op name and attributes, so Netron
  shows it with its inputs, outputs and attributes;
- a graph that ops call is a model-local ONNX function (domain ``popxl.graphs``) called by
  ``call``; ``repeat`` and ``if`` nodes (``ai.graphcore``) name their bodies' functions in their
  ``graph`` / ``then_graph`` / ``else_graph`` attributes.

A model whose ops all have ONNX equivalents (calls included: popart's importer expands local
functions) runs in ``popart.InferenceSession`` and ONNX Runtime.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from popxl.graph import Graph, op_called_graphs
from popxl.ir import Ir
from popxl.visualize.listing import format_attr

if TYPE_CHECKING:  # pragma: no cover
    from popxl.op import Op
    from popxl.tensor import Constant, Variable

__all__ = ["export_onnx", "GRAPHCORE_DOMAIN", "GRAPHS_DOMAIN", "OPSET"]

GRAPHCORE_DOMAIN = "ai.graphcore"  # PopART's own ops
GRAPHS_DOMAIN = "popxl.graphs"  # the functions made from popxl's subgraphs
OPSET = 20  # Gelu is an ONNX op from opset 20


def _onnx_type(dtype: Any) -> int:
    if dtype.name in ("float8_143", "float8_152"):
        return onnx.TensorProto.FLOAT8E4M3FNUZ if dtype.name == "float8_143" else onnx.TensorProto.FLOAT8E5M2FNUZ
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype.as_numpy()))


class _Body:
    """The nodes of one ONNX graph or function being written; how it holds constants differs."""

    def __init__(self, exporter: "_Exporter", is_function: bool) -> None:
        self.exporter, self.is_function = exporter, is_function
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self.counter = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}__{self.counter}"

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.add_const(np.asarray(value), name)
        return name

    def add_const(self, value: np.ndarray, name: str) -> None:
        tensor = numpy_helper.from_array(np.array(value, order="C"), name)  # (ascontiguousarray makes 0-d 1-d)
        if self.is_function:  # functions hold no initializers
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.initializers.append(tensor)

    def node(self, op_type: str, inputs: List[str], outputs: List[str], domain: str = "", **attrs: Any) -> None:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.fresh(op_type), domain=domain,
                                           **{k: v for k, v in attrs.items() if v is not None}))


Converter = Callable[["Op", List[str], List[str], _Body], None]


def _same(onnx_type: str, **fixed: Any) -> Converter:
    return lambda op, ins, outs, body: body.node(onnx_type, ins, outs, **fixed)


def _reduce(onnx_type: str) -> Converter:
    def convert(op, ins, outs, body):  # from opset 18 every Reduce* takes its axes as an input
        axes = body.const(np.asarray(op.attrs["axis"], np.int64), "axes")
        body.node(onnx_type, [ins[0], axes], outs, keepdims=int(bool(op.attrs["keepdims"])))
    return convert


def _reshape(op, ins, outs, body):
    body.node("Reshape", [ins[0], body.const(np.asarray(op.attrs["shape"], np.int64), "shape")], outs)


def _clip(op, ins, outs, body):
    dtype = np.dtype(op.inputs[0].dtype.as_numpy())
    lo = body.const(np.asarray(op.attrs["min"], dtype), "min")
    hi = body.const(np.asarray(op.attrs["max"], dtype), "max")
    body.node("Clip", [ins[0], lo, hi], outs)


def _cast(op, ins, outs, body):
    body.node("Cast", ins, outs, to=_onnx_type(op.attrs["data_type"]))


def _scaled_add(op, ins, outs, body):
    """a * x + b * y, with the scales as constants or (popxl allows it) tensors."""
    dtype = np.dtype(op.inputs[0].dtype.as_numpy())
    scale_tensors = iter(ins[2:])  # a scale given as a tensor (attribute None) is an extra input
    terms = []
    for value, key in zip(ins[:2], ("a", "b")):
        scale = op.attrs[key]
        if scale == 1:
            terms.append(value)
            continue
        factor = next(scale_tensors) if scale is None else body.const(np.asarray(scale, dtype), key)
        terms.append(body.fresh("scaled"))
        body.node("Mul", [value, factor], [terms[-1]])
    body.node("Add", terms, outs)


# popxl op -> ONNX (default domain, opset OPSET). Ops not here go to the ai.graphcore domain.
_ONNX: Dict[str, Converter] = {
    **{name: _same(onnx_type) for names, onnx_type in (
        (("add", "add_"), "Add"), (("sub",), "Sub"), (("mul",), "Mul"), (("div",), "Div"), (("pow",), "Pow"),
        (("negate",), "Neg"), (("abs",), "Abs"), (("exp", "exp_"), "Exp"), (("log",), "Log"), (("sqrt",), "Sqrt"),
        (("relu", "relu_"), "Relu"), (("sigmoid",), "Sigmoid"), (("tanh",), "Tanh"), (("sin",), "Sin"),
        (("cos",), "Cos"), (("floor",), "Floor"), (("ceil",), "Ceil"), (("sign",), "Sign"),
        (("matmul",), "MatMul"), (("identity", "detach", "detach_"), "Identity"), (("equal",), "Equal"),
        (("greater",), "Greater"), (("where",), "Where"), (("logical_and",), "And"), (("logical_or",), "Or"),
        (("logical_not",), "Not"), (("isnan",), "IsNaN"), (("isinf",), "IsInf"), (("maximum",), "Max"),
        (("add_n",), "Sum"), (("bitwise_not",), "BitwiseNot"), (("bitwise_and",), "BitwiseAnd"),
        (("bitwise_or",), "BitwiseOr"), (("bitwise_xor",), "BitwiseXor"))
       for name in names},
    "gelu": _same("Gelu", approximate="tanh"), "gelu_": _same("Gelu", approximate="tanh"),
    "geluerf": _same("Gelu"), "geluerf_": _same("Gelu"),
    "softmax": lambda op, ins, outs, body: body.node("Softmax", ins, outs, axis=int(op.attrs["axis"])),
    "transpose": lambda op, ins, outs, body: body.node("Transpose", ins, outs, perm=list(op.attrs["permutation"])),
    "transpose_": lambda op, ins, outs, body: body.node("Transpose", ins, outs, perm=list(op.attrs["permutation"])),
    "concat": lambda op, ins, outs, body: body.node("Concat", ins, outs, axis=int(op.attrs["axis"])),
    "gather": lambda op, ins, outs, body: body.node("Gather", ins, outs, axis=int(op.attrs["axis"])),
    "reshape": _reshape, "reshape_": _reshape, "clip": _clip, "cast": _cast,
    "scaled_add": _scaled_add, "scaled_add_": _scaled_add,
    "sum": _reduce("ReduceSum"), "mean": _reduce("ReduceMean"), "max": _reduce("ReduceMax"),
    "min": _reduce("ReduceMin"), "prod": _reduce("ReduceProd"),
}


def _attribute(value: Any) -> Any:
    """An attribute of a custom-domain node: what ONNX can hold as is, else readable text."""

    if isinstance(value, Graph):
        return _function_name(value)
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, float, str, np.integer, np.floating)):
        return value.item() if isinstance(value, np.generic) else value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                         for v in value):
        return [int(v) for v in value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (float, int)) for v in value):
        return [float(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return numpy_helper.from_array(value)
    return format_attr(value)


def _function_name(graph: "Graph") -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", graph.id).strip("_") or "graph"


class _Exporter:
    def __init__(self, ir: "Ir") -> None:
        self.ir = ir
        self.functions: Dict[str, onnx.FunctionProto] = {}
        # Streams and tensors have names of their own in popxl, one namespace in ONNX.
        self.stream_names = {s.tensor_id for s in (*ir.get_all_h2d_streams(), *ir.get_all_d2h_streams())}

    def name(self, t: Any) -> str:
        return t.id + "__tensor" if t.id in self.stream_names else t.id

    def function(self, graph: "Graph") -> str:
        name = _function_name(graph)
        if name not in self.functions:
            self.functions[name] = None  # type: ignore[assignment]  # (a graph that calls itself stops here)
            body = _Body(self, is_function=True)
            for c in graph.constants:
                body.add_const(c._host_data_value, self.name(c))
            for op in graph.ops:
                self.op(op, body)
            outputs = self.outputs_of(graph, body)
            self.functions[name] = helper.make_function(
                GRAPHS_DOMAIN, name, [self.name(t) for t in graph.inputs], outputs, body.nodes,
                opset_imports=self.opsets(), doc_string=f"popxl graph {graph.id}")
        return name

    def outputs_of(self, graph: "Graph", body: _Body) -> List[str]:
        """Output names; an output that is also an input (or a repeated output) gets an Identity."""
        names, seen = [], {self.name(t) for t in graph.inputs}
        for t in graph.outputs:
            name = self.name(t)
            if name in seen:
                name = body.fresh(name)
                body.node("Identity", [self.name(t)], [name])
            seen.add(name)
            names.append(name)
        return names

    def opsets(self) -> List[onnx.OperatorSetIdProto]:
        return [helper.make_opsetid("", OPSET), helper.make_opsetid(GRAPHCORE_DOMAIN, 1),
                helper.make_opsetid(GRAPHS_DOMAIN, 1)]

    def op(self, op: "Op", body: _Body) -> None:

        ins = [self.name(t) for t in op.inputs]
        outs = [self.name(t) for t in op.outputs]
        if op.type == "call":
            callee = op.attrs["graph"]
            bound = [""] * len(callee.inputs)
            for pos, name in zip(op.attrs["input_index"], ins):
                bound[pos] = name
            while bound and bound[-1] == "":
                bound.pop()
            body.node(self.function(callee), bound, outs, domain=GRAPHS_DOMAIN)
        elif op.type in _ONNX:
            _ONNX[op.type](op, ins, outs, body)
        else:
            for called in op_called_graphs(op):
                self.function(called)
            attrs = {k: _attribute(v) for k, v in op.attrs.items() if v is not None}
            body.node(op.type, ins, outs, domain=GRAPHCORE_DOMAIN, **attrs)

    def graph(self) -> onnx.GraphProto:
        ir = self.ir
        main = ir.main_graph
        body = _Body(self, is_function=False)
        inputs, outputs = [], []
        written: Dict[str, int] = {}
        held: List[Union[Variable, Constant]] = [*main.variables, *main.constants]
        for t in held:
            body.add_const(t._host_data_value, self.name(t))
        seen_streams = set()
        for op in main.ops:
            if op.type not in ("host_load", "host_store"):
                self.op(op, body)
                continue
            stream = op.attrs["stream"]
            if op.type == "host_load":
                if stream.tensor_id not in seen_streams:
                    seen_streams.add(stream.tensor_id)
                    inputs.append(helper.make_tensor_value_info(stream.tensor_id, _onnx_type(stream.dtype),
                                                                list(stream.shape)))
                body.node("Identity", [stream.tensor_id], [self.name(op.outputs[0])])
            else:
                n = written.get(stream.tensor_id, 0)
                written[stream.tensor_id] = n + 1
                name = stream.tensor_id if n == 0 else f"{stream.tensor_id}__{n}"
                body.node("Identity", [self.name(op.inputs[0])], [name])
                outputs.append(helper.make_tensor_value_info(name, _onnx_type(stream.dtype), list(stream.shape)))
        return helper.make_graph(body.nodes, f"popxl_ir_{ir.id}", inputs, outputs, body.initializers)


def export_onnx(ir: "Ir", path: Optional[Union[str, Path]] = None) -> onnx.ModelProto:
    """The program as an ONNX model (opset 20, PopART's ``ai.graphcore`` domain for popxl-only ops,
    subgraphs as local functions); also written to ``path`` if given.

    Args:
        ir: The program exported.
        path: Where to write the model; not written when None.

    Returns:
        The ONNX model.

    Raises:
        TypeError: If ``ir`` is not an Ir.
        ValueError: If the main graph has no ops.
    """

    if not isinstance(ir, Ir):
        raise TypeError(f"export_onnx needs a popxl.Ir, not {type(ir).__name__}.")
    if not ir.main_graph.ops:
        raise ValueError(f"export_onnx: {ir!r} has no ops in its main graph; there is nothing to export.")
    exporter = _Exporter(ir)
    graph = exporter.graph()
    model = helper.make_model(graph, opset_imports=exporter.opsets(), producer_name="popxl-cpu",
                              functions=[f for f in exporter.functions.values()])
    model.ir_version = min(model.ir_version, 10)
    if path is not None:
        onnx.save(model, str(path))
    return model
