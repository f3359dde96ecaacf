"""mlp_small and mlp_big: MNIST-style MLP training (Linear layers with gelu between them, softmax
cross-entropy against int32 labels, plain SGD at lr 0.005), one definition for all frameworks.

The MLP definition here is shared with the `compile` workload (a 12-layer width-512 program).
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from benchmarks.common import Case
from benchmarks.workloads.training import STEPS, TrainSpec, training_builders

LR = 0.005
FEATURES, CLASSES = 784, 10
SMALL = (FEATURES, 32, CLASSES)
BIG = (FEATURES, 512, 512, CLASSES)


def init_params(sizes: Sequence[int], seed: int = 0) -> List[np.ndarray]:
    """He-normal weights (in, out) and zero biases, alternating W0, b0, W1, b1, ..."""
    rng = np.random.default_rng(seed)
    out: List[np.ndarray] = []
    for i, o in zip(sizes[:-1], sizes[1:]):
        out += [(rng.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32), np.zeros(o, np.float32)]
    return out


def make_spec(sizes: Sequence[int], batch: int, seed: int = 0) -> TrainSpec:
    """STEPS batches of standard-normal features and uniform labels, with fresh parameters."""
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((STEPS, batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], (STEPS, batch)).astype(np.int32)
    return TrainSpec(init_params(sizes, seed), x, y, LR)


# forward passes: x -> logits, gelu (tanh form, as popxl's gelu) after all but the last layer -----
def popxl_forward(x, *params):
    import popxl.ops as ops

    n = len(params) // 2
    for i in range(n):
        x = x @ params[2 * i] + params[2 * i + 1]
        x = ops.gelu(x) if i < n - 1 else x
    return x


def torch_forward(x, params):
    import torch

    n = len(params) // 2
    for i in range(n):
        x = torch.addmm(params[2 * i + 1], x, params[2 * i])  # what nn.Linear runs, with W as (in, out)
        x = torch.nn.functional.gelu(x, approximate="tanh") if i < n - 1 else x
    return x


def jax_forward(x, params):
    import jax

    n = len(params) // 2
    for i in range(n):
        x = x @ params[2 * i] + params[2 * i + 1]
        x = jax.nn.gelu(x, approximate=True) if i < n - 1 else x
    return x


# NumPy reference: the same STEPS SGD steps in float64, the correctness oracle ----------------------
_C = np.sqrt(2.0 / np.pi)


def _gelu_and_grad(z: np.ndarray):
    t = np.tanh(_C * (z + 0.044715 * z ** 3))
    return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _C * (1 + 3 * 0.044715 * z * z)


def numpy_losses(spec: TrainSpec) -> np.ndarray:
    """Loss of each of the STEPS steps, computed by hand (forward, backward, update)."""
    ps = [p.astype(np.float64) for p in spec.params]
    n, losses = len(ps) // 2, []
    for x, y in zip(spec.inputs.astype(np.float64), spec.labels):
        acts, slopes = [x], []
        for i in range(n):
            z = acts[-1] @ ps[2 * i] + ps[2 * i + 1]
            if i < n - 1:
                a, s = _gelu_and_grad(z)
                acts.append(a)
                slopes.append(s)
            else:
                acts.append(z)
        logits = acts[-1] - acts[-1].max(axis=1, keepdims=True)
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        losses.append(-np.mean(np.log(probs[rows, y])))
        d = probs
        d[rows, y] -= 1
        d /= len(y)
        for i in reversed(range(n)):
            gW, gb = acts[i].T @ d, d.sum(axis=0)
            d = d @ ps[2 * i].T
            if i > 0:
                d *= slopes[i - 1]
            ps[2 * i] -= spec.lr * gW
            ps[2 * i + 1] -= spec.lr * gb
    return np.array(losses)


def _case(name: str, sizes: Sequence[int], batch: int, must_match: bool, torch_compile: bool = False) -> Case:
    def spec() -> TrainSpec:
        return make_spec(sizes, batch)
    return Case(name, f"batch {batch}, {'-'.join(map(str, sizes))}", "steps/s",
                training_builders(spec, popxl_forward, torch_forward, jax_forward, torch_compile=torch_compile),
                rtol=1e-4, reference=lambda: numpy_losses(spec()), must_match=must_match)


def cases(quick: bool) -> List[Case]:
    return [_case("mlp_small", SMALL, 8, must_match=True)]


def big_cases(quick: bool) -> List[Case]:
    return [_case("mlp_big", BIG, 256, must_match=False, torch_compile=True)]
