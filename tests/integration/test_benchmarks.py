"""Smoke test of benchmarks/run.py: the quick popxl-only run prints its table and passes the
mlp_small correctness gate (popxl's losses over 100 SGD steps against a NumPy reference)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


def test_quick_run_prints_table_and_passes_correctness_gate() -> None:
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--only", "overhead,mlp_small", "--frameworks", "popxl"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "| workload | case | unit | popxl |" in out
    assert "| overhead | 4 floats in/out, run() | µs/run |" in out
    assert "| mlp_small | batch 8, 784-32-10 (100 steps/run) | steps/s |" in out
    assert "| mlp_small | batch 8, 784-32-10 (1 step/run) | steps/s |" in out
    assert "popxl: ok vs reference" in out
    assert "not selected" in out  # the peers are reported, not run
    assert "each framework in a process of its own" in out


def test_in_process_run_measures_the_same_rows_in_one_process() -> None:
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--only", "overhead", "--frameworks", "popxl",
                           "--in-process"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all in this process" in proc.stdout
    assert "| overhead | 4 floats in/out, run() | µs/run |" in proc.stdout


def test_worker_host_builds_times_reports_failures_and_survives_a_crash() -> None:
    """run.py's worker processes (one per framework family): a bench built and timed there; a
    builder's exception comes back as the table's one-line reason; a worker killed in the middle
    of a timing fails that call with its exit code, and the next call starts a new worker."""
    sys.path.insert(0, str(RUN.parents[1]))
    from benchmarks.common import RemoteFailure, WorkerHost, describe_failure, workload_cases

    (case, _) = workload_cases("overhead", quick=True)
    assert case.name == "4 floats in/out, run()"
    host = WorkerHost("popxl", quick=True, threads=1)
    try:
        results, per_item, per_call = host.build("overhead", 0, "popxl")
        assert results.size > 0 and 0 < per_item <= per_call  # a run() is one item
        calls = host.calibrate("popxl", 0.01)
        assert calls >= 1 and 0 < host.time("popxl", calls) < 0.01
        with pytest.raises(RemoteFailure) as failed:
            host.build("overhead", 99, "popxl")
        assert describe_failure(failed.value).startswith("IndexError: list index out of range [common.py:")
        pid = host._proc.pid
        killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
        killer.start()
        with pytest.raises(RemoteFailure, match=r"the popxl worker process died \(exit code -9\)"):
            host.time("popxl", 10**9)
        killer.join()
        assert host.build("overhead", 0, "popxl")[0].size > 0 and host._proc.pid != pid
    finally:
        host.stop()


def test_a_worker_dying_while_timed_fails_its_row_cell_only() -> None:
    """run_case with one framework's worker dying in its second timed repeat: that cell says why,
    the other framework is measured over every repeat."""
    sys.path.insert(0, str(RUN.parents[1]))
    import numpy as np

    from benchmarks.common import Case, RemoteFailure, run_case

    class Host:  # what run_case asks of a LocalHost or a WorkerHost
        def __init__(self, dies_at: int) -> None:
            self.timed, self.dies_at, self.closed = 0, dies_at, 0

        def build(self, workload, index, key):
            return np.ones(3, np.float32), 0.01, 0.01

        def calibrate(self, key, min_time):
            return 1

        def time(self, key, calls):
            self.timed += 1
            if self.timed == self.dies_at:
                raise RemoteFailure("the torch worker process died (exit code -11)")
            return 0.01

        def close(self):
            self.closed += 1

    popxl, torch = Host(dies_at=0), Host(dies_at=2)
    case = Case("w", "c", "items/s", {"popxl": lambda: None, "torch": lambda: None})
    row = run_case(case, 0, {"popxl": popxl, "torch": torch}, repeats=3, min_time=0.01)
    assert popxl.timed == 3 and row.results["popxl"].value == 100.0
    assert row.results["torch"].na == "the torch worker process died (exit code -11)"
    assert row.results["torch"].check.startswith("ok vs popxl")
    assert popxl.closed == torch.closed == 1


def test_memory_benchmark_prints_its_measurement() -> None:
    proc = subprocess.run([sys.executable, str(RUN.parent / "memory.py"), "--quick"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ratio = float(proc.stdout.strip().splitlines()[-1].split("|")[-2].strip().rstrip("x"))
    assert 0.5 < ratio < 5  # a plausible measurement; the 1.2x target is the benchmark's business


def test_gemm_parity_checks_and_times_the_step_layouts() -> None:
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(RUN.parent / "gemm_parity.py"), "--quick"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| d x d") or line.startswith("| W")]
    assert len(rows) == 9 and "MISMATCH" not in proc.stdout
    assert "| W1 dW | 256 x 256 x 1024 |" in proc.stdout  # fan_in x rows x fan_out, x read transposed
    assert all(float(r.split("|")[-2].strip().rstrip("x")) > 0 for r in rows)
    # the kernel a training step's products take: weights written by the program are never kept
    # packed, so the table names no static-weights path
    assert all(r.split("|")[3].strip() and "kept packed" not in r for r in rows), rows


@pytest.mark.slow  # exports a 2-layer BERT and compiles three sessions: about 30 s
def test_quick_bert_workloads_run_and_agree() -> None:
    """bert_infer (exported by torch.onnx.export) through popart against ONNX Runtime, and bert_train's
    popxl programs (20-step and 1-step runs) agreeing step by step."""
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--only", "bert_infer,bert_train", "--frameworks",
                           "popxl,ort", "--repeats", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "| bert_infer | 2 layers, hidden 256, batch 8 x seq 128 | sequences/s |" in out
    assert "| bert_infer | 2 layers, hidden 256, batch 1 x seq 128 | ms |" in out
    assert "| bert_train | 2 layers, hidden 256, batch 4 x seq 64 (4 steps/run) | steps/s |" in out
    assert out.count("ONNX Runtime: ok vs popxl") == 2
    assert "popxl 1 step/run: ok vs popxl" in out and "MISMATCH" not in out


def test_ab_reads_run_tables_and_reports_ratios_of_ratios() -> None:
    """benchmarks/ab.py's arithmetic on two sides' tables (building revisions is not tested here)."""
    sys.path.insert(0, str(RUN.parents[1]))
    from benchmarks import ab

    def table(popxl_steps: float, torch_steps: float, overhead_us: float) -> str:
        return ("| workload | case | unit | popxl | PyTorch | popxl/PyTorch |\n|---|---|---|---|---|---|\n"
                f"| mlp_small | batch 8 | steps/s | {popxl_steps:,.0f} ±3% | {torch_steps:,.0f} ±2% | 2.00x |\n"
                f"| overhead | 4 floats | µs/run | {overhead_us} ±5% | 4.0 ±1% | 0.50x |\n")
    base = [ab.parse_table(table(1000, 500, 8.0))[0], ab.parse_table(table(1100, 550, 8.0))[0]]
    parsed, lower = ab.parse_table(table(2000, 500, 4.0))
    assert parsed[("mlp_small", "batch 8", "popxl")] == 2000.0 and parsed[("overhead", "4 floats", "PyTorch")] == 4.0
    assert lower == {("mlp_small", "batch 8"): False, ("overhead", "4 floats"): True}
    new = [parsed, ab.parse_table(table(2200, 550, 4.0))[0]]
    text = ab.report(base, new, lower)
    mlp = next(line for line in text.splitlines() if line.startswith("| mlp_small"))
    over = next(line for line in text.splitlines() if line.startswith("| overhead"))
    # NEW is twice as fast in both rows (fewer µs is faster), and so is its ratio against the same peer
    assert mlp.split(" | ")[4] == "2.000x" and mlp.split(" | ")[5].strip(" |") == "2.000x"
    assert over.split(" | ")[4] == "2.000x" and over.split(" | ")[5].strip(" |") == "2.000x"


def test_ab_compares_settings_of_one_checkout(monkeypatch, capsys) -> None:
    """`ab.py . --base-env NAME=VALUE`: both sides run this checkout, each run.py with its own
    environment; a setting without '=' is refused before anything runs."""
    sys.path.insert(0, str(RUN.parents[1]))
    from benchmarks import ab

    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(kwargs["env"].get("POPXL_BLAS"))
        steps = 1000 if kwargs["env"].get("POPXL_BLAS") == "openblas" else 1500
        table = ("| workload | case | unit | popxl |\n|---|---|---|---|\n"
                 f"| mlp_small | batch 8 | steps/s | {steps} ±3% |\n")
        return subprocess.CompletedProcess(cmd, 0, stdout=table, stderr="")
    monkeypatch.setattr(ab.subprocess, "run", fake_run)
    monkeypatch.delenv("POPXL_BLAS", raising=False)
    assert ab.main([".", "--base-env", "POPXL_BLAS=openblas", "--rounds", "2", "--only", "mlp_small"]) == 0
    assert sorted(seen, key=str) == [None, None, "openblas", "openblas"]
    out = capsys.readouterr().out
    assert "BASE this checkout POPXL_BLAS=openblas, NEW this checkout;" in out
    assert next(line for line in out.splitlines() if line.startswith("| mlp_small")).split(" | ")[4] == "1.500x |"
    with pytest.raises(SystemExit):
        ab.main([".", "--new-env", "POPXL_BLAS"])
    assert "expected NAME=VALUE, got 'POPXL_BLAS'" in capsys.readouterr().err
