"""What a user can get wrong (or do on purpose) that must give a clear error or the right result,
never a crash, a hang or silently wrong data: sessions shared between threads, detaching during a
run, Ctrl-C during a long run, another Ir's tensors, recursive graphs, shapes and counts past int64,
and the messages of common mistakes."""
import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import List

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import popart_exception

from engine_harness import engine

ENGINES = ["native", "reference"]


def _accumulating_ir(steps: int, width: int = 256):
    """Per run: ``steps`` times, load x, v += x, store v @ w (so a run takes a while and has state)."""
    ir = popxl.Ir()
    ir.num_host_transfers = steps
    with ir.main_graph:
        x_s = popxl.h2d_stream((width,), popxl.float32, "x")
        y_s = popxl.d2h_stream((width,), popxl.float32, "y")
        v = popxl.variable(np.zeros(width, np.float32), name="v")
        w = popxl.variable(np.eye(width, dtype=np.float32) * 2, name="w")

        def step(v_: popxl.TensorByRef, w_):
            ops.add_(v_, ops.host_load(x_s))
            ops.host_store(y_s, ops.reshape(ops.reshape(v_, (1, width)) @ w_, (width,)))

        ops.repeat(ir.create_graph(step, v, w), steps, v, w)
    return ir, x_s, y_s, v


# threads ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine_name", ENGINES)
def test_runs_from_two_threads_are_serialised(engine_name):
    steps, width = 8, 256
    ir, x_s, y_s, v = _accumulating_ir(steps, width)
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    runs_each = 20
    results = {}
    errors = []

    def worker(k):
        try:
            for i in range(runs_each):
                x = np.full((steps, width), float(k * 1000 + i), np.float32)
                results[(k, i)] = (x, session.run({x_s: x})[y_s])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    with session:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        # v only grows by whole runs: each run's outputs are v_before + cumsum(x) (times 2 from w),
        # whatever order the runs took; the final v is the sum of every input.
        for x, y in results.values():
            inc = 2 * np.cumsum(x[:, 0])
            start = y[0, 0] - inc[0]
            np.testing.assert_allclose(y[:, 0], start + inc, rtol=1e-6)
            np.testing.assert_allclose(y, np.repeat(y[:, :1], width, axis=1), rtol=0)
        total = sum(x.sum(axis=0) for x, _ in results.values())
        np.testing.assert_allclose(session.get_tensor_data(v), total, rtol=1e-6)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_detach_waits_for_a_run_in_another_thread(engine_name):
    steps, width = 200 if engine_name == "native" else 40, 512
    ir, x_s, y_s, v = _accumulating_ir(steps, width)
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    x = np.ones((steps, width), np.float32)
    out = {}
    started = threading.Event()

    def worker():
        started.set()
        out["y"] = session.run({x_s: x})[y_s]

    with session:
        t = threading.Thread(target=worker)
        t.start()
        started.wait()
        time.sleep(0.01)
    # leaving `with session:` detached only after the run: it finished with the right results and
    # the weights it computed were brought back
    t.join()
    assert not session.is_attached
    np.testing.assert_allclose(out["y"][:, 0], 2 * np.arange(1, steps + 1), rtol=1e-6)
    np.testing.assert_allclose(session.get_tensor_data(v), np.full(width, steps), rtol=1e-6)


# Ctrl-C -------------------------------------------------------------------------------------------

_INTERRUPT_CHILD = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    import popxl, popxl.ops as ops

    # Ctrl-C raising KeyboardInterrupt, as in a Python started from a terminal: a child of a
    # background job starts with SIGINT ignored, and Python then leaves it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)

    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((64, 64), np.float32), name="v")
        one = popxl.constant(np.ones((64, 64), np.float32))

        def bump(v_: popxl.TensorByRef, c):
            ops.add_(v_, c)
        ops.repeat(ir.create_graph(bump, v, one), 2 ** 40, v, one)  # hours: only an interrupt ends it

    def bumps():
        n = session.get_tensor_data(v)
        assert (n == n.flat[0]).all() and n.flat[0] >= 1, n.flat[:4]  # whole bumps only
        return int(n.flat[0])

    session = popxl.Session(ir, "ipu_model")
    with session:
        counts = []
        for attempt in range(2):
            print("ready", flush=True)
            try:
                session.run()
            except KeyboardInterrupt:
                print("interrupted", time.time(), flush=True)
            counts.append(bumps())
        assert counts[1] > counts[0], counts  # the second run went on from the first one's weights
        session.write_variable_data(v, np.full((64, 64), 5, np.float32))
        assert (session.get_tensor_data(v) == 5).all()
        print("usable", counts[0], counts[1], flush=True)
    # Python's Ctrl-C handling is back to normal after the runs
    try:
        time.sleep(30)
    except KeyboardInterrupt:
        print("second interrupt", flush=True)
