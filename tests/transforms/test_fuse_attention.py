"""The fused attention op (popxl/ops/fused_attention.py) on both engines, its gradient, and the
fuse_attention transform that makes it from matmul / scale / mask add / softmax / matmul chains:
same values as NumPy, one op instead of five, and nothing fused that something else reads."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.op import create_op
from popxl.ops.fused_attention import attention

from engine_harness import compare_engines, run_program
from grad_harness import check_grad

rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def numpy_attention(q, k, v, mask, scale):
    s = np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2).astype(np.float64)) * scale
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v.astype(np.float64)


def heads(t, b, s, h, d):
    """(b * s, h * d) rows -> (b, h, s, d): a strided view of the rows, as models split heads."""
    return ops.transpose(ops.reshape(t, (b, s, h, d)), (0, 2, 1, 3))


# (batch, heads, Sq, Sk, D, Dv, mask shape or None); with 1100 keys the native kernel takes 16
# query rows per block: 40 rows are two full blocks and a part
CASES = [(2, 3, 16, 16, 8, 8, (2, 1, 1, 16)), (1, 2, 70, 33, 16, 12, (70, 33)), (2, 2, 5, 9, 4, 4, None),
         (1, 1, 40, 1100, 8, 8, (1, 1, 40, 1100))]


@pytest.mark.usefixtures("each_blas")
@pytest.mark.parametrize("case", CASES)
def test_attention_native_matches_reference_and_numpy(case):
    b, h, sq, sk, d, dv, mshape = case
    q, k, v = rand(b, h, sq, d), rand(b, h, sk, d), rand(b, h, sk, dv)
    mask = [np.where(rng.random(mshape) < 0.2, -1e4, 0).astype(np.float32)] if mshape else []
    got = compare_engines(lambda *t: attention(*t, scale=0.3), [q, k, v, *mask], rtol=1e-5, atol=1e-5,
                          native_ops=["attention"])
    np.testing.assert_allclose(got[0], numpy_attention(q, k, v, mask[0] if mask else None, 0.3), rtol=1e-5,
                               atol=1e-5)


def test_attention_reads_strided_heads():
    """q, k and v as transposed views of (batch * seq, heads * dim) rows (no copies), k read through
    a transpose of its own: the native kernel reads them as they lie."""
    b, s, h, d = 2, 24, 3, 8
    x = [rand(b * s, h * d) for _ in range(3)]

    def build(xq, xk, xv):
        return attention(heads(xq, b, s, h, d), heads(xk, b, s, h, d), heads(xv, b, s, h, d), scale=0.25)
    got = compare_engines(build, x, rtol=1e-5, atol=1e-5, native_ops=["attention"])
    split = [a.reshape(b, s, h, d).transpose(0, 2, 1, 3) for a in x]
    np.testing.assert_allclose(got[0], numpy_attention(*split, None, 0.25), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("each_blas")
@pytest.mark.parametrize("masked", [False, True])
def test_attention_grad_native_matches_reference(masked):
    b, h, sq, sk, d = 2, 2, 37, 1030, 8
    q, k, v = rand(b, h, sq, d), rand(b, h, sk, d), rand(b, h, sk, d)
    mask = [np.where(rng.random((b, 1, 1, sk)) < 0.3, -1e4, 0).astype(np.float32)] if masked else []
    g = rand(b, h, sq, d)

    def build(q, k, v, *rest):
        out = attention(q, k, v, *rest[:-1], scale=0.35)
        return create_op("attention_grad", [q, k, v, *rest[:-1], out, rest[-1]], {"scale": 0.35})
    compare_engines(build, [q, k, v, *mask, g], rtol=2e-5, atol=2e-5, native_ops=["attention_grad"])


def test_attention_gradients_match_finite_differences():
    b, h, s, d = 1, 2, 6, 4
    mask = np.where(rng.random((1, 1, 1, s)) < 0.3, -1e4, 0).astype(np.float32)
    check_grad(lambda q, k, v: attention(q, k, v, popxl.constant(mask), scale=0.5),
               [rand(b, h, s, d), rand(b, h, s, d), rand(b, h, s, d)], eps=1e-2, rtol=2e-2, atol=2e-3)


# the transform ------------------------------------------------------------------------------------
def unfused(q, k, v, mask, scale, divide=False):
    s = q @ ops.transpose(k, (0, 1, 3, 2))
    s = s / (1.0 / scale) if divide else s * scale
    if mask is not None:
        s = s + mask
    return ops.softmax(s, axis=-1) @ v


def op_types(graph) -> list:
    return [op.type for op in graph.schedule()]


@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_fuse_attention_makes_one_op_with_the_same_values(divide, masked):
    b, h, s, d = 2, 2, 10, 4
    q, k, v = rand(b, h, s, d), rand(b, h, s, d), rand(b, h, s, d)
    mask = np.where(rng.random((b, 1, 1, s)) < 0.3, -1e4, 0).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(lambda q, k, v: unfused(q, k, v, popxl.constant(mask) if masked else None, 0.5, divide),
                                *[popxl.TensorSpec(a.shape, popxl.float32) for a in (q, k, v)])
    transforms.fuse_attention(graph)
    assert op_types(graph) == ["attention"]
    assert graph.schedule()[0].attrs["scale"] == pytest.approx(0.5)
    # a Session fuses the same chain on its own; both engines agree with NumPy
    got = compare_engines(lambda *t: unfused(*t, popxl.constant(mask) if masked else None, 0.5, divide), [q, k, v],
                          rtol=1e-5, atol=1e-5, native_ops=["attention"])
    np.testing.assert_allclose(got[0], numpy_attention(q, k, v, mask if masked else None, 0.5), rtol=1e-5, atol=1e-5)


def test_fuse_attention_keeps_chains_whose_values_are_read():
    """Probabilities that are also a graph output, or scores read twice, stay unfused."""
    shape = (1, 2, 6, 4)
    ir = popxl.Ir()
    with ir.main_graph:
        def probs_out(q, k, v):
            p = ops.softmax((q @ ops.transpose(k, (0, 1, 3, 2))) * 0.5, axis=-1)
            return p @ v, p

        def scores_twice(q, k, v):
            s = q @ ops.transpose(k, (0, 1, 3, 2))
            return ops.softmax(s, axis=-1) @ v + ops.sum(s, axis=-1, keepdims=True)
        specs = [popxl.TensorSpec(shape, popxl.float32)] * 3
        graphs = [ir.create_graph(f, *specs) for f in (probs_out, scores_twice)]
    for graph in graphs:
        before = op_types(graph)
        transforms.fuse_attention(graph)
        assert op_types(graph) == before


def test_training_through_fused_attention_matches_unfused():
    """fuse_attention on a forward graph before autodiff: the gradients (attention_grad) equal the
    unfused chain's (softmax_grad and four matmuls) on the same inputs."""
    b, h, s, d = 2, 2, 12, 8
    mask = np.where(rng.random((b, 1, 1, s)) < 0.3, -1e4, 0).astype(np.float32)
    inputs = [rand(b, h, s, d) for _ in range(3)]
    seeds = [rand(b, h, s, d)]
    outs = []
    for fuse in (False, True):
        ir = popxl.Ir()
        with ir.main_graph:
            fwd = ir.create_graph(lambda q, k, v: unfused(q, k, v, popxl.constant(mask), 0.4),
                                  *[popxl.TensorSpec(a.shape, popxl.float32) for a in inputs])
            if fuse:
                transforms.fuse_attention(fwd)
            info = transforms.autodiff(fwd, grads_required=list(fwd.inputs))
            streams = [popxl.h2d_stream(a.shape, popxl.float32, f"x{i}") for i, a in enumerate(inputs)]
            seed_stream = popxl.h2d_stream(seeds[0].shape, popxl.float32, "dy")
            call = ops.call_with_info(fwd, *[ops.host_load(st) for st in streams])
            grads = ops.call(info.graph, ops.host_load(seed_stream), inputs_dict=info.inputs_dict(call))
            out_streams = [popxl.d2h_stream(t.shape, t.dtype, f"g{i}") for i, t in enumerate(grads)]
            for st, t in zip(out_streams, grads):
                ops.host_store(st, t)
        assert ("attention_grad" in op_types(info.graph)) == fuse
        with popxl.Session(ir, "ipu_model") as session:
            res = session.run({**dict(zip(streams, inputs)), seed_stream: seeds[0]})
        outs.append([res[st] for st in out_streams])
    for unf, fus in zip(*outs):
        np.testing.assert_allclose(fus, unf, rtol=1e-4, atol=1e-5)


def test_run_program_fuses_inference_attention():
    b, h, s, d = 1, 2, 8, 4
    _, engine = run_program(lambda q, k, v: unfused(q, k, v, None, 0.5), [rand(b, h, s, d) for _ in range(3)], "native")
    assert "attention" not in engine.fallback_ops
