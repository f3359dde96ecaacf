"""TrainingSession and Builder: losses fall, anchors in training, optimiser steps against NumPy,
hyper-parameters changed between runs, accumulation and replication, modelToHost /
resetHostWeights round trips, and the errors of bad losses, options and ids."""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import popart
from popart_helpers import small_cnn

FEAT, CLASSES, BATCH = 6, 4, 8


class Nll(OpRun):
    """ONNX reference implementation of PopART's ai.graphcore Nll loss (for the evaluator)."""
    op_domain = "ai.graphcore"

    def _run(self, probs, labels, reduction=1, ignoreIndex=None, inputIsLogProbability=0):
        picked = probs[np.arange(len(labels)), labels]
        item = -(picked if inputIsLogProbability else np.log(picked))
        return (item.mean() if reduction == 1 else item.sum() if reduction == 0 else item,)


def linear_model(seed: int = 0, opset: int = 11) -> Tuple[popart.Builder, Dict[str, str]]:
    """probs = softmax(x @ W + b); loss = nll(probs, labels) (mean), built with the Builder."""
    rng = np.random.default_rng(seed)
    b = popart.Builder(opsets={"ai.onnx": opset})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [BATCH, FEAT]), "x")
    labels = b.addInputTensor("INT32", [BATCH], "labels")
    w = b.addInitializedInputTensor((rng.standard_normal((FEAT, CLASSES)) * 0.3).astype(np.float32), "W")
    bias = b.addInitializedInputTensor(np.zeros(CLASSES, np.float32), "b")
    with b.nameScope("fc"):
        logits = b.aiOnnx.add([b.aiOnnx.matmul([x, w]), bias])
    probs = b.aiOnnx.softmax([logits], axis=1)
    loss = b.aiGraphcore.nllloss([probs, labels], popart.ReductionType.Mean)
    b.addOutputTensor(probs)
    return b, {"x": x, "labels": labels, "W": w, "b": bias, "logits": logits, "probs": probs, "loss": loss}


def data(steps: int, seed: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, BATCH, FEAT)).astype(np.float32)
    y = (np.argmax(x[..., :CLASSES], -1)).astype(np.int32)  # learnable labels
    return x, y


def session(b: popart.Builder, ids: Dict[str, str], optimizer, bps: int = 1, anchors=None,
            options: popart.SessionOptions = None, device=None) -> popart.TrainingSession:
    anchors = anchors or {ids["loss"]: popart.AnchorReturnType("ALL")}
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(bps, anchors), ids["loss"], optimizer,
                               device or popart.DeviceManager().createCpuDevice(),
                               userOptions=options or popart.SessionOptions())
    s.prepareDevice()
    s.weightsFromHost()
    return s


def weights(s: popart.TrainingSession, *names: str) -> Dict[str, np.ndarray]:
    s.weightsToHost()
    out = {n: np.zeros(s.getInfo(n).shape(), np.float32) for n in names}
    s.readWeights(popart.PyWeightsIO(out))
    return out


