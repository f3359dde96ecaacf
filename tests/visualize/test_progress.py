"""Compile and run progress: tqdm bars, throttled, silent for quick work, switchable."""
import io
import time

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import progress
from popxl.progress import Progress, RunProgress


@pytest.fixture(autouse=True)
def _follow_environment():
    yield
    progress.set_enabled(None)


def test_quick_work_is_silent(monkeypatch):
    monkeypatch.setenv("POPXL_PROGRESS", "1")
    out = io.StringIO()
    with Progress("popxl: compiling", 10, stream=out) as p:
        for i in range(10):
            p.step(f"graph {i}")
    assert out.getvalue() == ""


def test_long_work_draws_a_few_times_not_per_step(monkeypatch):
    monkeypatch.setenv("POPXL_PROGRESS", "1")
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.05)
    monkeypatch.setattr(progress, "MIN_INTERVAL_SECONDS", 0.05)
    out = io.StringIO()
    p = Progress("popxl: compiling", 5000, stream=out)
    start = time.perf_counter()
    for i in range(5000):
        p.step(f"program: g{i}")
        if i % 1000 == 0:
            time.sleep(0.06)
    p.close()
    text = out.getvalue()
    redraws = text.count("\r")
    assert 2 <= redraws < 60, redraws  # throttled: a handful of redraws for 5000 steps
    assert "popxl: compiling" in text and "5000/5000" in text
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("how", ["env", "call"])
def test_progress_can_be_turned_off(monkeypatch, how):
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    if how == "env":
        monkeypatch.setenv("POPXL_PROGRESS", "0")
    else:
        monkeypatch.setenv("POPXL_PROGRESS", "1")
        progress.set_enabled(False)
    out = io.StringIO()
    with Progress("work", 3, stream=out) as p:
        for _ in range(3):
            time.sleep(0.01)
            p.step("x")
    assert out.getvalue() == ""
    with pytest.raises(TypeError, match="True, False or None"):
        progress.set_enabled("no")


def test_not_a_terminal_means_no_bar_unless_asked(monkeypatch):
    monkeypatch.delenv("POPXL_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    out = io.StringIO()  # not a tty
    with Progress("work", 3, stream=out) as p:
        p.step("x")
    assert out.getvalue() == ""


def test_session_compile_is_silent_when_quick(capfd, monkeypatch):
    monkeypatch.setenv("POPXL_PROGRESS", "1")
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32))
        ops.host_store(popxl.d2h_stream((3,), popxl.float32), x + 1.0)
    popxl.Session(ir, "cpu")
    assert "compiling" not in capfd.readouterr().err


def test_run_progress_fast_runs_are_never_timed_again():
    calls = []
    rp = RunProgress()
    assert rp.run(lambda a: calls.append(a) or a * 2, 21) == 42
    assert rp.fast and rp.expected is None and calls == [21]


def test_run_progress_long_runs_show_an_estimated_bar(monkeypatch):
    monkeypatch.setenv("POPXL_PROGRESS", "1")
    monkeypatch.setattr(progress, "LONG_RUN_SECONDS", 0.2)
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    monkeypatch.setattr(progress, "MIN_INTERVAL_SECONDS", 0.05)
    out = io.StringIO()
    rp = RunProgress("popxl: run", stream=out)
    rp.run(time.sleep, 0.3)  # the first long run is only timed
    assert not rp.fast and rp.expected == pytest.approx(0.3, abs=0.1) and out.getvalue() == ""
    rp.run(time.sleep, 0.3)
    text = out.getvalue()
    assert "popxl: run" in text and "100%" in text and text.count("\r") >= 3


def test_a_session_whose_runs_are_long_shows_a_run_bar(monkeypatch, capsys):
    monkeypatch.setenv("POPXL_PROGRESS", "1")
    monkeypatch.setattr(progress, "LONG_RUN_SECONDS", 0.0)  # every run counts as long
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    ir = popxl.Ir()
    with ir.main_graph:
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y_s, popxl.variable(np.ones(2, np.float32)) * 3.0)
    with popxl.Session(ir) as s:
        capsys.readouterr()
        np.testing.assert_array_equal(s.run()[y_s], [3.0, 3.0])  # timed, no bar
        assert "popxl: run" not in capsys.readouterr().err
        np.testing.assert_array_equal(s.run()[y_s], [3.0, 3.0])
        assert "popxl: run" in capsys.readouterr().err
