"""Engines run an Executable. ``native`` (C++, the default) is the fast one; ``reference`` (NumPy)
is the oracle that tests hold it against. ``POPXL_ENGINE=reference`` selects the oracle. Both
implement ``Engine`` (below) and share ``ArenaViews`` (engines/arena.py): NumPy views of device
memory and the ops' NumPy kernels (the reference engine's every op, the native engine's fallbacks).
"""
from __future__ import annotations

import os

from typing import Dict, Optional, Protocol, Sequence, Tuple

import numpy as np

from popxl.compiler.executable import Executable
from popxl.engines.native import NativeEngine
from popxl.engines.reference import ReferenceEngine

ENV_VAR = "POPXL_ENGINE"


class Engine(Protocol):
    """What the Session needs of an engine.

    - ``Engine(executable)``: load (prepare kernels and views); no device memory yet.
    - ``attach()`` / ``detach()``: allocate / release the device memory (one arena per replica);
      constants are written on attach; variable values are lost on detach.
    - ``write_variable`` / ``read_variable`` (a copy) / ``variable_view`` (read-only, no copy), by
      index into ``executable.variables`` and replica.
    - ``run(inputs, outputs)``: run the main program once. ``inputs[i]`` / ``outputs[i]`` are the
      host buffers of ``executable.h2d[i]`` / ``d2h[i]``: C-contiguous arrays of the stream's dtype
      holding ``(num_host_transfers, replicas, *shape)`` elements, in any shape of that size (the
      user's own arrays, unreshaped). When the executable has a static program (``static_graph``), ``run`` first runs it,
      for all replicas, whenever variables may have changed since it last ran: after ``attach`` and
      after any ``write_variable``. Device variables are written only through ``write_variable``;
      an engine may rely on that to keep values derived from static storage between runs. A run in
      which a stream was transferred other than ``num_host_transfers`` times raises after it
      (``RuntimeError``, naming the stream). A run on Python's main thread stops between two
      program steps with the exception a signal handler raised (Ctrl-C's ``KeyboardInterrupt``),
      memory as the last completed step left it; the engine stays attached and usable. Engines are
      not thread-safe: the Session lets one call in at a time.
    - Optionally ``exact_runner(in_layout, out_streams, out_makers)``: ``Session.run``'s fast path, a
      callable running on ``{stream: array}`` dicts that already hold exactly what ``run`` takes, else
      returning None (the native engine's is C++; without one, every run takes the session's checks).
    - ``profiling`` (settable; setting resets), ``reset_profile()``, ``op_profile()``: per-op timers,
      ``{(graph, instruction): (seconds per replica, calls per replica)}`` for the ops that ran.
    - Several instances (``popxl.distributed``): ``set_layout(index, count, local, global_replicas)``
      once, after loading (the executable's replicas are this instance's; groupings count all);
      ``join(comm, backend, gather)`` after attach and ``leave()`` (detach leaves too): collectives
      whose groups span instances exchange data with them, with the same results as one process
      running every replica.
    """

    name: str
    replicas: int
    profiling: bool

    @property
    def op_positions(self) -> Sequence[Tuple[int, int]]: ...

    @property
    def attached(self) -> bool: ...

    @property
    def scratch_bytes(self) -> int: ...

    def attach(self) -> None: ...

    def detach(self) -> None: ...

    def write_variable(self, index: int, replica: int, value: np.ndarray) -> None: ...

    def read_variable(self, index: int, replica: int) -> np.ndarray: ...

    def variable_view(self, index: int, replica: int) -> np.ndarray: ...

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None: ...

    def reset_profile(self) -> None: ...

    def op_profile(self) -> Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray]]: ...


def create_engine(exe: Executable, name: Optional[str] = None) -> Engine:
    """The engine named by ``name``, else by the ``POPXL_ENGINE`` environment variable, else ``native``."""
    name = name or os.environ.get(ENV_VAR, "native")
    if name == "native":
        return NativeEngine(exe)
    if name == "reference":
        return ReferenceEngine(exe)
    raise ValueError(f"Unknown engine {name!r} (from {ENV_VAR}); available: 'native', 'reference'.")
