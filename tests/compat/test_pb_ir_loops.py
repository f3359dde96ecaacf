"""popart._internal.ir, part 3: loops edited after they were traced. A graph that ops.repeat runs
gets a new output (Graph.markAsOutput): the loop then runs a wrapper graph holding a call of it,
as PopXL lays out every loop, and LoopOp.addLoopOutput / addLoopInput make the loop carry new
values; what popxl-addons' pipelining transform does. Each program runs on both engines against
a NumPy replay of the loop."""
import numpy as np
import pytest

import popart
import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from engine_harness import engine
from popxl.transforms import autodiff

ENGINES = ["native", "reference"]
RNG = np.random.default_rng(38)
C0 = RNG.normal(size=(2, 3)).astype(np.float32)
K = RNG.normal(size=(2, 3)).astype(np.float32)


@pytest.fixture(params=ENGINES)
def eng(request):
    return request.param


def _store(t, name):
    s = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(s, t)
    return s


def _run(ir, eng, *streams, variables=()):
    with engine(eng):
        session = popxl.Session(ir, "ipu_model")
    with session:
        out = session.run()
        values = [session.get_tensor_data(v) for v in variables]
    return [out[s] for s in streams], values


def _wrapper_call(loop_view, body):
    """The wrapper graph a loop runs after its body got an output, and the call of the body in it."""
    wrapper = popxl.Graph._from_pb(loop_view.getCalledGraphs()[0])
    assert wrapper is not body
    (call,) = wrapper._pb_graph.getOps()
    assert isinstance(call, _ir.op.CallOp) and call.getCalledGraphs()[0].id == body._pb_graph.id
    return wrapper, call


def test_body_value_made_after_tracing_is_carried(eng):
    """The loop is traced passing its state through unchanged; the step is traced into the body
    afterwards, marked as a body output and made the carried value (popxl-addons' pipelining)."""
    ir = popxl.Ir()
    with ir.main_graph:
        c0 = popxl.variable(C0, name="c0")
        k = popxl.variable(K, name="k")
        body = ir.create_graph(lambda c, k: c, c0, k)
        loop = ops.repeat_with_info(body, 4, c0, k)
        out = _store(loop.outputs[0], "out")
    with body:
        c_in, k_in = body.inputs
        step = ops.tanh(c_in * k_in) + 0.5
    lp = _ir.view_of(loop._op)
    body._pb_graph.markAsOutput(step.id)
    wrapper, call = _wrapper_call(lp, body)
    assert len(body.outputs) == 2 and lp.getNumExplicitInputs() == 3  # the loop still carries one value
    carried = wrapper._create_tensor_id("step")
    call.createAndConnectOutTensor(body._pb_graph.getOutputIndex(step.id), carried)
    call.setup()
    lp.addLoopOutput(0, lp.outId(0), carried, True)
    assert loop.outputs[0] is lp.outTensor(0)._popxl
    (got,), _ = _run(ir, eng, out)
    want = C0.copy()
    for _ in range(4):
        want = np.tanh(want * K) + np.float32(0.5)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("count", [3, 0])
@pytest.mark.parametrize("output_first", [False, True])
def test_new_loop_output_is_its_value_after_the_last_iteration(eng, count, output_first):
    """A value of the body becomes a new loop output, with the carried input it pairs with: the
    loop's result is its value in the last iteration (the initial value when nothing runs)."""
    init = np.full((2, 3), -7.0, np.float32)
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        c0 = popxl.variable(C0, name="c0")
        t0 = popxl.variable(init, name="t0")
        body = ir.create_graph(lambda c: c * 2.0, c0)
        loop = ops.repeat_with_info(body, count, c0)
        out_c = _store(loop.outputs[0], "c")
    with body:
        plus = body.inputs[0] + 1.0  # c entering the iteration, plus one
    lp = _ir.view_of(loop._op)
    body._pb_graph.markAsOutput(plus.id)
    wrapper, call = _wrapper_call(lp, body)
    inner = call.outId(1)
    if output_first:
        lp.addLoopOutput(1, main._create_tensor_id("last_plus"), inner, False)
        lp.addLoopInput(lp.getNumExplicitInputs() - 1, t0.id, wrapper._create_tensor_id("plus_in"), False)
    else:
        lp.addLoopInput(lp.getNumExplicitInputs(), t0.id, wrapper._create_tensor_id("plus_in"), False)
        lp.addLoopOutput(1, main._create_tensor_id("last_plus"), inner, False)
    assert lp.getNumExplicitInputs() == 4 and lp.outId(1) == "last_plus"
    assert wrapper.inputs[1].id == wrapper.id + "/plus_in"
    with main:
        out_t = _store(lp.outTensor(1)._popxl, "t")
    (got_c, got_t), _ = _run(ir, eng, out_c, out_t)
    np.testing.assert_array_equal(got_c, C0 * np.float32(2.0 ** count))
    np.testing.assert_array_equal(got_t, C0 * np.float32(2.0 ** (count - 1)) + 1 if count else init)


