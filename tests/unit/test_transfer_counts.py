"""Streams transferred other than num_host_transfers times per run, as PopXL and PopART define it:
each host_load reads the next slice of the stream's (num_host_transfers, replicas, *shape) input and
each host_store writes the next output slice, wrapping to slice 0 after the last; every run starts
at slice 0 again. Such a program is legal: the Session logs each such stream once (PopART's logger,
warning level), and output slices that no store wrote are zero in the arrays Session.run allocates
and keep their values in arrays given to run_with_outputs. Both engines behave alike."""
import contextlib
import logging

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.compiler import lower
from popxl.compiler.executable import transfer_counts
from popxl.logs import ROOT

from engine_harness import engine

ENGINES = ["native", "reference"]


def _session(ir, engine_name):
    with engine(engine_name):
        return popxl.Session(ir, "ipu_model")


@contextlib.contextmanager
def _warnings(caplog):
    """PopART's loggers do not propagate to the root logger: listen on theirs."""
    caplog.handler.setLevel(logging.WARNING)
    ROOT.addHandler(caplog.handler)
    level = ROOT.level
    ROOT.setLevel(logging.WARNING)
    try:
        yield caplog.records
    finally:
        ROOT.removeHandler(caplog.handler)
        ROOT.setLevel(level)


def _count_warnings(records, stream):
    return [r for r in records if r.name == "popart.session" and f"Stream {stream!r}" in r.getMessage()]


def _accumulate_ir(nht, repeats):
    """acc += x, y = acc, ``repeats`` times per run (acc starts at 0 each run)."""
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    with ir.main_graph:
        x_s = popxl.h2d_stream((2,), popxl.float32, "x")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")

        def step(acc):
            acc = acc + ops.host_load(x_s)
            ops.host_store(y_s, acc)
            return acc

        body = ir.create_graph(step, popxl.TensorSpec((2,), popxl.float32))
        ops.repeat(body, repeats, popxl.constant(np.zeros(2, np.float32)))
    return ir, x_s, y_s


@pytest.mark.parametrize("engine_name", ENGINES)
def test_fewer_transfers_read_the_first_slices_and_leave_zeros(engine_name, caplog):
    ir, x_s, y_s = _accumulate_ir(nht=4, repeats=2)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    with _warnings(caplog) as records:
        s = _session(ir, engine_name)
        with s:
            for _ in range(2):  # every run starts again at slice 0
                y = s.run({x_s: x})[y_s]
                np.testing.assert_array_equal(y, [x[0], x[0] + x[1], [0, 0], [0, 0]])
    (lx,) = _count_warnings(records, "x")
    (ly,) = _count_warnings(records, "y")
    assert lx.levelno == logging.WARNING
    assert "(host_load) is transferred 2 time(s) per run, but ir.num_host_transfers is 4" in lx.getMessage()
    assert "only the first 2 of the input's 4 slice(s) are read" in lx.getMessage()
    assert "(host_store) is transferred 2 time(s)" in ly.getMessage()
    assert "output slices 2 to 3 are not written: zero" in ly.getMessage()


@pytest.mark.parametrize("engine_name", ENGINES)
def test_more_transfers_wrap_around(engine_name, caplog):
    ir, x_s, y_s = _accumulate_ir(nht=2, repeats=3)
    x = np.array([[1, 2], [10, 20]], np.float32)
    with _warnings(caplog) as records:
        s = _session(ir, engine_name)
        with s:
            y = s.run({x_s: x})[y_s]
            # loads x0, x1, x0; stores acc to slices 0, 1, 0: slice 0 holds the third value
            np.testing.assert_array_equal(y, [2 * x[0] + x[1], x[0] + x[1]])
            y = s.run({x_s: x + 1})[y_s]
            np.testing.assert_array_equal(y, [2 * (x[0] + 1) + x[1] + 1, x[0] + x[1] + 2])
    assert "after slice 1 the loads wrap around to slice 0" in _count_warnings(records, "x")[0].getMessage()
    assert "each output slice holds the last value stored" in _count_warnings(records, "y")[0].getMessage()


@pytest.mark.parametrize("engine_name", ENGINES)
def test_outputs_given_to_run_with_outputs_keep_unwritten_slices(engine_name):
    ir, x_s, y_s = _accumulate_ir(nht=3, repeats=1)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    s = _session(ir, engine_name)
    with s:
        out = np.full((3, 2), -7.0, np.float32)
        s.run_with_outputs({x_s: x}, {y_s: out})
        np.testing.assert_array_equal(out, [x[0], [-7, -7], [-7, -7]])
        # a strided array goes through a copy: the slices no store wrote keep their values too
        wide = np.full((3, 4), -5.0, np.float32)
        s.run_with_outputs({x_s: x + 1}, {y_s: wide[:, ::2]})
        np.testing.assert_array_equal(wide[:, ::2], [x[0] + 1, [-5, -5], [-5, -5]])
        np.testing.assert_array_equal(wide[:, 1::2], -5.0)
        # the arrays the session allocates are zero there, every run (no stale memory)
        assert not s.create_host_outputs()[y_s].any()
        for _ in range(3):
            np.testing.assert_array_equal(s.run({x_s: x})[y_s], [x[0], [0, 0], [0, 0]])


