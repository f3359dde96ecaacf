"""The graph edit API (popxl.Graph: schedule, readers, trace, replace_ops, remove_ops, ...) that
transforms, the compiler and the compatibility layers use, and the matmul fusions built on it."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.compiler import lower
from popxl.op import create_op
from popxl.ops.call import bind_site_input
from popxl.transforms import fuse_matmul


def _chain():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.arange(4, dtype=np.float32), name="x")
        a = ops.relu(x)
        b = a * 2.0
        c = b + 1.0
        y_s = popxl.d2h_stream((4,), popxl.float32, "y")
        ops.host_store(y_s, c)
    return ir, x, a, b, c, y_s


def _run(ir, y_s):
    with popxl.Session(ir) as s:
        return s.run()[y_s]


def test_readers_schedule_and_check():
    ir, x, a, b, c, _ = _chain()
    g = ir.main_graph
    assert [op.type for op in g.schedule()] == ["relu", "mul", "add", "host_store"]
    assert g.readers(a) == [b.producer] and g.readers(x) == [a.producer]
    g.check()


def test_replace_ops_keeps_readers_and_the_result_tensor():
    ir, x, a, b, c, y_s = _chain()
    g = ir.main_graph
    made = g.replace_ops([a.producer, b.producer], lambda: ops.abs(x) * 3.0)
    assert [op.type for op in made] == ["abs", "mul"]
    assert b.producer is made[-1] and a.id not in {t.id for t in g.tensors}
    assert [op.type for op in g.schedule()] == ["abs", "mul", "add", "host_store"]
    g.check()
    np.testing.assert_array_equal(_run(ir, y_s), np.arange(4) * 3.0 + 1.0)


def test_replace_each_replaces_disjoint_chains_at_once():
    """Two chains replaced in one call: each new chain runs where its last op ran and takes over
    its result tensor; the old ops go in one removal, which still refuses a dangling reader."""
    ir, x, a, b, c, y_s = _chain()
    g = ir.main_graph
    made = g.replace_each([([a.producer], lambda: ops.abs(x)), ([c.producer], lambda: b - 1.0)])
    assert [[op.type for op in m] for m in made] == [["abs"], ["sub"]]
    assert a.producer is made[0][0] and c.producer is made[1][0]
    assert [op.type for op in g.schedule()] == ["abs", "mul", "sub", "host_store"]
    g.check()
    np.testing.assert_array_equal(_run(ir, y_s), np.arange(4) * 2.0 - 1.0)
    ir, x, a, b, c, _ = _chain()
    with pytest.raises(ValueError, match="still reads"):  # a chain's inner result is read outside it
        ir.main_graph.replace_each([([a.producer, b.producer], lambda: ops.abs(x)), ([c.producer], lambda: a + 0.0)])


def test_replace_ops_refuses_what_would_break_the_graph():
    ir, x, a, b, c, _ = _chain()
    g = ir.main_graph
    with pytest.raises(ValueError, match="returned 2 tensors for the 1 outputs"):
        g.replace_ops([b.producer], lambda: (a * 1.0, a * 2.0))
    ir, x, a, b, c, _ = _chain()
    with pytest.raises(ValueError, match="still reads"):  # the mul reads the relu's result
        ir.main_graph.remove_ops([a.producer])
    with pytest.raises(ValueError, match="must be made by the builder"):
        ir.main_graph.replace_ops([c.producer], lambda: b)


def test_remove_ops_refuses_graph_outputs_and_trace_before_places_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda t: ops.exp(t), popxl.TensorSpec((2,), popxl.float32))
    (exp,) = g.schedule()
    with pytest.raises(ValueError, match="is an output of graph"):
        g.remove_ops([exp])
    doubled, made = g.trace(lambda: g.inputs[0] * 2.0, before=exp)
    assert g.schedule() == (made[0], exp)
    g.replace_inputs(exp, [doubled])
    g.check()
    with pytest.raises(ValueError, match="takes"):
        g.replace_inputs(exp, [g.inputs[0], g.inputs[0]])


def test_outputs_inputs_and_call_sites():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda t: t + 1.0, popxl.TensorSpec((2,), popxl.float32))
        x = popxl.variable(np.ones(2, np.float32), name="x")
        (site_out,) = ops.call(g, x)
        site = site_out.producer
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y_s, x * 1.0)
    # a new by-reference input, bound at the site, written in the graph
    extra = g.add_input(x.spec, "acc", by_ref=True)
    bind_site_input(site, extra, x)
    assert site.attrs["input_index"] == (0, 1) and 1 in site.attrs["modified"]
    g.trace(lambda: ops.add_(extra, g.outputs[0]))
    # the old output goes, at the graph and at the site
    g.remove_output(0)
    ir.main_graph.remove_op_outputs(site, [0])
    assert site.outputs == () and g.outputs == ()
    for graph in (g, ir.main_graph):
        graph.check()
    np.testing.assert_array_equal(_run(ir, y_s), [3.0, 3.0])  # x += x + 1
    with pytest.raises(ValueError, match="already bound"):
        bind_site_input(site, extra, x)


def _linear_sgd(lr=0.1):
    """A Linear layer with bias trained a step: forward x @ W + b, gradient dW = x^T dy by matmul,
    scaled_add_ updates."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w0, b0 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        w, b = popxl.variable(w0, name="w"), popxl.variable(b0, name="b")
        xt = popxl.constant(x, name="x")
        y_s = popxl.d2h_stream((5, 3), popxl.float32, "y")
        fwd = ir.create_graph(lambda xx, ww, bb: xx @ ww + bb, xt, w, b)
        info = popxl.transforms.autodiff(fwd)
        fwd_site = ops.call_with_info(fwd, xt, w, b)
        (y,) = fwd_site.outputs
        ops.host_store(y_s, y)
        grads = ops.call(info.graph, popxl.constant(np.ones((5, 3), np.float32)),
                         inputs_dict=info.inputs_dict(fwd_site))
        by_fwd = dict(zip(info.outputs, grads))
        ops.scaled_add_(w, by_fwd[fwd.inputs[1]], b=-lr)
    return ir, w, y_s, x, w0, b0


