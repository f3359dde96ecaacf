"""What every workload shares: the benchmark contract (`Bench`, `Case`), framework availability,
interleaved timing, and the check of each framework's results against popxl's.

A workload module exposes ``cases(quick) -> List[Case]``. Each `Case` maps framework keys to
builders; a builder returns a `Bench` (a callable doing one unit of work) or raises
`Unavailable` with the reason, which the table shows as "n/a: <reason>" instead of failing.
"""
from __future__ import annotations

import gc
import importlib
import math
import multiprocessing
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

# Framework keys, in table order. "popxl" is the primary popxl variant of a case (for training:
# the case's steps_per_run per session.run); "popxl_1" is 1 step per run; "popxl_ops" is a program built directly
# with popxl ops where the primary variant goes through the PopART front end. "torch_compile" is
# PyTorch's step through torch.compile (inductor). "jax_scan" is a run's steps in one jitted
# lax.scan. Each key belongs to an installable family that --frameworks selects.
FRAMEWORKS: Dict[str, str] = {
    "popxl": "popxl",
    "popxl_1": "popxl",
    "popxl_ops": "popxl",
    "torch": "torch",
    "torch_compile": "torch",
    "jax": "jax",
    "jax_scan": "jax",
    "ort": "onnxruntime",
}
LABELS: Dict[str, str] = {
    "popxl": "popxl",
    "popxl_1": "popxl 1 step/run",
    "popxl_ops": "popxl ops (direct)",
    "torch": "PyTorch eager",
    "torch_compile": "PyTorch compiled",
    "jax": "JAX jit",
    "jax_scan": "JAX scan",
    "ort": "ONNX Runtime",
}
FAMILY_OF_OPTION = {"popxl": "popxl", "torch": "torch", "jax": "jax", "ort": "onnxruntime"}


class Unavailable(Exception):
    """A framework cannot run this case (not installed, op or dtype missing); the message says why."""


@dataclass
class Bench:
    """One framework's runnable instance of a case.

    ``call`` does one unit of work and returns when it is finished (JAX results are blocked on).
    ``items`` is the work per call (steps, FLOPs, images, runs). The first ``check_calls`` calls,
    made on the freshly built state, are the warm-up; their results (``output`` of each return
    value, flattened and joined) are what is compared across frameworks. ``fixed_inner`` pins the
    calls per timed repeat (for one-shot work such as compiling) instead of calibrating it.
    """

    call: Callable[[], Any]
    items: float
    check_calls: int = 1
    output: Optional[Callable[[Any], Any]] = None
    close: Optional[Callable[[], None]] = None
    fixed_inner: Optional[int] = None
    session: Any = None  # popxl's Session behind the call, for profiles (benchmarks/op_profile.py)


@dataclass
class Case:
    """One row of the table: a workload at one shape/dtype, with a builder per framework."""

    workload: str
    name: str
    unit: str
    builders: Dict[str, Callable[[], Bench]]
    lower_is_better: bool = False
    scale: float = 1.0  # value = items/s / scale, or (lower_is_better) seconds per item * scale
    rtol: float = 1e-4  # on max|a - b| / max|b| of the checked results
    reference: Optional[Callable[[], np.ndarray]] = None  # framework-free expected results
    must_match: bool = False  # a mismatch fails the run (correctness gate, not only a table note)
    steps_per_run: int = 100  # training: the steps of popxl's primary variant per session.run


@dataclass
class Measurement:
    value: Optional[float] = None  # median, in the case's unit
    spread: Optional[float] = None  # (max - min) / 2 / median of the repeats
    na: Optional[str] = None  # why there is no value
    check: Optional[str] = None  # result of comparing this framework's results with popxl's
    slow: bool = False  # the value is the warm-up's alone: one call took too long to repeat


@dataclass
class Row:
    case: Case
    results: Dict[str, Measurement] = field(default_factory=dict)
    check_failed: bool = False


