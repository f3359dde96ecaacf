"""Control-flow ops: If, Loop and Scan.

Their subgraphs (If's branches, Loop's and Scan's bodies) are imported by ``SubgraphImporter``
(``n.imp.subgraph``)
walks, which look names the subgraph does not define up in the enclosing scope.

* If: a condition known at import selects the branch, which is imported inline. Otherwise both
  branches become popxl graphs run by ``ops.conditional`` (outer device tensors they read become
  graph inputs); their outputs must then agree in shape and dtype.
* Loop: the trip count must be known at import (popart compiles a static program). The body is
  unrolled, imported once per iteration with the iteration's values bound to its inputs, so the
  iteration number and any condition computed from import-time values are known at import. A
  condition computed on the device cannot end a static program's loop: it is an error. Long loops
  without scan outputs (more than ``UNROLL_LIMIT`` iterations) become an ``ops.repeat`` of the body
  when the body allows it (same shapes each iteration, condition true at import).
* Scan: unrolled over the (static) scan length, slicing the scan inputs and stacking the outputs
  in the directions and along the axes the attributes give.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import numpy as np
import onnx

import popxl
import popxl.ops as ops
from popart.errors import OnnxImportError
from popart.onnx.table import Node, Value, _as_tensor, _axis, _stack, _unstack, onnx_op

__all__: List[str] = []

# Loops up to this many iterations are unrolled; longer ones use ops.repeat where possible.
UNROLL_LIMIT = 64
# Unrolling beyond this many iterations (a loop ops.repeat cannot express) is refused.
MAX_UNROLL = 4096


def _shape(v: Value) -> Tuple[int, ...]:
    return tuple(v.shape)


def _inputs(n: Node) -> List[Value]:
    return [n.imp.value(name) for name in n.proto.input]


def _check_outputs(n: Node, outs: Sequence[Value], count: int, what: str) -> None:
    if len(outs) != count:
        raise n.fail(f"{what} has {len(outs)} outputs; {count} were expected")


# If ----------------------------------------------------------------------------------------------
def _branch_graph(n: Node, branch: onnx.GraphProto) -> Tuple[popxl.Graph, List[popxl.Tensor]]:
    """``branch`` as a popxl graph, and the parent tensors to bind to its (captured) inputs."""
    scope = n.imp.subgraph(branch, n.opset, capture=True)

    def onnx_branch():
        return scope.run({})

    graph = popxl.gir().create_graph(onnx_branch)
    return graph, [outer for outer, _ in scope.captured.values()]


@onnx_op("If", foldable=False)
def _if(n: Node) -> List[Value]:
    then_branch, else_branch = n.attr("then_branch"), n.attr("else_branch")
    name = n.proto.input[0]
    if n.imp.is_foldable(name):
        taken = then_branch if n.static_bool(0, "the condition") else else_branch
        outs = n.imp.subgraph(taken, n.opset).run({})
        _check_outputs(n, outs, n.n_outputs, f"branch {taken.name!r}")
        return outs
    cond = n.x(0)
    if cond.nelms != 1:
        raise n.fail(f"the condition must hold a single value, but has shape {cond.shape}")
    if cond.shape != ():
        cond = ops.reshape(cond, ())
    then_graph, then_inputs = _branch_graph(n, then_branch)
    else_graph, else_inputs = _branch_graph(n, else_branch)
    a, b = then_graph.outputs, else_graph.outputs
    _check_outputs(n, a, n.n_outputs, "then_branch")
    _check_outputs(n, b, n.n_outputs, "else_branch")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            raise n.fail(f"the condition is computed on the device, so both branches are compiled and their "
                         f"outputs must agree, but output {i} ({n.proto.output[i]!r}) is {x.shape} {x.dtype.name} "
                         f"in then_branch and {y.shape} {y.dtype.name} in else_branch")
    return list(ops.conditional(cond, then_graph, else_graph, then_inputs, else_inputs))


# Loop --------------------------------------------------------------------------------------------
def _stack_scan_outputs(n: Node, per_iteration: List[List[Value]], axes: Sequence[int],
                        first: int) -> List[Value]:
    outs = []
    for k, values in enumerate(per_iteration):
        shapes = {_shape(v) for v in values}
        if len(shapes) != 1:
            raise n.fail(f"scan output {first + k} ({n.proto.output[first + k]!r}) changes shape between "
                         f"iterations ({sorted(shapes)})")
        outs.append(_stack(values, axes[k]))
    return outs


def _loop_repeat(n: Node, body: onnx.GraphProto, count: int, carried: List[Value]) -> Union[List[Value], str]:
    """The loop as an ops.repeat of the body, or why the body does not allow it (its shapes or
    dtypes change between iterations, it needs the iteration number at import, ...)."""
    scope = n.imp.subgraph(body, n.opset, capture=True)
    names = [i.name for i in body.input]
    init = [_as_tensor(v) for v in carried]
    counter = popxl.constant(np.int32(0))

    def onnx_loop_body(iteration, *values):
        outs = scope.run({names[0]: iteration, names[1]: np.array(True), **dict(zip(names[2:], values))})
        cond = scope.static(body.output[0].name)
        if n.has(1) and (cond is None or not n.single(cond, "the body's condition", bool)):
            raise _NotRepeatable()
        return [iteration + popxl.constant(np.int32(1))] + outs[1:]

    try:
        graph = popxl.gir().create_graph(onnx_loop_body, counter, *init)
        results = ops.repeat(graph, count, counter, *init, *[outer for outer, _ in scope.captured.values()])
    except _NotRepeatable:
        return "its body's condition output is not known to stay true at import"
    except (OnnxImportError, ValueError) as e:  # the unrolled loop raises it again if it is no such reason
        return str(e)
    return list(results[1:])


class _NotRepeatable(Exception):
    pass


@onnx_op("Loop", foldable=False)
def _loop(n: Node) -> List[Value]:
    body = n.attr("body")
    n_carried = n.n_inputs - 2
    n_scan = len(body.output) - 1 - n_carried
    if len(body.input) != n_carried + 2 or n_scan < 0:
        raise n.fail(f"the body has {len(body.input)} inputs and {len(body.output)} outputs, which does not fit "
                     f"{n_carried} loop-carried value(s)")
    trip_count = None
    if n.has(0):
        if not n.imp.is_foldable(n.proto.input[0]):
            raise n.fail(f"the trip count M (tensor {n.proto.input[0]!r}) must be known at import (popart compiles "
                         f"a static program), but it is computed on the device")
        trip_count = n.static_int(0, "the trip count M")
    use_cond = n.has(1)
    cond = True
    if use_cond:
        if not n.imp.is_foldable(n.proto.input[1]):
            raise n.fail(f"the initial loop condition (tensor {n.proto.input[1]!r}) is computed on the device: a "
                         f"data-dependent termination condition cannot be compiled into a static program")
        cond = n.static_bool(1, "the loop condition")
    carried = [n.imp.value(name) for name in n.proto.input[2:]]
    if trip_count is None and not use_cond:
        raise n.fail("the loop has neither a trip count M nor a condition: it never ends")
    not_repeatable = "it has scan outputs" if n_scan else "it has no trip count M"
    if trip_count is not None and trip_count > UNROLL_LIMIT and n_scan == 0 and cond:
        repeated = _loop_repeat(n, body, trip_count, carried)
        if not isinstance(repeated, str):
            return repeated
        not_repeatable = repeated
    names = [i.name for i in body.input]
    scope = n.imp.subgraph(body, n.opset)
    scans: List[List[Value]] = [[] for _ in range(n_scan)]
    it = 0
    it_dtype = n.static(0, "the trip count M").dtype if trip_count is not None else np.int64
    while cond and (trip_count is None or it < trip_count):
        if it >= MAX_UNROLL:
            raise n.fail(f"the loop runs more than {MAX_UNROLL} iterations and cannot be compiled as a repeat "
                         f"of its body: {not_repeatable}")
        outs = scope.run({names[0]: np.array(it, it_dtype), names[1]: np.array(cond), **dict(zip(names[2:], carried))})
        carried = outs[1:1 + n_carried]
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        it += 1
        last = trip_count is not None and it >= trip_count
        if use_cond and not last:
            if not isinstance(outs[0], np.ndarray):
                raise n.fail(f"the body's condition output {body.output[0].name!r} is computed on the device: a "
                             f"data-dependent termination condition cannot be compiled into a static program "
                             f"(give the loop a trip count M and a condition that stays true)")
            cond = n.single(outs[0], "the body's condition", bool)
    if n_scan and it == 0:
        raise n.fail("the loop runs no iterations, so the shapes of its scan outputs are unknown")
    return carried + _stack_scan_outputs(n, scans, [0] * n_scan, n_carried)


# Scan --------------------------------------------------------------------------------------------
def _axes(n: Node, name: str, count: int, ranks: Sequence[int]) -> List[int]:
    given = n.ints(name, [0] * count)
    if len(given) != count:
        raise n.fail(f"attribute {name} has {len(given)} entries; {count} were expected")
    return [_axis(a, r, n, f"attribute {name}: axis", scalar_axis=False) for a, r in zip(given, ranks)]


def _directions(n: Node, name: str, count: int) -> List[int]:
    given = n.ints(name, [0] * count)
    if len(given) != count or any(d not in (0, 1) for d in given):
        raise n.fail(f"attribute {name} must hold {count} directions, each 0 (forward) or 1 (reverse), not {given}")
    return given


@onnx_op("Scan", foldable=False)
def _scan(n: Node) -> List[Value]:
    body = n.attr("body")
    m = int(n.attr("num_scan_inputs"))
    values = _inputs(n)
    n_state = len(values) - m
    n_scan_out = n.n_outputs - n_state
    if n_state < 0 or n_scan_out < 0 or len(body.input) != len(values) or len(body.output) != n.n_outputs:
        raise n.fail(f"the body ({len(body.input)} inputs, {len(body.output)} outputs) does not fit "
                     f"{len(values)} inputs ({m} scanned) and {n.n_outputs} outputs")
    states, scanned = values[:n_state], values[n_state:]
    in_axes = _axes(n, "scan_input_axes", m, [len(_shape(v)) for v in scanned])
    in_dirs = _directions(n, "scan_input_directions", m)
    out_dirs = _directions(n, "scan_output_directions", n_scan_out)
    lengths = {_shape(v)[a] for v, a in zip(scanned, in_axes)}
    if len(lengths) != 1:
        raise n.fail(f"the scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    length = lengths.pop()
    if length == 0 and n_scan_out:
        raise n.fail("the scan inputs are empty, so the shapes of the scan outputs are unknown")
    if length > MAX_UNROLL:
        raise n.fail(f"the scan runs {length} iterations; at most {MAX_UNROLL} are supported (it is unrolled)")
    names = [i.name for i in body.input]
    scope = n.imp.subgraph(body, n.opset)
    outs_per_step: List[List[Value]] = [[] for _ in range(n_scan_out)]
    steps = [_unstack(v, a)[::-1] if d else _unstack(v, a) for v, a, d in zip(scanned, in_axes, in_dirs)]
    for t in range(length):
        slices = [per_step[t] for per_step in steps]
        outs = scope.run(dict(zip(names, states + slices)))
        states = outs[:n_state]
        for k in range(n_scan_out):
            outs_per_step[k].append(outs[n_state + k])
    for k, d in enumerate(out_dirs):
        if d:
            outs_per_step[k].reverse()
    out_ranks = [len(_shape(vs[0])) + 1 if vs else 1 for vs in outs_per_step]
    out_axes = _axes(n, "scan_output_axes", n_scan_out, out_ranks)
    return states + _stack_scan_outputs(n, outs_per_step, out_axes, n_state)
