"""Mutation fuzzing of ONNX models through popart: import, session, one run on random inputs.

A case is a seed. The seed picks one of a few small valid models (``BASES``) and applies random
field mutations (attribute values and types, dims, element types, opsets, names, dropped or
duplicated nodes, inputs and outputs, bogus tensor data) and/or byte mutations of the serialised
model (``mutate``); the mutated bytes and a description of every mutation are the case. Cases run
in long-lived worker processes (``WorkerPool``), so a crash (a signal) or a hang (a per-case
timeout) is reported with the seed and the mutations that caused it, and the campaign goes on
with a fresh worker. Every other outcome is a result or a Python exception; ``INTERNAL`` names the
exception types that show a bug in popart (an unchecked input reaching code that assumed it valid).
Longer than our ~800-line rule on purpose: it is a self-contained program (models, mutations, the
case runner and the pool), run as a script by each worker and from the command line.

From the command line (from the repository root):
    python tests/popart/onnx_fuzz.py --count 10000 [--start 0] [--workers 2]   a campaign, with a summary
    python tests/popart/onnx_fuzz.py --seed 1234                              one case, described, run here
"""
from __future__ import annotations

import argparse
import collections
import functools
import math
import os
import pickle
import random
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

# Exceptions that mean popart let an input through that it should have checked (or failed in its own
# bookkeeping): a case ending in one of these is a failure, like a crash.
INTERNAL = ("AttributeError", "KeyError", "IndexError", "RecursionError", "MemoryError", "AssertionError",
            "ZeroDivisionError", "OverflowError", "NameError", "UnboundLocalError", "SystemError",
            "FloatingPointError", "StopIteration", "UnicodeDecodeError")

# A worker's address space is capped so that a model asking for a huge allocation fails it (or
# refuses it) instead of taking the machine's memory.
WORKER_MEMORY_BYTES = 4 << 30
CASE_TIMEOUT_S = 60.0


# base models ------------------------------------------------------------------------------------------
N = helper.make_node


def _vi(name: str, elem: int, shape: Optional[Sequence[Any]]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: List[onnx.NodeProto], inputs: List[onnx.ValueInfoProto], outputs: Sequence[str],
           inits: Dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fuzz", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _mlp() -> onnx.ModelProto:
    r = np.random.default_rng(1)
    inits = {"w1": r.standard_normal((4, 8)).astype(np.float32), "b1": r.standard_normal(8).astype(np.float32),
             "w2": r.standard_normal((3, 8)).astype(np.float32), "b2": np.zeros(3, np.float32)}
    nodes = [N("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", alpha=1.0, beta=1.0),
             N("Relu", ["h"], ["r"], name="relu"),
             N("Gemm", ["r", "w2", "b2"], ["logits"], name="fc2", transB=1),
             N("Softmax", ["logits"], ["y"], name="softmax", axis=-1)]
    return _model(nodes, [_vi("x", TensorProto.FLOAT, [2, 4])], ["y"], inits, 17)


def _cnn() -> onnx.ModelProto:
    r = np.random.default_rng(2)
    inits = {"cw": (r.standard_normal((4, 2, 3, 3)) * 0.3).astype(np.float32), "cb": np.zeros(4, np.float32),
             "s": np.ones(4, np.float32), "bb": np.zeros(4, np.float32), "m": np.zeros(4, np.float32),
             "v": np.ones(4, np.float32), "gw": (r.standard_normal((4 * 3 * 3, 5)) * 0.1).astype(np.float32)}
    nodes = [N("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1],
               kernel_shape=[3, 3], dilations=[1, 1], group=1),
             N("BatchNormalization", ["c", "s", "bb", "m", "v"], ["b"], name="bn", epsilon=1e-5),
             N("Relu", ["b"], ["r"], name="relu"),
             N("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             N("Flatten", ["p"], ["f"], name="flatten", axis=1),
             N("MatMul", ["f", "gw"], ["g"], name="fc"),
             N("ReduceMean", ["c"], ["y2"], name="mean", axes=[2, 3], keepdims=1),
             N("Softmax", ["g"], ["y"], name="softmax", axis=1)]
    # opset 14: ONNX's reference evaluator runs BatchNormalization-9..13 in training mode
    return _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 2, 6, 6])], ["y", "y2"], inits, 14)


def _control() -> onnx.ModelProto:
    one = numpy_helper.from_array(np.float32(1), "one_v")
    then_g = helper.make_graph([N("Mul", ["x", "w"], ["t"], name="then_mul")], "then", [],
                               [helper.make_empty_tensor_value_info("t")])
    else_g = helper.make_graph([N("Constant", [], ["one"], value=one, name="else_one"),
                                N("Sub", ["x", "one"], ["e"], name="else_sub")], "else", [],
                               [helper.make_empty_tensor_value_info("e")])
    body = helper.make_graph(
        [N("Identity", ["cond"], ["cond_out"], name="body_cond"), N("Add", ["acc", "x"], ["a"], name="body_add"),
         N("Cast", ["i"], ["fi"], name="body_cast", to=TensorProto.FLOAT),
         N("Mul", ["a", "fi"], ["acc_out"], name="body_mul"), N("Identity", ["a"], ["scan_out"], name="body_scan")],
        "body", [_vi("i", TensorProto.INT64, []), _vi("cond", TensorProto.BOOL, []), _vi("acc", TensorProto.FLOAT, [2, 3])],
        [helper.make_empty_tensor_value_info(o) for o in ("cond_out", "acc_out", "scan_out")])
    nodes = [N("ReduceSum", ["x"], ["sum"], name="sum", keepdims=0),
             N("Greater", ["sum", "zero"], ["c"], name="positive"),
             N("If", ["c"], ["y_if"], name="if", then_branch=then_g, else_branch=else_g),
             N("Loop", ["trip", "true", "x"], ["y_loop", "y_scan"], name="loop", body=body)]
    inits = {"w": np.full((2, 3), 2.0, np.float32), "zero": np.float32(0), "trip": np.int64(3), "true": np.bool_(True)}
    return _model(nodes, [_vi("x", TensorProto.FLOAT, [2, 3])], ["y_if", "y_loop", "y_scan"], inits, 17)