def test_carried_pair_inserted_before_the_others(eng):
    """addLoopInput(2, ...) and addLoopOutput(0, ...) put a new carried pair first: the loop's other
    bindings and results move up one and keep their values."""
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        c0 = popxl.variable(C0, name="c0")
        k = popxl.variable(K, name="k")
        s0 = popxl.variable(np.zeros((), np.float32), name="s0")
        body = ir.create_graph(lambda c, k: c * k, c0, k)
        loop = ops.repeat_with_info(body, 3, c0, k)
        old_out = loop.outputs[0]
        out_c = _store(old_out, "c")
    lp = _ir.view_of(loop._op)
    lp.addLoopInput(2, s0.id, body._create_tensor_id("s"), False)
    s_in, c_in, k_in = body.inputs
    with body:
        total = s_in + ops.sum(c_in)
    lp.addLoopOutput(0, main._create_tensor_id("total"), total.id, False)
    assert lp.outTensor(1)._popxl is old_out and lp.inTensor(3)._popxl is c0 and lp.inTensor(4)._popxl is k
    with main:
        out_s = _store(lp.outTensor(0)._popxl, "s")
    (got_c, got_s), _ = _run(ir, eng, out_c, out_s)
    c, s = C0.copy(), np.float32(0)
    for _ in range(3):
        c, s = c * K, s + c.sum(dtype=np.float32)
    np.testing.assert_allclose(got_c, c, rtol=1e-6)
    np.testing.assert_allclose(got_s, s, rtol=1e-5)


def test_marked_output_alone_changes_nothing_and_inputs_still_route(eng):
    """A body output that the loop does not carry leaves the loop's results as they were; by-reference
    inputs still write back through the wrapper, and a value routed in afterwards reaches the body
    through the loop and the wrapper's call (popxl-addons' route_tensor_into_graph)."""
    ir = popxl.Ir()
    with ir.main_graph:
        c0 = popxl.variable(C0, name="c0")
        acc = popxl.variable(np.zeros((2, 3), np.float32), name="acc")
        k = popxl.variable(K, name="k")

        def step(c, a: popxl.TensorByRef):
            ops.var_updates.accumulate_(a, c)
            return c * 0.5

        body = ir.create_graph(step, c0, acc)
        loop = ops.repeat_with_info(body, 3, c0, acc)
        out = _store(loop.outputs[0], "out")
    with body:
        doubled = body.inputs[0] * 2.0
    lp = _ir.view_of(loop._op)
    body._pb_graph.markAsOutput(doubled.id)
    wrapper, call = _wrapper_call(lp, body)
    assert "__loop_wrapper" in wrapper.id and "__loop_wrapper" in str(ir)
    # route k in: a new loop-invariant input of the wrapper, then of the body at the wrapper's call
    k_wrapper = wrapper._create_tensor_id("k")
    lp.addLoopInput(lp.getNumExplicitInputs(), k.id, k_wrapper, False)
    with body:
        k_body = popxl.graph_input(k.shape, k.dtype, "k")
        ops.var_updates.accumulate_(body.inputs[1], k_body)
    call.connectInTensor(call.subgraphInToOpInIndex(body._pb_graph.getInputIndex(k_body.id)), k_wrapper)
    (got,), (got_acc,) = _run(ir, eng, out, variables=[acc])
    c, a = C0.copy(), np.zeros_like(C0)
    for _ in range(3):
        a, c = a + c + K, c * np.float32(0.5)
    np.testing.assert_array_equal(got, c)
    np.testing.assert_allclose(got_acc, a, rtol=1e-6)


