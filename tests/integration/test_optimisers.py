"""Optimisers as PopXL users write them (var_updates + autodiff), checked step by step against
NumPy: SGD with momentum, Adam, AdamW, LAMB, and loss scaling."""
from typing import Callable, Dict

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.ops import var_updates

R = np.random.default_rng(5)
X = R.standard_normal((6, 3)).astype(np.float32)
Y = R.standard_normal((6, 2)).astype(np.float32)
W0 = R.standard_normal((3, 2)).astype(np.float32)
STEPS = 3


def loss_grad(w: np.ndarray) -> np.ndarray:
    """d/dw of mean((X @ w - Y)^2)."""
    return (2.0 / Y.size) * X.T @ (X @ w - Y)


def run(update: Callable, state: Dict[str, np.ndarray], loss_scale: float = 1.0) -> np.ndarray:
    """STEPS training steps on the device: loss = mean((x @ w - y)^2), gradient by autodiff
    (seeded with ``loss_scale``), then ``update(w, grad, **state_tensors)``."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(W0, name="w")
        st = {k: popxl.variable(v, name=k) for k, v in state.items()}
        spec = popxl.TensorSpec(W0.shape, popxl.float32)
        fwd = ir.create_graph(lambda wt: ops.mean((popxl.constant(X) @ wt - popxl.constant(Y)) ** 2.0), spec)
        info = transforms.autodiff(fwd)
        names = list(st)

        def step(wt: popxl.TensorByRef, *sts: popxl.TensorByRef) -> None:
            site = ops.call_with_info(fwd, wt)
            (g,) = ops.call(info.graph, popxl.constant(np.float32(loss_scale)), inputs_dict=info.inputs_dict(site))
            update(wt, g, **dict(zip(names, sts)))

        ops.repeat(ir.create_graph(step, w, *st.values()), STEPS, w, *st.values())
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
    return sess.get_tensor_data(w)


def numpy_steps(update: Callable, state: Dict[str, np.ndarray]) -> np.ndarray:
    w, state = W0.astype(np.float64), {k: v.astype(np.float64) for k, v in state.items()}
    for _ in range(STEPS):
        w = update(w, loss_grad(w), state)
    return w


def test_sgd_with_momentum():
    lr, mom = 0.1, 0.9

    def device(w, g, v):
        var_updates.accumulator_scale_(v, mom)
        var_updates.accumulate_(v, g)
        ops.scaled_add_(w, v, b=-lr)

    def host(w, g, s):
        s["v"] = mom * s["v"] + g
        return w - lr * s["v"]

    state = {"v": np.zeros_like(W0)}
    np.testing.assert_allclose(run(device, state), numpy_steps(host, state), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_and_adamw(wd):
    lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-7

    def device(w, g, m, v, t):
        var_updates.accumulate_moving_average_(m, g, b1)
        var_updates.accumulate_moving_average_square_(v, g, b2)
        upd = var_updates.adam_updater(m, v, weight=w if wd else None, time_step=t, weight_decay=wd or None,
                                       beta1=b1, beta2=b2, epsilon=eps)
        ops.scaled_add_(w, upd, b=-lr)

    def host(w, g, s):
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = b2 * s["v"] + (1 - b2) * g * g
        s["t"] = s["t"] + 1
        mh, vh = s["m"] / (1 - b1 ** s["t"]), s["v"] / (1 - b2 ** s["t"])
        return w - lr * (mh / (np.sqrt(vh) + eps) + wd * w)

    state = {"m": np.zeros_like(W0), "v": np.zeros_like(W0), "t": np.zeros((), np.float32)}
    np.testing.assert_allclose(run(device, state), numpy_steps(host, state), rtol=1e-4, atol=1e-5)


def test_lamb():
    lr, b1, b2, eps, wd, mwn = 0.05, 0.9, 0.999, 1e-6, 0.01, 1.5  # mwn clips the weight norm (~1.9)

    def device(w, g, m, v, t):
        var_updates.accumulate_moving_average_(m, g, b1)
        var_updates.accumulate_moving_average_square_(v, g, b2)
        upd = var_updates.lamb_updater(m, v, weight=w, time_step=t, weight_decay=wd, beta1=b1, beta2=b2,
                                       epsilon=eps)
        var_updates.adam_var_update(w, upd, ops.lamb_square(w), ops.lamb_square(upd), learning_rate=lr,
                                    max_weight_norm=mwn)

    def host(w, g, s):
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = b2 * s["v"] + (1 - b2) * g * g
        s["t"] = s["t"] + 1
        upd = s["m"] / (1 - b1 ** s["t"]) / (np.sqrt(s["v"] / (1 - b2 ** s["t"])) + eps) + wd * w
        ratio = min(np.sqrt(np.sum(w * w)), mwn) / np.sqrt(np.sum(upd * upd))  # trust ratio
        return w - lr * ratio * upd

    state = {"m": np.zeros_like(W0), "v": np.zeros_like(W0), "t": np.zeros((), np.float32)}
    np.testing.assert_allclose(run(device, state), numpy_steps(host, state), rtol=1e-4, atol=1e-5)


def test_loss_scaling_gives_the_same_update():
    """Seed the gradient with S and divide it out in the update: the same weights as unscaled."""
    lr, scale = 0.1, 1024.0
    plain = run(lambda w, g: ops.scaled_add_(w, g, b=-lr), {})
    scaled = run(lambda w, g: ops.scaled_add_(w, g, b=-lr / scale), {}, loss_scale=scale)
    np.testing.assert_allclose(scaled, plain, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(plain, numpy_steps(lambda w, g, s: w - lr * g, {}), rtol=1e-5, atol=1e-6)
