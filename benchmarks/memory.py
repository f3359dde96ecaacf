"""Peak resident memory of a popxl training run against what it must hold (issue target: at most
1.2x the device arena + the weights + the host stream buffers), and of a training workload per
framework (--peers).

    python benchmarks/memory.py              # 784-2048-2048-10 MLP, batch 256, 100 steps per run
    python benchmarks/memory.py --quick      # a small model (smoke test)
    python benchmarks/memory.py --peers bert_train [--quick]   # peak RSS: popxl vs PyTorch, JAX

--peers: each framework trains the workload (every batch once: one popxl run, one JAX scan,
one call per step otherwise) in a process of its own, started from this one before anything
large is allocated here; the number is that process's whole peak resident set (VmHWM:
interpreter, libraries, weights, activations, compiled code), as a user would see it.

Runs in its own process. The baseline is taken after a small warm-up session, so the interpreter,
NumPy, oneDNN's code and the OpenMP threads are already resident and not charged to the run; then
the peak-RSS counter is reset (/proc/self/clear_refs) and the program is built, compiled, attached
and run. Charged: the growth of the peak over the baseline, plus the user's arrays made before it
(data and initial weights). Budget: the arena (device memory: variables, activations, gradients),
one host copy of the weights and the streamed inputs/outputs. As in a training script, the initial
weight arrays are let go once the Ir holds them (`popxl.variable` keeps its own copy, the host copy
of the budget); a script that kept them too would hold a second copy of its own.
The engine's kernel scratch region (oneDNN scratchpads, reordered operands) is shown on its own:
it is charged like everything else the process holds, and it is not part of the budget.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` as a package


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def measure(sizes, batch: int) -> Dict[str, float]:
    import popxl
    from benchmarks.workloads import mlp
    from benchmarks.workloads.training import build_popxl_program

    warm = mlp.make_spec((8, 8, 2), 2)  # loads every library a run touches
    ir = build_popxl_program(warm, mlp.popxl_forward, steps_per_run=mlp.STEPS)[0]
    with popxl.Session(ir, "cpu") as s:
        s.run({st: np.zeros((mlp.STEPS, *st.shape), st.dtype.as_numpy()) for st in ir.get_all_h2d_streams()})
    del ir, s

    spec = mlp.make_spec(sizes, batch)  # the user's data and initial weights: part of the budget below
    _reset_peak()
    base = _status_kib("VmRSS")
    ir, x_stream, y_stream, _ = build_popxl_program(spec, mlp.popxl_forward, steps_per_run=mlp.STEPS)
    weights = sum(p.nbytes for p in spec.params)
    spec.params = []  # the Ir's variables hold the weights now
    with popxl.Session(ir, "cpu") as session:
        session.run({x_stream: spec.inputs, y_stream: spec.labels})
        arena = session._exe.arena_bytes
        scratch = session._engine.scratch_bytes
    peak = _status_kib("VmHWM")
    host = spec.inputs.nbytes + spec.labels.nbytes + mlp.STEPS * 4  # + the per-step losses
    budget = arena + weights + host
    # The user's arrays were resident at the baseline: charge them too (the initial weights were
    # let go after the Ir took its copy; until then both copies count in the peak).
    used = (peak - base) * 1024 + spec.inputs.nbytes + spec.labels.nbytes + weights
    return {"arena": arena, "scratch": scratch, "weights": weights, "host": host, "budget": budget, "used": used,
            "ratio": used / budget}


PEER_KEYS = ["popxl", "torch", "torch_compile", "jax", "jax_scan"]


def child_peak(workload: str, key: str, quick: bool) -> int:
    """Train ``workload`` with framework ``key`` once through its batches; return VmHWM in KiB."""
    from benchmarks.common import workload_cases
    (case,) = workload_cases(workload, quick)
    bench = case.builders[key]()
    steps = int(case.steps_per_run)
    for _ in range(max(1, round(steps / bench.items))):
        bench.call()
    if bench.close:
        bench.close()
    return _status_kib("VmHWM")


def peers(workload: str, quick: bool, threads: int) -> int:
    import os
    import subprocess
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "JAX_PLATFORMS": "cpu"}
    peaks: Dict[str, float] = {}
    for key in PEER_KEYS:
        cmd = [sys.executable, __file__, "--child", f"{workload}:{key}"] + (["--quick"] if quick else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("VmHWM ")]
        if out.returncode != 0 or not line:
            print(f"{key}: failed ({out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode})")
            continue
        peaks[key] = int(line[0].split()[1]) / 1024
    print(f"{workload}{' (quick)' if quick else ''}: peak resident memory of a training process per framework, MiB")
    print("| framework | peak RSS MiB | popxl / it |")
    print("|---|---|---|")
    for key, mib in peaks.items():
        ratio = f"{peaks['popxl'] / mib:.2f}x" if "popxl" in peaks else ""
        print(f"| {key} | {mib:.0f} | {ratio} |")
    return 0 if "popxl" in peaks else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peers", metavar="WORKLOAD",
                        help="peak RSS per framework of a training workload (bert_train)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # workload:framework, run by --peers
    args = parser.parse_args(argv)
    if args.child:
        workload, key = args.child.split(":")
        print(f"VmHWM {child_peak(workload, key, args.quick)}")
        return 0
    if args.peers:
        return peers(args.peers, args.quick, args.threads)
    sizes, batch = ((784, 64, 10), 16) if args.quick else ((784, 2048, 2048, 10), 256)
    r = measure(sizes, batch)
    mib = 1 << 20
    print(f"training MLP {'-'.join(map(str, sizes))}, batch {batch}, 100 steps per run")
    print("| arena MiB | weights MiB | host buffers MiB | budget MiB | peak RSS growth MiB | of which kernel scratch MiB "
          "| ratio (target <= 1.2) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {r['arena'] / mib:.1f} | {r['weights'] / mib:.1f} | {r['host'] / mib:.1f} | {r['budget'] / mib:.1f} "
          f"| {r['used'] / mib:.1f} | {r['scratch'] / mib:.1f} | {r['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
