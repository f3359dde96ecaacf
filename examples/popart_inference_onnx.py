"""PopART inference from an ONNX file: load the model, run batches through PyStepIO.

Without arguments the program writes a small ONNX model first (a two-layer MLP made with
``onnx.helper``, into a temporary directory) and checks the session's outputs against NumPy::

    python examples/popart_inference_onnx.py
    python examples/popart_inference_onnx.py --model my_model.onnx   # your model, random inputs

With ``--model`` every graph output is anchored and the inputs are random values of the shapes
and types the model declares (give fixed sizes: dimensions named in the model count as 1).
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import popart

BATCH, FEATURES, HIDDEN, CLASSES = 4, 8, 16, 3


def write_mlp(path: str, seed: int = 0) -> dict:
    """probs = softmax(relu(x @ W1 + b1) @ W2 + b2) as an ONNX file; returns the weights."""
    rng = np.random.default_rng(seed)
    weights = {"W1": rng.standard_normal((FEATURES, HIDDEN)).astype(np.float32) * 0.5,
               "b1": rng.standard_normal(HIDDEN).astype(np.float32) * 0.1,
               "W2": rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32) * 0.5,
               "b2": np.zeros(CLASSES, np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("Gemm", ["a", "W2", "b2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, FEATURES])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [BATCH, CLASSES])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return weights


def run(model_path: str, inputs: dict, batches_per_step: int = 1) -> dict:
    """One step of an InferenceSession over the model, every graph output anchored."""
    outputs = [o.name for o in onnx.load(model_path, load_external_data=False).graph.output]
    data_flow = popart.DataFlow(batches_per_step, {name: popart.AnchorReturnType("All") for name in outputs})
    session = popart.InferenceSession(fnModel=model_path, dataFlow=data_flow,
                                      deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()          # {output name: array to fill}
    session.run(popart.PyStepIO(inputs, anchors))
    return anchors


def random_inputs(model_path: str, seed: int = 0) -> dict:
    model = onnx.load(model_path, load_external_data=False)
    known = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    inputs = {}
    for value in model.graph.input:
        if value.name in known:
            continue
        t = value.type.tensor_type
        shape = [d.dim_value or 1 for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        inputs[value.name] = (rng.integers(0, 2, shape) if np.issubdtype(dtype, np.integer) or dtype == bool
                              else rng.standard_normal(shape)).astype(dtype)
    return inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="an ONNX file to run (default: write and run a small MLP)")
    args = parser.parse_args()
    if args.model:
        for name, value in run(args.model, random_inputs(args.model)).items():
            print(f"{name}: {value.dtype} {list(value.shape)}, mean {value.mean():.4g}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.onnx")
        w = write_mlp(path)
        x = np.random.default_rng(1).standard_normal((BATCH, FEATURES)).astype(np.float32)
        probs = run(path, {"x": x})["probs"]
    logits = np.maximum(x @ w["W1"] + w["b1"], 0) @ w["W2"] + w["b2"]
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)
    print(f"probs of {BATCH} samples (rows sum to 1, equal to NumPy's):\n{np.round(probs, 4)}")


if __name__ == "__main__":
    main()
