"""Helpers for the popart tests: build small ONNX models with onnx.helper and run them both in an
InferenceSession and in ONNX's reference evaluator (the oracle)."""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import popart


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, np.ndarray], outputs: Sequence[str],
               initializers: Optional[Mapping[str, np.ndarray]] = None, opset: int = 17,
               input_shapes: Optional[Mapping[str, Optional[List]]] = None) -> onnx.ModelProto:
    """A model whose inputs are declared with the dtype and shape of the example arrays
    (``input_shapes`` overrides a declared shape, None leaving it unknown)."""
    input_shapes = dict(input_shapes or {})
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                         input_shapes.get(k, list(v.shape)))
           for k, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), "test", vis, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
              outputs: Optional[Sequence[str]] = None) -> List[np.ndarray]:
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(list(outputs) if outputs else None, dict(feeds))]


def make_session(model: onnx.ModelProto, outputs: Optional[Sequence[str]] = None, steps: int = 1,
                 input_shape_info: Optional[popart.InputShapeInfo] = None
                 ) -> Tuple[popart.InferenceSession, Dict[str, np.ndarray]]:
    """A prepared InferenceSession on the CPU device, anchoring ``outputs`` (ALL; None: every graph
    output) for ``steps`` batches, and its anchor arrays."""
    outputs = [o.name for o in model.graph.output] if outputs is None else outputs
    df = popart.DataFlow(steps, {o: popart.AnchorReturnType("All") for o in outputs})
    kwargs = {"inputShapeInfo": input_shape_info} if input_shape_info is not None else {}
    s = popart.InferenceSession(model.SerializeToString(), df, popart.DeviceManager().createCpuDevice(), **kwargs)
    s.prepareDevice()
    s.weightsFromHost()
    return s, s.initAnchorArrays()


def run_session(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], outputs: Sequence[str],
                input_shape_info: Optional[popart.InputShapeInfo] = None) -> List[np.ndarray]:
    """One batch through an InferenceSession on the CPU device, anchoring ``outputs`` (ALL)."""
    s, anchors = make_session(model, outputs, input_shape_info=input_shape_info)
    s.run(popart.PyStepIO(dict(feeds), anchors))
    return [anchors[o] for o in outputs]


def run_nodes(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, np.ndarray],
              inits: Optional[Mapping[str, np.ndarray]] = None, opset: int = 17,
              outputs: Optional[Sequence[str]] = None) -> List[np.ndarray]:
    """Import and run a model of ``nodes`` (fed ``inputs``, with initializers ``inits``); ``outputs``
    defaults to the last node's. For tests of import errors as much as of results."""
    outputs = [o for o in nodes[-1].output if o] if outputs is None else list(outputs)
    return run_session(make_model(nodes, inputs, outputs, inits, opset), inputs, outputs)


def check_against_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], outputs: Sequence[str],
                            rtol: float = 1e-5, atol: float = 1e-5) -> None:
    got = run_session(model, feeds, outputs)
    want = reference(model, feeds, outputs)
    for name, g, w in zip(outputs, got, want):
        assert g.shape == w.shape, f"{name}: shape {g.shape} != reference {w.shape}"
        if w.dtype == np.bool_:
            np.testing.assert_array_equal(g, w, err_msg=name)
        elif w.dtype.kind in "iu":
            np.testing.assert_array_equal(g.astype(np.int64), w.astype(np.int64), err_msg=name)
        else:
            np.testing.assert_allclose(g, w.astype(g.dtype), rtol=rtol, atol=atol, err_msg=name)


def small_cnn(batch: int = 2):
    """conv - batchnorm - relu - maxpool - flatten - gemm - softmax, with random weights."""
    r = np.random.default_rng(3)
    inits = {"cw": r.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
             "cb": r.standard_normal(8).astype(np.float32),
             "bs": r.random(8).astype(np.float32) + 0.5, "bb": r.standard_normal(8).astype(np.float32),
             "bm": r.standard_normal(8).astype(np.float32) * 0.1, "bv": r.random(8).astype(np.float32) + 0.5,
             "gw": r.standard_normal((10, 8 * 4 * 4)).astype(np.float32) * 0.1,
             "gb": r.standard_normal(10).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["input.1", "cw", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "bs", "bb", "bm", "bv"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["logits"], transB=1, name="fc"),
             helper.make_node("Softmax", ["logits"], ["output"], axis=1, name="softmax")]
    # Opset 14: ONNX's reference evaluator runs BatchNormalization-9..13 in training mode.
    return make_model(nodes, {"input.1": np.zeros((batch, 3, 8, 8), np.float32)}, ["output"], inits, opset=14)