def import_or_unavailable(module: str) -> Any:
    """Import a peer framework, or raise `Unavailable` so the table says "not installed"."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise Unavailable("not installed") from None


def to_numpy(value: Any) -> np.ndarray:
    """Host copy of a NumPy/JAX array, a torch tensor, or a sequence of those (concatenated)."""
    if value is None:
        return np.zeros(0, np.float32)
    if isinstance(value, (list, tuple)):
        return np.concatenate([to_numpy(v).ravel() for v in value]) if value else np.zeros(0, np.float32)
    if hasattr(value, "detach"):  # torch: no import needed to recognise it
        value = value.detach().float().numpy() if value.dtype.is_floating_point else value.detach().numpy()
    return np.asarray(value)


def max_rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    """max|a - b| relative to max|b|: one number that is meaningful for losses and for matrices
    alike, and does not blow up on entries that happen to be near zero."""
    a = np.asarray(actual, np.float64).ravel()
    b = np.asarray(expected, np.float64).ravel()
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def warm_up(bench: Bench) -> Tuple[np.ndarray, float]:
    """Run the check calls (the warm-up); return their joined results and seconds per item."""
    parts = []
    t0 = time.perf_counter()
    for _ in range(bench.check_calls):
        ret = bench.call()
        parts.append(to_numpy(bench.output(ret) if bench.output else ret).ravel())
    secs = (time.perf_counter() - t0) / (bench.check_calls * bench.items)
    return (np.concatenate(parts) if parts else np.zeros(0, np.float32)), secs


def calibrate(bench: Bench, min_time: float) -> int:
    """Calls per timed repeat so that one repeat lasts at least ``min_time`` (timer resolution
    and per-repeat noise then matter little, even for microsecond calls)."""
    if bench.fixed_inner is not None:
        return bench.fixed_inner
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            bench.call()
        dt = time.perf_counter() - t0
        if dt >= min_time / 4 or n >= 1 << 20:
            return max(1, math.ceil(n * min_time / max(dt, 1e-9)))
        n *= 4


def summarise(case: Case, seconds_per_item: Sequence[float]) -> Measurement:
    """Median and half-range spread, converted to the case's unit."""
    if case.lower_is_better:
        values = [s * case.scale for s in seconds_per_item]
    else:
        values = [1.0 / (s * case.scale) for s in seconds_per_item]
    med = statistics.median(values)
    return Measurement(value=med, spread=(max(values) - min(values)) / 2 / med if med else 0.0)


def describe_failure(e: BaseException) -> str:
    """One-line reason for the table; the traceback's last frame says where popxl refused."""
    if isinstance(e, (Unavailable, RemoteFailure)):  # a worker's message is already this line
        return str(e)
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    loc = f" [{where.filename.rsplit('/', 1)[-1]}:{where.lineno}]" if where else ""
    return f"{type(e).__name__}: {msg[:160]}{loc}"


# The workloads: name -> (module of benchmarks.workloads, its function returning the cases).
_CASES = {"gemm": ("gemm", "cases"), "mlp_small": ("mlp", "cases"), "mlp_big": ("mlp", "big_cases"),
          "gpt_block": ("gpt_block", "cases"), "cnn_infer": ("cnn", "cases"), "overhead": ("overhead", "cases"),
          "compile": ("compile", "cases"), "bert_infer": ("bert", "infer_cases"), "bert_train": ("bert", "train_cases")}

WORKLOADS = list(_CASES)


def workload_cases(name: str, quick: bool) -> List[Case]:
    """Import a workload lazily, so one that fails to import only costs its own rows."""
    module, func = _CASES[name]
    return getattr(importlib.import_module(f"benchmarks.workloads.{module}"), func)(quick)


class RemoteFailure(Exception):
    """A bench failed in a worker process; the message is the worker's `describe_failure`."""


