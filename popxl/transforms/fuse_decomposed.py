"""fuse_decomposed: put back together the ops an exporter or importer spells out, so that each
runs as one fused kernel (one or two passes over the activations instead of eight to ten).
Every Session applies it before compiling (the graph then shows what runs).

1. ``fuse_layer_norm``: layer normalisation over the last axis written out as ONNX's
   LayerNormalization is imported (and as PyTorch's exporter writes it at opsets before 17)::

       m = mean(x, last axis, keepdims); d = x - m; v = mean(d * d, last axis, keepdims)
       y = d * (1 / sqrt(v + eps)) * weight + bias          (or d / sqrt(v + eps))

   with ``weight`` and ``bias`` one value per position of the last axis, becomes ``layer_norm``
   of x seen as rows of its last axis (two reshapes, which are views).
2. ``fuse_gelu``: GELU in its erf form, ``x * (erf(x / sqrt 2) + 1) * 0.5`` in any order of the
   products, becomes ``geluerf(x)`` (PyTorch exports ``F.gelu`` so before opset 20).

A chain is rewritten only if nothing else reads its intermediate values (another op, a graph
output), so only the fused op's result can be observed; it agrees with the chain to float32
rounding (the fused kernels accumulate the statistics in float64). After autodiff the forward's
intermediates are read by the gradient graph, so a training program keeps its chains.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Set, Tuple, TypeGuard

import numpy as np

from popxl import dtypes, ops
from popxl.analysis import reachable_graphs
from popxl.graph import Graph
from popxl.op import Op
from popxl.tensor import Constant, Tensor, constant

__all__ = ["fuse_decomposed", "fuse_layer_norm", "fuse_gelu"]


def fuse_decomposed(ir):
    """Both rewrites, in place, in every graph the main graph reaches.

    Args:
        ir: The program rewritten.

    Returns:
        ``ir`` itself.
    """
    ir._check_mutable()
    for g in reachable_graphs(ir):
        fuse_gelu(fuse_layer_norm(g))
    return ir


# matching helpers ---------------------------------------------------------------------------------
def _scalar(t: Optional[Tensor]) -> Optional[float]:
    """The value of ``t`` if it is a one-element constant, else None."""
    if isinstance(t, Constant):
        data = np.asarray(t._host_data_value)
        if data.size == 1:
            return float(data.reshape(()))
    return None


class _Readers:
    """Readers of the graph's tensors (by op), and its outputs, taken once per rewrite pass."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.by_tensor: Dict[int, List[Op]] = {}  # by id() of the tensor
        for op in graph.schedule():
            for t in op.inputs:
                self.by_tensor.setdefault(id(t), []).append(op)
        self.outputs = {id(t) for t in graph.outputs}

    def only(self, t: Tensor, kind: str) -> Optional[Op]:
        """The single reader of ``t`` (which must not be a graph output) if it is a ``kind`` op."""
        readers = self.by_tensor.get(id(t), [])
        ops = {id(r): r for r in readers}
        if id(t) in self.outputs or len(ops) != 1:
            return None
        (op,) = ops.values()
        return op if op.type == kind else None

    def all(self, t: Tensor) -> List[Op]:
        return list({id(r): r for r in self.by_tensor.get(id(t), [])}.values())

    def private(self, t: Tensor, readers: Sequence[Op]) -> bool:
        """Whether ``readers`` are exactly the ops that read ``t`` and ``t`` is not a graph output."""
        return id(t) not in self.outputs and {id(r) for r in self.all(t)} == {id(r) for r in readers}


def _other(op: Op, t: Tensor) -> Optional[Tensor]:
    """The other operand of a binary op that reads ``t`` once, else None."""
    if len(op.inputs) != 2 or op.inputs.count(t) != 1:
        return None
    return op.inputs[1] if op.inputs[0] is t else op.inputs[0]


def _last_axis_mean(op: Op) -> bool:
    x = op.inputs[0]
    return (op.type == "mean" and x.rank >= 1 and tuple(op.attrs["axis"]) == (x.rank - 1,)
            and op.attrs["keepdims"])


def _row_vector(t: Optional[Tensor], x: Tensor) -> TypeGuard[Tensor]:
    """One value per position of x's last axis (shape (D,) or (1, ..., D)), of x's dtype."""
    return (t is not None and t.dtype == x.dtype and t.rank >= 1 and t.rank <= x.rank and t.shape[-1] == x.shape[-1]
            and all(n == 1 for n in t.shape[:-1]))


