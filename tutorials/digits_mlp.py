"""Tutorial: the classic PopXL MLP, trained with autodiff on scikit-learn's handwritten digits.

The model is written as PopXL programs are: ``Linear`` Modules whose weights are graph inputs,
one subgraph per layer, ``transforms.autodiff`` per layer, activations passed explicitly from the
forward calls to the gradient calls with ``GradGraphInfo.inputs_dict``, and plain ``scaled_add_``
updates (an optimiser is just more ops; see digits_mlp_adam.py and digits_mlp_accumulate.py).

The training program runs ``steps_per_run`` steps per ``session.run`` inside the device loop
(``ops.repeat`` + ``ir.num_host_transfers``). A separate test Ir reads the trained weights back
with ``get_tensors_data`` / ``write_variables_data`` and measures held-out accuracy.

    python tutorials/digits_mlp.py                 # full run (>= 90% held-out accuracy)
    python tutorials/digits_mlp.py --epochs 2      # quicker
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl import transforms

FEATURES, CLASSES = 64, 10


def load_digits_split(seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train/test split (80/20) of the 8x8 digits, pixels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the tutorials' data (the 8x8 digits) comes with scikit-learn, which is not installed: "
                          "pip install -e '.[tutorials]' (or '.[dev]') from popxl-cpu's root") from None

    pixels, labels = load_digits(return_X_y=True)
    x = (pixels / 16.0).astype(np.float32)
    y = labels.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = len(x) // 5
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


class Linear(popxl.Module):
    """x @ W + b, with an optional gelu. W and b are graph inputs, bound at the call site."""

    def __init__(self, out_features: int, gelu: bool = True) -> None:
        self.out_features, self.gelu = out_features, gelu

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        self.W = popxl.graph_input((x.shape[-1], self.out_features), popxl.float32, "W")
        self.b = popxl.graph_input((self.out_features,), popxl.float32, "b")
        y = x @ self.W + self.b
        return ops.gelu(y) if self.gelu else y


def init_weights(sizes: Sequence[int], seed: int) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"W": (rng.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32),
             "b": np.zeros(o, np.float32)} for i, o in zip(sizes[:-1], sizes[1:])]


class Layer:
    """One layer of the training program: its forward graph, gradient graph and variables."""

    def __init__(self, ir: popxl.Ir, module: Linear, x_spec: popxl.TensorSpec, init: Dict[str, np.ndarray],
                 name: str) -> None:
        self.module = module
        self.graph = ir.create_graph(module, x_spec)
        self.grad = transforms.autodiff(self.graph)  # its activations become extra outputs of self.graph
        self.W = popxl.variable(init["W"], name=f"{name}.W")
        self.b = popxl.variable(init["b"], name=f"{name}.b")

    def forward(self, x: popxl.Tensor, W: popxl.Tensor, b: popxl.Tensor):
        info = ops.call_with_info(self.graph, x, inputs_dict={self.module.W: W, self.module.b: b})
        return info.outputs[0], info

    def backward(self, dy: popxl.Tensor, fwd_info) -> Dict[popxl.Tensor, popxl.Tensor]:
        """Call the gradient graph; returns {parent tensor: its gradient} for x, W and b."""
        grad_info = ops.call_with_info(self.grad.graph, dy, inputs_dict=self.grad.inputs_dict(fwd_info))
        return self.grad.fwd_parent_ins_to_grad_parent_outs(fwd_info, grad_info)


class SGD:
    """Plain SGD. An optimiser says what state each variable needs (initial host values) and
    traces the update of one variable from its gradient and state."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def state(self, var: popxl.Variable) -> List[np.ndarray]:
        return []

    def update(self, var: popxl.Tensor, grad: popxl.Tensor, *state: popxl.Tensor) -> None:
        ops.scaled_add_(var, grad, b=-self.lr)


