"""Engines run an Executable. ``native`` (C++, the default) is the fast one; ``reference`` (NumPy)
is the oracle that tests hold it against. ``POPXL_ENGINE=reference`` selects the oracle.

Every engine offers the same small interface, used by the Session:

- ``Engine(executable)``: load (prepare kernels and views); no device memory yet.
- ``attach()`` / ``detach()``: allocate / release the device memory (one arena per replica);
  constants are written on attach; variable values are lost on detach.
- ``write_variable(index, replica, array)`` / ``read_variable(index, replica) -> array`` (a copy);
  ``variable_view(index, replica) -> array`` (read-only, no copy); ``scratch_bytes``: device
  memory the kernels use beyond the arena while they run.
- ``run(inputs, outputs)``: run the main program once. ``inputs[i]`` / ``outputs[i]`` are the
  host buffers of ``executable.h2d[i]`` / ``d2h[i]``, shaped ``(num_host_transfers, replicas, *shape)``.
  When the executable has a static program (``static_graph``), ``run`` first runs it, for all
  replicas, whenever variables may have changed since it last ran: after ``attach`` and after
  any ``write_variable``. A run in which a stream was transferred other than
  ``num_host_transfers`` times raises after it (``RuntimeError``, naming the stream). A run on
  Python's main thread stops between two program steps with the exception a signal handler raised
  (Ctrl-C's ``KeyboardInterrupt``), memory as the last completed step left it; the engine stays
  attached and usable. Engines are not thread-safe: the Session lets one call in at a time. Device variables are written only through ``write_variable``; an
  engine may rely on that to keep values derived from static storage between runs.
- ``profiling`` (settable; setting resets), ``reset_profile()``, ``op_profile()``: per-op timers,
  ``{(graph, instruction): (seconds per replica, calls per replica)}`` for the ops that ran.
"""
from __future__ import annotations

import os

from popxl.compiler.executable import Executable

ENV_VAR = "POPXL_ENGINE"


def create_engine(exe: Executable, name: str = None):
    """The engine named by ``name``, else by the ``POPXL_ENGINE`` environment variable, else ``native``."""
    name = name or os.environ.get(ENV_VAR, "native")
    if name == "native":
        from popxl.engines.native import NativeEngine
        return NativeEngine(exe)
    if name == "reference":
        from popxl.engines.reference import ReferenceEngine
        return ReferenceEngine(exe)
    raise ValueError(f"Unknown engine {name!r} (from {ENV_VAR}); available: 'native', 'reference'.")
