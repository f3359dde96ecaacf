"""Smoke test of benchmarks/run.py: the quick popxl-only run prints its table and passes the
mlp_small correctness gate (popxl's losses over 100 SGD steps against a NumPy reference)."""
from __future__ import annotations

import subprocess
import sys
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



def test_memory_benchmark_prints_its_measurement() -> None:
    proc = subprocess.run([sys.executable, str(RUN.parent / "memory.py"), "--quick"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ratio = float(proc.stdout.strip().splitlines()[-1].split("|")[-2].strip().rstrip("x"))
    assert 0.5 < ratio < 5  # a plausible measurement; the 1.2x target is the benchmark's business


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
