"""Edges of the popart session API where values could change silently or a call could corrupt a
run: 64-bit inputs that 32 bits cannot hold, resetHostWeights given tensors of another type, size
or range (all checked before anything is written), a nested run from a callback, and models whose
weights are too large for one protobuf message."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import popart
import popxl
import popxl.ops as ops
from popart import weights as popart_weights
from popart_helpers import make_model

N = helper.make_node
W = np.arange(6, dtype=np.float32).reshape(2, 3) / 10


def _model(extra_init=None):
    """y = x * w + 1 (x: float32[2, 3]); i: an int64 input gathered from a constant row."""
    return make_model([N("Mul", ["x", "w"], ["h"]), N("Add", ["h", "one"], ["y"]),
                       N("Gather", ["table", "i"], ["g"])],
                      {"x": np.zeros((2, 3), np.float32), "i": np.zeros(2, np.int64)}, ["y", "g"],
                      {"w": W, "one": np.float32(1.0), "table": np.arange(8, dtype=np.float32)})


def _session(anchors=("y", "g")):
    s = popart.InferenceSession(_model().SerializeToString(), popart.DataFlow(1, list(anchors)),
                                popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.weightsFromHost()
    return s


def test_int64_inputs_beyond_int32_are_refused_naming_the_input():
    s = _session()
    arrays = s.initAnchorArrays()
    feeds = {"x": np.ones((2, 3), np.float32), "i": np.array([1, 2 ** 40], np.int64)}
    with pytest.raises(popart.StepIOError, match=r"PyStepIO: input 'i' \(int64\) holds 1099511627776, which int32 "
                                                 r"cannot hold .* casting would wrap it"):
        s.run(popart.PyStepIO(feeds, arrays))
    feeds["i"] = np.array([1, 7], np.int64)  # in range: narrowed as before
    s.run(popart.PyStepIO(feeds, arrays))
    np.testing.assert_array_equal(arrays["g"], [1.0, 7.0])


def test_popxl_session_refuses_to_narrow_out_of_range_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        i_s = popxl.h2d_stream((2,), popxl.int32, "ids")
        o_s = popxl.d2h_stream((2,), popxl.int32, "out")
        ops.host_store(o_s, ops.host_load(i_s) + 1)
    with popxl.Session(ir, "ipu_model") as s:
        with pytest.raises(ValueError, match=r"Session.run: the input of stream 'ids' \(int64\) holds -4294967296"):
            s.run({i_s: np.array([5, -2 ** 32], np.int64)})
        np.testing.assert_array_equal(s.run({i_s: np.array([5, -7], np.int64)})[o_s], [6, -6])
    with popxl.Ir().main_graph, pytest.raises(ValueError, match=r"\(uint64\) holds 4294967296, which uint32 cannot "
                                                             r"hold"):
        popxl.variable(np.array([2 ** 32], np.uint64))


def _other_model(init: onnx.TensorProto) -> onnx.ModelProto:
    m = _model()
    for k, t in enumerate(m.graph.initializer):
        if t.name == init.name:
            m.graph.initializer[k].CopyFrom(init)
    return m


@pytest.mark.parametrize("init, message", [
    (helper.make_tensor("w", onnx.TensorProto.STRING, [2, 3], [b"1e3"] * 6),
     "weight 'w' has element type STRING, but the session's weight holds float32"),
    (numpy_helper.from_array(np.full((2, 3), 1e300), "w"),
     "weight 'w' holds 1e\\+300, beyond the range of float32 \\(it would become inf\\)"),
    (numpy_helper.from_array(np.zeros((2, 3), np.int32), "w"), "weight 'w' has element type INT32"),
    (numpy_helper.from_array(np.zeros((3, 2), np.float32), "w"), r"weight 'w' has shape \(3, 2\), the session expects"),
])
def test_reset_host_weights_checks_every_weight_before_writing(init, message):
    s = _session()
    other = _other_model(init)
    other.graph.initializer.append(numpy_helper.from_array(np.full(8, 5.0, np.float32), "table"))  # valid, earlier
    with pytest.raises(popart.popart_exception, match=message):
        s.resetHostWeights(other.SerializeToString())
    w = {"w": np.zeros((2, 3), np.float32)}
    s.readWeights(popart.PyWeightsIO(w))
    np.testing.assert_array_equal(w["w"], W)  # nothing was written


def test_reset_host_weights_names_a_weight_whose_data_does_not_match_its_dims():
    s = _session()
    bad = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    bad.dims[:] = [2, 3]  # 4 values for 6 places
    with pytest.raises(popart.popart_exception, match=r"weight 'w': its data cannot be read as a \[2, 3\] tensor"):
        s.resetHostWeights(_other_model(bad).SerializeToString())


def test_a_run_from_inside_a_run_is_refused():
    s = _session(anchors=("y",))
    nested = []

    def output_cb(tid):
        with pytest.raises(popart.popart_exception, match="Session.run: called while a run of this session is in "
                                                          "progress"):
            s.run(popart.PyStepIOCallback(lambda t, p: np.ones((2, 3), np.float32), lambda t: None,
                                          lambda t: np.zeros((2, 3), np.float32), lambda t: None))
        nested.append(tid)
        return buf

    buf = np.zeros((2, 3), np.float32)
    x = np.full((2, 3), 2.0, np.float32)
    s.run(popart.PyStepIOCallback(lambda t, p: x if t == "x" else np.array([0, 1], np.int64), lambda t: None,
                                  output_cb, lambda t: None))
    assert nested == ["y"]
    np.testing.assert_allclose(buf, x * W + 1, rtol=1e-6)  # the outer run's own values


def test_model_to_host_writes_large_models_with_external_data_and_reads_them_back(tmp_path, monkeypatch):
    monkeypatch.setattr(popart_weights, "EXTERNAL_DATA_BYTES", 16)  # stands for the 2 GB protobuf limit
    s = _session()
    w = {"w": np.full((2, 3), 4.0, np.float32)}
    s.writeWeights(popart.PyWeightsIO(w))
    path = tmp_path / "big.onnx"
    s.modelToHost(str(path))
    assert (tmp_path / "big.onnx.data").is_file()
    saved = onnx.load(str(path))
    stored = {t.name: numpy_helper.to_array(t) for t in saved.graph.initializer}
    np.testing.assert_array_equal(stored["w"], w["w"])
    again = popart.InferenceSession(str(path), popart.DataFlow(1, ["y"]), popart.DeviceManager().createCpuDevice())
    again.prepareDevice()
    again.weightsFromHost()
    arrays = again.initAnchorArrays()
    again.run(popart.PyStepIO({"x": np.ones((2, 3), np.float32), "i": np.zeros(2, np.int64)}, arrays))
    np.testing.assert_allclose(arrays["y"], 5.0)
    assert popart_weights.EXTERNAL_DATA_BYTES < 2 ** 31  # the real threshold stays below protobuf's limit
