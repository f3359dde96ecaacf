"""overhead: the fixed cost of one run that streams 4 floats in and 4 out and computes nothing.

popxl: session.run (allocates the outputs, as a user calls it) and run_with_outputs (reuses
them). Peers do the closest thing they have: PyTorch wraps the NumPy input, copies it and hands
back a NumPy array; JAX calls a jitted copy and brings the result back to NumPy.
"""
from __future__ import annotations

from typing import List

import numpy as np

from benchmarks.common import Bench, Case, import_or_unavailable

X = np.arange(4, dtype=np.float32)


def build_popxl(reuse_outputs: bool) -> Bench:
    import popxl
    import popxl.ops as ops

    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((4,), popxl.float32, name="x")
        y_stream = popxl.d2h_stream((4,), popxl.float32, name="y")
        ops.host_store(y_stream, ops.host_load(x_stream))
    session = popxl.Session(ir, "cpu")
    session.__enter__()
    inputs = {x_stream: X}
    if reuse_outputs:
        outputs = session.create_host_outputs()

        def call():
            session.run_with_outputs(inputs, outputs)
            return outputs[y_stream]
    else:
        def call():
            return session.run(inputs)[y_stream]
    return Bench(call, items=1, close=lambda: session.__exit__(None, None, None))


def build_torch() -> Bench:
    torch = import_or_unavailable("torch")
    return Bench(lambda: torch.from_numpy(X).clone().numpy(), items=1)


def build_jax() -> Bench:
    import_or_unavailable("jax")
    import jax
    import jax.numpy as jnp

    copy = jax.jit(jnp.copy)
    return Bench(lambda: np.asarray(copy(X)), items=1)


def cases(quick: bool) -> List[Case]:
    peers = {"torch": build_torch, "jax": build_jax}
    return [Case("overhead", f"4 floats in/out, {how}", "µs/run",
                 {"popxl": lambda r=reuse: build_popxl(r), **peers}, lower_is_better=True, scale=1e6, rtol=0.0)
            for how, reuse in (("run()", False), ("run_with_outputs()", True))]
