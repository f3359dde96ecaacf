"""Gradients of ``call``, ``repeat`` and ``conditional`` (popxl.ops.call): a call is differentiated
by differentiating the called graph and calling its gradient graph (autodiff's ``subgraph_grad``);
a loop by recording the state entering each iteration and running the body's gradient in reverse.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from popxl import dtypes
from popxl.grad_graph_info import ExpectedConnectionType
from popxl.graph import Graph
from popxl.op import grad_rule
from popxl.ops.call import CallSiteInfo, ConditionalSiteInfo, call, call_with_info, conditional, repeat
from popxl.ops.elementwise import add_
from popxl.ops.indexing import dynamic_slice, dynamic_update_
from popxl.ops.misc import increment_mod_, init
from popxl.ops.utils import cast_if_needed, spec
from popxl.tensor import Tensor, graph_input, graph_output

__all__: List[str] = []


def _forward_values(ctx, info, to_parent) -> Dict[Tensor, Tensor]:
    """The gradient graph's Fwd inputs bound to the parent's forward values (via the site)."""
    return {g_in: ctx.forward(to_parent(c.fwd_tensor)) for g_in, c in zip(info.graph.inputs, info.expected_inputs)
            if c.connection_type is ExpectedConnectionType.Fwd}


def _seeds(ctx, info, graph: Graph) -> List[Tensor]:
    """Output gradients of the site, in the order the gradient graph takes them."""
    return [ctx.grad_or_zeros(graph.outputs.index(c.fwd_tensor)) for c in info.expected_inputs
            if c.connection_type is ExpectedConnectionType.FwdGrad]


def _branch_grad(ctx, graph: Graph, positions: Sequence[int], index: Sequence[int]):
    """Differentiate ``graph`` for the site outputs that have gradients and for the site inputs
    at ``positions`` (bound to graph inputs ``index``) that need them."""
    provided = [graph.outputs[i] for i in range(len(ctx.op.outputs)) if ctx.grad(i) is not None]
    required = [graph.inputs[i] for p, i in zip(positions, index) if ctx.needs(p)]
    return ctx.subgraph_grad(graph, provided, required)


@grad_rule("call")
def _call_grad(ctx):
    graph, index = ctx.attrs["graph"], ctx.attrs["input_index"]
    info = _branch_grad(ctx, graph, range(len(index)), index)
    site = CallSiteInfo(ctx.op)
    outs = call(info.graph, *_seeds(ctx, info, graph), inputs_dict=_forward_values(ctx, info, site.graph_to_parent))
    grads: List[Optional[Tensor]] = [None] * len(ctx.op.inputs)
    for c, g in zip(info.expected_outputs, outs):
        p = index.index(graph.inputs.index(c.fwd_tensor))
        # A gradient graph the user built (popxl-addons' build_grad, say) may compute an input's
        # gradient in another float type (an fp8 matmul's float16 for a float32 input); PopART
        # passes it on as it is, popxl casts it to the input's type so gradients sum in one type.
        if g.dtype.is_floating_point and ctx.op.inputs[p].dtype.is_floating_point:
            g = cast_if_needed(g, ctx.op.inputs[p].dtype)
        grads[p] = g
    return grads


@grad_rule("if")
def _if_grad(ctx):
    """Each branch's gradient graph is wrapped so both wrappers output gradients for the same
    site inputs (zeros for the other branch's); a conditional on the same condition picks one."""
    a = ctx.attrs
    site = ConditionalSiteInfo(ctx.op)
    n_then = len(a["then_index"])
    branches = [(a["then_graph"], a["then_index"], 1, True), (a["else_graph"], a["else_index"], 1 + n_then, False)]
    infos = [_branch_grad(ctx, g, range(base, base + len(index)), index) for g, index, base, _ in branches]
    wanted = [p for p in range(1, len(ctx.op.inputs)) if ctx.needs(p)]
    wrappers, bindings = [], []
    for (graph, index, base, is_then), info in zip(branches, infos):
        seeds = _seeds(ctx, info, graph)
        fwd = _forward_values(ctx, info, lambda t, b=is_then: site.graph_to_parent(t, b))
        wrapper = ctx.op.graph.ir.create_empty_graph(f"{graph.name}_grad_branch")
        with wrapper:
            ins = [graph_input(t.shape, t.dtype, t.name) for t in [*seeds, *fwd.values()]]
            outs = call(info.graph, *ins[:len(seeds)], inputs_dict=dict(zip(fwd.keys(), ins[len(seeds):])))
            by_position = {base + index.index(graph.inputs.index(c.fwd_tensor)): g
                           for c, g in zip(info.expected_outputs, outs)}
            for p in wanted:
                t = ctx.op.inputs[p]
                graph_output(by_position[p] if p in by_position else init(t.shape, t.dtype, name="zero_grad"))
        wrappers.append(wrapper)
        bindings.append([*seeds, *fwd.values()])
    outs = conditional(ctx.input(0), wrappers[0], wrappers[1], then_inputs=bindings[0], else_inputs=bindings[1])
    grads: List[Optional[Tensor]] = [None] * len(ctx.op.inputs)
    for p, g in zip(wanted, outs):
        grads[p] = g
    return grads


_LOOP_SIDE_EFFECTS = ("host_load", "host_store", "remote_load", "remote_load_", "remote_store", "print_tensor")


def _check_recomputable(graph: Graph, where: str) -> None:
    """The loop gradient reruns the body: it must not consume streams or change its inputs."""
    stack, seen = [graph], set()
    while stack:
        g = stack.pop()
        if g in seen:
            continue
        seen.add(g)
        for op in g.schedule():
            if op.type in _LOOP_SIDE_EFFECTS or op.attrs.get("modified"):
                raise NotImplementedError(
                    f"autodiff of {where}: the loop body {graph.id!r} contains {op.type} {op.name!r} (at "
                    f"{op.location}), which moves data or changes inputs in place; the gradient of a loop "
                    f"re-runs its body, so such a body cannot be differentiated.")
            stack.extend(v for v in op.attrs.values() if isinstance(v, Graph))


@grad_rule("repeat")
def _repeat_grad(ctx):
    """Loop gradient: a recording loop stores the carried state entering each iteration in stacked
    buffers; a reverse loop reads state k back, re-runs a copy of the body to get its activations,
    and calls the body's gradient graph, carrying the state gradients and adding up the gradients
    of the loop-invariant inputs."""
    op = ctx.op
    body, index, n = op.attrs["graph"], op.attrs["input_index"], op.attrs["repeat_count"]
    where = f"ops.repeat at {op.location}"
    _check_recomputable(body, where)
    n_carry = len(body.outputs)
    if n == 0:  # the loop passes its carried inputs straight through (output i is input i)
        return [ctx.grad(i) if i < n_carry else None for i in index]
    copy = ctx.clone_graph(body)
    ir = op.graph.ir
    invariant = [p for p, i in enumerate(index) if i >= n_carry]
    by_input = {i: p for p, i in enumerate(index)}
    state_specs = [copy.inputs[i].spec for i in range(n_carry)]

    # 1. record: stacks[i][k] = carried state i entering iteration k
    def record(*args):
        states, rest = args[:n_carry], args[n_carry:]
        inv, stacks, counter = rest[:len(invariant)], rest[len(invariant):-1], rest[-1]
        for s, stack in zip(states, stacks):
            dynamic_update_(stack, counter, s.reshape((1,) + s.shape), [0], [1], True)
        increment_mod_(counter, 1, n + 1)
        outs = call(copy, *states, inputs_dict={copy.inputs[index[p]]: t for p, t in zip(invariant, inv)})
        for t in outs:
            graph_output(t)

    inv_specs = [op.inputs[p].spec for p in invariant]
    stack_specs = [spec((n, *s.shape), s.dtype) for s in state_specs]
    counter_spec = spec((1,), dtypes.uint32)
    rec_graph = _graph(ir, f"{body.name}_record", [(s, False) for s in state_specs + inv_specs] +
                       [(s, True) for s in stack_specs + [counter_spec]], record)
    states0 = [ctx.input(by_input[i]) for i in range(n_carry)]
    inv_vals = [ctx.input(p) for p in invariant]
    stacks = [init(s.shape, s.dtype, name=f"loop_state{i}_stack") for i, s in enumerate(stack_specs)]
    counter = init((1,), dtypes.uint32, name="loop_counter")
    repeat(rec_graph, n, *states0, *inv_vals, *stacks, counter)

    # 2. reverse: gradient of one iteration, state gradients carried, invariant gradients summed
    provided = [copy.outputs[i] for i in range(n_carry) if copy.outputs[i].dtype.is_floating_point]
    wanted_inv = [p for p in invariant if ctx.needs(p)]
    required = [copy.inputs[i] for i in range(n_carry) if copy.inputs[i].dtype.is_floating_point] + \
        [copy.inputs[index[p]] for p in wanted_inv]
    info = ctx.subgraph_grad(copy, provided, required)
    float_carry = [i for i in range(n_carry) if copy.inputs[i].dtype.is_floating_point]

    def reverse(*args):
        grads, rest = args[:len(float_carry)], args[len(float_carry):]
        sums, stacks_in = rest[:len(wanted_inv)], rest[len(wanted_inv):len(wanted_inv) + n_carry]
        counter_in, inv = rest[len(wanted_inv) + n_carry], rest[len(wanted_inv) + n_carry + 1:]
        increment_mod_(counter_in, n - 1, n)  # count down: n -> n-1 -> ... -> 0
        states = [dynamic_slice(st, counter_in, [0], [1], True).reshape(s.shape)
                  for st, s in zip(stacks_in, state_specs)]
        site = call_with_info(copy, *states, inputs_dict={copy.inputs[index[p]]: t for p, t in zip(invariant, inv)})
        seeds = {copy.outputs[i]: g for i, g in zip(float_carry, grads)}
        ins = [seeds[c.fwd_tensor] for c in info.expected_inputs if c.connection_type is ExpectedConnectionType.FwdGrad]
        fwd = {g_in: site.graph_to_parent(c.fwd_tensor) for g_in, c in zip(info.graph.inputs, info.expected_inputs)
               if c.connection_type is ExpectedConnectionType.Fwd}
        outs = call(info.graph, *ins, inputs_dict=fwd)
        by_fwd = {c.fwd_tensor: g for c, g in zip(info.expected_outputs, outs)}
        for acc, p in zip(sums, wanted_inv):
            g = by_fwd.get(copy.inputs[index[p]])
            if g is not None:
                add_(acc, g)
        for i in float_carry:
            t = copy.inputs[i]
            graph_output(by_fwd[t] if t in by_fwd else init(t.shape, t.dtype, name="zero_state_grad"))

    float_specs = [state_specs[i] for i in float_carry]
    sum_specs = [op.inputs[p].spec for p in wanted_inv]
    rev_graph = _graph(ir, f"{body.name}_reverse", [(s, False) for s in float_specs] + [(s, True) for s in sum_specs]
                       + [(s, False) for s in stack_specs] + [(counter_spec, True)] + [(s, False) for s in inv_specs],
                       reverse)
    seeds = [ctx.grad_or_zeros(i) for i in float_carry]
    sums = [init(s.shape, s.dtype, name="loop_invariant_grad") for s in sum_specs]
    state_grads = repeat(rev_graph, n, *seeds, *sums, *stacks, counter, *inv_vals)

    grads: List[Optional[Tensor]] = [None] * len(op.inputs)
    for i, g in zip(float_carry, state_grads):
        grads[by_input[i]] = g
    for p, g in zip(wanted_inv, sums):
        grads[p] = g
    return grads


def _graph(ir, name: str, inputs: Sequence[Tuple[Any, bool]], body) -> Graph:
    """A new graph with inputs of the given (spec, by_ref), traced by ``body(*inputs)``."""
    g = ir.create_empty_graph(name)
    with g:
        body(*[graph_input(s.shape, s.dtype, f"in{i}", by_ref=r) for i, (s, r) in enumerate(inputs)])
    return g
