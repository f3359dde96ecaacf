"""Import-time evaluation against run-time evaluation, op by op.

A node whose inputs are all known at import is computed then (folded) instead of on the device:
exporters compute shapes, position ids and masks that way (Shape -> Gather -> Concat -> Reshape,
a buffer -> Expand -> GatherElements ...). Whatever the importer computes at import must be what
the device computes for the same node: same broadcasting, same indexing (negative indices, long
axes), same element type (the ONNX type at import, its device counterpart at run time).

Every foldable op of the table is checked on ONNX's own node tests (their inputs) and on the cases
below (long axes, negative indices, broadcasting and dtypes the node tests leave out): the node
with all inputs as Constant nodes, folded by the importer, against the same node with its inputs
fed to an InferenceSession (inputs that must be known at import stay constants); and, for nodes of
several inputs, against the device with only the first input fed (the entry's own import-time
reading of the others: static indices, bounds, ...).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import popart
import popxl
from popart.onnx import OPS
from popart.onnx.backend import compile_time_inputs
from popart.onnx.importer import GraphImporter, device_dtype, op_key
from popart_helpers import make_session

# The node tests (and the selection the backend test runs: in scope and not excluded).
from test_onnx_backend import SELECTED, _BY_NAME

FOLDABLE = sorted(k for k, e in OPS.items() if e.foldable and "." not in k)

# Ops that only exist at import: the entry refuses inputs computed on the device, so there is no
# run-time evaluation to compare with. Checked against ONNX's expected outputs instead.
IMPORT_TIME_ONLY = {"Constant", "ConstantOfShape", "Range"}


@dataclass
class Case:
    """One node, its inputs (None: absent) by position, and the opset of the model."""
    name: str
    node: onnx.NodeProto
    inputs: List[Optional[np.ndarray]]
    opset: int
    expected: Optional[List[np.ndarray]] = None  # ONNX's expected outputs, for the node tests
    rtol: float = 1e-5
    atol: float = 1e-6


def _model(case: Case, fed: Sequence[str]) -> onnx.ModelProto:
    """The node in a model: inputs named in ``fed`` are graph inputs, the others Constant nodes."""
    node = case.node
    consts, vis = [], []
    for name, value in zip(node.input, case.inputs):
        if not name:
            continue
        if name in fed:
            vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                     list(value.shape)))
        else:
            consts.append(helper.make_node("Constant", [], [name], name=f"{name}_value",
                                           value=numpy_helper.from_array(value, name)))
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph(consts + [node], case.name, vis, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 8
    return model


def folded(case: Case) -> List[np.ndarray]:
    """The node's outputs as the importer computes them at import (all inputs Constant nodes)."""
    importer = GraphImporter(_model(case, fed=()))
    with popxl.Ir().main_graph:
        importer.lower({}, lambda name, value: popxl.variable(value, name=name))
    values = [importer.static(o) for o in case.node.output if o]
    assert all(v is not None for v in values), f"{case.name}: not evaluated at import"
    return values


def at_run_time(case: Case, fed: Sequence[str]) -> List[np.ndarray]:
    """The node's outputs computed by its entry on the device, inputs ``fed`` through PyStepIO (with
    none fed, the node is not folded: the entry sees every input known at import)."""
    model = _model(case, fed)
    outputs = [o for o in case.node.output if o]
    entry = OPS[op_key(case.node)]
    foldable, entry.foldable = entry.foldable, bool(fed) and entry.foldable
    try:
        session, anchors = make_session(model, outputs)
    finally:
        entry.foldable = foldable
    feeds = {name: np.array(v) for name, v in zip(case.node.input, case.inputs) if name in fed}
    session.run(popart.PyStepIO(feeds, anchors))
    return [np.asarray(anchors[o]) for o in outputs]


def _compare(case: Case, what: str, got: np.ndarray, want: np.ndarray) -> None:
    """``got`` (run time, device dtype) against ``want`` (import time, ONNX dtype)."""
    if got.dtype.names and got.dtype.itemsize == want.dtype.itemsize:
        got = got.view(want.dtype)  # float8 comes back as raw one-byte codes
    assert got.shape == want.shape, f"{what}: shape {got.shape} at run time, {want.shape} at import"
    assert got.dtype == device_dtype(want.dtype), \
        f"{what}: {got.dtype} at run time, {want.dtype} at import (device type {device_dtype(want.dtype)})"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64), err_msg=what)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=case.rtol,
                                   atol=case.atol, equal_nan=True, err_msg=what)