def test_a_session_applies_the_matmul_fusions_and_the_ir_shows_them():
    ir, w, y_s, x, w0, b0 = _linear_sgd()
    types = lambda g: [op.type for op in g.schedule()]  # noqa: E731
    before = {g.id: types(g) for g in ir._all_graphs()}
    assert "matmul_bias" not in sum(before.values(), [])
    with popxl.Session(ir) as s:
        y = s.run()[y_s]
        w1 = s.get_tensor_data(w).copy()
    after = sum((types(g) for g in ir._all_graphs()), [])
    assert after.count("matmul_bias") == 1 and after.count("matmul_update_") == 1
    assert "scaled_add_" not in types(ir.main_graph)
    for g in ir._all_graphs():
        g.check()
    np.testing.assert_allclose(y, x @ w0 + b0, rtol=1e-5)
    np.testing.assert_allclose(w1, w0 - 0.1 * x.T @ np.ones((5, 3)), rtol=1e-5)


def test_fusions_compile_to_what_runs_and_match_unfused_results():
    ir, w, y_s, *_ = _linear_sgd()
    exe = lower(fuse_matmul(ir))
    kinds = [i.get("type") for g in exe.graphs for i in g["program"]]
    assert kinds.count("matmul_bias") == 1 and kinds.count("matmul_update_") == 1
    assert kinds.count("scaled_add_") == 0 and kinds.count("matmul") == 1  # dX = dy W^T stays
    with pytest.raises(ValueError, match="matmul_bias"):
        with popxl.Ir().main_graph:
            create_op("matmul_bias", [popxl.constant(np.ones((2, 3), np.float32)),
                                      popxl.constant(np.ones((3, 4), np.float32)),
                                      popxl.constant(np.ones((4, 1), np.float32))])


def test_move_op_keeps_dependencies_and_add_op_copy_places_a_copy():
    ir, x, a, b, c, y_s = _chain()
    g = ir.main_graph
    with g:
        x * 5.0  # independent of the chain
    relu, mul, add, store, mul5 = g.schedule()
    g.move_op(mul5, relu)
    assert g.schedule()[0] is mul5
    g.move_op(mul5, None)
    assert g.schedule()[-1] is mul5
    with pytest.raises(ValueError, match="cannot run after"):
        g.move_op(relu, add)  # mul reads relu's result
    with pytest.raises(ValueError, match="cannot run before"):
        g.move_op(add, relu)
    with g:
        w = popxl.variable(np.zeros(4, np.float32), name="w")
        snapshot = w + 0.0
        ops.var_updates.accumulate_(w, x)
    with pytest.raises(ValueError, match="share a tensor that one of them makes or writes"):
        g.move_op(g.schedule()[-1], snapshot.producer)  # the update would come before the read
    sub = ir.create_empty_graph("sub")
    with sub:
        s_in = popxl.graph_input((4,), popxl.float32, "s_in")
        two = popxl.constant(np.float32(2.0), name="two")
    copy = sub.add_op_copy(b.producer, [s_in, two], output_names=["doubled"])
    assert copy.type == "mul" and copy.name == b.producer.name and copy.outputs[0].id == sub.id + "/doubled"
    assert copy.graph is sub and sub.schedule() == (copy,) and copy.id != b.producer.id
    with pytest.raises(ValueError, match="belongs to graph"):
        sub.add_op_copy(b.producer, [a, two])


def test_erase_op_replace_output_and_remove_isolated():
    ir, x, a, b, c, y_s = _chain()
    g = ir.main_graph
    g.erase_op(b.producer)  # `add` still reads b: b stays, without a producer
    assert b.producer is None and b in g.tensors
    with pytest.raises(AssertionError, match="whose producer was erased"):
        g.check()
    with pytest.raises(ValueError, match="is not isolated"):
        g.remove_isolated([b])
    for op in reversed(g.schedule()[1:]):
        g.erase_op(op)
    g.remove_isolated([b])
    assert b not in g.tensors and c not in g.tensors and [op.type for op in g.schedule()] == ["relu"]
    g.check()
    sub = ir.create_graph(lambda t: (t + 1.0, t * 2.0), x)
    plus, times = sub.outputs
    assert sub.replace_output(0, times) is plus and sub.outputs == (times, times)
    with sub:
        other = popxl.constant(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="with the spec of output 0"):
        sub.replace_output(0, other)
    assert sub._create_tensor_id("fresh") == sub.id + "/fresh"
    with popxl.name_scope("scope"):
        assert sub._create_tensor_id("fresh") == sub.id + "/scope/fresh"
