"""Pipelined execution over popxl.ipu(0) / popxl.ipu(1) with copy_to_ipu, built the way
popxl-addons' pipelining transform builds it: ramp-up cycles, then a loop whose body is traced
passing the copied values through unchanged, filled with one cycle of every stage afterwards
(variables routed in with LoopOp.addLoopInput), its new copies marked as body outputs and made the
carried values with LoopOp.addLoopOutput, then ramp-down cycles. Each pipelined program must give
what the same stages run one micro-batch after another give (values, losses, trained weights),
and both must match a float64 NumPy replay, on both engines."""
from types import SimpleNamespace

import numpy as np
import pytest

import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from engine_harness import engine

ENGINES = ["native", "reference"]
B, D_IN, H, D_OUT = 4, 5, 6, 3
N = 6          # micro-batches per run (num_host_transfers)
LR = 0.1
RNG = np.random.default_rng(387)
W0 = (RNG.normal(size=(D_IN, H)) / np.sqrt(D_IN)).astype(np.float32)
W1 = (RNG.normal(size=(H, D_OUT)) / np.sqrt(H)).astype(np.float32)
XS = RNG.normal(size=(2, N, B, D_IN)).astype(np.float32)   # two runs of N micro-batches
TS = RNG.normal(size=(2, N, B, D_OUT)).astype(np.float32)


@pytest.fixture(params=ENGINES)
def eng(request):
    return request.param


# the pipeline ------------------------------------------------------------------------------------
def _route(loop, body, t, written):
    """``t`` (a main-graph tensor) as a new loop-invariant input of the loop's body; ``written``:
    the body changes it in place and the loop copies it back."""
    sub = body._create_tensor_id(t.name)
    loop.addLoopInput(loop.getNumExplicitInputs(), t.id, sub, False)
    if written:
        index = loop.subgraphInToOpInIndex(body._pb_graph.getInputIndex(sub))
        loop.addModified(index, [_ir.view.Region.getFull(t.shape)])
    return body.get_tensor(sub)


def _cycle(stages, first, last, v, carried):
    """One pipeline cycle: stages ``first .. last - 1``, stage s reading what stage s - 1 sent in
    the previous cycle; returns what each stage sends to the next one."""
    sent = list(carried)
    for s in range(first, last):
        out = stages[s](carried[s - 1] if s else None, v)
        if s < len(stages) - 1:
            sent[s] = out
    return sent


def build_pipelined(stages, steps, v, written):
    """Trace ``stages`` (functions (value from the previous stage, variables) -> value for the next,
    already copied to its IPU) into the current graph as a pipeline over ``steps`` micro-batches."""
    n = len(stages)
    carried = [None] * (n - 1)
    for c in range(n - 1):  # ramp-up
        carried = _cycle(stages, 0, c + 1, v, carried)
    ir = popxl.gcg().ir
    body = ir.create_graph(lambda *values: values, *carried)  # passes the copies through, for now
    with popxl.ipu(0):
        site = ops.repeat_with_info(body, steps - (n - 1), *carried)
    loop = _ir.view_of(site._op)
    v_body = SimpleNamespace(**{k: _route(loop, body, t, k in written) for k, t in vars(v).items()})
    with body:
        sent = _cycle(stages, 0, n, v_body, list(body.inputs[:n - 1]))
    for j, t in enumerate(sent):  # the new copies become the values the loop carries
        body._pb_graph.markAsOutput(t.id)
        wrapper = popxl.Graph._from_pb(loop.getCalledGraphs()[0])
        (call,) = [op for op in wrapper._pb_graph.getOps()
                   if isinstance(op, _ir.op.CallOp) and op.getCalledGraphs()[0].id == body._pb_graph.id]
        inner = wrapper._create_tensor_id(t.name)
        call.createAndConnectOutTensor(body._pb_graph.getOutputIndex(t.id), inner)
        call.setup()
        loop.addLoopOutput(j, loop.outId(j), inner, True)
    carried = list(site.outputs)
    for c in range(1, n):  # ramp-down
        carried = _cycle(stages, c, n, v, carried)


def build_sequential(stages, steps, v):
    """The same stages run for one micro-batch after another: no overlap, no loop."""
    for _ in range(steps):
        value = None
        for stage in stages:
            value = stage(value, v)


# a two-stage inference pipeline ------------------------------------------------------------------
def _inference_program(pipelined):
    ir = popxl.Ir()
    ir.num_host_transfers = N
    with ir.main_graph:
        x_s = popxl.h2d_stream((B, D_IN), popxl.float32, "x")
        y_s = popxl.d2h_stream((B, D_OUT), popxl.float32, "y")
        with popxl.ipu(0):
            w0 = popxl.variable(W0, name="w0")
        with popxl.ipu(1):
            w1 = popxl.variable(W1, name="w1")

        def stage0(_, v):
            with popxl.ipu(0):
                return ops.tanh(ops.host_load(x_s) @ v.w0).copy_to_ipu(1)

        def stage1(h, v):
            with popxl.ipu(1):
                ops.host_store(y_s, ops.gelu(h @ v.w1))

        v = SimpleNamespace(w0=w0, w1=w1)
        if pipelined:
            build_pipelined([stage0, stage1], N, v, written=())
        else:
            build_sequential([stage0, stage1], N, v)
    return ir, x_s, y_s