def _shapes() -> onnx.ModelProto:
    nodes = [N("Shape", ["x"], ["shape"], name="shape"),
             N("Gather", ["shape", "zero"], ["batch"], name="take_batch", axis=0),
             N("Unsqueeze", ["batch", "axes0"], ["batch1"], name="unsqueeze"),
             N("Concat", ["batch1", "minus_one"], ["target"], name="concat", axis=0),
             N("Reshape", ["x", "target"], ["y_flat"], name="reshape"),
             N("Slice", ["x", "starts", "ends", "axes", "steps"], ["y_slice"], name="slice"),
             N("Gather", ["x", "idx"], ["y_gather"], name="gather", axis=2),
             N("Transpose", ["y_gather"], ["t"], name="transpose", perm=[2, 0, 1]),
             N("Expand", ["t", "expand_to"], ["y_expand"], name="expand"),
             N("ConstantOfShape", ["target2"], ["y_const"], name="const_of_shape",
               value=numpy_helper.from_array(np.array([1.5], np.float32))),
             N("Tile", ["y_slice", "reps"], ["y_tile"], name="tile")]
    inits = {"zero": np.int64(0), "axes0": np.array([0], np.int64), "minus_one": np.array([-1], np.int64),
             "starts": np.array([0, 1], np.int64), "ends": np.array([2, 4], np.int64),
             "axes": np.array([1, 2], np.int64), "steps": np.array([1, 2], np.int64),
             "idx": np.array([3, 0, -1], np.int64), "expand_to": np.array([2, 3, 2, 3], np.int64),
             "target2": np.array([2, 3], np.int64), "reps": np.array([1, 2, 1], np.int64)}
    return _model(nodes, [_vi("x", TensorProto.FLOAT, [2, 3, 4])],
                  ["y_flat", "y_slice", "y_gather", "y_expand", "y_const", "y_tile"], inits, 17)


def _integers() -> onnx.ModelProto:
    nodes = [N("Add", ["a", "b"], ["s"], name="add"), N("Mul", ["s", "b"], ["p"], name="mul"),
             N("Div", ["p", "b"], ["q"], name="div"), N("Mod", ["a", "b"], ["m"], name="mod", fmod=0),
             N("Abs", ["q"], ["abs"], name="abs"), N("Max", ["abs", "m"], ["mx"], name="max"),
             N("Greater", ["a", "b"], ["gt"], name="greater"), N("Where", ["gt", "a", "mx"], ["w"], name="where"),
             N("ReduceSum", ["w", "axes"], ["y_sum"], name="reduce", keepdims=0),
             N("ArgMax", ["a"], ["y_argmax"], name="argmax", axis=1, keepdims=1),
             N("Cast", ["w"], ["wf"], name="cast", to=TensorProto.FLOAT),
             N("Clip", ["wf", "lo", "hi"], ["y_clip"], name="clip"),
             N("Not", ["gt"], ["ng"], name="not"), N("And", ["ng", "flag"], ["y_and"], name="and"),
             N("TopK", ["a", "k"], ["y_top", "y_top_idx"], name="topk", axis=-1),
             N("CumSum", ["a", "axis1"], ["y_cumsum"], name="cumsum")]
    inits = {"axes": np.array([1], np.int64), "lo": np.float32(-3), "hi": np.float32(3), "k": np.array([2], np.int64),
             "axis1": np.int32(1)}
    inputs = [_vi("a", TensorProto.INT32, [2, 3]), _vi("b", TensorProto.INT32, [2, 3]),
              _vi("flag", TensorProto.BOOL, [2, 3])]
    return _model(nodes, inputs, ["y_sum", "y_argmax", "y_clip", "y_and", "y_top", "y_top_idx", "y_cumsum"], inits, 17)