class LocalHost:
    """Builds and times benches in this process. Case ``index`` of a workload is
    ``workload_cases(workload, quick)[index]``, so a worker process finds the parent's case by name
    and position (builders are closures, which do not cross processes)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self._cases: Dict[str, List[Case]] = {}
        self._benches: Dict[str, Bench] = {}
        self._call_seconds: Dict[str, float] = {}  # one warm-up call's

    def build(self, workload: str, index: int, key: str) -> Tuple[np.ndarray, float, float]:
        """Build ``key``'s bench of the case and warm it up: its checked results, and seconds per
        item and per call in the warm-up."""
        if workload not in self._cases:
            self._cases[workload] = workload_cases(workload, self.quick)
        bench = self._cases[workload][index].builders[key]()
        self._benches[key] = bench
        results, per_item = warm_up(bench)
        self._call_seconds[key] = per_item * bench.items
        return results, per_item, self._call_seconds[key]

    def calibrate(self, key: str, min_time: float) -> int:
        """Calls per timed repeat: one when a warm-up call already lasted ``min_time`` (calibrating
        would cost another long call), else `calibrate`'s count."""
        bench = self._benches[key]
        if bench.fixed_inner is None and self._call_seconds[key] >= min_time:
            return 1
        return calibrate(bench, min_time)

    def time(self, key: str, calls: int) -> float:
        """Seconds per item over ``calls`` calls of ``key``'s bench."""
        bench = self._benches[key]
        gc.collect()
        call = bench.call
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - t0) / (calls * bench.items)

    def close(self) -> None:
        """Close every bench built since the last close."""
        benches, self._benches = self._benches, {}
        for b in benches.values():
            if b.close:
                b.close()
        del benches  # the last reference: gc.collect() frees them
        gc.collect()