def _onnx_types(model: onnx.ModelProto) -> List[Optional[np.dtype]]:
    """The element type ONNX's type inference gives each graph output (None where it cannot tell)."""
    inferred = onnx.shape_inference.infer_shapes(model).graph.output
    return [np.dtype(helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type))
            if o.type.tensor_type.elem_type else None for o in inferred]


def check(case: Case) -> None:
    want = folded(case)
    present = [x for x in case.node.input if x]
    for k, (w, t) in enumerate(zip(want, _onnx_types(_model(case, fed=present)))):
        assert t is None or w.dtype == t, f"{case.name} output {k}: {w.dtype} at import, ONNX's type is {t}"
    fixed = set(compile_time_inputs(_model(case, fed=present)))
    runtime = [x for x in present if x not in fixed]
    # every input fed that may be; only the first; none at all (all must be known at import: the
    # entry's own reading of them)
    variants = [runtime] + ([runtime[:1]] if len(runtime) > 1 else []) if runtime else [[]]
    for fed in variants:
        for k, (g, w) in enumerate(zip(at_run_time(case, fed), want)):
            _compare(case, f"{case.name} output {k}, {fed or 'none'} fed", g, w)


# ---- ONNX's node tests ------------------------------------------------------------------------------
def _as_array(v) -> np.ndarray:
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.array(v)


def _node_test_case(name: str) -> Case:
    """The one node of ONNX node test ``name``, with the inputs and expected outputs of its first data set."""
    test = _BY_NAME[name]
    node = test.model.graph.node[0]
    inputs_data, expected = test.data_sets[0]
    arrays = iter(_as_array(v) for v in inputs_data)
    inputs = [next(arrays) if x else None for x in node.input]
    opset = next(o.version for o in test.model.opset_import if o.domain in ("", "ai.onnx"))
    float16 = any(a is not None and a.dtype == np.float16 for a in inputs)
    return Case(name, node, inputs, opset, [_as_array(e) for e in expected],
                # float16: the device computes in float32 and rounds once, NumPy rounds every step
                rtol=1e-3 if float16 else 1e-5, atol=1e-3 if float16 else 1e-6)


def _node_test_cases() -> Dict[str, List[Case]]:
    by_op: Dict[str, List[Case]] = {}
    for name in SELECTED:
        graph = _BY_NAME[name].model.graph
        # expanded functions (several nodes) are left out: each of their ops is checked on its own
        if len(graph.node) == 1 and op_key(graph.node[0]) in FOLDABLE:
            by_op.setdefault(graph.node[0].op_type, []).append(_node_test_case(name))
    return by_op


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    NODE_TEST_CASES = _node_test_cases()


# ---- cases the node tests leave out -----------------------------------------------------------------
_rng = np.random.default_rng(0)
I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def _i64(*v) -> np.ndarray:
    return np.asarray(v, np.int64)


def _ints(shape, low, high, dtype=np.int64) -> np.ndarray:
    return _rng.integers(low, high, shape).astype(dtype)


def _floats(*shape, dtype=np.float32) -> np.ndarray:
    return _rng.standard_normal(shape).astype(dtype)


def _bools(*shape) -> np.ndarray:
    return _rng.random(shape) < 0.5


