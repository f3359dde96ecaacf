"""conv_fused (relu(conv + bias + residual)) on both engines, and the fuse_conv transform that
makes it from conv / batch_norm_inference / add / relu chains: same values, fewer ops, and
nothing fused away that something else reads."""
from __future__ import annotations

from typing import Callable, List

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.ops.conv import conv_fused
from popxl.transforms import fuse_conv

from engine_harness import compare_engines

rng = np.random.default_rng(0)


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# float16 runs through the same float32 primitives, converted on the way in and out; both engines
# round a float32 result once, so they differ by about an ulp of float16 where sums ran in another order.
TOL = {np.float32: dict(rtol=1e-4, atol=1e-4), np.float16: dict(rtol=4e-3, atol=4e-3)}


CONV_ATTRS = [
    dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=1),
    dict(strides=(2, 2), pads=(0, 1, 1, 0), dilations=(1, 1), groups=2),
    dict(strides=(1, 2), pads=(2, 2, 2, 2), dilations=(2, 1), groups=1),
]


@pytest.mark.parametrize("attrs", CONV_ATTRS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_fused_native_matches_reference(attrs, residual, relu, dtype):
    x, w, b = rand(2, 4, 9, 8, dtype=dtype), rand(6, 4 // attrs["groups"], 3, 3, dtype=dtype), rand(6, dtype=dtype)
    with popxl.Ir().main_graph:  # the output shape, for the residual
        shape = conv_fused(popxl.constant(x), popxl.constant(w), popxl.constant(b), **attrs).shape
    inputs = [x, w, b] + ([rand(*shape, dtype=dtype)] if residual else [])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else TOL[dtype]
    compare_engines(lambda *t: conv_fused(*t[:3], residual=t[3] if residual else None, relu=relu, **attrs),
                    inputs, native_ops=["conv_fused"], **tol)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_fused_with_clip_native_matches_reference(residual, dtype):
    """ReLU6 (clip 0, 6) and a two-sided clip in place of the relu, after the residual."""
    x, w, b = rand(2, 4, 9, 8, dtype=dtype), rand(6, 4, 3, 3, dtype=dtype), rand(6, dtype=dtype)
    r = rand(2, 6, 9, 8, dtype=dtype) * 3
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else TOL[dtype]
    for bounds in [(0.0, 6.0), (-1.5, 0.75)]:
        got = compare_engines(lambda *t: conv_fused(*t[:3], residual=t[3] if residual else None, clip=bounds,
                                                    **CONV_ATTRS[0]),
                              [x, w, b] + ([r] if residual else []), native_ops=["conv_fused"], **tol)
        lo, hi = (np.asarray(v, dtype) for v in bounds)
        assert got[0].min() == lo and got[0].max() == hi  # both bounds reached


def test_conv_fused_checks_its_inputs():
    with popxl.Ir().main_graph:
        x, w = popxl.constant(rand(1, 2, 4, 4)), popxl.constant(rand(3, 2, 3, 3))
        with pytest.raises(ValueError, match="bias must have shape"):
            conv_fused(x, w, popxl.constant(rand(2)), **CONV_ATTRS[0])
        with pytest.raises(ValueError, match="residual must be"):
            conv_fused(x, w, popxl.constant(rand(3)), popxl.constant(rand(1, 3, 2, 2)), **CONV_ATTRS[0])
        pool = dict(pool_kernel=(2, 2), pool_strides=(2, 2), pool_pads=(0, 0, 0, 0), pool_dilations=(1, 1),
                    pool_ceil_mode=False)
        assert conv_fused(x, w, popxl.constant(rand(3)), **CONV_ATTRS[0], **pool).shape == (1, 3, 2, 2)
        with pytest.raises(ValueError, match="without a residual"):
            conv_fused(x, w, popxl.constant(rand(3)), popxl.constant(rand(1, 3, 4, 4)), **CONV_ATTRS[0], **pool)
        with pytest.raises(ValueError, match="not with relu"):
            conv_fused(x, w, popxl.constant(rand(3)), relu=True, clip=(0.0, 6.0), **CONV_ATTRS[0])
        with pytest.raises(ValueError, match="lo <= hi"):
            conv_fused(x, w, popxl.constant(rand(3)), clip=(1.0, -1.0), **CONV_ATTRS[0])
        with pytest.raises(ValueError, match="needs all of"):
            conv_fused(x, w, popxl.constant(rand(3)), **CONV_ATTRS[0], pool_kernel=(2, 2))


def _conv_bn(x: popxl.Tensor, r: np.random.Generator) -> popxl.Tensor:
    """conv 3x3 (4 -> 4 channels, padding 1) then batch norm, with weights (of x's dtype) drawn
    from ``r``."""
    dt = x.dtype.as_numpy()
    w = r.standard_normal((4, 4, 3, 3)) * 0.3
    stats = (1 + 0.1 * r.standard_normal(4), r.standard_normal(4), r.standard_normal(4), r.uniform(0.5, 1.5, 4))
    params = [popxl.variable(a.astype(dt)) for a in stats]
    return ops.batch_norm_inference(ops.conv(x, popxl.variable(w.astype(dt)), padding=(1, 1, 1, 1)), *params)


def _residual_block(x: popxl.Tensor, r: np.random.Generator) -> List[popxl.Tensor]:
    """conv-bn-relu, conv-bn, + x, relu: the ResNet basic block."""
    return [ops.relu(_conv_bn(ops.relu(_conv_bn(x, r)), r) + x)]


def _shared_intermediate(x: popxl.Tensor, r: np.random.Generator) -> List[popxl.Tensor]:
    """The conv output is also an output, the bn output is read twice: only what is safe fuses."""
    c = ops.conv(x, popxl.variable(r.standard_normal((4, 4, 3, 3)).astype(np.float32)), padding=(1, 1, 1, 1))
    y = ops.batch_norm_inference(c, *[popxl.variable(np.ones(4, np.float32)) for _ in range(4)])
    z = _conv_bn(x, r)
    return [c, y, ops.relu(z) + ops.tanh(z)]


def _biased_convs(x: popxl.Tensor, r: np.random.Generator) -> List[popxl.Tensor]:
    """Convolutions plus one value per output channel, written as ONNX importers write a Conv's bias
    (a (C, 1, 1) reshape) or as a (1, C, 1, 1) constant; plus a non-channel add, which stays."""
    def conv(t):
        return ops.conv(t, popxl.variable((r.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)),
                        padding=(1, 1, 1, 1))
    b = popxl.variable(r.standard_normal(4).astype(np.float32))
    y = ops.relu(conv(x) + ops.reshape(b, (4, 1, 1)))
    z = ops.relu(popxl.constant(r.standard_normal((1, 4, 1, 1)).astype(np.float32)) + conv(y) + x)
    spatial = conv(x) + popxl.constant(r.standard_normal((1, 1, 6, 6)).astype(np.float32))
    shared_bias = ops.reshape(b, (4, 1, 1))  # read again below: it stays
    return [z, spatial, (conv(z) + shared_bias) * shared_bias]


def _bias_free_convs(x: popxl.Tensor, r: np.random.Generator) -> List[popxl.Tensor]:
    """Convolutions without a bias: followed by a relu, or by a residual add, they become conv_fused
    ops (a zero bias); followed by a tanh (nothing to fuse) one stays a conv."""
    def conv(t):
        return ops.conv(t, popxl.variable((r.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)),
                        padding=(1, 1, 1, 1))
    z = conv(ops.relu(conv(x))) + x
    return [z, ops.tanh(conv(z))]


def _relu6_blocks(x: popxl.Tensor, r: np.random.Generator) -> List[popxl.Tensor]:
    """MobileNet's activation: conv-bn then clip(0, 6) (fused), and a clip after a relu (a second
    activation: not fused) and before a residual add (the add stays)."""
    y = ops.clip(_conv_bn(x, r), 0.0, 6.0)
    z = ops.clip(ops.relu(_conv_bn(y, r)), -1.0, 0.5)
    return [ops.clip(_conv_bn(z, r), 0.0, 6.0) + y]


def _run(build: Callable, x: np.ndarray, fuse: bool):
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream(x.shape, popxl.float32)
        outs = build(ops.host_load(s), np.random.default_rng(5))
        d2h = [popxl.d2h_stream(t.shape, t.dtype) for t in outs]
        for d, t in zip(d2h, outs):
            ops.host_store(d, t)
    if fuse:
        fuse_conv(ir.main_graph)
    types = [op.type for op in ir.main_graph.ops]
    with popxl.Session(ir, "cpu") as session:
        res = session.run({s: x})
    return [res[d] for d in d2h], types


@pytest.mark.parametrize("build,fused_types", [
    (_residual_block, {"conv_fused": 2}),
    (_shared_intermediate, {"conv": 1, "batch_norm_inference": 1, "conv_fused": 1, "relu": 1}),
    (_biased_convs, {"conv": 1, "conv_fused": 3, "relu": 0, "add": 1, "reshape": 3}),  # 1 kept, 2 to (C,)
    (_relu6_blocks, {"conv_fused": 3, "clip": 1, "relu": 0}),
    (_bias_free_convs, {"conv_fused": 2, "conv": 1, "relu": 0, "add": 0, "tanh": 1}),
])
def test_fuse_conv_keeps_values(build, fused_types):
    x = rand(2, 4, 6, 6)
    want, plain = _run(build, x, fuse=False)
    got, types = _run(build, x, fuse=True)
    for t, n in fused_types.items():
        assert types.count(t) == n, types
    assert "batch_norm_inference" not in types or "conv" in types
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_conv_bias_from_a_reshape_is_the_variable_itself():
    ir = popxl.Ir()
    with ir.main_graph:
        b = popxl.variable(rand(4))
        y = ops.conv(popxl.variable(rand(1, 4, 5, 5)), popxl.variable(rand(4, 4, 3, 3)))
        out = ops.relu(y + ops.reshape(b, (4, 1, 1)))
    fuse_conv(ir.main_graph)
    (op,) = ir.main_graph.ops
    assert op.type == "conv_fused" and op.inputs[2] is b and op.attrs["relu"] and out.producer is op


def test_residual_block_fuses_into_two_ops_with_post_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        (out,) = _residual_block(popxl.variable(rand(1, 4, 5, 5)), np.random.default_rng(5))
    fuse_conv(ir.main_graph)
    fused = [op for op in ir.main_graph.ops if op.type == "conv_fused"]
    assert [(op.attrs["residual"], op.attrs["relu"]) for op in fused] == [(False, True), (True, True)]
    assert out.producer is fused[1]
    # what remains besides them computes the folded weights and biases (var + eps, ...), not activations
    assert not [op for op in ir.main_graph.ops
                if op.type in ("conv", "batch_norm_inference", "relu") or (op.type == "add" and op.outputs[0].rank == 4)]
    # the value between the two convolutions stays channels-last; the block's input and output do not
    assert [op.attrs["layouts"] for op in fused] == [("nchw", "nhwc", "nchw"), ("nhwc", "nchw", "nchw")]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fused_residual_blocks_native_match_reference(dtype):
    """Two blocks: channels-last values passed as input and as residual between conv_fused ops."""
    def build(x):
        r = np.random.default_rng(9)
        (y,) = _residual_block(x, r)
        (z,) = _residual_block(y, r)
        fuse_conv(x.graph)
        assert any("nhwc" in (op.attrs.get("layouts") or ()) for op in x.graph.ops if op.type == "conv_fused")
        return z
    compare_engines(build, [rand(2, 4, 7, 6, dtype=dtype)], native_ops=["conv_fused"], **TOL[dtype])


@pytest.mark.parametrize("shape", [(4, 4, 7, 6), (3, 4, 64, 48)])
def test_channels_last_residuals_written_over_match_reference(shape):
    """Three blocks: the middle block adds a channels-last residual and its result takes the
    residual's place; a batch of 4 is convolved an image at a time, a batch of 3 whole (its
    residual added on all threads)."""
    def build(x):
        r = np.random.default_rng(11)
        for _ in range(3):
            (x,) = _residual_block(x, r)
        fuse_conv(x.graph)
        layouts = [op.attrs["layouts"] for op in x.graph.ops if op.type == "conv_fused" and op.attrs["residual"]]
        assert ("nhwc", "nhwc", "nhwc") in layouts, layouts  # x, y, residual: the middle block's second conv
        return x
    compare_engines(build, [rand(*shape)], native_ops=["conv_fused"], **TOL[np.float32])


def test_channels_last_ops_refuse_the_numpy_fallback():
    from popxl.compiler import lower
    from popxl.engines.native import NativeEngine
    ir = popxl.Ir()
    with ir.main_graph:
        r = np.random.default_rng(9)
        (y,) = _residual_block(popxl.variable(rand(1, 4, 5, 5)), r)
        _residual_block(y, r)
        fuse_conv(ir.main_graph)
    exe = lower(ir)
    NativeEngine(exe)  # fine: the native kernel reads the channels-last operands
    with pytest.raises(ValueError, match="channels-last operands, which only its native kernel reads"):
        NativeEngine(exe, force_fallback=["conv_fused"])


def _stem_and_head(x: popxl.Tensor, ceil_mode: bool = False) -> popxl.Tensor:
    """ResNet's ends: conv-bn-relu, 3x3/2 max pool (fused into the conv), a residual block, a 2x2
    max pool (not fused: the block ends with a residual), global average pool."""
    r = np.random.default_rng(11)
    y = ops.max_pool(ops.relu(_conv_bn(x, r)), kernel_size=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1),
                     ceil_mode=ceil_mode)
    (y,) = _residual_block(y, r)
    y = ops.max_pool(y, kernel_size=(2, 2))
    return ops.mean(y, (2, 3), keepdims=True)


def test_pools_between_convolutions_stay_channels_last():
    ir = popxl.Ir()
    with ir.main_graph:
        out = _stem_and_head(popxl.variable(rand(2, 4, 9, 9)))
    fuse_conv(ir.main_graph)
    by_type = {op.type: op for op in ir.main_graph.ops}
    assert "mean" not in by_type and out.producer is by_type["average_pool"]
    activations = [op.type for op in ir.main_graph.ops if op.outputs[0].rank == 4 and op.outputs[0].shape[0] == 2]
    assert activations == ["conv_fused"] * 3 + ["max_pool", "average_pool"]
    assert by_type["max_pool"].attrs["layouts"] == ("nhwc", "nhwc")
    assert by_type["average_pool"].attrs["layouts"] == ("nhwc", "nchw")
    convs = [op for op in ir.main_graph.ops if op.type == "conv_fused"]
    assert [op.attrs["layouts"] for op in convs] == [("nchw", "nhwc", "nchw"), ("nhwc", "nhwc", "nchw"),
                                                     ("nhwc", "nhwc", "nhwc")]
    # the stem took the 3x3/2 pool: its output is the pooled (5x5) value
    assert {k: v for k, v in convs[0].attrs.items() if k.startswith("pool_")} == dict(
        pool_kernel=(3, 3), pool_strides=(2, 2), pool_pads=(1, 1, 1, 1), pool_dilations=(1, 1), pool_ceil_mode=False)
    assert convs[0].outputs[0].shape == (2, 4, 5, 5) and convs[0].attrs["relu"]


def test_max_pool_is_not_fused_where_the_unpooled_value_is_read():
    ir = popxl.Ir()
    with ir.main_graph:
        c = ops.relu(_conv_bn(popxl.variable(rand(1, 4, 6, 6)), np.random.default_rng(3)))
        pooled = ops.max_pool(c, kernel_size=(2, 2), stride=(2, 2))
        other = ops.tanh(c)
    fuse_conv(ir.main_graph)
    assert pooled.producer.type == "max_pool" and other.producer.inputs[0].producer.type == "conv_fused"
    assert "pool_kernel" not in other.producer.inputs[0].producer.attrs


# Batch 3 is convolved (and pooled) whole on all threads, batch 4 an image at a time. Input 9x9:
# the stem's pool ends exactly at the padding; 10x10 with ceil_mode: its last window starts on the
# last pixel and hangs over the edge.
@pytest.mark.parametrize("batch,size,ceil_mode", [(4, 9, False), (3, 9, False), (4, 10, True), (3, 10, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_channels_last_pools_native_match_reference(dtype, batch, size, ceil_mode):
    def build(x):
        y = _stem_and_head(x, ceil_mode)
        fuse_conv(x.graph)
        assert any("nhwc" in (op.attrs.get("layouts") or ()) for op in x.graph.ops if op.type == "max_pool")
        assert any("pool_kernel" in op.attrs for op in x.graph.ops if op.type == "conv_fused")
        return y
    x = rand(batch, 4, size, size, dtype=dtype)
    (fused,) = compare_engines(build, [x], native_ops=["conv_fused", "max_pool", "average_pool"], **TOL[dtype])
    (plain,) = compare_engines(lambda t: _stem_and_head(t, ceil_mode), [x], **TOL[dtype])  # nothing fused
    np.testing.assert_allclose(fused, plain, **(TOL[dtype] if dtype == np.float16 else dict(rtol=1e-4, atol=1e-5)))


@pytest.mark.parametrize("batch", [3, 4])
def test_pooled_stem_native_matches_numpy(batch):
    """The stem alone, pooled in the fused op, against NumPy: every pooled value, each slice's."""
    x, w, b = rand(batch, 3, 20, 18), rand(8, 3, 7, 7), rand(8)
    conv = dict(strides=(2, 2), pads=(3, 3, 3, 3), dilations=(1, 1), groups=1)
    pool = dict(pool_kernel=(3, 3), pool_strides=(2, 2), pool_pads=(1, 1, 1, 1), pool_dilations=(1, 1),
                pool_ceil_mode=False)
    (got,) = compare_engines(lambda *t: conv_fused(*t, relu=True, **conv, **pool), [x, w, b],
                             native_ops=["conv_fused"], rtol=1e-5, atol=1e-5)
    # NumPy: the 7x7/2 convolution from its windows, relu, then the 3x3/2 max pool over -inf padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (3, 3), (3, 3)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (7, 7), axis=(2, 3))[:, :, ::2, ::2]
    y = np.maximum(np.einsum("ncpqij,mcij->nmpq", win, w.astype(np.float64)) + b[:, None, None], 0)
    yp = np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.lib.stride_tricks.sliding_window_view(yp, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(4, 5))
    assert got.shape == want.shape == (batch, 8, 5, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