def _indexing() -> onnx.ModelProto:
    nodes = [N("ScatterND", ["x", "nd_idx", "u"], ["scattered"], name="scatter_nd"),
             N("GatherND", ["scattered", "nd_idx"], ["y_gather_nd"], name="gather_nd"),
             N("Pad", ["x", "pads", "pad_value"], ["y_pad"], name="pad", mode="constant"),
             N("Reshape", ["x", "shape4"], ["x4"], name="to_4d"),
             N("Resize", ["x4", "", "scales"], ["y_resize"], name="resize", mode="nearest"),
             N("LayerNormalization", ["x", "gamma", "beta"], ["y_ln"], name="layer_norm", axis=-1, epsilon=1e-5),
             N("Cast", ["x"], ["h"], name="to_half", to=TensorProto.FLOAT16),
             N("ReduceMax", ["h", "axes"], ["hm"], name="reduce_max", keepdims=0),
             N("Cast", ["hm"], ["y_max"], name="to_float", to=TensorProto.FLOAT),
             N("Split", ["x"], ["s0", "s1"], name="split", axis=2, num_outputs=2),
             N("Concat", ["s1", "s0"], ["y_concat"], name="concat", axis=2),
             N("ArgMin", ["x"], ["y_argmin"], name="argmin", axis=1, keepdims=0),
             N("ScatterElements", ["x", "el_idx", "el_upd"], ["y_scatter_el"], name="scatter_el", axis=2,
               reduction="add")]
    inits = {"nd_idx": np.array([[0, 1], [1, 2]], np.int64), "pads": np.array([0, 1, 0, 0, 0, 2], np.int64),
             "pad_value": np.float32(0.5), "shape4": np.array([1, 2, 3, 4], np.int64),
             "scales": np.array([1, 1, 2, 0.5], np.float32), "gamma": np.ones(4, np.float32),
             "beta": np.zeros(4, np.float32), "axes": np.array([1], np.int64),
             "el_idx": np.array([[[0, 3, 3, 1]] * 3] * 2, np.int64), "el_upd": np.ones((2, 3, 4), np.float32)}
    inputs = [_vi("x", TensorProto.FLOAT, [2, 3, 4]), _vi("u", TensorProto.FLOAT, [2, 4])]
    outputs = ["y_gather_nd", "y_pad", "y_resize", "y_ln", "y_max", "y_concat", "y_argmin", "y_scatter_el"]
    return _model(nodes, inputs, outputs, inits, 18)


BASES: Dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": _mlp, "cnn": _cnn, "control": _control, "shapes": _shapes, "integers": _integers, "indexing": _indexing}


@functools.lru_cache(maxsize=None)
def base_bytes(name: str) -> bytes:
    return BASES[name]().SerializeToString()


# mutations --------------------------------------------------------------------------------------------
INTS = [0, 1, -1, 2, 3, -2, 5, 7, 64, 65, 4096, 100000, 2 ** 31 - 1, -2 ** 31, 2 ** 31, 2 ** 32, 2 ** 40,
        2 ** 62, 2 ** 63 - 1, -2 ** 63]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 1e-38, 1e38, 3.4e38, 1e300, math.inf, -math.inf, math.nan]
STRINGS = [b"", b"bogus", b"\xff\xfe\x00", b"NOTSET", b"SAME_UPPER", b"VALID", b"constant", b"reflect", b"edge",
           b"nearest", b"linear", b"cubic", b"DCR", b"CRD", b"forward", b"reverse", b"bidirectional", b"x" * 300]
ATTRIBUTE_NAMES = ["axis", "axes", "keepdims", "perm", "to", "transA", "transB", "alpha", "beta", "pads", "strides",
                   "kernel_shape", "dilations", "group", "mode", "epsilon", "select_last_index", "allowzero",
                   "num_outputs", "ceil_mode", "auto_pad", "largest", "sorted", "k", "fmod", "exclusive", "reverse",
                   "direction", "value", "split", "shape", "dtype", "seed", "noop_with_empty_axes", "count_include_pad",
                   "storage_order", "output_padding", "output_shape", "blocksize", "body", "then_branch"]
ELEM_TYPES = list(range(0, 28)) + [99, -1]
OPSETS = [0, -1, 1, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 99, 2 ** 62]
# Huge dims are refused at import (beyond memory); none in between, which would make legitimate
# models of gigabytes (that a worker's address-space cap, not popart, stops).
DIMS = [0, 1, 2, 3, 4, 5, 8, 16, 1000, -1, -7, 2 ** 31, 2 ** 40, 2 ** 62, 2 ** 63 - 1]


class Skip(Exception):
    """The drawn mutation does not apply to this model (another one is drawn)."""


def _graphs(g: onnx.GraphProto) -> List[onnx.GraphProto]:
    out = [g]
    for node in g.node:
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                out.extend(_graphs(sub))
    return out


def _all_nodes(model: onnx.ModelProto) -> List[Tuple[onnx.GraphProto, onnx.NodeProto]]:
    return [(g, n) for g in _graphs(model.graph) for n in g.node]


def _names(model: onnx.ModelProto) -> List[str]:
    names = []
    for g in _graphs(model.graph):
        names += [v.name for v in g.input] + [t.name for t in g.initializer]
        names += [o for n in g.node for o in n.output if o]
    return names


def _label(node: onnx.NodeProto) -> str:
    return f"node {node.name or '?'!r} ({node.op_type})"


def _pick(rng: random.Random, items: Sequence[Any]) -> Any:
    if not items:
        raise Skip()
    return items[rng.randrange(len(items))]


def _an_int(rng: random.Random) -> int:
    return _pick(rng, INTS) if rng.random() < 0.7 else rng.randint(-10, 10)


def _ints(rng: random.Random, old: Sequence[int]) -> List[int]:
    values, how = list(old), rng.randrange(5)
    if how == 0 and values:
        values[rng.randrange(len(values))] = _an_int(rng)
    elif how == 1:
        values.append(_an_int(rng))
    elif how == 2 and values:
        del values[rng.randrange(len(values))]
    elif how == 3:
        values = [_an_int(rng) for _ in range(rng.randrange(7))]
    else:
        values = values * 2
    return values


