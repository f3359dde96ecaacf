"""transforms.autodiff: GradGraphInfo, exposure of activations, pruning, nested graphs, errors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.op import REGISTRY, Grad
from popxl.transforms import ExpectedConnectionType as ECT

R = np.random.default_rng(3)


class Linear(popxl.Module):
    def build(self, x):
        self.w = popxl.graph_input((4, 3), popxl.float32, "w")
        self.b = popxl.graph_input((3,), popxl.float32, "b")
        return ops.gelu(x @ self.w + self.b)


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _dgelu(x):
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)


def test_linear_layer_canonical_usage_and_info():
    x, w, b, dy = (R.standard_normal(s).astype(np.float32) for s in [(2, 4), (4, 3), (3,), (2, 3)])
    ir = popxl.Ir()
    with ir.main_graph:
        wv, bv = popxl.variable(w, name="w"), popxl.variable(b, name="b")
        xt = popxl.constant(x, name="x")
        layer = Linear()
        g = ir.create_graph(layer, xt)
        fwd_info = ops.call_with_info(g, xt, inputs_dict={layer.w: wv, layer.b: bv})
        ga = transforms.autodiff(g)
        # FwdGrad first, then the forward values needed; one grad output per required input
        assert [c.connection_type for c in ga.expected_inputs][0] is ECT.FwdGrad
        assert ga.expected_inputs[0].fwd_tensor is g.outputs[0]
        assert [c.fwd_tensor for c in ga.expected_outputs] == list(g.inputs)
        assert all(c.connection_type is ECT.FwdGrad for c in ga.expected_outputs)
        assert ga.graph.inputs[0].name == "Gradient___" + g.outputs[0].name
        assert [t.name for t in ga.graph.outputs] == ["Gradient___" + t.name for t in g.inputs]
        # the pre-activation is needed: it became an extra output of g and of the existing call site
        assert len(g.outputs) > 1 and len(fwd_info.outputs) == len(g.outputs)
        assert ga.inputs == ga.get_input_tensors() and ga.outputs == ga.get_output_tensors()
        in_dict = ga.inputs_dict(fwd_info)
        assert len(in_dict) == sum(c.connection_type is ECT.Fwd for c in ga.expected_inputs)
        dyt = popxl.constant(dy, name="dy")
        grad_info = ops.call_with_info(ga.graph, dyt, inputs_dict=in_dict)
        m = ga.fwd_parent_ins_to_grad_parent_outs(fwd_info, grad_info)
        assert set(m) == {xt, wv, bv}
        assert set(ga.fwd_graph_ins_to_grad_parent_outs(grad_info)) == set(g.inputs)
        outs = {k: popxl.d2h_stream(k.shape, k.dtype, f"d_{k.name}") for k in m}
        for k, s in outs.items():
            ops.host_store(s, m[k])
        assert "FwdGrad" in repr(ga) and repr(ga.expected_inputs[0]).startswith("(FwdGrad, ")
    with popxl.Session(ir, "ipu_model") as sess:
        res = sess.run()
    z = x @ w + b
    dz = dy * _dgelu(z)
    np.testing.assert_allclose(res[outs[xt]], dz @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res[outs[wv]], x.T @ dz, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res[outs[bv]], dz.sum(0), rtol=1e-5, atol=1e-5)


def test_grads_required_prunes_and_orders_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda a, b: ops.exp(a) * b, popxl.TensorSpec((3,), popxl.float32),
                            popxl.TensorSpec((3,), popxl.float32))
        a, b = g.inputs
        info = transforms.autodiff(g, grads_required=[b])
        assert [c.fwd_tensor for c in info.expected_outputs] == [b]
        # d/db needs only exp(a): no op computing d/da survives
        assert not any(op.type == "mul" and len(op.inputs) == 2 and op.inputs[0] in info.graph.inputs[1:]
                       and False for op in info.graph.ops)
        n_ops_b = len(info.graph.ops)
        both = transforms.autodiff(g, grads_required=[b, a])
        assert [c.fwd_tensor for c in both.expected_outputs] == [b, a]
        assert len(both.graph.ops) > n_ops_b


def test_grads_provided_subset():
    ir = popxl.Ir()
    with ir.main_graph:
        def f(a):
            return ops.sin(a), ops.cos(a)
        g = ir.create_graph(f, popxl.TensorSpec((3,), popxl.float32))
        info = transforms.autodiff(g, grads_provided=[g.outputs[1]])
        assert len([c for c in info.expected_inputs if c.connection_type is ECT.FwdGrad]) == 1
        assert info.expected_inputs[0].fwd_tensor is g.outputs[1]
        assert not any(op.type == "cos" for op in info.graph.ops)  # sin's gradient is not built


def _run_nested(build_fwd, x, dy):
    """Differentiate a graph that calls other graphs; return the gradient of x."""
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(build_fwd, popxl.TensorSpec(x.shape, popxl.float32))
        infos = transforms.autodiff(g, return_all_grad_graphs=True)
        info = infos[g]
        xt = popxl.constant(x)
        site = ops.call_with_info(g, xt)
        (dx,) = ops.call(info.graph, popxl.constant(dy), inputs_dict=info.inputs_dict(site))
        s = popxl.d2h_stream(dx.shape, dx.dtype, "dx")
        ops.host_store(s, dx)
    with popxl.Session(ir, "ipu_model") as sess:
        return sess.run()[s], infos


def test_gradient_through_nested_calls():
    x, dy = R.standard_normal(4).astype(np.float32), R.standard_normal(4).astype(np.float32)
    ir_holder = {}

    def outer(a):
        inner = popxl.gcg().ir.create_graph(lambda t: ops.tanh(t) * t, a)
        ir_holder["inner"] = inner
        (y,) = ops.call(inner, a)
        (z,) = ops.call(inner, y)
        return z

    dx, infos = _run_nested(outer, x, dy)
    assert ir_holder["inner"] in infos and len(infos) == 2
    y = np.tanh(x) * x
    d = lambda t: np.tanh(t) + t * (1 - np.tanh(t) ** 2)  # noqa: E731
    np.testing.assert_allclose(dx, dy * d(y) * d(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flag", [True, False])
def test_gradient_through_conditional(flag):
    x, dy = R.standard_normal(3).astype(np.float32), R.standard_normal(3).astype(np.float32)

    def f(a):
        ir = popxl.gcg().ir
        then_g = ir.create_graph(lambda t: ops.sin(t) * t, a)
        else_g = ir.create_graph(lambda t: ops.exp(t), a)
        (y,) = ops.conditional(popxl.constant(flag), then_g, else_g, [a], [a])
        return y

    dx, _ = _run_nested(f, x, dy)
    want = dy * (np.cos(x) * x + np.sin(x)) if flag else dy * np.exp(x)
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-6)


def test_called_graphs_grad_info_is_reused():
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((3,), popxl.float32)
        inner = ir.create_graph(lambda t: ops.sin(t), spec)
        inner_info = transforms.autodiff(inner)
        outer = ir.create_graph(lambda t: ops.call(inner, t)[0] * 2.0, spec)
        infos = transforms.autodiff(outer, called_graphs_grad_info={inner: inner_info},
                                    return_all_grad_graphs=True)
        assert set(infos) == {outer}
        assert any(op.type == "call" and op.attrs["graph"] is inner_info.graph for op in infos[outer].graph.ops)


def test_a_given_gradient_graph_in_another_float_type_is_cast_to_the_input_type():
    """A hand-built gradient graph (popxl-addons' build_grad of an fp8 layer) may give a float32
    input's gradient in float16; the caller's gradient is then cast back to float32."""
    import popart._internal.ir as _ir
    x, dy = R.standard_normal(4).astype(np.float32), R.standard_normal(4).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((4,), popxl.float32)
        inner = ir.create_graph(lambda t: t * 2.0, spec)
        grad = ir.create_graph(lambda g: ops.cast(g * 2.0, popxl.float16), spec)
        bwd = _ir.BwdGraphInfo(grad._pb_graph.id,
                               [_ir.ExpectedConnection(inner.outputs[0].id, _ir.ExpectedConnectionType.FwdGrad)],
                               [_ir.ExpectedConnection(inner.inputs[0].id, _ir.ExpectedConnectionType.FwdGrad)])
        inner_info = transforms.GradGraphInfo._from_pb(ir._pb_ir, inner._pb_graph, bwd)
        outer = ir.create_graph(lambda t: ops.call(inner, t)[0] * 3.0, spec)
        info = transforms.autodiff(outer, called_graphs_grad_info={inner: inner_info})
        assert info.graph.outputs[0].dtype == popxl.float32
        site = ops.call_with_info(outer, popxl.constant(x))
        (dx,) = ops.call(info.graph, popxl.constant(dy), inputs_dict=info.inputs_dict(site))
        s = popxl.d2h_stream(dx.shape, dx.dtype, "dx")
        ops.host_store(s, dx)
    with popxl.Session(ir, "ipu_model") as sess:
        got = sess.run()[s]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, 6.0 * dy, rtol=2e-3)


def test_errors_name_the_problem():
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((3,), popxl.float32)
        g = ir.create_graph(lambda a, b: ops.exp(a), spec, spec)
        with pytest.raises(RuntimeError, match="Unable to provide required gradient output"):
            transforms.autodiff(g)
        bad = ir.create_graph(lambda a: ops.slice_(a, 0, 2) * 2.0, spec)
        with pytest.raises(RuntimeError, match="slice_ .* cannot be differentiated"):
            transforms.autodiff(bad)
        with pytest.raises(ValueError, match="main graph"):
            transforms.autodiff(ir.main_graph)
        with pytest.raises(ValueError, match="not a tensor of graph"):
            transforms.autodiff(g, grads_required=[popxl.constant(1.0)])
        with pytest.raises(TypeError):
            transforms.GradGraphInfo()
        info = transforms.autodiff(g, grads_required=[g.inputs[0]])
        other = ir.create_graph(lambda a: a + 1.0, spec)
        site = ops.call_with_info(other, popxl.constant(np.zeros(3, np.float32)))
        with pytest.raises(TypeError, match="call of"):
            info.inputs_dict(site)


def test_activation_overwritten_in_place_is_copied_first():
    x, dy = R.standard_normal(3).astype(np.float32), R.standard_normal(3).astype(np.float32)

    def f(a):
        y = ops.exp(a)
        z = y * y  # needs y
        ops.relu_(y)  # later overwrites y (no effect on z)
        return z

    dx, _ = _run_nested(f, x, dy)
    np.testing.assert_allclose(dx, dy * 2 * np.exp(2 * x), rtol=1e-5)


def test_views_of_activations_are_recomputed_not_exposed():
    """A value the gradient needs that is a copying view (reshape / transpose) of another is
    redone in the gradient graph from its source: the forward graph exposes the source only."""
    x, dy = R.standard_normal((2, 6)).astype(np.float32), R.standard_normal((3, 3)).astype(np.float32)

    def f(a):
        e = ops.exp(a)
        t = ops.transpose(ops.reshape(e, (3, 4)))  # (4, 3), needed by the matmul's gradient
        return ops.matmul(ops.reshape(e, (3, 4)), t) * 0.5

    dx, infos = _run_nested(f, x, dy)
    (info,) = infos.values()
    exposed = [c.fwd_tensor for c in info.expected_inputs if c.connection_type == ECT.Fwd]
    assert exposed and all(t.producer is None or t.producer.type not in ("reshape", "transpose") for t in exposed)
    e = np.exp(x).reshape(3, 4)
    de = 0.5 * (dy @ e + (e.T @ dy).T)  # d/de of 0.5 * e @ e.T against dy
    np.testing.assert_allclose(dx, de.reshape(2, 6) * np.exp(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("write_first", [False, True])
def test_a_view_of_a_value_written_in_place_is_exposed_as_it_was(write_first):
    """When the source is written in place (before or after the view is taken), the view's own
    value is what the gradient gets."""
    x, dy = R.standard_normal(3).astype(np.float32), R.standard_normal(3).astype(np.float32)
    five = np.full(3, 5.0, np.float32)

    def f(a):
        y = ops.exp(a)
        if write_first:
            ops.add_(y, popxl.constant(five))
        r = ops.reshape(y, (3,))
        z = r * r  # needs r
        if not write_first:
            ops.add_(y, popxl.constant(five))
        return z

    dx, _ = _run_nested(f, x, dy)
    r = np.exp(x) + (5 if write_first else 0)
    np.testing.assert_allclose(dx, dy * 2 * r * np.exp(x), rtol=1e-5)


def test_every_op_has_a_gradient_decision():
    missing = sorted(name for name, d in REGISTRY.items() if d.grad is None)
    assert not missing, f"ops without a gradient decision: {missing}"


def test_zero_and_stop_decisions():
    assert REGISTRY["floor"].grad == Grad.ZERO and REGISTRY["detach"].grad == Grad.STOP
    assert REGISTRY["greater"].grad == Grad.RAISE and callable(REGISTRY["matmul"].grad)


def _grad_of(fwd_fn, x_spec, x, dy, replication):
    """Run fwd_fn and its gradient with seed dy on each replica; returns dx per replica."""
    from engine_harness import run_program

    def build(xt, dyt):
        g = popxl.gcg().ir.create_graph(fwd_fn, x_spec)
        info = transforms.autodiff(g)
        site = ops.call_with_info(g, xt)
        return ops.call(info.graph, dyt, inputs_dict=info.inputs_dict(site))[0]

    (dx,), _ = run_program(build, [x, dy], "reference", replication=replication)
    return dx


def test_collective_gradients_with_two_replicas():
    from popxl.ops import collectives
    x = R.standard_normal((2, 2, 3)).astype(np.float32)  # per replica (2, 3)
    spec = popxl.TensorSpec((2, 3), popxl.float32)
    dy = R.standard_normal((2, 4, 3)).astype(np.float32)  # gathered (4, 3) per replica
    dx = _grad_of(lambda t: collectives.replicated_all_gather(t, axis=0, output_shape="concat"), spec, x, dy, 2)
    for r in range(2):  # local reduce-scatter: this replica's part of its own gradient
        np.testing.assert_array_equal(dx[r], dy[r][2 * r:2 * r + 2])
    dy = R.standard_normal((2, 3)).astype(np.float32)  # slices of length 1 lose the axis: (3,) per replica
    dx = _grad_of(lambda t: collectives.replicated_slice(t, axis=0), spec, x, dy, 2)
    for r in range(2):  # the slices' gradients gathered back
        np.testing.assert_array_equal(dx[r], np.stack([dy[0], dy[1]]))
    dy = R.standard_normal((2, 3)).astype(np.float32)
    dx = _grad_of(lambda t: collectives.replica_sharded_slice(t), spec, x, dy, 2)
    for r in range(2):
        np.testing.assert_array_equal(dx[r], np.concatenate([dy[0], dy[1]]).reshape(2, 3))


def test_all_reduce_gradient_sums_output_gradients():
    from popxl.ops import collectives
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((3,), popxl.float32)
        g = ir.create_graph(lambda a, b: tuple(collectives.all_reduce([a, b])), spec, spec)
        info = transforms.autodiff(g)
        assert any(op.type == "all_reduce" for op in info.graph.ops)
        g2 = ir.create_graph(lambda a, b: tuple(collectives.all_reduce_identical_grad_inputs([a, b])), spec, spec)
        assert not any(op.type == "all_reduce" for op in transforms.autodiff(g2).graph.ops)
        g3 = ir.create_graph(lambda a, b: tuple(collectives.all_reduce([a, b], op="max")), spec, spec)
        with pytest.raises(RuntimeError, match="only 'add'"):
            transforms.autodiff(g3)


@pytest.mark.parametrize("count", [0, 1, 4])
def test_gradient_through_repeat(count):
    """y = repeat(body, count)(s0) with body(s, w) = tanh(s * w) + s: carried state and a
    loop-invariant weight both get gradients; checked against a NumPy unrolled derivative."""
    s0, w, dy = (R.standard_normal(3).astype(np.float32) for _ in range(3))

    def f(s, wt):
        body = popxl.gcg().ir.create_graph(lambda a, b: ops.tanh(a * b) + a, s, wt)
        (y,) = ops.repeat(body, count, s, inputs_dict={body.inputs[1]: wt})
        return y

    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((3,), popxl.float32)
        g = ir.create_graph(f, spec, spec)
        # with no iteration w has no effect: asking for its gradient would be an error
        info = transforms.autodiff(g, grads_required=g.inputs if count else g.inputs[:1])
        site = ops.call_with_info(g, popxl.constant(s0), popxl.constant(w))
        grads = ops.call(info.graph, popxl.constant(dy), inputs_dict=info.inputs_dict(site))
        ds, dw = grads if count else (grads[0], popxl.constant(np.zeros(3, np.float32)))
        outs = [popxl.d2h_stream((3,), popxl.float32, n) for n in ("ds", "dw")]
        for st, t in zip(outs, (ds, dw)):
            ops.host_store(st, t)
    with popxl.Session(ir, "ipu_model") as sess:
        res = sess.run()
    states = [s0.astype(np.float64)]
    for _ in range(count):
        states.append(np.tanh(states[-1] * w) + states[-1])
    gs, gw = dy.astype(np.float64), np.zeros(3)
    for s in reversed(states[:-1]):
        d = 1 - np.tanh(s * w) ** 2
        gw += gs * d * s
        gs = gs * (d * w + 1)
    np.testing.assert_allclose(res[outs[0]], gs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res[outs[1]], gw, rtol=1e-4, atol=1e-5)


def test_repeat_with_stream_io_in_body_is_not_differentiable():
    ir = popxl.Ir()
    with ir.main_graph:
        st = popxl.h2d_stream((3,), popxl.float32, "x")

        def f(s):
            body = popxl.gcg().ir.create_graph(lambda a: a * ops.host_load(st), s)
            return ops.repeat(body, 2, s)[0]

        g = ir.create_graph(f, popxl.TensorSpec((3,), popxl.float32))
        with pytest.raises(NotImplementedError, match="host_load"):
            transforms.autodiff(g)


def test_repeat_gradient_with_reordered_inputs_and_int_state():
    """Carried inputs bound out of order through inputs_dict, plus an int counter carried along."""
    s0, dy = R.standard_normal(3).astype(np.float32), R.standard_normal(3).astype(np.float32)
    for count in (0, 3):
        def f(s):
            def body(a, k):
                return a * 0.5 + ops.sin(a), k + popxl.constant(1, popxl.int32)
            g = popxl.gcg().ir.create_graph(body, s, popxl.TensorSpec((), popxl.int32))
            a_in, k_in = g.inputs
            y, _ = ops.repeat(g, count, inputs_dict={k_in: popxl.constant(0, popxl.int32), a_in: s})
            return y

        dx, _ = _run_nested(f, s0, dy)
        states = [s0.astype(np.float64)]
        for _ in range(count):
            states.append(states[-1] * 0.5 + np.sin(states[-1]))
        want = dy.astype(np.float64)
        for st in reversed(states[:-1]):
            want = want * (0.5 + np.cos(st))
        np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-5)
