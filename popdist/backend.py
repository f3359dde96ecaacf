"""The communication backend of a multi-instance launch, started by ``popdist.init()`` (and by
``Ir(replication="popdist")`` when the launch has several instances).

- **MPI** between the instances: mpi4py over the mpich wheel's libmpi, started here with thread
  support (the native engine calls MPI from its own run loop; it finds the same library in the
  process). Every instance must be MPI rank ``instance index`` of ``num_instances``, as poprun
  launches them.
- **Failures**: a connection to poprun's supervisor (popdist/supervisor.py) says which instance
  failed or finished; an uncaught exception here is reported there before the traceback is printed,
  and the process waits (a few seconds at most) until the others have reacted before it exits.
- **Waits that end**: every exchange this module makes, and every collective of the native engine,
  stops with ``InstanceError`` when an instance failed, when the instance it waits for has finished,
  or after the collective timeout (``POPDIST_TIMEOUT`` seconds, default 600; 0: none).

At exit, MPI is finalised only if no instance failed (finalising waits for every instance, and a
dead one never comes).
"""
from __future__ import annotations

import atexit
import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from popdist.supervisor import SupervisorClient

__all__ = ["InstanceError", "Backend", "get", "TIMEOUT_VAR", "DEFAULT_TIMEOUT"]

TIMEOUT_VAR = "POPDIST_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
GRACE_VAR = "POPRUN_GRACE"  # how long a failed instance waits for the others to react (seconds)

# How long after an instance said its program ended a wait for it may still complete: a send it
# completed only means MPI holds the data, which may reach us later (native/src/instances.cpp too).
FINISHED_GRACE = 2.0

_PEER_CODES = {"running": 0, "finished": 1, "failed": 2}
# Set in the processes an MPI launcher starts (Hydra's PMI, PMIx, Open MPI's).
_LAUNCHED_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


class InstanceError(RuntimeError):
    """An instance of a multi-instance launch cannot go on because of another instance (or of its
    own earlier failure): the message names the instance and why."""


def _timeout(env: Dict[str, str]) -> float:
    text = env.get(TIMEOUT_VAR, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"popdist: {TIMEOUT_VAR}={text!r} is not a number of seconds.") from None
    if value < 0:
        raise ValueError(f"popdist: {TIMEOUT_VAR}={value} must be >= 0 (0: no timeout).")
    return value


def _start_mpi() -> Tuple[Any, bool]:
    """(mpi4py's MPI module, whether we finalise it ourselves)."""
    owns_finalize = "mpi4py.MPI" not in sys.modules
    import mpi4py  # noqa: PLC0415  (optional: only a launch over MPI needs it)
    if owns_finalize:
        mpi4py.rc.finalize = False  # see _at_exit
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI  # noqa: PLC0415  (after mpi4py.rc is set: importing MPI starts it)
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("popdist: MPI was started without MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level); the "
                           "native engine calls MPI from its own thread.")
    return MPI, owns_finalize


