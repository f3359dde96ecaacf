"""The reference engine: runs an Executable with the NumPy kernels of the op registry.

It is deliberately simple: every buffer is a NumPy view into one uint8 arena per replica, laid
out exactly as the memory plan says, so a wrong plan shows up as wrong numbers here too.
Replicas run in lockstep, instruction by instruction; collectives see all replicas at once.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from popxl.compiler.executable import Executable
from popxl.engines.arena import ArenaViews


class ReferenceEngine:
    name = "reference"
    build = "numpy"  # the NumPy kernels of this popxl (its version is compared with the program)

    def __init__(self, exe: Executable) -> None:
        self.exe = exe
        self.replicas = exe.replication_factor
        self.memory = ArenaViews(exe)  # buffer views and the ops' NumPy kernels
        self.op_positions = self.memory.op_positions
        self._position_of = {id(exe.graphs[gi]["program"][k]): i for i, (gi, k) in enumerate(self.op_positions)}
        self.profiling = False

    # device memory --------------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return bool(self.memory.views)

    @property
    def scratch_bytes(self) -> int:
        """Device memory the kernels use beyond the arena while they run (none here)."""
        return 0

    def attach(self) -> None:
        self.memory.bind([np.zeros(max(self.exe.arena_bytes, 1), np.uint8) for _ in range(self.replicas)])
        self.memory.write_constants()

    def detach(self) -> None:
        self.memory.unbind()
        self.memory.leave()

    # other instances (popxl.distributed): collectives gather every instance's inputs through mpi4py
    def set_layout(self, index: int, count: int, local: int, global_replicas: int) -> None:
        self.memory.replica_offset = index * local

    def join(self, comm: Any, backend: Any, gather: Callable) -> None:
        self.memory.join(gather)

    def leave(self) -> None:
        self.memory.leave()

    def write_variable(self, index: int, replica: int, value: np.ndarray) -> None:
        self.memory.write_variable(index, replica, value)

    def read_variable(self, index: int, replica: int) -> np.ndarray:
        return self.memory.read_variable(index, replica)

    def variable_view(self, index: int, replica: int) -> np.ndarray:
        """A read-only view of a variable's device memory (valid until the next run or detach)."""
        return self.memory.variable_view(index, replica)

    # execution ------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        # Host buffers come in any shape of the right size: viewed as (transfers, replicas, *shape).
        lead = (self.exe.num_host_transfers, self.replicas)
        self._inputs = [a.reshape(lead + tuple(s["shape"])) for a, s in zip(inputs, self.exe.h2d)]
        self._outputs = [a.reshape(lead + tuple(s["shape"])) for a, s in zip(outputs, self.exe.d2h)]
        self._loads = np.zeros((len(inputs), self.replicas), np.int64)
        self._stores = np.zeros((len(outputs), self.replicas), np.int64)
        reps = list(range(self.replicas))
        if self.exe.static_graph >= 0:  # every time: the oracle caches nothing
            self._exec(self.exe.static_graph, reps)
        self._exec(0, reps)

    def transfer_counts(self) -> Tuple[np.ndarray, np.ndarray]:
        """(host_load counts, host_store counts) of the last run, each (streams, replicas)."""
        return self._loads, self._stores

    def _copy(self, pairs, reps) -> None:
        for r in reps:
            v = self.memory.views[r]
            for src, dst in pairs:
                if src != dst:
                    v[dst][...] = v[src]

    # profiling ------------------------------------------------------------------------------------
    @property
    def profiling(self) -> bool:
        """Whether every op instruction is timed, per replica; setting it resets the profile."""
        return self._profiling

    @profiling.setter
    def profiling(self, on: bool) -> None:
        self._profiling = bool(on)
        self.reset_profile()

    def reset_profile(self) -> None:
        self._seconds = np.zeros((len(self.op_positions), self.replicas))
        self._calls = np.zeros((len(self.op_positions), self.replicas), np.int64)

    def op_profile(self) -> Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray]]:
        """``{(graph, instruction): (seconds per replica, calls per replica)}`` of the op
        instructions that ran since the last reset."""
        return {pos: (self._seconds[i], self._calls[i]) for i, pos in enumerate(self.op_positions)
                if self._calls[i].any()}

    def _timed_op(self, instr: Dict[str, Any], reps: List[int]) -> None:
        i = self._position_of[id(instr)]
        # A collective needs every replica at once: its time is shared out evenly.
        groups = [reps] if self.memory.is_collective(instr) else [[r] for r in reps]
        for group in groups:
            start = time.perf_counter()
            self.memory.run_op(instr, group)
            self._seconds[i, group] += (time.perf_counter() - start) / len(group)
            self._calls[i, group] += 1

    def _exec(self, graph: int, reps: List[int]) -> None:
        for instr in self.exe.graphs[graph]["program"]:
            kind = instr["kind"]
            if kind == "op":
                (self._timed_op if self._profiling else self.memory.run_op)(instr, reps)
            elif kind == "copy":
                self._copy([(instr["src"], instr["dst"])], reps)
            elif kind == "call":
                self._copy(instr["copy_in"], reps)
                self._exec(instr["graph"], reps)
                self._copy(instr["copy_out"], reps)
            elif kind == "repeat":
                self._copy(instr["copy_in"], reps)
                for _ in range(instr["count"]):
                    self._exec(instr["graph"], reps)
                    for r in reps:  # parallel assignment: read every carried value first
                        v = self.memory.views[r]
                        vals = [v[src].copy() for src, _ in instr["carry"]]
                        for (_, dst), val in zip(instr["carry"], vals):
                            v[dst][...] = val
                self._copy(instr["copy_out"], reps)
            elif kind == "if":
                taken = {r: bool(self.memory.views[r][instr["cond"]].reshape(-1)[0]) for r in reps}
                for key, flag in (("then", True), ("else", False)):
                    sub = [r for r in reps if taken[r] is flag]
                    if sub:
                        br = instr[key]
                        self._copy(br["copy_in"], sub)
                        self._exec(br["graph"], sub)
                        self._copy(br["copy_out"], sub)
            elif kind == "host_load":
                self._host_transfer(instr, reps, load=True)
            elif kind == "host_store":
                self._host_transfer(instr, reps, load=False)
            else:
                raise RuntimeError(f"reference engine: unknown instruction kind {kind!r}")

    def _host_transfer(self, instr: Dict[str, Any], reps: List[int], load: bool) -> None:
        s = instr["stream"]
        counts, host = (self._loads, self._inputs) if load else (self._stores, self._outputs)
        for r in reps:
            k = counts[s, r] % host[s].shape[0]  # the next slice, after the last the first (PopART's StepIO)
            if load:
                self.memory.views[r][instr["output"]][...] = host[s][k, r]
            else:
                host[s][k, r] = self.memory.views[r][instr["input"]]
            counts[s, r] += 1
