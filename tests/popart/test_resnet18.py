"""A ResNet-18 (conv + BatchNormalization + Relu blocks, residual Add, MaxPool, GlobalAveragePool,
Flatten, Gemm), the benchmark's ONNX model at a small image size, imported through
`popart.InferenceSession`, against ONNX Runtime: the same logits within float32 tolerance, also
after new weights are written to the device. And the same network as PyTorch exports it (batch
norms folded into the Conv weights and biases): as fast a program (every convolution one
conv_fused op, activations channels-last between them) with the same logits."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import popart
from benchmarks.workloads.cnn import make_input, resnet18_onnx

BATCH, IMAGE = 2, 64


def _ort_logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    # Twenty layers of float32 convolutions, summed in different orders by the two libraries.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return resnet18_onnx(batch=BATCH, image=IMAGE)


def _session(model: onnx.ModelProto) -> popart.InferenceSession:
    s = popart.InferenceSession(model.SerializeToString(), popart.DataFlow(2, {"logits": popart.AnchorReturnType("All")}),
                                popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.weightsFromHost()
    return s


@pytest.fixture(scope="module")
def session(model):
    s = _session(model)
    yield s
    s.detach()


def _run(session, batches: np.ndarray) -> np.ndarray:
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": batches}, anchors))
    return anchors["logits"]


def test_resnet18_matches_onnxruntime(model, session):
    batches = np.stack([make_input(seed, BATCH, IMAGE) for seed in (1, 2)])
    got = _run(session, batches)
    assert got.shape == (2, BATCH, 1000)
    for step in range(2):
        _assert_close(got[step], _ort_logits(model, batches[step]))


def test_resnet18_matches_onnxruntime_after_writing_weights(model, session):
    """New convolution weights and BatchNormalization statistics reach the device computation."""
    rng = np.random.default_rng(7)
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    new = {}
    for init in changed.graph.initializer:
        if init.name.startswith("s1b0c1.") or init.name.startswith("stem."):
            a = numpy_helper.to_array(init)
            a = (np.abs(a) if init.name.endswith(".var") else a) * rng.uniform(0.5, 1.5, a.shape).astype(np.float32)
            new[init.name] = a.astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(new[init.name], init.name))
    session.writeWeights(popart.PyWeightsIO(new))
    session.weightsFromHost()
    x = make_input(3, BATCH, IMAGE)
    got = _run(session, np.stack([x, x]))
    _assert_close(got[1], _ort_logits(changed, x))
    # and back through resetHostWeights
    session.resetHostWeights(model)
    session.weightsFromHost()
    _assert_close(_run(session, np.stack([x, x]))[0], _ort_logits(model, x))


def test_resnet18_with_folded_batch_norms_fuses_and_matches_onnxruntime():
    model = resnet18_onnx(batch=BATCH, image=IMAGE, folded=True)
    s = _session(model)
    exe = s._px.executable
    ops = [i for g in exe.graphs for i in g["program"] if i.get("type") in ("conv", "conv_fused", "add", "relu")]
    types = [i["type"] for i in ops]
    # 20 convolutions, each with its bias (and relu / residual add) fused; nothing else left on activations
    assert types == ["conv_fused"] * 20, types
    assert sum(1 for i in ops if "nhwc" in (i["attrs"].get("layouts") or ())) == 20
    x = make_input(4, BATCH, IMAGE)
    got = _run(s, np.stack([x, x]))
    s.detach()
    _assert_close(got[0], _ort_logits(model, x))
    _assert_close(got[1], got[0])
