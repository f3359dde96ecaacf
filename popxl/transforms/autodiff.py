"""Reverse-mode autodiff as an IR transform: forward graph in, gradient graph + `GradGraphInfo` out.

How it works:
1. Find the ops on a path from a tensor whose gradient is *required* to a tensor whose
   gradient is *provided*.
2. Walk those ops in reverse order inside a new graph. Each op's registry entry decides:
   a rule (a callable, declared next to the op with ``popxl.op.grad_rule``) traces that op's
   input gradients from its output gradients; ``Grad.STOP`` lets no gradient through;
   ``Grad.ZERO`` gives zeros; ``Grad.RAISE`` (and no decision at all) is an error naming the op.
3. Forward values a rule reads become gradient-graph inputs (``Fwd`` connections). A forward
   intermediate is first made an extra output of the forward graph, and every ``call`` site of
   that graph gets the matching output, as PopXL does, so the user can pass it in with
   ``GradGraphInfo.inputs_dict(call_info)``.
4. Contributions to one tensor's gradient are summed; the required gradients become the
   gradient graph's outputs, named ``Gradient___<forward name>``. Unused ops are dropped.

Calls and conditionals are differentiated by differentiating the called graphs (recursively,
or with the user's ``called_graphs_grad_info``) and calling their gradient graphs.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Set, Tuple, Union, overload

from popxl import ops
from popxl.grad_graph_info import ExpectedConnection, ExpectedConnectionType, GradGraphInfo
from popxl.graph import Graph, op_called_graphs
from popxl.op import REGISTRY, Grad, Op, create_op
from popxl.tensor import Constant, Tensor, TensorSpec, Variable, constant, graph_input, graph_output

__all__ = ["autodiff", "GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType", "GradOpContext"]

GRAD_PREFIX = "Gradient___"


def _is_float(t: Tensor) -> bool:
    return t.dtype.is_floating_point


def _describe(op: Op) -> str:
    return f"{op.type} {op.name!r} in graph {op.graph.id!r} (created at {op.location})"


def _call_sites(graph: Graph) -> List[Op]:
    """Every op in the IR that calls ``graph`` (as call/repeat body or conditional branch)."""
    return [op for g in graph.ir._all_graphs() for op in g.schedule() if graph in op_called_graphs(op)]


def _append_output(graph: Graph, t: Tensor) -> None:
    """Make ``t`` a new output of ``graph`` and give every site calling it the matching output."""
    sites = _call_sites(graph)
    for op in sites:
        if op.type == "repeat":
            raise NotImplementedError(
                f"autodiff: the gradient needs {t.id!r}, an intermediate of {graph.id!r}, but {graph.id!r} is "
                f"the body of ops.repeat at {op.location}; a loop body cannot get extra outputs. Call the "
                f"graph with ops.call inside the loop body and differentiate that call instead.")
    graph.add_output(t)
    for op in sites:
        if op.type == "if":  # both branches must keep matching outputs: the sibling outputs zeros
            then_g, else_g = op.attrs["then_graph"], op.attrs["else_graph"]
            if then_g is not else_g:
                sibling = else_g if then_g is graph else then_g
                zeros, _ = sibling.trace(lambda: ops.init(t.shape, t.dtype, name=f"zero_{t.name}"))
                sibling.add_output(zeros)
        op.graph.add_op_output(op, TensorSpec(t.shape, t.dtype, t.meta_shape), t.name)


class GradOpContext:
    """What a gradient rule sees while it traces one forward op's gradient into the gradient graph.

    ``input(i)`` / ``output(i)`` are that op's forward values (as gradient-graph tensors),
    ``grad(i)`` the gradient of output ``i`` (None if nothing flows back into it), ``needs(i)``
    whether the gradient of input ``i`` is wanted. The rule returns one gradient (or None) per input.

    Args:
        builder: The gradient graph being built.
        op: The forward op differentiated.
        out_grads: The gradient of each of its outputs (None where none flows back).
    """

    def __init__(self, builder: "_GradBuilder", op: Op, out_grads: List[Optional[Tensor]]) -> None:
        self._b, self.op, self._out_grads = builder, op, out_grads

    @property
    def attrs(self) -> Dict[str, Any]:
        """The forward op's attributes."""
        return self.op.attrs

    def input(self, i: int) -> Tensor:
        """A forward input of the op, as a gradient-graph tensor.

        Args:
            i: The input's index.

        Returns:
            The tensor.
        """
        return self._b.forward_value(self.op.inputs[i])

    def output(self, i: int) -> Tensor:
        """A forward output of the op, as a gradient-graph tensor.

        Args:
            i: The output's index.

        Returns:
            The tensor.
        """
        return self._b.forward_value(self.op.outputs[i])

    def forward(self, t: Tensor) -> Tensor:
        """Any tensor of the forward graph, as a gradient-graph tensor.

        Args:
            t: A tensor of the forward graph.

        Returns:
            The gradient-graph tensor carrying its value.
        """
        return self._b.forward_value(t)

    def grad(self, i: int) -> Optional[Tensor]:
        # outputs added while differentiating (exposed activations of a called graph) have none
        """The gradient flowing back into one output of the op.

        Args:
            i: The output's index.

        Returns:
            The gradient, or None if nothing flows back into it.
        """
        return self._out_grads[i] if i < len(self._out_grads) else None

    def grad_or_zeros(self, i: int) -> Tensor:
        """The gradient flowing back into one output, or zeros of its shape if none does.

        Args:
            i: The output's index.

        Returns:
            The gradient.
        """
        g = self.grad(i)
        if g is not None:
            return g
        out = self.op.outputs[i]
        return ops.init(out.shape, out.dtype, name=f"zero_grad_{out.name}")

    def needs(self, i: int) -> bool:
        """Whether the gradient of one input of the op is wanted.

        Args:
            i: The input's index.

        Returns:
            True if it is.
        """
        return self._b.needs_grad(self.op.inputs[i])

    def unbroadcast(self, g: Tensor, i: int) -> Tensor:
        """Sum ``g`` over the axes along which input ``i`` was broadcast, back to its shape.

        Args:
            g: A gradient of the op's output shape.
            i: The input's index.

        Returns:
            ``g`` reduced to input ``i``'s shape.
        """
        shape = self.op.inputs[i].shape
        if g.shape == shape:
            return g
        lead = len(g.shape) - len(shape)
        axes = list(range(lead)) + [lead + a for a, d in enumerate(shape) if d == 1 and g.shape[lead + a] != 1]
        if axes:
            g = ops.sum(g, axes, keepdims=True)
        return g.reshape(shape) if g.shape != shape else g

    def subgraph_grad(self, graph: Graph, provided: Sequence[Tensor], required: Sequence[Tensor]) -> GradGraphInfo:
        """The gradient graph of a called graph (the user's from ``called_graphs_grad_info`` if given).

        Args:
            graph: The called graph.
            provided: Its outputs whose gradients come in.
            required: Its inputs whose gradients are wanted.

        Returns:
            The `GradGraphInfo` of its gradient graph.
        """
        return self._b.subgraph_grad(graph, provided, required)

    def clone_graph(self, graph: Graph) -> Graph:
        """A copy of ``graph`` (same inputs, ops and outputs) that can be called and differentiated
        without touching the original (whose call sites may not take extra outputs).

        Args:
            graph: The graph copied.

        Returns:
            The copy.
        """
        return _clone(graph)


