"""fuse_decomposed: layer norms and erf-form GELUs written out as elementwise ops (as the ONNX
importer and PyTorch's exporter write them) become layer_norm / geluerf, with the same values;
the internal erf op behind ONNX's Erf on both engines; and a BERT-style ONNX layer imported by
popart runs as a handful of fused ops."""
from __future__ import annotations

import math

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.ops.elementwise import erf

from engine_harness import compare_engines
from grad_harness import check_grad

rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def op_types(graph) -> list:
    return [op.type for op in graph.schedule()]


def layer_norm_ops(x, w, b, eps, reciprocal=True):
    """What popart's importer makes of LayerNormalization over the last axis."""
    mean = ops.mean(x, -1, keepdims=True)
    d = ops.sub(x, mean)
    std = ops.sqrt(ops.add(ops.mean(ops.mul(d, d), -1, keepdims=True), popxl.constant(np.float32(eps))))
    y = ops.mul(d, ops.div(popxl.constant(np.float32(1.0)), std)) if reciprocal else ops.div(d, std)
    y = ops.mul(y, w)
    return ops.add(y, b) if b is not None else y


def numpy_layer_norm(x, w, b, eps):
    x64 = x.astype(np.float64)
    m = x64.mean(-1, keepdims=True)
    y = (x64 - m) / np.sqrt(((x64 - m) ** 2).mean(-1, keepdims=True) + eps) * w
    return y + b if b is not None else y


def build_graph(fn, *arrays):
    ir = popxl.Ir()
    with ir.main_graph:
        return ir.create_graph(fn, *[popxl.TensorSpec(a.shape, popxl.float32) for a in arrays])


