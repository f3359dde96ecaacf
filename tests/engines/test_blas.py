"""Which library's sgemm the native engine's float32 products use (native/src/kernels/blas.cpp):
MKL's on Intel CPUs where the `mkl` package loads, else OpenBLAS's; POPXL_BLAS and set_blas choose.
The products themselves are checked under each library by the tests marked with the `each_blas`
fixture (tests/conftest.py): matmuls of every layout, bias and residual epilogues, SGD updates,
attention and its gradient, Winograd convolutions."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from popxl.engines.native import _import_native

from engine_harness import run_program

native = _import_native()
rng = np.random.default_rng(0)
with open("/proc/cpuinfo") as _f:
    _cpuinfo = _f.read()
# oneDNN 3.2's matmul is its brgemm on AVX-512 CPUs (packed weights, fast thin products) and gemm:jit
# on AVX2 ones, which OpenBLAS beats: which products go to oneDNN depends on it (gemm.cpp)
AVX512 = bool(re.search(r"^flags\s*:.*\bavx512f\b", _cpuinfo, re.M))


def _algorithm(m: int, k: int, n: int) -> str:
    """The algorithm the native engine names for an (m x k) @ (k x n) float32 product of streamed
    operands, checked against NumPy."""
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    got, eng = run_program(lambda a, b: a @ b, [a, b], "native")
    np.testing.assert_allclose(got[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    return dict(eng.kernel_algorithms())["matmul"]


def test_each_library_takes_the_products_it_is_set_to(each_blas):
    assert native.preferred_blas() == each_blas
    # more than 1024 columns: OpenBLAS's on AVX-512 CPUs too, where oneDNN takes narrower ones from it
    assert _algorithm(256, 64, 1100) == f"sgemm ({each_blas})"


def test_mkl_leaves_small_products_and_a_few_rows_against_a_wide_matrix_to_openblas(each_blas):
    """MKL is the slower there (128 x 768 x 3072: ~145 against ~180 GFLOP/s; mlp_small's 8 x 784 x 32
    layers: 12% fewer steps/s), so those stay OpenBLAS's whichever is preferred; 256 rows are MKL's
    again."""
    assert _algorithm(64, 32, 2048) == "sgemm (openblas)"
    assert _algorithm(8, 784, 32) == "sgemm (openblas)"
    if each_blas == "mkl":
        assert _algorithm(256, 32, 2048) == "sgemm (mkl)"


def test_static_weights_are_kept_packed_by_onednn_and_the_kernel_says_so(each_blas):
    """On AVX-512 CPUs a product whose weights no op writes (an inference's) goes to oneDNN, which
    keeps them in its own layout between calls; the kernel names that path, as the sgemm kernel
    names its library (benchmarks/gemm_parity.py shows the name to say which path it timed). On AVX2
    CPUs oneDNN has no such layout for them and sgemm is the faster: it takes them."""
    import popxl
    import popxl.ops as ops
    a = rng.standard_normal((256, 64)).astype(np.float32)
    w = rng.standard_normal((64, 1100)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream(a.shape, popxl.float32)
        y = ops.host_load(s) @ popxl.variable(w)
        o = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(o, y)
    with popxl.Session(ir, "cpu") as session:
        got = session.run({s: a})[o]
        algorithm = dict(session._engine.kernel_algorithms())["matmul"]
    np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4 * np.sqrt(64))
    if AVX512:
        assert re.fullmatch(r"oneDNN matmul \([^,]+, weights kept packed\)", algorithm)
        # streamed weights with a thin side (a 10-class layer): oneDNN's matmul, packing nothing kept
        assert re.fullmatch(r"oneDNN matmul \([^,]+\)", _algorithm(4096, 512, 10))
    else:
        assert algorithm == f"sgemm ({each_blas})"
        assert _algorithm(4096, 512, 10) == f"sgemm ({each_blas})"


# Products oneDNN 3.2 has only its reference implementation for on AVX2 CPUs (accumulating ones:
# its post-ops with a transposed or batched operand; any with a column-strided operand), which runs
# them ~100x slower than a GEMM (mlp_big's 10-class weight gradient, 512x256T @ 256x10 with its SGD
# update: 20 ms a call): sgemm takes them whatever the rules of gemm.cpp would have chosen, reading
# a packed copy of an operand whose strides it cannot take.
@pytest.mark.parametrize("case", ["thin transposed", "batched small", "batched transposed", "strided update",
                                  "strided bias and residual", "strided thin"])
def test_no_product_is_left_to_onednns_reference_implementation(each_blas, case):
    from popxl.op import create_op
    import popxl.ops as ops

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    if case == "thin transposed":
        ins, a_of = [rand(256, 512), rand(256, 10), rand(512, 10)], lambda x: x.T
    elif case.startswith("batched"):
        ins = [rand(16, 64, 64) for _ in range(3)]
        a_of = (lambda x: x) if case == "batched small" else (lambda x: x.transpose(0, 2, 1))
    elif case == "strided update":
        ins, a_of = [rand(512, 512), rand(256, 10), rand(512, 10)], lambda x: x[:, ::2]
    elif case == "strided bias and residual":
        ins, a_of = [rand(512, 512), rand(256, 10), rand(10), rand(512, 10)], lambda x: x[:, ::2]
    else:  # the right operand strided too
        ins, a_of = [rand(1024, 512), rand(10, 512)], lambda x: x[:, ::2]

    def view(x):
        if case == "thin transposed":
            return ops.transpose(x, (1, 0))
        if case == "batched transposed":
            return ops.transpose(x, (0, 2, 1))
        return x[:, ::2] if case.startswith("strided") else x

    def product(*t):
        if case == "strided bias and residual":
            return create_op("matmul_bias_add", [view(t[0]), *t[1:]])[0]
        if case == "strided thin":
            return view(t[0]) @ ops.transpose(t[1][:, ::2], (1, 0))
        return create_op("matmul_update_", [view(t[0]), t[1], t[2]], {"b": -0.25})[0]
    got, eng = run_program(product, ins, "native")
    a = a_of(ins[0]).astype(np.float64)
    if case == "strided bias and residual":
        want = a @ ins[1] + ins[2] + ins[3]
    elif case == "strided thin":
        want = a @ ins[1][:, ::2].T
    else:
        want = ins[2] - 0.25 * (a @ ins[1])
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-4)
    (algorithm,) = [alg for op, alg in eng.kernel_algorithms() if op.startswith("matmul")]
    assert "ref" not in algorithm, algorithm


def test_the_cpu_chooses_by_default():
    native.set_blas("auto")
    intel = "GenuineIntel" in _cpuinfo
    want = "mkl" if intel and "mkl" in native.blas_available() else "openblas"
    assert native.preferred_blas() == want


def test_unknown_library_names_are_refused():
    with pytest.raises(ValueError, match=r"unknown BLAS library 'atlas' \(expected 'auto', 'openblas' or 'mkl'\)"):
        native.set_blas("atlas")
    assert native.preferred_blas() in native.blas_available()  # the choice in force is unchanged


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


# a product of 1100 columns: more than oneDNN takes from OpenBLAS on AVX-512 CPUs
PRODUCT = """
    import numpy as np, popxl
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((1100, 64), popxl.float32)
        x = popxl.ops.host_load(s)
        y = popxl.ops.matmul(x, popxl.ops.transpose(x))
        o = popxl.d2h_stream(y.shape, y.dtype)
        popxl.ops.host_store(o, y)
    a = np.random.default_rng(1).standard_normal((1100, 64)).astype(np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run({s: a})[o]
    np.testing.assert_allclose(got, a.astype(np.float64) @ a.T, rtol=1e-4, atol=1e-3)
    print(dict(session._engine.kernel_algorithms())["matmul"])
"""


def test_popxl_blas_chooses_the_library_for_the_process():
    out = _python(PRODUCT, POPXL_BLAS="openblas")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "sgemm (openblas)"


def test_a_wrong_popxl_blas_is_an_error_naming_the_variable():
    out = _python(PRODUCT, POPXL_BLAS="fastest")
    assert out.returncode != 0
    assert "ValueError: POPXL_BLAS='fastest': unknown BLAS library 'fastest'" in out.stderr, out.stderr


@pytest.mark.skipif("mkl" not in native.blas_available(), reason="MKL cannot be loaded here")
def test_mkl_beside_pytorch_in_one_process():
    """PyTorch carries an MKL of its own (linked into libtorch): loaded first, it must not take
    the place of ours, nor ours break its products."""
    pytest.importorskip("torch")
    out = _python("import torch\n" + textwrap.dedent(PRODUCT) + textwrap.dedent("""
        t = torch.from_numpy(a)
        np.testing.assert_allclose((t @ t.T).numpy(), a.astype(np.float64) @ a.T, rtol=1e-4, atol=1e-3)
    """), POPXL_BLAS="mkl")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "sgemm (mkl)"


@pytest.mark.skipif("mkl" not in native.blas_available(), reason="MKL cannot be loaded here")
def test_mkl_symbols_stay_out_of_the_process_scope():
    """popxl's MKL (sequential) is opened in a scope of its own, so a library loaded after it that
    reaches its own MKL through MKL's symbols (PyTorch) still gets its own. Through libmkl_rt, which
    opens MKL's layers globally, PyTorch imported after popxl's first product had one thread
    (torch.get_num_threads() and OpenMP's count were 1) and torch.mm ran on popxl's sequential MKL."""
    has_torch = importlib.util.find_spec("torch") is not None
    code = textwrap.dedent(PRODUCT) + textwrap.dedent("""
        import ctypes
        process = ctypes.CDLL(None)
        assert not hasattr(process, "mkl_get_max_threads") and not hasattr(process, "cblas_sgemm")
    """)
    if has_torch:
        code += textwrap.dedent("""
            import torch
            print(torch.get_num_threads(), ctypes.CDLL("libgomp.so.1").omp_get_max_threads())
            t = torch.from_numpy(a)
            np.testing.assert_allclose((t @ t.T).numpy(), a.astype(np.float64) @ a.T, rtol=1e-4, atol=1e-3)
        """)
    out = _python(code, POPXL_BLAS="mkl", OMP_NUM_THREADS="2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["sgemm (mkl)"] + (["2 2"] if has_torch else [])


@pytest.mark.skipif("mkl" not in native.blas_available(), reason="MKL cannot be loaded here")
def test_an_mkl_another_library_loaded_first_leaves_popxl_on_openblas():
    """Ours would share that MKL's core and whatever layers came with it (their threads, their
    integers), so popxl keeps to OpenBLAS, and refuses POPXL_BLAS=mkl."""
    code = ('import ctypes, os, sys\n'
            'ctypes.CDLL(os.path.join(sys.prefix, "lib", "libmkl_core.so.3"), mode=os.RTLD_LAZY)\n'
            + textwrap.dedent(PRODUCT))
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "sgemm (openblas)"
    refused = _python(code, POPXL_BLAS="mkl")
    assert refused.returncode != 0
    assert "cannot be loaded in this process" in refused.stderr, refused.stderr
