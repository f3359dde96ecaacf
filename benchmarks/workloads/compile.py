"""compile: time from nothing to a training program ready to run, for a 12-layer MLP
(784 -> 11 x 512 -> 10, batch 256, the mlp workloads' recipe).

popxl: trace the Ir (forward graph, autodiff, SGD step in ops.repeat) + Session construction
(lowering, engine load) + attach with weights to the device; 1 step per run, the same program
shape as JAX's one jitted step. JAX: trace, lower and XLA-compile a freshly defined step (a new
function each time, so nothing comes from JAX's caches). PyTorch eager has nothing to compile:
it is timed building its parameters and optimizer and running the first step.
"""
from __future__ import annotations

from typing import List

from benchmarks.common import Bench, Case, import_or_unavailable
from benchmarks.workloads import mlp
from benchmarks.workloads.training import build_popxl_program, jax_step_fn, torch_trainer

SIZES = (mlp.FEATURES, *[512] * 11, mlp.CLASSES)
BATCH = 256


def build_popxl() -> Bench:
    import popxl

    spec = mlp.make_spec(SIZES, BATCH)

    def call() -> None:
        ir = build_popxl_program(spec, mlp.popxl_forward, steps_per_run=1)[0]
        # weights_to_host_on_exit=False: leaving only detaches, so the copy back is not timed.
        with popxl.Session(ir, "cpu", weights_to_host_on_exit=False):
            pass
    return Bench(call, items=1, fixed_inner=1)


def build_jax() -> Bench:
    import_or_unavailable("jax")
    import jax
    import jax.numpy as jnp

    spec = mlp.make_spec(SIZES, BATCH)
    params = [jnp.asarray(p) for p in spec.params]
    x, y = jnp.asarray(spec.inputs[0]), jnp.asarray(spec.labels[0])

    def call() -> None:
        jax.jit(jax_step_fn(mlp.jax_forward, spec.lr), donate_argnums=0).lower(params, x, y).compile()
    return Bench(call, items=1, fixed_inner=1)


def build_torch() -> Bench:
    import_or_unavailable("torch")
    spec = mlp.make_spec(SIZES, BATCH)

    def call() -> None:
        torch_trainer(spec, mlp.torch_forward).call()
    return Bench(call, items=1, fixed_inner=1)


def cases(quick: bool) -> List[Case]:
    return [Case("compile", f"12-layer MLP width 512, batch {BATCH}", "s",
                 {"popxl": build_popxl, "torch": build_torch, "jax": build_jax},
                 lower_is_better=True)]