def test_output_inserted_before_others_renumbers_call_sites(eng):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(C0, name="x")
        g = ir.create_graph(lambda t: (t + 1.0, t * 3.0), x)
        site = ops.call_with_info(g, x)
        plus, times = site.outputs
        out_plus, out_times = _store(plus, "plus"), _store(times, "times")
    with g:
        minus = g.inputs[0] - 5.0
    g._pb_graph.markAsOutput(0, minus.id, False)
    assert site.outputs[1] is plus and site.outputs[2] is times
    with ir.main_graph:
        out_minus = _store(site.outputs[0], "minus")
    got, _ = _run(ir, eng, out_plus, out_times, out_minus)
    for g_, w in zip(got, (C0 + 1, C0 * 3, C0 - 5)):
        np.testing.assert_array_equal(g_, w)


def test_loop_of_a_wrapped_body_still_differentiates(eng):
    """The gradient of a loop whose body got a (not carried) output, through the wrapper's call,
    is the loop's gradient: d/dc0 of sum(c_n) for c <- c * k over n iterations is k ** n."""
    ir = popxl.Ir()
    with ir.main_graph:
        c0 = popxl.variable(C0, name="c0")
        k = popxl.variable(K, name="k")
        fwd = ir.create_graph(lambda c, k: ops.repeat(ir.create_graph(lambda a, b: a * b, c, k), 3, c, k)[0], c0, k)
        (body,) = [g for g in ir._all_graphs() if g is not fwd and g is not ir.main_graph]
        with body:
            extra = ops.exp(body.inputs[0])
        body._pb_graph.markAsOutput(extra.id)
        grads = autodiff(fwd)
        site = ops.call_with_info(fwd, c0, k)
        seed = popxl.constant(np.ones((2, 3), np.float32))
        dc, dk = ops.call(grads.graph, seed, inputs_dict=grads.inputs_dict(site))
        out_y, out_dc, out_dk = _store(site.outputs[0], "y"), _store(dc, "dc"), _store(dk, "dk")
    (y, got_dc, got_dk), _ = _run(ir, eng, out_y, out_dc, out_dk)
    np.testing.assert_allclose(y, C0 * K ** 3, rtol=1e-6)
    np.testing.assert_allclose(got_dc, K ** 3, rtol=1e-6)
    np.testing.assert_allclose(got_dk, 3 * C0 * K ** 2, rtol=1e-5)


def test_inconsistent_loop_is_refused_by_the_session():
    """A loop output added without its carried input is an error when the program is compiled."""
    ir = popxl.Ir()
    with ir.main_graph:
        c0 = popxl.variable(C0, name="c0")
        body = ir.create_graph(lambda c: c * 2.0, c0)
        loop = ops.repeat_with_info(body, 2, c0)
        _store(loop.outputs[0], "out")
    with body:
        extra = body.inputs[0] + 1.0
    lp = _ir.view_of(loop._op)
    lp.addLoopOutput(1, ir.main_graph._create_tensor_id("extra"), extra.id, False)
    with pytest.raises(popart.popart_exception, match="repeat .* has 2 outputs but only 1 inputs"):
        popxl.Session(ir, "ipu_model")


def test_loop_edit_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        c0 = popxl.variable(C0, name="c0")
        wrong = popxl.variable(np.zeros(3, np.float32), name="wrong")
        flag = popxl.constant(True)
        body = ir.create_graph(lambda c: c * 2.0, c0)
        loop = ops.repeat_with_info(body, 2, c0)
        then_g = ir.create_graph(lambda c: c + 1.0, c0)
        else_g = ir.create_graph(lambda c: c - 1.0, c0)
        ops.conditional(flag, then_g, else_g, [c0], [c0])
    lp = _ir.view_of(loop._op)
    with pytest.raises(popart.popart_exception, match="out of range"):
        lp.addLoopInput(5, c0.id, body._create_tensor_id("x"), False)
    with pytest.raises(popart.popart_exception, match="does not match graph input"):
        lp.addLoopInput(2, wrong.id, body.inputs[0].id, True)
    with pytest.raises(popart.popart_exception, match="out of range"):
        lp.addLoopOutput(2, "y", body.outputs[0].id, False)
    with pytest.raises(NotImplementedError, match="both branches"):
        then_g._pb_graph.markAsOutput(then_g.inputs[0].id)
    with pytest.raises(popart.popart_exception, match="out of range"):
        body._pb_graph.markAsOutput(3, body.inputs[0].id, False)
