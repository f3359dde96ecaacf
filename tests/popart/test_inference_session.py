"""InferenceSession: DataFlow / AnchorReturnType buffers and values, PyStepIO and PyStepIOCallback,
devices, options, model loading and import errors."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import popart
from popart.onnx.importer import newest_opset
from popart_helpers import make_model, reference, small_cnn

N = helper.make_node
rng = np.random.default_rng(7)
W = rng.standard_normal((2, 3)).astype(np.float32)


def _model():
    """h = x * w; y = h + 1 (x: float32[2, 3], w a weight)."""
    return make_model([N("Mul", ["x", "w"], ["h"], name="mul"), N("Add", ["h", "one"], ["y"], name="add")],
                      {"x": np.zeros((2, 3), np.float32)}, ["y"], {"w": W, "one": np.float32(1.0)})


def _session(anchors, bps=1, opts=None, device=None, model=None):
    device = device or popart.DeviceManager().createCpuDevice()
    s = popart.InferenceSession((model or _model()).SerializeToString(), popart.DataFlow(bps, anchors), device,
                                userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    return s


# DataFlow and AnchorReturnType --------------------------------------------------------------------------
def test_anchor_return_type_names_are_case_insensitive():
    for name in ("ALL", "All", "all"):
        assert popart.AnchorReturnType(name).id() is popart.AnchorReturnTypeId.ALL
    assert popart.AnchorReturnType("final").id() is popart.AnchorReturnTypeId.FINAL
    assert popart.AnchorReturnType("Sum").id() is popart.AnchorReturnTypeId.SUM
    art = popart.AnchorReturnType("everyn", 2)
    assert art.id() is popart.AnchorReturnTypeId.EVERYN and art.rp() == 2
    with pytest.raises(popart.popart_exception, match="return period"):
        popart.AnchorReturnType("EveryN")
    with pytest.raises(popart.popart_exception, match="unknown return type 'Most'"):
        popart.AnchorReturnType("Most")


def test_dataflow_validates_anchors():
    df = popart.DataFlow(4, ["a", "b"])
    assert df.anchors() == ["a", "b"] and df.batchesPerStep() == 4
    assert df.art("a").id() is popart.AnchorReturnTypeId.ALL and df.isAnchored("b") and not df.isAnchored("c")
    with pytest.raises(popart.popart_exception, match="must divide batchesPerStep=4"):
        popart.DataFlow(4, {"a": popart.AnchorReturnType("EveryN", 3)})
    with pytest.raises(popart.popart_exception, match="AnchorReturnType"):
        popart.DataFlow(4, {"a": "ALL"})


@pytest.mark.parametrize("bps", [1, 4])
def test_anchor_buffers_and_values_by_return_type(bps):
    anchors = {"y": popart.AnchorReturnType("ALL"), "h": popart.AnchorReturnType("SUM"),
               "x": popart.AnchorReturnType("FINAL"), "w": popart.AnchorReturnType("EveryN", 2 if bps > 1 else 1)}
    s = _session(anchors, bps)
    arrays = s.initAnchorArrays()
    lead = (bps,) if bps > 1 else ()
    assert arrays["y"].shape == lead + (2, 3)
    assert arrays["h"].shape == (2, 3) and arrays["x"].shape == (2, 3)
    assert arrays["w"].shape == ((bps // 2,) if bps > 1 else ()) + (2, 3)
    x = rng.standard_normal(lead + (2, 3)).astype(np.float32)
    for _ in range(2):  # SUM restarts every run
        s.run(popart.PyStepIO({"x": x}, arrays))
        xs = x.reshape((bps, 2, 3))
        np.testing.assert_allclose(arrays["y"].reshape(bps, 2, 3), xs * W + 1, rtol=1e-6)
        np.testing.assert_allclose(arrays["h"], (xs * W).sum(0), rtol=1e-5)
        np.testing.assert_array_equal(arrays["x"], xs[-1])
        np.testing.assert_array_equal(arrays["w"], np.broadcast_to(W, arrays["w"].shape))


def test_everyn_returns_batches_n_2n():
    s = _session({"y": popart.AnchorReturnType("EveryN", 3)}, bps=6)
    arrays = s.initAnchorArrays()
    assert arrays["y"].shape == (2, 2, 3)
    x = np.arange(6 * 6, dtype=np.float32).reshape(6, 2, 3)
    s.run(popart.PyStepIO({"x": x}, arrays))
    np.testing.assert_allclose(arrays["y"], x[[2, 5]] * W + 1, rtol=1e-6)


def test_batches_per_step_loops_inside_the_engine():
    s = _session({"y": popart.AnchorReturnType("ALL")}, bps=5)
    repeats = [op for op in s._ir.main_graph._ops if op.type == "repeat"]
    assert len(repeats) == 1 and repeats[0].attrs["repeat_count"] == 5
    assert s._ir.num_host_transfers == 5


def test_replication_and_accumulation_shape_buffers():
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = 3
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2})
    anchors = {"y": popart.AnchorReturnType("All"), "h": popart.AnchorReturnType("Sum"),
               "x": popart.AnchorReturnType("Final"), "w": popart.AnchorReturnType("EveryN", 2)}
    s = _session(anchors, bps=2, opts=opts, device=device)
    assert s.getInputShape("x") == (2, 3, 2, 2, 3)
    arrays = s.initAnchorArrays()
    assert arrays["y"].shape == (2, 3, 2, 2, 3)
    assert arrays["h"].shape == (2, 2, 3) and arrays["x"].shape == (2, 2, 3)
    assert arrays["w"].shape == (3, 2, 2, 3)
    x = rng.standard_normal((2, 3, 2, 2, 3)).astype(np.float32)
    s.run(popart.PyStepIO({"x": x}, arrays))
    np.testing.assert_allclose(arrays["y"], x * W + 1, rtol=1e-6)
    np.testing.assert_allclose(arrays["h"], (x * W).sum((0, 1)), rtol=1e-5)  # per replica
    np.testing.assert_array_equal(arrays["x"], x[-1, -1])
    with pytest.raises(popart.popart_exception, match="at least 2 IPUs"):
        _session(anchors, bps=2, opts=opts)  # the CPU device has one IPU


def test_unknown_anchor_is_named():
    with pytest.raises(popart.popart_exception, match=r"anchors \['nope'\] are not tensors of the model"):
        _session({"nope": popart.AnchorReturnType("ALL")})


# PyStepIO ------------------------------------------------------------------------------------------------
def test_stepio_errors_name_the_tensor_and_the_expected_shape():
    s = _session({"y": popart.AnchorReturnType("ALL")}, bps=2)
    arrays = s.initAnchorArrays()
    with pytest.raises(popart.StepIOError, match=r"input 'x' has shape \(2, 3\), expected \(2, 2, 3\) "
                                                 r"\(batchesPerStep=2 x tensor shape \(2, 3\)\)"):
        s.run(popart.PyStepIO({"x": np.zeros((2, 3), np.float32)}, arrays))
    with pytest.raises(popart.StepIOError, match=r"missing input\(s\) 'x' \(expected shape \(2, 2, 3\)\)"):
        s.run(popart.PyStepIO({}, arrays))
    with pytest.raises(popart.StepIOError, match=r"unknown input\(s\) \['z'\]"):
        s.run(popart.PyStepIO({"x": np.zeros((2, 2, 3), np.float32), "z": np.zeros(1)}, arrays))
    with pytest.raises(popart.StepIOError, match="input 'x' has dtype int32, expected float32"):
        s.run(popart.PyStepIO({"x": np.zeros((2, 2, 3), np.int32)}, arrays))
    with pytest.raises(popart.StepIOError, match=r"no output buffer for anchor\(s\) 'y' \(expected shape"):
        s.run(popart.PyStepIO({"x": np.zeros((2, 2, 3), np.float32)}, {}))
    with pytest.raises(popart.StepIOError, match=r"anchor 'y' has shape \(2, 3\), expected \(2, 2, 3\)"):
        s.run(popart.PyStepIO({"x": np.zeros((2, 2, 3), np.float32)}, {"y": np.zeros((2, 3), np.float32)}))
    assert isinstance(popart.StepIOError("m"), popart.popart_exception)


def test_stepio_callback():
    bps = 3
    s = _session({"y": popart.AnchorReturnType("ALL"), "h": popart.AnchorReturnType("SUM")}, bps=bps)
    x = rng.standard_normal((bps, 2, 3)).astype(np.float32)
    events, results, sent = [], {"y": [], "h": []}, iter(range(bps))

    def input_cb(tid, prefetch):
        events.append(("in", tid))
        return x[next(sent)]

    def output_cb(tid):
        buf = np.zeros((2, 3), np.float32)
        results[tid].append(buf)
        return buf

    s.run(popart.PyStepIOCallback(input_cb, lambda tid: events.append(("in_done", tid)), output_cb,
                                  lambda tid: events.append(("out_done", tid))))
    assert events.count(("in", "x")) == bps and events.count(("in_done", "x")) == bps
    assert events.count(("out_done", "y")) == bps and events.count(("out_done", "h")) == 1
    np.testing.assert_allclose(np.stack(results["y"]), x * W + 1, rtol=1e-6)
    np.testing.assert_allclose(results["h"][0], (x * W).sum(0), rtol=1e-5)
    with pytest.raises(popart.StepIOError, match=r"input_callback\('x'\) returned shape \(3,\), expected \(2, 3\)"):
        s.run(popart.PyStepIOCallback(lambda t, p: np.zeros(3, np.float32), lambda t: None, output_cb,
                                      lambda t: None))


def test_run_before_prepare_device():
    s = popart.InferenceSession(_model().SerializeToString(), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice())
    with pytest.raises(popart.popart_exception, match="call prepareDevice"):
        s.run(popart.PyStepIO({"x": np.zeros((2, 3), np.float32)}, s.initAnchorArrays()))


def test_int64_inputs_are_accepted_and_held_as_int32():
    model = make_model([N("Gather", ["t", "i"], ["y"])], {"i": np.zeros(4, np.int64)}, ["y"],
                       {"t": np.arange(10, dtype=np.float32) * 2})
    s = _session({"y": popart.AnchorReturnType("ALL")}, model=model)
    assert s.getInfo("i").data_type() == "INT32"
    arrays = s.initAnchorArrays()
    s.run(popart.PyStepIO({"i": np.array([3, 0, 9, 1], np.int64)}, arrays))
    np.testing.assert_array_equal(arrays["y"], [6, 0, 18, 2])


# devices --------------------------------------------------------------------------------------------------
def test_device_manager(monkeypatch):
    dm = popart.DeviceManager()
    cpu = dm.createCpuDevice()
    assert cpu.type is popart.DeviceType.Cpu and cpu.numIpus == 1
    model = dm.createIpuModelDevice({"numIPUs": 4, "tilesPerIPU": 1216})
    assert model.type is popart.DeviceType.IpuModel and model.numIpus == 4 and model.tilesPerIpu == 1216
    with pytest.raises(popart.popart_exception, match="unknown option"):
        dm.createIpuModelDevice({"numIpus": 2})
    assert dm.enumerateDevices() == []
    monkeypatch.delenv("POPXL_IPU_HW", raising=False)
    with pytest.raises(popart.popart_exception, match="no IPU hardware is available"):
        dm.acquireAvailableDevice(2, connectionType=popart.DeviceConnectionType.OnDemand)
    with pytest.raises(popart.popart_exception, match="no IPU hardware is available"):
        dm.acquireDeviceById(5)
    monkeypatch.setenv("POPXL_IPU_HW", "cpu")
    dev = dm.acquireAvailableDevice(2, connectionType=popart.DeviceConnectionType.OnDemand)
    assert dev.type is popart.DeviceType.Ipu and dev.numIpus == 2 and not dev.isAttached
    s = _session({"y": popart.AnchorReturnType("ALL")}, device=dev)
    assert dev.isAttached  # attached on demand, when the session loads
    arrays = s.initAnchorArrays()
    x = np.ones((2, 3), np.float32)
    s.run(popart.PyStepIO({"x": x}, arrays))
    np.testing.assert_allclose(arrays["y"], W + 1)


# options ------------------------------------------------------------------------------------------------
def test_session_options_and_patterns():
    opts = popart.SessionOptions()
    opts.enableStochasticRounding = True
    opts.engineOptions = {"autoReport.all": "true"}
    assert opts.enableStochasticRounding and opts.engineOptions["autoReport.all"] == "true"
    assert popart.SessionOptions().engineOptions == {}  # defaults are per instance
    with pytest.raises(AttributeError, match="no option 'replicatedgraphcount'.*'replicatedGraphCount'"):
        opts.replicatedgraphcount = 2
    with pytest.raises(AttributeError):
        opts.notAnOption
    with pytest.raises(popart.popart_exception, match="positive int"):
        opts.replicatedGraphCount = 0
    p = popart.Patterns()
    assert p.isPatternEnabled("PreUniRepl") and p.inplaceEnabled
    p.enablePattern("InPlace", False)
    assert not p.isPatternEnabled("InPlace")
    assert not popart.Patterns(popart.PatternsLevel.NoPatterns).isPatternEnabled("PreUniRepl")
    assert popart.Patterns(["PreUniRepl"]).isPatternEnabled("PreUniRepl")
    with pytest.raises(popart.popart_exception, match="unknown pattern 'Nope'"):
        popart.Patterns(["Nope"])


# model loading and import errors ----------------------------------------------------------------------
def test_model_from_file_model_to_host_and_reset_host_weights(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_model().SerializeToString())
    s = popart.InferenceSession(str(path), popart.DataFlow(1, ["y"]), popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.weightsFromHost()
    arrays = s.initAnchorArrays()
    x = np.ones((2, 3), np.float32)
    s.run(popart.PyStepIO({"x": x}, arrays))
    np.testing.assert_allclose(arrays["y"], W + 1)
    other = _model()
    other.graph.initializer[0].CopyFrom(__import__("onnx").numpy_helper.from_array(2 * W, "w"))
    s.resetHostWeights(other.SerializeToString())
    s.weightsFromHost()
    s.run(popart.PyStepIO({"x": x}, arrays))
    np.testing.assert_allclose(arrays["y"], 2 * W + 1)
    out = tmp_path / "saved.onnx"
    s.modelToHost(str(out))
    saved = __import__("onnx").load(str(out))
    np.testing.assert_allclose(__import__("onnx").numpy_helper.to_array(saved.graph.initializer[0]), 2 * W)
    with pytest.raises(popart.OnnxImportError, match="does not exist"):
        popart.InferenceSession(str(tmp_path / "missing.onnx"), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice())


def test_unsupported_ops_are_listed_in_one_error():
    model = make_model([N("Relu", ["x"], ["a"], name="r0"), N("NonZero", ["a"], ["b"], name="nz1"),
                        N("Unique", ["x"], ["c"], name="hm"), N("NonZero", ["c"], ["d"], name="nz2"),
                        N("Det", ["x"], ["e"], name="det", domain="com.example")],
                       {"x": np.zeros((2, 2), np.float32)}, ["b", "d", "e"])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(popart.OnnxImportError) as e:
        popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["b"]),
                                popart.DeviceManager().createCpuDevice())
    msg = str(e.value)
    assert "4 node(s) of 3 unsupported op type(s)" in msg
    assert "NonZero: nz1, nz2" in msg and "Unique: hm" in msg and "com.example.Det: det" in msg


def test_unknown_input_shape_needs_input_shape_info():
    model = make_model([N("Relu", ["x"], ["y"])], {"x": np.zeros((2, 3), np.float32)}, ["y"],
                       input_shapes={"x": ["batch", 3]})
    with pytest.raises(popart.OnnxImportError, match="model input\\(s\\) 'x'.*inputShapeInfo"):
        popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice())
    info = popart.InputShapeInfo()
    info.add("x", popart.TensorInfo("FLOAT", [4, 3]))
    s = popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice(), inputShapeInfo=info)
    s.prepareDevice()
    arrays = s.initAnchorArrays()
    x = rng.standard_normal((4, 3)).astype(np.float32)
    s.run(popart.PyStepIO({"x": x}, arrays))
    np.testing.assert_array_equal(arrays["y"], np.maximum(x, 0))


def test_shape_input_that_must_be_static_is_reported():
    model = make_model([N("Reshape", ["x", "s"], ["y"], name="rs")], {"x": np.zeros((2, 3), np.float32),
                                                                       "s": np.array([3, 2], np.int64)}, ["y"])
    with pytest.raises(popart.OnnxImportError, match="node 'rs' \\(Reshape.*input 1 \\(shape.*must be known at import"):
        popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice())


# a small CNN ----------------------------------------------------------------------------------------------
def test_small_cnn_matches_reference():
    model = small_cnn()
    s = popart.InferenceSession(model.SerializeToString(),
                                popart.DataFlow(3, {"output": popart.AnchorReturnType("All"),
                                                    "r": popart.AnchorReturnType("Final")}),
                                popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.weightsFromHost()
    arrays = s.initAnchorArrays()
    x = rng.standard_normal((3, 2, 3, 8, 8)).astype(np.float32)
    s.run(popart.PyStepIO({"input.1": x}, arrays))
    for i in range(3):
        np.testing.assert_allclose(arrays["output"][i], reference(model, {"input.1": x[i]})[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(arrays["r"], reference(model, {"input.1": x[-1]}, ["r"])[0], rtol=1e-4, atol=1e-5)


def test_mobilenet_block_runs_as_fused_convolutions():
    """Conv + Clip(0, 6) (ReLU6), a depthwise Conv + Clip, a 1x1 Conv + residual Add, as PyTorch
    exports a MobileNetV2 block: three conv_fused ops (bias and clip inside), the same values as
    ONNX's reference."""
    r = np.random.default_rng(3)
    def f32(*shape, scale=1.0):
        return (r.standard_normal(shape) * scale).astype(np.float32)
    w = {"w1": f32(24, 8, 1, 1, scale=0.4), "b1": f32(24), "w2": f32(24, 1, 3, 3, scale=0.4), "b2": f32(24),
         "w3": f32(8, 24, 1, 1, scale=0.3), "b3": f32(8), "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"]), N("Clip", ["c1", "lo", "hi"], ["a1"]),
             N("Conv", ["a1", "w2", "b2"], ["c2"], group=24, pads=[1, 1, 1, 1]), N("Clip", ["c2", "lo", "hi"], ["a2"]),
             N("Conv", ["a2", "w3", "b3"], ["c3"]), N("Add", ["c3", "x"], ["y"])]
    x = r.standard_normal((2, 8, 10, 10)).astype(np.float32) * 3
    model = make_model(nodes, {"x": x}, ["y"], w, opset=13)
    s = _session({"y": popart.AnchorReturnType("All")}, model=model)
    exe = s._px.executable
    types = [i.get("type") for g in exe.graphs for i in g["program"]
             if i.get("type") in ("conv", "conv_fused", "clip", "add")]
    assert types == ["conv_fused"] * 3, types
    arrays = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, arrays))
    np.testing.assert_allclose(arrays["y"], reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def _with_initializers(model, values):
    """A copy of ``model`` whose initializers named in ``values`` hold those values."""
    from onnx import ModelProto, numpy_helper
    out = ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    return out


def _conv_bn_relu_weights(seed):
    r = np.random.default_rng(seed)
    return {"cw": r.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.3,
            "bs": r.random(16).astype(np.float32) + 0.5, "bb": r.standard_normal(16).astype(np.float32),
            "bm": r.standard_normal(16).astype(np.float32) * 0.1, "bv": r.random(16).astype(np.float32) + 0.5}


@pytest.mark.parametrize("engine", ["reference", "native"])
def test_weight_writes_reach_the_batch_norm_folded_into_the_conv(engine, monkeypatch):
    """The folding of the batch norm into the conv weights runs only when the weights change (the
    executable's static program, which the native engine skips otherwise): runs after
    writeWeights + weightsFromHost compute with the new conv and batch norm weights."""
    monkeypatch.setenv("POPXL_ENGINE", engine)
    nodes = [N("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             N("BatchNormalization", ["c", "bs", "bb", "bm", "bv"], ["b"], name="bn"),
             N("Relu", ["b"], ["y"], name="relu")]
    model = make_model(nodes, {"x": np.zeros((2, 8, 6, 6), np.float32)}, ["y"], _conv_bn_relu_weights(1), opset=14)
    s = _session({"y": popart.AnchorReturnType("All")}, bps=2, model=model)
    exe = s._px.executable
    assert "mul" in [i.get("type") for i in exe.graphs[exe.static_graph]["program"]]
    (conv,) = [i for g in exe.graphs for i in g["program"] if i.get("type") == "conv_fused"]
    assert conv["static_inputs"] == [1, 2]  # folded weights and bias, read by the loop body in place
    from popart.report import execution_steps
    steps = execution_steps(exe)  # the static program is listed first, as it runs first
    assert steps[0] == "static <static> (when weights changed)" and any(line.startswith("  mul") for line in steps)
    arrays = s.initAnchorArrays()
    x = rng.standard_normal((2, 2, 8, 6, 6)).astype(np.float32)

    def check(m):
        s.run(popart.PyStepIO({"x": x}, arrays))
        for i in range(2):
            np.testing.assert_allclose(arrays["y"][i], reference(m, {"x": x[i]})[0], rtol=1e-4, atol=1e-4)

    check(model)
    new = {k: v for k, v in _conv_bn_relu_weights(2).items() if k in ("cw", "bs", "bm")}
    s.writeWeights(popart.PyWeightsIO(new))
    s.weightsFromHost()
    check(_with_initializers(model, new))
    check(_with_initializers(model, new))  # and again, from what the first run after the write computed


def test_initializers_become_variables_and_shape_data_is_folded():
    model = make_model([N("Reshape", ["x", "shape"], ["r"]), N("MatMul", ["r", "w"], ["y"])],
                       {"x": np.zeros((2, 3), np.float32)}, ["y"],
                       {"shape": np.array([3, 2], np.int64), "w": np.ones((2, 4), np.float32)})
    s = _session({"y": popart.AnchorReturnType("ALL")}, model=model)
    assert list(s._variables) == ["w"]  # the int64 shape was used at import only
    assert s.getInfo("w").shape() == [2, 4]
    import popxl
    assert all(isinstance(v, popxl.Variable) for v in s._variables.values())


def test_model_level_errors():
    dm = popart.DeviceManager()
    old = make_model([N("Relu", ["x"], ["y"])], {"x": np.zeros(2, np.float32)}, ["y"], opset=9)
    with pytest.raises(popart.OnnxImportError, match=f"opset 9; supported opsets are 11 to {newest_opset()}"):
        popart.InferenceSession(old.SerializeToString(), popart.DataFlow(1, ["y"]), dm.createCpuDevice())
    with pytest.raises(popart.OnnxImportError, match="could not parse"):
        popart.InferenceSession(b"not a model", popart.DataFlow(1, ["y"]), dm.createCpuDevice())
    unsorted = make_model([N("Relu", ["a"], ["y"]), N("Relu", ["x"], ["a"])], {"x": np.zeros(2, np.float32)}, ["y"])
    with pytest.raises(popart.OnnxImportError, match="reads tensor 'a', which no earlier node"):
        popart.InferenceSession(unsorted.SerializeToString(), popart.DataFlow(1, ["y"]), dm.createCpuDevice())
    cubic = make_model([N("Resize", ["x", "", "s"], ["y"], mode="cubic", cubic_coeff_a=-0.5, name="up")],
                       {"x": np.zeros((1, 1, 2, 2), np.float32)}, ["y"], {"s": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(popart.OnnxImportError, match="node 'up' \\(Resize, opset 17\\): cubic mode"):
        popart.InferenceSession(cubic.SerializeToString(), popart.DataFlow(1, ["y"]), dm.createCpuDevice())
    with pytest.raises(popart.popart_exception, match="batchesPerStep must be at least 1"):
        popart.InferenceSession(_model().SerializeToString(), popart.DataFlow(0, ["y"]), dm.createCpuDevice())


def test_read_and_write_weights():
    s = _session({"y": popart.AnchorReturnType("ALL")})
    w = np.zeros((2, 3), np.float32)
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO({"w": w}))
    np.testing.assert_array_equal(w, W)
    s.writeWeights(popart.PyWeightsIO({"w": np.full((2, 3), 2, np.float32)}))
    s.weightsFromHost()
    arrays = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": np.ones((2, 3), np.float32)}, arrays))
    np.testing.assert_array_equal(arrays["y"], 3)
    with pytest.raises(popart.popart_exception, match=r"\['v'\] are not weights"):
        s.readWeights(popart.PyWeightsIO({"v": w}))
    with pytest.raises(popart.popart_exception, match="has shape \\(3,\\), expected \\(2, 3\\)"):
        s.writeWeights(popart.PyWeightsIO({"w": np.zeros(3, np.float32)}))


def _attention_block(d: int = 8, heads: int = 2):
    """A transformer encoder block as torch.onnx.export writes one: the batch and sequence lengths are
    symbolic and every reshape target is computed from Shape / Gather / Unsqueeze / Concat."""
    r = np.random.default_rng(11)
    w = {k: (r.standard_normal(s) * 0.3).astype(np.float32) for k, s in
         (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("w1", (d, 4 * d)), ("w2", (4 * d, d)))}
    w.update({"ln_s": r.random(d).astype(np.float32) + 0.5, "ln_b": r.standard_normal(d).astype(np.float32),
              "b1": r.standard_normal(4 * d).astype(np.float32),
              "i0": np.int64(0), "i1": np.int64(1), "ax0": np.array([0], np.int64),
              "nh": np.array([heads], np.int64), "hd": np.array([d // heads], np.int64),
              "dm": np.array([d], np.int64), "scale": np.float32(np.sqrt(d // heads)),
              "half": np.float32(0.5), "one": np.float32(1.0), "sqrt2": np.float32(np.sqrt(2.0))})
    nodes = [N("Shape", ["x"], ["shp"]), N("Gather", ["shp", "i0"], ["B"]), N("Gather", ["shp", "i1"], ["T"]),
             N("Unsqueeze", ["B", "ax0"], ["Bu"]), N("Unsqueeze", ["T", "ax0"], ["Tu"]),
             N("Concat", ["Bu", "Tu", "nh", "hd"], ["heads_shape"], axis=0),
             N("Concat", ["Bu", "Tu", "dm"], ["model_shape"], axis=0)]
    for name in ("q", "k", "v"):
        nodes += [N("MatMul", ["x", f"w{name}"], [f"{name}0"]),
                  N("Reshape", [f"{name}0", "heads_shape"], [f"{name}1"]),
                  N("Transpose", [f"{name}1"], [f"{name}h"], perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [N("MatMul", ["qh", "kh"], ["scores0"]), N("Div", ["scores0", "scale"], ["scores"]),
              N("Softmax", ["scores"], ["probs"], axis=-1), N("MatMul", ["probs", "vh"], ["ctx0"]),
              N("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]), N("Reshape", ["ctx1", "model_shape"], ["ctx"]),
              N("MatMul", ["ctx", "wo"], ["attn"]), N("Add", ["x", "attn"], ["res"]),
              N("LayerNormalization", ["res", "ln_s", "ln_b"], ["ln"], axis=-1),
              N("MatMul", ["ln", "w1"], ["h0"]), N("Add", ["h0", "b1"], ["h1"]),
              # GELU as exporters decompose it: 0.5 * x * (1 + erf(x / sqrt(2)))
              N("Div", ["h1", "sqrt2"], ["g0"]), N("Erf", ["g0"], ["g1"]), N("Add", ["g1", "one"], ["g2"]),
              N("Mul", ["h1", "g2"], ["g3"]), N("Mul", ["g3", "half"], ["gelu"]),
              N("MatMul", ["gelu", "w2"], ["ff"]), N("Add", ["ln", "ff"], ["out"])]
    return make_model(nodes, {"x": np.zeros((1, 1, d), np.float32)}, ["out"], w, opset=17,
                      input_shapes={"x": ["batch", "seq", d]})


def test_transformer_block_with_symbolic_shapes():
    model = _attention_block()
    info = popart.InputShapeInfo()
    info.add("x", popart.TensorInfo("FLOAT", [3, 5, 8]))
    s = popart.InferenceSession(model.SerializeToString(),
                                popart.DataFlow(2, {"out": popart.AnchorReturnType("All"),
                                                    "probs": popart.AnchorReturnType("Final")}),
                                popart.DeviceManager().createCpuDevice(), inputShapeInfo=info)
    s.prepareDevice()
    arrays = s.initAnchorArrays()
    assert arrays["out"].shape == (2, 3, 5, 8) and arrays["probs"].shape == (3, 2, 5, 5)
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    s.run(popart.PyStepIO({"x": x}, arrays))
    for i in range(2):
        np.testing.assert_allclose(arrays["out"][i], reference(model, {"x": x[i]})[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(arrays["probs"], reference(model, {"x": x[1]}, ["probs"])[0], rtol=1e-4, atol=1e-5)
    assert set(s._variables) == {"wq", "wk", "wv", "wo", "w1", "w2", "ln_s", "ln_b", "b1", "scale", "half", "one",
                                 "sqrt2"}
