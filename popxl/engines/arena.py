"""Device memory seen from NumPy, shared by both engines: a view of every buffer of an executable
onto each replica's arena, variables read and written through them, and the op registry's NumPy
kernels run on them (all of the reference engine's ops; the native engine's fallback ops)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from popxl import dtypes
from popxl.compiler.executable import Executable, decode_attr
from popxl.compiler.instructions import check_op_attrs
from popxl.op import REGISTRY

__all__ = ["ArenaViews"]


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


class ArenaViews:
    """NumPy views of ``exe``'s buffers on bound arenas, and its op instructions' NumPy kernels.

    ``op_positions`` lists (graph, instruction) of every op instruction in program order: the
    kernel numbering the native engine uses, and the keys of engines' ``op_profile``."""

    def __init__(self, exe: Executable) -> None:
        self.exe = exe
        check_op_attrs(exe.graphs, exe.op_attrs)
        self._np_dtypes = [dtypes.ml_dtype(dtypes.dtype.from_name(b["dtype"])) for b in exe.buffers]
        # Each op instruction's kernel and decoded attributes, prepared once.
        self._prepared: Dict[int, Tuple[Any, Dict[str, Any]]] = {}
        self.op_positions: List[Tuple[int, int]] = []
        for gi, g in enumerate(exe.graphs):
            for k, instr in enumerate(g["program"]):
                if instr["kind"] != "op":
                    continue
                opdef = REGISTRY.get(instr["type"])
                if opdef is None or opdef.reference is None:
                    raise NotImplementedError(f"no NumPy kernel for op {instr['type']!r}")
                self._prepared[id(instr)] = (opdef, {k_: decode_attr(v) for k_, v in instr["attrs"].items()})
                self.op_positions.append((gi, k))
        self.views: List[List[np.ndarray]] = []  # [replica][buffer]
        # Several instances: the global index of this instance's replica 0, and how to gather every
        # instance's {global replica: inputs} for a collective (popxl.distributed.Launch.gather_replicas).
        self.replica_offset = 0
        self._gather: Optional[Callable[[Dict[int, Any], str], Dict[int, Any]]] = None

    # arenas -----------------------------------------------------------------------------------------
    def bind(self, arenas: Sequence[np.ndarray]) -> None:
        """View every buffer on each replica's arena (uint8 arrays that outlive the binding)."""
        self.views = [[np.ndarray(b["shape"], dtype=dt, buffer=arena, offset=b["offset"], strides=b["strides"])
                       for b, dt in zip(self.exe.buffers, self._np_dtypes)] for arena in arenas]

    def unbind(self) -> None:
        self.views = []

    def write_constants(self) -> None:
        for c in self.exe.constants:
            for views in self.views:
                v = views[c["buffer"]]
                v[...] = np.frombuffer(c["data"], dtype=v.dtype).reshape(v.shape)

    # variables --------------------------------------------------------------------------------------
    def _variable(self, index: int, replica: int) -> np.ndarray:
        return self.views[replica][self.exe.variables[index]["buffer"]]

    def write_variable(self, index: int, replica: int, value: np.ndarray) -> None:
        self._variable(index, replica)[...] = value

    def read_variable(self, index: int, replica: int) -> np.ndarray:
        return self._variable(index, replica).copy()

    def variable_view(self, index: int, replica: int) -> np.ndarray:
        """A read-only view of a variable's device memory (valid until the next run or detach)."""
        view = self._variable(index, replica).view()
        view.flags.writeable = False
        return view

    # other instances ----------------------------------------------------------------------------------
    def join(self, gather: Callable[[Dict[int, Any], str], Dict[int, Any]]) -> None:
        """Collectives span the instances: each gathers every instance's inputs and runs its NumPy
        kernel over all replicas, in the same order as one process running them all would."""
        self._gather = gather

    def leave(self) -> None:
        self._gather = None

    # ops --------------------------------------------------------------------------------------------
    def is_collective(self, instr: Dict[str, Any]) -> bool:
        return self._prepared[id(instr)][0].collective

    def run_op(self, instr: Dict[str, Any], reps: Sequence[int]) -> None:
        """Run op instruction ``instr``'s NumPy kernel for replicas ``reps`` (a collective sees them
        all at once) and write its results into its output views."""
        opdef, attrs = self._prepared[id(instr)]
        ins, outs = instr["inputs"], instr["outputs"]
        views = self.views
        # A kernel gets its inputs read-only (a write into one would change a variable, say), but
        # for a remote buffer's region (the last input of remote ops), which remote_store writes.
        writable = len(ins) - 1 if "remote_buffer" in attrs else -1

        def inputs(r: int) -> List[np.ndarray]:
            return [views[r][i] if k == writable else _read_only(views[r][i]) for k, i in enumerate(ins)]
        if opdef.collective and self._gather is not None:
            offset = self.replica_offset
            everyone = self._gather({offset + r: [np.array(views[r][i]) for i in ins] for r in reps},
                                    f"{instr['type']} {instr.get('name')!r}")
            order = sorted(everyone)
            results = dict(zip(order, opdef.reference([everyone[g] for g in order], replicas=order, **attrs)))
            per_rep: Iterable[Tuple[int, Any]] = ((r, results[offset + r]) for r in reps)
        elif opdef.collective:
            results = opdef.reference([inputs(r) for r in reps], replicas=list(reps), **attrs)
            per_rep = zip(reps, results)
        else:
            per_rep = ((r, opdef.reference(*inputs(r), **attrs)) for r in reps)
        for r, res in per_rep:
            res = res if isinstance(res, (tuple, list)) else (res,)
            if len(res) != len(outs):
                raise RuntimeError(
                    f"NumPy kernel of {instr['type']!r} ({instr.get('name')}) returned {len(res)} value(s), "
                    f"expected {len(outs)} (one per output of the op)")
            for o, val in zip(outs, res):
                dst = views[r][o]
                val = np.asarray(val)
                if val.shape != dst.shape or val.dtype != dst.dtype:
                    raise RuntimeError(
                        f"NumPy kernel of {instr['type']!r} ({instr.get('name')}) returned {val.shape} "
                        f"{val.dtype}, expected {dst.shape} {dst.dtype}")
                dst[...] = val
