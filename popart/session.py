"""``InferenceSession``: an ONNX model imported into a popxl program that runs ``batchesPerStep``
batches per ``run`` inside the engine, through a ``popxl.Session`` and its public API.

The session's parts, one concern a module: the program built from the model (``popart.program``,
which ``TrainingSession`` extends), the step IO and anchors (``popart.stepio``), the host weights
(``popart.weights``) and the reports (``popart.report``). This class holds them together: the
device's life cycle (``prepareDevice`` compiles the program into a ``popxl.Session``, which applies
popxl's transform pipeline), ``run``, and PopART's API over the parts.
"""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

import popxl
from popxl.analysis import reachable_graphs
from popart.dataflow import DataFlow, InputShapeInfo, PyStepIO, PyStepIOCallback, PyWeightsIO, TensorInfo
from popart.devices import DeviceInfo, DeviceType
from popart.errors import (TRACE, popart_exception, popart_internal_exception, poplar_application_runtime_error,
                           poplibs_exception)
from popart.losses import Loss
from popart.onnx.importer import GraphImporter, InputSpec, ModelLike, load_model
from popart.options import Patterns, SessionOptions
from popart.program import Anchor, ProgramBuilder
from popart.report import Report, SessionProfile
from popart.rounding import seed_value
from popart.stepio import HostIO
from popart.weights import HostWeights

__all__ = ["InferenceSession"]

logger = logging.getLogger("popart.session")


