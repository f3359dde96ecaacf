"""An ``onnx.backend.base.Backend`` over popart, so ONNX's own backend test suite (and any other
tool written against that interface) can run models on the CPU device.

It is a thin adapter over the public session API, exactly what a user of popart would write:
``prepare`` checks the model, ``run`` builds an ``InferenceSession`` with one ``DataFlow`` batch
and every graph output anchored ("All"), feeds the inputs through ``PyStepIO`` and returns the
outputs in graph-output order. Inputs that decide shapes (a Reshape's shape, a reduction's axes,
...) must be known when a popart program is compiled; the backend interface only gives them at
``run``, so the session is built for their values then (and reused while they stay the same).

The device holds 64-bit values in their 32-bit counterparts (as an IPU does); the ONNX backend
interface promises each output in the type the model declares, so results are converted back to
the declared element type on the host.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

import popart
from popart.onnx import OPS
from popart.onnx.protos import op_key, subgraphs

__all__ = ["PopartBackend", "PopartBackendRep", "prepare", "run_model", "run_node", "supports_device"]


def _declared_dtype(vi: onnx.ValueInfoProto) -> Optional[np.dtype]:
    """The NumPy dtype a graph output is declared with, or None if undeclared/not a tensor."""
    if not vi.type.HasField("tensor_type"):
        return None
    elem = vi.type.tensor_type.elem_type
    if elem == onnx.TensorProto.UNDEFINED:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    except Exception:
        return None


# Inputs that fix the shape of a result or the structure of the computation (axes, shapes, pads,
# sizes, counts): popart compiles a static program, so (as in PopART) these must be known when the
# session is built. Keyed by ONNX op type: the positions of such inputs.
_COMPILE_TIME_INPUTS: Dict[str, Tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "Pad": (1, 3), "Resize": (1, 2, 3), "TopK": (1,), "OneHot": (1,), "CumSum": (1,),
    "CumProd": (1,), "Range": (0, 1, 2), "ConstantOfShape": (0,), "Dropout": (1, 2), "Compress": (1,),
    "CenterCropPad": (1,), "DFT": (1, 2), "STFT": (1, 3), "MelWeightMatrix": (0, 1, 2, 3, 4),
    "Col2Im": (1, 2), "MaxUnpool": (2,), "Loop": (0, 1), "AffineGrid": (1,),
    **{op: (0,) for op in ("HannWindow", "HammingWindow", "BlackmanWindow")},
    **{op: (1,) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                           "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum")},
}


def _outer_reads(graph: onnx.GraphProto) -> Set[str]:
    """The names ``graph`` (and its subgraphs) read but do not define: values of enclosing scopes."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    reads: Set[str] = set()
    for node in graph.node:
        reads |= {x for x in node.input if x and x not in defined}
        for g in subgraphs(node):
            reads |= _outer_reads(g) - defined
        defined |= {o for o in node.output if o}
    return reads


def compile_time_inputs(model: onnx.ModelProto) -> List[str]:
    """The graph inputs whose values a node (at any subgraph depth) needs at a position in
    ``_COMPILE_TIME_INPUTS``: read there directly, or through the nodes that compute that value
    (a control op's results also depend on the outer values its subgraphs read; Shape and Size
    read only their input's shape, which is always known, so the search stops there)."""
    g = model.graph
    inputs = {i.name for i in g.input} - {t.name for t in g.initializer}
    producer: Dict[str, onnx.NodeProto] = {}
    todo: List[str] = []

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            producer.update({o: node for o in node.output if o})
            if node.domain in ("", "ai.onnx"):
                todo.extend(node.input[k] for k in _COMPILE_TIME_INPUTS.get(node.op_type, ())
                            if k < len(node.input) and node.input[k])
            for sub in subgraphs(node):
                visit(sub)

    visit(g)
    found: Dict[str, None] = {}
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found[name] = None
        elif name in producer and producer[name].op_type not in ("Shape", "Size"):
            node = producer[name]
            todo.extend(x for x in node.input if x)
            for sub in subgraphs(node):  # a control op's result also depends on what its subgraphs read
                todo.extend(_outer_reads(sub))
                todo.extend(o.name for o in sub.output)
    return [i.name for i in g.input if i.name in found]