def _mutate_tensor(t: TensorProto, rng: random.Random) -> str:
    how = rng.randrange(9)
    if how == 0:
        old = list(t.dims)
        t.dims[:] = _ints(rng, old) if rng.random() < 0.5 else [_pick(rng, DIMS) for _ in old] or [_pick(rng, DIMS)]
        return f"dims {old} -> {list(t.dims)}"
    if how == 1:
        old, t.data_type = t.data_type, _pick(rng, [e for e in ELEM_TYPES if 0 <= e < 28])
        return f"data_type {old} -> {t.data_type}"
    if how == 2:
        n = len(t.raw_data)
        cut = rng.randrange(n + 1) if n else 0
        t.raw_data = t.raw_data[:cut]
        return f"raw_data truncated {n} -> {cut} bytes"
    if how == 3:
        extra = bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 4, 8, 64])))
        t.raw_data = t.raw_data + extra
        return f"raw_data extended by {len(extra)} bytes"
    if how == 4 and len(t.raw_data):
        # extreme values of the tensor's own type written over its data
        try:
            dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        except Exception:
            raise Skip()
        a = np.frombuffer(t.raw_data, np.uint8).copy()
        if dt.kind == "f":
            specials = np.array([np.nan, np.inf, -np.inf, 0, -0.0, np.finfo(dt).max, np.finfo(dt).tiny / 2], dt)
        elif dt.kind in "iu":
            specials = np.array([np.iinfo(dt).min, np.iinfo(dt).max, -1 if dt.kind == "i" else 0, 0], dt)
        else:
            raise Skip()
        value = specials[rng.randrange(len(specials))]
        view = a.view(dt) if a.size % dt.itemsize == 0 else None
        if view is None or not view.size:
            raise Skip()
        k = rng.randrange(view.size)
        view[k] = value
        t.raw_data = a.tobytes()
        return f"element {k} := {value!r}"
    if how == 5:
        t.data_location = TensorProto.EXTERNAL
        entry = t.external_data.add()
        entry.key, entry.value = "location", _pick(rng, ["missing.bin", "../../../../etc/passwd", "/dev/zero", ""])
        return f"external data at {entry.value!r}"
    if how == 6 and len(t.raw_data):
        # the data moved to a typed field of the wrong length
        t.float_data.extend([1.0] * rng.randrange(5))
        t.raw_data = b""
        return f"raw_data replaced by {len(t.float_data)} float_data values"
    if how == 7:
        t.raw_data = bytes(rng.randrange(256) for _ in range(len(t.raw_data)))
        return "raw_data randomised"
    old = list(t.dims)
    t.dims[:] = old + [1] if rng.random() < 0.5 else old[:-1]
    return f"dims {old} -> {list(t.dims)}"


def _m_attr_value(model: onnx.ModelProto, rng: random.Random) -> str:
    g, node = _pick(rng, [(g, n) for g, n in _all_nodes(model) if n.attribute])
    a = _pick(rng, node.attribute)
    where = f"{_label(node)} attribute {a.name!r}"
    if a.type == AttributeProto.INT:
        old, a.i = a.i, _an_int(rng)
        return f"{where}: {old} -> {a.i}"
    if a.type == AttributeProto.FLOAT:
        old, a.f = a.f, _pick(rng, FLOATS)
        return f"{where}: {old} -> {a.f}"
    if a.type == AttributeProto.INTS:
        old = list(a.ints)
        a.ints[:] = _ints(rng, old)
        return f"{where}: {old} -> {list(a.ints)}"
    if a.type == AttributeProto.FLOATS:
        old = list(a.floats)
        a.floats[:] = [_pick(rng, FLOATS) for _ in range(rng.randrange(5))]
        return f"{where}: {old} -> {list(a.floats)}"
    if a.type == AttributeProto.STRING:
        old, a.s = a.s, _pick(rng, STRINGS)
        return f"{where}: {old!r} -> {a.s!r}"
    if a.type == AttributeProto.TENSOR:
        return f"{where}: {_mutate_tensor(a.t, rng)}"
    if a.type == AttributeProto.GRAPH:
        return f"{where}: {_mutate_subgraph(a.g, rng)}"
    raise Skip()


def _mutate_subgraph(g: onnx.GraphProto, rng: random.Random) -> str:
    how = rng.randrange(4)
    if how == 0 and len(g.node):
        k = rng.randrange(len(g.node))
        dropped = _label(g.node[k])
        del g.node[k]
        return f"dropped {dropped}"
    if how == 1 and len(g.output):
        k = rng.randrange(len(g.output))
        old = g.output[k].name
        g.output[k].name = _pick(rng, [o for n in g.node for o in n.output] + ["nowhere", ""])
        return f"output {k} {old!r} -> {g.output[k].name!r}"
    if how == 2 and len(g.input):
        k = rng.randrange(len(g.input))
        old = g.input[k].name
        del g.input[k]
        return f"dropped input {old!r}"
    g.output.append(helper.make_empty_tensor_value_info(_pick(rng, [o for n in g.node for o in n.output] or ["x"])))
    return f"added output {g.output[-1].name!r}"


