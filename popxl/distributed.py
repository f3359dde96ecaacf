"""A Session's place in a launch of several instances (``Ir(replication="popdist")`` under poprun).

Each instance (process) runs the same program on its own replicas: global replicas ``[offset,
offset + local)``; replica groupings and collectives count every instance's replicas. This module
is what the Session needs on top of its engine for that:

- the engine learns the layout when the Session is made, and joins the other instances at attach,
  on communicators of the session's own (one for the native engine's collectives, one for the
  exchanges made from Python: the reference engine's collectives, reading weights);
- at attach the instances compare fingerprints of their executables (and layouts) and refuse to
  run programs that differ;
- a run that fails on one instance is reported (popdist's supervisor tells the others, whose
  collectives stop with ``popdist.InstanceError``);
- values that live on other instances' replicas (a group with no replica here, ``all_replicas``
  retrieval, shards of replica-sharded variables) are exchanged when the weights are read: every
  instance makes the same plan, so each knows what to send whom, and that exchange is collective
  only when some instance needs a value it does not hold.

With one instance everything here is a no-op.

This module is popxl's one door to popdist (a leaf beside popxl's layers that imports none of
them): ``Ir(replication="popdist")`` reaches the launch through ``popdist_launch`` (a hook of the
core, ``popxl._hooks``, set here), and popart reads ``launch_environment`` from here.
"""
from __future__ import annotations

import hashlib
import sys
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

import popdist
import popdist.backend
from popdist import LaunchEnvironment
from popdist.backend import InstanceError, failure_text
from popxl import _hooks
from popxl.errors import popart_exception

__all__ = ["Launch", "popdist_launch", "launch_environment", "LaunchEnvironment"]

def popdist_launch() -> Tuple[int, int, int]:
    """(this instance's replicas, its index, the instance count) of ``Ir(replication="popdist")``,
    as the launcher describes them (popdist); with several instances, popdist's communication
    backend starts here (MPI, poprun's supervisor)."""
    launch = popdist.launch_environment()
    if launch.num_instances > 1:
        popdist.init()
    return launch.num_local_replicas, launch.instance_index, launch.num_instances


_hooks.popdist_launch = popdist_launch


def launch_environment() -> LaunchEnvironment:
    """The launch this process is part of, as poprun describes it (``popdist.launch_environment``)."""
    return popdist.launch_environment()

# An entry of device state: what `read(entry, local replica)` reads (the Session decides; instances
# exchange entries, so they are picklable).
Entry = TypeVar("Entry", bound=Hashable)


