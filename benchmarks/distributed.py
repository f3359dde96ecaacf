"""Data-parallel training across processes (poprun, MPI) against the same work in one process.

    python benchmarks/distributed.py                 # mlp_big, 5 launches of 500 steps per layout
    python benchmarks/distributed.py --steps 100 --repeats 3      # quicker

Every layout trains mlp_big (784-512-512-10, gelu, SGD) on the same global batch of 256 rows per
step, with the gradients averaged over the replicas (``replicated_all_reduce``) before each update:

- ``1 process x 1 replica, 2 threads``: the whole batch in one replica (no collective);
- ``1 process x 2 replicas, 2 threads``: 128 rows per replica, replicas run in turn in one process;
- ``2 processes x 1 replica, 1 thread each``: ``poprun --num-instances 2``, 128 rows per
  process, the all-reduce over MPI from the native engine's run loop.

It prints steps/s side by side and the 2-process layout's efficiency against the best
single-process one, then the all-reduce alone: a program that only all-reduces the gradients'
bytes (about 2.7 MB of float32 per step) across the 2 processes, against mpi4py's
``MPI_Allreduce`` of the same bytes, both as achieved bandwidth (bytes reduced per second).

Each measurement runs in its own process(es) (``--worker``); the table is printed by the driver.
Run it on an otherwise idle machine with at least 2 cores: the numbers of a shared machine say
little.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GLOBAL_BATCH = 256
STEPS_PER_RUN = 50


# workers (run inside the measured processes) -----------------------------------------------------
def _training_worker(steps: int) -> Dict[str, float]:
    import numpy as np

    import popdist
    import popxl
    from benchmarks.workloads.mlp import BIG, init_params, popxl_forward
    from benchmarks.workloads.training import TrainSpec, build_popxl_program

    ir = popxl.Ir(replication="popdist")
    replicas, local = ir.replication_factor, ir.instance_replication_factor
    rows = GLOBAL_BATCH // replicas
    k = STEPS_PER_RUN
    rng = np.random.default_rng(1)
    spec = TrainSpec(init_params(BIG, 0), np.zeros((k, rows, BIG[0]), np.float32), np.zeros((k, rows), np.int32), 0.005)
    ir, xs, ys, loss = build_popxl_program(spec, popxl_forward, k, ir=ir, data_parallel=replicas > 1)
    shape = (k, local) if local > 1 else (k,)
    feed = {xs: rng.standard_normal((*shape, rows, BIG[0])).astype(np.float32),
            ys: rng.integers(0, BIG[-1], (*shape, rows)).astype(np.int32)}
    runs = max(1, steps // k)
    with popxl.Session(ir, "ipu_model") as session:
        session.run(feed)  # warm-up
        start = time.perf_counter()
        for _ in range(runs):
            session.run(feed)
        seconds = time.perf_counter() - start
    return {"steps_per_s": runs * k / seconds, "instance": popdist.getInstanceIndex() if popdist.getNumInstances() > 1
            else 0}


def _gradient_elements() -> int:
    from benchmarks.workloads.mlp import BIG
    return sum(i * o + o for i, o in zip(BIG[:-1], BIG[1:]))


def _allreduce_worker(steps: int) -> Dict[str, float]:
    """The engine's all-reduce alone, then MPI_Allreduce of the same bytes (mpi4py, outside popxl)."""
    import numpy as np

    import popxl
    import popxl.ops as ops
    from mpi4py import MPI

    n = _gradient_elements()
    ir = popxl.Ir(replication="popdist")
    ir.num_host_transfers = 1
    with ir.main_graph:
        v = popxl.variable(np.ones(n, np.float32), name="grads")

        def body(t):
            ops.var_updates.copy_var_update_(t, ops.collectives.replicated_all_reduce(t, "mean"))
        ops.repeat(ir.create_graph(body, v), steps, v)
    with popxl.Session(ir, "ipu_model") as session:
        session.run({})
        start = time.perf_counter()
        session.run({})
        engine = time.perf_counter() - start
    comm = MPI.COMM_WORLD
    send, recv = np.ones(n, np.float32), np.empty(n, np.float32)
    comm.Allreduce(send, recv)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(steps):
        comm.Allreduce(send, recv)
    mpi = time.perf_counter() - start
    nbytes = 4 * n * steps
    return {"engine_gb_s": nbytes / engine / 1e9, "mpi_gb_s": nbytes / mpi / 1e9, "mb": 4 * n / 1e6,
            "instance": comm.Get_rank()}


