"""popart's sessions transform their programs through popxl's one transform pipeline
(popxl.transforms.PIPELINE, applied by popxl.Session): InferenceSession marks its step graph
'inference' (convolutions fused, weight computations hoisted out of the batchesPerStep loop) and
transforms nothing itself; TrainingSession's program gets the passes for every program only."""
from __future__ import annotations

import numpy as np
import popxl
import popxl.session
from onnx import helper
from popxl.transforms import PIPELINE, pipeline
from popxl.transforms.pipeline import Pass, Pipeline

import popart
from popart_helpers import make_model

N = helper.make_node
rng = np.random.default_rng(5)
WEIGHTS = {"cw": rng.standard_normal((4, 2, 3, 3)).astype(np.float32) * 0.3,
           "bs": rng.random(4).astype(np.float32) + 0.5, "bb": rng.standard_normal(4).astype(np.float32),
           "bm": rng.standard_normal(4).astype(np.float32) * 0.1, "bv": rng.random(4).astype(np.float32) + 0.5}


def _conv_model():
    nodes = [N("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1]), N("BatchNormalization", ["c", "bs", "bb", "bm", "bv"], ["b"]),
             N("Relu", ["b"], ["y"])]
    return make_model(nodes, {"x": np.zeros((1, 2, 5, 5), np.float32)}, ["y"], WEIGHTS, opset=14)


def _inference(bps: int = 2) -> popart.InferenceSession:
    return popart.InferenceSession(_conv_model().SerializeToString(),
                                   popart.DataFlow(bps, {"y": popart.AnchorReturnType("All")}),
                                   popart.DeviceManager().createCpuDevice())


def _training() -> popart.TrainingSession:
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = b.addInitializedInputTensor(rng.standard_normal((3, 2)).astype(np.float32), "w")
    loss = b.aiGraphcore.l1loss([b.aiOnnx.matmul([x, w])], 0.1)
    return popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                                  popart.ConstSGD(0.1), popart.DeviceManager().createCpuDevice())


def _types(graph) -> list:
    return [op.type for op in graph.ops]


def test_inference_session_marks_its_step_graph_and_the_pipeline_fuses_it():
    s = _inference()
    (step,) = [op.attrs["graph"] for op in s._ir.main_graph.ops if op.type == "repeat"]
    assert pipeline.is_marked(step, pipeline.INFERENCE)
    # building transforms nothing: the convolution is fused when the Session is made
    assert "conv" in _types(step) and "batch_norm_inference" in _types(step)
    s.prepareDevice()
    record = s._px.transforms_applied
    assert [r.name for r in record] == PIPELINE.names()
    assert record["fuse_conv"].ran and record["fuse_conv"].changes["conv_fused"] == 1
    assert record["hoist_invariants"].ran
    assert _types(step) == ["host_load", "conv_fused", "host_store"]
    assert "sqrt" in _types(s._ir.main_graph)  # the folding runs before the loop
    x = rng.standard_normal((2, 1, 2, 5, 5)).astype(np.float32)
    arrays = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, arrays))
    c = np.stack([_conv_nchw(xi[0], WEIGHTS["cw"]) for xi in x])
    sc = WEIGHTS["bs"] / np.sqrt(WEIGHTS["bv"] + 1e-5)
    want = np.maximum((c - WEIGHTS["bm"][:, None, None]) * sc[:, None, None] + WEIGHTS["bb"][:, None, None], 0)
    np.testing.assert_allclose(arrays["y"][:, 0], want, rtol=1e-4, atol=1e-4)
    s.detach()


def _conv_nchw(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 convolution, padding 1, of one (C, H, W) image."""
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (1, 1), (1, 1))), (3, 3), axis=(1, 2))
    return np.einsum("chwij,ocij->ohw", windows, w)


def test_training_session_gets_the_passes_for_every_program_only():
    s = _training()
    s.prepareDevice()
    record = s._px.transforms_applied
    assert not record["fuse_conv"].ran and not record["hoist_invariants"].ran
    assert record.ran == [n for n in PIPELINE.names() if n not in ("fuse_conv", "hoist_invariants")]
    s.detach()


def test_both_sessions_apply_popxls_pipeline(monkeypatch):
    """Whatever the pipeline holds is what popart's sessions apply: they have no transform list of their own."""
    seen = []
    probe = Pass("probe", "records the programs it sees", lambda ir, graphs: seen.append((ir, graphs)),
                 mark=pipeline.INFERENCE)
    monkeypatch.setattr(popxl.session, "PIPELINE", Pipeline([probe, *PIPELINE]))
    inference, training = _inference(), _training()
    for s in (inference, training):
        s.prepareDevice()
        assert [r.name for r in s._px.transforms_applied] == ["probe", *PIPELINE.names()]
    (step,) = [op.attrs["graph"] for op in inference._ir.main_graph.ops if op.type == "repeat"]
    assert seen == [(inference._ir, [step])]  # training marks nothing: the probe was skipped
    assert not training._px.transforms_applied["probe"].ran
    for s in (inference, training):
        s.detach()
