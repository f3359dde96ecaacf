"""The indexing ops (GatherND, ScatterND, ScatterElements, ReverseSequence, EyeLike, CenterCropPad,
Hardmax, Compress), built with onnx.helper, imported and run in an InferenceSession, against ONNX's
reference evaluator. Indices are covered both known at import (initializers) and fed at run time."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from popart.errors import OnnxImportError
from popart_helpers import check_against_reference, make_model, run_nodes, run_session
from test_onnx_ops import Case, N, f32, i64, pos

ND_DATA = f32(2, 3, 4)
SCATTER_ND_IDX = np.array([[1, 2], [0, -1], [1, 2]], np.int64)  # (1, 2) twice: reductions accumulate
SCATTER_EL_IDX = np.array([[1, 0, 2, 1], [1, 2, -3, 1]], np.int64)  # duplicates along axis 0

CASES = [
    # GatherND -------------------------------------------------------------------------------------
    Case("GatherND-elements", [N("GatherND", ["x", "i"], ["y"])],
         {"x": ND_DATA}, ["y"], {"i": np.array([[0, 1, 2], [1, -1, -4]], np.int64)}, opset=13),
    Case("GatherND-slices", [N("GatherND", ["x", "i"], ["y"])],
         {"x": ND_DATA}, ["y"], {"i": np.array([[[1], [0]], [[-1], [1]]], np.int64)}, opset=11),
    Case("GatherND-dynamic-indices", [N("GatherND", ["x", "i"], ["y"])],
         {"x": ND_DATA, "i": np.array([[1, 0], [0, 2], [-1, -1]], np.int64)}, ["y"], opset=13),
    Case("GatherND-batch_dims", [N("GatherND", ["x", "i"], ["y"], batch_dims=1)],
         {"x": ND_DATA, "i": np.array([[[2], [0]], [[1], [-1]]], np.int64)}, ["y"], opset=12),
    Case("GatherND-batch_dims-2", [N("GatherND", ["x", "i"], ["y"], batch_dims=2)],
         {"x": ND_DATA, "i": np.array([[[3], [0], [1]], [[2], [2], [-1]]], np.int64)}, ["y"], opset=13),
    Case("GatherND-int", [N("GatherND", ["x", "i"], ["y"])],
         {"x": np.arange(24, dtype=np.int32).reshape(4, 6)}, ["y"], {"i": np.array([[3, 5], [0, 0]], np.int64)},
         opset=13),
    Case("GatherND-one-tuple", [N("GatherND", ["x", "i"], ["y"])], {"x": ND_DATA}, ["y"], {"i": i64(1, -2)},
         opset=13),
    # ScatterND ------------------------------------------------------------------------------------
    Case("ScatterND", [N("ScatterND", ["x", "i", "u"], ["y"])],
         {"x": ND_DATA, "u": f32(2, 4)}, ["y"], {"i": np.array([[1, 2], [0, -1]], np.int64)}, opset=11),
    Case("ScatterND-elements", [N("ScatterND", ["x", "i", "u"], ["y"])],
         {"x": ND_DATA, "u": f32(2)}, ["y"], {"i": np.array([[1, 2, 3], [0, 0, -1]], np.int64)}, opset=13),
    Case("ScatterND-dynamic-indices", [N("ScatterND", ["x", "i", "u"], ["y"])],
         {"x": ND_DATA, "i": np.array([[[1]], [[0]]], np.int64), "u": f32(2, 1, 3, 4)}, ["y"], opset=13),
    Case("ScatterND-one-tuple", [N("ScatterND", ["x", "i", "u"], ["y"])],
         {"x": ND_DATA, "u": f32(4)}, ["y"], {"i": i64(0, 2)}, opset=13),
    *[Case(f"ScatterND-{r}", [N("ScatterND", ["x", "i", "u"], ["y"], reduction=r)],
           {"x": ND_DATA, "u": f32(3, 4), "i": SCATTER_ND_IDX}, ["y"], opset=18)
      for r in ("add", "mul", "max", "min")],
    Case("ScatterND-add-opset16", [N("ScatterND", ["x", "i", "u"], ["y"], reduction="add")],
         {"x": ND_DATA, "u": f32(3, 4)}, ["y"], {"i": SCATTER_ND_IDX}, opset=16),
    Case("ScatterND-mul-int", [N("ScatterND", ["x", "i", "u"], ["y"], reduction="mul")],
         {"x": np.arange(1, 9, dtype=np.int32), "u": np.array([2, 3, -1, 5], np.int32)}, ["y"],
         {"i": np.array([[4], [4], [1], [4]], np.int64)}, opset=18),
    # ScatterElements ------------------------------------------------------------------------------
    Case("ScatterElements", [N("ScatterElements", ["x", "i", "u"], ["y"])],
         {"x": f32(3, 5), "u": f32(2, 3)}, ["y"], {"i": np.array([[1, 0, 2], [0, 2, -1]], np.int64)}, opset=11),
    Case("ScatterElements-axis", [N("ScatterElements", ["x", "i", "u"], ["y"], axis=-1)],
         {"x": f32(2, 3, 5), "i": np.array([[[4, 0]], [[-2, 1]]], np.int64), "u": f32(2, 1, 2)}, ["y"], opset=13),
    *[Case(f"ScatterElements-{r}", [N("ScatterElements", ["x", "i", "u"], ["y"], reduction=r)],
           {"x": f32(3, 4), "i": SCATTER_EL_IDX, "u": f32(2, 4)}, ["y"], opset=18)
      for r in ("add", "mul", "max", "min")],
    Case("ScatterElements-mul-opset16", [N("ScatterElements", ["x", "i", "u"], ["y"], reduction="mul", axis=1)],
         {"x": f32(2, 4), "u": f32(2, 3)}, ["y"], {"i": np.array([[1, 1, 3], [0, 0, 0]], np.int64)}, opset=16),
    Case("ScatterElements-bool", [N("ScatterElements", ["x", "i", "u"], ["y"])],
         {"x": np.array([True, False, True, False]), "u": np.array([False, True])}, ["y"], {"i": i64(0, 3)},
         opset=13),
    # ReverseSequence ------------------------------------------------------------------------------
    Case("ReverseSequence-time", [N("ReverseSequence", ["x", "l"], ["y"], time_axis=0, batch_axis=1)],
         {"x": f32(4, 3, 2), "l": i64(4, 1, 2)}, ["y"]),
    Case("ReverseSequence-batch", [N("ReverseSequence", ["x", "l"], ["y"], time_axis=1, batch_axis=0)],
         {"x": f32(3, 5)}, ["y"], {"l": i64(5, 3, 0)}),
    # EyeLike --------------------------------------------------------------------------------------
    Case("EyeLike", [N("EyeLike", ["x"], ["y"])], {"x": f32(3, 4)}, ["y"]),
    Case("EyeLike-dtype-k", [N("EyeLike", ["x"], ["y"], dtype=TensorProto.INT32, k=1)], {"x": f32(4, 3)}, ["y"]),
    Case("EyeLike-negative-k", [N("EyeLike", ["x"], ["y"], k=-2)], {"x": np.zeros((4, 4), np.int32)}, ["y"]),
    # CenterCropPad --------------------------------------------------------------------------------
    Case("CenterCropPad-crop-and-pad", [N("CenterCropPad", ["x", "s"], ["y"])],
         {"x": f32(5, 4, 3)}, ["y"], {"s": i64(2, 7, 3)}, opset=18),
    Case("CenterCropPad-axes", [N("CenterCropPad", ["x", "s"], ["y"], axes=[-1, 0])],
         {"x": f32(6, 2, 5)}, ["y"], {"s": i64(2, 3)}, opset=18),
    # Hardmax --------------------------------------------------------------------------------------
    Case("Hardmax", [N("Hardmax", ["x"], ["y"])], {"x": f32(2, 3, 4)}, ["y"], opset=13),
    Case("Hardmax-axis-ties", [N("Hardmax", ["x"], ["y"], axis=0)],
         {"x": np.array([[1, 3, 2], [3, 3, 0], [3, 1, 2]], np.float32)}, ["y"], opset=13),
    # Compress -------------------------------------------------------------------------------------
    Case("Compress-axis", [N("Compress", ["x", "c"], ["y"], axis=1)],
         {"x": f32(2, 4, 3)}, ["y"], {"c": np.array([True, False, True], np.bool_)}),
    Case("Compress-negative-axis", [N("Compress", ["x", "c"], ["y"], axis=-1)],
         {"x": f32(2, 3)}, ["y"], {"c": np.array([False, True, True], np.bool_)}),
    Case("Compress-flatten", [N("Compress", ["x", "c"], ["y"])],
         {"x": pos(2, 3)}, ["y"], {"c": np.array([True, False, False, True, True], np.bool_)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_reference(case: Case) -> None:
    model = make_model(case.nodes, case.inputs, case.outputs, case.inits, case.opset)
    check_against_reference(model, case.inputs, case.outputs, rtol=case.tol, atol=case.tol)


def test_hardmax_before_opset_13_coerces_to_2d() -> None:
    # Before opset 13 the input is seen as [prod(shape[:axis]), prod(shape[axis:])]; ONNX's reference
    # evaluator applies the opset-13 rule, so the oracle is NumPy.
    x = f32(2, 3, 4)
    model = make_model([N("Hardmax", ["x"], ["y"], axis=1)], {"x": x}, ["y"], opset=11)
    flat = x.reshape(2, 12)
    want = np.zeros_like(flat)
    want[np.arange(2), flat.argmax(1)] = 1
    np.testing.assert_array_equal(run_session(model, {"x": x}, ["y"])[0], want.reshape(x.shape))


def test_compress_selecting_nothing() -> None:
    x = f32(3, 2)
    model = make_model([N("Compress", ["x", "c"], ["y"], axis=0)], {"x": x}, ["y"],
                       {"c": np.array([False, False], np.bool_)}, opset=13)
    assert run_session(model, {"x": x}, ["y"])[0].shape == (0, 2)


@pytest.mark.parametrize("nodes, inputs, inits, opset, match", [
    ([N("Compress", ["x", "c"], ["y"], axis=0)], {"x": f32(3), "c": np.array([True, False, True])}, None, 13,
     "condition.*must be known at import"),
    ([N("Compress", ["x", "c"], ["y"], axis=0)], {"x": f32(2)}, {"c": np.array([False, True, True])}, 13,
     "beyond the length 2"),
    ([N("CenterCropPad", ["x", "s"], ["y"])], {"x": f32(3, 4), "s": i64(2, 2)}, None, 18,
     "shape.*must be known at import"),
    ([N("CenterCropPad", ["x", "s"], ["y"], axes=[0])], {"x": f32(3, 4)}, {"s": i64(2, 2)}, 18,
     "one non-negative length per axis"),
    ([N("ScatterND", ["x", "i", "u"], ["y"], reduction="max")], {"x": f32(4), "u": f32(1)}, {"i": i64(1)[None]},
     16, "reduction must be one of"),
    ([N("ScatterElements", ["x", "i", "u"], ["y"], reduction="add")], {"x": f32(4), "u": f32(1)},
     {"i": i64(1)}, 13, "ScatterElements \\(ai.onnx opset 13\\) has no attribute 'reduction'"),
    ([N("ScatterND", ["x", "i", "u"], ["y"])], {"x": f32(4, 2), "u": f32(2)}, {"i": i64(1)[None]}, 13,
     "updates have shape"),
    ([N("GatherND", ["x", "i"], ["y"])], {"x": f32(4, 2)}, {"i": i64(1, 2, 0)[None]}, 13,
     r"indices.shape\[-1\] = 3"),
    ([N("GatherND", ["x", "i"], ["y"])], {"x": f32(4, 2)}, {"i": i64(4, 0)[None]}, 13, "out of range"),
    ([N("GatherND", ["x", "i"], ["y"], batch_dims=2)], {"x": f32(4, 2)}, {"i": i64(1, 0)[None]}, 13,
     "batch_dims 2"),
    ([N("ScatterElements", ["x", "i", "u"], ["y"], axis=2)], {"x": f32(4, 2), "u": f32(1, 1)},
     {"i": np.zeros((1, 1), np.int64)}, 13, "axis 2 is out of range"),
    ([N("ReverseSequence", ["x", "l"], ["y"], time_axis=0, batch_axis=0)], {"x": f32(4, 2)}, {"l": i64(1, 2)},
     13, "time_axis/batch_axis"),
    ([N("EyeLike", ["x"], ["y"])], {"x": f32(4, 2, 1)}, None, 13, "needs a 2-D input"),
], ids=["Compress-dynamic-condition", "Compress-condition-too-long", "CenterCropPad-dynamic-shape",
        "CenterCropPad-shape-length", "ScatterND-max-before-18", "ScatterElements-add-before-16",
        "ScatterND-updates-shape", "GatherND-tuple-too-long", "GatherND-index-out-of-range",
        "GatherND-batch_dims-too-large", "ScatterElements-axis", "ReverseSequence-axes", "EyeLike-rank"])
def test_bad_input_fails_at_import(nodes, inputs, inits, opset: int, match: str) -> None:
    with pytest.raises(OnnxImportError, match=match):
        run_nodes(nodes, inputs, inits, opset)
