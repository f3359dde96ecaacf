"""The native engine: the C++ interpreter and kernels of ``popxl._native``.

The executable's program tree, copies, host transfers and every op with a native kernel run in
C++ with the GIL released. An op without a native kernel for its dtypes calls back into the
NumPy reference kernel (on views of the same arena), so every program runs; ``fallback_ops``
lists which ops took that path.
"""
from __future__ import annotations

from typing import List, Sequence

import weakref

import attrs
import numpy as np

from popxl.compiler.executable import Executable
from popxl.engines.reference import ReferenceEngine


class NativeEngine(ReferenceEngine):
    def __init__(self, exe: Executable, force_fallback: Sequence[str] = ()) -> None:
        super().__init__(exe)  # prepares the reference kernels used as fallbacks
        from popxl import _native

        self._op_instrs = [ins for g in exe.graphs for ins in g["program"] if ins["kind"] == "op"]
        # The C++ engine holds the callback; a weak reference avoids an uncollectable cycle through it.
        me = weakref.ref(self)
        fallback = lambda index, replicas: me()._fallback(index, replicas)  # noqa: E731
        self._engine = _native.Engine.load(attrs.asdict(exe), fallback, list(force_fallback))
        native = self._engine.native_kernels()
        self.fallback_ops = sorted({ins["type"] for ins, ok in zip(self._op_instrs, native) if not ok})

    def _fallback(self, index: int, replicas: List[int]) -> None:
        self._op(self._op_instrs[index], list(replicas))

    @property
    def attached(self) -> bool:
        return self._engine.attached

    def attach(self) -> None:
        self._engine.attach()  # allocates the arenas and writes the constants
        self._make_views([self._engine.arena(r) for r in range(self.replicas)])

    def detach(self) -> None:
        self._views, self._arenas = [], []
        self._engine.detach()

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        self._engine.run(inputs, outputs, self.exe.num_host_transfers)
