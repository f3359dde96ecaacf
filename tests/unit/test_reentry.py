"""A Session called again from inside its own run (a custom op's NumPy kernel, a signal handler or
a callback on the running thread) refuses with a clear exception naming what was attempted; the
run that was interrupted ends with it, and the session stays usable: never freed memory in use,
never another run's values. Other threads wait for the run instead (the session's lock)."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import popart_exception
from popxl.op import REGISTRY, OpDef, create_op, register
from popxl.ops.utils import spec

from engine_harness import engine

ENGINES = ["native", "reference"]
_HOOK = {}


@pytest.fixture
def hook_op():
    """An op whose (Python) kernel calls ``_HOOK['call']()`` and passes its input through."""
    def kernel(x):
        if "call" in _HOOK:
            _HOOK["call"]()
        return x.copy()
    register(OpDef("test_reentry_hook", lambda specs: [spec(specs[0].shape, specs[0].dtype)], kernel,
                   family="test"))
    yield lambda t: create_op("test_reentry_hook", [t])[0]
    REGISTRY.pop("test_reentry_hook", None)
    _HOOK.clear()


def _session(engine_name, hook, nht=1):
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    with ir.main_graph:
        w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
        x_s = popxl.h2d_stream((2,), popxl.float32, "x")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")

        def step(w):
            ops.host_store(y_s, hook(ops.host_load(x_s) * w))
        body = ir.create_graph(step, w)
        ops.repeat(body, nht, inputs_dict={body.inputs[0]: w})
    with engine(engine_name):
        return popxl.Session(ir, "ipu_model"), w, x_s, y_s


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("attempt, words", [
    (lambda s, w, x: s.__exit__(None, None, None), "Session.__exit__: .* leaving `with session:` \\(detach\\)"),
    (lambda s, w, x: s.run({x: np.ones(2, np.float32)}), "Session.run: called while a run of this session"),
    (lambda s, w, x: s.write_variable_data(w, np.zeros(2, np.float32)), "Session.write_variables_data: called while"),
    (lambda s, w, x: s.weights_from_host(), "Session.weights_from_host: called while"),
    (lambda s, w, x: s.get_tensor_data(w), "Session.get_tensors_data: called while"),
])
def test_calls_from_inside_a_run_are_refused(engine_name, hook_op, attempt, words):
    s, w, x_s, y_s = _session(engine_name, hook_op)
    x = np.array([10.0, 20.0], np.float32)
    with s:
        _HOOK["call"] = lambda: attempt(s, w, x_s)
        with pytest.raises(popart_exception, match=words):
            s.run({x_s: x})
        del _HOOK["call"]
        assert s.is_attached
        np.testing.assert_array_equal(s.run({x_s: x})[y_s], [10.0, 40.0])  # usable, its own values
    np.testing.assert_array_equal(s.get_tensor_data(w), [1.0, 2.0])  # the weights were not touched


@pytest.mark.parametrize("engine_name", ENGINES)
def test_a_signal_handler_that_detaches_during_a_run_is_refused(engine_name, hook_op):
    s, w, x_s, y_s = _session(engine_name, hook_op, nht=400)
    x = np.ones((400, 2), np.float32)
    attempts = []

    def handler(signum, frame):
        attempts.append(signum)
        s.__exit__(None, None, None)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        with s:
            _HOOK["call"] = lambda: (time.sleep(0.002), os.kill(os.getpid(), signal.SIGUSR1) if not attempts else None)
            with pytest.raises(popart_exception, match="Session.__exit__: called while a run"):
                s.run({x_s: x})
            del _HOOK["call"]
            np.testing.assert_array_equal(s.run({x_s: x})[y_s], np.tile([1.0, 2.0], (400, 1)))
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert attempts


@pytest.mark.parametrize("engine_name", ENGINES)
def test_another_thread_waits_for_the_run(engine_name, hook_op):
    s, w, x_s, y_s = _session(engine_name, hook_op, nht=50)
    done = []
    with s:
        started = threading.Event()

        def slow():
            started.set()
            time.sleep(0.005)
        _HOOK["call"] = slow

        def other():
            started.wait(5)
            s.write_variable_data(w, np.array([3.0, 3.0], np.float32))  # waits for the run, then writes
            done.append(time.monotonic())
        t = threading.Thread(target=other)
        t.start()
        out = s.run({x_s: np.ones((50, 2), np.float32)})[y_s]
        end = time.monotonic()
        t.join(10)
        del _HOOK["call"]
        assert done and done[0] >= end  # the write came after the run
        np.testing.assert_array_equal(out, np.tile([1.0, 2.0], (50, 1)))  # the run saw one value throughout
        np.testing.assert_array_equal(s.run({x_s: np.ones((50, 2), np.float32)})[y_s], np.full((50, 2), 3.0))
