"""Tutorial: train a softmax-regression digit classifier with popxl, gradients written by hand.

The data is the 8x8 handwritten-digits set that scikit-learn ships (no download). The training
program streams one mini-batch per step, runs ``steps_per_run`` steps inside the device loop
(``ops.repeat`` + ``ir.num_host_transfers``), and streams the loss of every step back. A second
Ir evaluates the trained weights on held-out digits.

    python tutorials/digits_softmax_regression.py            # full run
    python tutorials/digits_softmax_regression.py --epochs 2  # quicker
"""
from __future__ import annotations

import argparse
from typing import Any, Dict

import numpy as np

import popxl
import popxl.ops as ops


try:  # the data: the same split as the MLP tutorial's
    from digits_mlp import load_digits_split
except ImportError:  # imported as tutorials.digits_softmax_regression
    from tutorials.digits_mlp import load_digits_split  # type: ignore[no-redef]


def build_training_ir(batch: int, steps_per_run: int, lr: float, features: int = 64, classes: int = 10):
    ir = popxl.Ir()
    ir.num_host_transfers = steps_per_run
    with ir.main_graph:
        W = popxl.variable(np.zeros((features, classes), np.float32), name="W")
        b = popxl.variable(np.zeros((classes,), np.float32), name="b")
        x_stream = popxl.h2d_stream((batch, features), popxl.float32, name="x")
        y_stream = popxl.h2d_stream((batch, classes), popxl.float32, name="onehot")
        loss_stream = popxl.d2h_stream((), popxl.float32, name="loss")

        def train_step(W: popxl.TensorByRef, b: popxl.TensorByRef):
            x = ops.host_load(x_stream, "x")
            onehot = ops.host_load(y_stream, "onehot")
            probs = ops.softmax(x @ W + b, axis=-1)
            loss = -ops.mean(ops.sum(onehot * ops.log(probs + 1e-9), axis=-1))
            ops.host_store(loss_stream, loss)
            # d(loss)/d(logits) of softmax + cross-entropy, averaged over the batch
            dlogits = (probs - onehot) * (1.0 / batch)
            ops.scaled_add_(W, x.T @ dlogits, b=-lr)
            ops.scaled_add_(b, ops.sum(dlogits, axis=0), b=-lr)

        step = ir.create_graph(train_step, W, b)
        ops.repeat(step, steps_per_run, W, b)
    return ir, (W, b), (x_stream, y_stream), loss_stream


def build_eval_ir(n: int, features: int = 64, classes: int = 10):
    ir = popxl.Ir()
    with ir.main_graph:
        W = popxl.variable(np.zeros((features, classes), np.float32), name="W")
        b = popxl.variable(np.zeros((classes,), np.float32), name="b")
        x_stream = popxl.h2d_stream((n, features), popxl.float32, name="x")
        probs_stream = popxl.d2h_stream((n, classes), popxl.float32, name="probs")
        ops.host_store(probs_stream, ops.softmax(ops.host_load(x_stream) @ W + b, axis=-1))
    return ir, (W, b), x_stream, probs_stream


def train(epochs: int = 10, batch: int = 32, steps_per_run: int = 10, lr: float = 0.5,
          seed: int = 0) -> Dict[str, Any]:
    x_train, y_train, x_test, y_test = load_digits_split(seed)
    ir, (W, b), (x_stream, y_stream), loss_stream = build_training_ir(batch, steps_per_run, lr)
    per_run = batch * steps_per_run
    runs_per_epoch = len(x_train) // per_run
    rng = np.random.default_rng(seed)
    losses = []
    session = popxl.Session(ir, "ipu_model")
    with session:
        for _ in range(epochs):
            order = rng.permutation(len(x_train))
            for r in range(runs_per_epoch):
                idx = order[r * per_run:(r + 1) * per_run]
                xb = x_train[idx].reshape(steps_per_run, batch, -1)
                yb = np.eye(10, dtype=np.float32)[y_train[idx]].reshape(steps_per_run, batch, 10)
                out = session.run({x_stream: xb, y_stream: yb})
                losses.extend(out[loss_stream].tolist())
    trained = session.get_tensors_data([W, b])

    eval_ir, (W_e, b_e), x_eval, probs_stream = build_eval_ir(len(x_test))
    eval_session = popxl.Session(eval_ir, "ipu_model")
    eval_session.write_variables_data({W_e: trained[W], b_e: trained[b]})
    with eval_session:
        probs = eval_session.run({x_eval: x_test})[probs_stream]
    accuracy = float(np.mean(np.argmax(probs, axis=-1) == y_test))
    return {"losses": losses, "accuracy": accuracy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    result = train(args.epochs, args.batch, args.steps_per_run, args.lr)
    losses = result["losses"]
    k = max(1, len(losses) // 10)
    print(f"loss: first {np.mean(losses[:k]):.4f} -> last {np.mean(losses[-k:]):.4f} over {len(losses)} steps")
    print(f"held-out accuracy: {result['accuracy']:.2%}")


if __name__ == "__main__":
    main()