class _GradBuilder:
    def __init__(self, fwd: Graph, provided: Sequence[Tensor], required: Sequence[Tensor],
                 called_info: Mapping[Graph, GradGraphInfo], all_infos: Dict[Graph, GradGraphInfo],
                 cache: Dict[Tuple, GradGraphInfo], strict: bool) -> None:
        self.fwd, self.provided, self.required = fwd, list(provided), list(required)
        self.called_info, self.all_infos, self.cache, self.strict = called_info, all_infos, cache, strict
        self.graph = fwd.ir.create_empty_graph(f"{fwd.name}_grad")
        self.values: Dict[Tensor, Tensor] = {}  # forward tensor -> gradient-graph tensor
        self.expected_inputs: List[ExpectedConnection] = []
        self.grads: Dict[Tensor, List[Tensor]] = {}
        self.depends: Set[Tensor] = set()

    # forward values -------------------------------------------------------------------------------
    def forward_value(self, t: Tensor) -> Tensor:
        if t in self.values:
            return self.values[t]
        if t.graph is not self.fwd:
            raise ValueError(f"autodiff: {t.id!r} is not a tensor of the forward graph {self.fwd.id!r}.")
        replay = self._replayable_view(t)
        if replay is not None:  # recompute the view from its source's value: no extra forward output
            source = self.forward_value(replay.inputs[0])
            with self.graph:
                v = create_op(replay.type, [source], dict(replay.attrs))[0]
            self.values[t] = v
            return v
        with self.graph:
            if isinstance(t, Constant):
                v = constant(t._host_data_value, t.dtype, name=t.name)
            else:
                exposed = t
                if t not in self.fwd.inputs and t not in self.fwd.outputs:
                    exposed = self._stable(t)
                    _append_output(self.fwd, exposed)
                v = graph_input(t.shape, t.dtype, t.name, meta_shape=t.meta_shape)
                self.expected_inputs.append(ExpectedConnection._create(exposed, ExpectedConnectionType.Fwd))
        self.values[t] = v
        return v

    def _replayable_view(self, t: Tensor) -> Optional[Op]:
        """The copying view op (reshape, transpose, slice, ...) that made ``t`` from another value,
        when the gradient graph can simply redo it: a forward intermediate whose source nothing
        writes in place. Redone there, it is a view again after lowering, where an extra forward
        output would be a copy (attention's transposed heads) and more memory kept per step."""
        op = t.producer
        if (op is None or op.graph is not self.fwd or op.opdef.view is None or not op.opdef.copy
                or len(op.inputs) != 1 or t in self.fwd.outputs):
            return None
        root = _root(op.inputs[0])
        for o in self.fwd.schedule():
            written = [o.inputs[o.opdef.inplace]] if o.opdef.inplace is not None else []
            if o.type in ("call", "repeat"):  # inputs a called graph may write (by reference)
                written += [o.inputs[o.attrs["input_index"].index(i)] for i in o.attrs["modified"]]
            if any(_root(w) is root for w in written):
                return None
        return op

    def _stable(self, t: Tensor) -> Tensor:
        """``t`` itself if no later op overwrites it in place, else a copy taken right after it
        is made: a graph output is read when the graph ends, the gradient needs the value then."""
        ops_ = self.fwd.schedule()
        start = ops_.index(t.producer) + 1 if t.producer is not None else 0
        later = [op for op in ops_[start:]
                 if op.opdef.inplace is not None and _root(op.inputs[op.opdef.inplace]) is _root(t)]
        if not later:
            return t
        # the copy runs right after t is made, before anything can overwrite it
        copy, _ = self.fwd.trace(lambda: ops.identity(t, f"{t.name}_for_grad"), before=ops_[start])
        return copy

    # which tensors take part -------------------------------------------------------------------------
    def needs_grad(self, t: Tensor) -> bool:
        return t in self.depends and _is_float(t)

    def _mark(self) -> List[Op]:
        self.depends = {t for t in self.required if _is_float(t)}
        for op in self.fwd.schedule():
            decision = REGISTRY[op.type].grad
            if decision == Grad.STOP or not any(i in self.depends for i in op.inputs):
                continue
            self.depends.update(o for o in op.outputs if _is_float(o))
        reaches: Set[Tensor] = set(self.provided)
        active = []
        for op in reversed(self.fwd.schedule()):
            if any(o in reaches for o in op.outputs) and any(i in self.depends for i in op.inputs):
                reaches.update(op.inputs)
                active.append(op)
        return active

    # gradients --------------------------------------------------------------------------------------
    def _total(self, t: Tensor) -> Optional[Tensor]:
        parts = self.grads.get(t)
        if not parts:
            return None
        if len(parts) > 1:  # several uses of t: one N-ary sum (transforms.decompose_sum can split it)
            with self.graph:
                total = ops.add(*parts) if len(parts) == 2 else \
                    create_op("add_n", parts, name="sum", output_names=[GRAD_PREFIX + t.name])[0]
            self.grads[t] = parts = [total]
        return parts[0]

    def _add_grad(self, t: Tensor, g: Tensor, op: Op) -> None:
        if g.shape != t.shape or g.dtype is not t.dtype:
            raise RuntimeError(f"autodiff: the gradient rule of {_describe(op)} gave {g.shape} {g.dtype.name} "
                               f"for input {t.id!r} of {t.shape} {t.dtype.name} (a bug in the rule).")
        self.grads.setdefault(t, []).append(g)

    def _differentiate(self, op: Op) -> None:
        out_grads = [self._total(o) for o in op.outputs]
        if all(g is None for g in out_grads):
            return
        decision = REGISTRY[op.type].grad
        if decision is None:
            raise NotImplementedError(f"autodiff: no gradient rule for {_describe(op)}.")
        if decision == Grad.RAISE:
            raise RuntimeError(f"autodiff: {_describe(op)} cannot be differentiated (PopXL has no gradient "
                               f"for it); detach its inputs or leave it off the path to the loss.")
        if decision == Grad.STOP:
            return
        with self.graph:
            if decision == Grad.ZERO:
                in_grads = [ops.init(t.shape, t.dtype, name=f"zero_grad_{t.name}") if self.needs_grad(t) else None
                            for t in op.inputs]
            else:
                in_grads = list(decision(GradOpContext(self, op, out_grads)))
        if len(in_grads) != len(op.inputs):
            raise RuntimeError(f"autodiff: the gradient rule of {_describe(op)} returned {len(in_grads)} "
                               f"gradients for {len(op.inputs)} inputs (a bug in the rule).")
        for t, g in zip(op.inputs, in_grads):
            if g is not None and self.needs_grad(t):
                self._add_grad(t, g, op)

    def subgraph_grad(self, graph: Graph, provided: Sequence[Tensor], required: Sequence[Tensor]) -> GradGraphInfo:
        if graph in self.called_info:
            return self.called_info[graph]
        if not graph._can_be_recursively_autodiffed:
            raise RuntimeError(
                f"autodiff of {self.fwd.id!r}: it calls graph {graph.id!r}, which has been marked as unsafe to "
                f"autodiff (setCanBeRecursivelyAutodiffed(False)); give its gradient graph in "
                f"called_graphs_grad_info.")
        key = (graph, tuple(provided), tuple(required))
        if key not in self.cache:
            info = _GradBuilder(graph, provided, required, self.called_info, self.all_infos, self.cache,
                                strict=False).build()
            self.cache[key] = self.all_infos[graph] = info
        return self.cache[key]

    def build(self) -> GradGraphInfo:
        active = self._mark()
        with self.graph:
            for t in self.provided:
                seed = graph_input(t.shape, t.dtype, GRAD_PREFIX + t.name, meta_shape=t.meta_shape)
                self.expected_inputs.append(ExpectedConnection._create(t, ExpectedConnectionType.FwdGrad))
                self.grads.setdefault(t, []).append(seed)
        for op in active:
            self._differentiate(op)
        expected_outputs = []
        for t in self.required:
            g = self._total(t)
            if g is None:
                if self.strict:
                    raise RuntimeError(
                        f"autodiff: Unable to provide required gradient output for {t.id!r} of graph "
                        f"{self.fwd.id!r}: no path of differentiable ops leads from it to the tensors whose "
                        f"gradients are provided ({[p.id for p in self.provided]}).")
                continue
            with self.graph:
                graph_output(self._named(g, GRAD_PREFIX + t.name))
            expected_outputs.append(ExpectedConnection._create(t, ExpectedConnectionType.FwdGrad))
        _prune(self.graph)
        return GradGraphInfo._create(self.graph, self.fwd, self.expected_inputs, expected_outputs)

    def _named(self, g: Tensor, name: str) -> Tensor:
        """``g`` renamed to ``name``, or a named copy if ``g`` is an input or already an output."""
        if g.producer is None or g in self.graph.outputs or g.producer.opdef.view is not None:
            return ops.identity(g, name)
        self.graph.rename(g, name)
        return g