""")


@pytest.mark.parametrize("engine_name", ENGINES)
def test_ctrl_c_stops_a_long_run_and_leaves_the_session_usable(engine_name, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_INTERRUPT_CHILD)
    env = {**os.environ, "POPXL_ENGINE": engine_name}
    env.pop("PYTHONPATH", None)
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], daemon=True).start()

    def next_line() -> List[str]:
        try:
            return lines.get(timeout=60).split()
        except queue.Empty:
            pytest.fail("the child said nothing for 60 s (a run that Ctrl-C did not stop?)")

    try:
        for _ in range(2):
            assert next_line() == ["ready"]
            time.sleep(0.5)  # well into the long run (the engine watches signals after 20 ms)
            sent = time.time()
            child.send_signal(signal.SIGINT)
            line = next_line()
            assert line[:1] == ["interrupted"], line
            latency = float(line[1]) - sent
            assert latency < 1.0, f"the run stopped {latency:.3f} s after Ctrl-C"
        assert next_line()[:1] == ["usable"]
        time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        assert next_line() == ["second", "interrupt"]
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# another Ir's tensors ------------------------------------------------------------------------------

def _small_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.arange(3, dtype=np.float32), name="v")
        c = popxl.constant(np.ones(3, np.float32), name="c")
        y_s = popxl.d2h_stream((3,), popxl.float32, "y")
        ops.host_store(y_s, v + c)
    return ir, v, c, y_s


def test_session_calls_take_only_their_own_irs_tensors():
    ir_a, v_a, c_a, y_a = _small_ir()
    ir_b, v_b, c_b, y_b = _small_ir()
    a, b = popxl.Session(ir_a), popxl.Session(ir_b)
    with a, b:
        for call in (lambda: a.write_variable_data(v_b, np.full(3, 7, np.float32)),
                     lambda: a.write_variables_data({v_b: np.full(3, 7, np.float32)}),
                     lambda: a.get_tensor_data(v_b), lambda: a.get_tensors_data([c_b])):
            with pytest.raises(ValueError, match=r"belongs to Ir\[id=\d+\], not to this Session's Ir"):
                call()
        with pytest.raises(ValueError, match="stream 'y' in the outputs belongs to"):
            a.run_with_outputs({}, {y_b: np.zeros(3, np.float32)})
        # nothing of b's was touched
        np.testing.assert_array_equal(b.get_tensor_data(v_b), np.arange(3))
        np.testing.assert_array_equal(b.run()[y_b], np.arange(3) + 1)


# recursion ----------------------------------------------------------------------------------------

def test_a_graph_calling_itself_is_refused_at_trace_time():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: x + 1.0, popxl.TensorSpec((2,), popxl.float32))
        with g:
            with pytest.raises(ValueError, match=r"ops.call \(at .*test_misuse.py:\d+\): calling graph "
                                                 r"'.*' from graph '.*' would make the program recursive"):
                ops.call(g, g.inputs[0])


def test_a_cycle_through_other_graphs_is_refused_and_named():
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((2,), popxl.float32)
        inner = ir.create_graph(lambda x: x * 2.0, spec)
        middle = ir.create_graph(lambda x: ops.call(inner, x)[0], spec)
        outer = ir.create_graph(lambda x: ops.repeat(middle, 2, x)[0], spec)
        with inner:
            with pytest.raises(ValueError) as e:
                ops.repeat(outer, 3, inner.inputs[0])
            cycle = f"'{inner.id}' -> '{outer.id}' -> '{middle.id}' -> '{inner.id}'"
            assert cycle in str(e.value)
            with pytest.raises(ValueError, match="recursive"):
                ops.conditional(popxl.constant(True), middle, inner, [inner.inputs[0]], [inner.inputs[0]])
        # calling the same graph twice, or from several graphs, is fine
        x = popxl.constant(np.ones(2, np.float32))
        ops.call(outer, x)
        ops.call(outer, x)


# shapes and counts --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, error, words", [
    ((2 ** 31, 2 ** 31), ValueError, "holds 4611686018427387904 elements (18446744073709551616 bytes)"),
    ((2 ** 61,), ValueError, "more than int64 can count"),
    ((2 ** 62, 4), ValueError, "holds 18446744073709551616 elements"),
    ((2 ** 64,), ValueError, "has dimension 18446744073709551616; dimensions must be from 0 to"),
    ((-1, 2), ValueError, "has dimension -1"),
    ((2.5,), TypeError, "must hold ints only"),
    (("3",), TypeError, "must hold ints only"),
    (3, TypeError, "must be a sequence of ints"),
])
def test_bad_stream_shapes_are_refused_at_trace_time(shape, error, words):
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(error) as e:
            popxl.h2d_stream(shape, popxl.float32, "big")
        assert "HostToDeviceStream 'big'" in str(e.value) and words in str(e.value)
        with pytest.raises(error, match="graph_input 'gin'"):
            with ir.create_empty_graph("g"):
                popxl.graph_input(shape, popxl.float32, "gin")


def test_numpy_integers_are_dimensions():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((np.int64(2), np.int32(3)), popxl.float32, "x")
        assert s.shape == (2, 3) and all(type(d) is int for d in s.shape)
        x = ops.host_load(s)
        with pytest.raises(TypeError, match=r"ops.reshape: shape for tensor .* must hold ints only"):
            ops.reshape(x, (2.0, 3))
        with pytest.raises(ValueError, match=r"ops.init.*has dimension 18446744073709551616"):
            ops.init((2 ** 64,), popxl.float32)


@pytest.mark.parametrize("count", [2 ** 63, -1, 2.0, True])
def test_repeat_counts_outside_int64_are_refused(count):
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda: None)
        with pytest.raises(ValueError, match=r"repeat_count must be an int from 0 to 9223372036854775807"):
            ops.repeat(g, count)


def test_device_memory_beyond_the_machine_is_refused_before_allocating():
    ir = popxl.Ir()
    with ir.main_graph:
        x = ops.init((2 ** 40,), popxl.float32, "huge")  # 4 TiB
        ops.host_store(popxl.d2h_stream((1,), popxl.float32, "y"), x[:1])
    with pytest.raises(popart_exception, match=r"needs \d+ bytes of device memory per replica .*more than this "
                                               r"machine's memory .*'huge' \(1099511627776,\) float32"):
        popxl.Session(ir)

    ir = popxl.Ir()
    ir.num_host_transfers = 2 ** 20
    with ir.main_graph:
        s = popxl.h2d_stream((2 ** 20,), popxl.float32, "frames")  # 4 MiB a transfer, 4 TiB a run
        def load():
            ops.host_load(s)
        ops.repeat(ir.create_graph(load), 2 ** 20)
    with pytest.raises(popart_exception, match=r"host buffer of stream 'frames'.*4398046511104 bytes"):
        popxl.Session(ir)


# messages -----------------------------------------------------------------------------------------

def _io_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((2,), popxl.float32, "x")
        i_s = popxl.h2d_stream((2,), popxl.int32, "i")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y_s, ops.host_load(x_s) + ops.cast(ops.host_load(i_s), popxl.float32))
    return ir, x_s, i_s, y_s


def test_wrong_dtype_is_reported_as_given():
    ir, x_s, i_s, y_s = _io_ir()
    with popxl.Session(ir) as s:
        with pytest.raises(TypeError, match=r"stream 'x' carries float32, but the host array has dtype int64"):
            s.run({x_s: np.array([1, 2], np.int64), i_s: np.array([1, 2], np.int32)})
        # 64-bit data for a 32-bit stream of the same kind is still downcast, as PopXL does
        out = s.run({x_s: np.array([1.5, 2.5], np.float64), i_s: np.array([1, 2], np.int64)})
        np.testing.assert_array_equal(out[y_s], [2.5, 4.5])


def test_inputs_must_be_a_dict():
    ir, x_s, i_s, _ = _io_ir()
    with popxl.Session(ir) as s:
        with pytest.raises(TypeError, match=r"inputs must be a dict from stream to host array.*not list"):
            s.run([np.zeros(2, np.float32), np.zeros(2, np.int32)])
        with pytest.raises(TypeError, match=r"expected a dict \{variable: data\}, not list"):
            s.write_variables_data([])


def test_pickling_an_ir_says_what_cannot_be_pickled():
    ir, x_s, _, _ = _io_ir()
    t = ir.main_graph.ops[0].outputs[0]
    for obj in (ir, ir.main_graph, t, t.producer):
        with pytest.raises(TypeError, match=r"Ir\[id=\d+\] \(a popxl.Ir, or a graph or tensor of it\) cannot be "
                                            r"pickled"):
            pickle.dumps(obj)


def test_a_stream_name_as_key_says_to_pass_the_stream():
    """``session.run({"x": ...})``: the message names the stream called "x" and says to key by it."""
    ir, x_s, i_s, y_s = _io_ir()
    with popxl.Session(ir) as s:
        with pytest.raises(ValueError, match=r"key 'x' is a str, not a stream: inputs are keyed by the stream "
                                             r"objects that popxl.h2d_stream returns \(here the stream 'x': pass "
                                             r"the stream itself, not its name\)"):
            s.run({"x": np.zeros(2, np.float32), i_s: np.zeros(2, np.int32)})
        with pytest.raises(ValueError, match=r"key 'y' is a str.*popxl.d2h_stream returns \(here the stream 'y'"):
            s.run_with_outputs({x_s: np.zeros(2, np.float32), i_s: np.zeros(2, np.int32)},
                               {"y": np.zeros(2, np.float32)})
        with pytest.raises(ValueError, match=r"key 'z' is a str, not a stream: inputs are keyed by the stream "
                                             r"objects that popxl.h2d_stream returns\."):
            s.run({x_s: np.zeros(2, np.float32), i_s: np.zeros(2, np.int32), "z": 0})


def test_axis_and_index_errors_name_the_users_line():
    """Out-of-range axes and indices give the "(at file:line)" that the other op errors give."""
    here = r"\(at .*test_misuse.py:\d+\)"
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32), name="a")
        with pytest.raises(ValueError, match=r"ops.softmax: axis 5 is out of range .*" + here):
            ops.softmax(a, axis=5)
        with pytest.raises(IndexError, match=r"index 7 is out of bounds for axis 0 of 'a' with size 2 " + here):
            a[7]
        with pytest.raises(TypeError, match=r"Cannot index 'a' with 'k'.*" + here):
            a["k"]
        with pytest.raises(ValueError, match=r"ops.sum: axis 2 is out of range.*" + here):
            ops.sum(a, axis=2)
        with pytest.raises(ValueError, match=r"ops.squeeze: axis 4 is out of range.*" + here):
            ops.squeeze(a, [4])
        with pytest.raises(ValueError, match=r"ops.concat: axis 3 is out of range.*" + here):
            ops.concat([a, a], axis=3)
        with pytest.raises(ValueError, match=r"ops.split: axis: axis 3 is out of range.*" + here):
            ops.split(a, 2, axis=3)


def test_call_outputs_in_a_name_scope_carry_the_scope_once():
    """A graph traced and called in ``name_scope("layer0")``: its call's output is ``layer0/gelu``
    (the listing showed ``layer0/layer0/gelu``); a call from another scope keeps the graph's name."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((3, 4), np.float32), name="x")
        with popxl.name_scope("layer0"):
            graph = ir.create_graph(lambda t: ops.gelu(t), x.spec)
            (y,) = ops.call(graph, x)
        with popxl.name_scope("layer1"):
            (z,) = ops.call(graph, x)
        (u,) = ops.call(graph, x)
    assert [t.name for t in graph.outputs] == ["layer0/gelu"]
    assert (y.id, z.id, u.id) == ("layer0/gelu", "layer1/layer0/gelu", "layer0/gelu__t1")
    assert "layer0/layer0" not in str(ir)


def test_popart_version_string():
    import popart
    assert popart.versionString() == popart.__version__ == popxl.__version__
    assert popart.versionNumber() == tuple(int(p) for p in popart.__version__.split("."))
