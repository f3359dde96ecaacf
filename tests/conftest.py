"""Shared test set-up: makes tests/engine_harness.py importable from every test folder, and the
repository root importable so tests can share the benchmarks' model builders (`benchmarks.workloads`)."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

import pytest  # noqa: E402


@pytest.fixture(params=["openblas", "mkl"])
def each_blas(request):
    """Runs a test once per sgemm library of the native engine (native/src/kernels/blas.cpp), for
    products built during it: OpenBLAS's and MKL's (skipped where MKL cannot be loaded)."""
    from popxl.engines.native import _import_native
    native = _import_native()
    if request.param not in native.blas_available():
        pytest.skip(f"{request.param} cannot be loaded in this process")
    native.set_blas(request.param)
    try:
        yield request.param
    finally:
        native.set_blas("auto")
