"""The ONNX op table: one entry per ONNX op type, each turning one node into popxl ops.

This module holds the table, the ``Node`` entries receive, and the entries of the common ops
(elementwise, matmul, softmax and losses, convolution and pooling, normalisation, reductions,
shapes, indexing); ``control`` (If, Loop, Scan), ``recurrent`` (LSTM/GRU/RNN), ``signal`` (DFT,
STFT, windows, mel weights), ``sampling`` (GridSample, RoiAlign, MaxUnpool, Col2Im) and ``graphcore``
(PopART's own domain) register the rest. Ops defined as functions of others are expanded before import (``functions``).

An entry receives a ``Node`` (the node plus helpers to read its attributes and inputs) and returns
one value per output: a popxl Tensor, or a NumPy array when the output is known at import (Shape,
Size). Differences between opsets (attributes that became inputs, changed defaults) are handled
inside the entry. Where popxl has no op for an ONNX feature, the entry composes it from popxl ops.
Nodes whose inputs are all known at import never reach their entry: the importer folds them.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx

import popxl
import popxl.ops as ops
from popxl import dtypes
from popxl.op import create_op
from popart.errors import OnnxImportError
from popart.onnx.importer import GraphImporter, device_array, device_dtype, op_key
from popart.onnx.validate import element_dtype

__all__ = ["OPS", "Node", "Entry"]

Value = Union[np.ndarray, popxl.Tensor]


# The dtype kinds a single value read at import must have when asked for exactly, and its name.
_SCALAR_KINDS: Dict[type, Tuple[str, str]] = {int: ("iu", "an integer"), float: ("f", "a floating-point"),
                                              bool: ("b", "a boolean")}


class Node:
    """One ONNX node being lowered, with typed access to its attributes and inputs."""

    def __init__(self, importer: GraphImporter, proto: onnx.NodeProto, index: int) -> None:
        self.imp = importer
        self.proto = proto
        self.index = index
        self.op_type = proto.op_type
        self.opset = importer.node_opset(index)
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

    def static_ints(self, i: int, what: str) -> List[int]:
        """Input ``i``, known at import (a shape, axes, pads), as a flat list of ints."""
        values = [int(v) for v in np.asarray(self.static(i, what)).reshape(-1)]
        if any(not -2 ** 63 <= v < 2 ** 63 for v in values):  # a uint64 beyond int64 (or a float)
            raise self.fail(f"input {i} ({what}) holds {values}, beyond 64-bit integers")
        return values

    def optional_static_ints(self, i: int, what: str) -> Optional[List[int]]:
        return self.static_ints(i, what) if self.has(i) else None

    def single(self, value: Any, what: str, kind: type = int, exact: bool = False,
               index: Optional[int] = None) -> Any:
        """``value``, which must hold one element, as ``kind`` (int, float or bool). ``exact``: its
        dtype must already be of that kind (else any number converts). ``index``: the input it is,
        named in the error."""
        v = np.asarray(value)
        if v.size != 1 or v.dtype.kind not in (_SCALAR_KINDS[kind][0] if exact else "biuf"):
            problem = "must hold a single value" if v.size != 1 else "has the wrong type"
            where = f"input {index} ({what}) {problem}: " if index is not None else ""
            raise self.fail(f"{where}{what} must be {_SCALAR_KINDS[kind][1]} scalar, got {v.dtype} of shape {v.shape}")
        return kind(v.reshape(-1)[0])

    def static_int(self, i: int, what: str, exact: bool = False) -> int:
        """Input ``i``, a single value known at import (an axis, a count, a length), as an int."""
        return self.single(self.static(i, what), what, int, exact, i)

    def static_float(self, i: int, what: str) -> float:
        return self.single(self.static(i, what), what, float, index=i)

    def static_bool(self, i: int, what: str) -> bool:
        return self.single(self.static(i, what), what, bool, index=i)

    def shape(self, i: int) -> Tuple[int, ...]:
        """The shape of input ``i`` (known at import in every case)."""
        v = self.imp.static(self.proto.input[i])
        return tuple(v.shape) if v is not None else tuple(self.x(i).shape)

    def scalar(self, value: float, like: popxl.Tensor) -> popxl.Tensor:
        """A scalar constant of ``like``'s dtype."""
        return _scalar(value, like)


# How a node is computed at import: its inputs (None where absent) in, one array per output out.
Fold = Callable[..., Sequence[Optional[np.ndarray]]]


class Entry:
    """How one ONNX op type is lowered. ``foldable``: a node whose inputs are all known at import
    is computed at import instead (all ops here are deterministic; only those whose import-time
    evaluation lacks features are not foldable), by ``fold(node, *inputs)`` when the op has one
    (``onnx_fold``), else by ONNX's reference implementation."""

    def __init__(self, fn: Callable[[Node], Sequence[Optional[Value]]], foldable: bool = True) -> None:
        self.fn = fn
        self.foldable = foldable
        self.fold: Optional[Fold] = None

    def __call__(self, n: Node) -> Sequence[Optional[Value]]:
        return self.fn(n)


OPS: Dict[str, Entry] = {}


def onnx_op(*op_types: str, foldable: bool = True) -> Callable:
    """Register the decorated function as the entry of each of ``op_types`` (``foldable=False``:
    never computed at import, for ops whose ONNX reference implementation misses features)."""
    def deco(fn: Callable[[Node], Sequence[Optional[Value]]]) -> Callable:
        for t in op_types:
            if t in OPS:
                raise RuntimeError(f"ONNX op {t} registered twice")
            OPS[t] = Entry(fn, foldable)
        return fn
    return deco


def onnx_fold(*op_types: str) -> Callable[[Fold], Fold]:
    """Register the decorated function as the import-time evaluation of each of ``op_types``
    (already in the table), in place of ONNX's reference implementation where that one computes
    something else than the entry does at run time."""
    def deco(fn: Fold) -> Fold:
        for t in op_types:
            OPS[t].fold = fn
        return fn
    return deco


def _scalar(value: float, like: popxl.Tensor) -> popxl.Tensor:
    """A scalar constant of ``like``'s dtype."""
    return popxl.constant(np.asarray(value, dtype=like.dtype.as_numpy()))


def _as_tensor(v: Value) -> popxl.Tensor:
    """``v`` as a tensor of the current graph (an import-time value becomes a constant)."""
    return v if isinstance(v, popxl.Tensor) else popxl.constant(device_array(np.asarray(v)))


def _stack(values: Sequence[Value], axis: int = 0) -> Value:
    """``values`` (all of one shape) stacked along a new ``axis``; a NumPy array if all are."""
    if all(isinstance(v, np.ndarray) for v in values):
        return np.stack(values, axis)
    ts = [_as_tensor(v) for v in values]
    shape = tuple(ts[0].shape)
    parts = [ops.reshape(t, shape[:axis] + (1,) + shape[axis:]) for t in ts]
    return ops.concat(parts, axis) if len(parts) > 1 else parts[0]


def _unstack(v: Value, axis: int = 0) -> List[Value]:
    """The slices of ``v`` along ``axis``, each without that axis (the inverse of ``_stack``)."""
    if isinstance(v, np.ndarray):
        return [np.asarray(np.take(v, i, axis)) for i in range(v.shape[axis])]
    d = v.shape[axis]
    rest = tuple(s for a, s in enumerate(v.shape) if a != axis)
    parts = ops.split(v, d, axis) if d > 1 else [v] * d  # one part needs no split op; ops.split refuses 0
    return [ops.reshape(p, rest) for p in parts]


def _i32(value: np.ndarray) -> popxl.Tensor:
    return popxl.constant(np.asarray(value).astype(np.int32))


def _as_int32(t: popxl.Tensor) -> popxl.Tensor:
    return t if t.dtype == dtypes.int32 else ops.cast(t, dtypes.int32)


def _strides(shape: Sequence[int]) -> np.ndarray:
    """Row-major element strides of ``shape``."""
    return np.cumprod((tuple(shape[1:]) + (1,))[::-1])[::-1].astype(np.int64)


