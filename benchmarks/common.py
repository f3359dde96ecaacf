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
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

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


def time_interleaved(benches: Dict[str, Bench], repeats: int, min_time: float,
                     call_time: Optional[Dict[str, float]] = None) -> Dict[str, List[float]]:
    """Seconds per item for each bench, ``repeats`` samples each.

    Repeats go round-robin over the frameworks, so a burst of machine noise lands on all of them
    rather than on whichever happened to run then; only ratios from one run are meaningful.
    A bench whose warm-up calls (``call_time``, seconds per call) already last ``min_time``
    runs one call per repeat without calibrating: calibrating would cost another long call."""
    call_time = call_time or {}
    inner = {k: 1 if call_time.get(k, 0.0) >= min_time and b.fixed_inner is None else calibrate(b, min_time)
             for k, b in benches.items()}
    samples: Dict[str, List[float]] = {k: [] for k in benches}
    for _ in range(repeats):
        for k, b in benches.items():
            gc.collect()
            call, n = b.call, inner[k]
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            samples[k].append((time.perf_counter() - t0) / (n * b.items))
    return samples


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
    if isinstance(e, Unavailable):
        return str(e)
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    loc = f" [{where.filename.rsplit('/', 1)[-1]}:{where.lineno}]" if where else ""
    return f"{type(e).__name__}: {msg[:160]}{loc}"


def run_case(case: Case, frameworks: Sequence[str], repeats: int, min_time: float,
             slow_call: float = 30.0) -> Row:
    """Build every selected framework's bench, warm up and check each, time them interleaved.

    A framework whose warm-up call took longer than ``slow_call`` seconds (PyTorch's float16
    GEMM on CPUs without float16 units takes minutes) is reported from that one call instead of
    holding up the whole run."""
    row = Row(case)
    benches: Dict[str, Bench] = {}
    checks: Dict[str, np.ndarray] = {}
    slow: Dict[str, float] = {}
    call_time: Dict[str, float] = {}
    try:
        for key in FRAMEWORKS:
            if key not in case.builders:
                continue
            if FRAMEWORKS[key] not in frameworks:
                row.results[key] = Measurement(na="not selected")
                continue
            try:
                bench = case.builders[key]()
                benches[key] = bench
                checks[key], secs = warm_up(bench)
                call_time[key] = secs * bench.items
                if secs * bench.items > slow_call:  # one call, not the whole warm-up
                    slow[key] = secs
            except Exception as e:  # a framework that cannot run this case is reported, not fatal
                row.results[key] = Measurement(na=describe_failure(e))
        _check(case, row, checks)
        timed = {k: b for k, b in benches.items() if k in checks and k not in slow}
        samples = {**time_interleaved(timed, repeats, min_time, call_time), **{k: [s] for k, s in slow.items()}}
        for key, secs in samples.items():
            m = summarise(case, secs)
            m.check, m.slow = row.results.get(key, Measurement()).check, key in slow
            row.results[key] = m
    finally:
        for b in benches.values():
            if b.close:
                b.close()
        gc.collect()
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