def numpy_grads(W: np.ndarray, bias: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Loss and gradients of mean nll(softmax(x W + b)) w.r.t. W and b."""
    z = x @ W + bias
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    d = p.copy()
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    return loss, x.T @ d, d.sum(0)


# training ---------------------------------------------------------------------------------------------
def test_builder_model_trains_and_loss_falls():
    b, ids = linear_model()
    s = session(b, ids, popart.ConstSGD(0.5), bps=10)
    x, y = data(10)
    anchors = s.initAnchorArrays()
    losses = []
    for _ in range(8):
        s.run(popart.PyStepIO({ids["x"]: x, ids["labels"]: y}, anchors))
        losses.append(anchors[ids["loss"]].mean())
    assert losses[-1] < 0.5 * losses[0]
    assert s.getTrainableTensorIds() == [ids["W"], ids["b"]]


def test_imported_onnx_model_trains_with_loss_objects(tmp_path):
    # An ONNX file (a CNN with BatchNormalization) and the older loss-object API.
    onnx.save(small_cnn(batch=4), str(tmp_path / "cnn.onnx"))
    info = popart.InputShapeInfo()
    info.add("labels", popart.TensorInfo("INT32", [4]))
    s = popart.TrainingSession(str(tmp_path / "cnn.onnx"), deviceInfo=popart.DeviceManager().createCpuDevice(),
                               dataFeed=popart.DataFlow(4, {"loss": popart.AnchorReturnType("ALL")}),
                               losses=[popart.NllLoss("output", "labels", "loss")],
                               optimizer=popart.SGD({"defaultLearningRate": (0.05, False),
                                                     "defaultMomentum": (0.9, True)}),
                               inputShapeInfo=info)
    assert s.getInputTensorIds() == ["input.1", "labels"]
    s.prepareDevice()
    s.weightsFromHost()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, (4, 4)).astype(np.int32)
    anchors = s.initAnchorArrays()
    first = None
    for _ in range(6):
        s.run(popart.PyStepIO({"input.1": x, "labels": y}, anchors))
        first = anchors["loss"].mean() if first is None else first
    assert anchors["loss"].mean() < 0.5 * first
    # BatchNormalization's running statistics are not trained.
    assert "bm" not in s.getTrainableTensorIds() and "cw" in s.getTrainableTensorIds()


def test_anchor_return_types_in_training():
    b, ids = linear_model()
    loss, probs, W = ids["loss"], ids["probs"], ids["W"]
    art = popart.AnchorReturnType
    anchors = {loss: art("ALL"), probs: art("FINAL"), ids["logits"]: art("EVERYN", 2),
               popart.reservedGradientPrefix() + W: art("SUM"), "Gradient___" + ids["x"]: art("ALL")}
    s = session(b, ids, popart.SGD(0.0), bps=4, anchors=anchors)  # lr 0: every batch sees the same weights
    x, y = data(4)
    out = s.initAnchorArrays()
    assert {k: v.shape for k, v in out.items()} == {
        loss: (4,), probs: (BATCH, CLASSES), ids["logits"]: (2, BATCH, CLASSES), "Gradient___" + W: (FEAT, CLASSES),
        "Gradient___" + ids["x"]: (4, BATCH, FEAT)}
    s.run(popart.PyStepIO({ids["x"]: x, ids["labels"]: y}, out))
    w0 = weights(s, W, ids["b"])
    expect = [numpy_grads(w0[W], w0[ids["b"]], x[k], y[k]) for k in range(4)]
    np.testing.assert_allclose(out[loss], [e[0] for e in expect], rtol=1e-5)
    np.testing.assert_allclose(out["Gradient___" + W], sum(e[1] for e in expect), rtol=1e-4, atol=1e-6)
    logits = x @ w0[W] + w0[ids["b"]]
    np.testing.assert_allclose(out[ids["logits"]], logits[[1, 3]], rtol=1e-5)
    # dloss/dx = dloss/dbias-per-row @ W^T (the bias gradient before summing over rows)
    p_all = np.exp(logits - logits.max(-1, keepdims=True))
    p_all /= p_all.sum(-1, keepdims=True)
    d = p_all.copy()
    for k in range(4):
        d[k][np.arange(BATCH), y[k]] -= 1
    np.testing.assert_allclose(out["Gradient___" + ids["x"]], d / BATCH @ w0[W].T, rtol=1e-4, atol=1e-7)
    p = np.exp(logits[3]) / np.exp(logits[3]).sum(-1, keepdims=True)
    np.testing.assert_allclose(out[probs], p, rtol=1e-5)


def test_sgd_step_matches_numpy_and_learning_rate_changes_between_runs():
    b, ids = linear_model()
    W, B = ids["W"], ids["b"]
    s = session(b, ids, popart.SGD(0.1))
    x, y = data(2)
    out = s.initAnchorArrays()
    w = weights(s, W, B)
    for step, lr in enumerate([0.1, 0.7]):
        if step:
            compiled = s._px
            s.updateOptimizerFromHost(popart.SGD(lr))  # no recompilation: the lr is a device variable
            assert s._px is compiled
        s.run(popart.PyStepIO({ids["x"]: x[step], ids["labels"]: y[step]}, out))
        _, gW, gb = numpy_grads(w[W], w[B], x[step], y[step])
        got = weights(s, W, B)
        np.testing.assert_allclose(got[W], w[W] - lr * gW, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[B], w[B] - lr * gb, rtol=1e-5, atol=1e-6)
        w = got
    # The older two-call form.
    s.updateOptimizer(popart.SGD(0.0))
    s.optimizerFromHost()
    s.run(popart.PyStepIO({ids["x"]: x[0], ids["labels"]: y[0]}, out))
    np.testing.assert_allclose(weights(s, W, B)[W], w[W])


def test_sgd_momentum_weight_decay_dampening_loss_scaling_match_numpy():
    b, ids = linear_model()
    W, B = ids["W"], ids["b"]
    lr, mm, wd, dm, ls = 0.2, 0.9, 0.01, 0.1, 8.0
    opt = popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": (mm, False),
                      "defaultWeightDecay": (wd, False), "defaultDampening": (dm, True), "lossScaling": (ls, False)})
    s = session(b, ids, opt)
    x, y = data(3)
    out = s.initAnchorArrays()
    w = weights(s, W, B)
    v = {W: np.zeros_like(w[W]), B: np.zeros_like(w[B])}
    for k in range(3):
        s.run(popart.PyStepIO({ids["x"]: x[k], ids["labels"]: y[k]}, out))
        _, gW, gb = numpy_grads(w[W], w[B], x[k], y[k])
        for n, g in ((W, gW), (B, gb)):
            v[n] = mm * v[n] + (1 - dm) * (g + wd * w[n])
            w[n] = w[n] - lr * v[n]
        got = weights(s, W, B)
        np.testing.assert_allclose(got[W], w[W], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[B], w[B], rtol=1e-4, atol=1e-6)
    with pytest.raises(popart.popart_exception, match="dampening|defaultDampening"):
        s.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": (mm, False),
                                              "defaultWeightDecay": (wd, False), "defaultDampening": (0.5, True),
                                              "lossScaling": (ls, False)}))
    with pytest.raises(popart.popart_exception, match="cannot switch"):
        s.updateOptimizerFromHost(popart.Adam({}))


@pytest.mark.parametrize("mode", list(popart.AdamMode))
def test_adam_modes_match_numpy(mode):
    b, ids = linear_model()
    W, B = ids["W"], ids["b"]
    lr, b1, b2, eps, wd, mwn = 0.05, 0.8, 0.95, 1e-6, 0.01, 0.5
    params = {"defaultLearningRate": (lr, False), "defaultBeta1": (b1, True), "defaultBeta2": (b2, True),
              "defaultEps": (eps, True), "defaultWeightDecay": (wd, True)}
    if mode is popart.AdamMode.Lamb:  # clipping of the weight norm (W's norm is above 0.5, b's below)
        params["maxWeightNorm"] = (mwn, True)
    s = session(b, ids, popart.Adam(params, mode=mode))
    x, y = data(3)
    out = s.initAnchorArrays()
    w = weights(s, W, B)
    m = {n: np.zeros_like(w[n]) for n in w}
    v = {n: np.zeros_like(w[n]) for n in w}
    bias = mode in (popart.AdamMode.Adam, popart.AdamMode.AdaMax, popart.AdamMode.Lamb)
    for k in range(3):
        s.run(popart.PyStepIO({ids["x"]: x[k], ids["labels"]: y[k]}, out))
        _, gW, gb = numpy_grads(w[W], w[B], x[k], y[k])
        for n, g in ((W, gW), (B, gb)):
            t = k + 1
            m[n] = b1 * m[n] + (1 - b1) * g
            mh = m[n] / (1 - b1 ** t) if bias else m[n]
            if mode is popart.AdamMode.AdaMax:
                v[n] = np.maximum(b2 * v[n], np.abs(g))
                term = mh / (v[n] + eps) + wd * w[n]
            else:
                v[n] = b2 * v[n] + (1 - b2) * g * g
                vh = v[n] / (1 - b2 ** t) if bias else v[n]
                term = mh / (np.sqrt(vh) + eps) + wd * w[n]
            ratio = 1.0
            if mode in (popart.AdamMode.Lamb, popart.AdamMode.LambNoBias):
                wnorm = np.linalg.norm(w[n])
                if mode is popart.AdamMode.Lamb:
                    wnorm = min(wnorm, mwn)
                # a zero weight (the bias at the start) takes the plain Adam step
                ratio = wnorm / np.linalg.norm(term) if wnorm > 0 else 1.0
            w[n] = w[n] - lr * ratio * term
        got = weights(s, W, B)
        np.testing.assert_allclose(got[W], w[W], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[B], w[B], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["accumulation", "replication"])
def test_accumulation_and_replication_mean_equals_large_batch(mode):
    """Two micro-batches (accumulated or on two replicas), gradients averaged, equal one step on
    both batches' mean loss."""
    b, ids = linear_model()
    W, B = ids["W"], ids["b"]
    opts = popart.SessionOptions()
    opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    device = popart.DeviceManager().createCpuDevice()
    if mode == "accumulation":
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = 2
    else:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = 2
        device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2})
    s = session(b, ids, popart.ConstSGD(0.3), bps=2, options=opts, device=device)
    x, y = data(4)
    feed = {ids["x"]: x.reshape(2, 2, BATCH, FEAT), ids["labels"]: y.reshape(2, 2, BATCH)}
    assert s.getInputShape(ids["x"]) == (2, 2, BATCH, FEAT)
    out = s.initAnchorArrays()
    assert out[ids["loss"]].shape == (2, 2)
    w = weights(s, W, B)
    s.run(popart.PyStepIO(feed, out))
    for step in range(2):
        g = [numpy_grads(w[W], w[B], x[2 * step + k], y[2 * step + k]) for k in range(2)]
        np.testing.assert_allclose(out[ids["loss"]][step], [g[0][0], g[1][0]], rtol=1e-5)
        w = {W: w[W] - 0.3 * (g[0][1] + g[1][1]) / 2, B: w[B] - 0.3 * (g[0][2] + g[1][2]) / 2}
    got = weights(s, W, B)
    np.testing.assert_allclose(got[W], w[W], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got[B], w[B], rtol=1e-4, atol=1e-6)


