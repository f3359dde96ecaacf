"""popxl.export_onnx: ONNX ops where ONNX has them, ai.graphcore for the rest, subgraphs as local
functions; importable programs give popart.InferenceSession the popxl Session's results."""
import numpy as np
import onnx
import pytest

import popart
import popxl
import popxl.ops as ops
from popxl.onnx_export import GRAPHCORE_DOMAIN, GRAPHS_DOMAIN
from models import mlp, streams


def _popart_run(model: onnx.ModelProto, feeds, outputs):
    session = popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, list(outputs)),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return anchors


def _popxl_run(ir, feeds):
    with popxl.Session(ir, "cpu") as session:
        return session.run(feeds)


def test_mlp_round_trips_through_popart(tmp_path):
    ir = mlp(layers=2, train=False, seed=3)
    model = popxl.export_onnx(ir, tmp_path / "mlp.onnx")
    onnx.checker.check_model(onnx.load(str(tmp_path / "mlp.onnx")), full_check=True)
    assert [f.name for f in model.functions] == ["Linear_subgraph_0", "Linear_subgraph_1"]
    assert {f.domain for f in model.functions} == {GRAPHS_DOMAIN}
    assert [n.op_type for n in model.functions[0].node] == ["MatMul", "Add", "Gelu"]
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    h2d, d2h = streams(ir)
    expected = _popxl_run(ir, {h2d: x})[d2h]
    got = _popart_run(model, {"x": x}, ["y"])["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.abs(expected).max() > 1e-3  # a real value, not zeros


def test_many_onnx_ops_round_trip():
    rng = np.random.default_rng(1)
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((2, 3, 4), popxl.float32, name="x")
        i_stream = popxl.h2d_stream((2,), popxl.int32, name="idx")
        outs = [popxl.d2h_stream(s, d, name=n) for s, d, n in
                (((3, 2, 4), popxl.float32, "a"), ((2, 12), popxl.float32, "b"), ((2, 3), popxl.float32, "c"),
                 ((2, 3, 4), popxl.int32, "d"), ((2, 3, 4), popxl.float32, "e"))]
        x = ops.host_load(x_stream, "x")
        idx = ops.host_load(i_stream, "idx")
        w = popxl.variable(rng.normal(size=(4, 4)).astype(np.float32), name="w")
        a = ops.transpose(ops.softmax(x @ w, axis=2), (1, 0, 2))
        b = ops.reshape(ops.concat([ops.relu(x), ops.tanh(x)], axis=2), (2, 24))
        b = ops.gather(b, idx, axis=1)
        b = ops.reshape(ops.concat([b] * 6, axis=1), (2, 12))
        c = ops.mean(ops.clip(x, -0.5, 0.5) * 2.0 - ops.log(ops.exp(x) + 1.0), axis=2)
        d = ops.cast(ops.greater(x, ops.exp(ops.negate(x))), popxl.int32)
        e = ops.where(ops.equal(d, popxl.constant(1, popxl.int32)), ops.sqrt(ops.abs(x)), ops.geluerf(x))
        for stream, value in zip(outs, (a, b, c, d, e)):
            ops.host_store(stream, value)
    model = popxl.export_onnx(ir)
    onnx.checker.check_model(model, full_check=True)
    assert not [n for n in model.graph.node if n.domain == GRAPHCORE_DOMAIN]
    feeds = {"x": rng.normal(size=(2, 3, 4)).astype(np.float32), "idx": np.array([5, 17], np.int32)}
    expected = _popxl_run(ir, {x_stream: feeds["x"], i_stream: feeds["idx"]})
    got = _popart_run(model, feeds, "abcde")
    for stream in outs:
        np.testing.assert_allclose(got[stream.tensor_id], expected[stream], rtol=1e-5, atol=1e-6,
                                   err_msg=stream.tensor_id)


def test_popxl_only_ops_go_to_the_graphcore_domain_with_their_attributes():
    ir = mlp(layers=1, train=True)
    with ir.main_graph:
        probs = popxl.variable(np.full((4, 3), 1 / 3, np.float32), name="probs")
        labels = popxl.constant(np.array([0, 1, 2, 0], np.int32), name="labels")
        ops.nll_loss(probs, labels, ignore_index=2)
        body = ir.create_graph(lambda t: t * 2.0, probs)
        ops.repeat(body, 3, probs)
    model = popxl.export_onnx(ir)
    onnx.checker.check_model(model)
    nodes = {n.op_type: n for n in model.graph.node}
    nll = nodes["nll_loss"]
    assert nll.domain == GRAPHCORE_DOMAIN
    assert {a.name: onnx.helper.get_attribute_value(a) for a in nll.attribute}["ignore_index"] == 2
    repeat = nodes["repeat"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in repeat.attribute}
    assert attrs["repeat_count"] == 3 and attrs["graph"].decode() in {f.name for f in model.functions}
    grad_fn = next(f for f in model.functions if f.name.startswith("Linear_grad"))
    assert any(n.op_type == "gelu_grad" and n.domain == GRAPHCORE_DOMAIN for n in grad_fn.node)
    # the SGD update of a weight becomes ONNX arithmetic: w + (-0.1) * dw
    assert [n.op_type for n in model.graph.node].count("Mul") >= 1
    assert {o.domain for o in model.opset_import} == {"", GRAPHCORE_DOMAIN, GRAPHS_DOMAIN}


def test_export_errors_are_clear():
    with pytest.raises(TypeError, match="needs a popxl.Ir"):
        popxl.export_onnx("model")
    with pytest.raises(ValueError, match="has no ops"):
        popxl.export_onnx(popxl.Ir())