def build_training_ir(batch: int, steps_per_run: int, hidden: Sequence[int], weights, optimizer,
                      accumulate: int = 1):
    """The training program: ``steps_per_run`` optimiser steps per run. With ``accumulate`` > 1,
    each step averages the gradients of that many micro-batches (``accumulate_``) before the
    update and then zeroes the accumulators."""
    ir = popxl.Ir()
    ir.num_host_transfers = steps_per_run * accumulate
    sizes = [FEATURES, *hidden, CLASSES]
    with ir.main_graph:
        x_stream = popxl.h2d_stream((batch, FEATURES), popxl.float32, name="x")
        label_stream = popxl.h2d_stream((batch,), popxl.int32, name="labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, name="loss")
        layers, spec = [], popxl.TensorSpec((batch, FEATURES), popxl.float32)
        for i, (w, out) in enumerate(zip(weights, sizes[1:])):
            layers.append(Layer(ir, Linear(out, gelu=i < len(weights) - 1), spec, w, f"layer{i}"))
            spec = popxl.TensorSpec((batch, out), popxl.float32)
        params = [v for layer in layers for v in (layer.W, layer.b)]
        states = [[popxl.variable(s, name=f"{v.name}.state{k}") for k, s in enumerate(optimizer.state(v))]
                  for v in params]
        accums = [popxl.variable(np.zeros(v.shape, np.float32), name=f"{v.name}.accum") for v in params] \
            if accumulate > 1 else []
        n = len(params)

        def gradients(ps: Sequence[popxl.Tensor]) -> List[popxl.Tensor]:
            """Forward, loss and backward of one micro-batch; the gradients of ``ps``."""
            x = ops.host_load(x_stream, "x")
            labels = ops.host_load(label_stream, "labels")
            sites = []
            for layer, W, b in zip(layers, ps[0::2], ps[1::2]):
                x, info = layer.forward(x, W, b)
                sites.append(info)
            loss, dx = ops.nll_loss_with_softmax_grad(ops.softmax(x, axis=-1), labels)
            ops.host_store(loss_stream, loss)
            grads = {}
            for layer, info in zip(reversed(layers), reversed(sites)):
                by_parent = layer.backward(dx, info)
                dx = by_parent[info.parent_input(0)]
                grads.update(by_parent)
            return [grads[p] for p in ps]

        def update_all(ps, grads, flat_states) -> None:
            it = iter(flat_states)
            for p, g, st in zip(ps, grads, states):
                optimizer.update(p, g, *[next(it) for _ in st])

        flat_states = [s for st in states for s in st]
        if accumulate == 1:
            def step(*ts: popxl.TensorByRef) -> None:
                update_all(ts[:n], gradients(ts[:n]), ts[n:])
            body_args = [*params, *flat_states]
        else:
            def micro_batch(*ts: popxl.TensorByRef) -> None:
                for acc, g in zip(ts[n:], gradients(ts[:n])):
                    ops.var_updates.accumulate_(acc, g, 1.0 / accumulate)
            micro = ir.create_graph(micro_batch, *params, *accums)

            def step(*ts: popxl.TensorByRef) -> None:
                ps, acc, st = ts[:n], ts[n:2 * n], ts[2 * n:]
                ops.repeat(micro, accumulate, *ps, *acc)
                update_all(ps, acc, st)
                for a in acc:
                    ops.var_updates.accumulator_zero_(a)
            body_args = [*params, *accums, *flat_states]
        ops.repeat(ir.create_graph(step, *body_args), steps_per_run, *body_args)
    return ir, params, (x_stream, label_stream), loss_stream


def build_eval_ir(n: int, hidden: Sequence[int]):
    """Inference on ``n`` examples; its variables are written from the trained ones."""
    ir = popxl.Ir()
    sizes = [FEATURES, *hidden, CLASSES]
    with ir.main_graph:
        x_stream = popxl.h2d_stream((n, FEATURES), popxl.float32, name="x")
        probs_stream = popxl.d2h_stream((n, CLASSES), popxl.float32, name="probs")
        x, variables = ops.host_load(x_stream), []
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            W = popxl.variable(np.zeros((d_in, d_out), np.float32), name=f"layer{i}.W")
            b = popxl.variable(np.zeros(d_out, np.float32), name=f"layer{i}.b")
            x = x @ W + b
            x = ops.gelu(x) if i < len(sizes) - 2 else x
            variables += [W, b]
        ops.host_store(probs_stream, ops.softmax(x, axis=-1))
    return ir, variables, x_stream, probs_stream


def train(epochs: int = 10, batch: int = 32, steps_per_run: int = 10, hidden: Sequence[int] = (32,),
          optimizer=None, accumulate: int = 1, seed: int = 0) -> Dict[str, Any]:
    """Train, then evaluate on the held-out fifth. Returns the per-step losses and the accuracy."""
    optimizer = optimizer if optimizer is not None else SGD(0.1)
    x_train, y_train, x_test, y_test = load_digits_split(seed)
    weights = init_weights([FEATURES, *hidden, CLASSES], seed)
    ir, variables, (x_stream, label_stream), loss_stream = build_training_ir(
        batch, steps_per_run, hidden, weights, optimizer, accumulate)
    per_run = batch * steps_per_run * accumulate
    rng = np.random.default_rng(seed)
    losses: List[float] = []
    session = popxl.Session(ir, "ipu_model")
    with session:
        for _ in range(epochs):
            order = rng.permutation(len(x_train))
            for r in range(len(x_train) // per_run):
                idx = order[r * per_run:(r + 1) * per_run]
                out = session.run({x_stream: x_train[idx].reshape(-1, batch, FEATURES),
                                   label_stream: y_train[idx].reshape(-1, batch)})
                losses.extend(out[loss_stream].tolist())
    trained = session.get_tensors_data(variables)

    eval_ir, eval_vars, x_eval, probs_stream = build_eval_ir(len(x_test), hidden)
    eval_session = popxl.Session(eval_ir, "ipu_model")
    eval_session.write_variables_data({e: trained[v] for e, v in zip(eval_vars, variables)})
    with eval_session:
        probs = eval_session.run({x_eval: x_test})[probs_stream]
    accuracy = float(np.mean(np.argmax(probs, axis=-1) == y_test))
    return {"losses": losses, "accuracy": accuracy}


def report(result: Dict[str, Any]) -> None:
    losses = result["losses"]
    k = max(1, len(losses) // 10)
    print(f"loss: first {np.mean(losses[:k]):.4f} -> last {np.mean(losses[-k:]):.4f} over {len(losses)} steps")
    print(f"held-out accuracy: {result['accuracy']:.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    report(train(args.epochs, args.batch, optimizer=SGD(args.lr)))


if __name__ == "__main__":
    main()