# saving and loading -----------------------------------------------------------------------------------
def test_model_to_host_matches_reference_evaluator_and_onnxruntime(tmp_path):
    b, ids = linear_model()
    s = session(b, ids, popart.SGD(0.5), bps=5)
    x, y = data(5)
    out = s.initAnchorArrays()
    for _ in range(3):
        s.run(popart.PyStepIO({ids["x"]: x, ids["labels"]: y}, out))
    path = str(tmp_path / "trained.onnx")
    s.modelToHost(path)
    model = onnx.load(path)
    trained = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_allclose(trained[ids["W"]], weights(s, ids["W"])[ids["W"]])
    # Same outputs as the session (a run with learning rate 0 anchors the probabilities).
    s.updateOptimizerFromHost(popart.SGD(0.0))
    s2 = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {ids["probs"]: popart.AnchorReturnType("ALL"),
                                                                       ids["loss"]: popart.AnchorReturnType("ALL")}),
                                ids["loss"], popart.SGD(0.0), popart.DeviceManager().createCpuDevice())
    s2.resetHostWeights(path)
    s2.prepareDevice()
    s2.weightsFromHost()
    o2 = s2.initAnchorArrays()
    s2.run(popart.PyStepIO({ids["x"]: x[0], ids["labels"]: y[0]}, o2))
    ref = ReferenceEvaluator(model, new_ops=[Nll])
    probs, loss = ref.run([ids["probs"], ids["loss"]], {ids["x"]: x[0], ids["labels"]: y[0]})
    np.testing.assert_allclose(o2[ids["probs"]], probs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(o2[ids["loss"]], loss, rtol=1e-5)


def test_model_to_host_of_imported_model_runs_in_onnxruntime(tmp_path):
    import onnxruntime as ort  # a dev dependency: this check must run, not skip
    onnx.save(small_cnn(batch=4), str(tmp_path / "cnn.onnx"))
    info = popart.InputShapeInfo()
    info.add("labels", popart.TensorInfo("INT32", [4]))
    s = popart.TrainingSession(str(tmp_path / "cnn.onnx"), popart.DataFlow(2, {"output": popart.AnchorReturnType("ALL")}),
                               optimizer=popart.ConstSGD(0.05), deviceInfo=popart.DeviceManager().createCpuDevice(),
                               losses=[popart.NllLoss("output", "labels", "loss")], inputShapeInfo=info)
    s.prepareDevice()
    s.weightsFromHost()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, (2, 4)).astype(np.int32)
    s.run(popart.PyStepIO({"input.1": x, "labels": y}, s.initAnchorArrays()))
    s.modelToHost(str(tmp_path / "trained.onnx"))
    model = onnx.load(str(tmp_path / "trained.onnx"))
    assert [n.op_type for n in model.graph.node][-1] == "Softmax"  # the loss stays out of the saved model
    inf = popart.InferenceSession(str(tmp_path / "trained.onnx"), popart.DataFlow(1, ["output"]),
                                  popart.DeviceManager().createCpuDevice())
    inf.prepareDevice()
    inf.weightsFromHost()
    got = inf.initAnchorArrays()
    inf.run(popart.PyStepIO({"input.1": x[0]}, got))
    sess = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got["output"], sess.run(["output"], {"input.1": x[0]})[0], rtol=1e-4, atol=1e-6)
    before = onnx.load(str(tmp_path / "cnn.onnx"))
    changed = {t.name for t, u in zip(before.graph.initializer, model.graph.initializer)
               if not np.array_equal(onnx.numpy_helper.to_array(t), onnx.numpy_helper.to_array(u))}
    assert {"cw", "bm", "bv"} <= changed  # weights trained, BatchNormalization statistics updated


