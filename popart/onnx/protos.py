"""What the importer, the op table and its families share about ONNX protos and the values they
hold: a node's table key, its subgraphs, every node of a graph, and the NumPy dtype a value has on
the device. A leaf of ``popart.onnx`` (the framework ``table``, the family modules and the driver
``importer`` all import it; it imports none of them)."""
from __future__ import annotations

from typing import Any, Iterator, List

import numpy as np
import onnx

__all__ = ["op_key", "subgraphs", "all_nodes", "device_dtype", "device_array"]

# The device has no 64-bit types (as on an IPU): 64-bit values are held in their 32-bit counterparts.
_DEVICE_NP = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32),
              np.dtype(np.float64): np.dtype(np.float32)}


def op_key(node: onnx.NodeProto) -> str:
    """The op table key of a node: its op type in the default domain, ``domain.op_type`` elsewhere
    (PopART's own ops, such as the losses the Builder adds, live in ``ai.graphcore``)."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def subgraphs(node: onnx.NodeProto) -> List[onnx.GraphProto]:
    """The graphs in a node's attributes (If's branches, Loop's and Scan's bodies)."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The nodes of ``graph`` and of every subgraph within it."""
    for node in graph.node:
        yield node
        for g in subgraphs(node):
            yield from all_nodes(g)


def device_dtype(dt: Any) -> np.dtype:
    """The NumPy dtype a value of dtype ``dt`` has on the device."""
    dt = np.dtype(dt)
    return _DEVICE_NP.get(dt, dt)


def device_array(a: np.ndarray) -> np.ndarray:
    """``a`` in its device dtype. 64-bit integers beyond the 32-bit range saturate instead of
    wrapping: INT64_MAX, an exporter's "no limit", stays the largest value (Min(x, INT64_MAX) is x)."""
    a = np.asarray(a)
    if a.dtype not in _DEVICE_NP:
        return a
    to = device_dtype(a.dtype)
    if to.kind in "iu":
        a = np.clip(a, np.iinfo(to).min, np.iinfo(to).max)
    return a.astype(to)