def case(name: str, op: str, *inputs: Optional[np.ndarray], opset: int = 17, outputs: int = 1, **attrs) -> Case:
    names = [f"x{i}" if v is not None else "" for i, v in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{k}" for k in range(outputs)], name=name, **attrs)
    return Case(name, node, [None if v is None else np.asarray(v) for v in inputs], opset)


STRESS_CASES: List[Case] = [
    # GatherElements: BERT's token-type buffer (an axis longer than np.choose takes), negative
    # indices, indices shorter than the data along the other axes
    case("gather_elements_long_axis", "GatherElements", _ints((1, 512), 0, 2), _i64(*range(16))[None], axis=1),
    case("gather_elements_negative", "GatherElements", _floats(2, 70), _ints((2, 16), -70, 70), axis=1),
    case("gather_elements_smaller_indices", "GatherElements", _ints((3, 4, 5), -9, 9, np.int32),
         _ints((2, 4, 3), -3, 3, np.int32), axis=0),
    case("gather_elements_bool_last_axis", "GatherElements", _bools(3, 80), _ints((3, 5), -80, 80), axis=-1),
    # Gather: a scalar index (the axis goes), negative indices of either integer type
    case("gather_scalar_negative", "Gather", _ints((5, 4), -50, 50), np.asarray(-1, np.int64)),
    case("gather_negative_int32", "Gather", _floats(2, 100), _ints((3, 2), -100, 100, np.int32), axis=-1),
    case("gather_shape_dims", "Gather", _i64(2, 16, 32, 8), _i64(0, -1)),
    # Expand: both ways (a 1 in the shape keeps the input's length), and up in rank
    case("expand_bidirectional", "Expand", _ints((1, 16), 0, 9), _i64(3, 1)),
    case("expand_rank_up_float16", "Expand", _floats(3, 1, dtype=np.float16), _i64(2, 1, 4)),
    case("expand_bool_scalar", "Expand", np.asarray(True), _i64(2, 3)),
    # Where: three-way broadcasting, -inf fill (attention masks)
    case("where_broadcast_int64", "Where", _bools(2, 1, 4), _ints((3, 1), -5, 5), np.asarray(-7, np.int64)),
    case("where_mask_fill", "Where", _bools(4), _floats(2, 4), np.asarray([-np.inf], np.float32)),
    # comparisons and logic, broadcast, on 64-bit integers, NaN and bool
    *[case(f"{op.lower()}_int64_broadcast", op, _ints((3, 1), -3, 3), _ints((4,), -3, 3))
      for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")],
    case("equal_bool", "Equal", _bools(2, 3), _bools(3)),
    case("less_nan", "Less", np.asarray([np.nan, 1, -np.inf], np.float32), np.asarray([0, np.nan, 0], np.float32)),
    *[case(f"{op.lower()}_broadcast", op, _bools(2, 1, 3), _bools(4, 1)) for op in ("And", "Or", "Xor")],
    case("not", "Not", _bools(3, 4)),
    # arithmetic on integers (negative operands) and broadcasting
    *[case(f"{op.lower()}_int64_broadcast", op, _ints((2, 3), -100, 100), _ints((3,), -100, 100))
      for op in ("Add", "Sub", "Mul")],
    case("mul_int32_scalar", "Mul", _ints((4,), -9, 9, np.int32), np.asarray(-3, np.int32)),
    case("add_float16", "Add", _floats(3, 4, dtype=np.float16), _floats(4, dtype=np.float16)),
    case("div_int64_signs", "Div", _i64(7, -7, 7, -7, 0, 9), _i64(2, 2, -2, -2, 3, 9)),
    case("div_int32_broadcast", "Div", _ints((3, 4), -50, 50, np.int32), np.asarray([3, -4, 5, -6], np.int32)),
    case("div_float_by_zero", "Div", np.asarray([1, -1, 0, 3], np.float32), np.asarray([0, 0, 0, 2], np.float32)),
    case("mod_int_signs", "Mod", _i64(7, -7, 7, -7, 6), _i64(3, 3, -3, -3, 3)),
    case("mod_int_fmod", "Mod", _i64(7, -7, 7, -7), _i64(3, 3, -3, -3), fmod=1),
    case("mod_float_fmod", "Mod", np.asarray([5.5, -5.5, 5.5, -5.5], np.float32),
         np.asarray([2, 2, -2, -2], np.float32), fmod=1),
    case("pow_float_int_exponent", "Pow", _floats(2, 3), _i64(2, 3, 0)),
    case("pow_int", "Pow", _ints((2, 3), -4, 5), _i64(2, 3, 0)),
    case("pow_negative_base", "Pow", np.asarray([-2, -0.5, 4], np.float32), np.asarray([3, 2, 0.5], np.float32)),
    case("sqrt_head_dim", "Sqrt", np.asarray(8.0, np.float32)),
    *[case(f"{op.lower()}_int64", op, _ints((2, 5), -20, 20)) for op in ("Neg", "Abs", "Sign")],
    *[case(f"{op.lower()}_negative", op, np.asarray([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.2], np.float32))
      for op in ("Floor", "Ceil", "Round")],
    # casts: truncation toward zero, to and from bool, 64-bit types, float16
    case("cast_float_to_int64", "Cast", np.asarray([-2.7, -0.5, 0.5, 2.7, 1e6], np.float32), to=onnx.TensorProto.INT64),
    case("cast_float_to_bool", "Cast", np.asarray([0, -0.0, 0.1, np.nan, -3], np.float32), to=onnx.TensorProto.BOOL),
    case("cast_bool_to_float", "Cast", _bools(5), to=onnx.TensorProto.FLOAT),
    case("cast_int64_to_int32", "Cast", _ints((6,), -1000, 1000), to=onnx.TensorProto.INT32),
    case("cast_int64_to_float16", "Cast", _ints((6,), -1000, 1000), to=onnx.TensorProto.FLOAT16),
    case("cast_double_to_float", "Cast", _floats(5, dtype=np.float64), to=onnx.TensorProto.FLOAT),
    case("cast_float16_to_int8", "Cast", np.asarray([-100.5, -1.5, 0, 1.5, 100.5], np.float16),
         to=onnx.TensorProto.INT8),
    case("castlike_int_to_float", "CastLike", _ints((4,), -9, 9), np.zeros((), np.float32)),
    case("clip_int64", "Clip", _ints((8,), -20, 20), np.asarray(-5, np.int64), np.asarray(7, np.int64)),
    case("clip_max_only", "Clip", _floats(6), None, np.asarray(0.25, np.float32)),
    # variadic ops, broadcast over three inputs
    *[case(f"{op.lower()}_three_broadcast", op, _floats(2, 1, 3), _floats(4, 1), _floats(3))
      for op in ("Max", "Min", "Sum", "Mean")],
    case("max_int64", "Max", _ints((2, 3), -9, 9), _ints((3,), -9, 9)),
    case("min_nan", "Min", np.asarray([np.nan, 1, 2], np.float32), np.asarray([0, np.nan, 1], np.float32)),
    # shapes
    case("concat_int64_negative_axis", "Concat", _ints((2, 1), 0, 9), _ints((2, 3), 0, 9), _ints((2, 0), 0, 9),
         axis=-1),
    case("unsqueeze_negative_axes", "Unsqueeze", _i64(4, 5, 6), _i64(-1, 0)),
    case("unsqueeze_opset11", "Unsqueeze", _i64(4, 5), opset=11, axes=[0]),
    case("squeeze_negative_axis", "Squeeze", _ints((3, 1), 0, 9), _i64(-1)),
    case("squeeze_all_ones", "Squeeze", _ints((1, 3, 1), 0, 9)),
    case("reshape_zero_minus_one", "Reshape", _ints((2, 3, 4), 0, 9), _i64(0, -1)),
    case("reshape_allowzero", "Reshape", np.zeros((0, 3), np.int64), _i64(3, 0), opset=14, allowzero=1),
    case("slice_negative_step", "Slice", _ints((10,), 0, 99), _i64(-2), _i64(I64_MIN), _i64(0), _i64(-3)),
    case("slice_to_end", "Slice", _ints((3, 10), 0, 99), _i64(1, -4), _i64(I64_MAX, I64_MAX)),
    case("slice_axes_steps", "Slice", _floats(4, 6), _i64(-5), _i64(100), _i64(-1), _i64(2)),
    case("split_uneven", "Split", _ints((7,), 0, 9), opset=18, outputs=3, num_outputs=3),
    case("split_sizes", "Split", _ints((2, 7), 0, 9), _i64(2, 5), outputs=2, axis=-1),
    case("tile_int64", "Tile", _ints((2, 3), 0, 9), _i64(2, 1)),
    case("transpose_default", "Transpose", _ints((2, 3, 4), 0, 9)),
    case("flatten_negative_axis", "Flatten", _ints((2, 3, 4), 0, 9), axis=-1),
    case("flatten_axis0", "Flatten", _floats(2, 3), axis=0),
    case("shape_start_end", "Shape", _floats(2, 3, 4, 5), start=-3, end=-1),
    case("size", "Size", _floats(2, 3, 4)),
    # reductions: 64-bit integers, negative axes, bools, empty axes
    case("reduce_sum_int64", "ReduceSum", _ints((3, 4), -9, 9), _i64(-1), keepdims=0),
    case("reduce_sum_noop", "ReduceSum", _floats(3, 4), np.zeros(0, np.int64), noop_with_empty_axes=1),
    case("reduce_prod_int", "ReduceProd", _ints((3, 4), -3, 4), axes=[0], opset=17),
    case("reduce_max_bool", "ReduceMax", _bools(3, 4), _i64(1), opset=18),
    case("reduce_min_bool", "ReduceMin", _bools(3, 4), _i64(0), opset=18, keepdims=0),
    case("reduce_max_int64", "ReduceMax", _ints((3, 4), -9, 9), axes=[-1], opset=17),
    case("reduce_mean_all", "ReduceMean", _floats(3, 4), opset=17, keepdims=0),
    case("cumsum_int64_exclusive_reverse", "CumSum", _ints((3, 5), -9, 9), _i64(-1), exclusive=1, reverse=1),
    case("cumsum_float_axis0", "CumSum", _floats(4, 3), np.asarray(0, np.int32)),
    case("trilu_upper_int64_batched", "Trilu", _ints((2, 4, 5), -9, 9), _i64(-1)),
    case("trilu_lower_bool", "Trilu", _bools(5, 4), _i64(2), upper=0),
    case("onehot_negative", "OneHot", _i64(0, -1, 2, -5), np.asarray(5, np.int64), _i64(0, 3), axis=0),
    case("argmax_ties_last", "ArgMax", np.asarray([[1, 3, 3], [2, 2, 1]], np.int32), axis=-1, keepdims=0,
         select_last_index=1),
    case("argmin_ties_first", "ArgMin", np.asarray([[1, 1, 3], [2, 0, 0]], np.float32), axis=1),
    case("topk_ties_smallest", "TopK", np.asarray([[3, 1, 1, 2], [0, 0, 5, 0]], np.int64), _i64(3), outputs=2,
         axis=-1, largest=0),
    case("scatter_elements_negative_add", "ScatterElements", _ints((3, 4), -9, 9),
         np.asarray([[-1, 0], [1, -1]], np.int64), _ints((2, 2), -9, 9), axis=1, reduction="add"),
    case("scatter_nd_negative", "ScatterND", _floats(4, 3), np.asarray([[-1], [0]], np.int64), _floats(2, 3)),
    case("gather_nd_negative_batch", "GatherND", _ints((2, 3, 4), -9, 9), np.asarray([[[-1, 0]], [[2, -4]]], np.int64),
         batch_dims=1),
    case("einsum_matmul", "Einsum", _floats(2, 3), _floats(3, 4), equation="ij,jk->ik"),
    case("einsum_transpose_batch", "Einsum", _floats(2, 3, 4), equation="bij->bji"),
    case("matmul_vector", "MatMul", _floats(2, 3), _floats(3)),
    case("gemm_trans", "Gemm", _floats(3, 2), _floats(4, 3), _floats(4), transA=1, transB=1, alpha=0.5),
    case("softmax_opset11_coerced", "Softmax", _floats(2, 3, 4), opset=11, axis=1),
    case("logsoftmax_last_axis", "LogSoftmax", _floats(2, 3, 4), axis=-1),
    case("pad_int64_constant", "Pad", _ints((2, 3), -9, 9), _i64(1, 0, 0, 2), np.asarray(-1, np.int64)),
    case("pad_negative_crop", "Pad", _floats(3, 4), _i64(-1, 1, 0, -2)),
    case("pad_reflect", "Pad", _floats(3, 4), _i64(0, 2, 0, 1), mode="reflect"),
    case("depth_to_space_int", "DepthToSpace", _ints((1, 8, 2, 2), 0, 99), blocksize=2, mode="CRD"),
    case("space_to_depth_int", "SpaceToDepth", _ints((1, 2, 4, 4), 0, 99), blocksize=2),
    case("compress_no_axis", "Compress", _ints((2, 3), 0, 9), np.asarray([True, False, True, True])),
    case("isnan_isinf", "IsNaN", np.asarray([np.nan, np.inf, 0], np.float32)),
    case("isinf_negative_only", "IsInf", np.asarray([np.nan, np.inf, -np.inf, 0], np.float32), detect_positive=0),
    case("bitshift_uint8", "BitShift", np.asarray([1, 2, 128], np.uint8), np.asarray([1, 2, 1], np.uint8),
         direction="LEFT"),
    case("bitwise_and_int32", "BitwiseAnd", _ints((4,), -99, 99, np.int32), np.asarray(-3, np.int32), opset=18),
    case("shrink_int", "Shrink", _ints((6,), -9, 9), lambd=1.5, bias=1.0),
    # older opsets' forms (attributes that later became inputs, the 2-D view of the softmaxes)
    case("logsoftmax_opset11_coerced", "LogSoftmax", _floats(2, 3, 4), opset=11, axis=1),
    case("hardmax_opset11_coerced", "Hardmax", _floats(2, 3, 4), opset=11),
    case("softmax_opset11_default_axis", "Softmax", _floats(3, 2, 2), opset=11),
    case("split_opset11_attribute", "Split", _ints((6, 2), 0, 9), opset=11, outputs=2, split=[4, 2]),
    case("squeeze_opset11_attribute", "Squeeze", _ints((1, 3, 1), 0, 9), opset=11, axes=[-1]),
    case("reduce_sum_opset11_attribute", "ReduceSum", _ints((3, 4), -9, 9), opset=11, axes=[0], keepdims=0),
    case("reduce_max_opset13_attribute", "ReduceMax", _floats(3, 4), opset=13, axes=[-1]),
    case("reduce_l2_opset13", "ReduceL2", _floats(3, 4), opset=13, axes=[1]),
    case("gather_nd_opset11", "GatherND", _floats(3, 4), np.asarray([[-1, 0], [2, 3]], np.int64), opset=11),
    case("pad_opset11", "Pad", _floats(2, 3), _i64(0, 1, 1, 0), opset=11, mode="edge"),
    case("pad_opset18_axes", "Pad", _ints((2, 3), -9, 9), _i64(1, 2), None, _i64(-1), opset=18),
    case("shape_opset13", "Shape", _floats(2, 3)),
    case("clip_opset11", "Clip", _floats(6), np.asarray(-0.5, np.float32), np.asarray(0.5, np.float32), opset=11),
    case("clip_min_above_max", "Clip", _floats(6), np.asarray(0.5, np.float32), np.asarray(-0.5, np.float32)),
    case("topk_opset11", "TopK", _floats(2, 5), _i64(2), opset=11, outputs=2),
    case("scatter_elements_opset11", "ScatterElements", _floats(3, 3), np.asarray([[-1, 0, 2]], np.int64),
         _floats(1, 3), opset=11, axis=0),
    case("cast_opset13", "Cast", _floats(4), opset=13, to=onnx.TensorProto.INT32),
    case("mod_opset13", "Mod", _ints((5,), -9, 9), _i64(4), opset=13),
    case("equal_opset11_int", "Equal", _ints((3, 1), 0, 3), _ints((3,), 0, 3), opset=11),
    case("reshape_opset13", "Reshape", _floats(2, 3, 4), _i64(-1, 4), opset=13),
    case("batchnorm_opset14_inference", "BatchNormalization", _floats(2, 3, 2), np.ones(3, np.float32),
         np.zeros(3, np.float32), _floats(3), np.abs(_floats(3)) + 0.5, opset=14),
    case("dropout_opset12_inference", "Dropout", _floats(2, 3), opset=12),
    case("average_pool_opset11_pads", "AveragePool", _floats(1, 2, 5, 5), opset=11, kernel_shape=[3, 3],
         pads=[1, 1, 1, 1], count_include_pad=1),
    case("resize_opset11_nearest", "Resize", _floats(1, 1, 2, 3), np.zeros(0, np.float32),
         np.asarray([1, 1, 2, 2], np.float32), opset=11),
    case("dequantize_linear_opset19", "DequantizeLinear", _ints((4,), -100, 100, np.int8),
         np.asarray(0.5, np.float32), np.asarray(3, np.int8), opset=19),
    case("quantize_linear_opset13", "QuantizeLinear", _floats(5) * 50, np.asarray(0.5, np.float32),
         np.asarray(3, np.uint8), opset=13),
    case("erf", "Erf", np.linspace(-4, 4, 17).astype(np.float32)),
    case("sigmoid_extremes", "Sigmoid", np.asarray([-100, -10, 0, 10, 100], np.float32)),
    case("tanh_extremes", "Tanh", np.asarray([-100, -1, 0, 1e-4, 100], np.float32)),
]


def _body(name: str, inputs: Sequence[Tuple[str, int]], outputs: Sequence[str],
          nodes: Sequence[onnx.NodeProto]) -> onnx.GraphProto:
    """A Loop or Scan body with untyped-shape inputs (name, element type) and outputs."""
    return helper.make_graph(list(nodes), name, [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                             [helper.make_empty_tensor_value_info(o) for o in outputs])


# Control ops are not folded themselves: with inputs known at import an If takes its branch at
# import and Loop and Scan unroll, their bodies' nodes folded one by one; with device inputs they
# run as ops.conditional / unrolled device code.
_INT64, _BOOL, _FLOAT = onnx.TensorProto.INT64, onnx.TensorProto.BOOL, onnx.TensorProto.FLOAT
CONTROL_CASES: List[Case] = [
    case("loop_doubling_int64", "Loop", np.asarray(4, np.int64), np.asarray(True), _i64(3, -2), outputs=2,
         body=_body("double", [("i", _INT64), ("c", _BOOL), ("v", _INT64)], ["c_out", "v_out", "scan"], [
             helper.make_node("Identity", ["c"], ["c_out"]),
             helper.make_node("Add", ["v", "v"], ["v_out"]),
             helper.make_node("Mul", ["v_out", "i"], ["scan"])])),
    case("scan_running_sum", "Scan", _floats(2), _floats(3, 2), outputs=2, num_scan_inputs=1,
         body=_body("running_sum", [("s", _FLOAT), ("x", _FLOAT)], ["s_out", "y"], [
             helper.make_node("Add", ["s", "x"], ["s_out"]),
             helper.make_node("Identity", ["s_out"], ["y"])])),
]

ALL_CASES: Dict[str, List[Case]] = {op: list(cases) for op, cases in NODE_TEST_CASES.items()}
for _c in STRESS_CASES + CONTROL_CASES:
    ALL_CASES.setdefault(_c.node.op_type, []).append(_c)
for _c in map(_node_test_case, ("test_if", "test_loop11")):  # the backend's control-flow node tests
    ALL_CASES.setdefault(_c.node.op_type, []).append(_c)

# Foldable ops none of whose node tests runs here, with the reason (no case may be silently missing).
UNCHECKED: Dict[str, str] = {}


def test_every_foldable_op_is_checked():
    missing = [op for op in FOLDABLE if not ALL_CASES.get(op) and op not in UNCHECKED]
    assert not missing, f"foldable ops without a fold-vs-run case: {missing}"


@pytest.mark.parametrize("op_type", sorted(set(FOLDABLE) - IMPORT_TIME_ONLY))
def test_import_time_evaluation_matches_run_time(op_type):
    cases = ALL_CASES.get(op_type, [])
    if not cases:
        pytest.skip(UNCHECKED[op_type])
    for c in cases:
        check(c)


@pytest.mark.parametrize("op_type", ["If", "Loop", "Scan"])
def test_control_ops_with_inputs_known_at_import_match_run_time(op_type):
    for c in ALL_CASES[op_type]:
        check(c)


@pytest.mark.parametrize("op_type", sorted(IMPORT_TIME_ONLY))
def test_import_time_only_ops_match_onnx(op_type):
    """Constant, ConstantOfShape and Range run only at import: their values against ONNX's expected
    outputs (the node tests), exactly, in the ONNX type."""
    cases = [c for c in ALL_CASES.get(op_type, []) if c.expected is not None]
    assert cases
    for c in cases:
        for got, want in zip(folded(c), c.expected):
            assert got.dtype == want.dtype and got.shape == want.shape, c.name
            np.testing.assert_array_equal(got, want, err_msg=c.name)


def test_ops_not_computed_at_import_run_on_the_device():
    """Nodes ONNX's reference cannot evaluate (GlobalLpPool has no implementation, GroupNormalization
    fails on its opset-21 form, DequantizeLinear has none before opset 19) are computed on the
    device when their inputs are constants: the same values as with the inputs fed."""
    scale, bias = _floats(4), _floats(4)  # per channel from opset 21
    cases = [case("global_lp_pool", "GlobalLpPool", _floats(2, 3, 4, 4), p=3),
             case("group_norm_opset21", "GroupNormalization", _floats(2, 4, 3), scale, bias, opset=21,
                  num_groups=2),
             case("dequantize_opset13", "DequantizeLinear", _ints((4,), -100, 100, np.int8),
                  np.asarray(0.5, np.float32), np.asarray(3, np.int8), opset=13)]
    for c in cases:
        importer = GraphImporter(_model(c, fed=()))
        with popxl.Ir().main_graph:
            importer.lower({}, lambda name, value: popxl.variable(value, name=name))
        assert importer.static("y0") is None, c.name  # a device tensor
        present = [x for x in c.node.input if x]
        for got, want in zip(at_run_time(c, fed=()), at_run_time(c, fed=present)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=c.name)


@pytest.mark.parametrize("fed", [(), ("x0",)], ids=["folded", "indices-known-at-import"])
def test_gather_elements_indices_out_of_range_name_the_node(fed):
    c = case("bad_gather", "GatherElements", _floats(2, 70), np.asarray([[0, 70]], np.int64), axis=1)
    with pytest.raises(popart.OnnxImportError, match=r"'bad_gather' \(GatherElements.*indices out of range"):
        at_run_time(c, fed)


def test_gather_elements_indices_longer_than_data_name_the_node():
    c = case("bad_gather", "GatherElements", _floats(2, 3), np.zeros((3, 1), np.int64), axis=1)
    for fed in [(), ("x0", "x1")]:
        with pytest.raises(popart.OnnxImportError, match=r"'bad_gather'.*may not be longer than data"):
            at_run_time(c, fed)


@pytest.mark.parametrize("op,bound,want", [("Min", I64_MAX, [5, -3]), ("Max", I64_MIN, [5, -3]),
                                           ("Less", 3_000_000_000, [True, True]),
                                           ("Greater", -3_000_000_000, [True, True])])
def test_64_bit_values_known_at_import_saturate_on_the_device(op, bound, want):
    """An int64 value known at import beyond the device's 32 bits (INT64_MAX as "no limit") keeps
    its order against device values: it saturates rather than wrapping (INT64_MAX became -1)."""
    c = case(f"{op.lower()}_sentinel", op, _i64(5, -3), np.asarray(bound, np.int64))
    (got,) = at_run_time(c, fed=("x0",))
    np.testing.assert_array_equal(got, want)


def test_a_weight_has_a_tensor_once_lowered():
    # Before lower() the importer has nothing to make a weight's device tensor with ("'NoneType'
    # object is not callable" then); after it, the weight is the tensor lower() made.
    w = _floats(3)
    graph = helper.make_graph([helper.make_node("Neg", ["w"], ["y"])], "g", [],
                              [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    importer = GraphImporter(model)
    with pytest.raises(popart.OnnxImportError, match=r"GraphImporter.tensor: 'w' is a weight, made on the device by "
                                                     r"lower\(\); it has no tensor before lower\(\) is called"):
        importer.tensor("w")
    with popxl.Ir().main_graph:
        importer.lower({}, lambda name, value: popxl.variable(value, name=name))
    assert importer.weights["w"] is importer.tensor("w") and importer.tensor("w").shape == (3,)
