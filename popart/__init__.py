"""popart on CPUs: PopART's session API over popxl.

Import an ONNX model into an ``InferenceSession``, describe the data flow with ``DataFlow`` and
``AnchorReturnType``, pick a device from ``DeviceManager`` and run batches with ``PyStepIO``.
Build or extend models with ``Builder`` (``aiOnnx`` ops, ``aiGraphcore`` losses) and train them
with ``TrainingSession`` and an optimiser (``ConstSGD``, ``SGD``, ``Adam``).
"""
from popart.dataflow import (AnchorReturnType, AnchorReturnTypeId, DataFlow, InputShapeInfo, PyStepIO,
                             PyStepIOCallback, PyWeightsIO, TensorInfo)
from popart.devices import (DeviceConnectionType, DeviceInfo, DeviceManager, DeviceSelectionCriterion, DeviceType,
                            SyncPattern)
from popart.errors import (Logger, OnnxImportError, RecoveryAction, StepIOError, getLogger, popart_exception,
                           popart_internal_exception, popart_runtime_error, poplar_application_runtime_error,
                           poplar_exception, poplar_recoverable_runtime_error, poplar_runtime_error,
                           poplar_system_runtime_error, poplar_unknown_runtime_error,
                           poplar_unrecoverable_runtime_error, poplibs_exception)
from popart.options import (Patterns, PatternsLevel, RecomputationType, SessionOptions, SyntheticDataMode,
                            VirtualGraphMode)
from popart.session import InferenceSession
from popart.builder import AiGraphcore, AiOnnx, Builder
from popart.losses import IdentityLoss, L1Loss, NllLoss, ReductionType
from popart.optimizers import SGD, Adam, AdamMode, ConstSGD, Optimizer, OptimizerValue, WeightDecayMode
from popart.training import TrainingSession, reservedGradientPrefix

__version__ = "0.1.0"


def versionString() -> str:
    """This package's version, as PopART's ``popart.versionString()`` gives its own.

    Returns:
        The version, ``"MAJOR.MINOR.PATCH"`` (the same as ``popart.__version__``).
    """
    return __version__


def versionNumber() -> tuple:
    """This package's version as numbers, as PopART's ``popart.versionNumber()``.

    Returns:
        ``(major, minor, patch)``, ints.
    """
    major, minor, patch = (int(p) for p in __version__.split(".")[:3])
    return (major, minor, patch)

__all__ = [
    "AnchorReturnType", "AnchorReturnTypeId", "DataFlow", "InputShapeInfo", "PyStepIO", "PyStepIOCallback",
    "PyWeightsIO", "TensorInfo", "DeviceConnectionType", "DeviceInfo", "DeviceManager", "DeviceSelectionCriterion",
    "DeviceType",
    "SyncPattern", "Logger", "getLogger", "RecoveryAction", "popart_exception", "popart_internal_exception",
    "popart_runtime_error", "poplibs_exception", "poplar_exception", "poplar_runtime_error",
    "poplar_application_runtime_error", "poplar_system_runtime_error", "poplar_recoverable_runtime_error",
    "poplar_unrecoverable_runtime_error", "poplar_unknown_runtime_error", "OnnxImportError", "StepIOError",
    "Patterns", "PatternsLevel", "RecomputationType", "SessionOptions", "SyntheticDataMode", "VirtualGraphMode",
    "InferenceSession", "TrainingSession", "reservedGradientPrefix", "Builder", "AiOnnx", "AiGraphcore",
    "ReductionType", "NllLoss", "L1Loss", "IdentityLoss", "Optimizer", "OptimizerValue", "ConstSGD", "SGD", "Adam",
    "AdamMode", "WeightDecayMode", "versionString", "versionNumber",
]
