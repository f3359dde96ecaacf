"""Programs with dimensions beyond 32 bits load in the native engine without a crash.

oneDNN's dims are 64-bit, yet creating a matmul primitive with M or K of 2**32 or more killed
the process with SIGFPE (a heuristic divides by a size held in 32 bits); found by the ONNX
mutation fuzz (tests/popart/onnx_fuzz.py). Such operands now go to the fallback kernel. A
Session refuses these programs as larger than this machine's memory, but one with 64 GB would
load them: the engine is made from the lowered program directly (its kernels are created at
load; the arena is allocated only on attach), in a subprocess so that a regression fails the
test instead of killing the run.
"""
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import sys
    import popxl, popxl.ops as ops
    kind, shape = sys.argv[1], tuple(int(v) for v in sys.argv[2:])
    ir = popxl.Ir()
    with ir.main_graph:
        x = ops.host_load(popxl.h2d_stream(shape, popxl.float32, "x"), "x")
        if kind == "matmul":
            w = ops.host_load(popxl.h2d_stream((shape[-1], 3), popxl.float32, "w"), "w")
            y = ops.matmul(x, w)
        elif kind == "conv":
            w = ops.host_load(popxl.h2d_stream((shape[1], shape[1], 1, 1), popxl.float32, "w"), "w")
            y = ops.conv(x, w)
        else:
            y = ops.max_pool(x, kernel_size=(1, 1))
        ops.host_store(popxl.d2h_stream(y.shape, y.dtype, "y"), y)
    from popxl.compiler.lower import lower
    from popxl.engines import create_engine
    create_engine(lower(ir), "native")  # creates every kernel; attaching would allocate the arena
    print("loaded")
""")


@pytest.mark.parametrize("kind, shape", [
    ("matmul", (2 ** 32, 4)),            # M
    ("matmul", (1, 2 ** 33)),            # K
    ("matmul", (2, 2 ** 40, 4)),         # batched M
    ("conv", (1, 1, 2 ** 32, 1)),
    ("pool", (1, 2 ** 32, 1, 1)),
])
def test_dimensions_beyond_32_bits_load(kind, shape):
    out = subprocess.run([sys.executable, "-c", _SCRIPT, kind, *map(str, shape)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, f"exit status {out.returncode}\n{out.stderr[-2000:]}"
    assert out.stdout.strip() == "loaded"
