"""``TrainingSession``: an ONNX model, a loss and an optimiser, trained ``batchesPerStep``
weight updates per ``run`` inside the engine.

The program:

- forward graph: the imported model (inputs and weights are graph inputs); outputs are the
  loss, the anchored forward tensors and the new running statistics of BatchNormalization
  (which normalises with batch statistics when training). ``popxl.transforms.autodiff`` builds
  its gradient graph for the trainable weights (floating-point weights the loss depends on,
  running statistics excluded) and for inputs whose gradient is anchored.
- micro-batch: ``host_load`` of the inputs, a call of the forward graph, the write-back of the
  running statistics, a call of the gradient graph seeded with the loss scaling, anchors (as in
  InferenceSession; ``Gradient___<weight or input>`` anchors a gradient). With ``accumulationFactor`` > 1 the micro-batch is its own
  graph, repeated that many times per step, adding its gradients into accumulators.
- step graph (repeated ``batchesPerStep`` times): the micro-batch(es), the gradient reduction
  across replicas (``replicated_all_reduce``) and accumulation steps (Sum or Mean, from
  ``SessionOptions.accumulationAndReplicationReductionType``), division by the loss scaling,
  then the optimiser's in-place updates of the weights and of its state.

Weights, optimiser state and the non-constant hyper-parameters are main-graph variables passed
to the subgraphs by reference, so ``updateOptimizerFromHost`` just writes new scalar values.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

import numpy as np
import popxl
import popxl.ops as ops
from popxl import dtypes, transforms
from popxl.op import REGISTRY, Grad
from popart.dataflow import DataFlow, InputShapeInfo
from popart.devices import DeviceInfo
from popart.errors import TRACE, popart_exception
from popart.losses import Loss, ReductionType, reduction_of
from popart.onnx.importer import ModelLike
from popart.onnx.protos import all_nodes
from popart.optimizers import Optimizer
from popart.options import Patterns, SessionOptions
from popart.rounding import StochasticRounder
from popart.program import Anchor, ByRef, safe_name
from popart.session import InferenceSession

__all__ = ["TrainingSession", "reservedGradientPrefix"]

logger = logging.getLogger("popart.session")

GRADIENT_PREFIX = "Gradient___"


def reservedGradientPrefix() -> str:
    """The prefix of gradient tensor ids: anchor ``Gradient___w`` to get the gradient of weight ``w``."""
    return GRADIENT_PREFIX


LossArg = Union[str, Loss]


class TrainingSession(InferenceSession):
    """Trains an ONNX model.

    ``TrainingSession(fnModel, dataFlow, loss, optimizer, deviceInfo, inputShapeInfo=None,
    patterns=None, userOptions=None)``. ``loss`` is the id of a scalar floating-point tensor of the
    model (e.g. from ``Builder.aiGraphcore.nllloss``); the older ``losses=[popart.NllLoss(...)]``
    appends loss nodes to the model (inputs they name that the model lacks, such as labels,
    become model inputs typed by ``inputShapeInfo``). ``dataFeed`` is the old name of ``dataFlow``.
    """

    def __init__(self, fnModel: ModelLike, dataFlow: Optional[DataFlow] = None, loss: Optional[LossArg] = None,
                 optimizer: Optional[Optimizer] = None, deviceInfo: Optional[DeviceInfo] = None,
                 inputShapeInfo: Optional[InputShapeInfo] = None, patterns: Optional[Patterns] = None,
                 userOptions: Optional[SessionOptions] = None, name: str = "training",
                 dataFeed: Optional[DataFlow] = None, losses: Optional[Sequence[Loss]] = None) -> None:
        if not isinstance(optimizer, Optimizer) or type(optimizer) is Optimizer:  # the base class has no rule
            raise popart_exception(f"TrainingSession: optimizer must be a popart optimiser (ConstSGD, SGD, Adam), "
                                   f"not {optimizer!r}.")
        specs: List[LossArg]
        if loss is not None and losses is None:
            specs = [loss]
        elif losses is not None and loss is None:
            specs = list(losses)
        else:
            raise popart_exception("TrainingSession: give the loss tensor id as loss=..., or loss objects as "
                                   "losses=[...] (one of the two).")
        if not specs:
            raise popart_exception("TrainingSession: losses is empty.")
        for spec in specs:
            if not isinstance(spec, (str, Loss)):
                raise popart_exception(f"TrainingSession: unsupported loss {spec!r}; give a tensor id (str) or "
                                       f"popart.NllLoss / L1Loss / IdentityLoss.")
        self._loss_specs = specs
        self.optimizer = optimizer
        self._pending_optimizer: Optional[Optimizer] = None
        self._hyper_vars: Dict[Tuple[str, Optional[str]], popxl.Variable] = {}
        self._opt_state: Dict[str, List[popxl.Variable]] = {}
        self._trainable: List[str] = []
        self._input_grads: List[str] = []
        super().__init__(fnModel, dataFlow, deviceInfo, inputShapeInfo, patterns, userOptions, name, dataFeed,
                         losses=[s for s in specs if isinstance(s, Loss)])

    # the model --------------------------------------------------------------------------------------
    def _needs_random(self) -> bool:
        return super()._needs_random() or any(n.op_type == "Dropout" for n in all_nodes(self._importer.graph))

    @property
    def _loss_ids(self) -> List[str]:
        return [s.output() if isinstance(s, Loss) else s for s in self._loss_specs]

    def _loss_tensor(self) -> popxl.Tensor:
        """The scalar loss (the sum of several losses), checked."""
        known = set(self._importer.names())
        total: Optional[popxl.Tensor] = None
        for lid in self._loss_ids:
            if lid not in known:
                raise popart_exception(f"TrainingSession: the loss {lid!r} is not a tensor of the model (its outputs "
                                       f"are {[o.name for o in self._model.graph.output]}).")
            t = self._importer.tensor(lid)
            if not t.dtype.is_floating_point:
                raise popart_exception(f"TrainingSession: unsupported loss {lid!r}: it has dtype {t.dtype.name}; a "
                                       f"loss must be a floating-point scalar.")
            if t.nelms != 1:
                raise popart_exception(
                    f"TrainingSession: unsupported loss {lid!r}: it has shape {t.shape}; a loss must be a scalar. "
                    f"Reduce it, e.g. builder.aiGraphcore.identityloss([{lid!r}], popart.ReductionType.Mean).")
            t = ops.reshape(t, ()) if t.shape != () else t
            total = t if total is None else ops.add(total, t)
        assert total is not None, "the constructor refuses an empty list of losses"
        return total

    # building ---------------------------------------------------------------------------------------
    def _build(self) -> None:
        ir = self._new_ir()
        ir.num_host_transfers = self._steps
        main = ir.main_graph
        self._in_streams = self._input_streams(main)
        self._make_seed(main)
        fwd = ir.create_empty_graph("popart_forward")
        weight_inputs: Dict[str, popxl.Tensor] = {}

        def weight(name: str, value: np.ndarray) -> popxl.Tensor:
            var = self._new_weight(main, name, value)
            weight_inputs[name] = popxl.graph_input(var.shape, var.dtype, safe_name(name))
            return weight_inputs[name]

        with fwd:
            data_inputs = {s.name: popxl.graph_input(s.shape, dtypes.from_numpy(s.device_dtype), safe_name(s.name))
                           for s in self._inputs}
            # With stochastic rounding the forward graph takes a fresh seed at each call.
            self._fwd_seed = popxl.graph_input((2,), dtypes.uint32, "random_seed") \
                if self._seed_var is not None else None
            random = StochasticRounder(self._fwd_seed) if self._fwd_seed is not None else None
            self._importer.random = random
            self._importer.rounder = random if self.options.enableStochasticRounding else None
            self._importer.training = True
            self._importer.lower(data_inputs, weight)
            loss = self._loss_tensor()
            grad_anchors = [a for a in self.dataFlow.anchors() if a.startswith(GRADIENT_PREFIX)]
            fwd_anchors = [a for a in self.dataFlow.anchors() if a not in grad_anchors]
            self._check_anchors(set(self._importer.names()) | set(grad_anchors))
            emitted = set()
            for t in [loss] + [self._importer.tensor(a) for a in fwd_anchors]:
                # Inputs and repeated tensors are copied: each output is its own tensor.
                out = ops.identity(t) if t.producer is None or t in emitted else t
                emitted.add(t)
                popxl.graph_output(out)
            # New running statistics (BatchNormalization) follow: written back after each call.
            self._stat_updates = [name for name, _ in self._importer.stat_updates]
            for _, t in self._importer.stat_updates:
                popxl.graph_output(t)
        loss_out = fwd.outputs[0]
        statistics = {x for node in self._model.graph.node if node.op_type == "BatchNormalization"
                      for x in node.input[3:5]}
        self._trainable = [n for n in self._reaching(fwd, weight_inputs, loss_out) if n not in statistics]
        # Gradients of model inputs can be anchored too (PopART's Gradient___<input>).
        wanted_inputs = {a[len(GRADIENT_PREFIX):] for a in grad_anchors} & set(data_inputs)
        self._input_grads = self._reaching(fwd, {n: data_inputs[n] for n in wanted_inputs}, loss_out)
        unknown = [a for a in grad_anchors if a[len(GRADIENT_PREFIX):] not in self._trainable + self._input_grads]
        if unknown:
            raise popart_exception(f"DataFlow anchors {unknown} are not gradients of trainable weights or of "
                                   f"floating-point inputs the loss depends on; the trainable weights are "
                                   f"{self._trainable}.")
        if not self._trainable:
            raise popart_exception("TrainingSession: the loss does not depend on any weight of the model; there is "
                                   "nothing to train.")
        try:
            grad = transforms.autodiff(fwd, grads_provided=[loss_out],
                                       grads_required=[weight_inputs[n] for n in self._trainable] +
                                       [data_inputs[n] for n in self._input_grads])
        except (RuntimeError, NotImplementedError) as e:
            raise popart_exception(f"TrainingSession: the model cannot be differentiated: {e}") from e
        self._make_optimizer_variables(main)

        step = ir.create_empty_graph("popart_step")
        af = self.accumulationFactor
        micro = ir.create_empty_graph("popart_micro_batch") if af > 1 else None
        thread = ByRef([step] + ([micro] if micro is not None else []))
        accumulators: List[Tuple[Anchor, popxl.Tensor]] = []
        grad_accs: Dict[str, popxl.Variable] = {}
        if micro is not None:
            with main:
                for n in self._trainable:
                    v = self._variables[n]
                    grad_accs[n] = popxl.variable(np.zeros(v.shape, v.dtype.as_numpy()), name=safe_name(n) + "_grad_accl")
            with micro:
                grads = self._micro_batch(fwd, grad, data_inputs, weight_inputs, fwd_anchors, main, thread,
                                          accumulators)
                for n, g in grads.items():
                    ops.var_updates.accumulate_(thread(grad_accs[n], safe_name(n) + "_grad_accl"), g)
        with step:
            if micro is not None:
                ops.repeat(micro, af, inputs_dict=thread.bindings(micro))
                grads = {n: thread(acc, safe_name(n) + "_grad_accl", depth=1) for n, acc in grad_accs.items()}
            else:
                grads = self._micro_batch(fwd, grad, data_inputs, weight_inputs, fwd_anchors, main, thread,
                                          accumulators)
            self._update(grads, thread)
            for n in grad_accs:
                ops.var_updates.accumulator_zero_(grads[n])
        self._finish_main(main, step, self.batchesPerStep, thread, accumulators)
        self._ir = ir

    @staticmethod
    def _reaching(fwd: popxl.Graph, inputs: Dict[str, popxl.Tensor], loss: popxl.Tensor) -> List[str]:
        """The names of ``inputs`` (graph inputs of ``fwd``) that the loss depends on through
        differentiable ops, in the order given."""
        deps: Dict[popxl.Tensor, FrozenSet[str]] = {
            t: frozenset([n]) for n, t in inputs.items() if t.dtype.is_floating_point}
        for op in fwd.schedule():
            if REGISTRY[op.type].grad == Grad.STOP:
                continue
            found = frozenset().union(*(deps.get(i, frozenset()) for i in op.inputs))
            if found:
                for o in op.outputs:
                    if o.dtype.is_floating_point:
                        deps[o] = deps.get(o, frozenset()) | found
        reached = deps.get(loss, frozenset())
        return [n for n in inputs if n in reached]

    def _make_optimizer_variables(self, main: popxl.Graph) -> None:
        opt = self.optimizer
        with main:
            unknown = [w for _, w in opt.hyper_keys() if w is not None and w not in self._variables]
            if unknown:
                raise popart_exception(f"TrainingSession: the optimiser has specific values for {sorted(set(unknown))}, "
                                       f"which are not weights of the model (its weights: {list(self._variables)}).")
            for name, weight in opt.hyper_keys():
                v = opt.value(name, weight)
                if not v.isConst():
                    suffix = f"_{safe_name(weight)}" if weight is not None else ""
                    self._hyper_vars[(name, weight)] = popxl.variable(np.asarray(v.val(), np.float32),
                                                                      name=f"optimizer_{name}{suffix}")
            for n in self._trainable:
                w = self._variables[n]
                self._opt_state[n] = [popxl.variable(value, name=f"{safe_name(n)}_{suffix}")
                                      for suffix, value in opt.state(np.zeros(w.shape, w.dtype.as_numpy()), n)]

    def _hyper(self, thread: ByRef, depth: Optional[int],
               weight: Optional[str] = None) -> Callable[[str], Union[float, popxl.Tensor]]:
        """Hyper-parameter ``name`` for ``weight`` in the graph ``depth`` levels in: a threaded
        device variable if it is not constant, else its value."""
        own = set(self.optimizer.hyper_keys())

        def get(name: str) -> Union[float, popxl.Tensor]:
            key = (name, weight) if (name, weight) in own else (name, None)
            if key in self._hyper_vars:
                return thread(self._hyper_vars[key], self._hyper_vars[key].name, depth)
            return self.optimizer.value(*key).val()
        return get

    def _micro_batch(self, fwd: popxl.Graph, grad: transforms.GradGraphInfo, data_inputs: Dict[str, popxl.Tensor],
                     weight_inputs: Dict[str, popxl.Tensor], fwd_anchors: List[str], main: popxl.Graph,
                     thread: ByRef, accumulators: List[Tuple[Anchor, popxl.Tensor]]) -> Dict[str, popxl.Tensor]:
        """Forward and backward of one micro-batch in the current graph; the weights' gradients
        (of the loss times the loss scaling)."""
        loaded = {name: ops.host_load(s, safe_name(name)) for name, s in self._in_streams.items()}
        bound = {data_inputs[name]: t for name, t in loaded.items()}
        local = {n: thread(self._variables[n], safe_name(n)) for n in weight_inputs}
        bound.update({weight_inputs[n]: local[n] for n in weight_inputs})
        rounder = self._rounder(thread)
        if rounder is not None:
            assert self._fwd_seed is not None, "_build gives the forward graph a seed input when there is a seed"
            bound[self._fwd_seed] = rounder.split()
            self._store_seed(rounder, thread)
        info = ops.call_with_info(fwd, inputs_dict=bound)
        loss = info.outputs[0]
        ls = self._hyper(thread, None)("ls")
        if isinstance(ls, popxl.Tensor):
            seed = ops.reshape(ops.cast(ls, loss.dtype) if ls.dtype is not loss.dtype else ls, loss.shape)
        else:
            seed = popxl.constant(np.full(loss.shape, ls, loss.dtype.as_numpy()))
        grad_info = ops.call_with_info(grad.graph, seed, inputs_dict=grad.inputs_dict(info))
        by_parent = grad.fwd_parent_ins_to_grad_parent_outs(info, grad_info)
        grads = {n: by_parent[local[n]] for n in self._trainable}
        values = dict(zip(fwd_anchors, info.outputs[1:1 + len(fwd_anchors)]))
        first = 1 + len(fwd_anchors)
        for name, new in zip(self._stat_updates, info.outputs[first:first + len(self._stat_updates)]):
            if self.globalReplicationFactor > 1:  # the replicas keep one set of statistics
                new = ops.collectives.replicated_all_reduce(new, "mean")
            ops.var_updates.copy_var_update_(local[name], new)
        values.update({GRADIENT_PREFIX + n: g for n, g in grads.items()})
        values.update({GRADIENT_PREFIX + n: by_parent[loaded[n]] for n in self._input_grads})
        for name in self.dataFlow.anchors():
            t = values[name]
            self._sink_anchor(name, t, main, thread, accumulators)
        return grads

    def _update(self, grads: Dict[str, popxl.Tensor], thread: ByRef) -> None:
        """Reduce the gradients across replicas, undo the loss scaling, and apply the optimiser."""
        hyper = self._hyper(thread, 1)
        rf, af = self.globalReplicationFactor, self.accumulationFactor
        mean = reduction_of(self.options.accumulationAndReplicationReductionType) is ReductionType.Mean
        factor = 1.0 / (rf * af) if mean else 1.0
        ls = hyper("ls")
        rounder = self._rounder(thread, 1) if self.options.enableStochasticRounding else None
        for n in self._trainable:
            g = grads[n]
            if rf > 1:
                g = ops.collectives.replicated_all_reduce(g, "add")
            if isinstance(ls, popxl.Tensor):
                g = ops.div(g, ops.cast(ls, g.dtype) if ls.dtype is not g.dtype else ls)
                scale = factor
            else:
                scale = factor / ls
            if scale != 1.0:
                g = ops.mul(g, popxl.constant(np.asarray(scale, g.dtype.as_numpy())))
            w = thread(self._variables[n], safe_name(n), 1)
            state = [thread(s, s.name, 1) for s in self._opt_state[n]]
            hyper = self._hyper(thread, 1, n)
            if w.dtype is dtypes.float32:
                self.optimizer.update(w, g, hyper, state, n)
                continue
            # Lower-precision weights are updated in float32 and rounded back once (stochastically
            # with enableStochasticRounding), so small updates are not lost to float16 steps.
            w32 = ops.cast(w, dtypes.float32)
            self.optimizer.update(w32, ops.cast(g, dtypes.float32), hyper, state, n)
            ops.var_updates.copy_var_update_(w, rounder(w32) if rounder is not None else ops.cast(w32, w.dtype))
        self._store_seed(rounder, thread, 1)

    # optimiser --------------------------------------------------------------------------------------
    def _write_hyper(self, optimizer: Optimizer) -> None:
        self._weights.set({var: np.asarray(optimizer.value(*key).val(), np.float32)
                           for key, var in self._hyper_vars.items()})

    def updateOptimizerFromHost(self, optimizer: Optimizer) -> None:
        """Use ``optimizer``'s hyper-parameter values from now on (written to the device at once;
        no recompilation). Its kind and constant values must match the compiled optimiser."""
        logger.log(TRACE, "Session::updateOptimizerFromHost")
        if not isinstance(optimizer, Optimizer) or type(optimizer) is Optimizer:  # the base class has no rule
            raise popart_exception(f"updateOptimizerFromHost: expected a popart optimiser, not {optimizer!r}.")
        self.optimizer.compatible(optimizer)
        self.optimizer = optimizer
        self._pending_optimizer = None
        self._write_hyper(optimizer)

    def updateOptimizer(self, optimizer: Optimizer) -> None:
        """Set new hyper-parameter values on the host; ``optimizerFromHost()`` sends them."""
        if not isinstance(optimizer, Optimizer) or type(optimizer) is Optimizer:  # the base class has no rule
            raise popart_exception(f"updateOptimizer: expected a popart optimiser, not {optimizer!r}.")
        self.optimizer.compatible(optimizer)
        self._pending_optimizer = optimizer

    def optimizerFromHost(self) -> None:
        """Copy the optimiser's hyper-parameters (after ``updateOptimizer``) to the device."""
        logger.log(TRACE, "Session::optimizerFromHost")
        self._attached("optimizerFromHost")
        if self._pending_optimizer is not None:
            self.optimizer = self._pending_optimizer
            self._pending_optimizer = None
        self._write_hyper(self.optimizer)

    def getTrainableTensorIds(self) -> List[str]:
        """The weights the optimiser updates."""
        return list(self._trainable)

    def _summary_lines(self) -> List[str]:
        return super()._summary_lines() + [f"Training: loss {self._loss_ids}, optimiser {self.optimizer!r}, {len(self._trainable)} trainable "
                f"weight(s), accumulationFactor={self.accumulationFactor}."]

    def __repr__(self) -> str:
        return (f"TrainingSession({self.name!r}, inputs={self.getInputTensorIds()}, loss={self._loss_ids}, "
                f"optimizer={self.optimizer!r})")
