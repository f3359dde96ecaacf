"""The popxl program a popart session runs, built from its ONNX model (``ProgramBuilder``, the part
of ``InferenceSession`` that ``TrainingSession`` replaces with its own ``_build``).

The inference program:

- main graph: one variable per weight (float initializer) and a ``repeat`` of the step graph,
  ``batchesPerStep * accumulationFactor`` times (``ir.num_host_transfers`` is that count, so each
  iteration reads the next slice of every input stream);
- step graph: ``host_load`` of every model input, the imported nodes, then per anchor: a
  ``host_store`` every iteration (ALL and EVERYN; EVERYN keeps every N-th batch on the host), or
  an in-place update of a main-graph accumulator passed by reference (SUM adds, FINAL copies),
  which the main graph stores once after the loop. The step graph is marked for inference
  (``popxl.transforms.pipeline.INFERENCE``): when the program is compiled, popxl's transform
  pipeline fuses its convolutions and hoists the computations on weights alone out of the loop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx

import popxl
import popxl.ops as ops
from popxl import dtypes
from popxl.distributed import launch_environment
from popxl.transforms import pipeline

from popart.dataflow import AnchorReturnType, AnchorReturnTypeId, DataFlow, InputShapeInfo
from popart.errors import popart_exception
from popart.losses import GRAPHCORE_DOMAIN, Loss
from popart.onnx.importer import GraphImporter, InputSpec
from popart.onnx.ops import RANDOM_OPS
from popart.onnx.protos import all_nodes, device_array
from popart.options import SessionOptions
from popart.rounding import StochasticRounder, seed_value

if TYPE_CHECKING:  # the session's layer, above this one (.importlinter)
    from popart.weights import HostWeights

__all__ = ["ProgramBuilder", "ByRef", "Anchor", "drop_ones", "safe_name", "PER_BATCH"]

PER_BATCH = (AnchorReturnTypeId.ALL, AnchorReturnTypeId.EVERYN)


def drop_ones(*dims: int) -> Tuple[int, ...]:
    """``dims`` without the 1s (PopART's buffer shapes leave out factors of 1)."""
    return tuple(d for d in dims if d != 1)


def safe_name(name: str) -> str:
    """An ONNX tensor name as a popxl name (no scope separators)."""
    return name.replace("/", "_") or "onnx"


class ByRef:
    """Threads main-graph tensors into nested subgraphs (outermost first) as by-reference inputs,
    so every level reads and updates the same storage; ``bindings(graph)`` is what the call of
    ``graph`` passes in."""

    def __init__(self, graphs: Sequence[popxl.Graph]) -> None:
        # per level: its graph, the main-graph tensors' inputs in it, and what its call binds to them
        self._levels: List[Tuple[popxl.Graph, Dict[popxl.Tensor, popxl.Tensor], Dict[popxl.Tensor, popxl.Tensor]]] = \
            [(g, {}, {}) for g in graphs]

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


class Anchor:
    """One anchored tensor: how it is returned and its device stream."""

    def __init__(self, name: str, art: AnchorReturnType, tensor: popxl.Tensor,
                 stream: popxl.DeviceToHostStream) -> None:
        self.name = name
        self.art = art
        self.kind: AnchorReturnTypeId = art.id()
        self.shape: Tuple[int, ...] = tuple(tensor.shape)
        self.dtype: np.dtype = tensor.dtype.as_numpy()
        self.stream = stream

    @property
    def every(self) -> int:
        """The batches between two values kept on the host: N for EVERYN, else 1."""
        return self.art.rp() if self.kind is AnchorReturnTypeId.EVERYN else 1


class ProgramBuilder:
    """Builds the session's popxl Ir from its ONNX model (``_build``, called once by the session's
    constructor). It reads the session's ``options``, ``dataFlow``, ``batchesPerStep``,
    ``accumulationFactor``, replication factors, ``_importer`` (the model's nodes as popxl ops),
    ``_inputs`` and ``_loss_objects``, and fills ``_ir``, ``_in_streams`` (one per model input),
    ``_anchors`` (``Anchor`` by name), ``_seed_var`` and the weights (``_weights.add``)."""

    # set by the session's constructor before ``_build``
    options: SessionOptions
    dataFlow: DataFlow
    batchesPerStep: int
    accumulationFactor: int
    replicationFactor: int  # this instance's replicas
    globalReplicationFactor: int  # every instance's (poprun)
    _loss_objects: List[Loss]
    _model: onnx.ModelProto
    _importer: GraphImporter
    _inputs: List[InputSpec]
    _weights: HostWeights
    _anchors: Dict[str, Anchor]
    # set by ``_build``
    _ir: popxl.Ir
    _in_streams: Dict[str, popxl.HostToDeviceStream]
    _seed_var: Optional[popxl.Variable]

    # the model ----------------------------------------------------------------------------------------
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
        launch = launch_environment()
        asked = (options.globalReplicationFactor, options.globalReplicaOffset, self.replicationFactor)
        actual = (launch.num_total_replicas, launch.replica_index_offset, launch.num_local_replicas)
        if asked != actual:
            raise popart_exception(
                f"{type(self).__name__}: enableDistributedReplicatedGraphs with globalReplicationFactor={asked[0]}, "
                f"globalReplicaOffset={asked[1]} and replicatedGraphCount={asked[2]}, but the launch (poprun, popdist) "
                f"has {actual[0]} replicas, this instance's from {actual[1]}, {actual[2]} per instance. Use "
                f"popdist.popart.configureSessionOptions(opts) under poprun.")
        return launch.num_total_replicas

    # the program --------------------------------------------------------------------------------------
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
            return thread(self._new_weight(main, name, value), safe_name(name))

        accumulators: List[Tuple[Anchor, popxl.Tensor]] = []
        self._make_seed(main)
        with body:
            loaded = {name: ops.host_load(s, safe_name(name)) for name, s in self._in_streams.items()}
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
        return bool(self.options.enableStochasticRounding) or any(
            n.op_type in RANDOM_OPS for n in all_nodes(self._importer.graph))

    def _make_seed(self, main: popxl.Graph) -> None:
        self._seed_var = None
        if self._needs_random():
            with main:
                self._seed_var = popxl.variable(seed_value(None), name="random_seed")

    def _rounder(self, thread: ByRef, depth: Optional[int] = None) -> Optional[StochasticRounder]:
        """A source of random numbers (and stochastic rounder) for the graph ``depth`` levels in,
        or None when the program draws none."""
        if self._seed_var is None:
            return None
        return StochasticRounder(thread(self._seed_var, "random_seed", depth))

    def _store_seed(self, rounder: Optional[StochasticRounder], thread: ByRef, depth: Optional[int] = None) -> None:
        if rounder is not None:
            assert self._seed_var is not None, "a rounder is made only with the seed variable (_rounder)"
            ops.var_updates.copy_var_update_(thread(self._seed_var, "random_seed", depth), rounder.seed)

    def _input_streams(self, main: popxl.Graph) -> Dict[str, popxl.HostToDeviceStream]:
        with main:
            return {s.name: popxl.h2d_stream(s.shape, dtypes.from_numpy(s.device_dtype), safe_name(s.name))
                    for s in self._inputs}

    def _new_weight(self, main: popxl.Graph, name: str, value: np.ndarray) -> popxl.Variable:
        value = device_array(value)
        with main:
            var = popxl.variable(value, name=safe_name(name))
        self._weights.add(name, var, value)
        return var

    # anchors ------------------------------------------------------------------------------------------
    def _check_anchors(self, known: set) -> None:
        missing = [a for a in self.dataFlow.anchors() if a not in known]
        if missing:
            outputs = [o.name for o in self._model.graph.output]
            raise popart_exception(f"DataFlow anchors {missing} are not tensors of the model (its outputs are "
                                   f"{outputs}; any tensor a node produces can be anchored).")

    def _sink_anchor(self, name: str, t: popxl.Tensor, main: popxl.Graph, thread: ByRef,
                     accumulators: List[Tuple[Anchor, popxl.Tensor]]) -> None:
        """Send anchor ``name`` (value ``t`` in the current graph) to the host: a ``host_store`` per
        batch (ALL, EVERYN) or an update of a main-graph accumulator (SUM adds, FINAL copies),
        stored after the loop by ``_finish_main``."""
        with main:
            stream = popxl.d2h_stream(t.shape, t.dtype, safe_name(name))
        a = Anchor(name, self.dataFlow.art(name), t, stream)
        self._anchors[name] = a
        if a.kind in PER_BATCH:
            ops.host_store(a.stream, t)
            return
        with main:
            acc = ops.init(t.shape, t.dtype, safe_name(name) + "_acc")
        acc_in = thread(acc, safe_name(name) + "_acc")
        if a.kind is AnchorReturnTypeId.SUM:
            ops.add_(acc_in, t)
        else:
            ops.var_updates.copy_var_update_(acc_in, t)
        accumulators.append((a, acc))

    @staticmethod
    def _finish_main(main: popxl.Graph, body: popxl.Graph, count: int, thread: ByRef,
                     accumulators: List[Tuple[Anchor, popxl.Tensor]]) -> None:
        with main:
            ops.repeat(body, count, inputs_dict=thread.bindings(body))
            # The accumulated value is stored num_host_transfers times, like every other stream (a
            # stream transferred another number of times is legal, but logged); the host keeps the
            # first (see popart.stepio).
            for a, acc in accumulators:
                store = main.ir.create_graph(lambda value, stream=a.stream: ops.host_store(stream, value), acc)
                ops.repeat(store, main.ir.num_host_transfers, acc)