# the driver -------------------------------------------------------------------------------------
def _run(label: str, command: List[str], env: Dict[str, str]) -> List[Dict[str, float]]:
    full_env = {**{k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "POPRUN_"))}, **env}
    with tempfile.TemporaryDirectory() as out:  # a file per instance: their stdout lines may interleave
        proc = subprocess.run(command + ["--out", out], capture_output=True, text=True, env=full_env, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"{label}: exit status {proc.returncode}\n{proc.stderr[-3000:]}")
        return [json.loads(f.read_text()) for f in sorted(Path(out).glob("*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500, help="timed training steps per launch")
    parser.add_argument("--repeats", type=int, default=5, help="launches per layout, interleaved")
    parser.add_argument("--worker", choices=["training", "allreduce"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = (_training_worker if args.worker == "training" else _allreduce_worker)(args.steps)
        Path(args.out, f"{os.getpid()}.json").write_text(json.dumps(result))
        return

    me = [sys.executable, str(Path(__file__).resolve())]

    def poprun(instances: int, replicas: int) -> List[str]:
        return [str(Path(sys.executable).parent / "poprun"), "--num-instances", str(instances),
                "--num-replicas", str(replicas), *me]
    layouts = [("1 process x 1 replica, 2 threads", poprun(1, 1), {"OMP_NUM_THREADS": "2"}),
               ("1 process x 2 replicas, 2 threads", poprun(1, 2), {"OMP_NUM_THREADS": "2"}),
               ("2 processes x 1 replica, 1 thread each", poprun(2, 2), {"OMP_NUM_THREADS": "1"})]
    # Repeats go round-robin over the layouts (one launch each), so that the machine's drift lands
    # on all of them; a launch is as fast as its slowest instance.
    runs: Dict[str, List[float]] = {label: [] for label, _, _ in layouts}
    for _ in range(args.repeats):
        for label, cmd, env in layouts:
            results = _run(label, cmd + ["--worker", "training", "--steps", str(args.steps)], env)
            runs[label].append(min(r["steps_per_s"] for r in results))
    rates = {label: statistics.median(r) for label, r in runs.items()}
    print(f"mlp_big data-parallel training, global batch {GLOBAL_BATCH}, {args.steps} steps a launch, "
          f"median of {args.repeats} interleaved launches (±: half the min-max range)\n")
    print("| layout | steps/s |\n|---|---|")
    for label, r in runs.items():
        print(f"| {label} | {rates[label]:.1f} ±{(max(r) - min(r)) / 2 / rates[label]:.0%} |")
    best_single = max(rate for label, rate in rates.items() if label.startswith("1 process"))
    print(f"\n2-process efficiency against the best single-process layout: "
          f"{rates[layouts[2][0]] / best_single:.2f}x (target >= 0.9)\n")

    results = _run("all-reduce", poprun(2, 2) + ["--worker", "allreduce", "--steps", str(args.steps)],
                   {"OMP_NUM_THREADS": "1"})
    r = min(results, key=lambda x: x["engine_gb_s"])
    print(f"all-reduce of {r['mb']:.2f} MB (mlp_big's gradients) across 2 processes, {args.steps} times\n")
    print("| | GB/s | vs MPI_Allreduce |\n|---|---|---|")
    print(f"| popxl replicated_all_reduce (engine run loop) | {r['engine_gb_s']:.2f} | "
          f"{r['engine_gb_s'] / r['mpi_gb_s']:.2f}x |")
    print(f"| mpi4py MPI_Allreduce, same bytes | {r['mpi_gb_s']:.2f} | 1.00x |")


if __name__ == "__main__":
    main()
