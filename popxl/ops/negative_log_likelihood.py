"""PopXL's module path for the negative log-likelihood losses (``REDUCTION_TYPE``, ``nll_loss``,
``nll_loss_with_softmax_grad``); the ops live in ``popxl.ops.nn``."""
from typing import Literal

from popxl.ops.nn import nll_loss, nll_loss_with_softmax_grad  # noqa: F401

REDUCTION_TYPE = Literal["mean", "sum", "none"]

__all__ = ["REDUCTION_TYPE", "nll_loss", "nll_loss_with_softmax_grad"]
