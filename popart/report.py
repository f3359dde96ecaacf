"""Profiling reports: what ``Session.getReport()`` returns.

HOW THE NUMBERS ARE MEASURED (read this before comparing them with anything): the native engine
has no per-instruction timers, so when profiling is enabled (``engineOptions={"autoReport.all":
"true"}``) the session runs its program on the NumPy reference engine, timing every op
instruction in Python, once per replica ("IPU"). The times are therefore real measurements of
the program actually run, but of the reference kernels, not of the native ones the session uses
when profiling is off. Memory figures are exact: they come from the static memory plan of the
compiled program (one arena per replica, every tensor at a fixed place).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from popxl import dtypes
from popxl.compiler.executable import Executable
from popxl.engines.reference import ReferenceEngine

__all__ = ["TimedEngine", "Report", "OpProfile", "IpuMemory", "MEASUREMENT_NOTE"]

MEASUREMENT_NOTE = ("op times measured in Python on the NumPy reference engine (the native engine has no "
                    "per-op timers); memory from the compiled program's static plan")


def _buffer_bytes(exe: Executable, index: int) -> int:
    b = exe.buffers[index]
    return int(np.prod(b["shape"], dtype=np.int64)) * dtypes.ml_dtype(dtypes.dtype.from_name(b["dtype"])).itemsize


class TimedEngine(ReferenceEngine):
    """The reference engine, timing each op instruction per replica (``times[(graph, k)][replica]``)."""

    def __init__(self, exe: Executable) -> None:
        super().__init__(exe)
        self.where: Dict[int, Tuple[int, int]] = {}
        for gi, g in enumerate(exe.graphs):
            for k, instr in enumerate(g["program"]):
                if instr["kind"] == "op":
                    self.where[id(instr)] = (gi, k)
        self.reset()

    def reset(self) -> None:
        self.seconds: Dict[Tuple[int, int], np.ndarray] = {}
        self.calls: Dict[Tuple[int, int], np.ndarray] = {}

    def _op(self, instr: Dict[str, Any], reps: List[int]) -> None:
        key = self.where[id(instr)]
        if key not in self.seconds:
            self.seconds[key] = np.zeros(self.replicas)
            self.calls[key] = np.zeros(self.replicas, np.int64)
        # Collective ops need every replica at once: their time is shared out evenly.
        groups = [reps] if self._prepared[id(instr)][0].collective else [[r] for r in reps]
        for group in groups:
            start = time.perf_counter()
            super()._op(instr, group)
            spent = time.perf_counter() - start
            for r in group:
                self.seconds[key][r] += spent / len(group)
                self.calls[key][r] += 1


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

    def __init__(self, memory: List[IpuMemory], ops: List[OpProfile], runSeconds: List[float],
                 profiling: bool, executionSteps: Optional[List[str]] = None) -> None:
        self.memory = memory
        self.executionSteps = list(executionSteps or [])
        self.ops = ops
        self.runSeconds = list(runSeconds)
        self.executionProfiled = profiling
        self.header = MEASUREMENT_NOTE if profiling else "execution profiling not enabled; memory only"

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
    walk(0, 0)
    return lines


def build_report(exe: Executable, engine: Optional[TimedEngine], runSeconds: Sequence[float],
                 showExecutionSteps: bool = False) -> Report:
    """The report of a compiled program and, if it ran on a ``TimedEngine``, of its execution."""
    var_bufs = {v["buffer"] for v in exe.variables}
    const_bufs = {c["buffer"] for c in exe.constants}
    var_bytes = sum(_buffer_bytes(exe, b) for b in var_bufs)
    const_bytes = sum(_buffer_bytes(exe, b) for b in const_bufs)
    memory = [IpuMemory(r, exe.arena_bytes, var_bytes, const_bytes) for r in range(exe.replication_factor)]
    ops: List[OpProfile] = []
    if engine is not None:
        for (gi, k), secs in engine.seconds.items():
            instr = exe.graphs[gi]["program"][k]
            in_b = sum(_buffer_bytes(exe, b) for b in instr["inputs"])
            out_b = sum(_buffer_bytes(exe, b) for b in instr["outputs"])
            for r in range(exe.replication_factor):
                ops.append(OpProfile(instr.get("name") or instr["type"], instr["type"], str(exe.graphs[gi]["id"]),
                                     r, int(engine.calls[(gi, k)][r]), float(secs[r]), in_b, out_b))
    return Report(memory, ops, runSeconds, engine is not None, execution_steps(exe) if showExecutionSteps else None)