def _gelu(x):  # popxl's gelu is the tanh approximation, as PopART's
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def test_two_stage_inference_pipeline(eng):
    results = []
    for pipelined in (True, False):
        ir, x_s, y_s = _inference_program(pipelined)
        with engine(eng):
            session = popxl.Session(ir, "ipu_model")
        with session:
            results.append(session.run({x_s: XS[0]})[y_s])
    got, sequential = results
    assert got.shape == (N, B, D_OUT)
    np.testing.assert_array_equal(got, sequential)
    want = _gelu(np.tanh(XS[0].astype(np.float64) @ W0) @ W1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# a three-stage training pipeline ------------------------------------------------------------------
def _training_program(pipelined):
    """Stage 0 (IPU 0): load x, h = tanh(x @ w0), stash x and h. Stage 1 (IPU 1): load the target,
    y = h @ w1, store the loss 0.5 * |y - t|^2 / B, accumulate dw1, send dh back. Stage 2 (IPU 0):
    restore x and h of the same micro-batch, accumulate dw0. After the micro-batches, one SGD step
    with the accumulated gradients."""
    ir = popxl.Ir()
    ir.num_host_transfers = N
    with ir.main_graph:
        x_s = popxl.h2d_stream((B, D_IN), popxl.float32, "x")
        t_s = popxl.h2d_stream((B, D_OUT), popxl.float32, "t")
        loss_s = popxl.d2h_stream((), popxl.float32, "loss")
        with popxl.ipu(0):
            v0 = dict(w0=popxl.variable(W0, name="w0"), acc0=popxl.variable(np.zeros_like(W0), name="acc0"),
                      stash_x=popxl.variable(np.zeros((3, B, D_IN), np.float32), name="stash_x"),
                      stash_h=popxl.variable(np.zeros((3, B, H), np.float32), name="stash_h"),
                      put=popxl.variable(np.zeros(1, np.uint32), name="put"),
                      take=popxl.variable(np.zeros(1, np.uint32), name="take"))
        with popxl.ipu(1):
            v1 = dict(w1=popxl.variable(W1, name="w1"), acc1=popxl.variable(np.zeros_like(W1), name="acc1"))
        v = SimpleNamespace(**v0, **v1)

        def stage0(_, v):
            with popxl.ipu(0):
                x = ops.host_load(x_s)
                h = ops.tanh(x @ v.w0)
                for stash, value in ((v.stash_x, x), (v.stash_h, h)):
                    ops.dynamic_update_(stash, v.put, value.reshape((1, *value.shape)), [0], [1], True)
                ops.increment_mod_(v.put, 1, 3)
                return h.copy_to_ipu(1)

        def stage1(h, v):
            with popxl.ipu(1):
                diff = h @ v.w1 - ops.host_load(t_s)
                ops.host_store(loss_s, ops.sum(diff * diff) * (0.5 / B))
                dy = diff * (1.0 / B)
                ops.var_updates.accumulate_(v.acc1, h.T @ dy)
                return (dy @ v.w1.T).copy_to_ipu(0)

        def stage2(dh, v):
            with popxl.ipu(0):
                x, h = (ops.dynamic_slice(stash, v.take, [0], [1], True).reshape(stash.shape[1:])
                        for stash in (v.stash_x, v.stash_h))
                ops.increment_mod_(v.take, 1, 3)
                ops.var_updates.accumulate_(v.acc0, x.T @ (dh * (1.0 - h * h)))

        stages = [stage0, stage1, stage2]
        if pipelined:
            build_pipelined(stages, N, v, written={"acc0", "acc1", "stash_x", "stash_h", "put", "take"})
        else:
            build_sequential(stages, N, v)
        for w, acc in ((v.w0, v.acc0), (v.w1, v.acc1)):
            with popxl.ipu(w.ipu):
                ops.scaled_add_(w, acc, b=-LR)
                ops.var_updates.accumulator_zero_(acc)
    return ir, x_s, t_s, loss_s, (v.w0, v.w1)


def _numpy_training():
    w0, w1 = W0.astype(np.float64), W1.astype(np.float64)
    losses = []
    for x_run, t_run in zip(XS, TS):
        g0, g1, run_losses = np.zeros_like(w0), np.zeros_like(w1), []
        for x, t in zip(x_run.astype(np.float64), t_run.astype(np.float64)):
            h = np.tanh(x @ w0)
            diff = h @ w1 - t
            run_losses.append(0.5 * np.sum(diff * diff) / B)
            dy = diff / B
            g1 += h.T @ dy
            g0 += x.T @ ((dy @ w1.T) * (1 - h * h))
        w0, w1 = w0 - LR * g0, w1 - LR * g1
        losses.append(run_losses)
    return np.array(losses), w0, w1


def _train(pipelined, eng):
    ir, x_s, t_s, loss_s, weights = _training_program(pipelined)
    with engine(eng):
        session = popxl.Session(ir, "ipu_model")
    with session:
        losses = [session.run({x_s: x, t_s: t})[loss_s] for x, t in zip(XS, TS)]
        trained = [session.get_tensor_data(w) for w in weights]
    return np.array(losses), trained


def test_three_stage_training_pipeline(eng):
    losses, (w0, w1) = _train(True, eng)
    seq_losses, (seq_w0, seq_w1) = _train(False, eng)
    assert losses.shape == (2, N)
    np.testing.assert_allclose(losses, seq_losses, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w0, seq_w0, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w1, seq_w1, rtol=1e-6, atol=1e-7)
    want_losses, want_w0, want_w1 = _numpy_training()
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(w0, want_w0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w1, want_w1, rtol=1e-5, atol=1e-6)
    assert not np.allclose(w0, W0, atol=1e-3) and not np.allclose(w1, W1, atol=1e-3)  # the step did move them