def _where(tb: Any) -> str:
    """file:line of the innermost frame of a traceback."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    return f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


def failure_text(exc: BaseException, where: str = "") -> str:
    """How an instance's failure reads to the others and to poprun: what it raised (or that it was
    interrupted), then ``where``."""
    if isinstance(exc, KeyboardInterrupt):
        return f"was interrupted (KeyboardInterrupt){where}"
    return f"raised {type(exc).__name__}: {exc}{where}"


class Backend:
    """This process's side of the launch (one per process: ``get()``)."""

    def __init__(self, instance_index: int, num_instances: int, env: Optional[Dict[str, str]] = None) -> None:
        env = dict(os.environ if env is None else env)
        self.index, self.count = instance_index, num_instances
        self.timeout = _timeout(env)
        mismatch = (f"popdist: the launch environment (POPDIST_*) makes this process instance {instance_index} of "
                    f"{num_instances}, but MPI says rank {{}} of {{}}: start the program with poprun (or with mpiexec, "
                    f"one rank per instance and each rank's POPDIST_* set for it).")
        if not any(name in env for name in _LAUNCHED_VARS):  # no MPI launcher started us: do not start MPI
            raise ValueError(mismatch.format(0, 1))
        self.MPI, self._owns_finalize = _start_mpi()
        world = self.MPI.COMM_WORLD
        if (world.Get_rank(), world.Get_size()) != (instance_index, num_instances):
            raise ValueError(mismatch.format(world.Get_rank(), world.Get_size()))
        self.world = world
        self._lock = threading.Lock()
        self._states: Dict[int, Tuple[str, str]] = {}  # other instances: (state, message)
        self._finished_at: Dict[int, float] = {}  # when an instance said its program ended (time.monotonic)
        self._own: Optional[str] = None  # this instance's failure, once reported
        self._stopped = False  # this instance stopped because of another (it must not wait for them at exit)
        self._abandoned: List[Any] = []  # requests (and their buffers) of exchanges given up: never freed
        self._client = None
        address = env.get("POPRUN_SUPERVISOR")
        if address:
            self._client = SupervisorClient(address, env.get("POPRUN_TOKEN", ""), instance_index, self._notice)
        self._grace = float(env.get(GRACE_VAR, "5") or 5)
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)

    # what is known of the other instances -------------------------------------------------------
    def _notice(self, index: int, state: str, message: str) -> None:
        """A notice from the supervisor (its reader thread)."""
        with self._lock:
            self._states[index] = (state, message)
            if state == "finished":
                self._finished_at[index] = time.monotonic()
        native = sys.modules.get("popxl._native")
        if native is not None:
            native.set_peer_state(index, _PEER_CODES.get(state, 2), message)

    def push_states(self, native: Any) -> None:
        """Give the native engine (just loaded or joining) everything known so far."""
        native.reset_peer_states()
        with self._lock:
            for index, (state, message) in self._states.items():
                native.set_peer_state(index, _PEER_CODES.get(state, 2), message)

    def failure(self) -> Optional[str]:
        """Why the launch is broken (an instance failed), or None."""
        with self._lock:
            for index, (state, message) in sorted(self._states.items()):
                if state == "failed":
                    return f"instance {index} of {self.count} failed: {message}"
        return self._own

    def check(self, waiting_for: Iterable[int], what: str) -> None:
        """Raise InstanceError if an instance failed, or if one we wait for has finished (FINISHED_GRACE ago)."""
        why = self.failure()
        if why is None:
            with self._lock:
                for index in waiting_for:
                    state, message = self._states.get(index, ("running", ""))
                    # its last messages may still be on their way (FINISHED_GRACE)
                    if state == "finished" and time.monotonic() - self._finished_at[index] > FINISHED_GRACE:
                        why = (f"instance {index} ended its program while this instance ({self.index}) waits for it: "
                               f"the instances ran different programs or different numbers of steps")
                        break
        if why is not None:
            self.stop(f"{why}. Instance {self.index} of {self.count} stops in {what}.")

    def stopped(self, message: str) -> InstanceError:
        """This instance cannot go on because of the launch: say so to the supervisor; the error to raise."""
        if self._client is not None and self._own is None and not self._stopped:
            self._client.report("stopped", message)
        self._stopped = True
        return InstanceError("popdist: " + message)

    def stop(self, message: str) -> None:
        raise self.stopped(message)

    def report_failure(self, message: str) -> None:
        """This instance failed (the others must stop): tell the supervisor, once."""
        if self._own is not None:
            return
        self._own = f"instance {self.index} of {self.count} failed: {message}"
        if self._client is not None:
            self._client.report("failed", message)

    # MPI exchanges that end -----------------------------------------------------------------------
    def wait(self, requests: List[Any], what: str, peers: Iterable[int]) -> None:
        """Complete mpi4py requests (buffer API), polling; stop as ``check`` says or at the timeout."""
        peers = list(peers)
        start, pause = time.monotonic(), 0.0
        while not self.MPI.Request.Testall(requests):
            try:
                self.check(peers, what)
                waited = time.monotonic() - start
                if self.timeout and waited > self.timeout:
                    self.stop(f"no message from instance(s) {peers} for {int(waited)} s (the collective timeout, "
                              f"{TIMEOUT_VAR} / poprun --timeout): stuck, or not running {what}. Instance "
                              f"{self.index} of {self.count} stops in {what}.")
            except BaseException:
                self._abandon(requests)
                raise
            time.sleep(pause)
            pause = min(1e-3, pause * 2 or 1e-5)

    def _abandon(self, requests: List[Any]) -> None:
        for request in requests:
            try:
                request.Cancel()
            except self.MPI.Exception:
                pass
        self._abandoned.append(requests)  # MPI may still hold their buffers

    def new_comm(self, what: str) -> Any:
        """A communicator of its own for one session (collective over all instances)."""
        comm, request = self.world.Idup()
        self.wait([request], what, range(self.count))
        return comm

    def exchange(self, comm: Any, sends: Dict[int, Any], sources: Iterable[int], what: str,
                 tag: int = 0) -> Dict[int, Any]:
        """Send each ``sends[dest]`` (any picklable object) and receive one object from each source."""
        MPI = self.MPI
        sources = sorted(set(sources))
        payloads = {dest: pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) for dest, obj in sends.items()}
        sizes = {src: np.zeros(1, np.int64) for src in sources}
        out_sizes = {dest: np.array([len(p)], np.int64) for dest, p in payloads.items()}
        requests = [comm.Irecv([sizes[src], MPI.INT64_T], source=src, tag=tag) for src in sources]
        requests += [comm.Isend([out_sizes[dest], MPI.INT64_T], dest=dest, tag=tag) for dest in payloads]
        self.wait(requests, what, sources)
        buffers = {src: bytearray(int(sizes[src][0])) for src in sources}
        requests = [comm.Irecv([buffers[src], MPI.BYTE], source=src, tag=tag + 1) for src in sources]
        requests += [comm.Isend([payloads[dest], MPI.BYTE], dest=dest, tag=tag + 1) for dest in payloads]
        self.wait(requests, what, sources)
        return {src: pickle.loads(bytes(buffers[src])) for src in sources}

    def allgather(self, comm: Any, obj: Any, what: str) -> List[Any]:
        """Every instance's ``obj``, in instance order."""
        others = [i for i in range(self.count) if i != self.index]
        got = self.exchange(comm, {i: obj for i in others}, others, what)
        got[self.index] = obj
        return [got[i] for i in range(self.count)]

    # the end of the process ---------------------------------------------------------------------
    def _excepthook(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        failed = False
        if isinstance(exc, InstanceError):
            self.stopped(str(exc).removeprefix("popdist: "))
        else:
            self.report_failure(failure_text(exc, _where(tb)))
            failed = True
        self._previous_hook(exc_type, exc, tb)
        if failed and self._client is not None:
            sys.stderr.flush()
            self._client.wait_release(self._grace)  # let the others print why they stop

    def _at_exit(self) -> None:
        broken = self._stopped or self.failure() is not None
        if not broken and self._client is not None:
            self._client.report("finished", "its program ended")
        if self._owns_finalize:
            if not broken and not self.MPI.Is_finalized():
                self.MPI.Finalize()
        elif broken:
            self.MPI._set_abort_status(1)  # mpi4py's own finalisation would wait for the failed instance


_backend: Optional[Backend] = None
_backend_lock = threading.Lock()


def get(instance_index: int, num_instances: int) -> Backend:
    """The process's backend, started on first use."""
    global _backend
    with _backend_lock:
        if _backend is None:
            _backend = Backend(instance_index, num_instances)
        elif (_backend.index, _backend.count) != (instance_index, num_instances):
            raise ValueError(f"popdist: the backend runs instance {_backend.index} of {_backend.count}; the launch "
                             f"environment now says {instance_index} of {num_instances}.")
        return _backend


def current() -> Optional[Backend]:
    """The backend if one was started."""
    return _backend
