"""PopART training: build a model with popart.Builder, train it with a TrainingSession.

A softmax classifier (``x @ W + b``, softmax, PopART's ``nllloss``) is built op by op with the
Builder, then ``TrainingSession`` runs ``BATCHES_PER_STEP`` SGD steps per ``run``, the data fed
through ``PyStepIO``. The loss falls, and the trained weights read back with ``readWeights`` give
the accuracy on held-out data::

    python examples/popart_training.py
"""
from __future__ import annotations

import numpy as np

import popart

BATCH, FEATURES, CLASSES, BATCHES_PER_STEP, RUNS = 16, 10, 4, 10, 8


def make_data(samples: int, seed: int):
    """Points labelled by which of the first CLASSES features is largest (a linear model can learn it)."""
    x = np.random.default_rng(seed).standard_normal((samples, FEATURES)).astype(np.float32)
    return x, np.argmax(x[:, :CLASSES], axis=1).astype(np.int32)


def build():
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [BATCH, FEATURES]), "x")
    labels = builder.addInputTensor(popart.TensorInfo("INT32", [BATCH]), "labels")
    w = builder.addInitializedInputTensor(np.zeros((FEATURES, CLASSES), np.float32), "W")
    b = builder.addInitializedInputTensor(np.zeros(CLASSES, np.float32), "b")
    logits = builder.aiOnnx.add([builder.aiOnnx.matmul([x, w]), b])
    probs = builder.aiOnnx.softmax([logits], axis=1)
    loss = builder.aiGraphcore.nllloss([probs, labels], popart.ReductionType.Mean)
    builder.addOutputTensor(probs)
    return builder, x, labels, w, b, loss


def main() -> None:
    builder, x, labels, w, b, loss = build()
    session = popart.TrainingSession(fnModel=builder.getModelProto(),
                                     dataFlow=popart.DataFlow(BATCHES_PER_STEP, {loss: popart.AnchorReturnType("All")}),
                                     loss=loss, optimizer=popart.ConstSGD(0.5),
                                     deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()              # {loss: (BATCHES_PER_STEP,) array}

    xs, ys = make_data(RUNS * BATCHES_PER_STEP * BATCH, seed=0)
    losses = []
    for run in range(RUNS):                           # each run: BATCHES_PER_STEP SGD steps
        rows = slice(run * BATCHES_PER_STEP * BATCH, (run + 1) * BATCHES_PER_STEP * BATCH)
        feed = {x: xs[rows].reshape(BATCHES_PER_STEP, BATCH, FEATURES),
                labels: ys[rows].reshape(BATCHES_PER_STEP, BATCH)}
        session.run(popart.PyStepIO(feed, anchors))
        losses.append(float(anchors[loss].mean()))
    print("mean loss per run:", " ".join(f"{v:.3f}" for v in losses))

    session.weightsToHost()
    trained = {w: np.zeros((FEATURES, CLASSES), np.float32), b: np.zeros(CLASSES, np.float32)}
    session.readWeights(popart.PyWeightsIO(trained))
    x_test, y_test = make_data(1000, seed=1)
    accuracy = np.mean(np.argmax(x_test @ trained[w] + trained[b], axis=1) == y_test)
    print(f"held-out accuracy {accuracy:.1%}")
    assert losses[-1] < 0.5 * losses[0] and accuracy > 0.8, (losses, accuracy)


if __name__ == "__main__":
    main()