def _clone(graph: Graph) -> Graph:
    copy = graph.ir.create_empty_graph(f"{graph.name}_copy")
    values: Dict[Tensor, Tensor] = {}

    def value(t: Tensor) -> Tensor:
        """The copy's tensor for ``t``; a constant of ``graph`` is copied at each use."""
        if t in values:
            return values[t]
        assert isinstance(t, Constant), "a subgraph reads its inputs, its ops' outputs and constants"
        return constant(t._host_data_value, t.dtype, name=t.name)
    with copy:
        for t in graph.inputs:
            values[t] = graph_input(t.shape, t.dtype, t.name, by_ref=graph.is_input_by_ref(t),
                                    meta_shape=t.meta_shape)
        for op in graph.schedule():
            ins = [value(t) for t in op.inputs]
            new = create_op(op.type, ins, dict(op.attrs), output_names=[o.name for o in op.outputs], return_op=True)
            values.update(zip(op.outputs, new.outputs))
        for t in graph.outputs:
            graph_output(values[t])
    return copy


def _root(t: Tensor) -> Tensor:
    """The tensor whose storage ``t`` views (through view ops such as reshape_ / transpose_)."""
    while t.producer is not None and t.producer.opdef.view is not None and not t.producer.opdef.copy:
        t = t.producer.inputs[0]
    return t


