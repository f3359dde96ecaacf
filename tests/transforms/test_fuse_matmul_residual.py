"""Linear layers as transformers apply them: a stack of matrices times one weight (one folded
GEMM in the native engine) and fuse_matmul's third rewrite, (x @ W + b) + residual as one
matmul_bias_add whose GEMM starts from bias + residual."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.op import create_op
from popxl.transforms import fuse_matmul

from engine_harness import compare_engines

rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# (x shape, w shape): stacks of rows that fold into one GEMM, a broadcast 2-D weight, thin sides
@pytest.mark.parametrize("xs,ws", [((4, 33, 20), (20, 7)), ((2, 3, 17, 64), (64, 96)), ((3, 40, 8), (8, 300)),
                                   ((5, 64), (64, 64))])
@pytest.mark.usefixtures("each_blas")
def test_matmul_of_a_stack_and_one_weight(xs, ws):
    x, w = rand(*xs), rand(*ws)
    got = compare_engines(lambda x, w: x @ w, [x, w], rtol=1e-5, atol=1e-5, native_ops=["matmul"])
    np.testing.assert_allclose(got[0], x @ w, rtol=1e-5, atol=1e-5)


def test_matmul_of_a_strided_stack():
    """Rows not evenly spaced through the stack (a transposed view): no fold, same values."""
    x, w = rand(20, 6, 33), rand(20, 9)
    got = compare_engines(lambda x, w: ops.transpose(x, (2, 1, 0)) @ w, [x, w], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0], x.transpose(2, 1, 0) @ w, rtol=1e-5, atol=1e-5)


# small products (sgemm) and ones past a million multiply-adds with at most 1024 columns (oneDNN's
# matmul with a binary-add post-op, on AVX-512 CPUs)
@pytest.mark.parametrize("xs,ws", [((2, 16, 24), (24, 40)), ((48, 5), (5, 3)), ((3, 4, 8, 8), (8, 8)),
                                   ((4, 128, 96), (96, 256)), ((512, 200), (200, 768))])
@pytest.mark.usefixtures("each_blas")
def test_matmul_bias_add_native_matches_reference(xs, ws):
    x, w = rand(*xs), rand(*ws)
    b, r = rand(ws[1]), rand(*xs[:-1], ws[1])
    # float32 rounding of a k-term sum grows with sqrt(k) (the order of the sums differs: AVX2's
    # OpenBLAS kernels against NumPy's missed atol=1e-5 by 2e-5 at k = 200)
    atol = 1e-5 * np.sqrt(ws[0])
    got = compare_engines(lambda x, w, b, r: create_op("matmul_bias_add", [x, w, b, r])[0], [x, w, b, r],
                          rtol=1e-5, atol=atol, native_ops=["matmul_bias_add"])
    np.testing.assert_allclose(got[0], x @ w + b + r, rtol=1e-5, atol=atol)


# t += b * (a @ w) as a gradient's GEMM computes it: a = x^T (the weight gradient's layout), a
# plain one, and a column-strided a that sgemm cannot read; small and past a million multiply-adds.
@pytest.mark.parametrize("rows,k,cols,layout", [(12, 10, 7, "t"), (96, 512, 200, "t"), (256, 300, 128, "plain"),
                                                (64, 256, 96, "strided")])
@pytest.mark.usefixtures("each_blas")
def test_matmul_update_native_matches_reference(rows, k, cols, layout):
    x = rand(k, rows) if layout == "t" else rand(rows, 2 * k if layout == "strided" else k)
    w, t = rand(k, cols), rand(rows, cols)

    def view(x):
        return ops.transpose(x, (1, 0)) if layout == "t" else x[:, ::2] if layout == "strided" else x
    a = x.T if layout == "t" else x[:, ::2] if layout == "strided" else x
    got = compare_engines(lambda x, w, t: create_op("matmul_update_", [view(x), w, t], {"b": -0.25})[0], [x, w, t],
                          rtol=1e-5, atol=1e-4, native_ops=["matmul_update_"])
    np.testing.assert_allclose(got[0], t - 0.25 * (a @ w), rtol=1e-5, atol=1e-4)


def types(graph) -> list:
    return [op.type for op in graph.schedule()]


def test_residual_add_joins_the_gemm():
    x, w, b, h = rand(2, 8, 16), rand(16, 16), rand(16), rand(2, 8, 16)
    got = compare_engines(lambda x, w, b, h: (x @ w + b) + h, [x, w, b, h], rtol=1e-5, atol=1e-5,
                          native_ops=["matmul_bias_add"])
    np.testing.assert_allclose(got[0], x @ w + b + h, rtol=1e-5, atol=1e-5)
    ir = popxl.Ir()
    with ir.main_graph:
        xt, ht = popxl.variable(x, name="x"), popxl.variable(h, name="h")
        y = h_plus = ht + (xt @ popxl.variable(w) + popxl.variable(b))
        ops.host_store(popxl.d2h_stream(y.shape, y.dtype, "y"), h_plus)
    fuse_matmul(ir)
    assert "matmul_bias_add" in types(ir.main_graph) and "add" not in types(ir.main_graph)


def test_residual_add_stays_apart_when_an_input_changes_in_between_or_the_sum_is_read():
    x, w, b, h = rand(4, 8), rand(8, 8), rand(8), rand(4, 8)
    ir = popxl.Ir()
    with ir.main_graph:
        xt, wt, bt, ht = (popxl.variable(a) for a in (x, w, b, h))
        p = xt @ wt + bt
        ops.add_(xt, ht)  # writes x between the product and the residual add
        y = p + ht
        q = xt @ wt + bt  # product read twice
        z = q + ht
        for n, t in (("y", y), ("z", z), ("q", q)):
            ops.host_store(popxl.d2h_stream(t.shape, t.dtype, n), t)
    fuse_matmul(ir)
    assert "matmul_bias_add" not in types(ir.main_graph)
