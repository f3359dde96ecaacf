"""The native engine: the C++ interpreter and kernels of ``popxl._native``.

The executable's program tree, copies, host transfers and every op with a native kernel run in
C++ with the GIL released. An op without a native kernel for its dtypes calls back into the
NumPy reference kernel (on views of the same arena), so every program runs; ``fallback_ops``
lists which ops took that path.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
from typing import Any, Callable, Dict, List, Sequence, Tuple

import weakref

import attrs
import numpy as np

from popxl.compiler.executable import VERSION, Executable
from popxl.engines.arena import ArenaViews


# How long (in spins, ~25 us here) an idle OpenMP thread waits busily before it sleeps. Only
# oneDNN's kernels (convolutions, pooling) run on libgomp's team; the engine's own kernels have a
# team of their own that spins during runs and gives way (native/src/threads.hpp). libgomp's
# default, 300,000 spins (milliseconds), is ruinous on a busy machine, where a thread spinning at a
# barrier takes the core its partner needs to finish (mlp_big with one other busy process: ~60 ->
# ~90 steps/s at 1,000 spins, when all kernels ran on libgomp's team).
_GOMP_SPINCOUNT = "1000"


def _import_native():
    """``popxl._native``, loaded with the settings its libraries read once, at load, and only then:

    - OPENBLAS_NUM_THREADS=1 for its OpenBLAS: the kernels split GEMMs over the engine's threads
      themselves, and a BLAS thread pool started at load would spin on a core for a while;
    - GOMP_SPINCOUNT (see ``_GOMP_SPINCOUNT``) for libgomp, unless the user set OMP_WAIT_POLICY or
      GOMP_SPINCOUNT. The OpenMP runtime is one per process: a library that loaded it earlier
      (PyTorch, say) keeps its settings, and one that loads after popxl shares popxl's.

    The variables are restored at once, so libraries loaded later (SciPy's BLAS, say) still see the
    user's environment."""
    _native = sys.modules.get("popxl._native")
    if _native is None:
        _native = _load_native()
    # A forked child (multiprocessing's "fork", DataLoader workers) runs its engines single-threaded:
    # the parent's threads do not exist there (a region of libgomp's would hang). Set
    # once, whoever imported the module first (``import popxl._native`` does not come here).
    global _FORK_HANDLER_SET, _BLAS_SET
    if not _FORK_HANDLER_SET:
        os.register_at_fork(after_in_child=_native.after_fork_in_child)
        _FORK_HANDLER_SET = True
    if not _BLAS_SET:
        _set_blas(_native, os.environ.get("POPXL_BLAS", ""))
        _BLAS_SET = True
    return _native


_FORK_HANDLER_SET = False
_BLAS_SET = False


def _set_blas(native: Any, name: str) -> None:
    """POPXL_BLAS (``auto``, ``openblas`` or ``mkl``; unset: ``auto``) chooses the library whose
    sgemm takes the float32 products: by default MKL on Intel CPUs where the ``mkl`` package loads,
    else OpenBLAS (docs/guide/engine.md)."""
    try:
        native.set_blas(name or "auto")
    except ValueError as e:
        raise ValueError(f"POPXL_BLAS={name!r}: {e}") from None


def _load_native() -> Any:
    """Import ``popxl._native`` with the environment ``_import_native`` describes."""
    load_env = {"OPENBLAS_NUM_THREADS": "1"}
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        load_env["GOMP_SPINCOUNT"] = _GOMP_SPINCOUNT
    saved = {k: os.environ.get(k) for k in load_env}
    os.environ.update(load_env)
    try:
        # The compiled engine: a leaf (it imports nothing of popxl's), loaded here, once the environment
        # is set, and by name: `from popxl import _native` would read as an import of popxl's root
        # package, which imports every layer (import-linter and mypy would see a cycle).
        _native = importlib.import_module("popxl._native")
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    return _native


@functools.lru_cache(maxsize=None)
def _build_id() -> str:
    """A digest of the native extension's file: instances of one launch must run the same build."""
    digest = hashlib.sha256()
    with open(_import_native().__file__, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


class NativeEngine:
    name = "native"

    @property
    def build(self) -> str:
        """Which build of the engine this is (a digest of the extension module)."""
        return _build_id()

    run: Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]  # see Engine.run

    def __init__(self, exe: Executable, force_fallback: Sequence[str] = ()) -> None:
        self.exe = exe
        self.replicas = exe.replication_factor
        self.memory = ArenaViews(exe)  # buffer views and NumPy kernels, for the fallback ops
        self.op_positions = self.memory.op_positions
        _native = _import_native()
        if _native.abi_version() != VERSION:
            raise RuntimeError(
                f"popxl._native implements executable version {_native.abi_version()}, but this popxl writes "
                f"version {VERSION}: the native extension is stale. Rebuild it: pip install -e . (in the "
                f"source tree).")

        self._op_instrs = [exe.graphs[gi]["program"][k] for gi, k in self.op_positions]  # kernel order
        # The C++ engine holds the callback; a weak reference avoids an uncollectable cycle through it.
        me = weakref.ref(self)

        def fallback(index: int, replicas: Any) -> Any:
            engine = me()
            assert engine is not None  # the C++ engine calling this is this object's, so it is alive
            return engine._fallback(index, replicas)
        self._engine = _native.Engine.load(attrs.asdict(exe, recurse=False), fallback, list(force_fallback))
        self._engine.transfers = exe.num_host_transfers
        # run(inputs, outputs) is the extension's own method: no Python frame between Session.run and
        # C++ (a run on Python's main thread stops for signals, Ctrl-C, between program steps).
        self.run = self._engine.run
        native = self._engine.native_kernels()
        self.fallback_ops = sorted({ins["type"] for ins, ok in zip(self._op_instrs, native) if not ok})

    def exact_runner(self, in_layout: Sequence[Tuple[Any, np.dtype, tuple]], out_streams: Sequence[Any],
                     out_makers: Sequence[Tuple[Callable[..., np.ndarray], tuple]]) -> Callable[..., Any]:
        """Session.run's fast path in C++: ``runner(inputs, outputs=None)`` runs on dicts that already hold
        exactly what ``run`` takes (per stream of ``in_layout`` ``(stream, dtype, host shape)``, in the
        engine's order, a C-contiguous NumPy array of that dtype and shape; outputs writable, or made by
        ``out_makers`` ``(callable, args)`` and returned as ``{stream: array}``), else returns None without
        running."""
        templates = [np.empty(shape, dtype) for _, dtype, shape in in_layout]
        return _import_native().ExactRunner(self._engine, [s for s, _, _ in in_layout], templates,
                                            list(out_streams), list(out_makers))

    def kernel_algorithms(self) -> List[Tuple[str, str]]:
        """(op type, algorithm) of each op instruction's kernel, in program order, where the kernel
        chooses how it computes (a convolution: ``"winograd F(4x4,3x3)"`` or oneDNN's implementation
        name); an empty string otherwise."""
        return [(ins["type"], a) for ins, a in zip(self._op_instrs, self._engine.kernel_algorithms())]

    def _fallback(self, index: int, replicas: List[int]) -> None:
        self.memory.run_op(self._op_instrs[index], list(replicas))

    # profiling: the C++ engine's own per-op timers (a fallback op is timed there too, callback included)
    @property
    def profiling(self) -> bool:
        return self._engine.profiling

    @profiling.setter
    def profiling(self, on: bool) -> None:
        self._engine.profiling = bool(on)

    def reset_profile(self) -> None:
        self._engine.reset_profile()

    def op_profile(self) -> Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray]]:
        seconds, calls = self._engine.op_profile()
        seconds = np.asarray(seconds).reshape(-1, self.replicas)
        calls = np.asarray(calls, np.int64).reshape(-1, self.replicas)
        return {pos: (seconds[i], calls[i]) for i, pos in enumerate(self.op_positions) if calls[i].any()}

    # device memory ----------------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return self._engine.attached

    @property
    def scratch_bytes(self) -> int:
        """The one scratch region every kernel shares while it runs (oneDNN scratchpads, operands
        reordered into a primitive's layout, float16 staging), allocated at attach beside the arena."""
        return self._engine.scratch_bytes

    def attach(self) -> None:
        self._engine.attach()  # allocates the arenas and writes the constants
        self.memory.bind([self._engine.arena(r) for r in range(self.replicas)])

    def detach(self) -> None:
        self.memory.unbind()
        self.memory.leave()
        self._engine.detach()  # leaves the other instances too

    # other instances (popxl.distributed) ------------------------------------------------------------
    def set_layout(self, index: int, count: int, local: int, global_replicas: int) -> None:
        self._engine.set_layout(index, count, local, global_replicas)
        self.memory.replica_offset = index * local

    def join(self, comm: Any, backend: Any, gather: Callable) -> None:
        """Collectives reach the other instances: the C++ ones over MPI communicator ``comm`` (from the
        run loop), NumPy fallbacks through ``gather``; ``backend`` (popdist's) says what it knows of
        the other instances and how long a wait may last."""
        backend.push_states(_import_native())
        self._engine.join(comm.handle, backend.timeout)
        self.memory.join(gather)

    def leave(self) -> None:
        self._engine.leave()
        self.memory.leave()

    def write_variable(self, index: int, replica: int, value: np.ndarray) -> None:
        self.memory.write_variable(index, replica, value)
        self._engine.variables_written()  # the static program and kernels' derived values are stale

    def read_variable(self, index: int, replica: int) -> np.ndarray:
        return self.memory.read_variable(index, replica)

    def variable_view(self, index: int, replica: int) -> np.ndarray:
        """A read-only view of a variable's device memory (valid until the next run or detach)."""
        return self.memory.variable_view(index, replica)

    def transfer_counts(self) -> Tuple[np.ndarray, np.ndarray]:
        """(host_load counts, host_store counts) of the last run, each (streams, replicas)."""
        loads, stores = self._engine.transfer_counts()
        return (np.asarray(loads, np.int64).reshape(len(self.exe.h2d), self.replicas),
                np.asarray(stores, np.int64).reshape(len(self.exe.d2h), self.replicas))

