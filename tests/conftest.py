"""Shared test set-up: makes tests/engine_harness.py importable from every test folder, and the
repository root importable so tests can share the benchmarks' model builders (`benchmarks.workloads`)."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