class InferenceSession(ProgramBuilder):
    """Runs an ONNX model for inference.

    ``fnModel``: a file path, the serialised ModelProto (bytes) or an ``onnx.ModelProto``.
    ``dataFlow`` (alias ``dataFeed``): batches per step and anchors. ``deviceInfo``: from
    ``DeviceManager``. ``inputShapeInfo``: shapes of inputs the model leaves open.
    ``patterns`` and ``userOptions``: see ``popart.Patterns`` and ``popart.SessionOptions``.
    """

    def __init__(self, fnModel: ModelLike, dataFlow: Optional[DataFlow] = None,
                 deviceInfo: Optional[DeviceInfo] = None, inputShapeInfo: Optional[InputShapeInfo] = None,
                 patterns: Optional[Patterns] = None, userOptions: Optional[SessionOptions] = None,
                 name: str = "inference", dataFeed: Optional[DataFlow] = None,
                 losses: Optional[Sequence[Loss]] = None) -> None:
        for loss in losses or []:
            if not isinstance(loss, Loss):
                raise popart_exception(f"{type(self).__name__}: unsupported loss {loss!r}; losses must be "
                                       f"popart.NllLoss, L1Loss or IdentityLoss objects.")
        self._loss_objects: List[Loss] = list(losses or [])
        if dataFlow is None:
            dataFlow = dataFeed
        elif dataFeed is not None:
            raise popart_exception(f"{type(self).__name__}: give dataFlow or its old name dataFeed, not both.")
        if not isinstance(dataFlow, DataFlow):
            raise popart_exception(f"{type(self).__name__}: dataFlow must be a popart.DataFlow, not {dataFlow!r}.")
        if not isinstance(deviceInfo, DeviceInfo):
            raise popart_exception(f"{type(self).__name__}: deviceInfo must be a popart.DeviceInfo (from "
                                   f"popart.DeviceManager()), not {deviceInfo!r}.")
        options = userOptions if userOptions is not None else SessionOptions()
        if not isinstance(options, SessionOptions):
            raise popart_exception(f"{type(self).__name__}: userOptions must be popart.SessionOptions, not {options!r}.")
        if patterns is not None and not isinstance(patterns, Patterns):
            raise popart_exception(f"{type(self).__name__}: patterns must be popart.Patterns, not {patterns!r}.")
        if dataFlow.batchesPerStep() < 1:
            raise popart_exception(f"{type(self).__name__}: DataFlow.batchesPerStep must be at least 1.")
        self.name = name
        self.dataFlow = dataFlow
        self.deviceInfo = deviceInfo
        self.options = options
        self.patterns = patterns if patterns is not None else Patterns()
        self.replicationFactor = options.getReplicationFactor()  # this instance's replicas
        self.globalReplicationFactor = self._launch_replicas(options)  # every instance's (poprun)
        self.accumulationFactor = options.getAccumulationFactor()
        self.batchesPerStep = dataFlow.batchesPerStep()
        if self.replicationFactor > deviceInfo.numIpus:
            raise popart_exception(
                f"{type(self).__name__}: replicatedGraphCount={self.replicationFactor} needs a device with at least "
                f"{self.replicationFactor} IPUs, but {deviceInfo!r} has {deviceInfo.numIpus}. Use "
                f"DeviceManager().createIpuModelDevice({{'numIPUs': {self.replicationFactor}}}).")
        self._user_model = load_model(fnModel)
        self._model = self._prepare_model(self._user_model, inputShapeInfo)
        shape_info = inputShapeInfo.getAllTensorInfo() if inputShapeInfo is not None else {}
        self._importer = GraphImporter(
            self._model, {k: (v.shape(), v.numpy_dtype()) for k, v in shape_info.items()})
        self._inputs: List[InputSpec] = self._importer.inputs
        self._weights = HostWeights()
        self._running = False  # inside run (its callbacks included): a nested run would reuse its buffers
        self._variables: Dict[str, popxl.Variable] = self._weights.variables  # the model's weights by name
        self._anchors: Dict[str, Anchor] = {}
        self._build()
        self._io = HostIO(self._inputs, self._in_streams, self._anchors, self.batchesPerStep,
                          self.accumulationFactor, self.replicationFactor)
        self._profile = SessionProfile(options)
        self._px: Optional[popxl.Session] = None
        logger.debug("InferenceSession %r: %d ONNX nodes, %d weights, inputs %s, anchors %s", name,
                     len(self._model.graph.node), len(self._variables), self.getInputTensorIds(), list(self._anchors))

    def setRandomSeed(self, seedValue: int) -> None:
        """Seed the session's random numbers (stochastic rounding, dropout)."""
        if self._seed_var is not None:  # set by _build
            self._weights.set({self._seed_var: seed_value(seedValue)})

    # shapes ---------------------------------------------------------------------------------------------
    def getInputShape(self, tensorId: str) -> Tuple[int, ...]:
        """The shape ``PyStepIO`` needs for input ``tensorId``:
        [batchesPerStep, accumulationFactor, replicationFactor, *shape] with size-1 factors dropped."""
        return self._io.input_shape(tensorId)

    def getAnchorShape(self, tensorId: str) -> Tuple[int, ...]:
        """The shape of the host buffer of anchor ``tensorId`` (PopART's rules per return type)."""
        return self._io.anchor_shape(tensorId)

    def getInputTensorIds(self) -> List[str]:
        """The model inputs the host feeds each run (initializers excluded)."""
        return self._io.input_ids()

    def getOutputTensorIds(self) -> List[str]:
        """The model's declared outputs."""
        return [o.name for o in self._model.graph.output]

    def getAnchorTensorIds(self) -> List[str]:
        return list(self._anchors)

    def getInfo(self, tensorId: str) -> TensorInfo:
        """Data type and per-batch shape of an input, anchor or weight (as held on the device)."""
        if tensorId in self._anchors:
            a = self._anchors[tensorId]
            return TensorInfo(a.dtype, a.shape)
        if tensorId in self._variables:
            v = self._variables[tensorId]
            return TensorInfo(v.dtype.as_numpy(), v.shape)
        s = self._io.input(tensorId)
        return TensorInfo(s.device_dtype, s.shape)

    def initAnchorArrays(self) -> Dict[str, np.ndarray]:
        """Zeroed host buffers for every anchor, shaped as ``getAnchorShape`` says."""
        return self._io.init_anchor_arrays()

    # device ---------------------------------------------------------------------------------------------
    def prepareDevice(self, loadEngine: bool = True) -> None:
        """Compile the program for the device and, with ``loadEngine``, attach and load it."""
        logger.log(TRACE, "Session::prepareDevice")
        if self._px is None:
            if self.deviceInfo.type is DeviceType.Ipu:
                logger.warning("running a program for IPU hardware on the CPU engine (POPXL_IPU_HW=cpu).")
            try:
                px = popxl.Session(self._ir, self.deviceInfo._popxl_device)
            except (ValueError, TypeError, NotImplementedError, KeyError, IndexError, AssertionError) as e:
                # The program was built by this package: failing to compile it is our bug.
                raise popart_internal_exception(f"prepareDevice: the program of session {self.name!r} could not "
                                                f"be compiled: {type(e).__name__}: {e}") from e
            self._px = px
            self._profile.connect(px)
            self._io.connect(px)
            self._weights.connect(px)
        if loadEngine:
            self.loadEngineAndConnectStreams()

    def loadEngineAndConnectStreams(self) -> None:
        if self._px is None:
            raise popart_exception("loadEngineAndConnectStreams: call prepareDevice() first.")
        if not self._px.is_attached:
            if not self.deviceInfo.isAttached:
                self.deviceInfo.attach()
            self._px.__enter__()  # attach for the session's lifetime; detached in __del__ / detach

    def _attached(self, what: str) -> popxl.Session:
        if self._px is None or not self._px.is_attached:
            raise popart_exception(f"Session.{what}: the session is not prepared; call prepareDevice() first.")
        return self._px

    def detach(self) -> None:
        """Copy the weights back to the host and release the device."""
        if self._px is not None and self._px.is_attached:
            self._px.__exit__(None, None, None)
            self.deviceInfo.detach()

    def __del__(self) -> None:
        try:
            px = getattr(self, "_px", None)
            if px is not None and px.is_attached:
                px.__exit__(None, None, None)
        except Exception:  # interpreter shutdown: nothing useful to do
            pass

    # weights --------------------------------------------------------------------------------------------
    def weightsFromHost(self) -> None:
        """Copy the host weights to the device."""
        logger.log(TRACE, "Session::weightsFromHost")
        self._attached("weightsFromHost").weights_from_host()

    def weightsToHost(self) -> None:
        """Copy the device weights to the host."""
        logger.log(TRACE, "Session::weightsToHost")
        self._attached("weightsToHost").weights_to_host()

    def readWeights(self, weightsIo: PyWeightsIO) -> None:
        """Fill the arrays of ``weightsIo`` with the host weights (call ``weightsToHost`` first to
        get the device values)."""
        self._weights.read(weightsIo)

    def writeWeights(self, weightsIo: PyWeightsIO) -> None:
        """Set the host weights from ``weightsIo``; ``weightsFromHost`` then sends them to the device."""
        self._weights.write(weightsIo)

    def modelToHost(self, fn: str) -> None:
        """Write the model, with the current weights as its initializers, to the file ``fn``."""
        if self._px is not None and self._px.is_attached:
            self._px.weights_to_host()
        self._weights.save_model(self._user_model, fn)

    def resetHostWeights(self, modelProtoOrFilename: ModelLike,
                         ignoreWeightsInModelWithoutCorrespondingHostWeight: bool = False) -> None:
        """Take the host weights from the initializers of another model (file, bytes or ModelProto);
        call ``weightsFromHost`` to send them to the device."""
        self._weights.reset_from(modelProtoOrFilename, self._importer.initializers,
                                 ignoreWeightsInModelWithoutCorrespondingHostWeight)

    # running --------------------------------------------------------------------------------------------
    def run(self, stepio: Union[PyStepIO, PyStepIOCallback], debugName: str = "") -> None:
        """Run ``batchesPerStep`` batches, reading inputs from and writing anchors to ``stepio``."""
        logger.log(TRACE, "Session::run %s", debugName)
        px = self._attached("run")
        if self._running:
            raise popart_exception("Session.run: called while a run of this session is in progress (from a "
                                   "PyStepIOCallback's callback?): the outer run's inputs and anchors would be "
                                   "overwritten. Run again after it returns.")
        self._running = True
        try:
            self._run(px, stepio)
        finally:
            self._running = False

    def _run(self, px: popxl.Session, stepio: Union[PyStepIO, PyStepIOCallback]) -> None:
        if isinstance(stepio, PyStepIO):
            inputs = self._io.inputs_from_arrays(stepio)
            self._io.check_outputs(stepio.outputs)
            given = stepio.outputs
        elif isinstance(stepio, PyStepIOCallback):
            inputs = self._io.inputs_from_callbacks(stepio)
            given = None
        else:
            raise popart_exception(f"Session.run: expected a popart.PyStepIO or PyStepIOCallback, not {stepio!r}.")
        # The engine writes the anchors it can straight into the user's arrays (popart.stepio).
        outputs = self._io.stream_outputs(given, inputs.values())
        start = time.perf_counter()
        try:
            px.run_with_outputs(inputs, outputs)
        except NotImplementedError as e:  # an op without a kernel for its dtypes
            raise poplibs_exception(f"Session.run: {e}") from e
        except (RuntimeError, ValueError, FloatingPointError) as e:
            raise poplar_application_runtime_error(f"Session.run: the program failed: {type(e).__name__}: {e}") from e
        self._profile.record(time.perf_counter() - start)
        results, to_copy = self._io.results(outputs, given)
        if self.options.enableFloatingPointChecks:
            self._check_floating_point(results)
        if isinstance(stepio, PyStepIO):
            for name in to_copy:
                stepio.outputs[name][...] = results[name]
        else:
            self._io.outputs_to_callbacks(stepio, results)

    def _check_floating_point(self, results: Dict[str, np.ndarray]) -> None:
        """enableFloatingPointChecks: an IPU traps on NaN and overflow; here the anchors and weights
        are checked after the run (the first bad tensor is named)."""
        values = dict(results)
        self.weightsToHost()
        values.update(self._weights.values())
        for name, v in values.items():
            if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
                raise poplar_application_runtime_error(
                    f"Session.run: floating-point exception (enableFloatingPointChecks): tensor {name!r} has "
                    f"{int(np.sum(np.isnan(v)))} NaN and {int(np.sum(np.isinf(v)))} infinite values.")

    # reports --------------------------------------------------------------------------------------------
    def getSummaryReport(self, resetProfile: bool = True) -> str:
        """A text summary of the program and, when profiling is enabled (engineOptions
        ``autoReport.all``), of the runs since the last reset: their number and wall-clock times."""
        n_ops = sum(len(g.schedule()) for g in reachable_graphs(self._ir))
        lines = [f"popart session {self.name!r}: {len(self._model.graph.node)} ONNX nodes lowered to {n_ops} popxl "
                 f"ops, {len(self._variables)} weights, batchesPerStep={self.batchesPerStep}, "
                 f"replicationFactor={self.replicationFactor}, device={self.deviceInfo!r}."]
        lines += self._summary_lines()
        lines += self._profile.summary_lines(self.batchesPerStep)
        if resetProfile and self._profile.enabled:
            self._profile.reset()
        return "\n".join(lines)

    def _summary_lines(self) -> List[str]:
        return [f"Engine options: {self.engineOptions()}."]

    def engineOptions(self) -> Dict[str, str]:
        """The engine options in effect: ``SessionOptions.engineOptions``, plus
        ``target.deterministicWorkers=true`` when stochastic rounding is on (as PopART sets it;
        an explicit engine option overrides it). On the CPU they only document the run."""
        opts = {"target.deterministicWorkers": "true"} if self.options.enableStochasticRounding else {}
        opts.update({str(k): str(v) for k, v in self.options.engineOptions.items()})
        return opts

    def getReport(self, resetProfile: bool = True) -> Report:
        """The profile (a ``popart.report.Report``): memory per IPU from the compiled program and,
        with ``engineOptions={"autoReport.all": "true"}``, per-op calls and times per IPU measured
        during the runs since the last reset (see popart.report for how they are measured)."""
        if self._px is None:
            raise popart_exception("getReport: the session is not compiled; call prepareDevice() first.")
        steps = str(self.options.reportOptions.get("showExecutionSteps", "false")).lower() == "true"
        report = self._profile.report(showExecutionSteps=steps)
        if resetProfile:
            self._profile.reset()
        return report

    def getCycleCount(self, id: str = "") -> int:
        raise popart_exception("getCycleCount: hardware cycle counters exist only on IPU hardware.")

    def __repr__(self) -> str:
        return f"InferenceSession({self.name!r}, inputs={self.getInputTensorIds()}, anchors={list(self._anchors)})"
