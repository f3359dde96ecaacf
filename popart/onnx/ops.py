"""The ONNX op table: one entry per ONNX op type, each turning one node into popxl ops.

An entry receives a ``Node`` (the node plus helpers to read its attributes and inputs) and returns
one value per output: a popxl Tensor, or a NumPy array when the output is known at import (Shape,
Size). Differences between opsets (attributes that became inputs, changed defaults) are handled
inside the entry. Where popxl has no op for an ONNX feature, the entry composes it from popxl ops.
Nodes whose inputs are all known at import never reach their entry: the importer folds them.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx

import popxl
import popxl.ops as ops
from popxl import dtypes
from popart.errors import OnnxImportError
from popart.onnx.importer import GraphImporter, device_array, device_dtype, op_key

__all__ = ["OPS", "Node", "Entry"]

Value = Union[np.ndarray, popxl.Tensor]


class Node:
    """One ONNX node being lowered, with typed access to its attributes and inputs."""

    def __init__(self, importer: GraphImporter, proto: onnx.NodeProto, index: int) -> None:
        self.imp = importer
        self.proto = proto
        self.index = index
        self.op_type = proto.op_type
        self.opset = importer.opset
        self.entry: Entry = importer._ops[op_key(proto)]
        self._attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}

    def describe(self) -> str:
        return f"node {self.proto.name or f'<node {self.index}>'!r} ({self.op_type}, opset {self.opset})"

    def fail(self, message: str) -> OnnxImportError:
        return OnnxImportError(f"{self.describe()}: {message}")

    # attributes -----------------------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        v = self._attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    def ints(self, name: str, default: Optional[Sequence[int]] = None) -> Optional[List[int]]:
        v = self._attrs.get(name)
        return [int(i) for i in v] if v is not None else (list(default) if default is not None else None)

    # inputs ---------------------------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.proto.input)

    @property
    def n_outputs(self) -> int:
        return len(self.proto.output)

    def has(self, i: int) -> bool:
        return i < len(self.proto.input) and self.proto.input[i] != ""

    def x(self, i: int) -> popxl.Tensor:
        """Input ``i`` as a popxl Tensor."""
        if not self.has(i):
            raise self.fail(f"input {i} is required")
        return self.imp.tensor(self.proto.input[i])

    def xs(self) -> List[popxl.Tensor]:
        return [self.x(i) for i in range(self.n_inputs) if self.has(i)]

    def static(self, i: int, what: str) -> np.ndarray:
        """Input ``i`` as a NumPy array; it must be known at import."""
        if not self.has(i):
            raise self.fail(f"input {i} ({what}) is required")
        v = self.imp.static(self.proto.input[i])
        if v is None:
            raise self.fail(f"input {i} ({what}, tensor {self.proto.input[i]!r}) must be known at import "
                            f"(a constant, an initializer, or computed from shapes), but it is computed on the device")
        return v

    def optional_static(self, i: int, what: str) -> Optional[np.ndarray]:
        return self.static(i, what) if self.has(i) else None

    def shape(self, i: int) -> Tuple[int, ...]:
        """The shape of input ``i`` (known at import in every case)."""
        v = self.imp.static(self.proto.input[i])
        return tuple(v.shape) if v is not None else tuple(self.x(i).shape)

    def scalar(self, value: float, like: popxl.Tensor) -> popxl.Tensor:
        """A scalar constant of ``like``'s dtype."""
        return popxl.constant(np.asarray(value, dtype=like.dtype.as_numpy()))

    def constant(self, value: np.ndarray) -> popxl.Tensor:
        return popxl.constant(device_array(np.asarray(value)))


class Entry:
    """How one ONNX op type is lowered. ``foldable``: a node whose inputs are all known at import
    is computed at import instead (every op here is deterministic, so all are)."""

    def __init__(self, fn: Callable[[Node], Sequence[Optional[Value]]], foldable: bool = True) -> None:
        self.fn = fn
        self.foldable = foldable

    def __call__(self, n: Node) -> Sequence[Optional[Value]]:
        return self.fn(n)


OPS: Dict[str, Entry] = {}


def onnx_op(*op_types: str) -> Callable:
    """Register the decorated function as the entry of each of ``op_types``."""
    def deco(fn: Callable[[Node], Sequence[Optional[Value]]]) -> Callable:
        for t in op_types:
            if t in OPS:
                raise RuntimeError(f"ONNX op {t} registered twice")
            OPS[t] = Entry(fn)
        return fn
    return deco