def test_reset_host_weights_round_trip(tmp_path):
    b, ids = linear_model()
    W, B = ids["W"], ids["b"]
    s = session(b, ids, popart.SGD(0.5), bps=2)
    x, y = data(2)
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({ids["x"]: x, ids["labels"]: y}, out))
    saved = weights(s, W, B)
    s.modelToHost(str(tmp_path / "a.onnx"))
    s.run(popart.PyStepIO({ids["x"]: x, ids["labels"]: y}, out))
    assert not np.allclose(weights(s, W)[W], saved[W])
    s.resetHostWeights(str(tmp_path / "a.onnx"))
    s.weightsFromHost()
    back = weights(s, W, B)
    np.testing.assert_array_equal(back[W], saved[W])
    np.testing.assert_array_equal(back[B], saved[B])


# builder ----------------------------------------------------------------------------------------------
def test_builder_model_proto_ops_and_ids(tmp_path):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 6]))
    assert b.getInputTensorIds() == [x]
    a, c = b.aiOnnx.split([x], num_outputs=2, axis=1)
    t = b.aiOnnx.transpose([b.aiOnnx.mul([a, c])], perm=[1, 0])
    values, idx = b.aiOnnx.topk([t, b.aiOnnx.constant(np.array([2], np.int64))], axis=0)
    y = b.aiOnnx.cast([values], "FLOAT16")
    with b.nameScope("outer"), b.nameScope("inner"):
        z = b.aiOnnx.relu([y])
    assert z.startswith("outer/inner/")
    b.addOutputTensor(z)
    b.addOutputTensor(idx)
    assert b.getTensorShape(t) == [3, 2] and b.getTensorShape(z) == [2, 2]
    assert b.getTensorDtypeString(z) == "float16"
    assert b.getOutputTensorIds() == [z, idx]
    model = onnx.load_from_string(b.getModelProto())
    onnx.checker.check_model(model)
    xv = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {x: xv})
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, [z, idx]),
                                popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: xv}, out))
    np.testing.assert_allclose(out[z], want[0])
    np.testing.assert_array_equal(out[idx], want[1])
    import onnxruntime as ort  # the Builder's proto is an ordinary ONNX model
    got = ort.InferenceSession(b.getModelProto(), providers=["CPUExecutionProvider"]).run(None, {x: xv})
    np.testing.assert_allclose(got[0], want[0])
    # Every op the importer supports has a Builder method.
    from popart.onnx import supported_ops
    assert all(hasattr(b.aiOnnx, op.lower()) for op in supported_ops() if "." not in op)
    with pytest.raises(popart.popart_exception, match="CastLike needs ai.onnx opset 15"):
        b.aiOnnx.castlike([x, x])