def _prod(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _axis(axis: int, rank: int, n: Node, what: str = "axis", scalar_axis: bool = True) -> int:
    """``axis`` counted from 0, checked against ``rank``. ``scalar_axis``: a rank-0 tensor takes axis 0
    (as ops that see a scalar as one element do); else it has no axis."""
    if not -rank <= axis < (max(rank, 1) if scalar_axis else rank):
        raise n.fail(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _popxl_dtype_of_onnx(elem_type: int) -> dtypes.dtype:
    """The popxl dtype that holds values of ONNX element type ``elem_type`` on the device."""
    return dtypes.from_numpy(device_dtype(element_dtype(int(elem_type))))


# elementwise ------------------------------------------------------------------------------------------
def _sigmoid(x: popxl.Tensor) -> popxl.Tensor:
    # 1 / (1 + exp(-x)): exact in relative terms for large negative x, where 0.5 * tanh(x / 2) + 0.5 is not.
    one = popxl.constant(np.ones((), x.dtype.as_numpy()))
    return ops.div(one, ops.add(one, ops.exp(ops.negate(x))))


def _poly(x: popxl.Tensor, coefficients: Sequence[float]) -> popxl.Tensor:
    """c0 + c1 x + c2 x^2 + ... by Horner's rule."""
    y = _scalar(coefficients[-1], x)
    for c in reversed(coefficients[:-1]):
        y = ops.add(ops.mul(y, x), _scalar(c, x))
    return y


# Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, below float32 resolution of erf near 1.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: popxl.Tensor) -> popxl.Tensor:
    one = _scalar(1.0, x)
    t = ops.div(one, ops.add(one, ops.mul(_scalar(_ERF_P, x), ops.abs(x))))
    y = ops.sub(one, ops.mul(ops.mul(_poly(t, _ERF_A), t), ops.exp(ops.negate(ops.mul(x, x)))))
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


def _activation(t: str, x: popxl.Tensor, attr: Callable[[str, float], Any]) -> popxl.Tensor:
    """The ONNX activation ``t`` (one with attributes, read by ``attr(name, default)``), composed
    from popxl elementwise ops. The recurrent ops call it with their own alpha/beta."""
    def c(v: float) -> popxl.Tensor:
        return _scalar(v, x)

    if t == "Softplus":
        return _softplus(x)
    if t == "Softsign":
        return ops.div(x, ops.add(c(1.0), ops.abs(x)))
    if t == "Mish":
        return ops.mul(x, ops.tanh(_softplus(x)))
    if t in ("HardSigmoid", "HardSwish"):
        alpha, beta = (float(attr("alpha", 0.2)), float(attr("beta", 0.5))) if t == "HardSigmoid" else (1 / 6, 0.5)
        h = ops.clip(ops.add(ops.mul(x, c(alpha)), c(beta)), 0.0, 1.0)
        return h if t == "HardSigmoid" else ops.mul(x, h)
    if t == "Elu":
        alpha = float(attr("alpha", 1.0))
        return _where_positive(x, ops.mul(c(alpha), ops.sub(ops.exp(x), c(1.0))))
    if t == "Selu":
        alpha = float(attr("alpha", 1.67326319217681884765625))
        gamma = float(attr("gamma", 1.05070102214813232421875))
        return ops.mul(c(gamma), _where_positive(x, ops.mul(c(alpha), ops.sub(ops.exp(x), c(1.0)))))
    if t == "Celu":
        alpha = float(attr("alpha", 1.0))
        return _where_positive(x, ops.mul(c(alpha), ops.sub(ops.exp(ops.div(x, c(alpha))), c(1.0))))
    if t == "ThresholdedRelu":
        alpha = float(attr("alpha", 1.0))
        return _where_positive(x, c(0.0), alpha)
    raise ValueError(f"{t} is not an activation")


@onnx_op("Softplus", "Softsign", "Mish", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "ThresholdedRelu",
         "PRelu")
def _activations(n: Node) -> List[Value]:
    x = n.x(0)
    if n.op_type == "PRelu":  # the slope is an input, not an attribute
        return [_where_positive(x, ops.mul(x, n.x(1)))]
    return [_activation(n.op_type, x, n.attr)]


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
    # Python-style modulo: the result takes the divisor's sign (r + b cannot overflow: r and b have
    # opposite signs there). A divisor of 0 gives 0, as popxl's fmod does.
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
    # b with the truncated quotient, so dividing it is exact whichever way the division rounds (and
    # never overflows: the remainder has a's sign). popxl's rules carry over: b = 0 gives 0, and
    # INT_MIN / -1 wraps to INT_MIN.
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


@onnx_fold("Max", "Min", "Sum", "Mean")
def _variadic_at_import(n: Node, *xs: np.ndarray) -> List[np.ndarray]:
    # ONNX's reference Mean adds into its first input in place, which fails when the inputs
    # broadcast to a larger shape than the first one's.
    fn = {"Max": np.maximum, "Min": np.minimum}.get(n.op_type, np.add)
    y = xs[0]
    for x in xs[1:]:
        y = fn(y, x)
    if n.op_type == "Mean":
        y = y / np.asarray(len(xs), y.dtype)
    return [np.asarray(y, xs[0].dtype)]


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
    lo = -math.inf if bounds[0] is None else n.single(bounds[0], "min", float, index=1)
    hi = math.inf if bounds[1] is None else n.single(bounds[1], "max", float, index=2)
    # ONNX (as NumPy's clip, min(max(x, lo), hi)): with min above max every value becomes max
    return [ops.clip(x, min(lo, hi), hi)]


# popxl's float8 formats are ONNX's FLOAT8E4M3FNUZ / FLOAT8E5M2FNUZ; their largest magnitudes.
_FP8_MAX = {dtypes.float8_143: 240.0, dtypes.float8_152: 57344.0}


def _cast_to(n: Node, x: popxl.Tensor, to: dtypes.dtype) -> popxl.Tensor:
    if x.dtype == to:
        return x
    zero_scale = _i32(0)
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
    return [_cast_to(n, n.x(0), _popxl_dtype_of_onnx(n.attr("to")))]


@onnx_op("CastLike")
def _cast_like(n: Node) -> List[Value]:
    return [_cast_to(n, n.x(0), n.x(1).dtype)]


# inverse and hyperbolic trigonometry ------------------------------------------------------------------
def _odd_series(x: popxl.Tensor, coefficients: Sequence[float]) -> popxl.Tensor:
    """x (c0 + c1 x^2 + c2 x^4 + ...): the Taylor form of an odd function near 0."""
    return ops.mul(x, _poly(ops.mul(x, x), coefficients))


# Abramowitz & Stegun 4.4.49: atan(t) / t on [0, 1] as a polynomial in t^2, |error| <= 2e-8.
_ATAN = (1.0, -0.3333314528, 0.1999355085, -0.1420889944, 0.1065626393, -0.0752896400, 0.0429096138,
         -0.0161657367, 0.0028662257)


def _atan(x: popxl.Tensor) -> popxl.Tensor:
    # |x| > 1 is reduced by atan(a) = pi/2 - atan(1/a); the sign is restored last (NaN stays NaN).
    a = ops.abs(x)
    big = ops.greater(a, _scalar(1.0, x))
    t = ops.where(big, ops.div(_scalar(1.0, x), a), a)
    r = _odd_series(t, _ATAN)
    r = ops.where(big, ops.sub(_scalar(math.pi / 2, x), r), r)
    return ops.where(_less(x, _scalar(0.0, x)), ops.negate(r), r)


def _asin(x: popxl.Tensor) -> popxl.Tensor:
    # x / sqrt(1 - x^2) is +-inf at +-1, where atan gives +-pi/2; beyond, sqrt gives NaN.
    one = _scalar(1.0, x)
    return _atan(ops.div(x, ops.sqrt(ops.mul(ops.sub(one, x), ops.add(one, x)))))


def _acos(x: popxl.Tensor) -> popxl.Tensor:
    # 2 atan(sqrt((1 - x) / (1 + x))): accurate near 1, where pi/2 - asin(x) would cancel.
    one = _scalar(1.0, x)
    return ops.mul(_scalar(2.0, x), _atan(ops.sqrt(ops.div(ops.sub(one, x), ops.add(one, x)))))


def _small(x: popxl.Tensor, bound: float) -> popxl.Tensor:
    return _less(ops.abs(x), _scalar(bound, x))


def _sinh(x: popxl.Tensor) -> popxl.Tensor:
    # (e^x - e^-x) / 2 cancels near 0: the Taylor series there (|x| < 0.5: next term < 1e-8 relative).
    half = _scalar(0.5, x)
    far = ops.mul(half, ops.sub(ops.exp(x), ops.exp(ops.negate(x))))
    return ops.where(_small(x, 0.5), _odd_series(x, (1.0, 1 / 6, 1 / 120, 1 / 5040)), far)


def _cosh(x: popxl.Tensor) -> popxl.Tensor:
    return ops.mul(_scalar(0.5, x), ops.add(ops.exp(x), ops.exp(ops.negate(x))))


def _log_hypot_sum(a: popxl.Tensor, root: popxl.Tensor) -> popxl.Tensor:
    """log(a + root) for the inverse hyperbolics, with log(2a) where a is so large that a^2 under
    ``root`` would overflow."""
    huge = ops.greater(a, _scalar(1e4, a))
    return ops.where(huge, ops.add(ops.log(a), _scalar(math.log(2.0), a)), ops.log(ops.add(a, root)))


def _asinh(x: popxl.Tensor) -> popxl.Tensor:
    # sign(x) log(|x| + sqrt(x^2 + 1)), whose logarithm of ~1 loses digits near 0: series there.
    a = ops.abs(x)
    r = _log_hypot_sum(a, ops.sqrt(ops.add(ops.mul(a, a), _scalar(1.0, x))))
    r = ops.where(_less(x, _scalar(0.0, x)), ops.negate(r), r)
    return ops.where(_small(x, 0.2), _odd_series(x, (1.0, -1 / 6, 3 / 40, -15 / 336, 105 / 3456)), r)


def _acosh(x: popxl.Tensor) -> popxl.Tensor:
    one = _scalar(1.0, x)
    return _log_hypot_sum(x, ops.sqrt(ops.mul(ops.sub(x, one), ops.add(x, one))))


def _atanh(x: popxl.Tensor) -> popxl.Tensor:
    one = _scalar(1.0, x)
    far = ops.mul(_scalar(0.5, x), ops.log(ops.div(ops.add(one, x), ops.sub(one, x))))
    return ops.where(_small(x, 0.2), _odd_series(x, (1.0, 1 / 3, 1 / 5, 1 / 7, 1 / 9)), far)


def _tan(x: popxl.Tensor) -> popxl.Tensor:
    return ops.div(ops.sin(x), ops.cos(x))


_TRIG: Dict[str, Callable[[popxl.Tensor], popxl.Tensor]] = {
    "Tan": _tan, "Asin": _asin, "Acos": _acos, "Atan": _atan, "Sinh": _sinh, "Cosh": _cosh, "Asinh": _asinh,
    "Acosh": _acosh, "Atanh": _atanh,
}


@onnx_op(*_TRIG)
def _trig(n: Node) -> List[Value]:
    x = n.x(0)
    if not x.dtype.is_floating_point:
        raise n.fail(f"needs a floating-point input, got {x.dtype}")
    return [_TRIG[n.op_type](x)]


@onnx_op("Xor")
def _xor(n: Node) -> List[Value]:
    a, b = n.x(0), n.x(1)
    return [ops.logical_and(ops.logical_or(a, b), ops.logical_not(ops.logical_and(a, b)))]


_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
            "BitwiseNot": "bitwise_not"}


@onnx_op(*_BITWISE, "BitShift")
def _bitwise(n: Node) -> List[Value]:
    # popxl has no functions for bit operations: the ops (integer operands only) are made by name
    xs = n.xs()
    if n.op_type == "BitShift":
        direction = n.attr("direction")
        if direction not in ("LEFT", "RIGHT"):
            raise n.fail(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
        return [create_op(f"bitshift_{direction.lower()}", xs)[0]]
    return [create_op(_BITWISE[n.op_type], xs)[0]]


@onnx_op("Shrink")
def _shrink(n: Node) -> List[Value]:
    x = n.x(0)
    lambd, bias = float(n.attr("lambd", 0.5)), float(n.attr("bias", 0.0))
    if not x.dtype.is_floating_point:  # the thresholds and the shift act on the values as floats
        return [ops.cast(_shrink_values(ops.cast(x, dtypes.float32), lambd, bias), x.dtype)]
    return [_shrink_values(x, lambd, bias)]


def _shrink_values(x: popxl.Tensor, lambd: float, bias: float) -> popxl.Tensor:
    low = _less(x, _scalar(-lambd, x))
    high = ops.greater(x, _scalar(lambd, x))
    return ops.where(low, ops.add(x, _scalar(bias, x)), ops.where(high, ops.sub(x, _scalar(bias, x)), _scalar(0.0, x)))



# quantization -------------------------------------------------------------------------------------------
_INT_RANGE = {dtypes.uint8: (0, 255), dtypes.int8: (-128, 127), dtypes.uint16: (0, 65535),
              dtypes.int16: (-32768, 32767), dtypes.int32: (-2 ** 31, 2 ** 31 - 1)}


def _per_element(n: Node, p: popxl.Tensor, x: popxl.Tensor) -> popxl.Tensor:
    """A scale or zero point spread over x: per tensor (a scalar), per axis (a 1-D tensor along
    ``axis``) or per block (x's rank, ``block_size`` elements of ``axis`` sharing one value)."""
    if p.nelms == 1 and p.rank <= 1:
        return ops.reshape(p, ())
    axis = _axis(int(n.attr("axis", 1)), x.rank, n)
    block = int(n.attr("block_size", 0) or 0)
    d = x.shape[axis]
    if block <= 0:
        if p.rank != 1 or p.shape[0] != d:
            raise n.fail(f"a per-axis scale/zero point must be 1-D of length {d} (axis {axis} of {x.shape}), "
                         f"got shape {p.shape}")
        return ops.reshape(p, tuple(d if a == axis else 1 for a in range(x.rank)))
    blocks = -(-d // block)
    want = tuple(blocks if a == axis else x.shape[a] for a in range(x.rank))
    if p.shape != want:
        raise n.fail(f"a blocked scale/zero point for {x.shape}, axis {axis}, block_size {block} must have "
                     f"shape {want}, got {p.shape}")
    # repeat each value block_size times along the axis, then drop the tail past d
    spread = ops.reshape(p, want[:axis + 1] + (1,) + want[axis + 1:])
    spread = ops.mul(spread, popxl.constant(np.ones(want[:axis + 1] + (block,) + want[axis + 1:],
                                                    p.dtype.as_numpy())))
    spread = ops.reshape(spread, want[:axis] + (blocks * block,) + want[axis + 1:])
    return spread if blocks * block == d else ops.slice(spread, start=[0], stop=[d], axis=[axis])


@onnx_op("DequantizeLinear")
def _dequantize_linear(n: Node) -> List[Value]:
    x, scale = n.x(0), n.x(1)
    f = scale.dtype
    y = _cast_to(n, x, f)
    if n.has(2):
        y = ops.sub(y, _per_element(n, _cast_to(n, n.x(2), f), x))
    return [ops.mul(y, _per_element(n, scale, x))]


@onnx_op("QuantizeLinear")
def _quantize_linear(n: Node) -> List[Value]:
    x, scale = n.x(0), n.x(1)
    if n.has(2):
        out = n.x(2).dtype
    else:
        code = int(n.attr("output_dtype", 0) or 0)
        out = _popxl_dtype_of_onnx(code) if code else dtypes.uint8
    if out not in _INT_RANGE or out == dtypes.int32:
        raise n.fail(f"quantizing to {out} is not supported (8- and 16-bit integers are)")
    f = x.dtype
    y = _round_half_even(ops.div(x, _per_element(n, _cast_to(n, scale, f), x)))
    if n.has(2):
        y = ops.add(y, _per_element(n, _cast_to(n, n.x(2), f), x))
    lo, hi = _INT_RANGE[out]
    return [ops.cast(ops.clip(y, float(lo), float(hi)), out)]


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


# einsum -----------------------------------------------------------------------------------------------
# An einsum term is held as a list of labels: one letter per axis, and "...k" for the k-th of the
# axes the ellipsis stands for (numbered from the left of the widest ellipsis, so that narrower
# ellipses line up on the right, as broadcasting does).
Labels = List[str]


def _einsum_term(term: str, n: Node) -> Tuple[Labels, bool]:
    """The letters of one term, with "..." kept as one item; and whether it has an ellipsis."""
    out: Labels = []
    i = 0
    while i < len(term):
        if term.startswith("...", i):
            if "..." in out:
                raise n.fail(f"equation term {term!r} has more than one '...'")
            out.append("...")
            i += 3
        elif term[i].isascii() and term[i].isalpha():
            out.append(term[i])
            i += 1
        else:
            raise n.fail(f"equation term {term!r}: expected letters and at most one '...', got {term[i]!r}")
    return out, "..." in out


def _einsum_parse(equation: str, shapes: Sequence[Tuple[int, ...]], n: Node) -> Tuple[List[Labels], Labels]:
    """The labels of each operand's axes and of the output's, ellipses expanded."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise n.fail(f"equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = [_einsum_term(t, n) for t in lhs.split(",")]
    if len(terms) != len(shapes):
        raise n.fail(f"equation {equation!r} has {len(terms)} operand term(s) but the node has {len(shapes)} "
                     f"input(s)")
    widths = []
    for k, ((term, has_ellipsis), shape) in enumerate(zip(terms, shapes)):
        letters = len(term) - has_ellipsis
        if (len(shape) < letters) if has_ellipsis else (len(shape) != letters):
            raise n.fail(f"equation term {k} ({''.join(term)!r}) does not fit input {k} of shape {shape}")
        widths.append(len(shape) - letters)
    wide = max(widths, default=0)

    def expand(term: Labels, width: int) -> Labels:
        out: Labels = []
        for label in term:
            out.extend([f"...{j}" for j in range(wide - width, wide)] if label == "..." else [label])
        return out

    inputs = [expand(t, w) for (t, _), w in zip(terms, widths)]
    if not arrow:
        # Implicit output: the broadcast axes, then the letters used exactly once, in ASCII order.
        counts = Counter(label for t, _ in terms for label in t if label != "...")
        return inputs, expand(["..."], wide) + sorted(label for label, c in counts.items() if c == 1)
    out_term, out_has_ellipsis = _einsum_term(rhs, n)
    if wide and not out_has_ellipsis:
        raise n.fail(f"equation {equation!r}: the inputs' '...' stand for {wide} axes, so the output needs '...' too")
    output = expand(out_term, wide)
    if len(set(output)) != len(output):
        raise n.fail(f"equation {equation!r}: the output repeats an index")
    used = {label for t in inputs for label in t}
    missing = [label for label in output if label not in used]
    if missing:
        raise n.fail(f"equation {equation!r}: output indices {missing} appear in no input")
    return inputs, output


def _label_sizes(inputs: Sequence[Labels], shapes: Sequence[Tuple[int, ...]], n: Node) -> Dict[str, int]:
    """Each label's length; a length of 1 broadcasts against any other."""
    sizes: Dict[str, int] = {}
    for labels, shape in zip(inputs, shapes):
        for label, d in zip(labels, shape):
            have = sizes.get(label, 1)
            if d != have and 1 not in (d, have):
                raise n.fail(f"index {label!r} has lengths {have} and {d} in different places")
            sizes[label] = d if have == 1 else have
    return sizes


def _permute(x: popxl.Tensor, labels: Labels, order: Labels) -> popxl.Tensor:
    perm = tuple(labels.index(label) for label in order)
    return x if perm == tuple(range(len(perm))) else ops.transpose(x, perm)


def _einsum_diagonal(x: popxl.Tensor, labels: Labels, n: Node) -> Tuple[popxl.Tensor, Labels]:
    """Collapse the axes that share a label into one (the diagonal), by a gather from the
    flattened tensor: element [i, j, ...] of the result is at sum(stride[axis] * index[label[axis]])."""
    unique = list(dict.fromkeys(labels))
    if len(unique) == len(labels):
        return x, labels
    dims = {}
    for label, d in zip(labels, x.shape):
        if dims.setdefault(label, d) != d:
            raise n.fail(f"repeated index {label!r} spans axes of different lengths {dims[label]} and {d}")
    strides = _strides(x.shape)
    grid = np.indices([dims[label] for label in unique], dtype=np.int64)
    flat = sum(int(strides[a]) * grid[unique.index(label)] for a, label in enumerate(labels))
    y = ops.gather(ops.reshape(x, (x.nelms,)), _i32(flat), 0)
    return y, unique


def _sum_labels(x: popxl.Tensor, labels: Labels, needed: set) -> Tuple[popxl.Tensor, Labels]:
    """Sum over the axes whose label is not needed any more."""
    axes = [a for a, label in enumerate(labels) if label not in needed]
    if not axes:
        return x, labels
    return ops.sum(x, axes, keepdims=False), [label for label in labels if label in needed]


def _contract(a: popxl.Tensor, la: Labels, b: popxl.Tensor, lb: Labels, keep: set,
              sizes: Dict[str, int]) -> Tuple[popxl.Tensor, Labels]:
    """One batched matmul: labels in both operands are batch axes if still needed, else summed;
    each side's other labels are its free axes."""
    shared = [label for label in la if label in lb]
    batch = [label for label in shared if label in keep]
    summed = [label for label in shared if label not in keep]
    free_a = [label for label in la if label not in lb]
    free_b = [label for label in lb if label not in la]

    def size(ls: Labels) -> int:
        return _prod([sizes[label] for label in ls])

    a = ops.reshape(_permute(a, la, batch + free_a + summed), (size(batch), size(free_a), size(summed)))
    b = ops.reshape(_permute(b, lb, batch + summed + free_b), (size(batch), size(summed), size(free_b)))
    y = ops.matmul(a, b)
    out = batch + free_a + free_b
    return ops.reshape(y, tuple(sizes[label] for label in out)), out


@onnx_op("Einsum")
def _einsum(n: Node) -> List[Value]:
    xs = [n.x(i) for i in range(n.n_inputs)]
    if not xs:
        raise n.fail("needs at least one input")
    equation = n.attr("equation")
    if equation is None:
        raise n.fail("the equation attribute is required")
    shapes = [tuple(x.shape) for x in xs]
    inputs, output = _einsum_parse(equation, shapes, n)
    sizes = _label_sizes(inputs, shapes, n)
    operands: List[Tuple[popxl.Tensor, Labels]] = []
    for x, labels in zip(xs, inputs):
        x, labels = _einsum_diagonal(x, labels, n)
        # A length-1 axis broadcast against a longer one elsewhere: drop it, leaving the label to
        # the operands that have it in full (its value is repeated along it, which is the same).
        drop = [label for label, d in zip(labels, x.shape) if d == 1 and sizes[label] != 1]
        if drop:
            labels = [label for label in labels if label not in drop]
            x = ops.reshape(x, tuple(sizes[label] for label in labels))
        operands.append((x, labels))
    # Indices that only one operand has and the output lacks are summed in that operand first.
    for k, (x, labels) in enumerate(operands):
        others = {label for j, (_, ls) in enumerate(operands) if j != k for label in ls}
        operands[k] = _sum_labels(x, labels, others | set(output))
    y, ly = operands[0]
    for k in range(1, len(operands)):
        b, lb = operands[k]
        later = {label for _, ls in operands[k + 1:] for label in ls}
        y, ly = _contract(y, ly, b, lb, later | set(output), sizes)
    y, ly = _sum_labels(y, ly, set(output))
    return [_permute(y, ly, output)]


# softmax ----------------------------------------------------------------------------------------------
def _log_softmax(x: popxl.Tensor, axis: int) -> popxl.Tensor:
    # (x - max) - log(sum(exp(x - max))): x - logsumexp(x) loses the digits of large x (1e4 + 3.44
    # holds 3.44 to ~5e-4 in float32). The max only shifts: no gradient flows through it.
    shifted = ops.sub(x, ops.detach(ops.max(x, axis, keepdims=True)))
    return ops.sub(shifted, ops.log(ops.sum(ops.exp(shifted), axis, keepdims=True)))


def _softmax_view(n: Node, shape: Tuple[int, ...]) -> Tuple[Tuple[int, ...], int]:
    """The shape Softmax, LogSoftmax and Hardmax see their input in, and the axis they work along:
    from opset 13 the input itself along ``axis`` (default -1); before, the input seen as 2-D,
    [prod(shape[:axis]), prod(shape[axis:])] (default axis 1), along its second axis."""
    if n.opset >= 13:
        return tuple(shape), _axis(int(n.attr("axis", -1)), len(shape), n, scalar_axis=False)
    axis = _axis(int(n.attr("axis", 1)), len(shape), n)
    return (_prod(shape[:axis]), _prod(shape[axis:])), 1


@onnx_op("Softmax", "LogSoftmax")
def _softmax(n: Node) -> List[Value]:
    x = n.x(0)
    fn = ops.softmax if n.op_type == "Softmax" else _log_softmax
    view, axis = _softmax_view(n, x.shape)
    return [ops.reshape(fn(ops.reshape(x, view), axis), x.shape)]


# losses -----------------------------------------------------------------------------------------------
_REDUCTIONS = ("none", "sum", "mean")


def _nll(n: Node, log_prob: popxl.Tensor, target: popxl.Tensor, weight: Optional[popxl.Tensor]) -> popxl.Tensor:
    """-log_prob[n, target[n, d...], d...] (times weight[target]), reduced as the node asks.
    Targets equal to ignore_index give 0 and count for no weight in the mean."""
    reduction = n.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise n.fail(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if log_prob.rank < 2:
        raise n.fail(f"the input must be (N, C) or (N, C, d1, ...), got shape {log_prob.shape}")
    nb, c = log_prob.shape[:2]
    spatial = tuple(log_prob.shape[2:])
    if tuple(target.shape) != (nb,) + spatial:
        raise n.fail(f"the target's shape {target.shape} must be {(nb,) + spatial} for input shape {log_prob.shape}")
    if weight is not None and tuple(weight.shape) != (c,):
        raise n.fail(f"the weight's shape {weight.shape} must be ({c},)")
    if target.dtype.is_floating_point:
        raise n.fail(f"the target must hold integer class indices, got {target.dtype.name}")
    target = _as_int32(target)
    valid: Optional[popxl.Tensor] = None
    ignore = n.attr("ignore_index")
    if ignore is not None and -2 ** 31 <= int(ignore) < 2 ** 31:
        # ignore_index may lie outside [0, C): point ignored targets at class 0 before any gather.
        valid = ops.logical_not(ops.equal(target, _i32(int(ignore))))
        target = ops.where(valid, target, _i32(0))
    # The target class's element of each (n, d) line of the input seen as (N, C, D).
    d = _prod(spatial)
    flat = _element_positions(ops.reshape(target, (nb, 1, d)), (nb, c, d), 1, (nb, 1, d))
    loss = ops.negate(ops.gather(ops.reshape(log_prob, (log_prob.nelms,)), ops.reshape(flat, target.shape), 0))
    zero = n.scalar(0.0, loss)
    w: Optional[popxl.Tensor] = None
    if weight is not None:
        w = ops.gather(weight, target, 0)
        if valid is not None:
            w = ops.where(valid, w, zero)
        loss = ops.mul(loss, w)
    elif valid is not None:
        w = ops.cast(valid, loss.dtype)
    if valid is not None:
        loss = ops.where(valid, loss, zero)  # exactly 0, even where log_prob is -inf
    if reduction == "none":
        return loss
    total = ops.sum(loss)
    if reduction == "sum":
        return total
    return ops.mean(loss) if w is None else ops.div(total, ops.sum(w))


@onnx_op("NegativeLogLikelihoodLoss")
def _nll_loss(n: Node) -> List[Value]:
    return [_nll(n, n.x(0), n.x(1), n.x(2) if n.has(2) else None)]


@onnx_op("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(n: Node) -> List[Value]:
    scores = n.x(0)
    if scores.rank < 2:
        raise n.fail(f"the scores must be (N, C) or (N, C, d1, ...), got shape {scores.shape}")
    log_prob = _log_softmax(scores, 1)
    return [_nll(n, log_prob, n.x(1), n.x(2) if n.has(2) else None), log_prob]


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


def _kernel_shape(n: Node) -> List[int]:
    kernel = n.ints("kernel_shape")
    if kernel is None:
        raise n.fail("kernel_shape is required")
    return kernel


@onnx_op("MaxPool", "AveragePool")
def _pool(n: Node) -> List[Value]:
    x = n.x(0)
    kernel = _kernel_shape(n)
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


# Lp pools: the sum of |x|^p over each window, to the power 1/p
def _abs_pow(x: popxl.Tensor, p: int) -> popxl.Tensor:
    return ops.abs(x) if p == 1 else ops.mul(x, x) if p == 2 else ops.pow(ops.abs(x), _scalar(float(p), x))


def _root(x: popxl.Tensor, p: int) -> popxl.Tensor:
    return x if p == 1 else ops.sqrt(x) if p == 2 else ops.pow(x, _scalar(1.0 / p, x))


def _p(n: Node) -> int:
    p = int(n.attr("p", 2))
    if p < 1:
        raise n.fail(f"p must be a positive integer, got {p}")
    return p



# Not computed at import: ONNX's reference has no implementation (constant inputs run on the device).
@onnx_op("GlobalLpPool", foldable=False)
def _global_lp_pool(n: Node) -> List[Value]:
    x, p = n.x(0), _p(n)
    return [_root(ops.sum(_abs_pow(x, p), list(range(2, x.rank)), keepdims=True), p)]


def _window_sum(x: popxl.Tensor, kernel: Sequence[int], **window) -> popxl.Tensor:
    """The sum over each pooling window of every channel: a depthwise convolution with ones, whose
    zero padding adds nothing."""
    c = x.shape[1]
    ones = popxl.constant(np.ones((c, 1) + tuple(kernel), x.dtype.as_numpy()))
    return ops.conv(x, ones, groups=c, **window)


@onnx_op("LpPool")
def _lp_pool(n: Node) -> List[Value]:
    x, p = n.x(0), _p(n)
    kernel = _kernel_shape(n)
    rank = len(kernel)
    if x.rank != rank + 2:
        raise n.fail(f"a {rank}-D kernel needs a rank-{rank + 2} input, got shape {x.shape}")
    kw = _window_attrs(n, rank)
    if n.attr("ceil_mode", 0) and kw["pad_type"] == "not_set":
        # the windows a ceil-mode pool adds at the end read only padding beyond the input: more
        # end padding (zeros, which add nothing) gives the convolution those windows
        pads = list(kw["padding"])
        for i in range(rank):
            eff = (kernel[i] - 1) * kw["dilation"][i] + 1
            want = _ceil_pool_len(x.shape[2 + i], kernel[i], kw["stride"][i], kw["dilation"][i], pads[i],
                                  pads[rank + i])
            pads[rank + i] += max(0, (want - 1) * kw["stride"][i] + eff - (x.shape[2 + i] + pads[i] + pads[rank + i]))
        kw["padding"] = tuple(pads)
    return [_root(_window_sum(_abs_pow(x, p), kernel, **kw), p)]



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
    if x.rank < 2:
        raise n.fail(f"the input must be (N, C, ...), got shape {x.shape}")
    y, _, _ = _standardise(x, range(2, x.rank), float(n.attr("epsilon", 1e-5)), n)
    return [ops.add(ops.mul(y, _per_channel(n.x(1), x.rank)), _per_channel(n.x(2), x.rank))]


# Not computed at import: ONNX's reference fails on its opset-21 form (constant inputs run on the device).
@onnx_op("GroupNormalization", foldable=False)
def _group_norm(n: Node) -> List[Value]:
    x = n.x(0)
    groups = int(n.attr("num_groups"))
    if x.rank < 2 or groups < 1:
        raise n.fail(f"the input must be (N, C, ...) and num_groups positive, got shape {x.shape}, {groups} groups")
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
        ratio = n.static_float(1, "ratio") if n.opset >= 12 and n.has(1) else float(n.attr("ratio", 0.5))
        if ratio == 0.0:
            return [x, np.ones(x.shape, np.bool_)]
        return [ops.dropout(x, n.imp.random.split(), ratio), None]
    if training is not None and bool(training):
        raise n.fail("training_mode=true is not supported by an inference session")
    # Inference: the identity, and a mask of all ones.
    return [x, np.ones(x.shape, np.bool_)]


@onnx_op("LpNormalization")
def _lp_normalization(n: Node) -> List[Value]:
    x = n.x(0)
    p = _p(n)
    if p not in (1, 2):
        raise n.fail(f"p must be 1 or 2, got {p}")
    axis = _axis(int(n.attr("axis", -1)), x.rank, n)
    norm = _root(ops.sum(_abs_pow(x, p), [axis], keepdims=True), p)
    zero = _scalar(0.0, x)
    # an all-zero line stays zero (its norm is 0; the division's NaN is not selected)
    return [ops.where(ops.equal(norm, zero), zero, ops.div(x, norm))]



@onnx_op("LRN")
def _lrn(n: Node) -> List[Value]:
    x = n.x(0)
    size = n.attr("size")
    if size is None or int(size) < 1:
        raise n.fail(f"size must be a positive integer, got {size}")
    size = int(size)
    if x.rank < 2:
        raise n.fail(f"needs an (N, C, ...) input, got shape {x.shape}")
    alpha, beta, bias = float(n.attr("alpha", 1e-4)), float(n.attr("beta", 0.75)), float(n.attr("bias", 1.0))
    # The channel window [c - (size - 1) // 2, c + ceil((size - 1) / 2)]: channels as the one
    # spatial axis of a window sum, the other axes flattened beside them.
    lead, c = x.shape[:2]
    rest = _prod(x.shape[2:])
    sq = ops.reshape(ops.mul(x, x), (lead, 1, c, rest))
    lo, hi = (size - 1) // 2, size // 2
    ss = ops.reshape(_window_sum(sq, (size, 1), padding=(lo, 0, hi, 0)), x.shape)
    scale = ops.add(_scalar(bias, x), ops.mul(_scalar(alpha / size, x), ss))
    return [ops.div(x, ops.pow(scale, _scalar(beta, x)))]


@onnx_op("MeanVarianceNormalization")
def _mean_variance_normalization(n: Node) -> List[Value]:
    x = n.x(0)
    axes = sorted({_axis(a, x.rank, n, "axes") for a in n.ints("axes", [0, 2, 3])})
    centred = ops.sub(x, ops.mean(x, axes, keepdims=True))
    std = ops.sqrt(ops.mean(ops.mul(centred, centred), axes, keepdims=True))
    return [ops.div(centred, ops.add(std, _scalar(1e-9, x)))]



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
    axes = _ints_arg(n, "axes", 13 if n.op_type == "ReduceSum" else 18)
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
        hit = ops.greater(count, _i32(0))
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
    return [np.asarray(_prod(n.shape(0)), np.int64)]


def _import_time_only(n: Node) -> List[Value]:
    # Reached only when an input is computed on the device: the importer folds the static case.
    raise n.fail("its inputs must be known at import (constants, initializers or shapes)")


for _t in ("Constant", "ConstantOfShape", "Range"):
    OPS[_t] = Entry(_import_time_only)


@onnx_op("Reshape")
def _reshape(n: Node) -> List[Value]:
    x = n.x(0)
    shape = n.static_ints(1, "shape")
    allowzero = n.opset >= 14 and n.attr("allowzero", 0)
    if not allowzero:
        if any(d == 0 and i >= x.rank for i, d in enumerate(shape)):
            raise n.fail(f"shape {shape} copies (0) a dimension beyond the input's rank {x.rank}")
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if shape.count(-1) > 1:
        raise n.fail(f"shape {shape} has more than one -1")
    if -1 in shape:
        known = _prod([d for d in shape if d != -1])
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
    lead = _prod(x.shape[:axis])
    return [ops.reshape(x, (lead, _prod(x.shape[axis:])))]


def _unsqueezed_shape(shape: Sequence[int], axes: Sequence[int], n: Node) -> Tuple[int, ...]:
    out_rank = len(shape) + len(axes)
    axes = sorted(_axis(a, out_rank, n, "axes") for a in axes)
    if len(set(axes)) != len(axes):
        raise n.fail(f"axes {axes} repeat an axis")
    dims = iter(shape)
    return tuple(1 if i in axes else next(dims) for i in range(out_rank))


def _ints_arg(n: Node, name: str, since_opset: int) -> Optional[List[int]]:
    """Ints (axes, split lengths) given as attribute ``name`` before ``since_opset`` and as input 1
    from then on."""
    return n.optional_static_ints(1, name) if n.opset >= since_opset else n.ints(name)


@onnx_op("Unsqueeze")
def _unsqueeze(n: Node) -> List[Value]:
    x = n.x(0)
    axes = _ints_arg(n, "axes", 13)
    if axes is None:
        raise n.fail("axes are required")
    return [ops.reshape(x, _unsqueezed_shape(x.shape, axes, n))]


@onnx_op("Squeeze")
def _squeeze(n: Node) -> List[Value]:
    x = n.x(0)
    axes = _ints_arg(n, "axes", 13)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {_axis(a, x.rank, n, "axes", scalar_axis=False) for a in axes}
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
    if len({x.rank for x in xs}) > 1:
        raise n.fail(f"inputs must have one rank, got shapes {[tuple(x.shape) for x in xs]}")
    axis = _axis(int(n.attr("axis")), xs[0].rank, n, scalar_axis=False)
    xs = [x for x in xs if x.shape[axis] != 0] or xs[:1]
    return [ops.concat(xs, axis) if len(xs) > 1 else xs[0]]


@onnx_op("Split")
def _split(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n, scalar_axis=False)
    d = x.shape[axis]
    split = _ints_arg(n, "split", 13)
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
    starts, ends = n.static_ints(1, "starts"), n.static_ints(2, "ends")
    axes = n.optional_static_ints(3, "axes")
    axes = list(range(len(starts))) if axes is None else [_axis(a, x.rank, n, "axes") for a in axes]
    steps = n.optional_static_ints(4, "steps")
    steps = [1] * len(starts) if steps is None else steps
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
    shape = tuple(n.static_ints(1, "shape"))
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
    repeats = n.static_ints(1, "repeats")
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


def _pad_steps(n: Node, shape: Sequence[int], pads: Sequence[int],
               mode: str) -> Iterator[Tuple[int, np.ndarray, Optional[np.ndarray]]]:
    """Padding axis by axis: for each padded axis, the positions to take along it and, in constant
    mode, where the taken values stand (a mask that broadcasts; None if every position does)."""
    r = len(shape)
    for a in range(r):
        before, after = int(pads[a]), int(pads[a + r])
        if before == 0 and after == 0:
            continue
        d = shape[a]
        if d == 0 and mode != "constant":
            raise n.fail(f"cannot {mode}-pad the empty axis {a}")
        index = _pad_index(d, before, after, mode)
        inside = (index >= 0) & (index < d)
        mask = inside.reshape([1] * a + [len(index)] + [1] * (r - a - 1)) if mode == "constant" else None
        yield a, np.clip(index, 0, max(d - 1, 0)), None if mask is None or mask.all() else mask


def _pad_tensor(x: popxl.Tensor, pads: Sequence[int], mode: str, value: Union[float, popxl.Tensor],
                n: Node) -> popxl.Tensor:
    """Pad ``x``; ``value`` (constant mode) is a number or a scalar tensor computed on the device."""
    y = x
    for a, positions, inside in _pad_steps(n, x.shape, pads, mode):
        y = _repeat_axis(y, a, positions)
        if inside is not None:
            fill = value if isinstance(value, popxl.Tensor) else n.scalar(value, y)
            y = ops.where(popxl.constant(inside), y, fill)
    return y


def _pad_args(n: Node, rank: int) -> Tuple[List[int], str]:
    """Pad's mode and its pads, [begin of every axis..., end of every axis...], for an input of
    ``rank`` (from opset 18 the pads may name some axes only)."""
    mode = n.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise n.fail(f"unknown mode {mode!r}")
    pads = n.static_ints(1, "pads")
    axes = n.optional_static_ints(3, "axes") if n.opset >= 18 else None
    if axes is not None:
        axes = [_axis(a, rank, n, "axes") for a in axes]
        if len(pads) != 2 * len(axes):
            raise n.fail(f"pads {pads} must have {2 * len(axes)} entries for axes {axes}")
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        raise n.fail(f"pads {pads} must have {2 * rank} entries for rank {rank}")
    return pads, mode


@onnx_op("Pad")
def _pad(n: Node) -> List[Value]:
    x = n.x(0)
    pads, mode = _pad_args(n, x.rank)
    if n.has(2) and n.imp.static(n.proto.input[2]) is None:
        # The pad value is computed on the device: a scalar tensor (it does not change any shape).
        v = n.x(2)
        value = ops.reshape(v if v.dtype == x.dtype else ops.cast(v, x.dtype), ())
    else:
        value = n.optional_static(2, "constant_value")
        value = 0.0 if value is None or value.size == 0 else value.reshape(-1)[0].item()
    return [_pad_tensor(x, pads, mode, value, n)]


@onnx_fold("Pad")
def _pad_at_import(n: Node, x: np.ndarray, *rest: Optional[np.ndarray]) -> List[np.ndarray]:
    # The positions the device takes (``_pad_index``); ONNX's reference refuses negative pads (crops).
    pads, mode = _pad_args(n, x.ndim)
    value = n.optional_static(2, "constant_value")
    fill = np.zeros((), x.dtype) if value is None or value.size == 0 else value.reshape(-1)[0].astype(x.dtype)
    y = x
    for a, positions, inside in _pad_steps(n, x.shape, pads, mode):
        y = np.take(y, positions, a) if y.shape[a] else \
            np.zeros(y.shape[:a] + positions.shape + y.shape[a + 1:], x.dtype)
        if inside is not None:
            y = np.where(inside, y, fill)
    return [np.asarray(y, x.dtype)]


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
    sizes = n.optional_static_ints(3, "sizes")
    if scales is not None and scales.size == 0:
        scales = None
    if scales is not None and not np.all(np.isfinite(scales) & (scales > 0)):
        raise n.fail(f"scales {scales.tolist()} must be finite and positive")
    if (scales is None) == (sizes is None):
        raise n.fail("exactly one of scales and sizes must be given")
    factor = [1.0] * x.rank
    want = list(x.shape)
    if scales is not None:
        for a, s in zip(axes, scales.reshape(-1)):
            factor[a] = float(s)
            want[a] = int(math.floor(x.shape[a] * float(s)))
    else:
        for a, s in zip(axes, sizes):
            want[a] = s
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


def _shift_in(x: popxl.Tensor, axis: int, k: int, fill: float) -> popxl.Tensor:
    """``x`` moved ``k`` places up ``axis``, the first ``k`` positions holding ``fill``."""
    length = x.shape[axis]
    k = min(k, length)
    head = popxl.constant(np.full(x.shape[:axis] + (k,) + x.shape[axis + 1:], fill, x.dtype.as_numpy()))
    if k == length:
        return head
    return ops.concat([head, ops.slice(x, start=[0], stop=[length - k], axis=[axis])], axis)


def _cumprod(x: popxl.Tensor, axis: int) -> popxl.Tensor:
    # log2(n) rounds of multiplying by the partial products 1, 2, 4 ... places back (popxl has no
    # cumulative product; log/exp would fail on zeros and negative values).
    y, step = x, 1
    while step < x.shape[axis]:
        y = ops.mul(y, _shift_in(y, axis, step, 1))
        step *= 2
    return y


@onnx_op("CumSum", "CumProd")
def _cumulative(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(n.static_int(1, "axis"), x.rank, n)
    flip = np.arange(x.shape[axis] - 1, -1, -1)
    reverse = bool(n.attr("reverse", 0))
    product = n.op_type == "CumProd"
    y = _repeat_axis(x, axis, flip) if reverse else x
    if n.attr("exclusive", 0):  # each position sees only those before it: shift the identity in
        y = _shift_in(y, axis, 1, 1 if product else 0)
    y = _cumprod(y, axis) if product else ops.cumsum(y, axis)
    return [_repeat_axis(y, axis, flip) if reverse else y]


@onnx_fold("CumSum", "CumProd")
def _cumulative_at_import(n: Node, x: np.ndarray, axis: np.ndarray) -> List[np.ndarray]:
    # ONNX's reference CumSum refuses the one-element 1-D axis the entry (and ONNX Runtime) take.
    axis = _axis(n.static_int(1, "axis"), x.ndim, n)
    y = np.flip(x, axis) if n.attr("reverse", 0) else x
    identity = 1 if n.op_type == "CumProd" else 0
    if n.attr("exclusive", 0) and y.shape[axis]:  # each position sees only those before it
        first = np.full_like(np.take(y, [0], axis), identity)
        y = np.concatenate([first, np.delete(y, -1, axis)], axis)
    y = (np.cumprod if identity else np.cumsum)(y, axis, dtype=x.dtype)
    return [np.flip(y, axis) if n.attr("reverse", 0) else y]


@onnx_op("TopK")
def _topk(n: Node) -> List[Value]:
    x = n.x(0)
    k = n.static_int(1, "K")
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


def _round_half_even(x: popxl.Tensor) -> popxl.Tensor:
    # floor(x + 0.5), minus one where that rounded a tie up to an odd value.
    half = _scalar(0.5, x)
    r = ops.floor(ops.add(x, half))
    tie = ops.equal(ops.sub(r, x), half)
    odd = ops.logical_not(ops.equal(ops.fmod(r, _scalar(2.0, x)), _scalar(0.0, x)))
    return ops.where(ops.logical_and(tie, odd), ops.sub(r, _scalar(1.0, x)), r)


@onnx_op("Round")
def _round(n: Node) -> List[Value]:
    return [_round_half_even(n.x(0))]


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
    k = n.static_int(1, "k") if n.has(1) else 0
    keep = np.ones((rows, cols), np.bool_)
    keep = np.triu(keep, k) if upper else np.tril(keep, k)
    return [ops.where(popxl.constant(keep), x, n.scalar(0, x))]


@onnx_op("OneHot")
def _onehot(n: Node) -> List[Value]:
    indices = n.x(0)
    depth = n.static_int(1, "depth")
    values = n.x(2)
    axis = int(n.attr("axis", -1))
    if indices.dtype.is_floating_point:  # ONNX allows float indices; they are truncated
        indices = ops.cast(indices, dtypes.int32)
    return [ops.onehot(indices, popxl.constant(np.asarray(depth, np.int32)), values, axis)]


# indexing: gathers and scatters on a flattened view of the data -----------------------------------
# Every index (tuple) becomes a flat row number, so one popxl gather / scatter_reduce along axis 0
# does the work whatever the ranks involved.
def _wrap_negative(idx: popxl.Tensor, dims: np.ndarray) -> popxl.Tensor:
    """Negative indices counted from the end: idx + dims where idx < 0 (``dims`` broadcasts)."""
    return ops.where(_less(idx, _i32(0)), ops.add(idx, _i32(dims)), idx)


def _wrapped_indices(n: Node, idx: np.ndarray, dims: np.ndarray, what: str) -> np.ndarray:
    """Indices known at import (into axes of lengths ``dims``, which broadcasts) as int64 with
    negative values counted from the end; an index outside [-dim, dim) is an error."""
    idx = np.asarray(idx).astype(np.int64)
    if idx.size and ((idx < -dims).any() or (idx >= dims).any()):
        raise n.fail(f"{what} out of range for axes of lengths {np.asarray(dims).tolist()}")
    return np.where(idx < 0, idx + dims, idx)


def _index_input(n: Node, i: int, dims: np.ndarray, what: str) -> popxl.Tensor:
    """Input ``i`` (indices into axes of lengths ``dims``, broadcasting over its trailing axis) as
    int32 with negative values wrapped; checked against the range when known at import."""
    static = n.imp.static(n.proto.input[i]) if n.has(i) else None
    if static is None:
        return _wrap_negative(_as_int32(n.x(i)), dims)
    return _i32(_wrapped_indices(n, static, dims, what))


def _nd_rows(n: Node, data_shape: Tuple[int, ...], batch_dims: int) -> Tuple[popxl.Tensor, int]:
    """GatherND/ScatterND: the flat row of ``data`` viewed as [rows, slice] that each index tuple of
    input 1 names (shape ``indices.shape[:-1]``), and k, the tuple length. Rows count the batch
    dimensions first, then the k indexed dimensions."""
    ishape = n.shape(1)
    b = batch_dims
    if len(ishape) < 1 or not 0 <= b < min(len(ishape), len(data_shape)):
        raise n.fail(f"batch_dims {b} must be below the ranks of data {data_shape} and indices {ishape}")
    if tuple(ishape[:b]) != tuple(data_shape[:b]):
        raise n.fail(f"the first {b} dimensions of indices {ishape} and data {data_shape} must be equal")
    k = ishape[-1]
    if not 1 <= k <= len(data_shape) - b:
        raise n.fail(f"indices.shape[-1] = {k} must be between 1 and {len(data_shape) - b} for data {data_shape}")
    dims = np.asarray(data_shape[b:b + k], np.int64)
    idx = _index_input(n, 1, dims, "indices")
    rows = ops.sum(ops.mul(idx, _i32(_strides(dims))), [-1]) if k > 1 else ops.reshape(idx, tuple(ishape[:-1]))
    if b:
        # Each index tuple stays inside its batch: add the batch's first row.
        batch = np.indices(ishape[:-1])[:b]
        first = sum(int(s) * g for s, g in zip(_strides(data_shape[:b]), batch)) * _prod(dims)
        rows = ops.add(rows, _i32(first))
    return rows, k


def _element_positions(idx: popxl.Tensor, data_shape: Tuple[int, ...], axis: int,
                       grid_shape: Tuple[int, ...]) -> popxl.Tensor:
    """GatherElements-style flat positions into ``data``: the coordinates of each place of
    ``grid_shape`` with the ``axis`` coordinate replaced by ``idx`` (which broadcasts to
    ``grid_shape`` and is already wrapped to non-negative values)."""
    strides = _strides(data_shape)
    grid = np.indices(grid_shape)
    base = sum((int(strides[a]) * grid[a] for a in range(len(data_shape)) if a != axis),
               np.zeros(grid_shape, np.int64))
    return ops.add(_i32(base), ops.mul(idx, _i32(strides[axis])))


# Reductions by opset: ONNX added add/mul at opset 16 and max/min at 18.
_SCATTER_REDUCTION = {"none": "none", "add": "sum", "mul": "mul", "max": "max", "min": "min"}


def _scatter_reduction(n: Node) -> str:
    r = n.attr("reduction", "none")
    allowed = ["none"] + (["add", "mul"] if n.opset >= 16 else []) + (["max", "min"] if n.opset >= 18 else [])
    if r not in allowed:
        raise n.fail(f"reduction must be one of {allowed} at opset {n.opset}, got {r!r}")
    return _SCATTER_REDUCTION[r]


def _scatter_rows(data: popxl.Tensor, rows: popxl.Tensor, updates: popxl.Tensor, reduction: str) -> popxl.Tensor:
    """Scatter ``updates`` [U, S] into the rows ``rows`` [U] of ``data`` [R, S] with ``reduction``
    ("none", "sum", "mul", "max", "min"); returns the new [R, S]."""
    if data.dtype == dtypes.bool:  # scatter_reduce works on numbers: round-trip through int32
        y = _scatter_rows(ops.cast(data, dtypes.int32), rows, ops.cast(updates, dtypes.int32), reduction)
        return ops.cast(y, dtypes.bool)
    if reduction == "mul":
        # No multiplying scatter in popxl: give every update the product of all updates aimed at its
        # row (a [U, U] same-row mask; O(U^2 S) work), multiply the row by it, then write it back.
        # Updates sharing a row write the same value, so the plain write is well defined.
        u = rows.shape[0]
        same = ops.equal(ops.reshape(rows, (u, 1, 1)), ops.reshape(rows, (1, u, 1)))
        ones = popxl.constant(np.ones((), updates.dtype.as_numpy()))
        factor = ops.prod(ops.where(same, ops.reshape(updates, (1,) + updates.shape), ones), [1])
        updates, reduction = ops.mul(ops.gather(data, rows, 0), factor), "none"
    return ops.scatter_reduce(updates, rows, reduction, initial_values=data, axis=0)


# GatherND / ScatterND ---------------------------------------------------------------------------------
@onnx_op("GatherND")
def _gather_nd(n: Node) -> List[Value]:
    x = n.x(0)
    b = int(n.attr("batch_dims", 0)) if n.opset >= 12 else 0
    rows, k = _nd_rows(n, x.shape, b)
    tail = x.shape[b + k:]
    y = ops.gather(ops.reshape(x, (_prod(x.shape[:b + k]), _prod(tail))), rows, 0)
    return [ops.reshape(y, tuple(n.shape(1)[:-1]) + tuple(tail))]


@onnx_op("ScatterND")
def _scatter_nd(n: Node) -> List[Value]:
    x, upd = n.x(0), n.x(2)
    reduction = _scatter_reduction(n)
    rows, k = _nd_rows(n, x.shape, 0)
    want = tuple(n.shape(1)[:-1]) + tuple(x.shape[k:])
    if tuple(upd.shape) != want:
        raise n.fail(f"updates have shape {upd.shape}, expected indices.shape[:-1] + data.shape[k:] = {want}")
    r, s, u = _prod(x.shape[:k]), _prod(x.shape[k:]), _prod(n.shape(1)[:-1])
    y = _scatter_rows(ops.reshape(x, (r, s)), ops.reshape(rows, (u,)), ops.reshape(upd, (u, s)), reduction)
    return [ops.reshape(y, x.shape)]


# ScatterElements / ReverseSequence -------------------------------------------------------------------
@onnx_op("ScatterElements")
def _scatter_elements(n: Node) -> List[Value]:
    x, upd = n.x(0), n.x(2)
    reduction = _scatter_reduction(n)
    axis = _axis(int(n.attr("axis", 0)), x.rank, n, scalar_axis=False)
    ishape = n.shape(1)
    if len(ishape) != x.rank or tuple(upd.shape) != tuple(ishape):
        raise n.fail(f"indices {ishape} and updates {upd.shape} must have one shape, of the rank of data {x.shape}")
    if any(i > d for i, d in zip(ishape, x.shape)):
        raise n.fail(f"indices {ishape} may not be larger than data {x.shape} in any dimension")
    idx = _index_input(n, 1, np.asarray(x.shape[axis], np.int64), "indices")
    flat = ops.reshape(_element_positions(idx, x.shape, axis, tuple(ishape)), (_prod(ishape),))
    y = _scatter_rows(ops.reshape(x, (x.nelms, 1)), flat, ops.reshape(upd, (_prod(ishape), 1)), reduction)
    return [ops.reshape(y, x.shape)]


@onnx_op("ReverseSequence")
def _reverse_sequence(n: Node) -> List[Value]:
    x = n.x(0)
    t_axis, b_axis = int(n.attr("time_axis", 0)), int(n.attr("batch_axis", 1))
    if x.rank < 2 or {t_axis, b_axis} != {0, 1}:
        raise n.fail(f"needs rank >= 2 and time_axis/batch_axis 0 and 1 (one each), got {t_axis}/{b_axis} "
                     f"for shape {x.shape}")
    t, b = x.shape[t_axis], x.shape[b_axis]
    if tuple(n.shape(1)) != (b,):
        raise n.fail(f"sequence_lens must have shape ({b},), got {n.shape(1)}")

    def along(axis: int, v: popxl.Tensor) -> popxl.Tensor:  # v laid along ``axis`` of x's rank
        return ops.reshape(v, tuple(v.nelms if a == axis else 1 for a in range(x.rank)))

    lens = along(b_axis, _as_int32(n.x(1)))
    time = along(t_axis, _i32(np.arange(t)))
    # Time step i of a sequence of length L reads step L - 1 - i while i < L, else itself.
    src = ops.where(_less(time, lens), ops.sub(ops.sub(lens, _i32(1)), time), time)
    flat = _element_positions(src, x.shape, t_axis, x.shape)
    return [ops.gather(ops.reshape(x, (x.nelms,)), flat, 0)]


# EyeLike / CenterCropPad / Hardmax / Compress ----------------------------------------------------------
@onnx_op("EyeLike")
def _eye_like(n: Node) -> List[Value]:
    shape = n.shape(0)
    if len(shape) != 2:
        raise n.fail(f"needs a 2-D input, got shape {shape}")
    if n.attr("dtype") is not None:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(n.attr("dtype"))))
    else:
        static = n.imp.static(n.proto.input[0])
        dt = static.dtype if static is not None else np.dtype(n.x(0).dtype.as_numpy())
    # Only the input's shape matters, which is known at import: the result is a constant.
    return [np.eye(shape[0], shape[1], int(n.attr("k", 0)), dtype=dt)]


@onnx_op("CenterCropPad")
def _center_crop_pad(n: Node) -> List[Value]:
    x = n.x(0)
    target = n.static_ints(1, "shape")
    axes = n.ints("axes", list(range(x.rank)))
    axes = [_axis(a, x.rank, n, "axes") for a in axes]
    if len(set(axes)) != len(axes) or len(target) != len(axes) or any(v < 0 for v in target):
        raise n.fail(f"shape {target} must hold one non-negative length per axis of {axes}")
    starts, stops, pads = [], [], [0] * (2 * x.rank)
    for a, want in zip(axes, target):
        d = x.shape[a]
        if want <= d:  # crop: the window starts at floor((d - want) / 2)
            starts.append((d - want) // 2)
            stops.append((d - want) // 2 + want)
        else:  # pad: an odd extra element goes after
            starts.append(0)
            stops.append(d)
            pads[a], pads[a + x.rank] = (want - d) // 2, (want - d + 1) // 2
    y = ops.slice(x, start=starts, stop=stops, axis=axes) if axes else x
    return [_pad_tensor(y, pads, "constant", 0, n) if any(pads) else y]


def _hardmax_along(x: popxl.Tensor, axis: int) -> popxl.Tensor:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    on_off = popxl.constant(np.asarray([0, 1], x.dtype.as_numpy()))
    return ops.onehot(ops.argmax(x, axis, False), _i32(x.shape[axis]), on_off, axis)


@onnx_op("Hardmax")
def _hardmax(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank == 0:
        raise n.fail("needs a tensor of rank >= 1")
    view, axis = _softmax_view(n, x.shape)
    return [ops.reshape(_hardmax_along(ops.reshape(x, view), axis), x.shape)]


@onnx_fold("Softmax", "LogSoftmax", "Hardmax")
def _softmax_at_import(n: Node, x: np.ndarray) -> List[np.ndarray]:
    # ONNX's reference implementations know only opset 13's form (no 2-D view before it).
    if x.ndim == 0:
        raise n.fail("needs a tensor of rank >= 1")
    view, axis = _softmax_view(n, x.shape)
    v = x.reshape(view)
    if n.op_type == "Hardmax":  # 1 at the first maximum
        y = (np.arange(v.shape[axis]).reshape([-1 if a == axis else 1 for a in range(v.ndim)])
             == np.expand_dims(np.argmax(v, axis), axis)).astype(x.dtype)
        return [y.reshape(x.shape)]
    # float16 is computed in float32 and rounded once, as on the device
    shifted = v.astype(np.promote_types(x.dtype, np.float32)) - np.max(v, axis, keepdims=True)
    total = np.sum(np.exp(shifted), axis, keepdims=True)
    y = np.exp(shifted) / total if n.op_type == "Softmax" else shifted - np.log(total)
    return [y.astype(x.dtype).reshape(x.shape)]


@onnx_op("Compress")
def _compress(n: Node) -> List[Value]:
    x = n.x(0)
    cond = np.asarray(n.static(1, "condition"))
    if cond.ndim != 1:
        raise n.fail(f"condition must be 1-D, got shape {cond.shape}")
    axis: Optional[int] = n.attr("axis")
    if axis is None:  # no axis: select from the flattened input
        x, axis = ops.reshape(x, (x.nelms,)), 0
    axis = _axis(int(axis), x.rank, n)
    keep = np.flatnonzero(cond.astype(bool))
    if keep.size and keep[-1] >= x.shape[axis]:
        raise n.fail(f"condition selects index {int(keep[-1])}, beyond the length {x.shape[axis]} of axis {axis}")
    return [ops.gather(x, _i32(keep), axis)]


def _gather_elements_axis(n: Node, data_shape: Tuple[int, ...], idx_shape: Tuple[int, ...]) -> int:
    """GatherElements' axis, checked with the shapes: indices of data's rank, no longer than data
    along the other axes (the output takes the indices' shape)."""
    if len(idx_shape) != len(data_shape):
        raise n.fail(f"indices rank {len(idx_shape)} differs from data rank {len(data_shape)}")
    axis = _axis(int(n.attr("axis", 0)), len(data_shape), n, scalar_axis=False)
    if any(i > d for a, (i, d) in enumerate(zip(idx_shape, data_shape)) if a != axis):
        raise n.fail(f"indices {tuple(idx_shape)} may not be longer than data {tuple(data_shape)} in an axis "
                     f"other than {axis}")
    return axis


@onnx_op("GatherElements")
def _gather_elements(n: Node) -> List[Value]:
    x, idx = n.x(0), n.x(1)
    axis = _gather_elements_axis(n, x.shape, idx.shape)
    idx = _index_input(n, 1, np.asarray(x.shape[axis], np.int64), "indices")
    return [ops.gather(ops.reshape(x, (x.nelms,)), _element_positions(idx, x.shape, axis, idx.shape), 0)]


@onnx_fold("GatherElements")
def _gather_elements_at_import(n: Node, data: np.ndarray, indices: np.ndarray) -> List[np.ndarray]:
    # ONNX's reference implementation picks with np.choose, which takes at most 32/64 choices (the
    # length of the axis): longer axes fell back to a path that read one index per row.
    axis = _gather_elements_axis(n, data.shape, indices.shape)
    idx = _wrapped_indices(n, indices, np.asarray(data.shape[axis], np.int64), "indices")
    # The output has the indices' shape: data is cut to it along the other axes.
    region = data[tuple(slice(None) if a == axis else slice(0, k) for a, k in enumerate(idx.shape))]
    return [np.take_along_axis(region, idx, axis)]


# random numbers ------------------------------------------------------------------------------------
# Never folded (their results are not known at import). With a `seed` attribute the values are
# the same every run (a constant seed from it, as ONNX Runtime does); without one they come from
# the session's seed (setRandomSeed), fresh each step.
RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli")


def _random_seed(n: Node) -> popxl.Tensor:
    seed = n.attr("seed")
    if seed is not None:
        s = int(np.float64(seed).view(np.uint64))  # every float seed its own stream
        return popxl.constant(np.array([s & 0xFFFFFFFF, s >> 32], np.uint32))
    if n.imp.random is None:
        # the session's seed reaches the top-level graph only
        raise n.fail("a random op without a seed attribute inside an If/Loop/Scan body is not supported; "
                     "give it a seed attribute")
    return n.imp.random.split()


@onnx_op(*RANDOM_OPS, foldable=False)
def _random(n: Node) -> List[Value]:
    like = n.op_type.endswith("Like") or n.op_type == "Bernoulli"
    if not like and n.ints("shape") is None:
        raise n.fail("the shape attribute is required")
    shape = tuple(n.shape(0)) if like else tuple(n.ints("shape"))
    code = n.attr("dtype")
    out = _popxl_dtype_of_onnx(code) if code is not None else n.x(0).dtype if like else dtypes.float32
    draw = out if out in (dtypes.float16, dtypes.float32) else dtypes.float32
    seed = _random_seed(n)
    if n.op_type == "Bernoulli":  # 1 with the input's probability: u < p for u uniform in [0, 1)
        p = n.x(0)
        u = ops.random_uniform(seed, shape, 0.0, 1.0, p.dtype if p.dtype == dtypes.float16 else dtypes.float32)
        return [ops.cast(_less(u, _cast_to(n, p, u.dtype)), out)]
    if "Normal" in n.op_type:
        y = ops.random_normal(seed, shape, float(n.attr("mean", 0.0)), float(n.attr("scale", 1.0)), draw)
    else:
        y = ops.random_uniform(seed, shape, float(n.attr("low", 0.0)), float(n.attr("high", 1.0)), draw)
    return [y if draw == out else ops.cast(y, out)]


# The entries of the other modules register into OPS when imported: control-flow, recurrent,
# signal and sampling ops, and PopART's own domain.
from popart.onnx import control, graphcore, recurrent, sampling, signal  # noqa: E402,F401