@pytest.mark.parametrize("engine_name", ENGINES)
def test_nested_repeats_and_calls_multiply_counts(engine_name, caplog):
    ir = popxl.Ir()
    ir.num_host_transfers = 5
    with ir.main_graph:
        x_s = popxl.h2d_stream((), popxl.float32, "x")
        y_s = popxl.d2h_stream((), popxl.float32, "y")
        inner = ir.create_graph(lambda: ops.host_store(y_s, ops.host_load(x_s) * 2.0))
        middle = ir.create_graph(lambda: ops.repeat(inner, 3))

        def outer():
            ops.call(middle)
            ops.call(middle)
        ops.repeat(ir.create_graph(outer), 2)  # 2 x (2 calls x 3) = 12 transfers
    assert transfer_counts(lower(ir)) == ([12], [12])
    x = np.arange(1, 6, dtype=np.float32)
    with _warnings(caplog) as records:
        s = _session(ir, engine_name)
        with s:
            y = s.run({x_s: x})[y_s]
    # transfer k uses slice k % 5; slice i last written by the largest k < 12 with k % 5 == i
    np.testing.assert_array_equal(y, 2 * x)
    assert "is transferred 12 time(s) per run, but ir.num_host_transfers is 5" in \
        _count_warnings(records, "x")[0].getMessage()


def _lr_training_ir(device_iterations, accumulation):
    """Graphcore's training applications: the learning rate is loaded once per step, the data and
    labels once per micro-batch (num_host_transfers = device_iterations * accumulation). A linear
    model's squared error, gradients accumulated over the micro-batches, then w -= lr * grad."""
    ir = popxl.Ir()
    ir.num_host_transfers = device_iterations * accumulation
    with ir.main_graph:
        w = popxl.variable(np.array([[0.5], [-1.0], [2.0]], np.float32), name="w")
        lr_s = popxl.h2d_stream((), popxl.float32, "lr")
        x_s = popxl.h2d_stream((4, 3), popxl.float32, "x")
        t_s = popxl.h2d_stream((4, 1), popxl.float32, "t")
        loss_s = popxl.d2h_stream((), popxl.float32, "loss")

        def micro_batch(acc, w):
            x, t = ops.host_load(x_s), ops.host_load(t_s)
            err = ops.matmul(x, w) - t
            ops.host_store(loss_s, ops.sum(err * err) * 0.5)
            return acc + ops.matmul(ops.transpose(x), err)

        mb = ir.create_graph(micro_batch, popxl.TensorSpec((3, 1), popxl.float32), w.spec)

        def step(w: popxl.TensorByRef):
            lr = ops.host_load(lr_s)
            (grad,) = ops.repeat(mb, accumulation, popxl.constant(np.zeros((3, 1), np.float32)),
                                 inputs_dict={mb.inputs[1]: w})
            ops.scaled_add_(w, grad, b=-lr)

        st = ir.create_graph(step, w)
        ops.repeat(st, device_iterations, inputs_dict={st.inputs[0]: w})
    return ir, w, lr_s, x_s, t_s, loss_s


@pytest.mark.parametrize("engine_name", ENGINES)
def test_learning_rate_once_per_step_data_per_micro_batch(engine_name, caplog):
    di, acc = 2, 3
    ir, w, lr_s, x_s, t_s, loss_s = _lr_training_ir(di, acc)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(di * acc, 4, 3)).astype(np.float32)
    t = rng.normal(size=(di * acc, 4, 1)).astype(np.float32)
    lr = np.array([0.1, 0.01, 99.0, 99.0, 99.0, 99.0], np.float32)  # slices 2.. are never read

    ref = np.array([[0.5], [-1.0], [2.0]], np.float64)
    losses = []
    for run in range(2):
        for step in range(di):
            grad = np.zeros((3, 1))
            for m in range(acc):
                k = step * acc + m
                err = x[k] @ ref - t[k]
                losses.append(0.5 * float((err * err).sum()))
                grad += x[k].T @ err
            ref = ref - lr[step] * grad  # the learning rate of step s is slice s, every run

    with _warnings(caplog) as records:
        s = _session(ir, engine_name)
        with s:
            got = [s.run({lr_s: lr, x_s: x, t_s: t})[loss_s] for _ in range(2)]
        np.testing.assert_allclose(np.concatenate(got), losses, rtol=2e-5)
        np.testing.assert_allclose(s.get_tensor_data(w), ref, rtol=2e-5)
    (msg,) = [r.getMessage() for r in _count_warnings(records, "lr")]
    assert "is transferred 2 time(s) per run, but ir.num_host_transfers is 6" in msg
    assert not _count_warnings(records, "x") and not _count_warnings(records, "t")


