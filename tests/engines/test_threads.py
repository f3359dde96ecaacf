"""The native engine's thread team (native/src/threads.hpp): how regions share out work, what
happens to an exception thrown on a thread, a team per Python thread that runs sessions, and the
threads' wait between regions (busy during a run, asleep after it)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.engines.native import _import_native

_native = _import_native()


def _shares(taken: list) -> list:
    """Item counts of the threads that took any, checking each took one contiguous run of items,
    in thread order (with fewer items than threads, the first threads' shares are empty)."""
    assert min(taken, default=0) >= 0 and taken == sorted(taken), taken
    return [taken.count(i) for i in sorted(set(taken))]


@pytest.mark.parametrize("items", [1, 2, 7, 1000])
def test_static_shares_are_contiguous_and_even(items):
    sizes = _shares(_native.team_shares(items))
    assert sum(sizes) == items
    assert max(sizes) - min(sizes) <= 1


def test_no_items_is_no_work():
    assert _native.team_shares(0) == []


@pytest.mark.parametrize("where", ["first", "last"])
def test_an_exception_on_any_thread_reaches_the_caller_and_the_team_lives_on(where):
    # The first item is on the caller's share, the last on the last thread's (a worker's when the
    # machine has two cores or more).
    items = 1000
    fail_at, thread = (0, 0) if where == "first" else (items - 1, max(_native.team_shares(items)))
    with pytest.raises(ValueError, match=f"item {fail_at} failed on thread {thread}$"):
        _native.team_shares(items, fail_at)
    assert sum(_shares(_native.team_shares(items))) == items


def _relu_program(n: int):
    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((n, n), popxl.float32, "x")
        y_s = popxl.d2h_stream((n, n), popxl.float32, "y")
        ops.host_store(y_s, ops.relu(ops.host_load(x_s)) * 2.0)  # elementwise: over the threads
    return ir, x_s, y_s


def _task_count() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_sessions_on_several_python_threads_each_get_a_team_ended_with_the_thread():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((512, 512)).astype(np.float32) for _ in range(3)]
    results: dict = {}
    errors: list = []

    def work(k: int) -> None:
        try:
            ir, x_s, y_s = _relu_program(512)
            with popxl.Session(ir, "cpu") as s:
                results[k] = [s.run({x_s: xs[k]})[y_s] for _ in range(20)]
        except BaseException as e:  # reported below: an assert in a thread would be lost
            errors.append(e)

    def round_of_threads() -> None:
        results.clear()
        threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for k in range(3):
            for got in results[k]:
                np.testing.assert_array_equal(got, np.maximum(xs[k], 0) * 2)

    # The first sessions of a process may start threads of their own for its lifetime: counted
    # after a first round. Each Python thread's team is joined as the thread ends, after join()
    # returns (thread-local destructors run last): the count gets a moment to settle.
    round_of_threads()
    before = -1
    while before != _task_count():  # settled: unchanged over 0.2 s
        before = _task_count()
        time.sleep(0.2)
    round_of_threads()
    deadline = time.monotonic() + 10
    while _task_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _task_count() == before


_IDLE_SCRIPT = textwrap.dedent("""
    import os, statistics, time
    import numpy as np
    import popxl, popxl.ops as ops
    from popxl.engines.native import _import_native
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((1024, 1024), np.float32))
        ops.repeat(ir.create_graph(lambda t: ops.gelu(t), x.spec), 1, x)  # a two-thread kernel
    with popxl.Session(ir, "cpu") as s:
        s.run()
        pause_cpu = []
        for _ in range(5):
            s.run()
            c = time.process_time()
            time.sleep(0.2)
            pause_cpu.append(time.process_time() - c)
        # between regions of one call: a serial stretch the team's threads wait through
        c = time.process_time()
        _import_native().team_shares(10)
        t = time.perf_counter()
        while time.perf_counter() - t < 0.2:
            pass
        _import_native().team_shares(10)
        cold = time.process_time() - c
    print(os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"), os.environ.get("OPENBLAS_NUM_THREADS"),
          statistics.median(pause_cpu), cold)
""")


@pytest.mark.parametrize("user_env", [{}, {"OMP_WAIT_POLICY": "active"}, {"OMP_WAIT_POLICY": "passive"}])
def test_idle_threads_sleep_unless_the_user_says_otherwise(user_env):
    """After a run, and between regions outside runs, the engine's threads spin only briefly before
    they sleep (on a busy machine a spinning thread takes the core its partner needs); the
    environment seen by libraries loaded later is the user's; a user's own OMP_WAIT_POLICY wins
    ("active": the threads spin on through the whole pause). CPU time, not wall time, so other
    load cannot fake it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS")}
    env.update(user_env, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", _IDLE_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    spincount, policy, blas_threads, paused, cold = out.stdout.split()
    assert (spincount, policy, blas_threads) == ("None", user_env.get("OMP_WAIT_POLICY", "None"), "None")
    if user_env.get("OMP_WAIT_POLICY") == "active":
        # of the 200 ms pause: a spinning thread gets a fair share of a core even on a machine
        # loaded several times over (a 50 ms pause left it under 10 ms at load 11 on 2 cores)
        assert float(paused) > 0.01
    else:
        assert float(paused) < 0.003
        # the caller's own 200 ms of busy waiting, and not much of a second thread's
        assert float(cold) < 0.2 + 0.02
