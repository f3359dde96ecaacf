"""Smoke test of benchmarks/run.py: the quick popxl-only run prints its table and passes the
mlp_small correctness gate (popxl's losses over 100 SGD steps against a NumPy reference)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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



def test_memory_benchmark_prints_its_measurement() -> None:
    proc = subprocess.run([sys.executable, str(RUN.parent / "memory.py"), "--quick"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ratio = float(proc.stdout.strip().splitlines()[-1].split("|")[-2].strip().rstrip("x"))
    assert 0.5 < ratio < 5  # a plausible measurement; the 1.2x target is the benchmark's business
