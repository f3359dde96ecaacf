"""Data-parallel training with popxl, one process or several under poprun.

A softmax regression trains for ``STEPS`` steps in one ``session.run``: every replica loads its own
batch, computes its gradient, the replicas average their gradients with
``replicated_all_reduce`` and each applies the same SGD update. ``Ir(replication="popdist")``
takes the replicas from the launcher: run alone, the program is one replica; under poprun each
process (instance) runs its share of the replicas and the all-reduce spans the processes::

    python examples/poprun_data_parallel.py                                              # 1 replica
    poprun --num-instances 2 --num-replicas 2 python examples/poprun_data_parallel.py    # 2 processes x 1

At the end every instance compares its weights with NumPy running the same training on all the
replicas' batches, and instance 0 prints the losses.
"""
from __future__ import annotations

import numpy as np

import popdist
import popxl
import popxl.ops as ops

STEPS, BATCH, FEATURES, CLASSES, LR = 20, 8, 16, 4, 0.5


def batches(replica: int):
    """The (STEPS, BATCH, ...) inputs and labels of one global replica: the same whichever process runs it."""
    rng = np.random.default_rng(100 + replica)
    x = rng.standard_normal((STEPS, BATCH, FEATURES)).astype(np.float32)
    return x, np.argmax(x[..., :CLASSES], axis=-1).astype(np.int32)  # labels a linear model can learn


def numpy_training(replicas: int) -> np.ndarray:
    """The same training in float64 NumPy: the gradient averaged over every replica's batch."""
    data = [batches(r) for r in range(replicas)]
    w = np.zeros((FEATURES, CLASSES))
    for step in range(STEPS):
        grads = []
        for x, y in data:
            z = x[step] @ w
            p = np.exp(z - z.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            p[np.arange(BATCH), y[step]] -= 1
            grads.append(x[step].T @ p / BATCH)
        w -= LR * np.mean(grads, axis=0)
    return w


def main() -> None:
    ir = popxl.Ir(replication="popdist")
    ir.num_host_transfers = STEPS
    with ir.main_graph:
        w = popxl.variable(np.zeros((FEATURES, CLASSES), np.float32), name="w")
        x_stream = popxl.h2d_stream((BATCH, FEATURES), popxl.float32, "x")
        y_stream = popxl.h2d_stream((BATCH,), popxl.int32, "y")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")

        def step(w: popxl.TensorByRef):
            x = ops.host_load(x_stream)
            probs = ops.softmax(x @ w, axis=1)
            loss, dlogits = ops.nll_loss_with_softmax_grad(probs, ops.host_load(y_stream))
            dw = ops.collectives.replicated_all_reduce(ops.transpose(x) @ dlogits, "mean")
            ops.scaled_add_(w, dw, b=-LR)
            ops.host_store(loss_stream, loss)

        ops.repeat(ir.create_graph(step, w), STEPS, w)

    # host buffers: (STEPS, replicas of this process, ...), the replica axis dropped when there is one
    offset, local = popdist.getReplicaIndexOffset(), ir.instance_replication_factor
    mine = [batches(offset + r) for r in range(local)]
    feed = {s: np.stack([d[i] for d in mine], axis=1) if local > 1 else mine[0][i]
            for i, s in enumerate((x_stream, y_stream))}
    with popxl.Session(ir, "ipu_model") as session:
        losses = session.run(feed)[loss_stream]
        trained = session.get_tensor_data(w)

    expected = numpy_training(ir.replication_factor)
    np.testing.assert_allclose(trained, expected, rtol=1e-4, atol=1e-5)
    if popdist.getInstanceIndex() == 0:
        first, last = losses[0].mean(), losses[-1].mean()
        print(f"{popdist.getNumInstances()} instance(s), {ir.replication_factor} replica(s): "
              f"loss {first:.3f} -> {last:.3f}; weights equal NumPy's "
              f"(max difference {np.abs(trained - expected).max():.1e})")


if __name__ == "__main__":
    main()
