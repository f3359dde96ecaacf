"""A child of a process that ran a Session (multiprocessing's "fork" start method, as PyTorch's
DataLoader workers use) creates and runs Sessions: its engines run single-threaded there, since
the threads of the parent (the engine's team, OpenMP's) do not exist in a child. A hang would fail
the test (timeouts)."""
from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import popxl
import popxl.ops as ops

N = 192  # a product big enough to be spread over threads in the parent


def _program():
    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((N, N), popxl.float32, "x")
        y_s = popxl.d2h_stream((N, N), popxl.float32, "y")
        x = ops.host_load(x_s)
        ops.host_store(y_s, ops.gelu(x @ x))
    return ir, x_s, y_s


def _run_once(x: np.ndarray) -> np.ndarray:
    ir, x_s, y_s = _program()
    with popxl.Session(ir, "ipu_model") as s:
        return s.run({x_s: x})[y_s]


def _child(queue, x):
    queue.put(_run_once(x))


X = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32) / 8


def test_a_forked_child_runs_sessions_after_the_parent_did():
    want = _run_once(X)  # the parent's threads now exist
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_child, args=(queue, X)) for _ in range(2)]
    for p in children:
        p.start()
    try:
        got = [queue.get(timeout=120) for _ in children]
    finally:
        for p in children:
            p.join(10)
            if p.is_alive():
                p.kill()
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_run_once(X), want, rtol=1e-6)  # the parent is unaffected


def test_forked_children_run_when_the_extension_was_imported_directly_first():
    # `import popxl._native` before any Session (a test module does it at collection): the engine
    # still sets its at-fork handler when it first loads the module, so the children do not hang.
    code = ("import sys; import popxl._native; sys.path.insert(0, sys.argv[1]); import test_fork; "
            "test_fork.test_a_forked_child_runs_sessions_after_the_parent_did(); print('ok')")
    run = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


class _Squares:
    """A dataset whose items are computed by a popxl program in the DataLoader's worker."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> np.ndarray:
        return _run_once(X * (i + 1))[:2, :2]


def test_torch_dataloader_workers_run_sessions():
    torch = pytest.importorskip("torch")
    want = [_run_once(X * (i + 1))[:2, :2] for i in range(4)]
    loader = torch.utils.data.DataLoader(_Squares(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", timeout=120)
    got = [np.asarray(item) for item in loader]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
