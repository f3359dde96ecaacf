"""The GEMMs of bert_train's step, each layout alone: popxl's matmul kernel against PyTorch's
``torch.mm``, timed interleaved in one process (rounds alternate between the two).

    python benchmarks/gemm_parity.py            # the step's nine layouts, 7 rounds
    python benchmarks/gemm_parity.py --quick    # small shapes, 2 rounds (smoke test)

bert_train spends ~88% of its step in these products, on both sides; this says whether a gap in
the training ratio comes from the products themselves or from the work around them. Each side
multiplies SETS different operand pairs in turn (as a step does: nothing stays in cache between
products), REPEATS times per round; popxl's run is one ``ops.repeat`` of them (plus a 1x1 slice
and sum per product, so none is dead code), PyTorch's a Python loop of ``torch.mm(out=)``. The
program writes its operands (as a step writes its weights), so the kernel is the one bert_train's
products get, named in the table: operands never written would take the static-weights path
(oneDNN, weights kept packed between calls), which a training step never does.
The products' top-left elements are compared first (a mismatch: exit status 1). A ratio > 1
means popxl's product is faster.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List, NamedTuple, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` as a package

SETS, REPEATS = 6, 5


class Layout(NamedTuple):
    """C (m x n) = op(A) op(B) over k, with A or B stored transposed as a step reads them."""
    name: str
    m: int
    k: int
    n: int
    a_transposed: bool = False
    b_transposed: bool = False


def step_layouts(rows: int, hidden: int, ffn: int) -> List[Layout]:
    """A linear layer's three products (forward x W, dX = dY W^T, dW = x^T dY) for the attention
    projections (hidden x hidden) and the two feed-forward matrices."""
    layouts = []
    for what, fan_in, fan_out in (("d x d", hidden, hidden), ("W1", hidden, ffn), ("W2", ffn, hidden)):
        layouts += [Layout(f"{what} forward", rows, fan_in, fan_out),
                    Layout(f"{what} dX", rows, fan_out, fan_in, b_transposed=True),
                    Layout(f"{what} dW", fan_in, rows, fan_out, a_transposed=True)]
    return layouts


def _operands(layout: Layout, rng: np.random.Generator):
    m, k, n = layout.m, layout.k, layout.n
    a = [rng.standard_normal((k, m) if layout.a_transposed else (m, k)).astype(np.float32) for _ in range(SETS)]
    b = [rng.standard_normal((n, k) if layout.b_transposed else (k, n)).astype(np.float32) for _ in range(SETS)]
    return a, b


def popxl_products(layout: Layout, a: List[np.ndarray],
                   b: List[np.ndarray]) -> Tuple[Callable[[], np.ndarray], Callable[[], None], str]:
    """(run the products once, returning the sum of their top-left elements per repeat; detach; the
    kernel the native engine chose for the products)."""
    import popxl
    import popxl.ops as ops

    ir = popxl.Ir()
    ir.num_host_transfers = REPEATS
    with ir.main_graph:
        a_vars = [popxl.variable(x, name=f"a{i}") for i, x in enumerate(a)]
        b_vars = [popxl.variable(x, name=f"b{i}") for i, x in enumerate(b)]
        out = popxl.d2h_stream((), popxl.float32, "corner")

        def body(*operands: popxl.Tensor) -> None:
            total = None
            for x, w in zip(operands[:SETS], operands[SETS:]):
                y = (ops.transpose(x) if layout.a_transposed else x) @ (ops.transpose(w) if layout.b_transposed else w)
                corner = ops.sum(ops.slice(y, [0, 0], [1, 1]))
                total = corner if total is None else total + corner
            ops.host_store(out, total)

        ops.repeat(ir.create_graph(body, *a_vars, *b_vars), REPEATS, *a_vars, *b_vars)
        # Every operand written once per run (0 added to one element): see the module's docstring.
        for v in a_vars + b_vars:
            ops.add_(ops.slice_(v, [0, 0], [1, 1]), popxl.constant(0.0))
    session = popxl.Session(ir, "cpu")
    session.__enter__()
    kernels = {alg for kind, alg in session._engine.kernel_algorithms() if kind == "matmul"}
    return lambda: session.run({})[out], lambda: session.__exit__(None, None, None), " / ".join(sorted(kernels))


def torch_products(layout: Layout, a: List[np.ndarray], b: List[np.ndarray]) -> Callable[[], float]:
    """Run the products once, returning the sum of their top-left elements."""
    import torch

    a_t = [torch.from_numpy(x).t() if layout.a_transposed else torch.from_numpy(x) for x in a]
    b_t = [torch.from_numpy(w).t() if layout.b_transposed else torch.from_numpy(w) for w in b]
    outs = [torch.empty(layout.m, layout.n) for _ in range(SETS)]

    def call() -> float:
        for _ in range(REPEATS):
            for x, w, y in zip(a_t, b_t, outs):
                torch.mm(x, w, out=y)
        return float(sum(y[0, 0] for y in outs))
    return call


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per layout (median reported)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="small shapes, 2 rounds")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import popxl  # noqa: F401  (popxl first: its OpenMP runtime settings, as in run.py)
    import torch
    torch.set_num_threads(args.threads)

    from benchmarks.workloads import bert
    cfg = bert.TRAIN_QUICK if args.quick else bert.TRAIN
    rounds = 2 if args.quick else args.rounds
    rng = np.random.default_rng(0)
    print(f"bert_train's products ({cfg.batch * cfg.seq} rows, hidden {cfg.hidden}, ffn {cfg.ffn}), "
          f"{args.threads} threads, median of {rounds} interleaved rounds; GFLOP/s")
    print("| layout | m x k x n | popxl's kernel | popxl | PyTorch | popxl/PyTorch |\n|---|---|---|---|---|---|")
    total = {"popxl": 0.0, "torch": 0.0}
    failed = False
    for layout in step_layouts(cfg.batch * cfg.seq, cfg.hidden, cfg.ffn):
        a, b = _operands(layout, rng)
        popxl_call, detach, kernel = popxl_products(layout, a, b)
        calls = {"popxl": popxl_call, "torch": torch_products(layout, a, b)}
        times = {name: [] for name in calls}
        # warm-up (packing buffers, MKL's first-call setup) and the check that both multiply alike
        corners, want = calls["popxl"](), calls["torch"]()
        if not np.allclose(corners, want, rtol=1e-4, atol=1e-3):
            print(f"MISMATCH in {layout.name}: popxl's corners {corners}, PyTorch's {want}")
            failed = True
        for _ in range(rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
        detach()
        flops = 2 * layout.m * layout.k * layout.n * SETS * REPEATS
        med = {name: statistics.median(t) for name, t in times.items()}
        for name in total:
            total[name] += med[name]
        print(f"| {layout.name} | {layout.m} x {layout.k} x {layout.n} | {kernel} | {flops / med['popxl'] / 1e9:.0f} | "
              f"{flops / med['torch'] / 1e9:.0f} | {med['torch'] / med['popxl']:.3f}x |")
    print(f"\nall layouts, equal weight: popxl/PyTorch {total['torch'] / total['popxl']:.3f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
