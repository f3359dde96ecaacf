"""The training code of the user's PopART documents (PopART's session documentation), run as written
except that the AlexNet exported with torch is replaced by a small CNN (with a softmax output
named "output" and 8x8 images) saved under the same file name."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import popart
from popart_helpers import small_cnn


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _batches(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 4, 3, 8, 8)).astype(np.float32),
            rng.integers(0, 10, (n, 4)).astype(np.int32))


def test_seed_000_creating_a_training_session(in_tmp):
    # torch.onnx.export(model, input_, "alexnet.onnx") -> a small CNN
    onnx.save(small_cnn(batch=4), "alexnet.onnx")

    # Create a runtime environment
    anchors = {"output": popart.AnchorReturnType("ALL")}
    dataFeed = popart.DataFlow(100, anchors)

    losses = [popart.NllLoss("output", "labels", "loss")]
    optimizer = popart.ConstSGD(0.001)

    # We need to describe the labels input shape
    inputShapeInfo = popart.InputShapeInfo()
    inputShapeInfo.add("labels", popart.TensorInfo("INT32", [4]))
    device = popart.DeviceManager().createCpuDevice()

    session = popart.TrainingSession("alexnet.onnx",
                                     deviceInfo=device,
                                     dataFeed=dataFeed,
                                     losses=losses,
                                     optimizer=optimizer,
                                     inputShapeInfo=inputShapeInfo)

    # Beyond the document: the session trains.
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    assert anchors["output"].shape == (100, 4, 10)
    x, y = _batches(100)
    session.run(popart.PyStepIO({"input.1": x, "labels": y}, anchors))
    np.testing.assert_allclose(anchors["output"].sum(-1), 1, rtol=1e-5)


def test_seed_004_builder_appends_nll_loss(in_tmp):
    # torch.onnx.export(model, input_, "alexnet.onnx", output_names=[output_name]) -> a small CNN
    onnx.save(small_cnn(batch=4), "alexnet.onnx")
    output_name = "output"

    # Create a runtime environment
    anchors = {output_name: popart.AnchorReturnType("All")}
    dataFlow = popart.DataFlow(100, anchors)

    # Append an Nll loss operation to the model
    builder = popart.Builder("alexnet.onnx")
    labels = builder.addInputTensor("INT32", [4])
    nlll = builder.aiGraphcore.nllloss([output_name, labels])

    optimizer = popart.ConstSGD(0.001)

    # Run session on CPU
    device = popart.DeviceManager().createCpuDevice()
    session = popart.TrainingSession(builder.getModelProto(),
                                     deviceInfo=device,
                                     dataFlow=dataFlow,
                                     loss=nlll,
                                     optimizer=optimizer)

    session.prepareDevice()
    session.weightsFromHost()
    out = session.initAnchorArrays()
    x, y = _batches(100)
    session.run(popart.PyStepIO({"input.1": x, labels: y}, out))
    assert out[output_name].shape == (100, 4, 10)


def _sgd_session(lr: float, profile: bool = False) -> popart.TrainingSession:
    builder = popart.Builder(small_cnn(batch=4))
    labels = builder.addInputTensor("INT32", [4], "labels")
    loss = builder.aiGraphcore.nllloss(["output", labels])
    opts = popart.SessionOptions()
    if profile:
        opts.engineOptions = {"autoReport.all": "true"}
        opts.reportOptions = {"showExecutionSteps": "true"}
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(2, {loss: popart.AnchorReturnType("ALL")}),
                                     loss, popart.SGD(lr), popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    return session


def test_seed_000_and_001_learning_rate_schedule():
    learningRate = [0.1, 0.05, 0.0]
    x, y = _batches(2)
    session = _sgd_session(learningRate[0])
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    stepio = popart.PyStepIO({"input.1": x, "labels": y}, anchors)
    w = {"cw": np.zeros((8, 3, 3, 3), np.float32)}
    for step in range(3):
        # seed 000: update the learning rate parameter between training steps
        stepLr = learningRate[step]
        session.updateOptimizer(popart.SGD(stepLr))
        session.optimizerFromHost()
        session.run(stepio)
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(w))
    before = w["cw"].copy()
    # seed 001: the one-call form; with learning rate 0 the weights stay put.
    session.updateOptimizerFromHost(popart.SGD(learningRate[2]))
    session.run(stepio)
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(w))
    np.testing.assert_array_equal(w["cw"], before)