def test_builder_extends_an_existing_model(tmp_path):
    onnx.save(small_cnn(batch=4), str(tmp_path / "cnn.onnx"))
    b = popart.Builder(str(tmp_path / "cnn.onnx"))
    labels = b.addInputTensor("INT32", [4])
    loss = b.aiGraphcore.l1loss([b.aiOnnx.sub(["output", b.aiOnnx.constant(np.float32(0.1))])], 0.5,
                                reduction=popart.ReductionType.Sum)
    nll = b.aiGraphcore.nllloss(["output", labels], popart.ReductionType.NoReduction)
    assert b.getTensorShape(loss) == [] and b.getTensorShape(nll) == [4]
    assert b.getInputTensorIds() == ["input.1", labels]
    ident = b.aiGraphcore.identityloss([nll])
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, [ident, "output"]),
                               ident, popart.ConstSGD(0.01), popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    out = s.initAnchorArrays()
    x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = np.arange(4, dtype=np.int32)
    s.run(popart.PyStepIO({"input.1": x, labels: y}, out))
    np.testing.assert_allclose(out["output"].sum(-1), 1, rtol=1e-5)
    np.testing.assert_allclose(out[ident], -np.log(out["output"][np.arange(4), y]).mean(), rtol=1e-5)


# errors -----------------------------------------------------------------------------------------------
def test_errors_unknown_option_bad_loss_and_mismatched_ids():
    opts = popart.SessionOptions()
    with pytest.raises(AttributeError, match="no option 'enableStochasticRouding'"):
        opts.enableStochasticRouding = True
    b, ids = linear_model()
    dev = popart.DeviceManager().createCpuDevice()
    df = popart.DataFlow(1, [ids["loss"]])
    proto = b.getModelProto()
    with pytest.raises(popart.popart_exception, match="loss 'nope' is not a tensor of the model"):
        popart.TrainingSession(proto, df, "nope", popart.SGD(0.1), dev)
    with pytest.raises(popart.popart_exception, match="unsupported loss .*shape \\(8, 4\\)"):
        popart.TrainingSession(proto, popart.DataFlow(1, [ids["probs"]]), ids["probs"], popart.SGD(0.1), dev)
    with pytest.raises(popart.popart_exception, match="unsupported loss"):
        popart.TrainingSession(proto, df, 3.0, popart.SGD(0.1), dev)
    with pytest.raises(popart.popart_exception, match="optimizer must be"):
        popart.TrainingSession(proto, df, ids["loss"], 0.1, dev)
    with pytest.raises(popart.popart_exception, match="optimizer must be"):  # the base class
        popart.TrainingSession(proto, df, ids["loss"], popart.Optimizer({}, "mine"), dev)
    with pytest.raises(popart.popart_exception, match="not gradients of trainable weights"):
        popart.TrainingSession(proto, popart.DataFlow(1, ["Gradient___labels"]), ids["loss"], popart.SGD(0.1), dev)
    with pytest.raises(popart.popart_exception, match="anchors \\['missing'\\] are not tensors"):
        popart.TrainingSession(proto, popart.DataFlow(1, ["missing"]), ids["loss"], popart.SGD(0.1), dev)
    with pytest.raises(popart.popart_exception, match="not tensors of the model"):
        b.aiOnnx.add([ids["x"], "nope"])
    with pytest.raises(AttributeError, match="has no op 'frobnicate'"):
        b.aiOnnx.frobnicate
    s = session(b, ids, popart.SGD(0.1))
    with pytest.raises(popart.StepIOError, match="unknown input"):
        s.run(popart.PyStepIO({"xx": np.zeros((BATCH, FEAT), np.float32), ids["labels"]: np.zeros(BATCH, np.int32)},
                              s.initAnchorArrays()))
    with pytest.raises(popart.popart_exception, match="not weights of this session"):
        s.readWeights(popart.PyWeightsIO({"W2": np.zeros((FEAT, CLASSES), np.float32)}))