def _axis(axis: int, rank: int, n: Node, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise n.fail(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _popxl_dtype(np_dtype: np.dtype) -> dtypes.dtype:
    return dtypes.from_numpy(device_dtype(np_dtype))


# elementwise ------------------------------------------------------------------------------------------
def _sigmoid(x: popxl.Tensor) -> popxl.Tensor:
    # 1 / (1 + exp(-x)): exact in relative terms for large negative x, where 0.5 * tanh(x / 2) + 0.5 is not.
    one = popxl.constant(np.ones((), x.dtype.as_numpy()))
    return ops.div(one, ops.add(one, ops.exp(ops.negate(x))))


# Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, below float32 resolution of erf near 1.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: popxl.Tensor) -> popxl.Tensor:
    dt = x.dtype.as_numpy()

    def c(v: float) -> popxl.Tensor:
        return popxl.constant(np.asarray(v, dt))

    ax = ops.abs(x)
    t = ops.div(c(1.0), ops.add(c(1.0), ops.mul(c(_ERF_P), ax)))
    poly = c(_ERF_A[-1])
    for a in reversed(_ERF_A[:-1]):
        poly = ops.add(ops.mul(poly, t), c(a))
    poly = ops.mul(poly, t)
    y = ops.sub(c(1.0), ops.mul(poly, ops.exp(ops.negate(ops.mul(x, x)))))
    return ops.mul(ops.sign(x), y)


def _reciprocal(x: popxl.Tensor) -> popxl.Tensor:
    return ops.div(popxl.constant(np.ones((), x.dtype.as_numpy())), x)


_UNARY: Dict[str, Callable[[popxl.Tensor], popxl.Tensor]] = {
    "Relu": ops.relu, "Tanh": ops.tanh, "Sqrt": ops.sqrt, "Exp": ops.exp, "Log": ops.log, "Neg": ops.negate,
    "Abs": ops.abs, "Sin": ops.sin, "Cos": ops.cos, "Ceil": ops.ceil, "Floor": ops.floor, "Sign": ops.sign,
    "Not": ops.logical_not, "IsNaN": ops.isnan, "Sigmoid": _sigmoid, "Erf": _erf, "Reciprocal": _reciprocal,
}


@onnx_op(*_UNARY)
def _unary(n: Node) -> List[Value]:
    return [_UNARY[n.op_type](n.x(0))]


@onnx_op("Identity")
def _identity(n: Node) -> List[Value]:
    return [n.x(0)]


@onnx_op("LeakyRelu")
def _leaky_relu(n: Node) -> List[Value]:
    x = n.x(0)
    alpha = float(n.attr("alpha", 0.01))
    zero = n.scalar(0.0, x)
    return [ops.where(ops.greater(x, zero), x, ops.mul(x, n.scalar(alpha, x)))]


@onnx_op("Gelu")
def _gelu(n: Node) -> List[Value]:
    approx = n.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise n.fail(f"approximate must be 'none' or 'tanh', got {approx!r}")
    return [ops.geluerf(n.x(0)) if approx == "none" else ops.gelu(n.x(0))]


def _softplus(x: popxl.Tensor) -> popxl.Tensor:
    # relu(x) + log(1 + exp(-|x|)): no overflow for large |x|.
    one = popxl.constant(np.ones((), x.dtype.as_numpy()))
    return ops.add(ops.relu(x), ops.log(ops.add(one, ops.exp(ops.negate(ops.abs(x))))))


def _where_positive(x: popxl.Tensor, negative: popxl.Tensor, threshold: float = 0.0) -> popxl.Tensor:
    """x where x > threshold, else ``negative`` (the shared shape of the ReLU-like activations)."""
    return ops.where(ops.greater(x, popxl.constant(np.asarray(threshold, x.dtype.as_numpy()))), x, negative)


def _activation(n: Node, x: popxl.Tensor) -> popxl.Tensor:
    """The ONNX activations with attributes, composed from popxl elementwise ops."""
    def c(v: float) -> popxl.Tensor:
        return n.scalar(v, x)

    t = n.op_type
    if t == "Softplus":
        return _softplus(x)
    if t == "Softsign":
        return ops.div(x, ops.add(c(1.0), ops.abs(x)))
    if t == "Mish":
        return ops.mul(x, ops.tanh(_softplus(x)))
    if t in ("HardSigmoid", "HardSwish"):
        alpha, beta = (float(n.attr("alpha", 0.2)), float(n.attr("beta", 0.5))) if t == "HardSigmoid" else (1 / 6, 0.5)
        h = ops.clip(ops.add(ops.mul(x, c(alpha)), c(beta)), 0.0, 1.0)
        return h if t == "HardSigmoid" else ops.mul(x, h)
    if t == "Elu":
        alpha = float(n.attr("alpha", 1.0))
        return _where_positive(x, ops.mul(c(alpha), ops.sub(ops.exp(x), c(1.0))))
    if t == "Selu":
        alpha = float(n.attr("alpha", 1.67326319217681884765625))
        gamma = float(n.attr("gamma", 1.05070102214813232421875))
        return ops.mul(c(gamma), _where_positive(x, ops.mul(c(alpha), ops.sub(ops.exp(x), c(1.0)))))
    if t == "Celu":
        alpha = float(n.attr("alpha", 1.0))
        return _where_positive(x, ops.mul(c(alpha), ops.sub(ops.exp(ops.div(x, c(alpha))), c(1.0))))
    if t == "ThresholdedRelu":
        alpha = float(n.attr("alpha", 1.0))
        return _where_positive(x, c(0.0), alpha)
    if t == "PRelu":
        return _where_positive(x, ops.mul(x, n.x(1)))
    raise n.fail("not an activation")


@onnx_op("Softplus", "Softsign", "Mish", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "ThresholdedRelu",
         "PRelu")
def _activations(n: Node) -> List[Value]:
    return [_activation(n, n.x(0))]


@onnx_op("IsInf")
def _isinf(n: Node) -> List[Value]:
    x = n.x(0)
    y = ops.isinf(x)
    zero = n.scalar(0.0, x)
    if not n.attr("detect_positive", 1):
        y = ops.logical_and(y, _less(x, zero))
    if not n.attr("detect_negative", 1):
        y = ops.logical_and(y, ops.greater(x, zero))
    return [y]


@onnx_op("Mod")
def _mod(n: Node) -> List[Value]:
    a, b = n.x(0), n.x(1)
    r = ops.fmod(a, b)
    if n.attr("fmod", 0):
        return [r]
    # Python-style modulo: the result takes the divisor's sign.
    zero = n.scalar(0, r)
    fix = ops.logical_and(ops.logical_not(ops.equal(r, zero)),
                          ops.logical_not(ops.equal(_less(r, zero), _less(b, zero))))
    return [ops.where(fix, ops.add(r, b), r)]


def _less(a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.greater(b, a)


def _pow(a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    # ONNX lets the exponent have its own type; popxl wants one dtype.
    return ops.pow(a, b if b.dtype == a.dtype else ops.cast(b, a.dtype))


def _div(a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    if a.dtype.is_floating_point:
        return ops.div(a, b)
    # ONNX integer division truncates toward zero; popxl's floors. a - fmod(a, b) is a multiple of
    # b with the truncated quotient, so dividing it is exact whichever way the division rounds.
    return ops.div(ops.sub(a, ops.fmod(a, b)), b)


_BINARY: Dict[str, Callable[[popxl.Tensor, popxl.Tensor], popxl.Tensor]] = {
    "Add": ops.add, "Sub": ops.sub, "Mul": ops.mul, "Div": _div, "Pow": _pow, "Equal": ops.equal,
    "Greater": ops.greater, "Less": _less, "And": ops.logical_and, "Or": ops.logical_or,
    "GreaterOrEqual": lambda a, b: ops.logical_not(_less(a, b)),
    "LessOrEqual": lambda a, b: ops.logical_not(ops.greater(a, b)),
}


@onnx_op(*_BINARY)
def _binary(n: Node) -> List[Value]:
    return [_BINARY[n.op_type](n.x(0), n.x(1))]


def _minimum(a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    if a.dtype.is_floating_point or a.dtype.is_signed:
        # -max(-a, -b): keeps maximum's NaN propagation.
        return ops.negate(ops.maximum(ops.negate(a), ops.negate(b)))
    return ops.where(ops.greater(a, b), b, a)  # unsigned: no negation, and no NaN to propagate


@onnx_op("Max", "Min", "Sum", "Mean")
def _variadic(n: Node) -> List[Value]:
    xs = n.xs()
    if n.op_type == "Max":
        return [ops.maximum(*xs) if len(xs) > 1 else xs[0]]
    fold = _minimum if n.op_type == "Min" else ops.add
    y = xs[0]
    for x in xs[1:]:
        y = fold(y, x)
    if n.op_type == "Mean" and len(xs) > 1:
        y = ops.div(y, n.scalar(len(xs), y))
    return [y]


@onnx_op("Where")
def _where(n: Node) -> List[Value]:
    return [ops.where(n.x(0), n.x(1), n.x(2))]


@onnx_op("Clip")
def _clip(n: Node) -> List[Value]:
    x = n.x(0)
    if n.opset < 11:
        lo, hi = n.attr("min"), n.attr("max")
        bounds = [None if v is None else np.asarray(v) for v in (lo, hi)]
    else:
        bounds = [n.imp.static(n.proto.input[i]) if n.has(i) else None for i in (1, 2)]
        dynamic = [n.has(i) and bounds[i - 1] is None for i in (1, 2)]
        if any(dynamic):  # bounds computed on the device: compose from max/min
            y = x
            if n.has(1):
                y = ops.maximum(y, n.x(1))
            if n.has(2):
                y = _minimum(y, n.x(2))
            return [y]
    lo = -math.inf if bounds[0] is None else float(bounds[0])
    hi = math.inf if bounds[1] is None else float(bounds[1])
    return [ops.clip(x, lo, hi)]


# popxl's float8 formats are ONNX's FLOAT8E4M3FNUZ / FLOAT8E5M2FNUZ; their largest magnitudes.
_FP8_MAX = {dtypes.float8_143: 240.0, dtypes.float8_152: 57344.0}


def _cast_to(n: Node, x: popxl.Tensor, to: dtypes.dtype) -> popxl.Tensor:
    if x.dtype == to:
        return x
    zero_scale = popxl.constant(np.asarray(0, np.int32))
    if to in _FP8_MAX:
        # float8 is reached only through the pow2scale cast (scale 2**0), from float16/float32.
        if x.dtype not in (dtypes.float16, dtypes.float32):
            x = ops.cast(x, dtypes.float32)
        if n.attr("saturate", 1):
            # ONNX saturation: values beyond the range, infinities included, clamp to it (NaN
            # stays NaN); without it they become NaN, the FNUZ formats having no infinity.
            m = _FP8_MAX[to]
            x = ops.clip(x, -m, m)
        return ops.pow2scale_cast_to_fp8(x, zero_scale, to)
    if x.dtype in _FP8_MAX:
        mid = to if to in (dtypes.float16, dtypes.float32) else dtypes.float32
        y = ops.pow2scale_cast_from_fp8(x, zero_scale, mid)
        return y if mid == to else ops.cast(y, to)
    return ops.cast(x, to)


@onnx_op("Cast")
def _cast(n: Node) -> List[Value]:
    return [_cast_to(n, n.x(0), _popxl_dtype(onnx.helper.tensor_dtype_to_np_dtype(n.attr("to"))))]


@onnx_op("CastLike")
def _cast_like(n: Node) -> List[Value]:
    return [_cast_to(n, n.x(0), n.x(1).dtype)]


# matmul / gemm ----------------------------------------------------------------------------------------
@onnx_op("MatMul")
def _matmul(n: Node) -> List[Value]:
    return [ops.matmul(n.x(0), n.x(1))]


@onnx_op("Gemm")
def _gemm(n: Node) -> List[Value]:
    a, b = n.x(0), n.x(1)
    if n.attr("transA", 0):
        a = ops.transpose(a)
    if n.attr("transB", 0):
        b = ops.transpose(b)
    y = ops.matmul(a, b)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    if alpha != 1.0:
        y = ops.mul(y, n.scalar(alpha, y))
    if n.has(2) and beta != 0.0:
        c = n.x(2)
        if beta != 1.0:
            c = ops.mul(c, n.scalar(beta, c))
        y = ops.add(y, c)
    return [y]


# softmax ----------------------------------------------------------------------------------------------
def _log_softmax(x: popxl.Tensor, axis: int) -> popxl.Tensor:
    return ops.sub(x, ops.logsumexp(x, axis, keepdims=True))


@onnx_op("Softmax", "LogSoftmax")
def _softmax(n: Node) -> List[Value]:
    x = n.x(0)
    fn = ops.softmax if n.op_type == "Softmax" else _log_softmax
    if n.opset >= 13:
        return [fn(x, _axis(int(n.attr("axis", -1)), x.rank, n))]
    # Before opset 13 the input is seen as 2-D: [prod(shape[:axis]), prod(shape[axis:])].
    axis = _axis(int(n.attr("axis", 1)), x.rank, n)
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    y = fn(ops.reshape(x, (lead, -1 if x.nelms else 0)), 1)
    return [ops.reshape(y, x.shape)]


# convolution and pooling ------------------------------------------------------------------------------
_AUTO_PAD = {"NOTSET": "not_set", "SAME_UPPER": "same_upper", "SAME_LOWER": "same_lower", "VALID": "valid"}


def _window_attrs(n: Node, rank: int) -> Dict[str, Any]:
    auto_pad = n.attr("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PAD:
        raise n.fail(f"unknown auto_pad {auto_pad!r}")
    return {"stride": tuple(n.ints("strides", [1] * rank)),
            "dilation": tuple(n.ints("dilations", [1] * rank)),
            "padding": tuple(n.ints("pads", [0] * (2 * rank))),
            "pad_type": _AUTO_PAD[auto_pad]}


def _add_channel_bias(y: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.add(y, ops.reshape(b, (b.shape[0],) + (1,) * (y.rank - 2)))


@onnx_op("Conv", "ConvTranspose")
def _conv(n: Node) -> List[Value]:
    x, w = n.x(0), n.x(1)
    rank = w.rank - 2
    kw = _window_attrs(n, rank)
    groups = int(n.attr("group", 1))
    if n.op_type == "Conv":
        y = ops.conv(x, w, groups=groups, **kw)
    else:
        y = ops.conv_transpose(x, w, groups=groups, output_padding=tuple(n.ints("output_padding", [])),
                               output_shape=tuple(n.ints("output_shape", [])), **kw)
    return [_add_channel_bias(y, n.x(2)) if n.has(2) else y]


def _pad_explicit(x: popxl.Tensor, pads: Sequence[int], value: float, n: Node) -> popxl.Tensor:
    """Constant-pad the spatial axes of an (N, C, ...) tensor by ONNX-ordered ``pads``."""
    r = x.rank - 2
    full = [0, 0] + list(pads[:r]) + [0, 0] + list(pads[r:])
    return _pad_tensor(x, full, "constant", value, n)


@onnx_op("MaxPool", "AveragePool")
def _pool(n: Node) -> List[Value]:
    x = n.x(0)
    kernel = n.ints("kernel_shape")
    if kernel is None:
        raise n.fail("kernel_shape is required")
    rank = len(kernel)
    kw = _window_attrs(n, rank)
    ceil_mode = bool(n.attr("ceil_mode", 0))
    kw["auto_pad"] = kw.pop("pad_type")  # the pooling ops name it after the ONNX attribute
    if n.op_type == "MaxPool":
        if n.attr("storage_order", 0):
            raise n.fail("storage_order=1 only affects the Indices output, which is not supported")
        if not x.dtype.is_floating_point and x.dtype.itemsize <= 2:
            # popxl pools floats only; 8- and 16-bit integers are exact in float32, and the maximum
            # is one of the inputs, so the round trip is exact.
            y = ops.max_pool(ops.cast(x, dtypes.float32), tuple(kernel), ceil_mode=ceil_mode, **kw)
            return [ops.cast(y, x.dtype)]
        return [ops.max_pool(x, tuple(kernel), ceil_mode=ceil_mode, **kw)]
    if n.attr("count_include_pad", 0) and any(kw["padding"]):
        if kw["auto_pad"] != "not_set":
            raise n.fail("count_include_pad=1 is supported with explicit pads only, not with auto_pad")
        # Padding values take part in the average: pad with zeros first, then pool without pads.
        pads = kw["padding"]
        spatial = x.shape[2:]
        x = _pad_explicit(x, pads, 0.0, n)
        kw["padding"] = (0,) * (2 * rank)
        y = ops.average_pool(x, tuple(kernel), ceil_mode=ceil_mode, **kw)
        if ceil_mode:
            # With the padding now part of the input, a last window that starts in the end padding
            # is no longer recognised as such: drop it, as pooling the unpadded input would.
            want = [_ceil_pool_len(spatial[i], kernel[i], kw["stride"][i], kw["dilation"][i], pads[i],
                                   pads[rank + i]) for i in range(rank)]
            if list(y.shape[2:]) != want:
                y = ops.slice(y, start=[0] * rank, stop=want, axis=list(range(2, 2 + rank)))
        return [y]
    return [ops.average_pool(x, tuple(kernel), ceil_mode=ceil_mode, **kw)]


def _ceil_pool_len(size: int, k: int, s: int, d: int, begin: int, end: int) -> int:
    """Output length of a ceil-mode pooling window along one axis: windows may run past the end
    padding, but none may start in it."""
    span = size + begin + end - ((k - 1) * d + 1)
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= size + begin else out


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(n: Node) -> List[Value]:
    x = n.x(0)
    axes = list(range(2, x.rank))
    fn = ops.mean if n.op_type == "GlobalAveragePool" else ops.max
    return [fn(x, axes, keepdims=True)]


# normalisation ----------------------------------------------------------------------------------------
@onnx_op("BatchNormalization")
def _batch_norm(n: Node) -> List[Value]:
    training = bool(n.attr("training_mode", 0)) or n.imp.training
    if not training:
        y = ops.batch_norm_inference(n.x(0), n.x(1), n.x(2), n.x(3), n.x(4), epsilon=float(n.attr("epsilon", 1e-5)))
        return [y]
    if not n.imp.training:
        raise n.fail("training_mode=1 needs a TrainingSession (an inference session cannot update the running "
                     "statistics)")
    return _batch_norm_training(n)


def _batch_norm_training(n: Node) -> List[Value]:
    """Normalise with the batch's statistics (biased variance) and compute the new running
    statistics, momentum * running + (1 - momentum) * batch, as ONNX's training mode defines them;
    the importer records them so the session writes them back into the statistics' variables."""
    x = n.x(0)
    axes = [0] + list(range(2, x.rank))
    channel = (1, x.shape[1]) + (1,) * (x.rank - 2)
    mean = ops.mean(x, axes, keepdims=True)
    d = ops.sub(x, mean)
    var = ops.mean(ops.mul(d, d), axes, keepdims=True)
    y = ops.mul(d, _reciprocal(ops.sqrt(ops.add(var, n.scalar(float(n.attr("epsilon", 1e-5)), var)))))
    y = ops.add(ops.mul(y, ops.reshape(n.x(1), channel)), ops.reshape(n.x(2), channel))
    m = float(n.attr("momentum", 0.9))
    stats = []
    for k, batch in ((3, mean), (4, var)):
        running = n.x(k)
        new = ops.add(ops.mul(running, n.scalar(m, running)),
                      ops.mul(ops.detach(ops.reshape(batch, running.shape)), n.scalar(1.0 - m, running)))
        n.imp.stat_updates.append((n.proto.input[k], new))
        stats.append(new)
    return [y] + stats


def _standardise(x: popxl.Tensor, axes: Sequence[int], eps: float,
                 n: Node) -> Tuple[popxl.Tensor, popxl.Tensor, popxl.Tensor]:
    """(x - mean) / sqrt(var + eps) over ``axes`` (biased variance), with the mean and 1/std."""
    mean = ops.mean(x, list(axes), keepdims=True)
    d = ops.sub(x, mean)
    var = ops.mean(ops.mul(d, d), list(axes), keepdims=True)
    inv_std = _reciprocal(ops.sqrt(ops.add(var, n.scalar(eps, var))))
    return ops.mul(d, inv_std), mean, inv_std


@onnx_op("LayerNormalization")
def _layer_norm(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", -1)), x.rank, n)
    y, mean, inv_std = _standardise(x, range(axis, x.rank), float(n.attr("epsilon", 1e-5)), n)
    y = ops.mul(y, n.x(1))
    if n.has(2):
        y = ops.add(y, n.x(2))
    return [y, mean, inv_std]


def _per_channel(p: popxl.Tensor, rank: int) -> popxl.Tensor:
    return ops.reshape(p, (p.shape[0],) + (1,) * (rank - 2))


@onnx_op("InstanceNormalization")
def _instance_norm(n: Node) -> List[Value]:
    x = n.x(0)
    y, _, _ = _standardise(x, range(2, x.rank), float(n.attr("epsilon", 1e-5)), n)
    return [ops.add(ops.mul(y, _per_channel(n.x(1), x.rank)), _per_channel(n.x(2), x.rank))]


@onnx_op("GroupNormalization")
def _group_norm(n: Node) -> List[Value]:
    x = n.x(0)
    groups = int(n.attr("num_groups"))
    c = x.shape[1]
    if c % groups:
        raise n.fail(f"{c} channels do not split into {groups} groups")
    scale, bias = n.x(1), n.x(2)
    if n.opset < 21 and scale.shape[0] == groups and groups != c:
        # Opsets 18-20 scale and shift per group: give each channel its group's value.
        per = np.repeat(np.arange(groups), c // groups)
        scale, bias = _repeat_axis(scale, 0, per), _repeat_axis(bias, 0, per)
    return [ops.group_norm(x, scale, bias, groups, float(n.attr("epsilon", 1e-5)))]


@onnx_op("Dropout")
def _dropout(n: Node) -> List[Value]:
    training = n.optional_static(2, "training_mode") if n.opset >= 12 else None
    x = n.x(0)
    if n.imp.training and (training is None or bool(training)):
        # A TrainingSession drops (as PopART does), with a fresh seed per call of the forward graph.
        ratio = n.optional_static(1, "ratio") if n.opset >= 12 else None
        ratio = float(np.asarray(ratio).reshape(-1)[0]) if ratio is not None else float(n.attr("ratio", 0.5))
        if ratio == 0.0:
            return [x, np.ones(x.shape, np.bool_)]
        return [ops.dropout(x, n.imp.random.split(), ratio), None]
    if training is not None and bool(training):
        raise n.fail("training_mode=true is not supported by an inference session")
    # Inference: the identity, and a mask of all ones.
    return [x, np.ones(x.shape, np.bool_)]


# reductions -------------------------------------------------------------------------------------------
_REDUCE: Dict[str, Callable[..., popxl.Tensor]] = {
    "ReduceMean": ops.mean, "ReduceSum": ops.sum, "ReduceMax": ops.max, "ReduceMin": ops.min,
    "ReduceProd": ops.prod, "ReduceL1": ops.l1, "ReduceL2": ops.l2, "ReduceLogSumExp": ops.logsumexp,
    "ReduceSumSquare": ops.sumsquare, "ReduceLogSum": ops.logsum,
}


@onnx_op(*_REDUCE)
def _reduce(n: Node) -> List[Value]:
    x = n.x(0)
    # Axes moved from an attribute to an input: ReduceSum at opset 13, the others at opset 18.
    axes_as_input = n.opset >= (13 if n.op_type == "ReduceSum" else 18)
    if axes_as_input:
        axes = n.optional_static(1, "axes")
        axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    else:
        axes = n.ints("axes")
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.rank))
    axes = sorted({_axis(a, x.rank, n, "axes") for a in axes})
    keep = bool(n.attr("keepdims", 1))
    if x.dtype == dtypes.bool and n.op_type in ("ReduceMax", "ReduceMin"):
        # Max of bools is "any", min is "all" (not any of the negations): counted as int32, which
        # also gives the right identity (False for max, True for min) over an empty set.
        probe = x if n.op_type == "ReduceMax" else ops.logical_not(x)
        count = ops.sum(ops.cast(probe, dtypes.int32), axes, keepdims=keep)
        hit = ops.greater(count, popxl.constant(np.asarray(0, np.int32)))
        return [hit if n.op_type == "ReduceMax" else ops.logical_not(hit)]
    return [_REDUCE[n.op_type](x, axes, keepdims=keep)]


@onnx_op("ArgMax", "ArgMin")
def _argmax(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n)
    keep = bool(n.attr("keepdims", 1))
    fn = ops.argmax if n.op_type == "ArgMax" else ops.argmin
    if not n.attr("select_last_index", 0):
        return [fn(x, axis, keep)]
    # The last extreme index: search the reversed axis, then map the index back.
    d = x.shape[axis]
    idx = fn(ops.gather(x, np.arange(d - 1, -1, -1).tolist(), axis), axis, keep)
    return [ops.sub(popxl.constant(np.asarray(d - 1, idx.dtype.as_numpy())), idx)]


# shapes and data movement -----------------------------------------------------------------------------
@onnx_op("Shape")
def _shape(n: Node) -> List[Value]:
    s = np.asarray(n.shape(0), np.int64)
    if n.opset >= 15:
        start, end = n.attr("start", 0), n.attr("end")
        s = s[slice(start, end)]
    return [s]


@onnx_op("Size")
def _size(n: Node) -> List[Value]:
    return [np.asarray(int(np.prod(n.shape(0), dtype=np.int64)), np.int64)]


def _import_time_only(n: Node) -> List[Value]:
    # Reached only when an input is computed on the device: the importer folds the static case.
    raise n.fail("its inputs must be known at import (constants, initializers or shapes)")


for _t in ("Constant", "ConstantOfShape", "Range"):
    OPS[_t] = Entry(_import_time_only)


@onnx_op("Reshape")
def _reshape(n: Node) -> List[Value]:
    x = n.x(0)
    shape = [int(d) for d in n.static(1, "shape").reshape(-1)]
    allowzero = n.opset >= 14 and n.attr("allowzero", 0)
    if not allowzero:
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if shape.count(-1) > 1:
        raise n.fail(f"shape {shape} has more than one -1")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or x.nelms % known:
            raise n.fail(f"cannot reshape {x.shape} to {shape}")
        shape[shape.index(-1)] = x.nelms // known
    return [ops.reshape(x, tuple(shape))]


@onnx_op("Flatten")
def _flatten(n: Node) -> List[Value]:
    x = n.x(0)
    axis = int(n.attr("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise n.fail(f"axis {axis} is out of range for rank {x.rank}")
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [ops.reshape(x, (lead, int(np.prod(x.shape[axis:], dtype=np.int64))))]


def _unsqueezed_shape(shape: Sequence[int], axes: Sequence[int], n: Node) -> Tuple[int, ...]:
    out_rank = len(shape) + len(axes)
    axes = sorted(_axis(a, out_rank, n, "axes") for a in axes)
    if len(set(axes)) != len(axes):
        raise n.fail(f"axes {axes} repeat an axis")
    dims = iter(shape)
    return tuple(1 if i in axes else next(dims) for i in range(out_rank))


def _axes_arg(n: Node, since_opset: int) -> Optional[List[int]]:
    """Axes given as an attribute before ``since_opset`` and as input 1 from then on."""
    if n.opset >= since_opset:
        a = n.optional_static(1, "axes")
        return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]
    return n.ints("axes")


@onnx_op("Unsqueeze")
def _unsqueeze(n: Node) -> List[Value]:
    x = n.x(0)
    axes = _axes_arg(n, 13)
    if axes is None:
        raise n.fail("axes are required")
    return [ops.reshape(x, _unsqueezed_shape(x.shape, axes, n))]


@onnx_op("Squeeze")
def _squeeze(n: Node) -> List[Value]:
    x = n.x(0)
    axes = _axes_arg(n, 13)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {_axis(a, x.rank, n, "axes") for a in axes}
    bad = [a for a in axes if x.shape[a] != 1]
    if bad:
        raise n.fail(f"cannot squeeze axes {bad} of shape {x.shape}: their length is not 1")
    return [ops.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@onnx_op("Transpose")
def _transpose(n: Node) -> List[Value]:
    x = n.x(0)
    perm = n.ints("perm", list(range(x.rank))[::-1])
    return [ops.transpose(x, tuple(perm))]


@onnx_op("Concat")
def _concat(n: Node) -> List[Value]:
    xs = n.xs()
    axis = _axis(int(n.attr("axis")), xs[0].rank, n)
    xs = [x for x in xs if x.shape[axis] != 0] or xs[:1]
    return [ops.concat(xs, axis) if len(xs) > 1 else xs[0]]


@onnx_op("Split")
def _split(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n)
    d = x.shape[axis]
    if n.opset >= 13:
        split = n.optional_static(1, "split")
        split = None if split is None else [int(v) for v in split.reshape(-1)]
    else:
        split = n.ints("split")
    if split is None:
        parts = int(n.attr("num_outputs", n.n_outputs))
        if n.opset >= 18 and n.attr("num_outputs") is not None:
            chunk = -(-d // parts)  # ceil: the last part may be smaller
            split = [min(chunk, d - i * chunk) for i in range(parts)]
        else:
            if d % parts:
                raise n.fail(f"axis {axis} of length {d} does not split into {parts} equal outputs")
            split = [d // parts] * parts
    return ops.split(x, split, axis)


@onnx_op("Slice")
def _slice(n: Node) -> List[Value]:
    x = n.x(0)
    starts = [int(v) for v in n.static(1, "starts").reshape(-1)]
    ends = [int(v) for v in n.static(2, "ends").reshape(-1)]
    axes = n.optional_static(3, "axes")
    axes = list(range(len(starts))) if axes is None else [_axis(int(a), x.rank, n, "axes") for a in axes.reshape(-1)]
    steps = n.optional_static(4, "steps")
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps.reshape(-1)]
    if 0 in steps:
        raise n.fail("steps must not be 0")
    # Clamp the int64 "to the end" sentinels into the int range popxl takes.
    big = 2 ** 31 - 1
    starts = [max(min(s, big), -big) for s in starts]
    ends = [max(min(e, big), -big - 1) for e in ends]
    y = ops.slice(x, start=starts, stop=ends, step=[1 if s > 0 else -1 for s in steps], axis=axes)
    if any(abs(s) > 1 for s in steps):  # popxl slices with unit steps; take every k-th element after
        strides = [1] * x.rank
        for a, s in zip(axes, steps):
            strides[a] = abs(s)
        y = ops.subsample(y, strides)
    return [y]


@onnx_op("Gather")
def _gather(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n)
    idx = n.imp.static(n.proto.input[1])
    if idx is not None:
        d = x.shape[axis]
        idx = np.asarray(idx)
        if idx.size and (idx.min() < -d or idx.max() >= d):
            raise n.fail(f"indices out of range [-{d}, {d}) for axis {axis} of shape {x.shape}")
        idx_t = popxl.constant(np.where(idx < 0, idx + d, idx).astype(np.int32))
    else:
        idx_t = n.x(1)  # popxl's gather also counts negative indices from the end
    return [ops.gather(x, idx_t, axis)]


def _repeat_axis(x: popxl.Tensor, axis: int, index: np.ndarray) -> popxl.Tensor:
    """Take positions ``index`` of ``axis`` (used to broadcast, tile and pad without new popxl ops)."""
    return ops.gather(x, popxl.constant(index.astype(np.int32)), axis)


@onnx_op("Expand")
def _expand(n: Node) -> List[Value]:
    x = n.x(0)
    shape = tuple(int(d) for d in n.static(1, "shape").reshape(-1))
    try:
        out = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        raise n.fail(f"cannot broadcast {x.shape} to {shape}") from None
    y = ops.reshape(x, (1,) * (len(out) - x.rank) + x.shape) if len(out) > x.rank else x
    for a, (have, want) in enumerate(zip(y.shape, out)):
        if have != want:
            y = _repeat_axis(y, a, np.zeros(want, np.int64))
    return [y]


@onnx_op("Tile")
def _tile(n: Node) -> List[Value]:
    x = n.x(0)
    repeats = [int(r) for r in n.static(1, "repeats").reshape(-1)]
    if len(repeats) != x.rank or any(r < 0 for r in repeats):
        raise n.fail(f"repeats {repeats} must be {x.rank} non-negative ints")
    y = x
    for a, r in enumerate(repeats):
        if r != 1:
            y = _repeat_axis(y, a, np.tile(np.arange(x.shape[a]), r))
    return [y]


def _pad_index(d: int, before: int, after: int, mode: str) -> np.ndarray:
    """Source positions of a padded axis; out-of-range positions (constant mode) are masked later."""
    i = np.arange(-before, d + after)
    if mode == "edge":
        return np.clip(i, 0, d - 1)
    if mode == "reflect":
        if d == 1:
            return np.zeros_like(i)
        period = 2 * (d - 1)
        m = np.mod(i, period)
        return np.where(m < d, m, period - m)
    if mode == "wrap":
        return np.mod(i, d)
    return i


def _pad_tensor(x: popxl.Tensor, pads: Sequence[int], mode: str, value: Union[float, popxl.Tensor],
                n: Node) -> popxl.Tensor:
    """Pad ``x``; ``value`` (constant mode) is a number or a scalar tensor computed on the device."""
    r = x.rank
    y = x
    for a in range(r):
        before, after = int(pads[a]), int(pads[a + r])
        if before == 0 and after == 0:
            continue
        d = x.shape[a]
        if d == 0 and mode != "constant":
            raise n.fail(f"cannot {mode}-pad the empty axis {a}")
        index = _pad_index(d, before, after, mode)
        inside = (index >= 0) & (index < d)
        y = _repeat_axis(y, a, np.clip(index, 0, max(d - 1, 0)))
        if mode == "constant" and not inside.all():
            mask = inside.reshape([1] * a + [len(index)] + [1] * (r - a - 1))
            fill = value if isinstance(value, popxl.Tensor) else n.scalar(value, y)
            y = ops.where(popxl.constant(mask), y, fill)
    return y


@onnx_op("Pad")
def _pad(n: Node) -> List[Value]:
    x = n.x(0)
    mode = n.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise n.fail(f"unknown mode {mode!r}")
    pads = [int(p) for p in n.static(1, "pads").reshape(-1)]
    if n.has(2) and n.imp.static(n.proto.input[2]) is None:
        # The pad value is computed on the device: a scalar tensor (it does not change any shape).
        v = n.x(2)
        value = ops.reshape(v if v.dtype == x.dtype else ops.cast(v, x.dtype), ())
    else:
        value = n.optional_static(2, "constant_value")
        value = 0.0 if value is None or value.size == 0 else value.reshape(-1)[0].item()
    axes = n.optional_static(3, "axes") if n.opset >= 18 else None
    if axes is not None:
        axes = [_axis(int(a), x.rank, n, "axes") for a in axes.reshape(-1)]
        full = [0] * (2 * x.rank)
        for k, a in enumerate(axes):
            full[a], full[a + x.rank] = pads[k], pads[k + len(axes)]
        pads = full
    if len(pads) != 2 * x.rank:
        raise n.fail(f"pads {pads} must have {2 * x.rank} entries for rank {x.rank}")
    return [_pad_tensor(x, pads, mode, value, n)]


@onnx_op("Resize")
def _resize(n: Node) -> List[Value]:
    x = n.x(0)
    mode = n.attr("mode", "nearest")
    ctm = n.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic"):
        raise n.fail(f"unknown mode {mode!r}")
    if mode == "cubic" and (float(n.attr("cubic_coeff_a", -0.75)) != -0.75 or n.attr("exclude_outside", 0)):
        raise n.fail("cubic mode is supported with cubic_coeff_a=-0.75 and exclude_outside=0 only")
    if ctm == "tf_crop_and_resize":
        raise n.fail("coordinate_transformation_mode 'tf_crop_and_resize' is not supported")
    if n.attr("antialias", 0):
        raise n.fail("antialias=1 is not supported")
    if n.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise n.fail("keep_aspect_ratio_policy other than 'stretch' is not supported")
    axes = n.ints("axes") if n.opset >= 18 else None
    axes = list(range(x.rank)) if axes is None else [_axis(a, x.rank, n, "axes") for a in axes]
    scales = n.optional_static(2, "scales")
    sizes = n.optional_static(3, "sizes")
    if scales is not None and scales.size == 0:
        scales = None
    if (scales is None) == (sizes is None):
        raise n.fail("exactly one of scales and sizes must be given")
    factor = [1.0] * x.rank
    want = list(x.shape)
    if scales is not None:
        for a, s in zip(axes, scales.reshape(-1)):
            factor[a] = float(s)
            want[a] = int(math.floor(x.shape[a] * float(s)))
    else:
        for a, s in zip(axes, sizes.reshape(-1)):
            want[a] = int(s)
            f = float(s) / x.shape[a]
            # Resize by sizes uses scale = size / length; nudge it up by an ulp if the float
            # product rounds below the wanted size (popxl sizes its output as floor(length * scale)).
            while math.floor(x.shape[a] * f) < want[a]:
                f = float(np.nextafter(f, np.inf))
            factor[a] = f
    y = ops.interpolate(x, tuple(factor), mode=mode, nearest_mode=n.attr("nearest_mode", "round_prefer_floor"),
                        coordinate_transformation_mode=ctm)
    if tuple(y.shape) != tuple(want):
        raise n.fail(f"resized shape {y.shape} differs from the expected {tuple(want)}")
    return [y]


@onnx_op("CumSum")
def _cumsum(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.static(1, "axis").reshape(-1)[0]), x.rank, n)
    reverse = bool(n.attr("reverse", 0))
    flip = np.arange(x.shape[axis] - 1, -1, -1)
    y = _repeat_axis(x, axis, flip) if reverse else x
    y = ops.cumsum(y, axis)
    if n.attr("exclusive", 0):
        y = ops.sub(y, _repeat_axis(x, axis, flip) if reverse else x)
    return [_repeat_axis(y, axis, flip) if reverse else y]


@onnx_op("TopK")
def _topk(n: Node) -> List[Value]:
    x = n.x(0)
    k = int(n.static(1, "K").reshape(-1)[0])
    axis = _axis(int(n.attr("axis", -1)), x.rank, n)
    values, indices = ops.topk(x, k, axis, bool(n.attr("largest", 1)), bool(n.attr("sorted", 1)))
    return [values, indices]


@onnx_op("DepthToSpace", "SpaceToDepth")
def _depth_space(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank != 4:
        raise n.fail(f"needs a 4-D (N, C, H, W) input, got shape {x.shape}")
    b = int(n.attr("blocksize"))
    nb, c, h, w = x.shape
    if n.op_type == "SpaceToDepth":
        y = ops.reshape(x, (nb, c, h // b, b, w // b, b))
        # DCR (the default) puts the block offsets before the channel, CRD after it (the mode
        # attribute arrived in opset 24; the inverse of DepthToSpace with the same mode).
        perm = (0, 3, 5, 1, 2, 4) if n.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
        y = ops.transpose(y, perm)
        return [ops.reshape(y, (nb, c * b * b, h // b, w // b))]
    if n.attr("mode", "DCR") == "DCR":
        y = ops.transpose(ops.reshape(x, (nb, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = ops.transpose(ops.reshape(x, (nb, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return [ops.reshape(y, (nb, c // (b * b), h * b, w * b))]


@onnx_op("Round")
def _round(n: Node) -> List[Value]:
    # Half to even, composed: floor(x + 0.5), minus one where that rounded a tie up to an odd value.
    x = n.x(0)
    half, one, two = n.scalar(0.5, x), n.scalar(1.0, x), n.scalar(2.0, x)
    r = ops.floor(ops.add(x, half))
    tie = ops.equal(ops.sub(r, x), half)
    odd = ops.logical_not(ops.equal(ops.fmod(r, two), n.scalar(0.0, x)))
    return [ops.where(ops.logical_and(tie, odd), ops.sub(r, one), r)]


@onnx_op("Trilu")
def _trilu(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank < 2:
        raise n.fail(f"needs a tensor of rank >= 2, got shape {x.shape}")
    rows, cols = x.shape[-2:]
    upper = bool(n.attr("upper", 1))
    if n.has(1) and n.imp.static(n.proto.input[1]) is None:
        # k computed on the device (it does not change the shape): keep where col - row >= k
        # (upper) or <= k (lower), comparing against the constant grid of col - row.
        k = n.x(1)
        k = ops.reshape(k if k.dtype == dtypes.int32 else ops.cast(k, dtypes.int32), ())
        diag = popxl.constant((np.arange(cols)[None, :] - np.arange(rows)[:, None]).astype(np.int32))
        keep_t = ops.logical_not(_less(diag, k)) if upper else ops.logical_not(ops.greater(diag, k))
        return [ops.where(keep_t, x, n.scalar(0, x))]
    k = n.optional_static(1, "k")
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    keep = np.ones((rows, cols), np.bool_)
    keep = np.triu(keep, k) if upper else np.tril(keep, k)
    return [ops.where(popxl.constant(keep), x, n.scalar(0, x))]


@onnx_op("OneHot")
def _onehot(n: Node) -> List[Value]:
    indices = n.x(0)
    depth = int(np.asarray(n.static(1, "depth")).reshape(-1)[0])
    values = n.x(2)
    axis = int(n.attr("axis", -1))
    if indices.dtype.is_floating_point:  # ONNX allows float indices; they are truncated
        indices = ops.cast(indices, dtypes.int32)
    return [ops.onehot(indices, popxl.constant(np.asarray(depth, np.int32)), values, axis)]


@onnx_op("GatherElements")
def _gather_elements(n: Node) -> List[Value]:
    # Composed as a gather from the flattened input: flat index = (position with the axis
    # coordinate removed) + index * stride of the axis.
    x, idx = n.x(0), n.x(1)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n)
    if idx.rank != x.rank:
        raise n.fail(f"indices rank {idx.rank} differs from data rank {x.rank}")
    d = x.shape[axis]
    strides = np.cumprod((x.shape[1:] + (1,))[::-1])[::-1]
    grid = np.indices(idx.shape)
    base = sum(int(strides[a]) * grid[a] for a in range(x.rank) if a != axis)
    idx = idx if idx.dtype == dtypes.int32 else ops.cast(idx, dtypes.int32)
    zero = popxl.constant(np.asarray(0, np.int32))
    idx = ops.where(_less(idx, zero), ops.add(idx, popxl.constant(np.asarray(d, np.int32))), idx)
    flat = ops.add(popxl.constant(base.astype(np.int32)),
                   ops.mul(idx, popxl.constant(np.asarray(int(strides[axis]), np.int32))))
    return [ops.gather(ops.reshape(x, (x.nelms,)), flat, 0)]


# PopART's own domain registers its entries into OPS when imported.
from popart.onnx import graphcore as _graphcore  # noqa: E402,F401