def _prune(graph: Graph) -> None:
    """Drop ops whose results nothing uses (rules compute a gradient for every input they can)."""
    used = set(graph.outputs)
    unused = []
    for op in reversed(graph.schedule()):
        writes = op.opdef.side_effect or op.opdef.inplace is not None or op.attrs.get("modified")
        if writes or any(o in used for o in op.outputs):
            used.update(op.inputs)
        else:
            unused.append(op)
    graph.remove_ops(unused)


# The return type follows ``return_all_grad_graphs``, so that ``autodiff(g).graph`` type-checks.
@overload
def autodiff(graph: Graph, grads_provided: Optional[Iterable[Tensor]] = None,
             grads_required: Optional[Iterable[Tensor]] = None,
             called_graphs_grad_info: Optional[Mapping[Graph, GradGraphInfo]] = None,
             return_all_grad_graphs: Literal[False] = False) -> GradGraphInfo: ...


@overload
def autodiff(graph: Graph, grads_provided: Optional[Iterable[Tensor]] = None,
             grads_required: Optional[Iterable[Tensor]] = None,
             called_graphs_grad_info: Optional[Mapping[Graph, GradGraphInfo]] = None, *,
             return_all_grad_graphs: Literal[True]) -> Dict[Graph, GradGraphInfo]: ...