class Launch:
    """One Session's view of the launch (``Ir._instances``)."""

    def __init__(self, ir: Any, exe: Any, engine: Any) -> None:
        self.index, self.count = ir._instances
        self.local = ir.instance_replication_factor
        self.global_replicas = ir.replication_factor
        self.offset = self.index * self.local
        self.backend: Optional[popdist.backend.Backend] = None  # with several instances only
        self._comms: List[Any] = []
        if self.count == 1:
            return
        self.backend = popdist.backend.get(self.index, self.count)
        engine.set_layout(self.index, self.count, self.local, self.global_replicas)
        layout = f"{self.count} instances x {self.local} replicas".encode()
        self.fingerprint = hashlib.sha256(exe.to_json().encode() + layout).hexdigest()
        self.engine_kind = f"{engine.name} engine (build {engine.build})"

    def owner(self, replica: int) -> int:
        """The instance running global replica ``replica``."""
        return replica // self.local

    def local_index(self, replica: int) -> Optional[int]:
        """This instance's index of global replica ``replica``, or None when another instance runs it."""
        return self._here(replica) if self.owner(replica) == self.index else None

    def _here(self, replica: int) -> int:
        """This instance's index of global replica ``replica``, which it runs."""
        return replica - self.offset

    # attach / detach ------------------------------------------------------------------------------
    def join(self, engine: Any, what: str) -> None:
        """Join the other instances (collective over all of them): new communicators, the programs
        compared, the engine linked."""
        backend = self.backend
        if backend is None:  # one instance
            return
        engine_comm = backend.new_comm(f"attaching {what}")
        self._comms = [engine_comm, backend.new_comm(f"attaching {what}")]
        everyone = backend.allgather(self._comms[1], (self.engine_kind, self.fingerprint), f"attaching {what}")
        kinds, prints = [k for k, _ in everyone], [p for _, p in everyone]
        other_engine = [i for i, k in enumerate(kinds) if k != kinds[0]]
        differ = [i for i, f in enumerate(prints) if f != prints[0]]
        if other_engine or differ:
            self.leave(engine)
        if other_engine:
            raise popart_exception(
                f"{what}: the instances run different engines: {', '.join(f'instance {i}: {k}' for i, k in enumerate(kinds))}. "
                f"Every instance must run the same engine and build (POPXL_ENGINE, and the same installation).")
        if differ:
            raise popart_exception(
                f"{what}: the instances run different programs: the executable of instance(s) {differ} differs from "
                f"instance 0's (fingerprints {', '.join(f'{i}: {p[:12]}' for i, p in enumerate(prints))}). Every "
                f"instance must build the same program (ops, shapes, constants, replication) in the same order.")
        engine.join(engine_comm, backend, self.gather_replicas)

    def leave(self, engine: Any) -> None:
        if not self._comms or self.backend is None:  # not joined
            return
        engine.leave()
        if not self.backend.MPI.Is_finalized():  # a Session detached at interpreter exit comes after MPI's end
            for comm in self._comms:
                comm.Free()
        self._comms = []

    # runs -----------------------------------------------------------------------------------------
    def guard(self, run: Callable[..., None]) -> Callable[..., None]:
        """``run`` (an engine's), reporting how it fails to the launch: with several instances a
        failed run leaves them out of step, so the others must stop too."""
        backend = self.backend
        if backend is None:  # one instance
            return run
        native = sys.modules.get("popxl._native")
        native_error = native.InstanceError if native is not None else InstanceError

        def guarded(*args: Any) -> None:
            try:
                run(*args)
            except InstanceError:
                raise
            except native_error as e:  # the C++ engine's: popdist's, and the supervisor is told
                raise backend.stopped(str(e).removeprefix("popdist: ")) from None
            except BaseException as e:
                backend.report_failure(failure_text(e, " in Session.run"))
                raise
        return guarded

    # values on other instances --------------------------------------------------------------------
    def gather_replicas(self, local: Dict[int, Any], what: str) -> Dict[int, Any]:
        """Every instance's ``{global replica: value}``, merged (a collective of all instances)."""
        assert self.backend is not None, "the engine gathers only after join (several instances)"
        merged: Dict[int, Any] = {}
        for part in self.backend.allgather(self._comms[1], local, what):
            merged.update(part)
        return merged

    def read(self, plan: Sequence[Tuple[Entry, Sequence[int]]], read: Callable[[Entry, int], np.ndarray],
             what: str) -> Dict[Entry, np.ndarray]:
        """The value of each ``(entry, candidate replicas)`` of ``plan``: read on a candidate replica of
        this instance (the first), else received from the instance running the first candidate. Every
        instance must pass the same plan; they exchange only if one of them holds no candidate of an
        entry, and then all of them must be reading."""
        def source(candidates: Sequence[int], instance: int) -> int:
            return next((r for r in candidates if self.owner(r) == instance), candidates[0])

        out = {entry: read(entry, self._here(source(c, self.index))) for entry, c in plan
               if self.owner(source(c, self.index)) == self.index}
        backend = self.backend
        if backend is None or all(self.owner(source(c, k)) == k for _, c in plan for k in range(self.count)):
            return out
        sends: Dict[int, Dict[Entry, np.ndarray]] = {}
        for k in range(self.count):
            for entry, c in plan:
                r = source(c, k)
                if k != self.index and self.owner(r) == self.index:
                    sends.setdefault(k, {})[entry] = read(entry, self._here(r))
        needs = {self.owner(source(c, self.index)) for entry, c in plan if entry not in out}
        others = [k for k in range(self.count) if k != self.index]
        got = backend.exchange(self._comms[1], {k: sends.get(k, {}) for k in others}, others, what)
        for k in needs:
            out.update(got[k])
        return out