# reports ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["native", "reference"])
def test_get_report_per_op_time_and_memory_per_ipu(engine, monkeypatch):
    monkeypatch.setenv("POPXL_ENGINE", engine)
    b, ids = linear_model()
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    opts.reportOptions = {"showExecutionSteps": "true"}
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    s = session(b, ids, popart.SGD(0.1), bps=3, options=opts,
                device=popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}))
    x, y = data(6)
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({ids["x"]: x.reshape(3, 2, BATCH, FEAT), ids["labels"]: y.reshape(3, 2, BATCH)}, out))
    summary = s.getSummaryReport(resetProfile=False)
    assert "Training: loss" in summary and "Per-op times" in summary
    report = s.getReport()
    assert report.measuredBy == engine and f"by the {engine} engine" in report.header
    assert [m.ipu for m in report.memory] == [0, 1]
    assert report.memory[0].variableBytes >= (FEAT * CLASSES + CLASSES) * 4
    matmuls = [o for o in report.ops if o.type in ("matmul", "matmul_bias")]  # x @ W + b runs as one op
    assert {o.ipu for o in matmuls} == {0, 1}
    fwd = [o for o in matmuls if o.outputBytes == BATCH * CLASSES * 4]
    assert fwd and all(o.calls == 3 and o.seconds > 0 for o in fwd)  # once per step on each IPU
    assert report.totalOpSeconds(0) > 0 and len(report.runSeconds) == 1
    # The timers sit inside the run: all ops of both IPUs together took less than the run did.
    assert report.totalOpSeconds() < report.runSeconds[0]
    assert "matmul" in str(report)
    steps = report.executionSteps
    assert steps[0].startswith("repeat popart_step") and any(line.strip().startswith("host_load") for line in steps)
    assert any(line.strip().startswith("call popart_forward") for line in steps)
    # Reset: a new report has no execution yet; without profiling only memory is reported.
    assert all(o.calls == 0 for o in s.getReport().ops)
    plain = session(b, ids, popart.SGD(0.1))
    r = plain.getReport()
    assert not r.executionProfiled and r.ops == [] and r.memory[0].totalBytes > 0 and r.executionSteps == []


def test_floating_point_checks_and_training_without_weights():
    b, ids = linear_model()
    opts = popart.SessionOptions()
    opts.enableFloatingPointChecks = True
    s = session(b, ids, popart.SGD(1e38), options=opts)
    x, y = data(1)
    with pytest.raises(popart.poplar_application_runtime_error, match="floating-point exception"):
        for _ in range(3):
            s.run(popart.PyStepIO({ids["x"]: x[0] * 1e3, ids["labels"]: y[0]}, s.initAnchorArrays()))
    assert issubclass(popart.poplar_application_runtime_error, popart.popart_exception)

    nb = popart.Builder()
    i = nb.addInputTensor("FLOAT", [3])
    loss = nb.aiGraphcore.l1loss([i], 0.1)
    with pytest.raises(popart.popart_exception, match="does not depend on any weight"):
        popart.TrainingSession(nb.getModelProto(), popart.DataFlow(1, [loss]), loss, popart.SGD(0.1),
                               popart.DeviceManager().createCpuDevice())


def test_l1_and_identity_loss_objects():
    b = popart.Builder()
    x = b.addInputTensor("FLOAT", [2, 3], "x")
    w = b.addInitializedInputTensor(np.full((3,), 2.0, np.float32), "w")
    y = b.aiOnnx.mul([x, w])
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, ["l1", "id"]), None, popart.ConstSGD(0.0),
                               popart.DeviceManager().createCpuDevice(),
                               losses=[popart.L1Loss(y, "l1", 0.5, popart.ReductionType.Sum),
                                       popart.IdentityLoss(y, "id", popart.ReductionType.Mean)])
    s.prepareDevice()
    out = s.initAnchorArrays()
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    s.run(popart.PyStepIO({x: xv}, out))
    np.testing.assert_allclose(out["l1"], 0.5 * np.abs(2 * xv).sum(), rtol=1e-6)
    np.testing.assert_allclose(out["id"], (2 * xv).mean(), rtol=1e-6)


