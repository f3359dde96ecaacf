"""Each stream is transferred exactly num_host_transfers times per run: a program that does it fewer
or more times is refused when the Session is made, or, where the count depends on which branch of a
conditional runs, by the run itself (both engines)."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.compiler import lower
from popxl.compiler.executable import transfer_counts

from engine_harness import engine

ENGINES = ["native", "reference"]


def _session(ir, engine_name="native"):
    with engine(engine_name):
        return popxl.Session(ir, "ipu_model")


def _load_store_ir(nht, repeats=None):
    """x -> x + 1 -> y, in the main graph, or in a graph repeated ``repeats`` times."""
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    with ir.main_graph:
        x_s = popxl.h2d_stream((2,), popxl.float32, "x")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")

        def step():
            ops.host_store(y_s, ops.host_load(x_s) + 1.0)

        if repeats is None:
            step()
        else:
            ops.repeat(ir.create_graph(step), repeats)
    return ir, x_s, y_s


def test_forgotten_repeat_is_refused_at_creation():
    ir, _, _ = _load_store_ir(nht=4)
    with pytest.raises(popxl.errors.popart_exception) as e:
        popxl.Session(ir)
    msg = str(e.value)
    assert "stream 'x' (host_load) 1 time(s) per run" in msg and "num_host_transfers is 4" in msg
    assert "ir.num_host_transfers = 1" in msg and "ops.repeat(..., repeat_count=4)" in msg


def test_too_many_transfers_are_refused_at_creation():
    ir, _, _ = _load_store_ir(nht=2, repeats=3)
    with pytest.raises(popxl.errors.popart_exception, match=r"'x' \(host_load\) 3 time\(s\).*is 2.*"
                                                             r"ir.num_host_transfers = 3"):
        popxl.Session(ir)


def test_counts_multiply_through_nested_repeats_and_calls():
    ir = popxl.Ir()
    ir.num_host_transfers = 12
    with ir.main_graph:
        x_s = popxl.h2d_stream((), popxl.float32, "x")
        y_s = popxl.d2h_stream((), popxl.float32, "y")
        inner = ir.create_graph(lambda: ops.host_store(y_s, ops.host_load(x_s) * 2.0))
        middle = ir.create_graph(lambda: ops.repeat(inner, 3))

        def outer():
            ops.call(middle)
            ops.call(middle)
        ops.repeat(ir.create_graph(outer), 2)  # 2 x (2 calls x 3) = 12
    assert transfer_counts(lower(ir)) == ([12], [12])
    s = popxl.Session(ir)
    x = np.arange(12, dtype=np.float32)
    with s:
        np.testing.assert_array_equal(s.run({x_s: x})[y_s], 2 * x)

    twin = popxl.Ir()
    twin.num_host_transfers = 6
    with twin.main_graph:
        x2 = popxl.h2d_stream((), popxl.float32, "x")
        inner2 = twin.create_graph(lambda: ops.host_store(popxl.d2h_stream((), popxl.float32, "y"),
                                                          ops.host_load(x2)))
        ops.repeat(twin.create_graph(lambda: ops.repeat(inner2, 3)), 4)
    with pytest.raises(popxl.errors.popart_exception, match=r"12 time\(s\) per run.*is 6"):
        popxl.Session(twin)


def _conditional_ir(nht, then_loads, else_loads):
    """Per run: load a flag, then a branch that loads x ``then_loads`` / ``else_loads`` times and
    adds what it read to y, which is stored once."""
    ir = popxl.Ir()
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


def test_same_count_in_both_branches_is_known_at_creation():
    ir, *_ = _conditional_ir(nht=2, then_loads=1, else_loads=1)
    assert transfer_counts(lower(ir)) == ([2, 2], [2])
    bad, *_ = _conditional_ir(nht=2, then_loads=2, else_loads=2)  # 2 steps x 2 loads = 4
    with pytest.raises(popxl.errors.popart_exception, match=r"'x' \(host_load\) 4 time\(s\)"):
        popxl.Session(bad)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_count_that_depends_on_branches_is_checked_by_the_run(engine_name):
    # The then-branch reads x twice, the else-branch not at all: with 2 steps per run the run is
    # right only when exactly one step takes the then-branch.
    ir, flag_s, x_s, y_s = _conditional_ir(nht=2, then_loads=2, else_loads=0)
    counts = transfer_counts(lower(ir))
    assert counts == ([2, None], [2])
    s = _session(ir, engine_name)
    x = np.array([1.0, 10.0], np.float32)
    with s:
        out = s.run({flag_s: np.array([True, False]), x_s: x})
        np.testing.assert_array_equal(out[y_s], [11.0, 0.0])
        with pytest.raises(RuntimeError, match=r"host_load of stream 'x' ran 0 time\(s\) in this run, but "
                                               r"num_host_transfers=2.*ops.conditional"):
            s.run({flag_s: np.array([False, False]), x_s: x})
        with pytest.raises(RuntimeError, match=r"'x' ran more than num_host_transfers=2"):
            s.run({flag_s: np.array([True, True]), x_s: x})
        # the session stays usable after both errors
        out = s.run({flag_s: np.array([False, True]), x_s: x})
        np.testing.assert_array_equal(out[y_s], [0.0, 11.0])


@pytest.mark.parametrize("engine_name", ENGINES)
def test_run_count_check_names_the_replica(engine_name):
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        flag_s = popxl.h2d_stream((), popxl.bool, "flag")
        y_s = popxl.d2h_stream((), popxl.float32, "y")
        then_g = ir.create_graph(lambda: ops.host_store(y_s, popxl.constant(1.0)))
        else_g = ir.create_graph(lambda: None)
        ops.conditional(ops.host_load(flag_s), then_g, else_g)
    s = _session(ir, engine_name)
    with s:
        out = s.run({flag_s: np.array([True, True])})
        np.testing.assert_array_equal(out[y_s], [1.0, 1.0])
        with pytest.raises(RuntimeError, match=r"host_store of stream 'y' ran 0 time\(s\) in this run on replica 1"):
            s.run({flag_s: np.array([True, False])})


def test_correct_programs_are_unaffected():
    ir, x_s, y_s = _load_store_ir(nht=3, repeats=3)
    s = popxl.Session(ir)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with s:
        np.testing.assert_array_equal(s.run({x_s: x})[y_s], x + 1)
