"""``SessionOptions`` (an attribute object whose names are PopART's; setting an unknown name raises)
and ``Patterns`` (which graph rewrites are enabled).

On the CPU only a few options change what a session does: ``replicatedGraphCount`` (with
``enableReplicatedGraphs``) and ``accumulationFactor`` (with ``enableGradientAccumulation``) shape
the step buffers and the number of batches per step. The others are stored and reported back so
that programs written for PopART run unchanged, but they tune IPU compilation and have no effect here.
Likewise ``Patterns`` are recorded and validated; the popxl compiler applies its own rewrites."""
from __future__ import annotations

import copy
from enum import Enum
from typing import Any, Dict, Iterable, List, Union

from popart.errors import popart_exception
from popart.losses import ReductionType

__all__ = ["SessionOptions", "Patterns", "PatternsLevel", "VirtualGraphMode", "RecomputationType",
           "SyntheticDataMode"]


class VirtualGraphMode(Enum):
    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


class RecomputationType(Enum):
    NoRecompute = 0
    Standard = 1
    NormOnly = 2
    RecomputeAll = 3
    Pipeline = 4


setattr(RecomputationType, "None", RecomputationType.NoRecompute)  # PopART spells it ``None``


class SyntheticDataMode(Enum):
    Off = 0
    Zeros = 1
    RandomNormal = 2
    RandomUniform = 3


# name -> default. Values are deep-copied per instance (dicts and lists are mutable).
_DEFAULTS: Dict[str, Any] = {
    # options with an effect on the CPU
    "replicatedGraphCount": 1, "enableReplicatedGraphs": False,
    "accumulationFactor": 1, "enableGradientAccumulation": False,
    # how a TrainingSession combines the gradients of accumulation steps and replicas (PopART's default: Sum)
    "accumulationAndReplicationReductionType": ReductionType.Sum,
    # accepted for compatibility: IPU compilation, scheduling and reporting settings
    "enableStochasticRounding": False, "engineOptions": {}, "convolutionOptions": {}, "lstmOptions": {},
    "matmulOptions": {}, "reportOptions": {}, "gclOptions": {}, "constantWeights": True,
    "virtualGraphMode": VirtualGraphMode.Off, "enablePipelining": False,
    "autoRecomputation": RecomputationType.NoRecompute, "explicitRecomputation": False,
    "enableOutlining": True, "enableOutliningCopyCostPruning": True, "outlineThreshold": 1.0,
    "outlineSequenceBreakCost": 10000.0, "logDir": "", "cachePath": "session_cache", "enableEngineCaching": False,
    "instrumentWithHardwareCycleCounter": False, "hardwareInstrumentations": set(),
    "disableGradAccumulationTensorStreams": True, "enableFloatingPointChecks": False,
    "enablePrefetchDatastreams": True, "defaultPrefetchBufferingDepth": 1, "prefetchBufferingDepthMap": {},
    "syntheticDataMode": SyntheticDataMode.Off, "enableFullyConnectedPass": True, "enableExplicitMainLoops": False,
    "useHostCopyOps": False, "aliasZeroCopy": False, "enableLoadAndOffloadRNGState": False,
    "enableNonStableSoftmax": False, "decomposeGradSum": False, "globalReplicationFactor": 1,
    "enableDistributedReplicatedGraphs": False, "globalReplicaOffset": 0, "kahnTieBreaker": "greedy",
    "timeLimitScheduler": 1e9, "swapLimitScheduler": 1000000000, "serializedPoprithmsShiftGraphsDir": "",
    "dotChecks": set(), "firstDotOp": 0, "finalDotOp": 10000, "dotOpNames": False,
    "exportPoplarComputationGraph": False, "exportPoplarVertexGraph": False, "separateCallOpPdfs": True,
    "enableStableNorm": False, "opxAliasChecking": False, "opxModifyChecking": False,
    "rearrangeAnchorsOnHost": True, "rearrangeStreamsOnHost": False, "partialsTypeMatMuls": "",
    "groupHostSync": False, "strictOpVersions": True, "compileEngine": True, "mergeVarUpdateMemThreshold": 1000000,
    "looseThresholdAtPeak": 8000, "createImplicitPipeliningFwdOnlyProgram": False, "enableMergeExchange": True,
    "ensureFp32LossScaleTensor": False, "enableInplaceAmbiguityChecking": False, "delayVarUpdates": True,
    "scheduleNonWeightUpdateGradientConsumersEarly": False, "numIOTiles": 0, "enableSerializedMatmuls": True,
    "enableConstantFoldingOfMultipleConsumers": True, "customCodelets": [], "customCodeletCompileFlags": "",
    "updatableNamedBuffers": [], "stashAllTensorsInferencePipeline": False, "virtualGraphSplitRatios": [],
    "enableSupportedDataTypeCasting": True, "useLoopCandidateCreator": False, "enableVariablesCaching": True,
    "automaticLossScalingSettings": None, "batchSerializationSettings": None, "executionPhaseSettings": None,
    "accumulationOuterFragmentSettings": None, "tensorLocationSettingsOverride": {},
    "activationTensorLocationSettings": None, "weightTensorLocationSettings": None,
    "optimizerStateTensorLocationSettings": None, "accumulatorTensorLocationSettings": None,
    "replicatedCollectivesSettings": None, "developerSettings": None, "enablePrefetchRNGState": True,
    "throwIfLog2ScaleTensorNotInRange": True,
}
_INT_OPTIONS = ("replicatedGraphCount", "accumulationFactor")


