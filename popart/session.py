"""``InferenceSession``: an ONNX model imported into a popxl program that runs ``batchesPerStep``
batches per ``run`` inside the engine.

The program built from a model:

- main graph: one variable per weight (float initializer) and a ``repeat`` of the step graph,
  ``batchesPerStep * accumulationFactor`` times (``ir.num_host_transfers`` is that count, so each
  iteration reads the next slice of every input stream);
- step graph: ``host_load`` of every model input, the imported nodes, then per anchor: a
  ``host_store`` every iteration (ALL and EVERYN; EVERYN keeps every N-th batch on the host), or
  an in-place update of a main-graph accumulator passed by reference (SUM adds, FINAL copies),
  which the main graph stores once after the loop.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import numpy_helper

import popxl
import popxl.ops as ops
from popxl import dtypes
from popxl.transforms import pipeline
from popart.dataflow import (AnchorReturnTypeId, DataFlow, InputShapeInfo, PyStepIO, PyStepIOCallback,
                             PyWeightsIO, TensorInfo)
from popart.devices import DeviceInfo, DeviceType
from popart.errors import (TRACE, StepIOError, popart_exception, popart_internal_exception,
                           poplar_application_runtime_error, poplibs_exception)
from popart.onnx.importer import GraphImporter, InputSpec, ModelLike, all_nodes, device_array, load_model
from popart.losses import GRAPHCORE_DOMAIN, Loss
from popart.options import Patterns, SessionOptions
from popart.rounding import StochasticRounder, seed_value
from popart.report import Report, build_report, measurement_note

__all__ = ["InferenceSession"]

logger = logging.getLogger("popart.session")

_PER_BATCH = (AnchorReturnTypeId.ALL, AnchorReturnTypeId.EVERYN)


def _drop_ones(*dims: int) -> Tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def _safe(name: str) -> str:
    return name.replace("/", "_") or "onnx"


class ByRef:
    """Threads main-graph tensors into nested subgraphs (outermost first) as by-reference inputs,
    so every level reads and updates the same storage; ``bindings(graph)`` is what the call of
    ``graph`` passes in."""

    def __init__(self, graphs: Sequence[popxl.Graph]) -> None:
        self._levels = [(g, {}, {}) for g in graphs]

    def __call__(self, var: popxl.Tensor, name: str, depth: Optional[int] = None) -> popxl.Tensor:
        """``var`` as a tensor of the graph ``depth`` levels in (default: the innermost)."""
        parent = var
        for graph, local, bind in self._levels[:depth]:
            if var not in local:
                with graph:
                    t = popxl.graph_input(var.shape, var.dtype, name, by_ref=True)
                local[var] = t
                bind[t] = parent
            parent = local[var]
        return parent

    def bindings(self, graph: popxl.Graph) -> Dict[popxl.Tensor, popxl.Tensor]:
        return next(dict(bind) for g, _, bind in self._levels if g is graph)


class _Anchor:
    """One anchored tensor: how it is returned, its device stream and its host buffers."""

    def __init__(self, name: str, art: Any, tensor: popxl.Tensor) -> None:
        self.name = name
        self.art = art
        self.kind: AnchorReturnTypeId = art.id()
        self.shape: Tuple[int, ...] = tuple(tensor.shape)
        self.dtype: np.dtype = tensor.dtype.as_numpy()
        self.stream: Optional[popxl.DeviceToHostStream] = None


class InferenceSession:
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
        self._variables: Dict[str, popxl.Variable] = {}
        self._anchors: Dict[str, _Anchor] = {}
        self._build()
        self._px: Optional[popxl.Session] = None
        self._host_outputs: Optional[Dict[Any, np.ndarray]] = None
        self._run_seconds: List[float] = []
        logger.debug("InferenceSession %r: %d ONNX nodes, %d weights, inputs %s, anchors %s", name,
                     len(self._model.graph.node), len(self._variables), self.getInputTensorIds(), list(self._anchors))

    # building -------------------------------------------------------------------------------------------
    def _prepare_model(self, model: onnx.ModelProto, inputShapeInfo: Optional[InputShapeInfo]) -> onnx.ModelProto:
        """The model to import: the user's, with the nodes of any loss objects appended (their
        inputs the model lacks, such as labels, become model inputs typed by ``inputShapeInfo``)."""
        if not self._loss_objects:
            return model
        out = onnx.ModelProto()
        out.CopyFrom(model)
        g = out.graph
        defined = {v.name for v in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
        shapes = inputShapeInfo.getAllTensorInfo() if inputShapeInfo is not None else {}
        for loss in self._loss_objects:
            for x in loss.getInputIds():
                if x in defined:
                    continue
                if x in shapes:
                    info = shapes[x]
                    g.input.append(onnx.helper.make_tensor_value_info(
                        x, onnx.helper.np_dtype_to_tensor_dtype(info.numpy_dtype()), info.shape()))
                else:
                    g.input.append(onnx.helper.make_empty_tensor_value_info(x))
                defined.add(x)
            g.node.append(loss.node())
            defined.add(loss.output())
        if not any(o.domain == GRAPHCORE_DOMAIN for o in out.opset_import):
            out.opset_import.append(onnx.helper.make_opsetid(GRAPHCORE_DOMAIN, 1))
        return out

    @property
    def _steps(self) -> int:
        """Iterations of the step graph per run: one per micro batch of one replica."""
        return self.batchesPerStep * self.accumulationFactor

    def _launch_replicas(self, options: SessionOptions) -> int:
        """The replicas of every instance: with ``enableDistributedReplicatedGraphs`` (set by
        ``popdist.popart.configureSessionOptions`` under poprun), the launch's, checked against the
        launch environment; else this instance's."""
        if not options.enableDistributedReplicatedGraphs:
            return self.replicationFactor
        import popdist
        launch = popdist.launch_environment()
        asked = (options.globalReplicationFactor, options.globalReplicaOffset, self.replicationFactor)
        actual = (launch.num_total_replicas, launch.replica_index_offset, launch.num_local_replicas)
        if asked != actual:
            raise popart_exception(
                f"{type(self).__name__}: enableDistributedReplicatedGraphs with globalReplicationFactor={asked[0]}, "
                f"globalReplicaOffset={asked[1]} and replicatedGraphCount={asked[2]}, but the launch (poprun, popdist) "
                f"has {actual[0]} replicas, this instance's from {actual[1]}, {actual[2]} per instance. Use "
                f"popdist.popart.configureSessionOptions(opts) under poprun.")
        return launch.num_total_replicas

    def _new_ir(self) -> popxl.Ir:
        """The Ir to build in: this instance's replicas, part of the launch's under poprun."""
        if self.globalReplicationFactor != self.replicationFactor:
            return popxl.Ir(replication="popdist")
        return popxl.Ir(replication=self.replicationFactor)

    def _build(self) -> None:
        ir = self._new_ir()
        ir.num_host_transfers = self._steps
        main = ir.main_graph
        self._in_streams = self._input_streams(main)
        body = ir.create_empty_graph("popart_step")
        thread = ByRef([body])

        def weight(name: str, value: np.ndarray) -> popxl.Tensor:
            # By reference: the step graph reads the variable in place instead of a copy of it.
            return thread(self._new_weight(main, name, value), _safe(name))

        accumulators: List[Tuple[_Anchor, popxl.Tensor]] = []
        self._make_seed(main)
        with body:
            loaded = {name: ops.host_load(s, _safe(name)) for name, s in self._in_streams.items()}
            rounder = self._rounder(thread)
            self._importer.rounder = rounder if self.options.enableStochasticRounding else None
            self._importer.random = rounder
            self._importer.lower(loaded, weight)
            self._store_seed(rounder, thread)
            self._check_anchors(set(self._importer.names()))
            for name in self.dataFlow.anchors():
                self._sink_anchor(name, self._importer.tensor(name), main, thread, accumulators)
        # Inference only (TrainingSession builds its own program): the Session's transform pipeline
        # folds the batch norms into the convolutions (computed on the device from the weights) and
        # fuses relu / residual adds in; the folding (any computation on the weights alone) leaves
        # the loop, and lowering makes it part of the static program, run only when the weights
        # were written.
        pipeline.mark(body, pipeline.INFERENCE)
        self._finish_main(main, body, self._steps, thread, accumulators)
        self._ir = ir

    # stochastic rounding: a seed variable, split for every rounding and stored back each step
    def _needs_random(self) -> bool:
        """Whether the program draws random numbers (stochastic rounding, random ops; dropout when
        training)."""
        from popart.onnx.ops import RANDOM_OPS
        return bool(self.options.enableStochasticRounding) or any(
            n.op_type in RANDOM_OPS for n in all_nodes(self._importer.graph))

    def _make_seed(self, main: popxl.Graph) -> None:
        self._seed_var: Optional[popxl.Variable] = None
        if self._needs_random():
            with main:
                self._seed_var = popxl.variable(seed_value(None), name="random_seed")

    def _rounder(self, thread: "ByRef", depth: Optional[int] = None) -> Optional[StochasticRounder]:
        """A source of random numbers (and stochastic rounder) for the graph ``depth`` levels in,
        or None when the program draws none."""
        if self._seed_var is None:
            return None
        return StochasticRounder(thread(self._seed_var, "random_seed", depth))

    def _store_seed(self, rounder: Optional[StochasticRounder], thread: "ByRef", depth: Optional[int] = None) -> None:
        if rounder is not None:
            ops.var_updates.copy_var_update_(thread(self._seed_var, "random_seed", depth), rounder.seed)

    def setRandomSeed(self, seedValue: int) -> None:
        """Seed the session's random numbers (stochastic rounding, dropout)."""
        if getattr(self, "_seed_var", None) is not None:
            self._set_host_weights({self._seed_var: seed_value(seedValue)})

    def _input_streams(self, main: popxl.Graph) -> Dict[str, popxl.HostToDeviceStream]:
        with main:
            return {s.name: popxl.h2d_stream(s.shape, dtypes.from_numpy(s.device_dtype), _safe(s.name))
                    for s in self._inputs}

    def _new_weight(self, main: popxl.Graph, name: str, value: np.ndarray) -> popxl.Variable:
        with main:
            var = popxl.variable(device_array(value), name=_safe(name))
        self._variables[name] = var
        return var

    def _check_anchors(self, known: set) -> None:
        missing = [a for a in self.dataFlow.anchors() if a not in known]
        if missing:
            outputs = [o.name for o in self._model.graph.output]
            raise popart_exception(f"DataFlow anchors {missing} are not tensors of the model (its outputs are "
                                   f"{outputs}; any tensor a node produces can be anchored).")

    def _sink_anchor(self, name: str, t: popxl.Tensor, main: popxl.Graph, thread: "ByRef",
                     accumulators: List[Tuple[_Anchor, popxl.Tensor]]) -> None:
        """Send anchor ``name`` (value ``t`` in the current graph) to the host: a ``host_store`` per
        batch (ALL, EVERYN) or an update of a main-graph accumulator (SUM adds, FINAL copies),
        stored after the loop by ``_finish_main``."""
        a = _Anchor(name, self.dataFlow.art(name), t)
        self._anchors[name] = a
        with main:
            a.stream = popxl.d2h_stream(t.shape, t.dtype, _safe(name))
        if a.kind in _PER_BATCH:
            ops.host_store(a.stream, t)
            return
        with main:
            acc = ops.init(t.shape, t.dtype, _safe(name) + "_acc")
        acc_in = thread(acc, _safe(name) + "_acc")
        if a.kind is AnchorReturnTypeId.SUM:
            ops.add_(acc_in, t)
        else:
            ops.var_updates.copy_var_update_(acc_in, t)
        accumulators.append((a, acc))

    @staticmethod
    def _finish_main(main: popxl.Graph, body: popxl.Graph, count: int, thread: "ByRef",
                     accumulators: List[Tuple[_Anchor, popxl.Tensor]]) -> None:
        with main:
            ops.repeat(body, count, inputs_dict=thread.bindings(body))
            # The accumulated value is stored num_host_transfers times, like every other stream (a
            # stream transferred another number of times is legal, but logged); the host keeps the
            # first (see _anchor_value).
            for a, acc in accumulators:
                store = main.ir.create_graph(lambda value, stream=a.stream: ops.host_store(stream, value), acc)
                ops.repeat(store, main.ir.num_host_transfers, acc)

    # shapes ---------------------------------------------------------------------------------------------
    def _lead(self) -> Tuple[int, ...]:
        return _drop_ones(self.batchesPerStep, self.accumulationFactor, self.replicationFactor)

    def getInputShape(self, tensorId: str) -> Tuple[int, ...]:
        """The shape ``PyStepIO`` needs for input ``tensorId``:
        [batchesPerStep, accumulationFactor, replicationFactor, *shape] with size-1 factors dropped."""
        return self._lead() + self._input(tensorId).shape

    def getAnchorShape(self, tensorId: str) -> Tuple[int, ...]:
        """The shape of the host buffer of anchor ``tensorId`` (PopART's rules per return type)."""
        a = self._anchor(tensorId)
        if a.kind is AnchorReturnTypeId.ALL:
            return self._lead() + a.shape
        if a.kind is AnchorReturnTypeId.EVERYN:
            return _drop_ones(self.batchesPerStep // a.art.rp(), self.accumulationFactor,
                              self.replicationFactor) + a.shape
        return _drop_ones(self.replicationFactor) + a.shape

    def _input(self, tensorId: str) -> InputSpec:
        for s in self._inputs:
            if s.name == tensorId:
                return s
        raise popart_exception(f"{tensorId!r} is not an input of the model; inputs are {self.getInputTensorIds()}.")

    def _anchor(self, tensorId: str) -> _Anchor:
        if tensorId not in self._anchors:
            raise popart_exception(f"{tensorId!r} is not an anchor; anchors are {list(self._anchors)}.")
        return self._anchors[tensorId]

    def getInputTensorIds(self) -> List[str]:
        """The model inputs the host feeds each run (initializers excluded)."""
        return [s.name for s in self._inputs]

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
        s = self._input(tensorId)
        return TensorInfo(s.device_dtype, s.shape)

    def initAnchorArrays(self) -> Dict[str, np.ndarray]:
        """Zeroed host buffers for every anchor, shaped as ``getAnchorShape`` says."""
        return {name: np.zeros(self.getAnchorShape(name), a.dtype) for name, a in self._anchors.items()}

    # device ---------------------------------------------------------------------------------------------
    def prepareDevice(self, loadEngine: bool = True) -> None:
        """Compile the program for the device and, with ``loadEngine``, attach and load it."""
        logger.log(TRACE, "Session::prepareDevice")
        if self._px is None:
            if self.deviceInfo.type is DeviceType.Ipu:
                logger.warning("running a program for IPU hardware on the CPU engine (POPXL_IPU_HW=cpu).")
            try:
                self._px = popxl.Session(self._ir, self.deviceInfo._popxl_device)
            except (ValueError, TypeError, NotImplementedError, KeyError, IndexError, AssertionError) as e:
                # The program was built by this package: failing to compile it is our bug.
                raise popart_internal_exception(f"prepareDevice: the program of session {self.name!r} could not "
                                                f"be compiled: {type(e).__name__}: {e}") from e
            if self._profiling():
                self._engine().profiling = True
                logger.info("profiling enabled: %s.", measurement_note(self._engine().name))
            self._host_outputs = self._px.create_host_outputs()
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

    def _host_weights(self) -> Dict[str, np.ndarray]:
        if self._px is None:
            return {n: v._host_data_value for n, v in self._variables.items()}
        data = self._px.get_tensors_data(self._variables.values())
        return {n: data[v] for n, v in self._variables.items()}

    def _weight_ids(self, weightsIo: PyWeightsIO, what: str) -> None:
        if not isinstance(weightsIo, PyWeightsIO):
            raise popart_exception(f"{what}: expected a popart.PyWeightsIO, not {weightsIo!r}.")
        unknown = [k for k in weightsIo.weights if k not in self._variables]
        if unknown:
            raise popart_exception(f"{what}: {unknown} are not weights of this session; its weights are "
                                   f"{list(self._variables)}.")
        for k, arr in weightsIo.weights.items():
            want = self._variables[k].shape
            if not isinstance(arr, np.ndarray) or arr.shape != want:
                got = arr.shape if isinstance(arr, np.ndarray) else type(arr).__name__
                raise popart_exception(f"{what}: the array for weight {k!r} has shape {got}, expected {want}.")

    def readWeights(self, weightsIo: PyWeightsIO) -> None:
        """Fill the arrays of ``weightsIo`` with the host weights (call ``weightsToHost`` first to
        get the device values)."""
        self._weight_ids(weightsIo, "readWeights")
        values = self._host_weights()
        for k, arr in weightsIo.weights.items():
            arr[...] = values[k]

    def writeWeights(self, weightsIo: PyWeightsIO) -> None:
        """Set the host weights from ``weightsIo``; ``weightsFromHost`` then sends them to the device."""
        self._weight_ids(weightsIo, "writeWeights")
        self._set_host_weights({self._variables[k]: np.asarray(v, self._variables[k].dtype.as_numpy())
                                for k, v in weightsIo.weights.items()})

    def _set_host_weights(self, updates: Mapping[popxl.Variable, np.ndarray]) -> None:
        if self._px is None:
            for var, value in updates.items():
                var._host_data_value[...] = value
        else:
            self._px.write_variables_data(dict(updates))

    def modelToHost(self, fn: str) -> None:
        """Write the model, with the current weights as its initializers, to the file ``fn``."""
        if self._px is not None and self._px.is_attached:
            self._px.weights_to_host()
        values = self._host_weights()
        model = onnx.ModelProto()
        model.CopyFrom(self._user_model)
        for init in model.graph.initializer:
            if init.name in values:
                original = numpy_helper.to_array(init)
                init.CopyFrom(numpy_helper.from_array(values[init.name].astype(original.dtype), init.name))
        onnx.save(model, fn)

    def resetHostWeights(self, modelProtoOrFilename: ModelLike,
                         ignoreWeightsInModelWithoutCorrespondingHostWeight: bool = False) -> None:
        """Take the host weights from the initializers of another model (file, bytes or ModelProto);
        call ``weightsFromHost`` to send them to the device."""
        other = load_model(modelProtoOrFilename)
        updates = {}
        for init in other.graph.initializer:
            if init.name not in self._variables:
                if init.name in self._importer.initializers:
                    continue  # shape data folded at import, not a weight
                if ignoreWeightsInModelWithoutCorrespondingHostWeight:
                    continue
                raise popart_exception(f"resetHostWeights: the model has weight {init.name!r}, which this session "
                                       f"does not have.")
            var = self._variables[init.name]
            value = device_array(numpy_helper.to_array(init))
            if value.shape != var.shape:
                raise popart_exception(f"resetHostWeights: weight {init.name!r} has shape {value.shape}, the session "
                                       f"expects {var.shape}.")
            updates[var] = value.astype(var.dtype.as_numpy())
        self._set_host_weights(updates)

    # running --------------------------------------------------------------------------------------------
    def run(self, stepio: Union[PyStepIO, PyStepIOCallback], debugName: str = "") -> None:
        """Run ``batchesPerStep`` batches, reading inputs from and writing anchors to ``stepio``."""
        logger.log(TRACE, "Session::run %s", debugName)
        px = self._attached("run")
        if isinstance(stepio, PyStepIO):
            inputs = self._inputs_from_arrays(stepio)
            self._check_outputs(stepio.outputs)
        elif isinstance(stepio, PyStepIOCallback):
            inputs = self._inputs_from_callbacks(stepio)
        else:
            raise popart_exception(f"Session.run: expected a popart.PyStepIO or PyStepIOCallback, not {stepio!r}.")
        start = time.perf_counter()
        try:
            px.run_with_outputs(inputs, self._host_outputs)
        except NotImplementedError as e:  # an op without a kernel for its dtypes
            raise poplibs_exception(f"Session.run: {e}") from e
        except (RuntimeError, ValueError, FloatingPointError) as e:
            raise poplar_application_runtime_error(f"Session.run: the program failed: {type(e).__name__}: {e}") from e
        self._run_seconds.append(time.perf_counter() - start)
        results = {name: self._anchor_value(a) for name, a in self._anchors.items()}
        if self.options.enableFloatingPointChecks:
            self._check_floating_point(results)
        if isinstance(stepio, PyStepIO):
            for name, value in results.items():
                stepio.outputs[name][...] = value
        else:
            self._outputs_to_callbacks(stepio, results)

    def _check_floating_point(self, results: Mapping[str, np.ndarray]) -> None:
        """enableFloatingPointChecks: an IPU traps on NaN and overflow; here the anchors and weights
        are checked after the run (the first bad tensor is named)."""
        values = dict(results)
        self.weightsToHost()
        values.update(self._host_weights())
        for name, v in values.items():
            if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
                raise poplar_application_runtime_error(
                    f"Session.run: floating-point exception (enableFloatingPointChecks): tensor {name!r} has "
                    f"{int(np.sum(np.isnan(v)))} NaN and {int(np.sum(np.isinf(v)))} infinite values.")

    def _inputs_from_arrays(self, stepio: PyStepIO) -> Dict[popxl.HostToDeviceStream, np.ndarray]:
        given = stepio.inputs
        expected = self.getInputTensorIds()
        missing = [k for k in expected if k not in given]
        extra = [k for k in given if k not in expected]
        if missing or extra:
            parts = []
            if missing:
                parts.append("missing input(s) " + ", ".join(
                    f"{k!r} (expected shape {self.getInputShape(k)})" for k in missing))
            if extra:
                parts.append(f"unknown input(s) {extra} (the model's inputs are {expected})")
            raise StepIOError("PyStepIO: " + "; ".join(parts) + ".")
        streams = self._streams_by_name()
        out = {}
        for s in self._inputs:
            arr = np.asarray(given[s.name])
            want = self.getInputShape(s.name)
            if arr.shape != want:
                raise StepIOError(
                    f"PyStepIO: input {s.name!r} has shape {arr.shape}, expected {want} ({self._explain(s.shape)}).")
            out[streams[s.name]] = self._device_layout(self._to_device_dtype(s, arr))
        return out

    def _explain(self, shape: Tuple[int, ...]) -> str:
        parts = [f"{n}={v}" for n, v in (("batchesPerStep", self.batchesPerStep),
                                          ("accumulationFactor", self.accumulationFactor),
                                          ("replicationFactor", self.replicationFactor)) if v != 1]
        return " x ".join(parts + [f"tensor shape {shape}"])

    def _to_device_dtype(self, s: InputSpec, arr: np.ndarray) -> np.ndarray:
        if arr.dtype not in (s.dtype, s.device_dtype):
            raise StepIOError(f"PyStepIO: input {s.name!r} has dtype {arr.dtype}, expected {s.dtype}.")
        arr = arr.astype(s.device_dtype, copy=False)
        host = dtypes.from_numpy(s.device_dtype).as_numpy()
        if host.names:  # popxl's float8 host form: the raw one-byte codes of the ml_dtypes values
            return np.ascontiguousarray(arr).view(np.uint8).view(host).reshape(arr.shape)
        return arr

    def _device_layout(self, arr: np.ndarray) -> np.ndarray:
        """A user buffer [bps, af, rf, *shape] as popxl's host layout [steps, rf, *shape] (size 1 dropped)."""
        lead = len(self._lead())
        shape = arr.shape[lead:]
        return np.ascontiguousarray(arr).reshape(_drop_ones(self._steps, self.replicationFactor) + shape)

    def _streams_by_name(self) -> Dict[str, popxl.HostToDeviceStream]:
        return self._in_streams

    def _check_outputs(self, outputs: Mapping[str, np.ndarray]) -> None:
        missing = [k for k in self._anchors if k not in outputs]
        if missing:
            raise StepIOError("PyStepIO: no output buffer for anchor(s) " + ", ".join(
                f"{k!r} (expected shape {self.getAnchorShape(k)})" for k in missing) + "; use initAnchorArrays().")
        for name in self._anchors:
            buf = outputs[name]
            want = self.getAnchorShape(name)
            if not isinstance(buf, np.ndarray) or buf.shape != want:
                got = buf.shape if isinstance(buf, np.ndarray) else type(buf).__name__
                raise StepIOError(f"PyStepIO: the output buffer of anchor {name!r} has shape {got}, expected {want}.")

    def _anchor_value(self, a: _Anchor) -> np.ndarray:
        """The anchor's host result, from popxl's per-transfer stream buffer."""
        buf = self._host_outputs[a.stream].reshape((self._steps, self.replicationFactor) + a.shape)
        if a.kind is AnchorReturnTypeId.ALL:
            value = buf
        elif a.kind is AnchorReturnTypeId.EVERYN:
            per_batch = buf.reshape((self.batchesPerStep, self.accumulationFactor * self.replicationFactor) + a.shape)
            value = per_batch[a.art.rp() - 1::a.art.rp()]  # batches N, 2N, ... counting from 1
        else:
            value = buf[0]  # stored after the loop (num_host_transfers times, the same value)
        return value.reshape(self.getAnchorShape(a.name))

    def _fetches(self, kind: AnchorReturnTypeId, rp: int) -> int:
        if kind is AnchorReturnTypeId.ALL:
            return self._steps * self.replicationFactor
        if kind is AnchorReturnTypeId.EVERYN:
            return self._steps // rp * self.replicationFactor
        return self.replicationFactor

    def _inputs_from_callbacks(self, stepio: PyStepIOCallback) -> Dict[popxl.HostToDeviceStream, np.ndarray]:
        streams = self._streams_by_name()
        bufs = {s.name: np.empty((self._steps * self.replicationFactor,) + s.shape, s.device_dtype)
                for s in self._inputs}
        for k in range(self._steps * self.replicationFactor):
            for s in self._inputs:
                arr = np.asarray(stepio.input_callback(s.name, False))
                if arr.shape != s.shape:
                    raise StepIOError(f"PyStepIOCallback: input_callback({s.name!r}) returned shape {arr.shape}, "
                                      f"expected {s.shape} (one micro batch).")
                bufs[s.name][k] = self._to_device_dtype(s, arr)
                stepio.input_complete_callback(s.name)
        return {streams[s.name]: bufs[s.name].reshape(_drop_ones(self._steps, self.replicationFactor) + s.shape)
                for s in self._inputs}

    def _outputs_to_callbacks(self, stepio: PyStepIOCallback, results: Dict[str, np.ndarray]) -> None:
        for name, a in self._anchors.items():
            rp = a.art.rp() if a.kind is AnchorReturnTypeId.EVERYN else 1
            values = results[name].reshape((self._fetches(a.kind, rp),) + a.shape)
            for v in values:
                buf = stepio.output_callback(name)
                if not isinstance(buf, np.ndarray) or buf.shape != a.shape:
                    got = buf.shape if isinstance(buf, np.ndarray) else type(buf).__name__
                    raise StepIOError(f"PyStepIOCallback: output_callback({name!r}) returned a buffer of shape {got}, "
                                      f"expected {a.shape}.")
                buf[...] = v
                stepio.output_complete_callback(name)

    # reports --------------------------------------------------------------------------------------------
    def _profiling(self) -> bool:
        return str(self.options.engineOptions.get("autoReport.all", "false")).lower() == "true" or \
            str(self.options.engineOptions.get("autoReport.outputExecutionProfile", "false")).lower() == "true"

    def getSummaryReport(self, resetProfile: bool = True) -> str:
        """A text summary of the program and, when profiling is enabled (engineOptions
        ``autoReport.all``), of the runs since the last reset: their number and wall-clock times."""
        n_ops = sum(len(g.schedule()) for g in self._ir._all_graphs())
        lines = [f"popart session {self.name!r}: {len(self._model.graph.node)} ONNX nodes lowered to {n_ops} popxl "
                 f"ops, {len(self._variables)} weights, batchesPerStep={self.batchesPerStep}, "
                 f"replicationFactor={self.replicationFactor}, device={self.deviceInfo!r}."]
        lines += self._summary_lines()
        if not self._profiling():
            lines.append("Execution profiling not enabled.")
        else:
            times = self._run_seconds
            lines.append(f"Execution: {len(times)} run(s)" + (
                f", total {sum(times) * 1e3:.3f} ms, mean {np.mean(times) * 1e3:.3f} ms per run, "
                f"{sum(times) * 1e3 / (len(times) * self.batchesPerStep):.3f} ms per batch." if times else "."))
            op_times = self._op_times()
            if op_times:
                report = build_report(self._px._exe, op_times, times, self._engine().name)
                lines.append(f"Per-op times ({report.header}); slowest ops:")
                lines += [f"  {o!r}" for o in report.opsByTime()[:10]]
            if resetProfile:
                self._reset_profile()
        return "\n".join(lines)

    def _engine(self):
        return self._px._engine  # the popxl Session's engine: native unless POPXL_ENGINE says otherwise

    def _op_times(self):
        return self._engine().op_profile() if self._px is not None and self._engine().profiling else None

    def _reset_profile(self) -> None:
        self._run_seconds = []
        if self._px is not None and self._engine().profiling:
            self._engine().reset_profile()

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
        report = build_report(self._px._exe, self._op_times(), self._run_seconds, self._engine().name,
                              showExecutionSteps=steps)
        if resetProfile:
            self._reset_profile()
        return report

    def getCycleCount(self, id: str = "") -> int:
        raise popart_exception("getCycleCount: hardware cycle counters exist only on IPU hardware.")

    def __repr__(self) -> str:
        return f"InferenceSession({self.name!r}, inputs={self.getInputTensorIds()}, anchors={list(self._anchors)})"