def _conditional_ir(nht, then_loads, else_loads, replication=1):
    """Per step: load a flag, then a branch that loads x ``then_loads`` / ``else_loads`` times and
    adds what it read to y, which is stored once per step."""
    ir = popxl.Ir(replication=replication)
    ir.num_host_transfers = nht
    with ir.main_graph:
        flag_s = popxl.h2d_stream((), popxl.bool, "flag")
        x_s = popxl.h2d_stream((), popxl.float32, "x")
        y_s = popxl.d2h_stream((), popxl.float32, "y")

        def branch(n):
            def body(acc):
                for _ in range(n):
                    acc = acc + ops.host_load(x_s)
                return acc
            return body

        then_g = ir.create_graph(branch(then_loads), popxl.TensorSpec((), popxl.float32))
        else_g = ir.create_graph(branch(else_loads), popxl.TensorSpec((), popxl.float32))

        def step():
            flag = ops.host_load(flag_s)
            (y,) = ops.conditional(flag, then_g, else_g, [popxl.constant(0.0)], [popxl.constant(0.0)])
            ops.host_store(y_s, y)
        ops.repeat(ir.create_graph(step), nht)
    return ir, flag_s, x_s, y_s


def test_same_count_in_both_branches_is_known_before_running():
    ir, *_ = _conditional_ir(nht=2, then_loads=1, else_loads=1)
    assert transfer_counts(lower(ir)) == ([2, 2], [2])
    ir, *_ = _conditional_ir(nht=2, then_loads=2, else_loads=0)
    assert transfer_counts(lower(ir)) == ([2, None], [2])


@pytest.mark.parametrize("engine_name", ENGINES)
def test_count_that_depends_on_branches_is_logged_after_the_run(engine_name, caplog):
    # The then-branch reads x twice, the else-branch not at all.
    ir, flag_s, x_s, y_s = _conditional_ir(nht=2, then_loads=2, else_loads=0)
    x = np.array([1.0, 10.0], np.float32)
    with _warnings(caplog) as records:
        s = _session(ir, engine_name)
        with s:
            assert not _count_warnings(records, "x")  # not known before a run
            out = s.run({flag_s: np.array([True, False]), x_s: x})
            np.testing.assert_array_equal(out[y_s], [11.0, 0.0])
            assert not _count_warnings(records, "x")  # 2 loads: as many as num_host_transfers
            out = s.run({flag_s: np.array([False, False]), x_s: x})
            np.testing.assert_array_equal(out[y_s], [0.0, 0.0])
            (msg,) = [r.getMessage() for r in _count_warnings(records, "x")]
            assert "(host_load) is transferred 0 time(s) in a run (the count depends on which branches" in msg
            assert "its input is not read" in msg
            out = s.run({flag_s: np.array([True, True]), x_s: x})  # 4 loads: x0 + x1, then x0 + x1 again
            np.testing.assert_array_equal(out[y_s], [11.0, 11.0])
            out = s.run({flag_s: np.array([False, True]), x_s: x})
            np.testing.assert_array_equal(out[y_s], [0.0, 11.0])
    assert len(_count_warnings(records, "x")) == 1  # once per Session


@pytest.mark.parametrize("engine_name", ENGINES)
def test_replicas_keep_their_own_counts(engine_name, caplog):
    ir = popxl.Ir(replication=2)
    ir.num_host_transfers = 2
    with ir.main_graph:
        flag_s = popxl.h2d_stream((), popxl.bool, "flag")
        y_s = popxl.d2h_stream((), popxl.float32, "y")
        then_g = ir.create_graph(lambda: ops.host_store(y_s, popxl.constant(1.0)))
        else_g = ir.create_graph(lambda: None)
        ops.repeat(ir.create_graph(lambda: ops.conditional(ops.host_load(flag_s), then_g, else_g)), 2)
    with _warnings(caplog) as records:
        s = _session(ir, engine_name)
        with s:
            out = s.run({flag_s: np.array([[True, False], [True, True]])})[y_s]
            # replica 0 stores twice (slices 0, 1); replica 1 once (slice 0; slice 1 stays 0)
            np.testing.assert_array_equal(out, [[1.0, 1.0], [1.0, 0.0]])
    (msg,) = [r.getMessage() for r in _count_warnings(records, "y")]
    assert "transferred 1 time(s) in a run (the count depends on which branches of ops.conditional run; " \
           "on replica 1)" in msg


def test_correct_programs_log_nothing(caplog):
    ir, x_s, y_s = _accumulate_ir(nht=3, repeats=3)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with _warnings(caplog) as records:
        s = popxl.Session(ir)
        with s:
            np.testing.assert_array_equal(s.run({x_s: x})[y_s], np.cumsum(x, axis=0))
    assert not [r for r in records if r.name == "popart.session"]
