"""Control flow: ``call``, ``repeat`` and ``conditional`` of subgraphs, and their site infos.

A called graph sees parent values only through its inputs. Inputs pass by value; by-reference
inputs (``TensorByRef`` / ``graph_input(by_ref=True)``) write their in-place changes back to
the parent tensor after the call.

Longer than ~700 lines for a reason: ~350 of them are the public functions' docstrings, and the
three ops share one call-site machinery (inputs by value or by reference, subgraph outputs,
site infos), which splitting would scatter. Their gradient rules are in ``popxl.ops.call_grad``.
"""
from __future__ import annotations

from collections.abc import Iterable as _Iterable
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from popxl.context import get_current_context
from popxl.graph import Graph, op_called_graphs
from popxl.op import Op, OpDef, create_op, register, user_location
from popxl.ops.utils import spec
from popxl.tensor import INT64_MAX, Tensor, TensorLike, constant

__all__ = ["call", "call_with_info", "repeat", "repeat_with_info", "conditional", "conditional_with_info",
           "CallSiteInfo", "ConditionalSiteInfo"]


def _check_bound(specs: Sequence, graph: Graph, index: Sequence[int]) -> None:
    for s, i in zip(specs, index):
        g_in = graph.inputs[i]
        if s.shape != g_in.shape or s.dtype is not g_in.dtype:
            raise ValueError(f"graph {graph.id!r} input {i} ({g_in.name!r}) expects {g_in.shape} "
                             f"{g_in.dtype.name}, got {s.shape} {s.dtype.name}")


def _call_infer(specs, graph, input_index, modified):
    _check_bound(specs, graph, input_index)
    return [spec(t.shape, t.dtype, t.meta_shape) for t in graph.outputs]


def _repeat_infer(specs, graph, input_index, modified, repeat_count):
    _check_bound(specs, graph, input_index)
    if repeat_count < 0:
        raise ValueError(f"repeat_count must be >= 0, got {repeat_count}")
    n_out, n_in = len(graph.outputs), len(graph.inputs)
    if n_in < n_out:
        raise ValueError(f"graph {graph.id!r} has {n_out} outputs but only {n_in} inputs; each output i "
                         f"feeds input i of the next iteration, so inputs must be at least as many")
    for i, out in enumerate(graph.outputs):
        g_in = graph.inputs[i]
        if out.shape != g_in.shape or out.dtype is not g_in.dtype:
            raise ValueError(f"loop-carried output {i} ({out.name!r}: {out.shape} {out.dtype.name}) does not "
                             f"match input {i} ({g_in.name!r}: {g_in.shape} {g_in.dtype.name})")
        if i not in input_index:
            raise ValueError(f"loop-carried input {i} ({g_in.name!r}) of {graph.id!r} needs an initial value")
    return [spec(t.shape, t.dtype, t.meta_shape) for t in graph.outputs]


