"""The reference engine: runs an Executable with the NumPy kernels of the op registry.

It is deliberately simple: every buffer is a NumPy view into one uint8 arena per replica, laid
out exactly as the memory plan says, so a wrong plan shows up as wrong numbers here too.
Replicas run in lockstep, instruction by instruction; collectives see all replicas at once.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from popxl import dtypes
from popxl.compiler.executable import Executable, decode_attr
from popxl.op import REGISTRY


class ReferenceEngine:
    name = "reference"

    def __init__(self, exe: Executable) -> None:
        self.exe = exe
        self.replicas = exe.replication_factor
        self._np_dtypes = [dtypes.ml_dtype(dtypes.dtype.from_name(b["dtype"])) for b in exe.buffers]
        # Decode each op instruction's kernel and attributes once, at load.
        self._prepared: Dict[int, tuple] = {}
        for g in exe.graphs:
            self._prepare(g["program"])
        # (graph, instruction) of every op instruction, in program order: the kernel numbering
        # the native engine uses too, and the keys of ``op_profile``.
        self.op_positions: List[Tuple[int, int]] = [(gi, k) for gi, g in enumerate(exe.graphs)
                                                    for k, ins in enumerate(g["program"]) if ins["kind"] == "op"]
        self._position_of = {id(exe.graphs[gi]["program"][k]): i for i, (gi, k) in enumerate(self.op_positions)}
        self._arenas: List[np.ndarray] = []
        self._views: List[List[np.ndarray]] = []
        self._profiling = False
        ReferenceEngine.reset_profile(self)  # this class's timers (a subclass may keep its own)

    def _prepare(self, program: Sequence[Dict]) -> None:
        for instr in program:
            if instr["kind"] == "op":
                opdef = REGISTRY.get(instr["type"])
                if opdef is None or (opdef.reference is None):
                    raise NotImplementedError(f"reference engine: no kernel for op {instr['type']!r}")
                attrs = {k: decode_attr(v) for k, v in instr["attrs"].items()}
                self._prepared[id(instr)] = (opdef, attrs)

    # device memory --------------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return bool(self._arenas)

    @property
    def scratch_bytes(self) -> int:
        """Device memory the kernels use beyond the arena while they run (none here)."""
        return 0

    def attach(self) -> None:
        self._make_views([np.zeros(max(self.exe.arena_bytes, 1), np.uint8) for _ in range(self.replicas)])
        for c in self.exe.constants:
            for views in self._views:
                v = views[c["buffer"]]
                v[...] = np.frombuffer(c["data"], dtype=v.dtype).reshape(v.shape)

    def _make_views(self, arenas: List[np.ndarray]) -> None:
        """One NumPy view per buffer per replica, straight onto the arena bytes."""
        self._arenas = arenas
        self._views = [[np.ndarray(b["shape"], dtype=dt, buffer=arena, offset=b["offset"], strides=b["strides"])
                        for b, dt in zip(self.exe.buffers, self._np_dtypes)] for arena in arenas]

    def detach(self) -> None:
        self._arenas, self._views = [], []

    def write_variable(self, index: int, replica: int, value: np.ndarray) -> None:
        view = self._views[replica][self.exe.variables[index]["buffer"]]
        view[...] = value

    def read_variable(self, index: int, replica: int) -> np.ndarray:
        return self._views[replica][self.exe.variables[index]["buffer"]].copy()

    def variable_view(self, index: int, replica: int) -> np.ndarray:
        """A read-only view of a variable's device memory (valid until the next run or detach)."""
        view = self._views[replica][self.exe.variables[index]["buffer"]].view()
        view.flags.writeable = False
        return view

    # execution ------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        self._inputs, self._outputs = inputs, outputs
        self._loads = np.zeros((len(inputs), self.replicas), np.int64)
        self._stores = np.zeros((len(outputs), self.replicas), np.int64)
        reps = list(range(self.replicas))
        if self.exe.static_graph >= 0:  # every time: the oracle caches nothing
            self._exec(self.exe.static_graph, reps)
        self._exec(0, reps)
        self._check_transfer_counts()

    def _check_transfer_counts(self) -> None:
        """Every stream must have been transferred exactly num_host_transfers times (a program whose
        count depends on conditionals can only be checked after the run)."""
        for load, counts, host, meta in ((True, self._loads, self._inputs, self.exe.h2d),
                                         (False, self._stores, self._outputs, self.exe.d2h)):
            for s, r in zip(*np.nonzero(counts != np.array([h.shape[0] for h in host], np.int64)[:, None])):
                where = f" on replica {r}" if self.replicas > 1 else ""
                raise RuntimeError(
                    f"{'host_load' if load else 'host_store'} of stream {meta[s]['name']!r} ran {counts[s, r]} "
                    f"time(s) in this run{where}, but num_host_transfers={host[s].shape[0]}: every stream must be "
                    f"transferred exactly num_host_transfers times per run (the count depends on which branches "
                    f"of ops.conditional ran).")

    def _copy(self, pairs, reps) -> None:
        for r in reps:
            v = self._views[r]
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
        groups = [reps] if self._prepared[id(instr)][0].collective else [[r] for r in reps]
        for group in groups:
            start = time.perf_counter()
            self._op(instr, group)
            self._seconds[i, group] += (time.perf_counter() - start) / len(group)
            self._calls[i, group] += 1

    def _exec(self, graph: int, reps: List[int]) -> None:
        for instr in self.exe.graphs[graph]["program"]:
            kind = instr["kind"]
            if kind == "op":
                (self._timed_op if self._profiling else self._op)(instr, reps)
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
                        v = self._views[r]
                        vals = [v[src].copy() for src, _ in instr["carry"]]
                        for (_, dst), val in zip(instr["carry"], vals):
                            v[dst][...] = val
                self._copy(instr["copy_out"], reps)
            elif kind == "if":
                taken = {r: bool(self._views[r][instr["cond"]].reshape(-1)[0]) for r in reps}
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
        counts, host, meta = (self._loads, self._inputs, self.exe.h2d) if load else \
            (self._stores, self._outputs, self.exe.d2h)
        for r in reps:
            k = counts[s, r]
            if k >= host[s].shape[0]:
                raise RuntimeError(
                    f"{'host_load' if load else 'host_store'} of stream {meta[s]['name']!r} ran more than "
                    f"num_host_transfers={host[s].shape[0]} times in one run; raise ir.num_host_transfers.")
            if load:
                self._views[r][instr["output"]][...] = host[s][k, r]
            else:
                host[s][k, r] = self._views[r][instr["input"]]
            counts[s, r] = k + 1

    def _op(self, instr: Dict[str, Any], reps: List[int]) -> None:
        opdef, attrs = self._prepared[id(instr)]
        ins, outs = instr["inputs"], instr["outputs"]
        if opdef.collective:
            results = opdef.reference([[self._views[r][i] for i in ins] for r in reps], replicas=reps, **attrs)
            per_rep = zip(reps, results)
        else:
            per_rep = ((r, opdef.reference(*[self._views[r][i] for i in ins], **attrs)) for r in reps)
        for r, res in per_rep:
            res = res if isinstance(res, (tuple, list)) else (res,)
            for o, val in zip(outs, res):
                dst = self._views[r][o]
                val = np.asarray(val)
                if val.shape != dst.shape or val.dtype != dst.dtype:
                    raise RuntimeError(
                        f"reference kernel of {instr['type']!r} ({instr.get('name')}) returned {val.shape} "
                        f"{val.dtype}, expected {dst.shape} {dst.dtype}")
                dst[...] = val
