"""The native engine: the C++ interpreter and kernels of ``popxl._native``.

The executable's program tree, copies, host transfers and every op with a native kernel run in
C++ with the GIL released. An op without a native kernel for its dtypes calls back into the
NumPy reference kernel (on views of the same arena), so every program runs; ``fallback_ops``
lists which ops took that path.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Sequence, Tuple

import weakref

import attrs
import numpy as np

from popxl.compiler.executable import Executable
from popxl.engines.reference import ReferenceEngine


def _import_native():
    """``popxl._native``, its OpenBLAS (which it links) loaded with OPENBLAS_NUM_THREADS=1: the
    kernels split GEMMs over OpenMP threads themselves, and a BLAS thread pool started at load
    would spin on a core for a while. The variable is restored at once, so a BLAS loaded later
    (SciPy's, say) still sees the user's setting."""
    if "popxl._native" in sys.modules:
        return sys.modules["popxl._native"]
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        from popxl import _native
    finally:
        if saved is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved
    return _native


class NativeEngine(ReferenceEngine):
    name = "native"

    def __init__(self, exe: Executable, force_fallback: Sequence[str] = ()) -> None:
        super().__init__(exe)  # prepares the reference kernels used as fallbacks
        _native = _import_native()

        self._op_instrs = [exe.graphs[gi]["program"][k] for gi, k in self.op_positions]  # kernel order
        # The C++ engine holds the callback; a weak reference avoids an uncollectable cycle through it.
        me = weakref.ref(self)
        fallback = lambda index, replicas: me()._fallback(index, replicas)  # noqa: E731
        self._engine = _native.Engine.load(attrs.asdict(exe), fallback, list(force_fallback))
        native = self._engine.native_kernels()
        self.fallback_ops = sorted({ins["type"] for ins, ok in zip(self._op_instrs, native) if not ok})

    def _fallback(self, index: int, replicas: List[int]) -> None:
        self._op(self._op_instrs[index], list(replicas))

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
        self._make_views([self._engine.arena(r) for r in range(self.replicas)])

    def detach(self) -> None:
        self._views, self._arenas = [], []
        self._engine.detach()

    def write_variable(self, index: int, replica: int, value: np.ndarray) -> None:
        super().write_variable(index, replica, value)
        self._engine.variables_written()  # the static program and kernels' derived values are stale

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        self._engine.run(inputs, outputs, self.exe.num_host_transfers)