def _if_infer(specs, then_graph, else_graph, then_index, else_index):
    cond = specs[0]
    if cond.shape not in ((), (1,)) or not (cond.dtype.name == "bool" or cond.dtype.is_int):
        raise ValueError(f"condition must be a scalar bool, got {cond.shape} {cond.dtype.name}")
    n_then = len(then_index)
    _check_bound(specs[1:1 + n_then], then_graph, then_index)
    _check_bound(specs[1 + n_then:], else_graph, else_index)
    a, b = then_graph.outputs, else_graph.outputs
    if len(a) != len(b):
        raise ValueError(f"branches have different numbers of outputs: {then_graph.id!r} has {len(a)}, "
                         f"{else_graph.id!r} has {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype is not y.dtype:
            raise ValueError(f"branch output {i} differs: {x.shape} {x.dtype.name} vs {y.shape} {y.dtype.name}")
    return [spec(x.shape, x.dtype) for x in a]


register(OpDef("call", _call_infer, control=True, family="control"))
register(OpDef("repeat", _repeat_infer, control=True, family="control"))
register(OpDef("if", _if_infer, control=True, family="control"))


def _bind(graph: Graph, inputs: Sequence[Any], inputs_dict: Optional[Mapping[Tensor, TensorLike]],
          check_inputs: bool, where: str) -> Dict[int, Tensor]:
    """Bind positional and dict inputs to graph input indices, making constants for host values."""
    if not isinstance(graph, Graph):
        raise TypeError(f"{where}: expected a popxl.Graph, not {type(graph).__name__}.")
    flat: List[Any] = []
    for v in inputs:  # non-str iterables are flattened one level, as in PopXL
        if isinstance(v, _Iterable) and not isinstance(v, (str, Tensor, np.ndarray)):
            flat.extend(v)
        else:
            flat.append(v)
    g_inputs = graph.inputs
    if len(flat) > len(g_inputs):
        raise ValueError(f"{where}: {len(flat)} positional inputs given but graph {graph.id!r} has only "
                         f"{len(g_inputs)} inputs ({[t.name for t in g_inputs]}).")
    bound: Dict[int, Any] = dict(enumerate(flat))
    for k, v in (inputs_dict or {}).items():
        if not isinstance(k, Tensor) or k.graph is not graph or k not in g_inputs:
            name = k.id if isinstance(k, Tensor) else repr(k)
            raise ValueError(f"{where}: inputs_dict key {name} is not an input of graph {graph.id!r} "
                             f"(its inputs: {[t.name for t in g_inputs]}).")
        i = g_inputs.index(k)
        if i in bound:
            raise ValueError(f"{where}: graph input {k.name!r} of {graph.id!r} is given twice.")
        bound[i] = v
    if check_inputs:
        missing = [t.name for i, t in enumerate(g_inputs) if i not in bound]
        if missing:
            raise ValueError(f"{where}: graph {graph.id!r} inputs {missing} are not connected; pass them "
                             f"positionally or through inputs_dict.")
    for i, v in bound.items():
        if not isinstance(v, Tensor):
            try:
                bound[i] = constant(v, g_inputs[i].dtype, name=g_inputs[i].name)
            except Exception as e:
                raise TypeError(f"{where}: cannot convert {v!r} for graph input {g_inputs[i].name!r}: {e}") from None
    return dict(sorted(bound.items()))


class CallSiteInfo:
    """How one call or repeat site connects its parent tensors to the called graph.

    Returned by `call_with_info` and `repeat_with_info`; not made directly.

    Args:
        op: The call or repeat op of the site.
    """

    def __init__(self, op: Op) -> None:
        self._op = op

    @property
    def called_graph(self) -> Graph:
        """The graph the site calls."""
        return self._op.attrs["graph"]

    @property
    def _index(self) -> Tuple[int, ...]:
        return self._op.attrs["input_index"]

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        """The parent tensors bound to the graph's inputs, in the graph's input order."""
        return self._op.inputs

    @property
    def outputs(self) -> Tuple[Tensor, ...]:
        """The parent tensors the site's outputs are, in the graph's output order."""
        return self._op.outputs

    def parent_input(self, idx: int) -> Tensor:
        """The parent tensor bound to a graph input.

        Args:
            idx: The graph input's index.

        Returns:
            The parent tensor.

        Raises:
            IndexError: If ``idx`` is out of range.
        """
        return self._op.inputs[self.graph_to_parent_input_index(idx)]

    def parent_output(self, idx: int) -> Tensor:
        """The parent tensor of a graph output.

        Args:
            idx: The graph output's index.

        Returns:
            The parent tensor.

        Raises:
            IndexError: If ``idx`` is out of range.
        """
        return self._op.outputs[idx]

    def graph_to_parent_input_index(self, idx: int) -> int:
        """The site input index a graph input is bound at.

        Args:
            idx: The graph input's index.

        Returns:
            The index among the site's inputs.
        """
        try:
            return self._index.index(idx)
        except ValueError:
            raise ValueError(f"graph input {idx} of {self.called_graph.id!r} is not connected at this site") from None

    def parent_to_graph_input_index(self, idx: int) -> int:
        """The graph input index of a site input.

        Args:
            idx: The index among the site's inputs.

        Returns:
            The graph input's index.
        """
        return self._index[idx]

    def graph_to_parent_output_index(self, idx: int) -> int:
        """The site output index of a graph output.

        Args:
            idx: The graph output's index.

        Returns:
            The index among the site's outputs.
        """
        return idx

    def parent_to_graph_output_index(self, idx: int) -> int:
        """The graph output index of a site output.

        Args:
            idx: The index among the site's outputs.

        Returns:
            The graph output's index.
        """
        return idx

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        """The parent tensor a graph input or output corresponds to at this site.

        Args:
            graph_tensor: An input or output of the called graph.

        Returns:
            The parent tensor.

        Raises:
            ValueError: If ``graph_tensor`` is neither an input nor an output of the called graph.
        """
        g = self.called_graph
        if graph_tensor in g.inputs:
            return self.parent_input(g.inputs.index(graph_tensor))
        if graph_tensor in g.outputs:
            return self._op.outputs[g.outputs.index(graph_tensor)]
        raise ValueError(f"{graph_tensor!r} is neither an input nor an output of {g.id!r}.")

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        """The (first) graph input a parent tensor is bound to at this site.

        Args:
            parent_tensor: A tensor of the calling graph.

        Returns:
            The graph input.

        Raises:
            ValueError: If ``parent_tensor`` is not bound at this site.
        """
        for pos, t in enumerate(self._op.inputs):
            if t is parent_tensor:
                return self.called_graph.inputs[self._index[pos]]
        raise ValueError(f"{parent_tensor!r} is not an input of this call site.")

    def set_parent_input_modified(self, parent_tensor: Tensor, infer_modified_regions: bool = False) -> None:
        """Treat the graph input bound to a parent tensor as modified in place: changes are copied back to the parent.

        Args:
            parent_tensor: A parent tensor bound at this site.
            infer_modified_regions: Accepted for PopXL compatibility; the whole tensor counts as modified.

        Raises:
            ValueError: If ``parent_tensor`` is not bound at this site.
        """
        mark_site_input_modified(self._op, self.called_graph.inputs.index(self.parent_to_graph(parent_tensor)))

    def __repr__(self) -> str:
        return f"CallSiteInfo[{self._op.type} of {self.called_graph.id!r}]"


# Graphs called within graphs, counting the outermost: deeper programs are refused when traced
# (the compiler, autodiff and the reference engine walk nested graphs recursively: autodiff takes
# about six Python frames a level, of the interpreter's 1,000).
MAX_CALL_DEPTH = 128


def _check_not_recursive(callees: Sequence[Any], where: str) -> None:
    """Refuse a call of a graph from itself, directly or through graphs it calls (a program's
    memory is planned statically, so graphs cannot recurse, nor can they in PopXL), and a call
    that would nest graphs deeper than ``MAX_CALL_DEPTH``."""
    caller = get_current_context().graph
    for callee in callees:
        if not isinstance(callee, Graph):
            continue  # _bind reports it
        path, depth = _call_tree(callee, caller)
        if path is not None:
            cycle = " -> ".join(repr(g.id) for g in (caller, *path))
            raise ValueError(f"{where}: calling graph {callee.id!r} from graph {caller.id!r} would make the program "
                             f"recursive ({cycle}); graphs cannot call themselves, directly or through other graphs.")
        if depth + 1 > MAX_CALL_DEPTH:
            raise ValueError(f"{where}: calling graph {callee.id!r} from graph {caller.id!r} would nest {depth + 1} "
                             f"graphs in one another (graph {callee.id!r} is {depth} deep); popxl takes at most "
                             f"{MAX_CALL_DEPTH} (popxl.ops.call.MAX_CALL_DEPTH).")


def _call_tree(start: Graph, target: Graph) -> Tuple[Optional[List[Graph]], int]:
    """(the graphs from ``start`` down to ``target`` along calls, both ends included, or None;
    the depth of ``start``'s call tree: 1 for a graph that calls none). Walked with a stack of its
    own, not Python's, so deep programs reach the depth check."""
    depth: Dict[str, int] = {}
    parent: Dict[str, Optional[Graph]] = {start.id: None}
    stack: List[Tuple[Graph, bool]] = [(start, False)]
    found: Optional[Graph] = None
    while stack:
        g, done = stack.pop()
        if done:
            depth[g.id] = 1 + max((depth[c.id] for c in g.called_graphs), default=0)
            continue
        if g is target and found is None:
            found = g
        if g.id in depth:
            continue
        stack.append((g, True))
        for c in g.called_graphs:
            if c.id not in parent:
                parent[c.id] = g
            if c.id not in depth:
                stack.append((c, False))
    if found is None:
        return None, depth[start.id]
    path = [found]
    while (up := parent[path[-1].id]) is not None:
        path.append(up)
    return path[::-1], depth.get(start.id, 0)


def _site(optype: str, graph: Graph, inputs: Sequence[Any], inputs_dict, check_inputs: bool,
          extra: Optional[Dict[str, Any]] = None) -> CallSiteInfo:
    where = f"ops.{optype} (at {user_location()})"
    _check_not_recursive([graph], where)
    bound = _bind(graph, inputs, inputs_dict, check_inputs, where)
    modified = tuple(i for i in bound if graph.is_input_by_ref(graph.inputs[i]))
    attrs = {"graph": graph, "input_index": tuple(bound), "modified": modified, **(extra or {})}
    op = create_op(optype, list(bound.values()), attrs, name=graph.id,
                   output_names=_site_output_names(graph), return_op=True)
    return CallSiteInfo(op)


def _site_output_names(graph: Graph) -> List[str]:
    """Names for a call site's outputs: its graph's output names, less the name scope the site is
    made in when they already start with it (a graph traced and called in ``name_scope("layer0")``
    gives ``layer0/gelu``, not ``layer0/layer0/gelu``)."""
    scope = get_current_context().scope_prefix
    return [t.name[len(scope):] if scope and t.name.startswith(scope) else t.name for t in graph.outputs]


def bind_site_input(site: Op, graph_input: Tensor, parent: Tensor) -> None:
    """Bind ``graph_input`` of the graph a call or repeat op calls to ``parent`` at that site (an
    input added after the site was traced); a by-reference input is marked modified there."""
    graph = site.attrs["graph"]
    i = graph.inputs.index(graph_input)
    if i in site.attrs["input_index"]:
        raise ValueError(f"bind_site_input: input {graph_input.name!r} of {graph.id!r} is already bound at this site.")
    site.graph.add_op_input(site, parent)
    site.attrs["input_index"] = (*site.attrs["input_index"], i)
    if graph.is_input_by_ref(graph_input):
        mark_site_input_modified(site, i)


def graph_sites(graph: Graph) -> List[Op]:
    """Every op of ``graph``'s Ir that runs it: its calls, repeats and conditionals."""
    return [op for g in graph.ir._all_graphs() for op in g.schedule() if any(c is graph for c in op_called_graphs(op))]


def insert_graph_input(graph: Graph, index: int, spec: Any, name: str, by_ref: bool = False) -> Tensor:
    """A new input of ``graph`` at position ``index`` (the inputs from there move up one). Every
    site running the graph keeps its bindings (they are renumbered with the inputs); the new input
    is bound at none of them (``bind_site_input`` binds it)."""
    t = graph.add_input(spec, name, by_ref, index=index)
    at = graph.inputs.index(t)

    def moved(indices: Tuple[int, ...]) -> Tuple[int, ...]:
        return tuple(i + 1 if i >= at else i for i in indices)
    for op in graph_sites(graph):
        a = op.attrs
        if op.type == "if":
            for branch, key in (("then_graph", "then_index"), ("else_graph", "else_index")):
                if a[branch] is graph:
                    a[key] = moved(a[key])
        else:
            a["input_index"], a["modified"] = moved(a["input_index"]), moved(a["modified"])
    return t


def insert_graph_output(graph: Graph, index: int, t: Tensor) -> List[Tensor]:
    """Make ``t`` output ``index`` of ``graph`` (the outputs from there move up one) and give each
    call or repeat site running it the matching output at the same position; returns those
    outputs, one per site. What a new output of a loop body means for the loop (which input it is
    carried into) is the caller's concern."""
    sites = graph_sites(graph)
    for op in sites:
        if op.type == "if":
            raise ValueError(f"graph {graph.id!r} is a branch of the conditional {op.name!r}: both branches "
                             f"must keep the same outputs, so one cannot get an output alone.")
    graph.add_output(t, index)
    return [op.graph.add_op_output(op, t.spec, t.name, index) for op in sites]


def check_site(op: Op) -> None:
    """Check a call, repeat or conditional site against its graphs as they are now (they may have
    been edited since it was traced): its bindings, the loop-carried pairs of a repeat, and its
    outputs, which must match its graphs' outputs in number, shape and dtype.

    Raises:
        ValueError: Naming what does not fit.
    """
    try:
        specs = op.opdef.infer([t.spec for t in op.inputs], **op.attrs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{op.type} {op.name!r} in graph {op.graph.id!r}: {e}") from None
    have = [(t.shape, t.dtype) for t in op.outputs]
    want = [(t.shape, t.dtype) for t in specs]
    if have != want:
        raise ValueError(f"{op.type} {op.name!r} in graph {op.graph.id!r} has outputs "
                         f"{[(s, d.name) for s, d in have]}, but its graph gives {[(s, d.name) for s, d in want]}.")


def wrap_loop_body(site: Op) -> Graph:
    """Make the repeat op ``site`` run a new graph that calls the graph it ran (PopXL's own layout:
    its loops run a wrapper graph holding a call of the user's graph). The wrapper has the body's
    inputs (names, specs, by-reference), calls the body with all of them and returns the body's
    outputs, so the loop computes what it did, with the same bindings and results; afterwards the
    body is a called graph, which can get outputs that the loop does not carry. Returns the
    wrapper."""
    body = site.attrs["graph"]
    n = len(body.inputs)
    changed = set(site.attrs["modified"])
    wrapper = body.ir.create_empty_graph(f"{body.name}__loop_wrapper")
    ins = [wrapper.add_input(t.spec, t.name, body.is_input_by_ref(t) or i in changed)
           for i, t in enumerate(body.inputs)]
    modified = tuple(i for i, t in enumerate(body.inputs) if body.is_input_by_ref(t) or i in changed)
    call_op = create_op("call", ins, {"graph": body, "input_index": tuple(range(n)), "modified": modified},
                        name=body.id, output_names=[t.name for t in body.outputs], graph=wrapper,
                        return_op=True, notify=False)
    call_op.location, call_op.ipu, call_op.tile_set = site.location, site.ipu, site.tile_set
    call_op.execution_context = site.execution_context
    call_op.name = f"{wrapper.id}__call__{body.id}"
    for t in call_op.outputs:
        wrapper.add_output(t)
    site.attrs["graph"] = wrapper
    return wrapper


def mark_site_input_modified(site: Op, graph_input_index: int) -> None:
    """Input ``graph_input_index`` of a call or repeat site's graph is changed in place: the site
    copies it back to the parent tensor bound to it."""
    site.attrs["modified"] = tuple(sorted(set(site.attrs["modified"]) | {graph_input_index}))


def call_with_info(graph: Graph, *inputs: Union[TensorLike, Iterable[TensorLike]],
                   inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None,
                   check_inputs: bool = True) -> CallSiteInfo:
    """Call a graph, as `call`, and return the call site's info.

    Args:
        graph: The graph called.
        *inputs: Values bound to the graph's inputs in order: tensors of the current graph, or host
            values made constants of the input's dtype. A non-string iterable is flattened one level.
        inputs_dict: Graph input -> parent value, for inputs not bound by position (e.g. the
            ``graph_input`` tensors a Module stores on itself).
        check_inputs: Require every graph input to be bound.

    Returns:
        The `CallSiteInfo` of the new call site (its ``outputs`` are the results).

    Raises:
        TypeError: If a value cannot be made a tensor of its input's dtype, or ``graph`` is not a
            Graph.
        ValueError: If there are more positional values than inputs, an input is bound twice, a
            key of ``inputs_dict`` is not an input of ``graph``, a tensor is not in the current graph,
            a bound value's shape or dtype does not match its input, or (``check_inputs``) an input
            is left unbound.
    """
    return _site("call", graph, inputs, inputs_dict, check_inputs)


def call(graph: Graph, *inputs: Union[TensorLike, Iterable[TensorLike]],
         inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None) -> Tuple[Tensor, ...]:
    """Call a graph: its ops run on the bound values and its outputs come back as new tensors.

    Inputs pass by value, except inputs made with ``by_ref=True`` (or annotated ``TensorByRef``),
    whose in-place changes inside the graph are seen by the parent tensor.

    Args:
        graph: The graph called.
        *inputs: Values bound to the graph's inputs in order: tensors of the current graph, or host
            values made constants of the input's dtype. A non-string iterable is flattened one level.
        inputs_dict: Graph input -> parent value, for inputs not bound by position (e.g. the
            ``graph_input`` tensors a Module stores on itself).

    Returns:
        The parent tensors of all the graph's outputs, always a tuple: ``(y,) = ops.call(g, x)``.

    Raises:
        TypeError: If a value cannot be made a tensor of its input's dtype, or ``graph`` is not a
            Graph.
        ValueError: If there are more positional values than inputs, an input is bound twice, a
            key of ``inputs_dict`` is not an input of ``graph``, a tensor is not in the current graph,
            a bound value's shape or dtype does not match its input, or (``check_inputs``) an input
            is left unbound.
    """
    return call_with_info(graph, *inputs, inputs_dict=inputs_dict).outputs


def repeat_with_info(graph: Graph, repeat_count: int, *inputs: Union[TensorLike, Iterable[TensorLike]],
                     inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None,
                     check_inputs: bool = True) -> CallSiteInfo:
    """Run a graph several times, as `repeat`, and return the site's info.

    Args:
        graph: The graph run.
        repeat_count: How many times it runs.
        *inputs: Values bound to the graph's inputs in order: tensors of the current graph, or host
            values made constants of the input's dtype. A non-string iterable is flattened one level.
        inputs_dict: Graph input -> parent value, for inputs not bound by position (e.g. the
            ``graph_input`` tensors a Module stores on itself).
        check_inputs: Require every graph input to be bound.

    Returns:
        The `CallSiteInfo` of the new site (its ``called_graph`` is ``graph``; a wrapper graph calling
        ``graph`` once ``graph`` gets an output through ``popart._internal.ir``, as in PopXL).

    Raises:
        TypeError: If a value cannot be made a tensor of its input's dtype, or ``graph`` is not a
            Graph.
        ValueError: If ``repeat_count`` is negative, the graph has fewer inputs than outputs,
            there are more positional values than inputs, an input is bound twice, a
            key of ``inputs_dict`` is not an input of ``graph``, a tensor is not in the current graph,
            a bound value's shape or dtype does not match its input, or (``check_inputs``) an input
            is left unbound.
    """
    if not isinstance(repeat_count, (int, np.integer)) or isinstance(repeat_count, bool) \
            or not 0 <= repeat_count <= INT64_MAX:
        raise ValueError(f"ops.repeat: repeat_count must be an int from 0 to {INT64_MAX} (int64), got {repeat_count!r}.")
    return _site("repeat", graph, inputs, inputs_dict, check_inputs, {"repeat_count": int(repeat_count)})


def repeat(graph: Graph, repeat_count: int, *inputs: Union[TensorLike, Iterable[TensorLike]],
           inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None) -> Tuple[Tensor, ...]:
    """Run a graph ``repeat_count`` times in a loop.

    With N outputs, output i of one iteration is input i of the next (loop-carried); other inputs
    stay as bound, and by-reference inputs keep their in-place changes.

    Args:
        graph: The graph run.
        repeat_count: How many times it runs.
        *inputs: Values bound to the graph's inputs in order: tensors of the current graph, or host
            values made constants of the input's dtype. A non-string iterable is flattened one level.
        inputs_dict: Graph input -> parent value, for inputs not bound by position (e.g. the
            ``graph_input`` tensors a Module stores on itself).

    Returns:
        The outputs of the last iteration, as a tuple.

    Raises:
        TypeError: If a value cannot be made a tensor of its input's dtype, or ``graph`` is not a
            Graph.
        ValueError: If ``repeat_count`` is negative, the graph has fewer inputs than outputs,
            there are more positional values than inputs, an input is bound twice, a
            key of ``inputs_dict`` is not an input of ``graph``, a tensor is not in the current graph,
            a bound value's shape or dtype does not match its input, or (``check_inputs``) an input
            is left unbound.
    """
    return repeat_with_info(graph, repeat_count, *inputs, inputs_dict=inputs_dict).outputs


class ConditionalSiteInfo:
    """How a conditional site connects parent tensors to its two branches.

    Returned by `conditional_with_info`; not made directly.

    Args:
        op: The conditional op of the site.
    """

    def __init__(self, op: Op) -> None:
        self._op = op

    @property
    def called_graph(self) -> Tuple[Graph, Graph]:
        """The two branches, ``(then_branch, else_branch)``."""
        return self._op.attrs["then_graph"], self._op.attrs["else_graph"]

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        """The parent tensors bound at the site (the condition first)."""
        return self._op.inputs

    @property
    def outputs(self) -> Tuple[Tensor, ...]:
        """The parent tensors the site's outputs are."""
        return self._op.outputs

    def _branch(self, then_branch: bool) -> Tuple[Graph, Tuple[int, ...], int]:
        a = self._op.attrs
        n_then = len(a["then_index"])
        return (a["then_graph"], a["then_index"], 1) if then_branch else (a["else_graph"], a["else_index"], 1 + n_then)

    def parent_input(self, idx: int, then_branch: bool = True) -> Tensor:
        """The parent tensor bound to a branch input.

        Args:
            idx: The branch input's index.
            then_branch: Whether ``idx`` refers to the then-branch (True) or the else-branch.

        Returns:
            The parent tensor.
        """
        return self._op.inputs[self.graph_to_parent_input_index(idx, then_branch)]

    def parent_output(self, idx: int) -> Tensor:
        """The parent tensor of a branch output.

        Args:
            idx: The output's index (the same for both branches).

        Returns:
            The parent tensor.
        """
        return self._op.outputs[idx]

    def graph_to_parent_input_index(self, idx: int, then_branch: bool = True) -> int:
        """The site input index a branch input is bound at.

        Args:
            idx: The branch input's index.
            then_branch: Whether ``idx`` refers to the then-branch (True) or the else-branch.

        Returns:
            The index among the site's inputs.
        """
        g, index, base = self._branch(then_branch)
        if idx not in index:
            raise ValueError(f"input {idx} of {g.id!r} is not connected at this site")
        return base + index.index(idx)

    def parent_to_graph_input_index(self, idx: int, then_branch: bool = True) -> int:
        """The branch input index of a site input.

        Args:
            idx: The index among the site's inputs.
            then_branch: Whether ``idx`` refers to the then-branch (True) or the else-branch.

        Returns:
            The branch input's index.
        """
        g, index, base = self._branch(then_branch)
        return index[idx - base]

    def graph_to_parent_output_index(self, idx: int, then_branch: bool = True) -> int:
        """The site output index of a branch output.

        Args:
            idx: The branch output's index.
            then_branch: Whether ``idx`` refers to the then-branch (True) or the else-branch.

        Returns:
            The index among the site's outputs.
        """
        return idx

    def parent_to_graph_output_index(self, idx: int, then_branch: bool = True) -> int:
        """The branch output index of a site output.

        Args:
            idx: The index among the site's outputs.
            then_branch: Whether ``idx`` refers to the then-branch (True) or the else-branch.

        Returns:
            The branch output's index.
        """
        return idx

    def graph_to_parent(self, graph_tensor: Tensor, then_branch: bool = True) -> Tensor:
        """The parent tensor a branch input or output corresponds to.

        Args:
            graph_tensor: An input or output of the branch.
            then_branch: Whether ``graph_tensor`` belongs to the then-branch (True) or the else-branch.

        Returns:
            The parent tensor.

        Raises:
            ValueError: If ``graph_tensor`` is neither an input nor an output of that branch.
        """
        g, _, _ = self._branch(then_branch)
        if graph_tensor in g.inputs:
            return self.parent_input(g.inputs.index(graph_tensor), then_branch)
        if graph_tensor in g.outputs:
            return self._op.outputs[g.outputs.index(graph_tensor)]
        raise ValueError(f"{graph_tensor!r} is neither an input nor an output of {g.id!r}.")

    def parent_to_graph(self, parent_tensor: Tensor, then_branch: bool = True) -> Tensor:
        """The (first) branch input a parent tensor is bound to.

        Args:
            parent_tensor: A tensor of the calling graph.
            then_branch: Look in the then-branch (True) or the else-branch.

        Returns:
            The branch input.

        Raises:
            ValueError: If ``parent_tensor`` is not bound to that branch.
        """
        g, index, base = self._branch(then_branch)
        for pos, i in enumerate(index):
            if self._op.inputs[base + pos] is parent_tensor:
                return g.inputs[i]
        raise ValueError(f"{parent_tensor!r} is not an input of this branch.")

    def set_parent_input_modified(self, parent_tensor: Tensor, infer_modified_regions: bool = False) -> None:
        """Not supported for conditionals (as in PopXL).

        Args:
            parent_tensor: A parent tensor bound at this site.
            infer_modified_regions: Unused.

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError("conditional: modified (by-reference) inputs are not supported, as in PopXL.")


def conditional_with_info(cond: Tensor, then_branch: Graph, else_branch: Graph,
                          then_inputs: Optional[Iterable[TensorLike]] = None,
                          else_inputs: Optional[Iterable[TensorLike]] = None,
                          then_inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None,
                          else_inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None,
                          check_inputs: bool = True) -> ConditionalSiteInfo:
    """Run one of two graphs, as `conditional`, and return the site's info.

    Args:
        cond: A scalar bool tensor choosing the branch.
        then_branch: The graph run when ``cond`` is True.
        else_branch: The graph run when ``cond`` is False; its outputs match ``then_branch``'s.
        then_inputs: Values bound to ``then_branch``'s inputs in order.
        else_inputs: Values bound to ``else_branch``'s inputs in order.
        then_inputs_dict: ``then_branch`` input -> parent value.
        else_inputs_dict: ``else_branch`` input -> parent value.
        check_inputs: Require every graph input to be bound.

    Returns:
        The `ConditionalSiteInfo` of the new site.

    Raises:
        TypeError: If ``cond`` is not a Tensor, or a value cannot be made a tensor of its input's dtype.
        ValueError: If the branches' outputs differ in number, shape or dtype, inputs are bound
            wrongly (as for `call`), or a tensor is not in the current graph.
        NotImplementedError: If a branch has an input passed by reference.
    """
    where = f"ops.conditional (at {user_location()})"
    _check_not_recursive([then_branch, else_branch], where)
    for g in (then_branch, else_branch):
        if isinstance(g, Graph) and any(g.is_input_by_ref(t) for t in g.inputs):
            raise NotImplementedError(f"{where}: branch {g.id!r} has by-reference inputs; conditional "
                                      f"branches take inputs by value only (as in PopXL).")
    t_bound = _bind(then_branch, list(then_inputs or []), then_inputs_dict, check_inputs, where + " then_branch")
    e_bound = _bind(else_branch, list(else_inputs or []), else_inputs_dict, check_inputs, where + " else_branch")
    attrs = {"then_graph": then_branch, "else_graph": else_branch, "then_index": tuple(t_bound),
             "else_index": tuple(e_bound)}
    names = [f"{a.name}_or_{b.name}" for a, b in zip(then_branch.outputs, else_branch.outputs)]
    op = create_op("if", [cond, *t_bound.values(), *e_bound.values()], attrs, name="conditional",
                   output_names=names, return_op=True)
    return ConditionalSiteInfo(op)


def conditional(cond: Tensor, then_branch: Graph, else_branch: Graph,
                then_inputs: Optional[Iterable[TensorLike]] = None,
                else_inputs: Optional[Iterable[TensorLike]] = None,
                then_inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None,
                else_inputs_dict: Optional[Mapping[Tensor, TensorLike]] = None) -> Tuple[Tensor, ...]:
    """Run ``then_branch`` if ``cond`` holds, else ``else_branch``; both give outputs of the same shapes and dtypes.

    Args:
        cond: A scalar bool tensor choosing the branch.
        then_branch: The graph run when ``cond`` is True.
        else_branch: The graph run when ``cond`` is False; its outputs match ``then_branch``'s.
        then_inputs: Values bound to ``then_branch``'s inputs in order.
        else_inputs: Values bound to ``else_branch``'s inputs in order.
        then_inputs_dict: ``then_branch`` input -> parent value.
        else_inputs_dict: ``else_branch`` input -> parent value.

    Returns:
        The parent tensors of the chosen branch's outputs, as a tuple.

    Raises:
        TypeError: If ``cond`` is not a Tensor, or a value cannot be made a tensor of its input's dtype.
        ValueError: If the branches' outputs differ in number, shape or dtype, inputs are bound
            wrongly (as for `call`), or a tensor is not in the current graph.
        NotImplementedError: If a branch has an input passed by reference.
    """
    return conditional_with_info(cond, then_branch, else_branch, then_inputs, else_inputs,
                                 then_inputs_dict, else_inputs_dict).outputs