@overload
def autodiff(graph: Graph, grads_provided: Optional[Iterable[Tensor]] = None,
             grads_required: Optional[Iterable[Tensor]] = None,
             called_graphs_grad_info: Optional[Mapping[Graph, GradGraphInfo]] = None,
             return_all_grad_graphs: bool = False) -> Union[GradGraphInfo, Dict[Graph, GradGraphInfo]]: ...


def autodiff(graph: Graph, grads_provided: Optional[Iterable[Tensor]] = None,
             grads_required: Optional[Iterable[Tensor]] = None,
             called_graphs_grad_info: Optional[Mapping[Graph, GradGraphInfo]] = None,
             return_all_grad_graphs: bool = False) -> Union[GradGraphInfo, Dict[Graph, GradGraphInfo]]:
    """Build the gradient graph of a graph.

    Forward values the gradient graph needs are further inputs (``Fwd`` connections); intermediates
    it needs become extra outputs of ``graph``, and its existing call sites are updated. Called
    graphs are differentiated too, unless their `GradGraphInfo` is given. Typical use::

        info = ops.call_with_info(g, x, inputs_dict={...})
        grad = transforms.autodiff(g)
        dx, dW = ops.call(grad.graph, dy, inputs_dict=grad.inputs_dict(info))

    Args:
        graph: The forward graph (not the main graph).
        grads_provided: The tensors whose gradients the gradient graph takes as its first inputs,
            in order; default all outputs of ``graph``.
        grads_required: The tensors whose gradients it outputs, in order; default all inputs.
        called_graphs_grad_info: Gradient graphs already made for graphs that ``graph`` calls.
        return_all_grad_graphs: Return the infos of every graph differentiated, not only ``graph``'s.

    Returns:
        The `GradGraphInfo`; with ``return_all_grad_graphs``, a dict from each differentiated graph
        (``graph`` included) to its `GradGraphInfo`.

    Raises:
        TypeError: If ``graph`` is not a Graph.
        ValueError: If ``graph`` is the main graph, a provided or required tensor is not a
            (non-variable) tensor of ``graph``, or a required gradient cannot be reached.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"autodiff: expected a popxl.Graph, not {type(graph).__name__}.")
    if graph is graph.ir.main_graph:
        raise ValueError("autodiff: the main graph cannot be differentiated (its gradient graph could not be "
                         "called with its values); build the forward pass with ir.create_graph and call it.")
    graph.ir._check_mutable()
    provided = list(graph.outputs if grads_provided is None else grads_provided)
    required = list(graph.inputs if grads_required is None else grads_required)
    for what, ts in (("grads_provided", provided), ("grads_required", required)):
        for t in ts:
            if not isinstance(t, Tensor) or t.graph is not graph:
                name = t.id if isinstance(t, Tensor) else repr(t)
                raise ValueError(f"autodiff: {what} entry {name} is not a tensor of graph {graph.id!r}.")
            if isinstance(t, Variable):
                raise ValueError(f"autodiff: {what} entry {t.id!r} is a Variable.")
    all_infos: Dict[Graph, GradGraphInfo] = {}
    info = _GradBuilder(graph, provided, required, dict(called_graphs_grad_info or {}), all_infos, {},
                        strict=True).build()
    all_infos[graph] = info
    return all_infos if return_all_grad_graphs else info
