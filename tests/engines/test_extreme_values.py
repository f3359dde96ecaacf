"""Every registered op on extreme values, native engine against the reference engine.

The cases (extreme_cases.py) feed each op the values kernels get wrong: INT_MIN / INT_MAX, -1 and
0, NaN, +-inf, denormals, the largest floats, indices out of range and negative, empty tensors.
They run in a worker process (extreme_worker.py), so a crash (a signal such as SIGFPE or SIGSEGV,
or a sanitizer report under .ci/run's sanitizer step) fails the case that caused it, naming it,
and the next case gets a fresh worker. A case passes when both engines give the same outputs
(NaN-aware, float tolerances by dtype) or both raise a Python exception that names the op.
The default run covers float32 / int32 / uint32 and the cases without a dtype; `-m slow` the
other dtypes and variants.
"""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np
import pytest

from extreme_cases import CASES, EXCLUDED
from popxl.op import REGISTRY

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "extreme_worker.py")
# Seconds one case may take before the worker counts as hung (sanitizer builds run ~10x slower).
CASE_TIMEOUT = 120.0


class WorkerDied(Exception):
    pass


class Worker:
    """A worker process running cases one at a time; restarted after it dies."""

    def __init__(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()

    def _stderr_since(self, pos: int) -> str:
        self.stderr.seek(pos)
        text = self.stderr.read().decode(errors="replace")
        return text[-6000:]

    def _read(self, n: int, deadline: float) -> bytes:
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while len(buf) < n:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError
                chunk = os.read(self.proc.stdout.fileno(), n - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
        return buf

    def run(self, key: str) -> dict:
        self.stderr.seek(0, os.SEEK_END)
        pos = self.stderr.tell()
        deadline = time.monotonic() + CASE_TIMEOUT
        try:
            self.proc.stdin.write(key.encode() + b"\n")
            self.proc.stdin.flush()
            (size,) = struct.unpack("<Q", self._read(8, deadline))
            return pickle.loads(self._read(size, deadline))
        except TimeoutError:
            self.proc.kill()
            self.proc.wait()
            raise WorkerDied(f"hung: no result after {CASE_TIMEOUT:.0f} s\n{self._stderr_since(pos)}") from None
        except (EOFError, BrokenPipeError):
            code = self.proc.wait()
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            raise WorkerDied(f"the worker process {how}\n{self._stderr_since(pos)}") from None


_worker: Optional[Worker] = None


def run_in_worker(key: str) -> dict:
    global _worker
    if _worker is None or not _worker.alive():
        if _worker is not None:
            _worker.close()
        _worker = Worker()
    return _worker.run(key)


@pytest.fixture(scope="module", autouse=True)
def _stop_worker():
    yield
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


TOLERANCES = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def assert_same_values(case, i: int, want: np.ndarray, got: np.ndarray) -> None:
    what = f"{case.key}: output {i}"
    assert (got.shape, got.dtype) == (want.shape, want.dtype), \
        f"{what}: native gives {got.dtype} {got.shape}, reference {want.dtype} {want.shape}"
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    if case.native_nan == "zero":
        want = np.where(np.isnan(want) & (got == 0), want.dtype.type(0), want)
    elif case.native_nan == "skipped":
        want = np.where(np.isnan(want) & ~np.isnan(got), got, want)
    rtol = case.rtol if case.rtol is not None else TOLERANCES[want.dtype]
    # differences below the smallest normal number (denormals flushed to zero) do not count
    atol = case.atol if case.atol is not None else float(np.finfo(want.dtype).tiny)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                               equal_nan=True, err_msg=what)


def check_outcomes(case, outcomes: dict) -> None:
    ref, nat = outcomes["reference"], outcomes["native"]
    if ref[0] == "raised" or nat[0] == "raised":
        assert ref[0] == nat[0] == "raised", \
            f"{case.key}: only one engine raised:\n  reference: {ref[:3]}\n  native: {nat[:3]}"
        for engine, (_, kind, message) in outcomes.items():
            assert case.op in message, f"{case.key}: the {engine} engine's {kind} does not name the op: {message}"
        return
    if not case.fallback_ok:
        assert case.op not in nat[2], f"{case.key}: the native engine ran {case.op} through its NumPy fallback"
    assert len(nat[1]) == len(ref[1])
    for i, (want, got) in enumerate(zip(ref[1], nat[1])):
        assert_same_values(case, i, want, got)


def _param(key: str):
    return pytest.param(key, id=key, marks=[pytest.mark.slow] if CASES[key].slow else [])


@pytest.mark.parametrize("key", [_param(k) for k in CASES])
def test_extreme_values(key):
    case = CASES[key]
    try:
        outcomes = run_in_worker(key)
    except WorkerDied as e:
        pytest.fail(f"{key}: op {case.op} crashed the process: {e}", pytrace=False)
    check_outcomes(case, outcomes)


def test_every_op_has_cases():
    """Every registered op has extreme-value cases, or is listed as excluded with the reason."""
    covered = {c.op for c in CASES.values()}
    missing = sorted(set(REGISTRY) - covered - set(EXCLUDED))
    assert not missing, f"registered ops without extreme-value cases: {missing}"
    assert not set(EXCLUDED) & covered, "an excluded op has cases"
    assert set(EXCLUDED) <= set(REGISTRY), "an excluded op is not registered"


def test_a_crash_fails_the_case_not_the_run():
    """The harness itself: a worker killed by a signal is reported as the case's failure, and the next
    case runs in a fresh worker."""
    worker = Worker()
    try:
        worker.proc.send_signal(signal.SIGKILL)
        with pytest.raises(WorkerDied, match="SIGKILL"):
            worker.run(next(iter(CASES)))
    finally:
        worker.close()
