"""How often each stream is transferred per run, against ``ir.num_host_transfers``.

A run's host buffer of a stream holds ``num_host_transfers`` slices. Each ``host_load`` reads the
next slice and each ``host_store`` writes the next, wrapping to slice 0 after the last, with every
stream's position back at 0 at the start of a run (PopART's StepIO does the same, with a new StepIO
per run). So a stream may be transferred fewer or more times than ``num_host_transfers``: Graphcore's
training applications load the learning rate once per step and the data once per micro-batch. That
is legal; a Session says so once per stream in PopART's log (warning level), and the output slices
that no ``host_store`` wrote are zero in the arrays the Session allocates.
"""
from __future__ import annotations

from typing import Any, Callable, List, Set, Tuple

import numpy as np

from popxl.compiler.executable import Executable, transfer_counts
from popxl.logs import get_logger

__all__ = ["HostTransfers"]

logger = get_logger("session")

_KINDS = ("host_load", "host_store")


def _consequence(kind: str, count: int, nht: int) -> str:
    if count == 0:
        return ("its input is not read" if kind == "host_load" else
                "its output is not written: zero in the arrays Session.run returns, unchanged in arrays "
                "given to run_with_outputs")
    if kind == "host_load":
        if count < nht:
            return f"only the first {count} of the input's {nht} slice(s) are read"
        return (f"after slice {nht - 1} the loads wrap around to slice 0, so input slices are read more than "
                f"once (slice i by loads i, i + {nht}, ...)")
    if count < nht:
        return (f"output slices {count} to {nht - 1} are not written: zero in the arrays Session.run returns, "
                f"unchanged in arrays given to run_with_outputs")
    return (f"after slice {nht - 1} the stores wrap around to slice 0, so each output slice holds the last "
            f"value stored to it")


class HostTransfers:
    """One Session's transfer counts: those the program fixes are logged at creation; those that depend
    on which branch of an ``ops.conditional`` runs are read from the engine after each run, until each
    such stream has been logged once."""

    def __init__(self, exe: Executable) -> None:
        self._exe = exe
        self._nht = exe.num_host_transfers
        loads, stores = transfer_counts(exe)
        self._streams = (exe.h2d, exe.d2h)
        self._logged: Set[Tuple[int, int]] = set()  # (kind index, stream index)
        # (kind index, stream index) of the streams whose count is only known after a run
        self._unknown: List[Tuple[int, int]] = []
        for k, counts in enumerate((loads, stores)):
            for s, count in enumerate(counts):
                if count is None:
                    self._unknown.append((k, s))
                elif count != self._nht:
                    self._log(k, s, count, "per run")
        # Output streams whose slices a run may leave unwritten.
        self.may_leave_unwritten: List[bool] = [c is None or c < self._nht for c in stores]

    @property
    def depends_on_branches(self) -> bool:
        """Whether some count is known only after a run (it depends on conditionals)."""
        return bool(self._unknown)

    def _log(self, kind: int, stream: int, count: int, when: str) -> None:
        if (kind, stream) in self._logged:
            return
        self._logged.add((kind, stream))
        name, nht = self._streams[kind][stream]["name"], self._nht
        logger.warning("Stream %r (%s) is transferred %d time(s) %s, but ir.num_host_transfers is %d: %s.",
                       name, _KINDS[kind], count, when, nht, _consequence(_KINDS[kind], count, nht))

    def after_run(self, engine: Any) -> None:
        """Log the counts of the run that just ended, for the streams whose count depends on branches."""
        counts = engine.transfer_counts()
        for k, s in self._unknown:
            per_replica = np.asarray(counts[k][s])
            wrong = np.nonzero(per_replica != self._nht)[0]
            if len(wrong):
                r = int(wrong[0])
                when = ("in a run (the count depends on which branches of ops.conditional run"
                        + (f"; on replica {r}" if len(per_replica) > 1 else "") + ")")
                self._log(k, s, int(per_replica[r]), when)
        self._unknown = [ks for ks in self._unknown if ks not in self._logged]

    def watch(self, run: Callable[..., None], engine: Any) -> Callable[..., None]:
        """``run``, followed by ``after_run`` while some branch-dependent stream has not been logged."""
        if not self._unknown:
            return run

        def watched(*args: Any, **kwargs: Any) -> None:
            run(*args, **kwargs)
            if self._unknown:
                self.after_run(engine)
        return watched

    def output_makers(self, layout: List[tuple]) -> List[Tuple[Callable[..., np.ndarray], tuple]]:
        """How to make the host output array of each ``layout`` entry ``(stream, dtype, host shape)``,
        as ``(callable, args)``: zeros where a run may leave slices unwritten, else uninitialised (every
        slice is written). Decided once: ``Session.run`` makes outputs this way on every call."""
        return [(np.zeros if unwritten else np.empty, (shape, dtype))
                for (_, dtype, shape), unwritten in zip(layout, self.may_leave_unwritten)]
