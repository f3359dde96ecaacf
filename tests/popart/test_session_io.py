"""An InferenceSession's anchors are copied once, from the device into the user's PyStepIO arrays:
where an anchor's host buffer holds exactly its stream's slices (ALL, EveryN 1, any anchor of a
one-step run) the engine writes the user's array itself; other anchors, and user arrays that are
strided, read-only or overlap another buffer, go through the session's stream
buffer, with the same values. Also: popart reaches popxl's Session through its public API only."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
from onnx import helper

import popart
import popxl
from popart_helpers import make_model

N = helper.make_node
rng = np.random.default_rng(11)
W = rng.standard_normal((2, 3)).astype(np.float32)
X4 = rng.standard_normal((4, 2, 3)).astype(np.float32)


def _session(anchors, bps: int) -> popart.InferenceSession:
    """h = x * w; y = h + 1, x: float32[2, 3]."""
    model = make_model([N("Mul", ["x", "w"], ["h"]), N("Add", ["h", "one"], ["y"])],
                       {"x": np.zeros((2, 3), np.float32)}, ["y"], {"w": W, "one": np.float32(1.0)})
    s = popart.InferenceSession(model.SerializeToString(), popart.DataFlow(bps, anchors),
                                popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.weightsFromHost()
    return s


@pytest.fixture
def engine_buffers(monkeypatch) -> List[Dict]:
    """The output buffers each popxl run_with_outputs was given, by stream."""
    seen: List[Dict] = []
    original = popxl.Session.run_with_outputs

    def spy(self, inputs=None, outputs=None, downcast_inputs=True):
        seen.append(dict(outputs or {}))
        return original(self, inputs, outputs, downcast_inputs)
    monkeypatch.setattr(popxl.Session, "run_with_outputs", spy)
    return seen


def _written(s: popart.InferenceSession, given: Dict, arrays: Dict[str, np.ndarray], name: str) -> bool:
    """Whether the engine was given (a view of) the user's array of anchor ``name``."""
    return np.shares_memory(given[s._anchors[name].stream], arrays[name])


def test_the_engine_writes_the_users_anchor_arrays(engine_buffers):
    s = _session({"y": popart.AnchorReturnType("ALL"), "h": popart.AnchorReturnType("EveryN", 1)}, bps=4)
    arrays = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": X4}, arrays))
    (given,) = engine_buffers
    assert _written(s, given, arrays, "y") and _written(s, given, arrays, "h")
    np.testing.assert_allclose(arrays["y"], X4 * W + 1, rtol=1e-6)
    np.testing.assert_allclose(arrays["h"], X4 * W, rtol=1e-6)
    # new arrays for the next run are written in place too
    again = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": X4[::-1].copy()}, again))
    assert _written(s, engine_buffers[1], again, "y")
    np.testing.assert_allclose(again["y"], X4[::-1] * W + 1, rtol=1e-6)
    np.testing.assert_allclose(arrays["y"], X4 * W + 1, rtol=1e-6)  # the first run's arrays are left alone
    s.detach()


def test_a_one_step_run_writes_every_kind_of_anchor_in_place(engine_buffers):
    kinds = {"y": "ALL", "h": "SUM", "x": "FINAL"}
    s = _session({k: popart.AnchorReturnType(v) for k, v in kinds.items()}, bps=1)
    arrays = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": X4[0]}, arrays))
    assert all(_written(s, engine_buffers[0], arrays, k) for k in kinds)
    np.testing.assert_allclose(arrays["y"], X4[0] * W + 1, rtol=1e-6)
    np.testing.assert_allclose(arrays["h"], X4[0] * W, rtol=1e-6)
    np.testing.assert_array_equal(arrays["x"], X4[0])
    s.detach()


def test_anchors_that_keep_part_of_the_stream_go_through_the_session_buffer(engine_buffers):
    s = _session({"y": popart.AnchorReturnType("EveryN", 2), "h": popart.AnchorReturnType("SUM"),
                  "x": popart.AnchorReturnType("FINAL")}, bps=4)
    arrays = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": X4}, arrays))
    assert not any(_written(s, engine_buffers[0], arrays, k) for k in arrays)
    np.testing.assert_allclose(arrays["y"], X4[[1, 3]] * W + 1, rtol=1e-6)
    np.testing.assert_allclose(arrays["h"], (X4 * W).sum(0), rtol=1e-5)
    np.testing.assert_array_equal(arrays["x"], X4[-1])
    s.detach()


def test_user_arrays_the_engine_cannot_write_are_filled_by_a_copy(engine_buffers):
    s = _session({"y": popart.AnchorReturnType("ALL"), "x": popart.AnchorReturnType("ALL"),
                  "h": popart.AnchorReturnType("ALL")}, bps=4)
    x = X4.copy()
    strided = np.zeros((4, 3, 2), np.float32).transpose(0, 2, 1)  # not C-contiguous
    h = np.zeros((8, 2, 3), np.float32)[::2]  # strided too
    arrays = {"y": strided, "x": x, "h": h}  # x: the input array itself, which the engine must not write while reading it
    s.run(popart.PyStepIO({"x": x}, arrays))
    assert not any(_written(s, engine_buffers[0], arrays, k) for k in arrays)
    np.testing.assert_allclose(strided, X4 * W + 1, rtol=1e-6)
    np.testing.assert_array_equal(x, X4)
    np.testing.assert_allclose(h, X4 * W, rtol=1e-6)
    s.detach()


@pytest.mark.parametrize("dtype", [np.int8, np.float64, np.float16])
def test_anchor_arrays_of_another_dtype_are_refused(dtype):
    # A cast into them would wrap or round silently (PopART copies raw bytes: the dtype must match).
    s = _session({"y": popart.AnchorReturnType("ALL")}, bps=4)
    arrays = {"y": np.full((4, 2, 3), 7, dtype)}
    with pytest.raises(popart.StepIOError, match=rf"the output buffer of anchor 'y' has dtype {np.dtype(dtype)}, "
                                                 r"expected float32"):
        s.run(popart.PyStepIO({"x": X4}, arrays))
    assert (arrays["y"] == 7).all()  # untouched
    s.detach()


def test_callbacks_get_every_value():
    s = _session({"y": popart.AnchorReturnType("ALL")}, bps=4)
    it = iter(X4)
    got = []

    def output(tid):
        got.append(np.zeros((2, 3), np.float32))
        return got[-1]
    s.run(popart.PyStepIOCallback(lambda tid, prefetch: next(it), lambda tid: None, output, lambda tid: None))
    np.testing.assert_allclose(np.stack(got), X4 * W + 1, rtol=1e-6)
    s.detach()


def test_popart_uses_only_popxls_public_api():
    """No private member of popxl.Session (or of its compiled program or engine) is reached from popart's
    session modules."""
    root = Path(popart.__file__).parent
    for name in ("session.py", "training.py", "program.py", "stepio.py", "weights.py", "report.py"):
        text = (root / name).read_text()
        found = re.findall(r"\b(?:_px|px|session)\._[a-z]\w*|\._(?:exe|engine)\b|_host_data_value|_all_graphs", text)
        assert not found, (name, found)
