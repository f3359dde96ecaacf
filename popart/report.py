"""Profiling reports: what ``Session.getReport()`` returns.

HOW THE NUMBERS ARE MEASURED: with profiling enabled (``engineOptions={"autoReport.all":
"true"}``) the session's engine times every op instruction as it runs, once per replica ("IPU"):
the native engine with C++ steady-clock timers around each kernel (an op that falls back to a
NumPy kernel is timed there too, callback included), the reference engine (``POPXL_ENGINE=
reference``) in Python. A collective serves all replicas in one call; its time is shared out
evenly. Memory figures are exact: they come from the static memory plan of the compiled program
(one arena per replica, every tensor at a fixed place).
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import popxl
from popxl import dtypes
from popxl.compiler.executable import Executable
from popart.options import SessionOptions

__all__ = ["Report", "OpProfile", "IpuMemory", "measurement_note", "SessionProfile"]

logger = logging.getLogger("popart.session")

OpTimes = Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray]]  # what an engine's op_profile() returns


def measurement_note(engine_name: str) -> str:
    return (f"op times measured by the {engine_name} engine around each op instruction, per replica; "
            "memory from the compiled program's static plan")


def _buffer_bytes(exe: Executable, index: int) -> int:
    b = exe.buffers[index]
    return int(np.prod(b["shape"], dtype=np.int64)) * dtypes.ml_dtype(dtypes.dtype.from_name(b["dtype"])).itemsize


class OpProfile:
    """One op of the compiled program on one IPU (replica): its calls and time since the last
    reset, and the bytes of its inputs and outputs."""

    def __init__(self, name: str, type: str, graph: str, ipu: int, calls: int, seconds: float,
                 inputBytes: int, outputBytes: int) -> None:
        self.name, self.type, self.graph, self.ipu = name, type, graph, ipu
        self.calls, self.seconds = calls, seconds
        self.inputBytes, self.outputBytes = inputBytes, outputBytes

    def __repr__(self) -> str:
        return (f"OpProfile({self.name!r}, {self.type}, ipu={self.ipu}, calls={self.calls}, "
                f"{self.seconds * 1e3:.3f} ms, in={self.inputBytes} B, out={self.outputBytes} B)")


class IpuMemory:
    """The memory of one IPU (replica): the whole static plan and its parts."""

    def __init__(self, ipu: int, totalBytes: int, variableBytes: int, constantBytes: int) -> None:
        self.ipu, self.totalBytes = ipu, totalBytes
        self.variableBytes, self.constantBytes = variableBytes, constantBytes
        self.activationBytes = max(totalBytes - variableBytes - constantBytes, 0)

    def __repr__(self) -> str:
        return (f"IpuMemory(ipu={self.ipu}, total={self.totalBytes} B, variables={self.variableBytes} B, "
                f"constants={self.constantBytes} B, activations={self.activationBytes} B)")


class Report:
    """A profile: ``memory`` (one ``IpuMemory`` per IPU), ``ops`` (one ``OpProfile`` per op and
    IPU; empty when execution profiling is off), ``runSeconds`` (wall-clock time of each run)."""

    def __init__(self, memory: List[IpuMemory], ops: List[OpProfile], runSeconds: Sequence[float],
                 measuredBy: Optional[str], executionSteps: Optional[List[str]] = None) -> None:
        self.memory = memory
        self.executionSteps = list(executionSteps or [])
        self.ops = ops
        self.runSeconds = list(runSeconds)
        self.executionProfiled = measuredBy is not None
        self.measuredBy = measuredBy  # the engine that timed the ops ("native" / "reference")
        self.header = measurement_note(measuredBy) if measuredBy else "execution profiling not enabled; memory only"

    def opsByTime(self) -> List[OpProfile]:
        return sorted(self.ops, key=lambda o: -o.seconds)

    def totalOpSeconds(self, ipu: Optional[int] = None) -> float:
        return float(sum(o.seconds for o in self.ops if ipu is None or o.ipu == ipu))

    def __str__(self) -> str:
        lines = [f"# {self.header}"]
        for m in self.memory:
            lines.append(f"IPU {m.ipu}: {m.totalBytes} bytes (variables {m.variableBytes}, constants "
                         f"{m.constantBytes}, activations {m.activationBytes})")
        if self.executionProfiled:
            lines.append(f"{len(self.runSeconds)} run(s), {sum(self.runSeconds) * 1e3:.3f} ms")
            lines.append(f"{'ipu':>3} {'calls':>6} {'ms':>10} {'in B':>10} {'out B':>10}  op")
            for o in self.opsByTime():
                lines.append(f"{o.ipu:>3} {o.calls:>6} {o.seconds * 1e3:>10.3f} {o.inputBytes:>10} "
                             f"{o.outputBytes:>10}  {o.type} {o.name} ({o.graph})")
        if self.executionSteps:
            lines.append("Execution steps:")
            lines += [f"  {step}" for step in self.executionSteps]
        return "\n".join(lines)


def execution_steps(exe: Executable) -> List[str]:
    """The program as it executes: one line per instruction, called graphs indented under their
    call (reportOptions ``showExecutionSteps``)."""
    lines: List[str] = []

    def walk(gi: int, depth: int, count: str = "") -> None:
        for instr in exe.graphs[gi]["program"]:
            kind = instr["kind"]
            pad = "  " * depth
            if kind == "op":
                lines.append(f"{pad}{instr['type']} {instr.get('name') or ''}".rstrip())
            elif kind in ("call", "repeat"):
                times = f" x{instr['count']}" if kind == "repeat" else ""
                lines.append(f"{pad}{kind} {exe.graphs[instr['graph']]['id']}{times}")
                walk(instr["graph"], depth + 1)
            elif kind == "if":
                for branch in ("then", "else"):
                    lines.append(f"{pad}if/{branch} {exe.graphs[instr[branch]['graph']]['id']}")
                    walk(instr[branch]["graph"], depth + 1)
            elif kind in ("host_load", "host_store"):
                lines.append(f"{pad}{kind} {(exe.h2d if kind == 'host_load' else exe.d2h)[instr['stream']]['name']}")
    if exe.static_graph >= 0:
        lines.append(f"static {exe.graphs[exe.static_graph]['id']} (when weights changed)")
        walk(exe.static_graph, 1)
    walk(0, 0)
    return lines


def build_report(exe: Executable, op_times: Optional[OpTimes], runSeconds: Sequence[float],
                 measuredBy: Optional[str] = None, showExecutionSteps: bool = False) -> Report:
    """The report of a compiled program and, given an engine's ``op_profile()``, of its execution."""
    var_bufs = {v["buffer"] for v in exe.variables}
    const_bufs = {c["buffer"] for c in exe.constants}
    var_bytes = sum(_buffer_bytes(exe, b) for b in var_bufs)
    const_bytes = sum(_buffer_bytes(exe, b) for b in const_bufs)
    memory = [IpuMemory(r, exe.arena_bytes, var_bytes, const_bytes) for r in range(exe.replication_factor)]
    ops: List[OpProfile] = []
    for (gi, k), (secs, calls) in (op_times or {}).items():
        instr = exe.graphs[gi]["program"][k]
        in_b = sum(_buffer_bytes(exe, b) for b in instr["inputs"])
        out_b = sum(_buffer_bytes(exe, b) for b in instr["outputs"])
        for r in range(exe.replication_factor):
            ops.append(OpProfile(instr.get("name") or instr["type"], instr["type"], str(exe.graphs[gi]["id"]),
                                 r, int(calls[r]), float(secs[r]), in_b, out_b))
    return Report(memory, ops, runSeconds, measuredBy if op_times is not None else None,
                  execution_steps(exe) if showExecutionSteps else None)


