"""The inference code of the user's PopART documents (PopART's session documentation), run as written
except that the AlexNet exported with torch is replaced by a small CNN, or by the
benchmark's ResNet-18 at a small image size, saved under the same file name."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import popart
from benchmarks.workloads.cnn import resnet18_onnx
from popart_helpers import make_model, small_cnn


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _add_model():
    """o = a + b * w, on float32[1] inputs 'a' and 'b' (w is a weight)."""
    return make_model([helper.make_node("Mul", ["b", "w"], ["bw"]), helper.make_node("Add", ["a", "bw"], ["o"])],
                      {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)}, ["o"],
                      {"w": np.array([3.0], np.float32)})


def test_executing_graphs_example(in_tmp, monkeypatch):
    onnx.save(_add_model(), "onnx.pb")
    o = "o"

    # Selecting a device for execution
    df = popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")})
    device = popart.DeviceManager().createCpuDevice()
    session = popart.InferenceSession("onnx.pb", deviceInfo=device, dataFeed=df)
    s = popart.InferenceSession("onnx.pb", deviceInfo=device, dataFlow=df)
    assert s.getInputTensorIds() == ["a", "b"]

    monkeypatch.delenv("POPXL_IPU_HW", raising=False)
    with pytest.raises(popart.popart_exception, match="no IPU hardware"):
        popart.DeviceManager().acquireAvailableDevice(2)
    with pytest.raises(popart.popart_exception, match="no IPU hardware"):
        popart.DeviceManager().acquireDeviceById(5)
    connectionType = popart.DeviceConnectionType.OnDemand
    with pytest.raises(popart.popart_exception, match="no IPU hardware"):
        popart.DeviceManager().acquireAvailableDevice(4, connectionType=connectionType)
    assert popart.DeviceManager().createIpuModelDevice({}).type is popart.DeviceType.IpuModel

    # Executing a session
    session.prepareDevice()

    # Setting input/output data buffers
    anchors = session.initAnchorArrays()
    data_a = np.random.rand(1).astype(np.float32)
    data_b = np.random.rand(1).astype(np.float32)
    stepio = popart.PyStepIO({'a': data_a, 'b': data_b}, anchors)
    session.weightsFromHost()
    session.run(stepio)
    np.testing.assert_allclose(anchors[o], data_a + 3 * data_b, rtol=1e-6)

    # Saving and loading a model
    session.modelToHost("trained_model.onnx")
    assert [i.name for i in onnx.load("trained_model.onnx").graph.initializer] == ["w"]
    other = _add_model()
    other.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.array([5.0], np.float32), "w"))
    onnx.save(other, "test.onnx")
    session.resetHostWeights("test.onnx")
    session.weightsFromHost()
    session.run(stepio)
    np.testing.assert_allclose(anchors[o], data_a + 5 * data_b, rtol=1e-6)


def test_session_options_profiling_and_logging_examples(in_tmp, capsys):
    onnx.save(_add_model(), "onnx.pb")
    opts = popart.SessionOptions()
    opts.enableStochasticRounding = True
    opts.engineOptions = {"autoReport.all": "true"}
    opts.reportOptions = {"showExecutionSteps": "true"}
    session = popart.InferenceSession("onnx.pb", popart.DataFlow(1, {"o": popart.AnchorReturnType("ALL")}),
                                      popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)}, anchors))
    assert "Execution: 1 run(s)" in session.getSummaryReport()
    plain = popart.InferenceSession("onnx.pb", popart.DataFlow(1, ["o"]), popart.DeviceManager().createCpuDevice())
    assert "Execution profiling not enabled" in plain.getSummaryReport()

    try:
        popart.getLogger().setLevel("TRACE")
        popart.getLogger().setLevel("DEBUG")
        popart.getLogger("session").setLevel("OFF")
        assert popart.getLogger("session").getLevel() == "OFF" and popart.getLogger("ir").getLevel() == "DEBUG"
        with pytest.raises(popart.popart_exception, match="unknown level"):
            popart.getLogger().setLevel("LOUD")
    finally:
        popart.getLogger().setLevel("OFF")


def test_error_hierarchy():
    assert issubclass(popart.popart_internal_exception, popart.popart_exception)
    assert issubclass(popart.poplar_recoverable_runtime_error, popart.poplar_runtime_error)
    assert issubclass(popart.poplar_application_runtime_error, popart.poplar_runtime_error)
    e = popart.poplar_recoverable_runtime_error("x", popart.RecoveryAction.LINK_RESET)
    assert e.recoveryAction is popart.RecoveryAction.LINK_RESET
    assert {a.name for a in popart.RecoveryAction} == {"IPU_RESET", "LINK_RESET", "PARTITION_RESET", "POWER_CYCLE"}


# (model, image size, classes, whether the output is a softmax)
CNNS = {"small_cnn": (lambda: small_cnn(batch=4), 8, 10, True),
        "resnet18": (lambda: resnet18_onnx(batch=4, image=32, input_name="input.1", output_name="output"), 32, 1000,
                     False)}


@pytest.mark.parametrize("cnn", CNNS)
def test_importing_graphs_example(in_tmp, cnn):
    make, image, classes, softmax = CNNS[cnn]
    # torch.onnx.export(model, input_, "alexnet.onnx", output_names=[output_name]) -> a CNN
    onnx.save(make(), "alexnet.onnx")
    output_name = "output"

    # Obtain inputs/outputs name of loaded model
    loaded_model = onnx.load('alexnet.onnx')
    inputs_name = [node.name for node in loaded_model.graph.input]
    outputs_name = [node.name for node in loaded_model.graph.output]
    assert inputs_name == ["input.1"] and outputs_name == [output_name]

    # Create a runtime environment
    anchors = {output_name: popart.AnchorReturnType("All")}
    dataFlow = popart.DataFlow(100, anchors)
    device = popart.DeviceManager().createCpuDevice()

    session = popart.InferenceSession("alexnet.onnx", dataFlow, device)
    session.prepareDevice()

    input_1 = np.random.randn(4, 3, image, image).astype(np.float32)
    stepio = popart.PyStepIO({'input.1': input_1}, session.initAnchorArrays())
    # As written, the input holds one batch while batchesPerStep is 100: running it says so.
    with pytest.raises(popart.StepIOError, match=rf"expected \(100, 4, 3, {image}, {image}\)"):
        session.run(stepio)
    anchors = session.initAnchorArrays()
    batches = np.random.randn(100, 4, 3, image, image).astype(np.float32)
    session.run(popart.PyStepIO({'input.1': batches}, anchors))
    assert anchors[output_name].shape == (100, 4, classes)
    if softmax:
        np.testing.assert_allclose(anchors[output_name].sum(-1), 1, rtol=1e-5)
    else:  # logits: finite, and distinct batches give distinct ones
        assert np.isfinite(anchors[output_name]).all()
        assert not np.allclose(anchors[output_name][0], anchors[output_name][1])

    # The older form of the same example (seed 002): a dataFeed positional argument.
    dataFeed = popart.DataFlow(100, {"output": popart.AnchorReturnType("ALL")})
    session = popart.InferenceSession("alexnet.onnx", dataFeed, device)
    session.prepareDevice()
    assert session.initAnchorArrays()["output"].shape == (100, 4, classes)