class PopartBackendRep(BackendRep):
    """A model prepared for repeated runs.

    ``run`` builds (once per distinct value of the compile-time inputs, see
    ``_COMPILE_TIME_INPUTS``) an ``InferenceSession`` on the CPU device, anchors every graph output
    ("All", one batch), feeds the other inputs through ``PyStepIO`` and returns the outputs in
    graph-output order. Compile-time inputs given at run time are written into the model as
    Constant nodes, so the session is specialised to their values: the program popart compiles has
    static shapes, and those inputs decide them.
    """

    def __init__(self, model: onnx.ModelProto, device: str = "CPU") -> None:
        self._model = model
        self.outputs: List[str] = [o.name for o in model.graph.output]
        self._out_dtypes = [_declared_dtype(o) for o in model.graph.output]
        initializers = {t.name for t in model.graph.initializer}
        # The inputs the caller feeds, in graph order (initializers listed as inputs are weights).
        self.inputs: List[str] = [i.name for i in model.graph.input if i.name not in initializers]
        self.compile_time_inputs: List[str] = compile_time_inputs(model)
        self._sessions: Dict[Tuple[Any, ...], popart.InferenceSession] = {}

    def run(self, inputs: Union[Sequence[Any], Mapping[str, Any], Any], **kwargs: Any) -> Tuple[Any, ...]:
        feeds = self._feeds(inputs)
        fixed = {k: feeds.pop(k) for k in self.compile_time_inputs}
        session = self._session(fixed)
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO(feeds, anchors))
        values = []
        for name, dt in zip(self.outputs, self._out_dtypes):
            v = np.asarray(anchors[name])
            if dt is not None and v.dtype != dt:
                # popxl returns float8 as raw one-byte codes (a structured dtype, as PopXL does):
                # reinterpret them; everything else (64-bit types held in 32 bits) is converted.
                v = v.view(dt) if v.dtype.names and v.dtype.itemsize == dt.itemsize else v.astype(dt)
            values.append(v)
        return namedtupledict("Outputs", self.outputs)(*values)

    def _session(self, fixed: Dict[str, np.ndarray]) -> popart.InferenceSession:
        key = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(fixed.items()))
        if key not in self._sessions:
            model = self._specialised(fixed) if fixed else self._model
            anchors = {name: popart.AnchorReturnType("All") for name in dict.fromkeys(self.outputs)}
            session = popart.InferenceSession(fnModel=model, dataFlow=popart.DataFlow(1, anchors),
                                              deviceInfo=popart.DeviceManager().createCpuDevice())
            session.prepareDevice()
            session.weightsFromHost()
            self._sessions[key] = session
        return self._sessions[key]

    def _specialised(self, fixed: Dict[str, np.ndarray]) -> onnx.ModelProto:
        """The model with the inputs ``fixed`` replaced by Constant nodes holding their values."""
        model = onnx.ModelProto()
        model.CopyFrom(self._model)
        g = model.graph
        kept = [vi for vi in g.input if vi.name not in fixed]
        del g.input[:]
        g.input.extend(kept)
        consts = [onnx.helper.make_node("Constant", [], [name], name=f"{name}_value",
                                        value=onnx.numpy_helper.from_array(value, name))
                  for name, value in fixed.items()]
        nodes = consts + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
        return model

    def _feeds(self, inputs: Any) -> Dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            inputs = [inputs[k] for k in self.inputs]
        if isinstance(inputs, np.ndarray) and len(self.inputs) == 1:
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) != len(self.inputs):
            raise popart.StepIOError(f"PopartBackendRep.run: the model has {len(self.inputs)} input(s) "
                                     f"{self.inputs}, got {len(inputs)} value(s).")
        # np.array copies: arrays read from TensorProtos are read-only views, which popxl's native
        # engine does not accept as stream inputs.
        return {name: np.array(v) for name, v in zip(self.inputs, inputs)}


class PopartBackend(Backend):
    """ONNX backend running models through ``popart.InferenceSession`` on the CPU device."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device) and all(op_key(n) in OPS for n in model.graph.node)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PopartBackendRep:
        if not cls.supports_device(device):
            raise popart.popart_exception(f"PopartBackend: device {device!r} is not supported (use 'CPU').")
        super().prepare(model, device, **kwargs)  # the ONNX checker
        return PopartBackendRep(model, device)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> Tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Optional[Sequence[Tuple[np.dtype, Tuple[int, ...]]]] = None,
                 **kwargs: Any) -> Tuple[Any, ...]:
        """Run one node: wrapped in a model whose inputs take the dtypes and shapes of ``inputs``."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        arrays = [np.asarray(v) for v in inputs]
        names = [x for x in node.input if x]
        vis = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
               for n, a in zip(names, arrays)]
        outs = []
        for k, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and k < len(outputs_info):
                dt, shape = outputs_info[k]
                outs.append(onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape)))
            else:
                outs.append(onnx.helper.make_empty_tensor_value_info(name))
        opset = int(kwargs.get("opset_version", onnx.defs.onnx_opset_version()))
        graph = onnx.helper.make_graph([node], "run_node", vis, outs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        return PopartBackendRep(model, device).run(arrays)


prepare = PopartBackend.prepare
run_model = PopartBackend.run_model
run_node = PopartBackend.run_node
supports_device = PopartBackend.supports_device