def _m_attr_kind(model: onnx.ModelProto, rng: random.Random) -> str:
    g, node = _pick(rng, _all_nodes(model))
    how = rng.randrange(5)
    if how == 0 and node.attribute:
        a = _pick(rng, node.attribute)
        old = a.type
        a.type = _pick(rng, [t for t in AttributeProto.AttributeType.values() if t != old])
        return f"{_label(node)} attribute {a.name!r}: type {old} -> {a.type} (payload kept)"
    if how == 1 and node.attribute:
        k = rng.randrange(len(node.attribute))
        name = node.attribute[k].name
        del node.attribute[k]
        return f"{_label(node)}: attribute {name!r} removed"
    if how == 2 and node.attribute:
        a = _pick(rng, node.attribute)
        node.attribute.append(a)
        return f"{_label(node)}: attribute {a.name!r} duplicated"
    name = _pick(rng, ATTRIBUTE_NAMES)
    kind = rng.randrange(5)
    if kind == 0:
        a = helper.make_attribute(name, _an_int(rng))
    elif kind == 1:
        a = helper.make_attribute(name, _pick(rng, FLOATS))
    elif kind == 2:
        a = helper.make_attribute(name, [_an_int(rng) for _ in range(rng.randrange(1, 5))])
    elif kind == 3:
        a = helper.make_attribute(name, _pick(rng, STRINGS) or b"x")
    else:
        a = helper.make_attribute(name, numpy_helper.from_array(np.array([_an_int(rng) % 7], np.int64)))
    existing = [k for k, b in enumerate(node.attribute) if b.name == name]
    for k in reversed(existing):
        del node.attribute[k]
    node.attribute.append(a)
    return f"{_label(node)}: attribute {name!r} set to {helper.get_attribute_value(a)!r}"


def _m_value_info(model: onnx.ModelProto, rng: random.Random) -> str:
    g = _pick(rng, _graphs(model.graph))
    vi = _pick(rng, list(g.input) + list(g.output))
    t = vi.type.tensor_type
    how = rng.randrange(6)
    if how == 0:
        old, t.elem_type = t.elem_type, _pick(rng, [e for e in ELEM_TYPES if 0 <= e < 28])
        return f"value {vi.name!r}: elem_type {old} -> {t.elem_type}"
    if how == 1:
        t.shape.dim.add().dim_value = _pick(rng, DIMS[:8])
        return f"value {vi.name!r}: a dim added"
    if how == 2 and len(t.shape.dim):
        del t.shape.dim[rng.randrange(len(t.shape.dim))]
        return f"value {vi.name!r}: a dim removed"
    if how == 3 and len(t.shape.dim):
        d = t.shape.dim[rng.randrange(len(t.shape.dim))]
        d.dim_param = "batch"
        return f"value {vi.name!r}: a dim made symbolic"
    if how == 4:
        vi.type.Clear()
        return f"value {vi.name!r}: type cleared"
    if not len(t.shape.dim):
        raise Skip()
    k = rng.randrange(len(t.shape.dim))
    old = t.shape.dim[k].dim_value
    t.shape.dim[k].dim_value = _pick(rng, DIMS)
    return f"value {vi.name!r}: dim {k} {old} -> {t.shape.dim[k].dim_value}"


def _m_initializer(model: onnx.ModelProto, rng: random.Random) -> str:
    g = _pick(rng, [g for g in _graphs(model.graph) if len(g.initializer)])
    t = _pick(rng, g.initializer)
    return f"initializer {t.name!r}: {_mutate_tensor(t, rng)}"


def _m_opset(model: onnx.ModelProto, rng: random.Random) -> str:
    how = rng.randrange(4)
    if how == 0:
        old = model.opset_import[0].version
        model.opset_import[0].version = _pick(rng, OPSETS)
        return f"opset {old} -> {model.opset_import[0].version}"
    if how == 1:
        model.opset_import.append(helper.make_opsetid(_pick(rng, ["ai.onnx", "ai.graphcore", "ai.onnx.ml", "x"]),
                                                      _pick(rng, OPSETS)))
        return f"opset_import added {model.opset_import[-1].domain}:{model.opset_import[-1].version}"
    if how == 2:
        g, node = _pick(rng, _all_nodes(model))
        node.domain = _pick(rng, ["ai.onnx", "ai.graphcore", "com.microsoft", "x"])
        return f"{_label(node)}: domain -> {node.domain!r}"
    old, model.ir_version = model.ir_version, _pick(rng, [0, 1, 3, 4, 7, 10, 11, 99])
    return f"ir_version {old} -> {model.ir_version}"


def _m_names(model: onnx.ModelProto, rng: random.Random) -> str:
    g, node = _pick(rng, _all_nodes(model))
    names = _names(model)
    how = rng.randrange(4)
    if how == 0 and len(node.input):
        k = rng.randrange(len(node.input))
        old = node.input[k]
        node.input[k] = _pick(rng, names + ["", "nowhere"])
        return f"{_label(node)} input {k}: {old!r} -> {node.input[k]!r}"
    if how == 1 and len(node.output):
        k = rng.randrange(len(node.output))
        old = node.output[k]
        node.output[k] = _pick(rng, names + ["", "fresh"])
        return f"{_label(node)} output {k}: {old!r} -> {node.output[k]!r}"
    if how == 2:
        k = rng.randrange(len(model.graph.output))
        old = model.graph.output[k].name
        model.graph.output[k].name = _pick(rng, names + ["", "nowhere"])
        return f"graph output {k}: {old!r} -> {model.graph.output[k].name!r}"
    old = node.op_type
    node.op_type = _pick(rng, _op_types())
    if rng.random() < 0.7:  # made to fit the new op's definition, so that its entry is reached
        fitted = _fit_to_schema(node, model.opset_import[0].version)
        return f"{_label(node)}: op type {old} -> {node.op_type} ({fitted})"
    return f"{_label(node)}: op type {old} -> {node.op_type}"