@pytest.mark.parametrize("reciprocal", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_chain_becomes_layer_norm(reciprocal, with_bias):
    x, w, b = rand(2, 5, 16) * 3 + 1, rand(16), rand(16)
    fn = lambda x, w, b: layer_norm_ops(x, w, b if with_bias else None, 1e-5, reciprocal)  # noqa: E731
    graph = build_graph(fn, x, w, b)
    transforms.fuse_decomposed(graph.ir)  # the main graph does not reach it: nothing happens
    assert "layer_norm" not in op_types(graph)
    transforms.fuse_layer_norm(graph)
    assert [t for t in op_types(graph) if t not in ("reshape",)] == ["layer_norm"]
    got = compare_engines(fn, [x, w, b], rtol=1e-5, atol=1e-5, native_ops=["layer_norm"])
    np.testing.assert_allclose(got[0], numpy_layer_norm(x, w, b if with_bias else None, 1e-5), rtol=1e-5, atol=1e-5)


def test_layer_norm_chain_whose_statistics_are_read_stays():
    x, w, b = rand(4, 8), rand(8), rand(8)

    def fn(x, w, b):
        y = layer_norm_ops(x, w, b, 1e-5)
        return y, ops.mean(x, -1, keepdims=True) * 2.0  # a second reader of x is fine...

    def reads_mean(x, w, b):
        mean = ops.mean(x, -1, keepdims=True)
        d = ops.sub(x, mean)
        std = ops.sqrt(ops.add(ops.mean(ops.mul(d, d), -1, keepdims=True), popxl.constant(np.float32(1e-5))))
        return ops.add(ops.mul(ops.div(d, std), w), b), mean  # ...but not of the mean
    fused = build_graph(fn, x, w, b)
    transforms.fuse_layer_norm(fused)
    assert "layer_norm" in op_types(fused)
    kept = build_graph(reads_mean, x, w, b)
    before = op_types(kept)
    transforms.fuse_layer_norm(kept)
    assert op_types(kept) == before


def gelu_ops(x, form):
    c = popxl.constant(np.float32(math.sqrt(2.0)))
    half, one = popxl.constant(np.float32(0.5)), popxl.constant(np.float32(1.0))
    if form == "exported":  # PyTorch's export of F.gelu: x * (erf(x / sqrt 2) + 1) * 0.5
        return ops.mul(ops.mul(x, ops.add(erf(ops.div(x, c)), one)), half)
    if form == "half_first":  # 0.5 * x * (1 + erf(x * (1 / sqrt 2)))
        return ops.mul(ops.mul(half, x), ops.add(one, erf(ops.mul(x, popxl.constant(np.float32(1 / math.sqrt(2)))))))
    return ops.mul(x, ops.mul(ops.add(erf(ops.div(x, c)), one), half))  # x * ((erf + 1) * 0.5)


@pytest.mark.parametrize("form", ["exported", "half_first", "cdf_first"])
def test_gelu_chain_becomes_geluerf(form):
    x = rand(3, 40) * 2
    graph = build_graph(lambda x: gelu_ops(x, form), x)
    transforms.fuse_gelu(graph)
    assert op_types(graph) == ["geluerf"]
    got = compare_engines(lambda x: gelu_ops(x, form), [x], rtol=1e-6, atol=1e-6, native_ops=["geluerf"])
    want = 0.5 * x * (1 + np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("divisor", [2.0, 0.0])
def test_gelu_chain_with_another_scale_stays(divisor):
    # A divisor of 0 (ONNX Runtime runs such a model: inf / NaN values) is not a GELU either.
    x = rand(8)
    graph = build_graph(lambda x: ops.mul(ops.mul(x, ops.add(erf(ops.div(x, popxl.constant(np.float32(divisor)))),
                                                            popxl.constant(np.float32(1.0)))),
                                          popxl.constant(np.float32(0.5))), x)
    before = op_types(graph)
    transforms.fuse_gelu(graph)
    assert op_types(graph) == before


def test_erf_native_matches_reference_and_math():
    x = np.concatenate([rand(200) * 3, np.array([0.0, -0.0, 6.0, -6.0, np.inf, -np.inf, np.nan], np.float32)])
    got = compare_engines(erf, [x], rtol=1e-6, atol=1e-7, native_ops=["erf"])
    np.testing.assert_allclose(got[0], np.array([math.erf(v) for v in x.astype(np.float64)]), rtol=1e-6, atol=1e-7)


def test_erf_gradient():
    check_grad(erf, [rand(10)])


def test_bert_style_onnx_layer_runs_fused():
    """LayerNormalization, an exported GELU (Div, Erf, Add, Mul, Mul) and self-attention with a mask,
    imported by popart: the session's program has layer_norm, geluerf and attention, and matches NumPy."""
    from onnx import TensorProto, helper, numpy_helper

    import popart

    b, s, h, dh = 2, 12, 2, 4
    d = h * dh
    x = rand(b, s, d)
    mask = np.where(rng.random((b, 1, 1, s)) < 0.3, -1e4, 0).astype(np.float32)
    ln_w, ln_b = rand(d), rand(d)
    weights = {"ln_w": ln_w, "ln_b": ln_b, "mask": mask}
    scalars = {"sqrt2": np.array(math.sqrt(2), np.float32), "one": np.array(1, np.float32),
               "half": np.array(0.5, np.float32), "scale": np.array(math.sqrt(dh), np.float32),
               "split": np.array([b, s, h, dh], np.int64)}
    n = helper.make_node
    # scalars as Constant nodes (as PyTorch exports them): initializers are weights a user may write
    nodes = [n("Constant", [], [k], value=numpy_helper.from_array(v, k)) for k, v in scalars.items()]
    nodes += [n("LayerNormalization", ["x", "ln_w", "ln_b"], ["ln"], axis=-1, epsilon=1e-5),
             n("Div", ["ln", "sqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one"], ["g2"]),
             n("Mul", ["ln", "g2"], ["g3"]), n("Mul", ["g3", "half"], ["gelu"]),
             n("Reshape", ["gelu", "split"], ["r"]), n("Transpose", ["r"], ["q"], perm=[0, 2, 1, 3]),
             n("Transpose", ["r"], ["kt"], perm=[0, 2, 3, 1]), n("MatMul", ["q", "kt"], ["sc"]),
             n("Div", ["sc", "scale"], ["sc2"]), n("Add", ["sc2", "mask"], ["sc3"]),
             n("Softmax", ["sc3"], ["p"], axis=-1),
             n("MatMul", ["p", "q"], ["y"])]
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, s, dh])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = popart.InferenceSession(model.SerializeToString(),
                                      popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    types = {op.type for g in session._px.ir._all_graphs() for op in g.schedule()}
    assert {"layer_norm", "geluerf", "attention"} <= types
    assert not types & {"erf", "softmax", "sqrt", "mean"}
    ln = numpy_layer_norm(x, ln_w, ln_b, 1e-5)
    gelu = 0.5 * ln * (1 + np.vectorize(math.erf)(ln / math.sqrt(2)))
    q = gelu.reshape(b, s, h, dh).transpose(0, 2, 1, 3)
    sc = q @ np.swapaxes(q, -1, -2) / math.sqrt(dh) + mask
    p = np.exp(sc - sc.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ q
    np.testing.assert_allclose(anchors["y"], want, rtol=1e-4, atol=1e-5)
