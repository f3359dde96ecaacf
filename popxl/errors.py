"""Exceptions popxl raises besides the built-in ones, and PopART's exception hierarchy.

PopXL runs on PopART, and its errors from the IR and the session are PopART's
``popart_exception`` (``popart.popart_exception`` is this very class): popxl raises it where the
session cannot be created or attached. The hierarchy derives from ``RuntimeError``, so code that
catches ``RuntimeError`` keeps working.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["UndefinedValue", "popart_exception", "popart_internal_exception", "popart_runtime_error",
           "poplibs_exception", "poplar_exception", "poplar_runtime_error", "poplar_application_runtime_error",
           "poplar_system_runtime_error", "poplar_recoverable_runtime_error", "poplar_unrecoverable_runtime_error",
           "poplar_unknown_runtime_error", "RecoveryAction"]


class UndefinedValue(ValueError):
    """A property whose value is not determined (PopXL raises it for a tensor's ``ipu`` or
    ``tile_set`` when placement cannot be told). Here placement is always known, so popxl itself
    does not raise it; it exists so client code that catches it keeps working."""


class popart_exception(RuntimeError):
    """A bug in user code or in the framework (PopART's application error)."""


class popart_internal_exception(popart_exception):
    """An inconsistency inside popart itself."""


class popart_runtime_error(popart_exception):
    """A failure while the program runs."""


class poplibs_exception(popart_exception):
    """Raised by the kernel library (kept for name compatibility)."""


class poplar_exception(popart_exception):
    """Raised by the backend (kept for name compatibility)."""


class poplar_runtime_error(poplar_exception):
    """A backend failure while the program runs."""


class poplar_application_runtime_error(poplar_runtime_error):
    """A backend failure caused by the program."""


class poplar_system_runtime_error(poplar_runtime_error):
    """A failure of the machine (never raised on a CPU, kept for name compatibility)."""


class RecoveryAction(Enum):
    """What to do after a ``poplar_recoverable_runtime_error``."""
    IPU_RESET = "IPU_RESET"
    LINK_RESET = "LINK_RESET"
    PARTITION_RESET = "PARTITION_RESET"
    POWER_CYCLE = "POWER_CYCLE"


class poplar_recoverable_runtime_error(poplar_system_runtime_error):
    """A system error that ``recoveryAction`` can recover from.

    Args:
        message: The error message.
        recoveryAction: What to do to recover.
    """

    def __init__(self, message: str, recoveryAction: RecoveryAction = RecoveryAction.IPU_RESET) -> None:
        super().__init__(message)
        self.recoveryAction = recoveryAction


class poplar_unrecoverable_runtime_error(poplar_system_runtime_error):
    """A system error with no recovery action."""


class poplar_unknown_runtime_error(poplar_system_runtime_error):
    """A system error that may or may not be recoverable."""
