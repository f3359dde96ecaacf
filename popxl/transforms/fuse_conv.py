"""fuse_conv: inference rewrites that turn convolution chains into single ``conv_fused`` ops
(relu(conv(x, w) + bias + residual)), which the native engine runs as one oneDNN convolution
with post-ops instead of three or four passes over the activations.

1. ``batch_norm_inference(conv(x, w), scale, bias, mean, var)`` becomes
   ``conv_fused(x, w * s, bias - mean * s)`` with ``s = scale / sqrt(var + eps)`` per output
   channel. The folded weights and bias are computed *on the device from the variables*, by
   ordinary ops in the graph, whenever they may have changed (lowering puts ops on unwritten
   weights alone in the static program, run after weight writes): a user who later writes new
   weights (``weightsFromHost``, ``writeWeights``, ``resetHostWeights``) gets them folded with
   no refolding step, and the variables (what ``modelToHost`` saves) stay the user's.
   ``add(conv(x, w), b)`` with ``b`` one value per output channel (shape ``(C, 1, ...)`` or
   ``(1, C, 1, ...)``: how ONNX importers add a Conv's bias, and what PyTorch's export leaves once it
   has folded the batch norms into the weights) becomes ``conv_fused(x, w, b)``; a float32 or
   float16 ``conv`` without a bias whose result only a relu, clip, add or max pool reads becomes a
   ``conv_fused`` with a zero bias, for step 2.
2. A ``conv_fused`` whose output is read only by ``add(out, other)`` (same shape and dtype) takes
   ``other`` as its residual; one whose output is read only by ``relu`` (or ``clip``: ReLU6) takes
   it; one without a residual whose 4-D output is read only by a ``max_pool`` takes the pool
   (ResNet's stem: the native engine pools each batch slice of the result while it is in cache,
   and the unpooled activation is never stored).

3. (`keep_channels_last`) A 4-D float32 or float16 value that a ``conv_fused`` or a 2-D pooling
   op writes and only such ops read (a convolution as input or residual, a pool as input) is kept
   channels-last (NHWC) in memory: the layout oneDNN's convolutions and pooling use on this CPU,
   so it is not reordered out and back in between them (ResNet's stem: conv, max pool, conv).
   Only the native engine's memory layout changes (the ``layouts`` attribute); values and shapes
   do not.

Before 3, a global mean or max over the spatial dims of a 4-D float32 or float16 result of a
convolution or pool (ONNX GlobalAveragePool / GlobalMaxPool) becomes the equivalent whole-image pool
(`global_pools_as_pools`), which can read the channels-last value.

Intermediate values vanish, so these are for inference: gradients of ``conv_fused`` are not
defined (autodiff raises). A value that anything else reads (another op, a graph output, a host
store of an anchor) is never fused away.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from popxl import ops
from popxl.dtypes import float16, float32
from popxl.graph import Graph
from popxl.op import Op
from popxl.ops.conv import conv_fused, conv_pool_attrs
from popxl.tensor import Tensor, constant

__all__ = ["fuse_conv", "fold_batch_norm", "fuse_conv_bias", "fuse_conv_post_ops", "global_pools_as_pools",
           "keep_channels_last"]

# The dtypes the native engine's convolutions and pools take channels-last (float16 is computed in
# float32, converted on the way in and out).
_CHANNELS_LAST_DTYPES = (float32, float16)


def fuse_conv(graph: Graph) -> Graph:
    """All the rewrites, in place, on ``graph``. Returns ``graph``.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """
    return keep_channels_last(global_pools_as_pools(fuse_conv_post_ops(fuse_conv_bias(fold_batch_norm(graph)))))


def _only_reader(graph: Graph, t: Tensor) -> Optional[Op]:
    """The one op of ``graph`` that reads ``t``, if exactly one does and ``t`` is not a graph output."""
    if any(o is t for o in graph.outputs):
        return None
    readers = graph.readers(t)
    return readers[0] if len(readers) == 1 and readers[0].inputs.count(t) == 1 else None


def _replace(graph: Graph, old: Sequence[Op], build: Callable[[], Tensor]) -> Op:
    """Replace the chain ``old`` (its last op's output is the chain's result) with the ops
    ``build`` traces (Graph.replace_ops); returns the op that now makes the result."""
    graph.replace_ops(old, build)
    made = old[-1].outputs[0].producer
    assert made is not None, "replace_ops gives the result's tensor to the op making its replacement"
    return made


def _per_channel(t: Tensor, rank: int) -> Tensor:
    return ops.reshape(t, (t.shape[0],) + (1,) * (rank - 1))


def fold_batch_norm(graph: Graph) -> Graph:
    """Rewrite 1 above, in place. Returns ``graph``.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """
    graph.ir._check_mutable()
    for bn in [op for op in graph.schedule() if op.type == "batch_norm_inference"]:
        conv = bn.inputs[0].producer
        if conv is None or conv.graph is not graph or conv.type != "conv" or _only_reader(graph, conv.outputs[0]) is not bn:
            continue
        x, w = conv.inputs
        scale, bias, mean, var = bn.inputs[1:]
        if len({t.dtype for t in (x, w, scale, bias, mean, var)}) != 1:
            continue

        def build(x=x, w=w, scale=scale, bias=bias, mean=mean, var=var, eps=bn.attrs["epsilon"], attrs=conv.attrs):
            s = scale / ops.sqrt(var + eps)
            return conv_fused(x, w * _per_channel(s, w.rank), bias - mean * s, **attrs)
        _replace(graph, [conv, bn], build)
    return graph


def _channel_bias(graph: Graph, add: Op, y: Tensor) -> Optional[List[Op]]:
    """If ``add`` adds ``y`` (a convolution's result) and one value per channel of it, the ops that
    make that bias from a 1-D tensor of the channels: ``[reshape]`` when a reshape that only ``add``
    reads does, else ``[]``. None if it is not such an add."""
    other = [t for t in add.inputs if t is not y]
    if len(other) != 1 or other[0].dtype != y.dtype:
        return None
    (b,) = other
    c, spatial = y.shape[1], (1,) * (y.rank - 2)
    if b.shape not in ((c,) + spatial, (1, c) + spatial):
        return None
    producer = b.producer
    if (producer is not None and producer.graph is graph and producer.type == "reshape"
            and producer.inputs[0].shape == (c,) and _only_reader(graph, b) is add):
        return [producer]
    return []


def _takes_as_post_op(reader: Op, y: Tensor) -> bool:
    """Whether fuse_conv_post_ops can take ``reader`` of a conv_fused's fresh result ``y`` into it."""
    if reader.type == "add":
        other = [t for t in reader.inputs if t is not y]
        return len(other) == 1 and other[0].shape == y.shape and other[0].dtype == y.dtype
    return reader.type in ("relu", "clip") or (reader.type == "max_pool" and y.rank == 4)


def fuse_conv_bias(graph: Graph) -> Graph:
    """Rewrite 1's per-channel bias add, in place; a convolution without one whose result goes on
    to an op that rewrite 2 fuses takes a zero bias. Returns ``graph``.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """
    graph.ir._check_mutable()
    for conv in [op for op in graph.schedule() if op.type == "conv"]:
        (y,) = conv.outputs
        reader = _only_reader(graph, y)
        reshapes = _channel_bias(graph, reader, y) if reader is not None and reader.type == "add" else None
        x, w, c = conv.inputs[0], conv.inputs[1], y.shape[1]
        if reader is not None and reshapes is not None:
            (b,) = [t for t in reader.inputs if t is not y]
            bias = reshapes[0].inputs[0] if reshapes else None

            def build(b=b, bias=bias, attrs=conv.attrs):
                return conv_fused(x, w, bias if bias is not None else ops.reshape(b, (c,)), **attrs)
            _replace(graph, sorted([conv, reader] + reshapes, key=graph.schedule().index), build)
        elif reader is not None and _takes_as_post_op(reader, y) and y.dtype in _CHANNELS_LAST_DTYPES:
            # no bias: a zero one, so that what follows fuses (and the activations stay channels-last)
            def zero_bias(attrs: Dict[str, Any] = conv.attrs) -> Tensor:
                return conv_fused(x, w, constant(np.zeros(c, y.dtype.as_numpy())), **attrs)
            _replace(graph, [conv], zero_bias)
    return graph


def fuse_conv_post_ops(graph: Graph) -> Graph:
    """Rewrite 2 above, in place. Returns ``graph``.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """

    graph.ir._check_mutable()
    for op in [op for op in graph.schedule() if op.type == "conv_fused"]:
        while "pool_kernel" not in op.attrs:  # nothing follows a pool into the op
            (y,) = op.outputs
            reader = _only_reader(graph, y)
            if reader is None or not _takes_as_post_op(reader, y):
                break
            inputs: List[Tensor] = list(op.inputs)
            attrs = dict(op.attrs)
            activated = attrs["relu"] or "clip" in attrs  # nothing but a pool after the activation
            if reader.type == "add" and not attrs["residual"] and not activated:
                inputs += [t for t in reader.inputs if t is not y]
                attrs["residual"] = True
            elif reader.type == "relu" and not activated:
                attrs["relu"] = True
            elif reader.type == "clip" and not activated:
                attrs["clip"] = (reader.attrs["min"], reader.attrs["max"])
            elif reader.type == "max_pool" and not attrs["residual"]:
                attrs.update(conv_pool_attrs(reader.attrs))
            else:
                break
            x, w, b = inputs[:3]
            residual = inputs[3] if attrs.pop("residual") else None
            conv_attrs = {k: v for k, v in attrs.items() if k not in ("relu", "clip")}
            op = _replace(graph, [op, reader],
                          lambda: conv_fused(x, w, b, residual=residual, relu=attrs["relu"], clip=attrs.get("clip"),
                                             **conv_attrs))
    return graph


def global_pools_as_pools(graph: Graph) -> Graph:
    """The global pool rewrite above, in place. Returns ``graph``.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """
    graph.ir._check_mutable()
    pools = {"mean": ops.average_pool, "max": ops.max_pool}
    for op in [op for op in graph.schedule() if op.type in pools]:
        (x,) = op.inputs
        if (x.rank != 4 or x.dtype not in _CHANNELS_LAST_DTYPES or x.producer is None
                or x.producer.type not in _LAYOUT_INPUTS or tuple(op.attrs["axis"]) != (2, 3) or not op.attrs["keepdims"]):
            continue
        def as_pool(pool: Callable[..., Tensor] = pools[op.type], x: Tensor = x) -> Tensor:
            return pool(x, kernel_size=tuple(x.shape[2:]))
        _replace(graph, [op], as_pool)
    return graph


# Ops that can read and write channels-last values: their `layouts` attribute lists, per slot
# below, "nchw" or "nhwc" (the output's entry follows the inputs').
_LAYOUT_INPUTS = {"conv_fused": (0, 3), "max_pool": (0,), "average_pool": (0,)}


def _layout_slot(op: Op, t: Tensor) -> Optional[int]:
    """Where ``op``'s ``layouts`` attribute describes its input ``t``; None if ``t`` may not be
    channels-last there (an op that is not layout-aware, a weight or bias slot, ``t`` read twice)."""
    slots = _LAYOUT_INPUTS.get(op.type)
    if slots is None or op.inputs.count(t) != 1 or (op.type != "conv_fused" and op.outputs[0].rank != 4):
        return None
    i = op.inputs.index(t)
    if i not in slots:
        return None
    return 0 if op.type != "conv_fused" else (0 if i == 0 else 2)


def keep_channels_last(graph: Graph) -> Graph:
    """Rewrite 3 above, in place. Returns ``graph``.

    Args:
        graph: The graph rewritten.

    Returns:
        ``graph`` itself.
    """
    graph.ir._check_mutable()
    aware = [op for op in graph.schedule() if op.type in _LAYOUT_INPUTS and op.outputs[0].rank == 4]
    readers: Dict[str, List[Op]] = {}  # by tensor id
    for op in graph.schedule():
        for t in op.inputs:
            readers.setdefault(t.id, []).append(op)
    outputs = {t.id for t in graph.outputs}
    # conv_fused: (x, y, residual); a pool: (x, y)
    layouts = {id(op): list(op.attrs.get("layouts") or ("nchw",) * (3 if op.type == "conv_fused" else 2))
               for op in aware}
    for op in aware:
        (y,) = op.outputs
        reads = readers.get(y.id, [])
        if y.dtype not in _CHANNELS_LAST_DTYPES or y.id in outputs or not reads:
            continue
        slots = [s for s in (_layout_slot(r, y) for r in reads) if s is not None]
        if len(slots) != len(reads):
            continue
        layouts[id(op)][1] = "nhwc"
        for r, s in zip(reads, slots):
            layouts[id(r)][s] = "nhwc"
    for op in aware:
        if "nhwc" in layouts[id(op)]:
            op.attrs["layouts"] = tuple(layouts[id(op)])
    return graph