# 1. layer norm ------------------------------------------------------------------------------------
def _match_layer_norm(r: _Readers, mean1: Op) -> Optional[Tuple[List[Op], Tensor, Tensor, Optional[Tensor], float]]:
    """(ops of the chain in schedule order, x, weight, bias or None, eps) or None."""
    x = mean1.inputs[0]
    if not _last_axis_mean(mean1) or x.dtype not in (dtypes.float32, dtypes.float16) or x.shape[-1] < 1:
        return None
    sub = r.only(mean1.outputs[0], "sub")
    if sub is None or list(sub.inputs) != [x, mean1.outputs[0]]:
        return None
    d = sub.outputs[0]
    square = next((op for op in r.all(d) if op.type == "mul" and list(op.inputs) == [d, d]), None)
    if square is None:
        return None
    mean2 = r.only(square.outputs[0], "mean")
    if mean2 is None or not _last_axis_mean(mean2):
        return None
    add_eps = r.only(mean2.outputs[0], "add")
    if add_eps is None:
        return None
    eps = _scalar(_other(add_eps, mean2.outputs[0]))
    if eps is None or eps < 0:
        return None
    sqrt = r.only(add_eps.outputs[0], "sqrt")
    if sqrt is None:
        return None
    std = sqrt.outputs[0]
    chain = [mean1, sub, square, mean2, add_eps, sqrt]
    # d * (1 / std), or d / std
    scale = r.only(std, "div")
    if scale is None:
        return None
    normed_op: Optional[Op]
    if scale.inputs[1] is std and scale.inputs[0] is d:
        normed_op = scale
    elif scale.inputs[1] is std and _scalar(scale.inputs[0]) == 1.0:
        normed_op = r.only(scale.outputs[0], "mul")
        if normed_op is None or _other(normed_op, scale.outputs[0]) is not d:
            return None
        chain.append(scale)
    else:
        return None
    if not r.private(d, [square, normed_op]):
        return None
    chain.append(normed_op)
    y = normed_op.outputs[0]
    mul_w = r.only(y, "mul")
    if mul_w is None:
        return None
    weight = _other(mul_w, y)
    if not _row_vector(weight, x):
        return None
    chain.append(mul_w)
    y = mul_w.outputs[0]
    add_b = r.only(y, "add")
    bias = _other(add_b, y) if add_b is not None else None
    if add_b is not None and _row_vector(bias, x) and add_b.outputs[0].shape == x.shape:
        chain.append(add_b)
    else:
        bias = None
    if chain[-1].outputs[0].shape != x.shape or chain[-1].outputs[0].dtype != x.dtype:
        return None
    return chain, x, weight, bias, eps


def fuse_layer_norm(graph: Graph) -> Graph:
    """Rewrite 1 above, in place.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """
    graph.ir._check_mutable()
    gone: Set[int] = set()  # id() of the ops an earlier rewrite removed
    for mean1 in [op for op in graph.schedule() if op.type == "mean"]:
        found = None if id(mean1) in gone else _match_layer_norm(_Readers(graph), mean1)
        if found is None:
            continue
        chain, x, weight, bias, eps = found
        gone.update(map(id, chain))
        d = x.shape[-1]

        def build(x=x, weight=weight, bias=bias, eps=eps, d=d):
            rows = ops.reshape(x, (math.prod(x.shape[:-1]), d))
            w = ops.reshape(weight, (d,)) if weight.shape != (d,) else weight
            if bias is None:
                b = constant(np.zeros(d, x.dtype.as_numpy()))
            else:
                b = ops.reshape(bias, (d,)) if bias.shape != (d,) else bias
            return ops.reshape(ops.layer_norm(rows, w, b, eps), x.shape)
        graph.replace_ops(sorted(chain, key=graph.schedule().index), build)
    return graph


# 2. gelu ------------------------------------------------------------------------------------------
def _match_gelu(r: _Readers, erf: Op) -> Optional[Tuple[List[Op], Tensor]]:
    """(ops of the chain, x) or None for erf(x / sqrt 2) (or x * (1 / sqrt 2)) + 1, times x, times 0.5."""
    scaled = erf.inputs[0]
    pre = scaled.producer
    if pre is None or pre.graph is not r.graph or r.only(scaled, "erf") is not erf:
        return None
    divisor = _scalar(pre.inputs[1]) if pre.type == "div" else None
    if divisor is not None:
        if divisor == 0:  # x / 0 is no GELU (whatever ONNX Runtime makes of it): left as it is
            return None
        x, k = pre.inputs[0], 1.0 / divisor
    elif pre.type == "mul":
        consts = [(i, v) for i, v in enumerate(map(_scalar, pre.inputs)) if v is not None]
        if len(consts) != 1:
            return None
        x, k = pre.inputs[1 - consts[0][0]], consts[0][1]
    else:
        return None
    if not math.isclose(k, 1 / math.sqrt(2), rel_tol=1e-6) or x.dtype not in (dtypes.float32, dtypes.float16):
        return None
    plus = r.only(erf.outputs[0], "add")
    if plus is None or _scalar(_other(plus, erf.outputs[0])) != 1.0:
        return None
    # (x * cdf2) * 0.5, (x * 0.5) * cdf2 or x * (cdf2 * 0.5), where cdf2 = erf(..) + 1
    cdf2 = plus.outputs[0]
    first = r.only(cdf2, "mul")
    if first is None:
        return None
    other = _other(first, cdf2)
    chain = [pre, erf, plus, first]
    if other is x:  # x * cdf2, then * 0.5
        last = r.only(first.outputs[0], "mul")
        if last is None or _scalar(_other(last, first.outputs[0])) != 0.5:
            return None
        chain.append(last)
    elif _scalar(other) == 0.5:  # cdf2 * 0.5, then * x
        last = r.only(first.outputs[0], "mul")
        if last is None or _other(last, first.outputs[0]) is not x:
            return None
        chain.append(last)
    elif (other is not None and other.producer is not None and other.producer.type == "mul"
          and _other(other.producer, x) is not None and _scalar(_other(other.producer, x)) == 0.5):  # (x * 0.5) * cdf2
        chain.insert(0, other.producer)
    else:
        return None
    if chain[-1].outputs[0].shape != x.shape or chain[-1].outputs[0].dtype != x.dtype:
        return None
    # x itself is read by the chain and maybe others; the chain's own values must be private
    for op in chain[:-1]:
        if not r.private(op.outputs[0], [o for o in chain if op.outputs[0] in o.inputs]):
            return None
    return chain, x


def fuse_gelu(graph: Graph) -> Graph:
    """Rewrite 2 above, in place.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """
    graph.ir._check_mutable()
    for erf in [op for op in graph.schedule() if op.type == "erf"]:
        found = _match_gelu(_Readers(graph), erf)
        if found is None:
            continue
        chain, x = found
        def build(x: Tensor = x) -> Tensor:
            return ops.geluerf(x)
        graph.replace_ops(sorted(chain, key=graph.schedule().index), build)
    return graph