def set_torch_threads(threads: int) -> None:
    """PyTorch's intra-op threads, if PyTorch is installed (it imports it)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(threads)


def _serve(conn: Any, family: str, quick: bool, threads: int) -> None:
    """A worker process's loop: one framework family's benches, on command from `WorkerHost`."""
    if family == "popxl":
        # popxl's engine loads libgomp with its own settings (popxl/engines/native.py); loaded here,
        # before any builder, it cannot inherit another framework's (bert_infer's builders export
        # the model through PyTorch, which brings its own libgomp).
        from popxl.engines.native import _import_native
        _import_native()
    elif family == "torch":
        set_torch_threads(threads)
    host = LocalHost(quick)
    while True:
        message = conn.recv()
        if message is None:
            host.close()
            return
        method, args = message
        try:
            conn.send(("ok", getattr(host, method)(*args)))
        except Exception as e:
            conn.send(("failed", describe_failure(e)))


class WorkerHost:
    """A `LocalHost` in a process of its own (spawned: a fresh interpreter), for one framework
    family. Each framework then runs with its own OpenMP runtime at its own settings, as a user of
    that framework alone has it: in one process the first framework to load libgomp sets it up for
    all (run.py used to import PyTorch first, so popxl ran at libgomp's default idle spin, not at
    its own short one). A worker that dies (a crash in a framework) fails its case and is started
    again for the next."""

    def __init__(self, family: str, quick: bool, threads: int) -> None:
        self.family, self.quick, self.threads = family, quick, threads
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.family, self.quick, self.threads), daemon=True,
                                 name=f"bench-{self.family}")
        self._proc.start()
        child.close()

    def _call(self, method: str, *args: Any) -> Any:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((method, args))
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            self._proc = None
            raise RemoteFailure(f"the {self.family} worker process died (exit code {code})") from None
        if status != "ok":
            raise RemoteFailure(value)
        return value

    def build(self, workload: str, index: int, key: str) -> Tuple[np.ndarray, float, float]:
        return self._call("build", workload, index, key)

    def calibrate(self, key: str, min_time: float) -> int:
        return self._call("calibrate", key, min_time)

    def time(self, key: str, calls: int) -> float:
        return self._call("time", key, calls)

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._call("close")

    def stop(self) -> None:
        """End the worker process."""
        if self._proc is None:
            return
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()
        self._proc = None


Host = Union[LocalHost, WorkerHost]

# Pause before each timed repeat: another framework's idle threads may still be spinning after its
# repeat (libgomp's default spin, PyTorch's, lasts milliseconds) and would take a core from this one.
_SETTLE_SECONDS = 0.05


def run_case(case: Case, index: int, hosts: Mapping[str, Host], repeats: int, min_time: float,
             slow_call: float = 30.0) -> Row:
    """Build the bench of every framework in ``hosts`` (family -> host) for case ``index`` of its
    workload, warm up and check each, and time them interleaved.

    Repeats go round-robin over the frameworks, so a burst of machine noise lands on all of them
    rather than on whichever happened to run then; only ratios from one run are meaningful. Each
    repeat runs enough calls to last ``min_time``; a bench whose warm-up calls already last that
    long runs one call per repeat without calibrating (calibrating would cost another long call).
    A framework whose warm-up call took longer than ``slow_call`` seconds (PyTorch's float16 GEMM on
    CPUs without float16 units takes minutes) is reported from that one call instead of holding up
    the whole run."""
    row = Row(case)
    checks: Dict[str, np.ndarray] = {}
    warm: Dict[str, float] = {}  # seconds per item in the warm-up
    slow: List[str] = []
    built: Dict[str, Host] = {}
    try:
        for key in FRAMEWORKS:
            if key not in case.builders:
                continue
            host = hosts.get(FRAMEWORKS[key])
            if host is None:
                row.results[key] = Measurement(na="not selected")
                continue
            try:
                built[key] = host
                checks[key], warm[key], call_seconds = host.build(case.workload, index, key)
                if call_seconds > slow_call:  # one call, not the whole warm-up
                    slow.append(key)
            except Exception as e:  # a framework that cannot run this case is reported, not fatal
                row.results[key] = Measurement(na=describe_failure(e))
        _check(case, row, checks)
        timed = [k for k in checks if k not in slow]
        inner: Dict[str, int] = {}
        samples: Dict[str, List[float]] = {k: [] for k in timed}
        for _ in range(repeats):
            for k in list(timed):
                try:
                    if k not in inner:
                        inner[k] = built[k].calibrate(k, min_time)
                    time.sleep(_SETTLE_SECONDS)
                    samples[k].append(built[k].time(k, inner[k]))
                except RemoteFailure as e:  # its worker died: the others' rows go on
                    row.results[k] = Measurement(na=describe_failure(e), check=row.results.get(k, Measurement()).check)
                    timed.remove(k)
                    del samples[k]
        samples.update({k: [warm[k]] for k in slow})
        for key, secs in samples.items():
            m = summarise(case, secs)
            m.check, m.slow = row.results.get(key, Measurement()).check, key in slow
            row.results[key] = m
    finally:
        for host in {id(h): h for h in built.values()}.values():
            try:
                host.close()
            except RemoteFailure:  # a worker that dies closing its benches is started again when next needed
                pass
    return row


def _check(case: Case, row: Row, checks: Dict[str, np.ndarray]) -> None:
    """Compare each framework's warm-up results with the reference (if the case has one) and
    with popxl's, recording the verdict per framework."""
    expected: Dict[str, np.ndarray] = {}
    if case.reference is not None:
        expected["reference"] = case.reference()
    baseline = next((k for k in ("popxl", "popxl_1") if k in checks), None)
    for key, got in checks.items():
        if got.size == 0:  # nothing to compare (compile, say)
            continue
        notes, ok = [], True
        against = dict(expected)
        if baseline is not None and key != baseline:
            against[LABELS[baseline]] = checks[baseline]
        for name, want in against.items():
            # A framework may check fewer training steps than the baseline ran (a slow per-step
            # peer checks a prefix); the same init and batches make prefixes comparable.
            n = min(got.size, want.size)
            err = max_rel_err(got[:n], want[:n])
            good = err <= case.rtol
            ok &= good
            first = f", first {n}" if n < max(got.size, want.size) else ""
            notes.append(f"{'ok' if good else 'MISMATCH'} vs {name} ({err:.1e}{first})")
        row.results.setdefault(key, Measurement()).check = "; ".join(notes) if notes else None
        if not ok and case.must_match:
            row.check_failed = True
