"""ONNX entries of the elementwise ops: unary and binary arithmetic, comparisons and logic, the
activations with attributes (also read by the recurrent ops), casts, inverse and hyperbolic
trigonometry, bit operations, rounding and the linear quantization ops."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes
from popxl.op import create_op
from popxl.ops.elementwise import erf as elementwise_erf  # an internal op (not PopXL API)
from popxl.ops.elementwise import sigmoid  # popxl's own sigmoid op (popxl.ops does not name it)
from popart.onnx.table import Node, Value, _axis, _i32, _popxl_dtype_of_onnx, _scalar, onnx_fold, onnx_op

__all__: List[str] = []


# elementwise ------------------------------------------------------------------------------------------
def _poly(x: popxl.Tensor, coefficients: Sequence[float]) -> popxl.Tensor:
    """c0 + c1 x + c2 x^2 + ... by Horner's rule."""
    y = _scalar(coefficients[-1], x)
    for c in reversed(coefficients[:-1]):
        y = ops.add(ops.mul(y, x), _scalar(c, x))
    return y


def _reciprocal(x: popxl.Tensor) -> popxl.Tensor:
    return ops.div(popxl.constant(np.ones((), x.dtype.as_numpy())), x)


_UNARY: Dict[str, Callable[[popxl.Tensor], popxl.Tensor]] = {
    "Relu": ops.relu, "Tanh": ops.tanh, "Sqrt": ops.sqrt, "Exp": ops.exp, "Log": ops.log, "Neg": ops.negate,
    "Abs": ops.abs, "Sin": ops.sin, "Cos": ops.cos, "Ceil": ops.ceil, "Floor": ops.floor, "Sign": ops.sign,
    "Not": ops.logical_not, "IsNaN": ops.isnan, "Sigmoid": sigmoid, "Erf": elementwise_erf, "Reciprocal": _reciprocal,
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
    if n.op_type == "Min":
        y = xs[0]
        for x in xs[1:]:
            y = _minimum(y, x)
    elif len(xs) > 2:  # popxl's N-ary sum (made by name) adds left to right, as a chain of adds would
        y = create_op("add_n", xs)[0]
    else:
        y = ops.add(*xs) if len(xs) == 2 else xs[0]
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
