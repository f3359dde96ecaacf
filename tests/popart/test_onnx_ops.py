"""Each supported ONNX op, built with onnx.helper, imported and run in an InferenceSession, against
ONNX's reference evaluator (float32 tolerance). Opset-dependent forms are covered per opset."""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional

import numpy as np
import pytest
from onnx import TensorProto, helper

from popart_helpers import check_against_reference, make_model

# ONNX's reference Sigmoid overflows in exp for large |x| (its result is still right).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")
rng = np.random.default_rng(1234)
N = helper.make_node


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def pos(*shape: int) -> np.ndarray:
    return (rng.random(shape) + 0.5).astype(np.float32)


def i64(*values) -> np.ndarray:
    return np.asarray(values, np.int64)


class Case(NamedTuple):
    id: str
    nodes: list
    inputs: Dict[str, np.ndarray]
    outputs: List[str]
    inits: Optional[Dict[str, np.ndarray]] = None
    opset: int = 17
    tol: float = 1e-5


X4 = f32(2, 3, 5, 5)
CASES = [
    # elementwise ----------------------------------------------------------------------------------
    *[Case(op, [N(op, ["x"], ["y"])], {"x": f32(3, 4)}, ["y"])
      for op in ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Erf", "Identity", "Floor", "Ceil", "Sign",
                 "Sin", "Cos")],
    Case("Sqrt", [N("Sqrt", ["x"], ["y"])], {"x": pos(3, 4)}, ["y"]),
    Case("Log", [N("Log", ["x"], ["y"])], {"x": pos(3, 4)}, ["y"]),
    Case("Reciprocal", [N("Reciprocal", ["x"], ["y"])], {"x": pos(3, 4)}, ["y"]),
    Case("Sigmoid-extremes", [N("Sigmoid", ["x"], ["y"])],
         {"x": np.array([-100, -20, -1, 0, 1, 20, 100], np.float32)}, ["y"]),
    Case("Erf-range", [N("Erf", ["x"], ["y"])], {"x": np.linspace(-5, 5, 101).astype(np.float32)}, ["y"]),
    Case("LeakyRelu", [N("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": f32(3, 4)}, ["y"]),
    Case("LeakyRelu-default", [N("LeakyRelu", ["x"], ["y"])], {"x": f32(3, 4)}, ["y"]),
    Case("Gelu-erf", [N("Gelu", ["x"], ["y"])], {"x": f32(3, 4)}, ["y"], opset=20),
    Case("Gelu-tanh", [N("Gelu", ["x"], ["y"], approximate="tanh")], {"x": f32(3, 4)}, ["y"], opset=20, tol=1e-4),
    *[Case(op, [N(op, ["a", "b"], ["y"])], {"a": f32(2, 3, 4), "b": f32(3, 1)}, ["y"])
      for op in ("Add", "Sub", "Mul", "Equal", "Less", "Greater")],
    Case("Div", [N("Div", ["a", "b"], ["y"])], {"a": f32(2, 3), "b": pos(3)}, ["y"]),
    Case("Pow", [N("Pow", ["a", "b"], ["y"])], {"a": pos(2, 3), "b": f32(2, 3)}, ["y"]),
    Case("Pow-int-exponent", [N("Pow", ["a", "e"], ["y"])], {"a": f32(2, 3)}, ["y"], {"e": np.int64(2)}),
    Case("Equal-int", [N("Equal", ["a", "b"], ["y"])],
         {"a": np.array([1, 2, 3], np.int32), "b": np.array([1, 0, 3], np.int32)}, ["y"]),
    Case("Not", [N("Greater", ["a", "b"], ["g"]), N("Not", ["g"], ["y"])], {"a": f32(4), "b": f32(4)}, ["y"]),
    Case("Where", [N("Greater", ["a", "b"], ["c"]), N("Where", ["c", "a", "b"], ["y"])],
         {"a": f32(3, 4), "b": f32(4)}, ["y"]),
    Case("Min", [N("Min", ["a", "b", "c"], ["y"])], {"a": f32(3, 4), "b": f32(4), "c": f32(3, 1)}, ["y"]),
    Case("Max", [N("Max", ["a", "b", "c"], ["y"])], {"a": f32(3, 4), "b": f32(4), "c": f32(3, 1)}, ["y"]),
    Case("Sum-Mean", [N("Sum", ["a", "b"], ["s"]), N("Mean", ["a", "b"], ["m"])],
         {"a": f32(3, 4), "b": f32(4)}, ["s", "m"]),
    Case("Sum-Mean-3", [N("Sum", ["a", "b", "c"], ["s"]), N("Mean", ["a", "b", "c"], ["m"])],
         {"a": f32(3, 4), "b": f32(4), "c": f32(3, 1)}, ["s", "m"]),
    Case("Clip-inputs", [N("Clip", ["x", "lo", "hi"], ["y"])], {"x": f32(3, 4)}, ["y"],
         {"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    Case("Clip-min-only", [N("Clip", ["x", "lo"], ["y"])], {"x": f32(3, 4)}, ["y"], {"lo": np.float32(0.1)}),
    Case("Clip-dynamic", [N("Clip", ["x", "lo", "hi"], ["y"])],
         {"x": f32(3, 4), "lo": np.float32(-0.3), "hi": np.float32(0.4)}, ["y"]),
    Case("Cast", [N("Cast", ["x"], ["y"], to=TensorProto.INT32), N("Cast", ["y"], ["z"], to=TensorProto.FLOAT)],
         {"x": (f32(3, 4) * 4)}, ["y", "z"]),
    Case("Cast-int64", [N("Cast", ["x"], ["y"], to=TensorProto.INT64)], {"x": (f32(5) * 4)}, ["y"]),
    # matmul / gemm / softmax ------------------------------------------------------------------------
    Case("MatMul", [N("MatMul", ["a", "b"], ["y"])], {"a": f32(2, 3, 4)}, ["y"], {"b": f32(4, 5)}),
    Case("MatMul-batched", [N("MatMul", ["a", "b"], ["y"])], {"a": f32(2, 3, 4), "b": f32(2, 4, 5)}, ["y"]),
    Case("Gemm", [N("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transB=1)], {"a": f32(3, 4)}, ["y"],
         {"b": f32(5, 4), "c": f32(5)}),
    Case("Gemm-transA-noC", [N("Gemm", ["a", "b"], ["y"], transA=1)], {"a": f32(4, 3), "b": f32(4, 5)}, ["y"]),
    Case("Softmax-13", [N("Softmax", ["x"], ["y"], axis=1)], {"x": f32(2, 3, 4)}, ["y"], opset=13),
    Case("Softmax-13-default", [N("Softmax", ["x"], ["y"])], {"x": f32(2, 3, 4)}, ["y"], opset=13),
    Case("LogSoftmax-13", [N("LogSoftmax", ["x"], ["y"], axis=-1)], {"x": f32(2, 3, 4)}, ["y"]),
    # convolution / pooling / normalisation ------------------------------------------------------------
    Case("Conv", [N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])], {"x": X4}, ["y"],
         {"w": f32(4, 3, 3, 3), "b": f32(4)}, tol=1e-4),
    Case("Conv-group-dilation-autopad", [N("Conv", ["x", "w"], ["y"], group=3, dilations=[2, 2],
                                           auto_pad="SAME_UPPER")], {"x": f32(1, 3, 7, 6)}, ["y"],
         {"w": f32(6, 1, 3, 3)}, tol=1e-4),
    Case("Conv-1d", [N("Conv", ["x", "w"], ["y"], pads=[2, 1])], {"x": f32(2, 3, 9)}, ["y"], {"w": f32(2, 3, 4)},
         tol=1e-4),
    Case("ConvTranspose", [N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                             output_padding=[1, 1])], {"x": f32(1, 3, 4, 4)}, ["y"],
         {"w": f32(3, 2, 3, 3), "b": f32(2)}, tol=1e-4),
    Case("ConvTranspose-output_shape", [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                                          output_shape=[9, 9])], {"x": f32(1, 2, 4, 4)}, ["y"],
         {"w": f32(2, 3, 3, 3)}, tol=1e-4),
    Case("BatchNormalization", [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
         {"x": X4}, ["y"], {"s": f32(3), "b": f32(3), "m": f32(3), "v": pos(3)}, tol=1e-4),
    Case("LayerNormalization", [N("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=-1)],
         {"x": f32(2, 3, 8)}, ["y", "mean", "inv"], {"s": f32(8), "b": f32(8)}, tol=1e-4),
    Case("LayerNormalization-axis1-noB", [N("LayerNormalization", ["x", "s"], ["y"], axis=1, epsilon=1e-3)],
         {"x": f32(2, 3, 4)}, ["y"], {"s": f32(3, 4)}, tol=1e-4),
    Case("MaxPool", [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": X4}, ["y"]),
    Case("MaxPool-ceil-dilation", [N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1,
                                     dilations=[1, 1])], {"x": X4}, ["y"]),
    Case("AveragePool", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])], {"x": X4}, ["y"]),
    Case("AveragePool-count_include_pad", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                             pads=[1, 1, 1, 1], count_include_pad=1)], {"x": X4}, ["y"]),
    Case("AveragePool-same", [N("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], auto_pad="SAME_UPPER")],
         {"x": X4}, ["y"]),
    Case("GlobalAveragePool", [N("GlobalAveragePool", ["x"], ["y"])], {"x": X4}, ["y"]),
    Case("GlobalMaxPool", [N("GlobalMaxPool", ["x"], ["y"])], {"x": X4}, ["y"]),
    Case("Dropout-12", [N("Dropout", ["x"], ["y", "mask"])], {"x": f32(3, 4)}, ["y", "mask"], opset=12),
    Case("Dropout-13-ratio", [N("Dropout", ["x", "r"], ["y"])], {"x": f32(3, 4)}, ["y"], {"r": np.float32(0.3)}),
    # reductions -----------------------------------------------------------------------------------------
    *[Case(f"{op}-13", [N(op, ["x"], ["y"], axes=[1], keepdims=0)], {"x": f32(2, 3, 4)}, ["y"], opset=13)
      for op in ("ReduceMean", "ReduceMax", "ReduceMin")],
    *[Case(f"{op}-18", [N(op, ["x", "axes"], ["y"])], {"x": f32(2, 3, 4)}, ["y"], {"axes": i64(0, -1)}, opset=18)
      for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum")],
    Case("ReduceSum-11-attr", [N("ReduceSum", ["x"], ["y"], axes=[2])], {"x": f32(2, 3, 4)}, ["y"], opset=11),
    Case("ReduceSum-13-input", [N("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], {"x": f32(2, 3, 4)}, ["y"],
         {"axes": i64(1)}, opset=13),
    Case("ReduceSum-13-all", [N("ReduceSum", ["x"], ["y"])], {"x": f32(2, 3, 4)}, ["y"], opset=13),
    Case("ReduceSum-noop", [N("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)], {"x": f32(2, 3)}, ["y"],
         opset=13),
    Case("ArgMax", [N("ArgMax", ["x"], ["y"], axis=1)], {"x": f32(3, 5)}, ["y"]),
    Case("ArgMax-last-nokeep", [N("ArgMax", ["x"], ["y"], axis=0, keepdims=0, select_last_index=1)],
         {"x": np.array([[1, 3, 3], [3, 3, 1], [3, 0, 3]], np.float32)}, ["y"]),
    # shape ops ------------------------------------------------------------------------------------------
    Case("Reshape", [N("Reshape", ["x", "s"], ["y"])], {"x": f32(2, 3, 4)}, ["y"], {"s": i64(0, -1)}),
    Case("Reshape-from-Shape", [N("Shape", ["x"], ["sh"]), N("Gather", ["sh", "i"], ["d0"], axis=0),
                                N("Unsqueeze", ["d0", "ax"], ["d0u"]), N("Concat", ["d0u", "m1"], ["s"], axis=0),
                                N("Reshape", ["x", "s"], ["y"])], {"x": f32(2, 3, 4)}, ["y", "s"],
         {"i": np.int64(0), "ax": i64(0), "m1": i64(-1)}),
    Case("Flatten", [N("Flatten", ["x"], ["y"], axis=2)], {"x": f32(2, 3, 4, 5)}, ["y"]),
    Case("Flatten-0", [N("Flatten", ["x"], ["y"], axis=0)], {"x": f32(2, 3)}, ["y"]),
    Case("Transpose", [N("Transpose", ["x"], ["y"], perm=[2, 0, 1])], {"x": f32(2, 3, 4)}, ["y"]),
    Case("Transpose-default", [N("Transpose", ["x"], ["y"])], {"x": f32(2, 3, 4)}, ["y"]),
    Case("Concat", [N("Concat", ["a", "b", "c"], ["y"], axis=-1)], {"a": f32(2, 3), "b": f32(2, 1)}, ["y"],
         {"c": f32(2, 2)}),
    Case("Split-13-input", [N("Split", ["x", "s"], ["a", "b"], axis=1)], {"x": f32(2, 5)}, ["a", "b"],
         {"s": i64(2, 3)}, opset=13),
    Case("Split-11-attr", [N("Split", ["x"], ["a", "b", "c"], axis=0, split=[1, 1, 2])], {"x": f32(4, 2)},
         ["a", "b", "c"], opset=11),
    Case("Split-equal", [N("Split", ["x"], ["a", "b"], axis=1)], {"x": f32(2, 6)}, ["a", "b"], opset=13),
    Case("Split-18-num_outputs", [N("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)], {"x": f32(2, 7)},
         ["a", "b", "c"], opset=18),
    Case("Slice", [N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": f32(5, 6, 7)}, ["y"],
         {"st": i64(1, -1), "en": i64(9223372036854775807, -6), "ax": i64(1, 2), "sp": i64(2, -2)}),
    Case("Slice-defaults", [N("Slice", ["x", "st", "en"], ["y"])], {"x": f32(5, 6)}, ["y"],
         {"st": i64(1, 0), "en": i64(-1, 3)}),
    Case("Gather-static", [N("Gather", ["x", "i"], ["y"], axis=1)], {"x": f32(3, 5, 2)}, ["y"],
         {"i": np.array([[0, -1], [4, 2]], np.int64)}),
    Case("Gather-dynamic", [N("Gather", ["x", "i"], ["y"], axis=0)],
         {"x": f32(6, 3), "i": np.array([5, 0, 2, 2], np.int64)}, ["y"]),
    Case("Gather-scalar", [N("Gather", ["x", "i"], ["y"], axis=0)], {"x": f32(6, 3)}, ["y"], {"i": np.int64(3)}),
    Case("Unsqueeze-13", [N("Unsqueeze", ["x", "a"], ["y"])], {"x": f32(3, 4)}, ["y"], {"a": i64(0, -1)}),
    Case("Unsqueeze-11", [N("Unsqueeze", ["x"], ["y"], axes=[1])], {"x": f32(3, 4)}, ["y"], opset=11),
    Case("Squeeze-13", [N("Squeeze", ["x", "a"], ["y"])], {"x": f32(3, 1, 4, 1)}, ["y"], {"a": i64(1)}),
    Case("Squeeze-all", [N("Squeeze", ["x"], ["y"])], {"x": f32(3, 1, 4, 1)}, ["y"]),
    Case("Squeeze-11", [N("Squeeze", ["x"], ["y"], axes=[-1])], {"x": f32(3, 1, 4, 1)}, ["y"], opset=11),
    Case("Expand", [N("Expand", ["x", "s"], ["y"])], {"x": f32(3, 1)}, ["y"], {"s": i64(2, 3, 4)}),
    Case("Tile", [N("Tile", ["x", "r"], ["y"])], {"x": f32(2, 3)}, ["y"], {"r": i64(2, 3)}),
    Case("Pad-constant", [N("Pad", ["x", "p", "v"], ["y"])], {"x": f32(2, 3)}, ["y"],
         {"p": i64(1, 0, 2, 3), "v": np.float32(1.5)}),
    Case("Pad-reflect", [N("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": f32(1, 4, 5)}, ["y"],
         {"p": i64(0, 2, 3, 0, 3, 4)}),
    Case("Pad-edge", [N("Pad", ["x", "p"], ["y"], mode="edge")], {"x": f32(4, 5)}, ["y"],
         {"p": i64(1, 2, 2, 0)}),
    Case("Pad-18-axes", [N("Pad", ["x", "p", "", "a"], ["y"])], {"x": f32(2, 3, 4)}, ["y"],
         {"p": i64(1, 2), "a": i64(-1)}, opset=18),
    Case("Shape-15-slice", [N("Shape", ["x"], ["y"], start=1, end=-1)], {"x": f32(2, 3, 4, 5)}, ["y"], opset=15),
    Case("Size", [N("Size", ["x"], ["y"])], {"x": f32(2, 3)}, ["y"]),
    Case("Constant", [N("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [3], [1, 2, 3])),
                      N("Add", ["x", "c"], ["y"])], {"x": f32(2, 3)}, ["y"]),
    Case("Constant-value_ints", [N("Constant", [], ["c"], value_ints=[2, 3]), N("Reshape", ["x", "c"], ["y"])],
         {"x": f32(6)}, ["y"]),
    Case("ConstantOfShape", [N("Shape", ["x"], ["s"]), N("ConstantOfShape", ["s"], ["z"],
                                                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.5])),
                             N("Mul", ["x", "z"], ["y"])], {"x": f32(2, 3)}, ["y"]),
    Case("Range", [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i"], ["n"]),
                   N("Range", ["zero", "n", "one"], ["r"]), N("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
                   N("Add", ["x", "rf"], ["y"])], {"x": f32(2, 4)}, ["y"],
         {"i": np.int64(1), "zero": np.int64(0), "one": np.int64(1)}),
    Case("Resize-nearest-scales", [N("Resize", ["x", "", "sc"], ["y"], mode="nearest")], {"x": f32(1, 2, 3, 4)},
         ["y"], {"sc": np.array([1, 1, 2, 1.5], np.float32)}, opset=13),
    Case("Resize-linear-sizes", [N("Resize", ["x", "", "", "sz"], ["y"], mode="linear")], {"x": f32(1, 2, 3, 4)},
         ["y"], {"sz": i64(1, 2, 7, 5)}, opset=13),
    Case("Resize-linear-align-corners", [N("Resize", ["x", "roi", "sc"], ["y"], mode="linear",
                                           coordinate_transformation_mode="align_corners")],
         {"x": f32(1, 1, 4, 4)}, ["y"], {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 2], np.float32)},
         opset=11),
    Case("Resize-nearest-asymmetric-floor", [N("Resize", ["x", "", "sc"], ["y"], mode="nearest",
                                               coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
         {"x": f32(1, 1, 3, 3)}, ["y"], {"sc": np.array([1, 1, 3, 3], np.float32)}, opset=19),
    # further ops ------------------------------------------------------------------------------------------
    *[Case(op, [N(op, ["x"], ["y"])], {"x": f32(3, 4) * 3}, ["y"], opset=18)
      for op in ("Softplus", "Softsign", "Mish", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu",
                 "ThresholdedRelu")],
    Case("HardSigmoid-attrs", [N("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4)], {"x": f32(3, 4)}, ["y"]),
    Case("Elu-alpha", [N("Elu", ["x"], ["y"], alpha=0.5)], {"x": f32(3, 4)}, ["y"]),
    Case("PRelu", [N("PRelu", ["x", "s"], ["y"])], {"x": f32(2, 3, 4)}, ["y"], {"s": f32(3, 1)}),
    Case("IsInf", [N("IsInf", ["x"], ["a"]), N("IsInf", ["x"], ["b"], detect_negative=0),
                   N("IsInf", ["x"], ["c"], detect_positive=0)],
         {"x": np.array([1, np.inf, -np.inf, 0], np.float32)}, ["a", "b", "c"]),
    Case("Mod-fmod", [N("Mod", ["a", "b"], ["y"], fmod=1)], {"a": f32(3, 4) * 5, "b": pos(4) * 2}, ["y"]),
    Case("Mod-int", [N("Mod", ["a", "b"], ["y"])],
         {"a": np.array([-7, -3, 0, 3, 7, 8], np.int32), "b": np.array([3, -2, 5, -4, 3, 4], np.int32)}, ["y"]),
    Case("CastLike", [N("CastLike", ["x", "t"], ["y"])], {"x": f32(5) * 4, "t": np.zeros(1, np.int32)}, ["y"],
         opset=19),
    Case("InstanceNormalization", [N("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
         {"x": X4}, ["y"], {"s": f32(3), "b": f32(3)}, tol=1e-4),
    Case("GroupNormalization-21", [N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
         {"x": f32(2, 4, 3, 3)}, ["y"], {"s": f32(4), "b": f32(4)}, opset=21, tol=1e-4),
    Case("GroupNormalization-18", [N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
         {"x": f32(2, 4, 3, 3)}, ["y"], {"s": f32(2), "b": f32(2)}, opset=18, tol=1e-4),
    Case("CumSum", [N("CumSum", ["x", "a"], ["y"])], {"x": f32(3, 4)}, ["y"], {"a": np.int64(1)}),
    Case("CumSum-reverse-exclusive", [N("CumSum", ["x", "a"], ["y"], reverse=1, exclusive=1)], {"x": f32(3, 4)},
         ["y"], {"a": np.int64(0)}),
    Case("CumSum-exclusive-inf", [N("CumSum", ["x", "a"], ["y"], exclusive=1)],
         {"x": np.array([1.0, np.inf, 2.0, -1.0], np.float32)}, ["y"], {"a": np.int64(0)}),
    *[Case(f"CumProd-{r}{e}", [N("CumProd", ["x", "a"], ["y"], reverse=r, exclusive=e)],
           {"x": np.array([[1.5, -2, 0, 3, 0.5], [2, 2, -1, 1, 4]], np.float32)}, ["y"], {"a": np.int64(1)}, opset=26)
      for r in (0, 1) for e in (0, 1)],
    Case("CumProd-int-axis0", [N("CumProd", ["x", "a"], ["y"])], {"x": np.arange(1, 13, dtype=np.int32).reshape(6, 2)},
         ["y"], {"a": np.int64(-2)}, opset=26),
    Case("TopK", [N("TopK", ["x", "k"], ["v", "i"], axis=1)], {"x": f32(3, 6)}, ["v", "i"], {"k": i64(3)}),
    Case("TopK-smallest", [N("TopK", ["x", "k"], ["v", "i"], largest=0)], {"x": f32(3, 6)}, ["v", "i"],
         {"k": i64(2)}),
    Case("DepthToSpace-DCR", [N("DepthToSpace", ["x"], ["y"], blocksize=2)], {"x": f32(1, 8, 2, 3)}, ["y"]),
    Case("DepthToSpace-CRD", [N("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")], {"x": f32(1, 8, 2, 3)},
         ["y"]),
    Case("SpaceToDepth", [N("SpaceToDepth", ["x"], ["y"], blocksize=2)], {"x": f32(1, 2, 4, 6)}, ["y"]),
    *[Case(f"{op}-18", [N(op, ["x", "axes"], ["y"], keepdims=0)], {"x": pos(2, 3, 4)}, ["y"], {"axes": i64(1)},
           opset=18, tol=1e-4)
      for op in ("ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum")],
    Case("ReduceL2-13", [N("ReduceL2", ["x"], ["y"], axes=[0, 2])], {"x": f32(2, 3, 4)}, ["y"], opset=13),
    Case("ArgMin", [N("ArgMin", ["x"], ["y"], axis=-1, keepdims=0)], {"x": f32(3, 5)}, ["y"]),
    Case("IsNaN", [N("IsNaN", ["x"], ["y"])], {"x": np.array([1, np.nan, np.inf], np.float32)}, ["y"]),
    *[Case(op, [N("Greater", ["a", "b"], ["p"]), N("Less", ["a", "c"], ["q"]), N(op, ["p", "q"], ["y"])],
           {"a": f32(3, 4), "b": f32(4), "c": f32(3, 1)}, ["y"]) for op in ("And", "Or")],
    *[Case(op, [N(op, ["a", "b"], ["y"])], {"a": np.array([1, 2, 3], np.float32),
                                            "b": np.array([2, 2, 2], np.float32)}, ["y"])
      for op in ("GreaterOrEqual", "LessOrEqual")],
    Case("Round", [N("Round", ["x"], ["y"])],
         {"x": np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -0.6, 3.7], np.float32)}, ["y"]),
    Case("Trilu-upper", [N("Trilu", ["x", "k"], ["y"])], {"x": f32(2, 4, 5)}, ["y"], {"k": np.int64(1)}),
    Case("Trilu-lower", [N("Trilu", ["x"], ["y"], upper=0)], {"x": f32(4, 4)}, ["y"]),
    Case("OneHot", [N("OneHot", ["i", "d", "v"], ["y"], axis=1)], {"i": np.array([[0, 2], [1, -1]], np.int64)},
         ["y"], {"d": np.int64(3), "v": np.array([0.5, 2.0], np.float32)}),
    Case("GatherElements", [N("GatherElements", ["x", "i"], ["y"], axis=1)],
         {"x": f32(3, 4, 2), "i": np.array([[[0, 3]], [[-1, 1]], [[2, 2]]], np.int64)}, ["y"]),
    # trigonometry, windows, Lp norms and pools, quantization -----------------------------------------------
    *[Case(op, [N(op, ["x"], ["y"])], {"x": x}, ["y"]) for op, x in (
        ("Tan", f32(3, 4)), ("Atan", f32(3, 4) * 4), ("Sinh", f32(3, 4) * 2), ("Cosh", f32(3, 4) * 2),
        ("Asinh", f32(3, 4) * 3), ("Asin", np.linspace(-1, 1, 11, dtype=np.float32)),
        ("Acos", np.linspace(-1, 1, 11, dtype=np.float32)), ("Acosh", pos(3, 4) * 4 + 1),
        ("Atanh", np.linspace(-0.95, 0.95, 13, dtype=np.float32)))],
    Case("Xor", [N("Greater", ["a", "b"], ["p"]), N("Less", ["a", "c"], ["q"]), N("Xor", ["p", "q"], ["y"])],
         {"a": f32(3, 4), "b": f32(4), "c": f32(3, 1)}, ["y"]),
    *[Case(op, [N(op, ["a", "b"], ["y"])], {"a": np.array([[5, -3, 127, 0]], np.int8),
                                            "b": np.array([[3], [-128]], np.int8)}, ["y"], opset=18)
      for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")],
    Case("BitwiseNot", [N("BitwiseNot", ["a"], ["y"])], {"a": np.array([0, 1, 255, 7], np.uint8)}, ["y"], opset=18),
    *[Case(f"BitShift-{d}-uint", [N("BitShift", ["a", "b"], ["y"], direction=d)],
           {"a": np.array([1, 255, 16, 9], np.uint16), "b": np.array([0, 3, 15, 16], np.uint16)}, ["y"], opset=11)
      for d in ("LEFT", "RIGHT")],
    *[Case(f"BitShift-{d}-signed", [N("BitShift", ["a", "b"], ["y"], direction=d)],
           {"a": np.array([-7, 100, -128, 5, -1], np.int8), "b": np.array([1, 2, 9, -1, 3], np.int8)}, ["y"],
           opset=28) for d in ("LEFT", "RIGHT")],
    Case("Shrink", [N("Shrink", ["x"], ["y"], lambd=0.4, bias=0.1)], {"x": f32(3, 4)}, ["y"]),
    *[Case(f"{op}-{'periodic' if periodic else 'symmetric'}", [N(op, ["n"], ["y"], periodic=periodic)], {}, ["y"],
           {"n": np.int64(9)}) for op in ("HannWindow", "HammingWindow", "BlackmanWindow") for periodic in (0, 1)],
    Case("LpPool", [N("LpPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])],
         {"x": X4}, ["y"], opset=18, tol=1e-4),
    Case("LpNormalization-p2", [N("LpNormalization", ["x"], ["y"], axis=0)],
         {"x": np.concatenate([f32(2, 3), np.zeros((2, 1), np.float32)], 1)}, ["y"]),
    Case("LpPool-p1-dilation", [N("LpPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 1], p=1,
                                  dilations=[1, 2])], {"x": X4}, ["y"], opset=18, tol=1e-4),
    Case("LpPool-1d-same", [N("LpPool", ["x"], ["y"], kernel_shape=[3], auto_pad="SAME_UPPER")], {"x": f32(2, 3, 7)},
         ["y"], opset=18, tol=1e-4),
    Case("MeanVarianceNormalization", [N("MeanVarianceNormalization", ["x"], ["y"])], {"x": X4}, ["y"], tol=1e-4),
    Case("MeanVarianceNormalization-axes", [N("MeanVarianceNormalization", ["x"], ["y"], axes=[1])],
         {"x": f32(3, 5)}, ["y"], tol=1e-4),
    Case("QuantizeLinear-per-tensor", [N("QuantizeLinear", ["x", "s", "z"], ["y"])],
         {"x": np.array([-300, -2.5, -1.5, 0, 0.5, 1.5, 2.5, 100, 400], np.float32)}, ["y"],
         {"s": np.float32(2.0), "z": np.uint8(128)}),
    Case("QuantizeLinear-per-axis-int8", [N("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1)],
         {"x": f32(2, 3, 4) * 50}, ["y"], {"s": np.float32([0.5, 1.0, 2.0]), "z": np.int8([-3, 0, 5])}),
    Case("QuantizeLinear-blocked-int16", [N("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1, block_size=2)],
         {"x": f32(2, 5) * 1000}, ["y"], {"s": np.float32([[0.1, 0.2, 0.3], [1.0, 2.0, 4.0]]),
                                          "z": np.int16([[1, 2, 3], [-4, -5, -6]])}, opset=21),
    Case("QuantizeLinear-no-zero-point", [N("QuantizeLinear", ["x", "s"], ["y"])], {"x": f32(6) * 100}, ["y"],
         {"s": np.float32(0.5)}, opset=13),
    Case("DequantizeLinear-per-tensor", [N("DequantizeLinear", ["x", "s", "z"], ["y"])],
         {"x": np.array([0, 3, 128, 255], np.uint8)}, ["y"], {"s": np.float32(0.25), "z": np.uint8(128)}, opset=19),
    Case("DequantizeLinear-per-axis-int32", [N("DequantizeLinear", ["x", "s"], ["y"], axis=0)],
         {"x": np.array([[-1000, 7], [123456, -5]], np.int32)}, ["y"], {"s": np.float32([0.5, 0.125])}, opset=19),
    Case("DequantizeLinear-blocked", [N("DequantizeLinear", ["x", "s", "z"], ["y"], axis=0, block_size=2)],
         {"x": np.arange(-10, 5, dtype=np.int8).reshape(5, 3)}, ["y"],
         {"s": np.float32([[0.5, 1, 2], [3, 4, 5], [6, 7, 8]]), "z": np.int8([[1, 2, 3], [0, 0, 0], [-1, -2, -3]])},
         opset=21),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_reference(case: Case) -> None:
    model = make_model(case.nodes, case.inputs, case.outputs, case.inits, case.opset)
    check_against_reference(model, case.inputs, case.outputs, rtol=case.tol, atol=case.tol)


def test_every_required_op_has_a_case() -> None:
    from popart.onnx import OPS
    required = """Conv ConvTranspose BatchNormalization Relu LeakyRelu Sigmoid Tanh Gelu Erf Softmax LogSoftmax MaxPool
        AveragePool GlobalAveragePool Gemm MatMul Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Reshape Flatten
        Transpose Concat Split Slice Gather Unsqueeze Squeeze Expand Tile Pad Shape Constant ConstantOfShape Range Cast
        ReduceMean ReduceSum ReduceMax ReduceMin Dropout LayerNormalization Where Equal Less Greater Not Clip Resize
        Identity Min Max ArgMax""".split()
    tested = {n.op_type for c in CASES for n in c.nodes}
    assert set(required) <= set(OPS)
    assert set(required) <= tested, sorted(set(required) - tested)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_before_opset_13_coerces_to_2d(op: str) -> None:
    # Before opset 13 the input is flattened to [prod(shape[:axis]), prod(shape[axis:])]. ONNX's
    # reference evaluator applies the opset-13 rule here, so the oracle is NumPy.
    from popart_helpers import run_session
    x = f32(2, 3, 4)
    model = make_model([N(op, ["x"], ["y"], axis=1)], {"x": x}, ["y"], opset=11)
    flat = x.reshape(2, 12).astype(np.float64)
    logp = flat - flat.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    want = (np.exp(logp) if op == "Softmax" else logp).reshape(x.shape)
    np.testing.assert_allclose(run_session(model, {"x": x}, ["y"])[0], want, rtol=1e-5, atol=1e-6)


def test_negative_pads_crop() -> None:
    # ONNX's reference evaluator rejects negative pads (np.pad), so the oracle is NumPy slicing.
    from popart_helpers import run_session
    x = f32(4, 5)
    model = make_model([N("Pad", ["x", "p"], ["y"], mode="edge")], {"x": x}, ["y"], {"p": i64(-1, 2, 2, -2)})
    want = np.pad(x[1:, :3], ((0, 2), (2, 0)), mode="edge")
    np.testing.assert_array_equal(run_session(model, {"x": x}, ["y"])[0], want)


@pytest.mark.parametrize("op,fn,lo,hi", [("Atan", np.arctan, -50, 50), ("Asin", np.arcsin, -1, 1),
                                         ("Acos", np.arccos, -1, 1), ("Sinh", np.sinh, -9, 9),
                                         ("Asinh", np.arcsinh, -3e4, 3e4), ("Acosh", np.arccosh, 1, 3e4),
                                         ("Atanh", np.arctanh, -0.999, 0.999)])
def test_composed_trigonometry_is_accurate_over_its_range(op, fn, lo, hi) -> None:
    # The importer composes these from popxl ops (polynomials near 0 where the closed forms
    # cancel): relative error within a few float32 ulps across the range, small arguments included.
    from popart_helpers import run_session
    x = np.concatenate([np.linspace(lo, hi, 2001), np.geomspace(1e-6, 0.3, 50) * (1 if lo >= 0 else -1),
                        np.geomspace(1e-6, 0.3, 50)]).astype(np.float32)
    x = x[(x >= lo) & (x <= hi)]
    got = run_session(make_model([N(op, ["x"], ["y"])], {"x": x}, ["y"]), {"x": x}, ["y"])[0]
    want = fn(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("nodes,inputs,inits,message", [
    ([N("LpNormalization", ["x"], ["y"], p=3)], {"x": f32(2, 3)}, None, "p must be 1 or 2"),
    ([N("LRN", ["x"], ["y"])], {"x": f32(2, 3)}, None, "required attribute\\(s\\) 'size' of LRN"),
    ([N("LpPool", ["x"], ["y"], kernel_shape=[2, 2])], {"x": f32(2, 3, 4)}, None, "needs a rank-4 input"),
    ([N("QuantizeLinear", ["x", "s"], ["y"], axis=1)], {"x": f32(2, 3)}, {"s": np.float32([1, 2])},
     "per-axis scale/zero point must be 1-D of length 3"),
    ([N("HannWindow", ["n"], ["y"])], {"n": np.int64(4)}, None, "must be known at import"),
    ([N("Atan", ["x"], ["y"])], {"x": np.int32([1, 2])}, None, "needs a floating-point input"),
    ([N("TopK", ["x", "k"], ["y", "i"])], {"x": f32(2, 5)}, {"k": i64(2, 3)}, r"input 1 \(K\) must hold a single value"),
])
def test_bad_nodes_are_named_at_import(nodes, inputs, inits, message) -> None:
    import popart
    from popart_helpers import run_nodes
    with pytest.raises(popart.OnnxImportError, match=message):
        run_nodes(nodes, inputs, inits, opset=21, outputs=["y"])


def _lrn_oracle(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    c = x.shape[1]
    ss = np.zeros_like(x, dtype=np.float64)
    for i in range(c):  # the spec's window: [i - floor((size-1)/2), i + ceil((size-1)/2)], clipped
        ss[:, i] = (x[:, max(0, i - (size - 1) // 2):min(c, i + size // 2 + 1)].astype(np.float64) ** 2).sum(1)
    return x / (bias + alpha / size * ss) ** beta


def _lp_pool_ceil_oracle(x: np.ndarray) -> np.ndarray:
    # kernel (2, 2), strides (2, 2), dilations (1, 2), p = 1, ceil_mode on a (.., 5, 5) input: the
    # last window of each axis reads one row/column of the input (and padding beyond it)
    padded = np.zeros(x.shape[:2] + (6, 7), np.float64)
    padded[:, :, :5, :5] = np.abs(x)
    out = np.zeros(x.shape[:2] + (3, 2))
    for i in range(3):
        for j in range(2):
            out[:, :, i, j] = padded[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 3:2].sum((2, 3))
    return out


@pytest.mark.parametrize("node,x,oracle", [
    # ONNX's reference evaluator disagrees with the spec on these: its LRN window is off by one, its
    # LpNormalization p=1 omits the absolute value, its LpPool ceil-mode windows rescale like PyTorch's
    # avg-pool (count of elements read), and it has no GlobalLpPool. The oracles follow the spec text.
    (N("LRN", ["x"], ["y"], size=3, alpha=0.5, beta=0.6, bias=2.0), X4, lambda x: _lrn_oracle(x, 3, 0.5, 0.6, 2.0)),
    (N("LRN", ["x"], ["y"], size=4), f32(2, 5, 3), lambda x: _lrn_oracle(x, 4, 1e-4, 0.75, 1.0)),
    (N("LpNormalization", ["x"], ["y"], p=1, axis=0), np.concatenate([f32(2, 3), np.zeros((2, 1), np.float32)], 1),
     lambda x: np.where(x == 0, 0, x / np.maximum(np.abs(x).sum(0, keepdims=True), 1e-30))),
    (N("GlobalLpPool", ["x"], ["y"], p=3), X4,
     lambda x: (np.abs(x.astype(np.float64)) ** 3).sum((2, 3), keepdims=True) ** (1 / 3)),
    (N("LpPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], p=1, ceil_mode=1, dilations=[1, 2]), X4,
     _lp_pool_ceil_oracle),
], ids=["LRN", "LRN-even-size", "LpNormalization-p1", "GlobalLpPool-p3", "LpPool-ceil"])
def test_op_matches_spec(node, x, oracle) -> None:
    from popart_helpers import run_session
    got = run_session(make_model([node], {"x": x}, ["y"], opset=18), {"x": x}, ["y"])[0]
    np.testing.assert_allclose(got, oracle(x), rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("node,inputs,inits,op_type,composed", [
    (N("Sigmoid", ["x"], ["y"]), {"x": f32(3, 4)}, {}, "sigmoid", ("exp", "div")),
    (N("InstanceNormalization", ["x", "s", "b"], ["y"]), {"x": X4}, {"s": f32(3), "b": f32(3)}, "group_norm",
     ("mean", "sqrt")),
    (N("Sum", ["a", "b", "c"], ["y"]), {"a": f32(3, 4), "b": f32(4), "c": f32(3, 1)}, {}, "add_n", ("add",)),
    (N("LpNormalization", ["x"], ["y"], p=2, axis=1), {"x": f32(3, 4)}, {}, "l2", ("sqrt", "sum")),
    (N("GlobalLpPool", ["x"], ["y"], p=1), {"x": X4}, {}, "l1", ("abs", "sum")),
], ids=["Sigmoid", "InstanceNormalization", "Sum", "LpNormalization", "GlobalLpPool"])
def test_entries_use_popxl_ops_of_the_same_meaning(node, inputs, inits, op_type, composed) -> None:
    # Where popxl has an op that computes what the ONNX op does, the entry uses it rather than
    # composing it from smaller ones (one kernel, and that op's gradient rule when training).
    from popart_helpers import make_session
    from popxl.analysis import reachable_graphs
    s, _ = make_session(make_model([node], inputs, ["y"], inits), ["y"])
    types = [op.type for g in reachable_graphs(s._ir) for op in g.schedule()]
    assert op_type in types and not set(composed) & set(types), types
