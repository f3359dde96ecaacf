"""Run the benchmark workloads (benchmarks/workloads/, described in benchmarks/README.md) in popxl,
PyTorch eager, JAX jit (and ONNX Runtime for cnn_infer) side by side in one invocation, and print a
markdown table with popxl/peer ratios.

    python benchmarks/run.py                              # everything, 5 repeats
    python benchmarks/run.py --only gemm,mlp_small --repeats 7
    python benchmarks/run.py --quick --only overhead,mlp_small --frameworks popxl

Each framework runs in a worker process of its own (its own OpenMP runtime and settings, as a user
running it alone has them); --in-process runs them all in this one. Peers that are not installed
are reported as "not installed" (pip install '.[bench]').
A ratio > 1 always means popxl is faster. Exit status 1 if a correctness gate failed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Dict, List, Optional

# Thread counts are fixed before any framework is imported (OpenMP, Eigen and torch read them
# once at start-up), so every framework gets the same cores.
_THREADS_DEFAULT = 2


def _pin_threads(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}").strip()


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` as a package

from benchmarks.common import (FAMILY_OF_OPTION, FRAMEWORKS, LABELS, WORKLOADS, Host, LocalHost,  # noqa: E402
                               Row, WorkerHost, run_case, set_torch_threads, workload_cases)

# Ratio columns: popxl against each peer (for training rows, the popxl variant of that row).
PEERS = ["torch", "torch_compile", "jax", "jax_scan", "ort"]


def fmt_value(v: float) -> str:
    return f"{v:.3g}" if v < 1000 else f"{v:,.0f}"


def fmt_cell(row: Row, key: str) -> str:
    m = row.results.get(key)
    if m is None:
        return ""
    if m.na is not None:
        return f"n/a: {m.na}"
    if m.slow:
        return f"{fmt_value(m.value)} (1 slow call)"
    return f"{fmt_value(m.value)} ±{m.spread * 100:.0f}%"


def ratio(row: Row, popxl_key: str, peer: str) -> str:
    a, b = row.results.get(popxl_key), row.results.get(peer)
    if a is None or b is None or a.value is None or b.value is None:
        return ""
    r = b.value / a.value if row.case.lower_is_better else a.value / b.value
    return f"{r:.2f}x"


def table(rows: List[Row]) -> str:
    """One line per case and popxl variant: the training cases get a second line for popxl's
    1-step-per-run program, with the same peer measurements, so each ratio reads across a line."""
    present = [k for k in FRAMEWORKS if any(k in r.results for r in rows)]
    peers = [p for p in PEERS if p in present]
    head = ["workload", "case", "unit", *[LABELS[k] for k in present if k != "popxl_1"],
            *[f"popxl/{LABELS[p]}" for p in peers]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        variants = ["popxl"] + (["popxl_1"] if "popxl_1" in row.results else [])
        for v in variants:
            name = row.case.name + (f" ({row.case.steps_per_run} steps/run)" if v == "popxl" and len(variants) > 1 else "")
            name = row.case.name + " (1 step/run)" if v == "popxl_1" else name
            cells = [row.case.workload, name, row.case.unit,
                     *[fmt_cell(row, v if k == "popxl" else k) for k in present if k != "popxl_1"],
                     *[ratio(row, v, p) for p in peers]]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checks(rows: List[Row]) -> str:
    out = []
    for row in rows:
        for key, m in row.results.items():
            if m.check:
                out.append(f"- {row.case.workload} {row.case.name}, {LABELS[key]}: {m.check}")
    return "\n".join(out)


def machine_note(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    versions = []
    for mod in ("numpy", "torch", "jax", "onnxruntime"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            versions.append(f"{mod} not installed")
    # Other processes' load skews absolute numbers (ratios less so, as repeats are interleaved).
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {cpu}, {os.cpu_count()} cores, "
            f"load average {load} at the end; {threads} threads per framework; Python {platform.python_version()}; "
            f"{', '.join(versions)}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {WORKLOADS}")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per framework (median reported)")
    parser.add_argument("--quick", action="store_true", help="short repeats and small cases: a smoke test")
    parser.add_argument("--frameworks", default=",".join(FAMILY_OF_OPTION),
                        help="comma-separated subset of popxl,torch,jax,ort")
    parser.add_argument("--threads", type=int, default=_THREADS_DEFAULT)
    parser.add_argument("--slow-call", type=float, default=30.0,
                        help="a warm-up longer than this many seconds is reported as is, not timed again")
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds per timed repeat (default 0.3, --quick 0.02)")
    parser.add_argument("--in-process", action="store_true",
                        help="every framework in this process (one OpenMP runtime, whose settings the first "
                             "framework to load it chooses for all) instead of one worker process each")
    args = parser.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in only if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {WORKLOADS}")
    families = {FAMILY_OF_OPTION[f.strip()] for f in args.frameworks.split(",") if f.strip()}
    repeats = max(1, args.repeats if not args.quick or args.repeats != 5 else 3)
    min_time = args.min_time if args.min_time is not None else (0.02 if args.quick else 0.3)

    _pin_threads(args.threads)
    hosts: Dict[str, Host]
    if args.in_process:
        if "torch" in families:
            set_torch_threads(args.threads)
        local = LocalHost(args.quick)
        hosts = {f: local for f in families}
    else:
        hosts = {f: WorkerHost(f, args.quick, args.threads) for f in families}

    rows: List[Row] = []
    try:
        for name in only:
            for index, case in enumerate(workload_cases(name, args.quick)):
                print(f"[bench] {case.workload} {case.name} ...", file=sys.stderr, flush=True)
                rows.append(run_case(case, index, hosts, repeats, min_time, args.slow_call))
    finally:
        for host in hosts.values():
            if isinstance(host, WorkerHost):
                host.stop()
    where = "all in this process" if args.in_process else "each framework in a process of its own"
    print(f"popxl vs peers: {machine_note(args.threads)}; {where}; median of {repeats} repeats "
          f"(±: half the min-max range); ratio > 1 means popxl is faster\n")
    print(table(rows))
    print("\nCorrectness (warm-up results; max|a-b|/max|b|):")
    print(checks(rows) or "- nothing compared")
    failed = [f"{r.case.workload} {r.case.name}" for r in rows if r.check_failed]
    if failed:
        print(f"\nCORRECTNESS GATE FAILED: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
