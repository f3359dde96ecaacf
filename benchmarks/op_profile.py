"""Where a popxl workload's time goes: the native engine's per-op timers, summed per op kind.

    python benchmarks/op_profile.py bert_train            # 2-layer BERT training, 20 steps per run
    python benchmarks/op_profile.py bert_infer --batch 1  # BERT-base through popart.InferenceSession
    python benchmarks/op_profile.py bert_infer --quick --runs 2
    python benchmarks/op_profile.py bert_train --unfused   # without fuse_attention / fuse_decomposed
    python benchmarks/op_profile.py gpt_block
    python benchmarks/op_profile.py bert_train --by-shape  # each matmul shape on its own line

Prints one line per op kind: its share of the summed op time, calls and milliseconds per run,
and for matmuls the GFLOP/s they reach (2 * m * n * k per product; the cores' float32 ceiling is
what ``benchmarks/run.py --only gemm`` reaches at n=2048). A matmul is told apart by the rank of its
output (``matmul 4-D``: attention's per-head products).
Fractions are what to read on a shared machine: noise moves every op's time alike, absolute
times are only this run's.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` as a package


def op_kind(exe, instr: dict, by_shape: bool = False) -> str:
    """The op's type; a matmul's with its output rank, or with ``by_shape`` its operands' shapes
    (a ``T`` after a shape read transposed: its last two strides swapped) and whether its right
    operand lies in static storage."""
    kind = instr["type"]
    if not kind.startswith("matmul"):
        return kind
    if not by_shape:
        return kind + f" {len(exe.buffers[instr['outputs'][0]]['shape'])}-D"

    def shape(b: int) -> str:
        desc = exe.buffers[b]
        st = desc["strides"]
        transposed = len(st) >= 2 and abs(st[-2]) < abs(st[-1])
        return "x".join(map(str, desc["shape"])) + ("T" if transposed else "")
    a, b = instr["inputs"][:2]
    static = " static" if 1 in instr.get("static_inputs", ()) else ""
    return f"{kind} {shape(a)} @ {shape(b)}{static}"


def matmul_flops(exe, instr: dict) -> float:
    """Floating-point operations of one call of a matmul-family op (2 per multiply-add), else 0."""
    if not instr["type"].startswith("matmul"):
        return 0.0
    k = exe.buffers[instr["inputs"][0]]["shape"][-1]  # the lhs's last dim, 1-D or not
    return 2.0 * float(np.prod(exe.buffers[instr["outputs"][0]]["shape"], dtype=np.float64)) * k


def profile(px_session, run: Callable[[], None], runs: int,
            by_shape: bool = False) -> Dict[str, Tuple[float, int, float]]:
    """{op kind: (seconds per run, calls per run, flops per run)} over ``runs`` calls of ``run``
    (after one unprofiled call); matmuls told apart by shape with ``by_shape`` (see op_kind)."""
    run()
    profiler = px_session.op_profiler
    profiler.enabled = True  # resets the timers
    for _ in range(runs):
        run()
    exe = px_session.executable
    kinds: Dict[str, list] = defaultdict(lambda: [0.0, 0, 0.0])
    for (gi, k), (secs, calls) in profiler.op_times().items():
        instr = exe.graphs[gi]["program"][k]
        entry = kinds[op_kind(exe, instr, by_shape)]
        entry[0] += float(secs.sum()) / runs
        entry[1] += int(calls.sum()) // runs
        entry[2] += matmul_flops(exe, instr) * int(calls.sum()) / runs
    profiler.enabled = False
    return {k: (s, c, f) for k, (s, c, f) in kinds.items()}


def table(kinds: Dict[str, Tuple[float, int, float]]) -> str:
    total = sum(s for s, _, _ in kinds.values())
    gemm_secs = sum(s for s, _, f in kinds.values() if f)
    gemm_flops = sum(f for _, _, f in kinds.values())
    lines = [f"total op time {total * 1e3:.1f} ms per run; matmuls {gemm_secs / total:.1%} of it at "
             f"{gemm_flops / max(gemm_secs, 1e-12) / 1e9:.0f} GFLOP/s",
             "| op kind | share | calls/run | ms/run | GFLOP/s |", "|---|---|---|---|---|"]
    for kind, (secs, calls, flops) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        rate = f"{flops / secs / 1e9:.0f}" if flops and secs else ""
        lines.append(f"| {kind} | {secs / total:.1%} | {calls} | {secs * 1e3:.1f} | {rate} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=["bert_train", "bert_infer", "gpt_block"])
    parser.add_argument("--quick", action="store_true", help="the workload's --quick configuration")
    parser.add_argument("--batch", type=int, default=8, help="bert_infer: batch size")
    parser.add_argument("--runs", type=int, default=3, help="profiled session runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--by-shape", action="store_true",
                        help="matmuls per operand shapes (and static right operands) rather than per output rank")
    parser.add_argument("--unfused", action="store_true",
                        help="without the attention, layer norm and GELU fusions (what they save)")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.unfused:
        import popxl.session
        from popxl import transforms
        from popxl.transforms.pipeline import Pipeline
        popxl.session.PIPELINE = Pipeline([p for p in transforms.PIPELINE
                                           if p.name not in ("fuse_attention", "fuse_decomposed")])
        transforms.fuse_attention = lambda ir: ir  # training's own call on the forward graph

    from benchmarks.workloads import bert
    if args.workload == "gpt_block":
        from benchmarks.workloads import gpt_block
        from benchmarks.workloads.training import STEPS, popxl_trainer
        cfg = "gpt_block, 100 steps per run"
        bench = popxl_trainer(gpt_block.make_spec(), gpt_block.popxl_forward, STEPS)
    elif args.workload == "bert_train":
        from benchmarks.workloads.training import popxl_trainer
        cfg = bert.TRAIN_QUICK if args.quick else bert.TRAIN
        bench = popxl_trainer(bert.make_train_spec(cfg), lambda *a: bert.popxl_train_forward(cfg, *a), cfg.steps)
    else:
        cfg = bert.Config(**{**(bert.QUICK if args.quick else bert.BERT_BASE).__dict__, "batch": args.batch})
        bench = bert.build_popart_infer(cfg)
    print(f"{args.workload}: {cfg}")
    print(table(profile(bench.session, bench.call, args.runs, args.by_shape)))
    bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
