"""fuse_attention: scaled dot-product attention written out as ops becomes one ``attention`` op
(popxl/ops/fused_attention.py), whose native kernel goes over blocks of query rows and never
stores a head's (seq, seq) scores or probabilities::

    s = q @ kt            kt: k with its last two axes swapped (a transpose of k, or any tensor)
    s = s * c  or  s / c  (a scalar constant; optional)
    s = s + mask          (optional; any tensor that broadcasts to s)
    p = softmax(s, last axis)
    o = p @ v

with q, kt and v float32 of one rank >= 3 and the same leading (batch, heads) axes. This is what
PyTorch's exporter writes for BERT-style self-attention and what a popxl program spells out.

Every Session applies it before compiling: it fuses where nothing else reads the scores or the
probabilities (inference). A training program keeps the probabilities for its gradient, so apply
it to the forward graph *before* ``autodiff`` (``fuse_attention(fwd_graph)``): the gradient is
then ``attention_grad``, which recomputes the probabilities block by block instead of reading
stored ones. The fused op has no gradient for the mask: a chain whose mask needs one must stay
unfused (autodiff raises, naming the op).
"""
from __future__ import annotations

from typing import Optional

from popxl import dtypes, ops
from popxl.analysis import reachable_graphs
from popxl.graph import Graph
from popxl.op import Op
from popxl.ops.fused_attention import attention
from popxl.transforms.fuse_decomposed import _Readers, _other, _scalar

__all__ = ["fuse_attention"]


def _swap_last_two(rank: int):
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _match(r: _Readers, mm: Op):
    """(chain ops, q, k source, k is kt's source (not kt itself), v, mask, scale) or None."""
    if mm.type != "matmul" or mm.attrs.get("output_type") not in (None, dtypes.float32):
        return None
    q, kt = mm.inputs
    if (q.dtype != dtypes.float32 or kt.dtype != dtypes.float32 or q.rank < 3 or kt.rank != q.rank
            or q.shape[:-2] != kt.shape[:-2]):
        return None
    chain = [mm]
    s = mm.outputs[0]
    scale = 1.0
    nxt, s = _next(r, s, chain)
    if nxt is not None and nxt.type in ("mul", "div"):
        c = _scalar(other) if (other := _other(nxt, s)) is not None else None
        if c is None or (nxt.type == "div" and (nxt.inputs[0] is not s or c == 0)):
            return None
        scale = c if nxt.type == "mul" else 1.0 / c
        chain.append(nxt)
        nxt, s = _next(r, nxt.outputs[0], chain)
    mask = None
    if nxt is not None and nxt.type == "add":
        mask = _other(nxt, s)
        if mask is None or mask.dtype != s.dtype or nxt.outputs[0].shape != s.shape:
            return None
        chain.append(nxt)
        nxt, s = _next(r, nxt.outputs[0], chain)
    if nxt is None or nxt.type != "softmax" or nxt.attrs["axis"] != s.rank - 1:
        return None
    chain.append(nxt)
    mm2, p = _next(r, nxt.outputs[0], chain)
    if mm2 is None or mm2.type != "matmul" or mm2.inputs[0] is not p or mm2.inputs[1] is p \
            or mm2.attrs.get("output_type") not in (None, dtypes.float32):
        return None
    v = mm2.inputs[1]
    if v.dtype != dtypes.float32 or v.rank != q.rank or v.shape[:-2] != q.shape[:-2] or v.shape[-2] != kt.shape[-1]:
        return None
    chain.append(mm2)
    # kt made by swapping the last two axes of k, read by nothing else: read k itself
    t = kt.producer
    if (t is not None and t.graph is r.graph and t.type == "transpose"
            and tuple(t.attrs["permutation"]) == _swap_last_two(kt.rank) and r.private(kt, [mm])):
        return [t] + chain, q, t.inputs[0], True, v, mask, scale
    return chain, q, kt, False, v, mask, scale


def _next(r: _Readers, t, chain: list):
    """The single reader of ``t`` past reshapes that keep the shape (popart's Softmax import wraps
    the op in two), and the tensor it reads; the reshapes join ``chain``."""
    op = _single_reader(r, t)
    while op is not None and op.type == "reshape" and op.outputs[0].shape == t.shape:
        chain.append(op)
        t = op.outputs[0]
        op = _single_reader(r, t)
    return op, t


def _single_reader(r: _Readers, t) -> Optional[Op]:
    readers = r.all(t)
    if len(readers) != 1 or not r.private(t, readers) or readers[0].inputs.count(t) != 1:
        return None
    return readers[0]


def fuse_attention(target):
    """The rewrite above, in place.

    Args:
        target: A Graph (a forward graph before autodiff, say), or an Ir: every graph its main
            graph reaches.

    Returns:
        ``target`` itself.
    """
    if isinstance(target, Graph):
        graphs = [target]
        target.ir._check_mutable()
    else:
        target._check_mutable()
        graphs = reachable_graphs(target)
    for graph in graphs:
        readers, removed = None, set()  # (readers are taken again after each rewrite)
        for mm in [op for op in graph.schedule() if op.type == "matmul"]:
            if id(mm) in removed:
                continue
            readers = readers or _Readers(graph)
            found = _match(readers, mm)
            if found is None:
                continue
            chain, q, k, k_is_source, v, mask, scale = found
            removed.update(map(id, chain))
            readers = None

            def build(q=q, k=k, k_is_source=k_is_source, v=v, mask=mask, scale=scale):
                key = k if k_is_source else ops.transpose(k, _swap_last_two(k.rank))
                return attention(q, key, v, mask, scale)
            graph.replace_ops(sorted(chain, key=graph.schedule().index), build)
    return target