def test_inference_session_with_a_loss_returns_the_loss():
    # Seed 000: "If losses are provided to the inference session the forward pass and the losses
    # will be executed, and the final loss value will be returned."
    b, ids = linear_model()
    info = popart.InputShapeInfo()
    info.add("lbl", popart.TensorInfo("INT32", [BATCH]))
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(2, {"nll": popart.AnchorReturnType("FINAL")}),
                                popart.DeviceManager().createCpuDevice(), inputShapeInfo=info,
                                losses=[popart.NllLoss(ids["probs"], "lbl", "nll")])
    s.prepareDevice()
    s.weightsFromHost()
    x, y = data(2)
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({ids["x"]: x, ids["labels"]: y, "lbl": y}, out))
    w = weights(s, ids["W"], ids["b"])
    np.testing.assert_allclose(out["nll"], numpy_grads(w[ids["W"]], w[ids["b"]], x[1], y[1])[0], rtol=1e-5)
    with pytest.raises(popart.popart_exception, match="unsupported loss"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, ["nll"]), popart.DeviceManager().createCpuDevice(),
                                losses=["nll"])


def test_builder_cnn_with_positional_attributes_trains():
    """PopART-style positional attributes: conv(args, dilations, group, kernel_shape, pads, strides),
    maxpool(args, num_outputs, kernel_shape, ceil_mode, dilations, pads, storage_order, strides),
    gemm(args, alpha, beta, transA, transB)."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor("FLOAT", [4, 1, 6, 6])
    lab = b.addInputTensor("INT32", [4])
    cw = b.addInitializedInputTensor((rng.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32))
    c = b.aiOnnx.conv([x, cw], [1, 1], 1, [3, 3], [1, 1, 1, 1], [1, 1])
    (p,) = b.aiOnnx.maxpool([b.aiOnnx.relu([c])], 1, [2, 2], 0, [1, 1], [0, 0, 0, 0], 0, [2, 2])
    f = b.aiOnnx.flatten([p], axis=1)
    gw = b.addInitializedInputTensor((rng.standard_normal((3, 36)) * 0.1).astype(np.float32))
    gb = b.addInitializedInputTensor(np.zeros(3, np.float32))
    g = b.aiOnnx.gemm([f, gw, gb], 1.0, 1.0, 0, 1)
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([g], 1), lab], popart.ReductionType.Sum)
    assert (b.getTensorShape(c), b.getTensorShape(p), b.getTensorShape(g)) == ([4, 4, 6, 6], [4, 4, 3, 3], [4, 3])
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(8, [loss]), loss, popart.SGD(0.05),
                               popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.weightsFromHost()
    xs = rng.standard_normal((8, 4, 1, 6, 6)).astype(np.float32)
    ys = ((xs.mean((2, 3, 4)) > 0).astype(np.int32) + (xs[:, :, 0, 0, 0] > 1)).astype(np.int32)
    out = s.initAnchorArrays()
    losses = []
    for _ in range(6):
        s.run(popart.PyStepIO({x: xs, lab: ys}, out))
        losses.append(out[loss].mean())
    assert losses[-1] < 0.6 * losses[0]
    with pytest.raises(popart.popart_exception, match="too many positional"):
        b.aiOnnx.relu([c], 1)


def test_batch_normalization_trains_with_batch_statistics():
    """In a TrainingSession BatchNormalization normalises with the batch's statistics and updates
    its running statistics (momentum * running + (1 - momentum) * batch), as ONNX training mode does."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor("FLOAT", [4, 3, 2, 2], "x")
    scale, bias = np.array([1.0, 2.0, 0.5], np.float32), np.array([0.0, 0.1, -0.2], np.float32)
    sc = b.addInitializedInputTensor(scale, "scale")
    bi = b.addInitializedInputTensor(bias, "bias")
    mu = b.addInitializedInputTensor(np.zeros(3, np.float32), "mean")
    va = b.addInitializedInputTensor(np.ones(3, np.float32), "var")
    (y,) = b.aiOnnx.batchnormalization([x, sc, bi, mu, va], 1, 1e-5, 0.8)
    loss = b.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)
    art = popart.AnchorReturnType("ALL")
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {y: art, "Gradient___scale": art}), loss,
                               popart.SGD(0.0), popart.DeviceManager().createCpuDevice())
    assert s.getTrainableTensorIds() == ["scale", "bias"]
    s.prepareDevice()
    s.weightsFromHost()
    xs = rng.standard_normal((4, 3, 2, 2)).astype(np.float32) * 2 + 1
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: xs}, out))
    m, v = xs.mean((0, 2, 3)), xs.var((0, 2, 3))
    xhat = (xs - m[:, None, None]) / np.sqrt(v[:, None, None] + 1e-5)
    want = xhat * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(out[y], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["Gradient___scale"], (np.sign(want) * xhat).sum((0, 2, 3)), rtol=1e-5)
    stats = weights(s, "mean", "var")
    np.testing.assert_allclose(stats["mean"], 0.2 * m, rtol=1e-5)
    np.testing.assert_allclose(stats["var"], 0.8 + 0.2 * v, rtol=1e-5)