class SessionProfile:
    """What a popart session measures for its reports: the wall-clock time of each run and, with
    profiling enabled (``engineOptions`` ``autoReport.all`` or ``autoReport.outputExecutionProfile``
    "true"), the per-op times of the popxl Session's ``op_profiler``.

    Args:
        options: The session's ``SessionOptions`` (read when asked: their engine options decide).
    """

    def __init__(self, options: SessionOptions) -> None:
        self._options = options
        self._px: Optional[popxl.Session] = None
        self.run_seconds: List[float] = []

    @property
    def enabled(self) -> bool:
        """Whether execution profiling is asked for."""
        opts = self._options.engineOptions
        return str(opts.get("autoReport.all", "false")).lower() == "true" or \
            str(opts.get("autoReport.outputExecutionProfile", "false")).lower() == "true"

    def connect(self, px: popxl.Session) -> None:
        """The program is compiled into ``px``: time its ops if profiling is asked for."""
        self._px = px
        if self.enabled:
            px.op_profiler.enabled = True
            logger.info("profiling enabled: %s.", measurement_note(px.op_profiler.engine))

    def record(self, seconds: float) -> None:
        """One more run, of ``seconds``."""
        self.run_seconds.append(seconds)

    def op_times(self) -> Optional[OpTimes]:
        """The op times since the last reset, or None when the ops are not timed."""
        if self._px is None or not self._px.op_profiler.enabled:
            return None
        return self._px.op_profiler.op_times()

    def reset(self) -> None:
        self.run_seconds = []
        if self._px is not None and self._px.op_profiler.enabled:
            self._px.op_profiler.reset()

    def report(self, showExecutionSteps: bool = False) -> Report:
        """The report of the compiled program (``connect`` first) and of the runs since the last reset."""
        assert self._px is not None
        return build_report(self._px.executable, self.op_times(), self.run_seconds, self._px.op_profiler.engine,
                            showExecutionSteps=showExecutionSteps)

    def summary_lines(self, batches_per_step: int) -> List[str]:
        """``getSummaryReport``'s lines about execution."""
        if not self.enabled:
            return ["Execution profiling not enabled."]
        times = self.run_seconds
        lines = [f"Execution: {len(times)} run(s)" + (
            f", total {sum(times) * 1e3:.3f} ms, mean {np.mean(times) * 1e3:.3f} ms per run, "
            f"{sum(times) * 1e3 / (len(times) * batches_per_step):.3f} ms per batch." if times else ".")]
        op_times = self.op_times()
        if op_times and self._px is not None:  # op times come from a connected session
            report = build_report(self._px.executable, op_times, times, self._px.op_profiler.engine)
            lines.append(f"Per-op times ({report.header}); slowest ops:")
            lines += [f"  {o!r}" for o in report.opsByTime()[:10]]
        return lines