class SessionOptions:
    """PopART session options as attributes: ``opts = popart.SessionOptions();
    opts.replicatedGraphCount = 2``. Unknown names raise AttributeError."""

    def __init__(self) -> None:
        object.__setattr__(self, "_values", copy.deepcopy(_DEFAULTS))

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"popart.SessionOptions has no option {name!r}.")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _DEFAULTS:
            close = [k for k in _DEFAULTS if k.lower() == name.lower()]
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise AttributeError(f"popart.SessionOptions has no option {name!r}.{hint}")
        if name in _INT_OPTIONS and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise popart_exception(f"SessionOptions.{name} must be a positive int, not {value!r}.")
        self._values[name] = value

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(_DEFAULTS))

    # The factors that shape step buffers, taking their enable switches into account.
    def getReplicationFactor(self) -> int:
        return self.replicatedGraphCount if self.enableReplicatedGraphs else 1

    def getAccumulationFactor(self) -> int:
        return self.accumulationFactor if self.enableGradientAccumulation else 1

    def changed(self) -> Dict[str, Any]:
        """The options whose values differ from their defaults."""
        return {k: v for k, v in self._values.items() if v != _DEFAULTS[k]}

    def __repr__(self) -> str:
        return f"SessionOptions({self.changed()})"


class PatternsLevel(Enum):
    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


# PopART's pattern names, and the lowest level that enables each.
_PATTERNS: Dict[str, PatternsLevel] = {
    **{n: PatternsLevel.Minimal for n in (
        "InitAccumulatePattern", "ViewSimplifyPattern", "ContiguateIpuCopyIndices", "RandomNormalLikeOpPattern",
        "RandomUniformLikeOpPattern", "ZerosLikeOpPattern")},
    **{n: PatternsLevel.Default for n in (
        "PreUniRepl", "PostNRepl", "OpToIdentity", "UpsampleToResize", "ExpandCast", "InPlace", "SoftMaxGradDirect", "NLLLWithSoftMaxGradDirect", "SplitGradOp", "SubtractArg1GradOp",
        "MulArgGradOp", "ReciprocalGradOp", "DivArg0GradOp", "DivArg1GradOp", "PowArg0GradOp", "PowArg1GradOp",
        "SinGradOp", "CosGradOp", "ConvDataGrad", "SqrtGradOp", "ExpGradOp", "Log1pGradOp", "LogGradOp",
        "GemmDecomposition", "NegativeOneScale", "MatMulOp", "MatMulLhsGradOp", "MatMulRhsGradOp",
        "OptimizerDecompose", "SumToAdd", "DecomposeBinaryConstScalar", "LambSerialisedWeight", "ScanToLoop")},
    **{n: PatternsLevel.All for n in (
        "TanToSinOverCos", "AtanGradOp", "CoshOp", "Fuse", "PadSum", "SplitGather", "SqrtGradOp2",
        "LSTMOp", "TiedGather", "TiedGatherAccumulate")},
}


class Patterns:
    """The enabled graph rewrites: ``Patterns()`` (the default set),
    ``Patterns(PatternsLevel.X)`` or ``Patterns(["PreUniRepl", ...])``."""

    def __init__(self, patterns: Union[PatternsLevel, Iterable[str], None] = PatternsLevel.Default) -> None:
        if patterns is None:
            patterns = PatternsLevel.Default
        if isinstance(patterns, PatternsLevel):
            self._enabled = {n for n, lvl in _PATTERNS.items() if lvl.value <= patterns.value}
        else:
            names = list(patterns)
            for n in names:
                self._check(n)
            self._enabled = set(names)
        self._runtime_asserts = True
        self._update_inplace_prio_for_half = False

    @staticmethod
    def _check(name: str) -> None:
        if name not in _PATTERNS:
            raise popart_exception(f"Patterns: unknown pattern {name!r}; known patterns: {sorted(_PATTERNS)}.")

    @classmethod
    def create(cls, names: Iterable[str]) -> "Patterns":
        return cls(list(names))

    def enablePattern(self, name: str, enabled: bool) -> "Patterns":
        self._check(name)
        (self._enabled.add if enabled else self._enabled.discard)(name)
        return self

    def isPatternEnabled(self, name: str) -> bool:
        self._check(name)
        return name in self._enabled

    def enableRuntimeAsserts(self, enabled: bool) -> "Patterns":
        self._runtime_asserts = bool(enabled)
        return self

    @property
    def inplaceEnabled(self) -> bool:
        return "InPlace" in self._enabled

    @inplaceEnabled.setter
    def inplaceEnabled(self, enabled: bool) -> None:
        self.enablePattern("InPlace", enabled)

    def enableInPlace(self, enabled: bool) -> "Patterns":
        return self.enablePattern("InPlace", enabled)

    def getAllPreAliasPatternNames(self) -> List[str]:
        return sorted(self._enabled - {"InPlace"})

    def __repr__(self) -> str:
        return f"Patterns({sorted(self._enabled)})"