def _fit_to_schema(node: onnx.NodeProto, opset: int) -> str:
    """Drop the attributes the node's op does not define and the inputs/outputs beyond its counts."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:
        return "no definition at this opset"
    keep = [a for a in node.attribute if a.name in schema.attributes]
    dropped = len(node.attribute) - len(keep)
    del node.attribute[:]
    node.attribute.extend(keep)
    del node.input[schema.max_input:]
    del node.output[schema.max_output:]
    return f"{dropped} attribute(s) dropped, {len(node.input)} input(s), {len(node.output)} output(s)"


@functools.lru_cache(maxsize=None)
def _op_types() -> List[str]:
    from popart.onnx import OPS
    return sorted(k for k in OPS if "." not in k)


def _m_structure(model: onnx.ModelProto, rng: random.Random) -> str:
    g = _pick(rng, _graphs(model.graph))
    how = rng.randrange(4)
    if how == 0:  # an entry of one of the graph's lists dropped or repeated
        field = _pick(rng, [f for f in ("node", "input", "output", "initializer") if len(getattr(g, f))])
        entries = getattr(g, field)
        k = rng.randrange(len(entries))
        label = _label(entries[k]) if field == "node" else repr(entries[k].name)
        if rng.random() < 0.5:
            del entries[k]
            return f"dropped {field} {label}"
        entries.insert(rng.randrange(len(entries) + 1), entries[k])
        return f"repeated {field} {label}"
    if how == 1 and len(g.node) > 1:
        k = rng.randrange(len(g.node) - 1)
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(g.node[k])
        b.CopyFrom(g.node[k + 1])
        g.node[k].CopyFrom(b)
        g.node[k + 1].CopyFrom(a)
        return f"swapped nodes {k} and {k + 1}"
    node = _pick(rng, g.node)
    names = node.input if how == 2 else node.output
    what = "input" if how == 2 else "output"
    if rng.random() < 0.5 and len(names):
        del names[-1]
        return f"{_label(node)}: last {what} dropped"
    names.append(_pick(rng, _names(model) + [""]) if how == 2 else f"extra{rng.randrange(3)}")
    return f"{_label(node)}: {what} {names[-1]!r} appended"


FIELD_MUTATIONS: Dict[str, Callable[[onnx.ModelProto, random.Random], str]] = {
    "attr_value": _m_attr_value, "attr_kind": _m_attr_kind, "value_info": _m_value_info,
    "initializer": _m_initializer, "opset": _m_opset, "names": _m_names, "structure": _m_structure}


def _byte_mutation(data: bytes, rng: random.Random) -> Tuple[bytes, str]:
    b = bytearray(data)
    how = rng.randrange(6)
    if how == 0:
        spots = [rng.randrange(len(b)) for _ in range(rng.randint(1, 8))]
        for p in spots:
            b[p] ^= 1 << rng.randrange(8)
        return bytes(b), f"bits flipped at {spots}"
    if how == 1:
        p = rng.randrange(len(b))
        chunk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        b[p:p] = chunk
        return bytes(b), f"{len(chunk)} bytes inserted at {p}"
    if how == 2:
        p = rng.randrange(len(b))
        n = rng.randint(1, 32)
        del b[p:p + n]
        return bytes(b), f"{n} bytes deleted at {p}"
    if how == 3:
        p, q = rng.randrange(len(b)), rng.randrange(len(b))
        n = rng.randint(1, 64)
        b[q:q] = b[p:p + n]
        return bytes(b), f"bytes {p}:{p + n} copied to {q}"
    if how == 4:
        n = rng.randrange(len(b))
        return bytes(b[:n]), f"truncated to {n} bytes"
    p = rng.randrange(len(b))
    value = _pick(rng, [b"\xff" * 10 + b"\x01", b"\x80" * 9 + b"\x7f", b"\x00" * 4, b"\xff\xff\xff\xff\x0f"])
    b[p:p + len(value)] = value
    return bytes(b), f"varint-like bytes {value.hex()} written at {p}"


@dataclass
class Case:
    seed: int
    base: str
    mutations: List[str]
    data: bytes = field(repr=False)

    def describe(self) -> str:
        return f"seed {self.seed}: base {self.base!r}; " + "; ".join(self.mutations)


def mutate(seed: int) -> Case:
    """The case of ``seed``: a base model with 1-3 field mutations and/or a byte mutation."""
    rng = random.Random(seed)
    base = _pick(rng, sorted(BASES))
    model = onnx.ModelProto()
    model.ParseFromString(base_bytes(base))
    mutations: List[str] = []
    field_count = rng.choice([0, 1, 1, 1, 2, 2, 3])
    kinds = sorted(FIELD_MUTATIONS)
    attempts = 0
    while len(mutations) < field_count and attempts < 50:
        attempts += 1
        kind = _pick(rng, kinds)
        trial = onnx.ModelProto()
        trial.CopyFrom(model)
        try:
            what = FIELD_MUTATIONS[kind](trial, rng)
        except (Skip, ValueError, TypeError, OverflowError, IndexError):
            continue  # does not apply here, or a value protobuf refuses for the field
        model = trial
        mutations.append(f"{kind}: {what}")
    data = model.SerializeToString()
    if not mutations or rng.random() < 0.3:
        data, what = _byte_mutation(data, rng)
        mutations.append(f"bytes: {what}")
    return Case(seed, base, mutations, data)


# running one case --------------------------------------------------------------------------------------
def _random_feed(shape: Sequence[int], dt: np.dtype, rng: np.random.Generator) -> np.ndarray:
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 5, shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(-4, 5, shape).astype(dt)
    return np.zeros(shape, dt)


# Feeds larger than this are not made (their session was built; running it is not the point).
_MAX_FEED_ELEMENTS = 1 << 24


def run_case(data: bytes, seed: int = 0) -> Dict[str, Any]:
    """Import ``data``, build and prepare an InferenceSession anchoring every declared output, and
    run it once on random inputs of the declared shapes. The outcome: "ok", or the exception."""
    import popart
    stage = "import"
    try:
        try:
            # names that are not text (bytes: invalid UTF-8) are the importer's to refuse
            outputs = [o.name for o in onnx.load_from_string(data).graph.output if isinstance(o.name, str)]
        except Exception:
            outputs = []  # unparsable: the session says so
        flow = popart.DataFlow(1, {o: popart.AnchorReturnType("All") for o in outputs})
        s = popart.InferenceSession(data, flow, popart.DeviceManager().createCpuDevice())
        stage = "prepare"
        s.prepareDevice()
        s.weightsFromHost()
        stage = "run"
        anchors = s.initAnchorArrays()
        rng = np.random.default_rng(seed)
        feeds = {}
        for name in s.getInputTensorIds():
            shape = s.getInputShape(name)
            if math.prod(shape) > _MAX_FEED_ELEMENTS:
                return {"outcome": "ok", "stage": "built (input too large to feed)"}
            feeds[name] = _random_feed(shape, s.getInfo(name).numpy_dtype(), rng)
        s.run(popart.PyStepIO(feeds, anchors))
        return {"outcome": "ok", "stage": stage}
    except BaseException as e:  # noqa: B902  (every outcome is recorded, RecursionError and MemoryError too)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        frames = traceback.extract_tb(e.__traceback__)
        last = frames[-1] if frames else None
        # An error re-raised with context (the importer's "node 'n' (Op): ...") keeps what it came
        # from: an internal error there is as much a bug as one that reached the caller.
        causes, inner = [], e.__cause__
        while inner is not None and len(causes) < 10:
            causes.append(type(inner).__name__)
            inner = inner.__cause__
        return {"outcome": "error", "stage": stage, "type": type(e).__name__, "causes": causes,
                "module": type(e).__module__, "message": str(e)[:400],
                "where": f"{os.path.relpath(last.filename)}:{last.lineno} in {last.name}" if last else "",
                "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]}


# worker processes --------------------------------------------------------------------------------------
_FRAME = struct.Struct("<Q")


def _write(stream: Any, obj: Any) -> None:
    payload = pickle.dumps(obj)
    stream.write(_FRAME.pack(len(payload)) + payload)
    stream.flush()


def _read_exact(fd: int, n: int) -> Optional[bytes]:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read(fd: int) -> Optional[Any]:
    head = _read_exact(fd, _FRAME.size)
    if head is None:
        return None
    body = _read_exact(fd, _FRAME.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _self_test(kind: str) -> Dict[str, Any]:
    """Misbehaviours the pool must report (its own tests): a signal, a hang, an internal error."""
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(3600)
    if kind == "keyerror":
        try:
            {}["missing"]
        except KeyError as e:
            return {"outcome": "error", "stage": "self-test", "type": "KeyError", "module": "builtins",
                    "message": str(e), "where": "", "traceback": ""}
    return {"outcome": "ok", "stage": "self-test"}


def worker_main() -> None:
    """Serve cases from stdin until it closes: (kind, seed, payload) in, an outcome dict out."""
    import faulthandler
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed (by Python or native code) goes to stderr, not into the protocol
    faulthandler.enable()
    import popart  # noqa: F401  (imported once, before the first case)
    import popart.onnx.ops  # noqa: F401
    while True:
        request = _read(0)
        if request is None:
            return
        kind, seed, payload = request
        outcome = run_case(payload, seed) if kind == "model" else _self_test(payload)
        _write(protocol, outcome)


def _limit_worker() -> None:
    os.setsid()  # its own process group: killed with everything it started
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))


class _Worker:
    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, preexec_fn=_limit_worker)
        self.case: Optional[Tuple[Any, ...]] = None
        self.deadline = 0.0

    def submit(self, request: Tuple[Any, ...], timeout: float) -> None:
        self.case = request
        self.deadline = time.monotonic() + timeout
        _write(self.proc.stdin, request[:3])  # (kind, seed, payload); the description stays here

    def log_tail(self, n: int = 1500) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.log.close()


@dataclass
class Report:
    """What a campaign saw: outcome counts (``counts``) and the cases that failed (``failures``:
    (description, what happened))."""
    cases: int = 0
    counts: collections.Counter = field(default_factory=collections.Counter)
    failures: List[Tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [f"{self.cases} cases in {self.seconds:.1f} s"]
        lines += [f"  {n:6d}  {k}" for k, n in self.counts.most_common()]
        lines += [f"FAILED {d}\n    {what}" for d, what in self.failures]
        return "\n".join(lines)


class WorkerPool:
    """``workers`` long-lived worker processes; ``run`` hands them cases and collects outcomes,
    replacing a worker that dies (a signal: a crash) or overruns its case's timeout (a hang)."""

    def __init__(self, workers: int = 2, timeout: float = CASE_TIMEOUT_S) -> None:
        self.size, self.timeout = workers, timeout
        self._workers: List[_Worker] = []

    def __enter__(self) -> "WorkerPool":
        self._workers = [_Worker() for _ in range(self.size)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for w in self._workers:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
        for w in self._workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            w.stop()

    def run(self, requests: Iterable[Tuple[Any, ...]],
            on_result: Callable[[Tuple[Any, ...], Dict[str, Any]], None]) -> None:
        """Run every request ((kind, seed, payload, description)); ``on_result(request, outcome)``
        gets an outcome dict, with outcome "crash" or "hang" when the worker died or overran."""
        pending = iter(requests)
        busy: Dict[int, _Worker] = {}
        idle = list(range(len(self._workers)))
        exhausted = False
        while True:
            while idle and not exhausted:
                request = next(pending, None)
                if request is None:
                    exhausted = True
                    break
                k = idle.pop()
                w = self._workers[k]
                try:
                    w.submit(request, self.timeout)
                except (BrokenPipeError, OSError):  # died between cases: report it on this case's read
                    w.case = request
                busy[k] = w
            if not busy:
                return
            now = time.monotonic()
            wait = max(0.0, min(w.deadline for w in busy.values()) - now)
            ready, _, _ = select.select([w.proc.stdout.fileno() for w in busy.values()], [], [], wait)
            for k, w in list(busy.items()):
                request = w.case
                if w.proc.stdout.fileno() in ready:
                    outcome = _read(w.proc.stdout.fileno())
                    if outcome is None:
                        outcome = self._died(w)
                        self._workers[k] = w = self._replace(w)
                elif time.monotonic() >= w.deadline:
                    outcome = {"outcome": "hang", "stage": "?",
                               "message": f"no outcome within {self.timeout:.0f} s; worker killed",
                               "log": w.log_tail()}
                    self._workers[k] = w = self._replace(w)
                else:
                    continue
                del busy[k]
                idle.append(k)
                on_result(request, outcome)

    @staticmethod
    def _died(w: _Worker) -> Dict[str, Any]:
        code = w.proc.wait()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        return {"outcome": "crash", "stage": "?", "message": f"worker {how}", "log": w.log_tail()}

    @staticmethod
    def _replace(w: _Worker) -> _Worker:
        w.stop()
        return _Worker()


def classify(outcome: Dict[str, Any]) -> Tuple[str, Optional[str]]:
    """(the counter key of an outcome, why it is a failure or None)."""
    kind = outcome["outcome"]
    if kind == "ok":
        return "ok", None
    if kind in ("crash", "hang"):
        return kind, f"{outcome['message']}\n{outcome.get('log', '')}"
    name = outcome["type"]
    key = f"{outcome['stage']}: {name}"
    internal = [t for t in [name] + outcome.get("causes", []) if t in INTERNAL]
    if internal:
        return key, (f"internal error {internal[0]}: {name}: {outcome['message']} (at {outcome['where']})\n"
                     f"{outcome['traceback']}")
    if not outcome["message"].strip():
        return key, f"{name} without a message (at {outcome['where']})"
    return key, None


def fuzz(seeds: Iterable[int], workers: int = 2, timeout: float = CASE_TIMEOUT_S,
         progress: Optional[Callable[[Report], None]] = None) -> Report:
    """Run the cases of ``seeds`` in a pool of ``workers`` processes; the report of what came out."""
    report = Report()
    start = time.monotonic()

    def requests() -> Iterable[Tuple[Any, ...]]:
        for seed in seeds:
            case = mutate(seed)
            yield ("model", seed, case.data, case.describe())

    def on_result(request: Tuple[Any, ...], outcome: Dict[str, Any]) -> None:
        report.cases += 1
        key, failure = classify(outcome)
        report.counts[key] += 1
        if failure is not None:
            report.failures.append((request[3], failure))
        if progress is not None and report.cases % 500 == 0:
            progress(report)

    with WorkerPool(workers, timeout) as pool:
        pool.run(((kind, seed, data) + (desc,) for kind, seed, data, desc in requests()), on_result)
    report.seconds = time.monotonic() - start
    return report


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help="describe and run one case in this process")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S)
    args = parser.parse_args()
    if args.worker:
        worker_main()
        return
    if args.seed is not None:
        case = mutate(args.seed)
        print(case.describe())
        outcome = run_case(case.data, case.seed)
        print({k: v for k, v in outcome.items() if k != "traceback"})
        if outcome.get("traceback"):
            print(outcome["traceback"])
        return
    report = fuzz(range(args.start, args.start + args.count), args.workers, args.timeout,
                  progress=lambda r: print(f"... {r.cases} cases, {len(r.failures)} failures", flush=True))
    print(report.summary())
    sys.exit(1 if report.failures else 0)


if __name__ == "__main__":
    _main()
