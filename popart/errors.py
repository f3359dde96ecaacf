"""PopART's Python error hierarchy (defined in popxl.errors, which popxl raises too) and its logger.

Every error this package raises on purpose is a ``popart_exception`` (or a subclass), so user code
written against PopART's ``except popart.popart_exception`` keeps working. The classes also derive
from the matching Python built-in where one fits, so ``except ValueError`` works too.
"""
from __future__ import annotations

import logging
from typing import Optional

from popxl.errors import (RecoveryAction, popart_exception, popart_internal_exception, popart_runtime_error,
                          poplar_application_runtime_error, poplar_exception, poplar_recoverable_runtime_error,
                          poplar_runtime_error, poplar_system_runtime_error, poplar_unknown_runtime_error,
                          poplar_unrecoverable_runtime_error, poplibs_exception)
from popxl.logs import LEVELS, ROOT, TRACE, get_logger  # noqa: F401  (TRACE: the level popart's modules log at)

__all__ = ["popart_exception", "popart_internal_exception", "popart_runtime_error", "poplibs_exception",
           "poplar_exception", "poplar_runtime_error", "poplar_application_runtime_error",
           "poplar_system_runtime_error", "poplar_recoverable_runtime_error", "poplar_unrecoverable_runtime_error",
           "poplar_unknown_runtime_error", "RecoveryAction", "OnnxImportError", "StepIOError", "getLogger",
           "Logger"]


class OnnxImportError(popart_exception, ValueError):
    """The ONNX model cannot be turned into a program (unsupported ops, unknown shapes, bad attributes)."""


class StepIOError(popart_exception, ValueError):
    """The buffers handed to ``Session.run`` do not match what the session expects."""


# logging ----------------------------------------------------------------------------------------------
# The loggers themselves are configured in popxl.logs (popxl logs through them too).
_MODULES = ("popart", "session", "ir", "devicex", "transform", "pattern", "builder", "op", "opx", "ces",
            "python", "none", "popxl")


class Logger:
    """One of PopART's logging modules (``popart``, ``session``, ``ir``, ...), on Python logging."""

    def __init__(self, module: str) -> None:
        if module not in _MODULES:
            raise popart_exception(f"getLogger: unknown logging module {module!r}; known modules: {list(_MODULES)}.")
        self._log = get_logger(module)

    def setLevel(self, level: str) -> None:
        """Set the level: TRACE, DEBUG, INFO, WARN, ERR, CRITICAL or OFF (case-insensitive).
        On ``popart`` (the default logger) it sets every module's level."""
        key = str(level).upper()
        if key not in LEVELS:
            raise popart_exception(f"Logger.setLevel: unknown level {level!r}; use one of {list(LEVELS)}.")
        self._log.setLevel(LEVELS[key])
        if self._log is ROOT:
            for m in _MODULES[1:]:
                ROOT.getChild(m).setLevel(logging.NOTSET)  # follow the root again

    def getLevel(self) -> str:
        value = self._log.getEffectiveLevel()
        return next(k for k, v in LEVELS.items() if v == value) if value in LEVELS.values() else str(value)


def getLogger(module: Optional[str] = "popart") -> Logger:
    """The logger of ``module`` (default: every module)."""
    return Logger(module or "popart")
