"""The native engine's Winograd F(4x4, 3x3) convolutions (native/src/kernels/winograd.cpp): 3x3
stride-1 float32 conv / conv_fused ops, channels-last or NCHW (staged), and both gradients of
conv_grad; the reference engine's direct convolution is the oracle. Shapes cover partial edge
tiles, channel counts that are not multiples of eight, asymmetric padding, both work splits of the
forward kernel, weights kept transformed between runs (and transformed again after a weight write)
and weights that change every run; kernel_algorithms() shows which kernels took the path."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.op import create_op
from popxl.ops.conv import conv_fused
from popxl import transforms
from popxl.transforms import keep_channels_last

from engine_harness import engine, run_program

WINOGRAD = "winograd F(4x4,3x3)"


def _weights(r: np.random.Generator, k: int, c: int, kh: int = 3) -> np.ndarray:
    return (r.standard_normal((k, c, kh, kh)) / np.sqrt(c * kh * kh)).astype(np.float32)


def _block(x: popxl.Tensor, w: popxl.Tensor, k: int, pads: Tuple[int, ...], residual: bool, relu: bool,
           clip: Optional[Tuple[float, float]], seed: int = 1) -> popxl.Tensor:
    """conv 1x1 (x's channels -> C, channels-last result) -> the 3x3 convolution under test with
    weights `w` (C -> k), optionally adding a channels-last residual (another convolution of the
    input) -> a 1x1 conv back to NCHW, so the 3x3 convolution reads and writes channels-last."""
    r = np.random.default_rng(seed)
    c = w.shape[1]
    pw = dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1)
    a = conv_fused(x, popxl.variable(_weights(r, c, x.shape[1], 1)), popxl.variable(r.standard_normal(c).astype(
        np.float32)), relu=True, **pw)
    b = popxl.variable(r.standard_normal(k).astype(np.float32))
    res = None
    if residual:  # the result's shape: a 3x3 convolution of the (NCHW) input with the same pads
        res = conv_fused(x, popxl.variable(_weights(r, k, x.shape[1])), popxl.variable(np.zeros(k, np.float32)),
                         strides=(1, 1), pads=pads, dilations=(1, 1), groups=1)
    y = conv_fused(a, w, b, residual=res, relu=relu, clip=clip, strides=(1, 1), pads=pads, dilations=(1, 1), groups=1)
    out = conv_fused(y, popxl.variable(_weights(r, 5, k, 1)), popxl.variable(np.zeros(5, np.float32)), **pw)
    keep_channels_last(x.graph)
    return out


def _compare(build, inputs, expect_winograd: bool = True):
    want, _ = run_program(build, inputs, "reference")
    got, eng = run_program(build, inputs, "native")
    algorithms = [(t, a) for t, a in eng.kernel_algorithms() if t.startswith("conv")]
    assert any(WINOGRAD in a for _, a in algorithms) == expect_winograd, algorithms
    for g, w in zip(got, want):
        # Winograd's sums differ from direct ones by ~1e-5 of the largest value; a wrong tile,
        # channel or epilogue differs by the values themselves.
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())
    return got[0], algorithms


@pytest.mark.parametrize("shape, k, pads", [
    ((2, 16, 9, 7), 16, (1, 1, 1, 1)),    # partial tiles at the bottom and right edges
    ((1, 20, 6, 6), 24, (0, 0, 0, 0)),    # channels 20 (a 4-lane tail), no padding: 4x4 result, one tile
    ((3, 24, 17, 13), 19, (2, 1, 0, 2)),  # asymmetric padding, 19 output channels (a 3-lane tail)
    ((1, 32, 5, 11), 32, (0, 1, 1, 0)),
])
@pytest.mark.parametrize("residual, relu, clip", [(False, False, None), (True, True, None), (True, False, (-0.5, 0.75)),
                                                  (False, True, None)])
@pytest.mark.usefixtures("each_blas")
def test_winograd_matches_direct_convolution(shape, k, pads, residual, relu, clip):
    r = np.random.default_rng(3)
    w = _weights(r, k, shape[1])
    x = r.standard_normal(shape).astype(np.float32)
    out, algorithms = _compare(lambda t: _block(t, popxl.variable(w), k, pads, residual, relu, clip), [x])
    # the convolution under test, and the one making the residual (NCHW in, channels-last out)
    assert algorithms.count(("conv_fused", WINOGRAD)) == 1 + residual, algorithms
    assert np.isfinite(out).all()


@pytest.mark.parametrize("shape, k, pads", [((2, 16, 9, 7), 24, (1, 1, 1, 1)), ((1, 20, 6, 10), 16, (2, 0, 1, 1)),
                                             ((3, 17, 13, 12), 33, (0, 0, 0, 0))])
def test_winograd_on_nchw_values_stages_them(shape, k, pads):
    """A plain conv, and a conv_fused outside channels-last chains: x is copied channels-last and
    the result back around the tiles."""
    r = np.random.default_rng(8)
    x, w, b = r.standard_normal(shape).astype(np.float32), _weights(r, k, shape[1]), r.standard_normal(k).astype(
        np.float32)
    _, algorithms = _compare(lambda t: ops.conv(t, popxl.variable(w), padding=pads), [x])
    assert algorithms == [("conv", WINOGRAD)]
    attrs = dict(strides=(1, 1), pads=pads, dilations=(1, 1), groups=1)
    _, algorithms = _compare(lambda t: conv_fused(t, popxl.variable(w), popxl.variable(b), clip=(-0.5, 0.5), **attrs),
                             [x])
    assert algorithms == [("conv_fused", WINOGRAD)]
    # an NCHW residual is not read by the tiles: the direct convolution runs
    oh, ow = (shape[2 + i] + pads[i] + pads[2 + i] - 2 for i in range(2))
    res = r.standard_normal((shape[0], k, oh, ow)).astype(np.float32)
    _compare(lambda t, rt: conv_fused(t, popxl.variable(w), popxl.variable(b), residual=rt, relu=True, **attrs),
             [x, res], expect_winograd=False)


@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 0, 0, 0), (2, 0, 1, 2), (3, 3, 3, 3)], ids=str)
@pytest.mark.parametrize("grads", [None, ("dx",), ("dweight",), ("dx", "dweight")], ids=str)
@pytest.mark.usefixtures("each_blas")
def test_conv_grad_by_winograd(pads, grads):
    """conv_grad of a 3x3 stride-1 convolution: dx is a convolution of dy with the weights turned
    round (weights streamed: 256 tiles of dx), dw the sum over tiles of transformed x and dy
    products turned back into 3x3; Winograd computes both."""
    r = np.random.default_rng(9)
    x, w = r.standard_normal((16, 16, 16, 16)).astype(np.float32), _weights(r, 24, 16)
    attrs = dict(strides=(1, 1), pads=pads, dilations=(1, 1), groups=1)
    with popxl.Ir().main_graph:
        y_shape = conv_fused(popxl.constant(x), popxl.constant(w), popxl.constant(np.zeros(24, np.float32)),
                             **attrs).shape
    gy = r.standard_normal(y_shape).astype(np.float32)

    def build(a, b, g):
        conv_attrs = dict(ops.conv(a, b, padding=pads).producer.attrs)
        return create_op("conv_grad", [a, b, g], conv_attrs if grads is None else {**conv_attrs, "grads": grads})
    _, algorithms = _compare(build, [x, w, gy])
    assert ("conv_grad", " + ".join([WINOGRAD] * len(grads or ("dx", "dweight")))) in algorithms, algorithms


@pytest.mark.usefixtures("each_blas")
def test_winograd_many_tiles_with_weights_streamed_every_run():
    """8 images of 64x64, 32 -> 32 channels: 2048 tiles, cut into blocks a thread; the weights come
    from the host each run (not static), so they are transformed each run."""
    r = np.random.default_rng(4)
    x = r.standard_normal((8, 8, 64, 64)).astype(np.float32)
    w = _weights(r, 32, 32)
    _compare(lambda t, wt: _block(t, wt, 32, (1, 1, 1, 1), True, True, None), [x, w])


def test_winograd_not_used_for_few_tiles_with_streamed_weights_or_few_channels():
    r = np.random.default_rng(5)
    x = r.standard_normal((1, 16, 8, 8)).astype(np.float32)
    _compare(lambda t, wt: _block(t, wt, 16, (1, 1, 1, 1), False, True, None), [x, _weights(r, 16, 16)],
             expect_winograd=False)
    x, w = r.standard_normal((1, 8, 8, 8)).astype(np.float32), _weights(r, 8, 8)
    _compare(lambda t: _block(t, popxl.variable(w), 8, (1, 1, 1, 1), False, True, None), [x], expect_winograd=False)


def test_winograd_turned_off_by_the_environment(monkeypatch):
    r = np.random.default_rng(7)
    x, w = r.standard_normal((1, 16, 8, 8)).astype(np.float32), _weights(r, 16, 16)
    monkeypatch.setenv("POPXL_WINOGRAD", "0")
    _compare(lambda t: _block(t, popxl.variable(w), 16, (1, 1, 1, 1), False, True, None), [x], expect_winograd=False)


def test_winograd_weights_written_between_runs_are_used():
    """Static weights are transformed once per weights epoch: a write of new weights must reach the
    next run, and a run after writing the old ones back gives the first result again."""
    r = np.random.default_rng(6)
    x = r.standard_normal((2, 16, 12, 12)).astype(np.float32)
    w0, w1 = _weights(r, 16, 16), _weights(r, 16, 16)

    def session_for(engine_name: str):
        ir = popxl.Ir()
        with ir.main_graph:
            s = popxl.h2d_stream(x.shape, popxl.float32, "x")
            w = popxl.variable(w0, name="w")
            out = _block(ops.host_load(s), w, 16, (1, 1, 1, 1), False, True, None)
            d = popxl.d2h_stream(out.shape, out.dtype, "out")
            ops.host_store(d, out)
        with engine(engine_name):
            return popxl.Session(ir, "cpu"), s, d, w

    results = {}
    for name in ("reference", "native"):
        session, s, d, w = session_for(name)
        with session:
            first = session.run({s: x})[d]
            session.write_variable_data(w, w1)
            second = session.run({s: x})[d]
            session.write_variable_data(w, w0)
            third = session.run({s: x})[d]
            if name == "native":
                assert (("conv_fused", WINOGRAD) in session._engine.kernel_algorithms())
        results[name] = (first, second, third)
    ref, nat = results["reference"], results["native"]
    assert np.abs(ref[0] - ref[1]).max() > 0.1  # the new weights change the result
    for want, got in zip(ref, nat):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_array_equal(nat[2], nat[0])


def test_conv_grad_dx_by_winograd_with_static_weights():
    """Weights a variable nothing writes (kept transformed, turned round): few tiles suffice for dx;
    dw, from 6 tiles, is oneDNN's (the two kernels run in turn as the op's)."""
    r = np.random.default_rng(10)
    x, w = r.standard_normal((1, 20, 7, 9)).astype(np.float32), _weights(r, 16, 20)
    gy = r.standard_normal((1, 16, 7, 9)).astype(np.float32)

    def build(a, g):
        b = popxl.variable(w)
        return create_op("conv_grad", [a, b, g], dict(ops.conv(a, b, padding=(1, 1, 1, 1)).producer.attrs))
    _, algorithms = _compare(build, [x, gy])
    assert ("conv_grad", f"{WINOGRAD} + oneDNN") in algorithms, algorithms


def test_gradients_of_a_3x3_cnn_match_the_reference_engine():
    """autodiff of conv -> relu -> conv with weights streamed in (not static): the forward convolutions,
    and both gradients of each, by Winograd on the native engine."""
    r = np.random.default_rng(11)
    x = r.standard_normal((16, 16, 16, 16)).astype(np.float32)
    w1, w2 = _weights(r, 16, 16), _weights(r, 16, 16)
    seed = r.standard_normal((16, 16, 16, 16)).astype(np.float32)

    def build(t, a, b):
        ir = t.graph.ir

        def forward(xt, wa, wb):
            return ops.conv(ops.relu(ops.conv(xt, wa, padding=(1, 1, 1, 1))), wb, padding=(1, 1, 1, 1))
        graph = ir.create_graph(forward, t, a, b)
        grads = transforms.autodiff(graph)
        info = ops.call_with_info(graph, t, a, b)
        return ops.call(grads.graph, popxl.constant(seed), inputs_dict=grads.inputs_dict(info))
    got, algorithms = _compare(build, [x, w1, w2])
    assert algorithms.count(("conv", WINOGRAD)) == 2, algorithms
    assert algorithms.count(("conv_grad", f"{WINOGRAD} + {WINOGRAD}")) == 2, algorithms
    assert np.isfinite(got).all()
