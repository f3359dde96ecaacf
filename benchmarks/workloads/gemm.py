"""gemm: C = A @ B, square, float32 at n = 512, 1024, 2048 and float16/bfloat16 at n = 2048.

Each call computes one product into a buffer that stays on the device (popxl: a variable
updated by copy_var_update_; PyTorch: matmul(out=); JAX: a jitted matmul, blocked on), so the
measure is the GEMM, not host transfers. GFLOP/s = 2 n^3 / time.

popxl computes the product in the body of a one-iteration device loop (``ops.repeat``): written
in the main graph, a product of two variables nothing writes would be part of the session's
static program, computed once after each weight write rather than on every call.
"""
from __future__ import annotations

from typing import List

import numpy as np

from benchmarks.common import Bench, Case, Unavailable, import_or_unavailable

SIZES = (512, 1024, 2048)


def operands(n: int, dtype: str) -> List[np.ndarray]:
    """A and B, float32 values scaled so that C stays O(1), rounded to ``dtype`` once (every
    framework multiplies the same rounded numbers)."""
    rng = np.random.default_rng(n)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(np.sqrt(n)) for _ in range(2))
    if dtype == "float32":
        return [a, b]
    import ml_dtypes  # a popxl dependency; NumPy has no bfloat16
    np_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    return [a.astype(np_dtype).astype(np.float32), b.astype(np_dtype).astype(np.float32)]


def build_popxl(n: int, dtype: str) -> Bench:
    import popxl
    import popxl.ops as ops

    pdtype = getattr(popxl, dtype, None)
    if pdtype is None:
        raise Unavailable(f"popxl has no {dtype} dtype")
    a, b = operands(n, dtype)
    np_dtype = pdtype.as_numpy()
    ir = popxl.Ir()
    with ir.main_graph:
        A = popxl.variable(a.astype(np_dtype), pdtype, name="A")
        B = popxl.variable(b.astype(np_dtype), pdtype, name="B")
        C = popxl.variable(np.zeros((n, n), np_dtype), pdtype, name="C")

        def product(a: popxl.Tensor, b: popxl.Tensor, c: popxl.TensorByRef) -> None:
            ops.var_updates.copy_var_update_(c, a @ b)
        ops.repeat(ir.create_graph(product, A, B, C), 1, A, B, C)
    session = popxl.Session(ir, "cpu")
    session.__enter__()
    return Bench(lambda: session.run({}), items=2.0 * n ** 3,
                 output=lambda _: session.get_tensor_data(C).astype(np.float32),
                 close=lambda: session.__exit__(None, None, None))


def build_torch(n: int, dtype: str) -> Bench:
    torch = import_or_unavailable("torch")
    tdtype = getattr(torch, dtype)
    a, b = (torch.from_numpy(m).to(tdtype) for m in operands(n, dtype))
    c = torch.empty((n, n), dtype=tdtype)

    def call():
        torch.matmul(a, b, out=c)
        return c
    return Bench(call, items=2.0 * n ** 3)


def build_jax(n: int, dtype: str) -> Bench:
    import_or_unavailable("jax")
    import jax
    import jax.numpy as jnp

    a, b = (jnp.asarray(m, dtype=getattr(jnp, dtype)) for m in operands(n, dtype))
    mm = jax.jit(jnp.matmul)
    return Bench(lambda: mm(a, b).block_until_ready(), items=2.0 * n ** 3)


def cases(quick: bool) -> List[Case]:
    shapes = [(512, "float32")] if quick else \
        [*((n, "float32") for n in SIZES), (2048, "float16"), (2048, "bfloat16")]
    out = []
    for n, dtype in shapes:
        # Reduced-precision products differ in rounding and accumulation order between
        # libraries; float32 ones only in accumulation order.
        out.append(Case("gemm", f"n={n} {dtype}", "GFLOP/s",
                        {"popxl": lambda n=n, d=dtype: build_popxl(n, d),
                         "torch": lambda n=n, d=dtype: build_torch(n, d),
                         "jax": lambda n=n, d=dtype: build_jax(n, d)},
                        scale=1e9, rtol=1e-4 if dtype == "float32" else 1e-2))
    return out