def test_dropout_drops_when_training_only():
    b = popart.Builder()
    x = b.addInputTensor("FLOAT", [1000], "x")
    w = b.addInitializedInputTensor(np.ones(1000, np.float32), "w")
    (d,) = b.aiOnnx.dropout([b.aiOnnx.mul([x, w])], num_outputs=1, ratio=0.25)
    loss = b.aiGraphcore.identityloss([d], popart.ReductionType.Sum)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(2, {d: popart.AnchorReturnType("ALL"),
                                                                      "Gradient___w": popart.AnchorReturnType("ALL")}),
                               loss, popart.ConstSGD(0.0), popart.DeviceManager().createCpuDevice())
    s.setRandomSeed(3)
    s.prepareDevice()
    out = s.initAnchorArrays()
    xs = np.full((2, 1000), 3.0, np.float32)
    s.run(popart.PyStepIO({x: xs}, out))
    assert set(np.unique(out[d])) == {0.0, 4.0}  # kept values scaled by 1 / (1 - 0.25)
    assert abs(np.mean(out[d] == 0) - 0.25) < 0.05
    assert not np.array_equal(out[d][0], out[d][1])  # a new mask every batch
    np.testing.assert_allclose(out["Gradient___w"], out[d] / 1.0)  # d loss / d w = x * mask / (1 - p)
    inf = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, [d]), popart.DeviceManager().createCpuDevice())
    inf.prepareDevice()
    o = inf.initAnchorArrays()
    inf.run(popart.PyStepIO({x: xs[0]}, o))
    np.testing.assert_array_equal(o[d], xs[0])


def test_weight_specific_hyper_parameters():
    b, ids = linear_model()
    W, B = ids["W"], ids["b"]
    opt = popart.SGD({"defaultLearningRate": (0.1, False), "defaultWeightDecay": (0.05, True)})
    opt.insertSpecific(B, {"learningRate": (0.5, False), "weightDecay": (0.0, True)})
    s = session(b, ids, opt)
    x, y = data(2)
    out = s.initAnchorArrays()
    w = weights(s, W, B)
    for k, (lr_w, lr_b) in enumerate([(0.1, 0.5), (0.2, 0.05)]):
        if k:
            new = popart.SGD({"defaultLearningRate": (lr_w, False), "defaultWeightDecay": (0.05, True)})
            new.insertSpecific(B, {"learningRate": (lr_b, False), "weightDecay": (0.0, True)})
            s.updateOptimizerFromHost(new)
        s.run(popart.PyStepIO({ids["x"]: x[k], ids["labels"]: y[k]}, out))
        _, gW, gb = numpy_grads(w[W], w[B], x[k], y[k])
        w = {W: w[W] - lr_w * (gW + 0.05 * w[W]), B: w[B] - lr_b * gb}
        got = weights(s, W, B)
        np.testing.assert_allclose(got[W], w[W], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[B], w[B], rtol=1e-5, atol=1e-6)
    with pytest.raises(popart.popart_exception, match="weight-specific"):
        s.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.1, False), "defaultWeightDecay": (0.05, True)}))
    with pytest.raises(popart.popart_exception, match="unknown hyper-parameter"):
        opt.insertSpecific(B, {"lossScaling": 2.0})
    bad = popart.SGD(0.1)
    bad.insertSpecific("nope", {"learningRate": 0.1})
    with pytest.raises(popart.popart_exception, match="not weights of the model"):
        session(b, ids, bad)


def test_builder_annotations_travel_with_the_builder():
    b = popart.Builder()
    x = b.addInputTensor("FLOAT", [2, 2])
    with b.virtualGraph(1), b.pipelineStage(0):
        y = b.aiOnnx.relu([x])
        assert b.getPipelineStage() == 0
    z = b.aiOnnx.exp([y])
    assert b.getVirtualGraph(y) == 1 and not b.nodeHasAttribute("__ipu_number", z)
    b.setAvailableMemoryProportion(z, 0.3)
    assert b.getNodeAttribute("__available_memory_proportion", z) == 0.3
    with pytest.raises(popart.popart_exception, match="no attribute"):
        b.getNodeAttribute("__pipeline_stage", z)
    with pytest.raises(popart.popart_exception, match="not the output of a node"):
        b.getVirtualGraph(x)
    onnx.checker.check_model(onnx.load_from_string(b.getModelProto()))  # the proto stays plain ONNX
