"""Elementwise ops: unary math, binary arithmetic with NumPy broadcasting, comparisons, logic,
casts and identities. Each op is declared once; in-place variants (``name_``) share the rule
and kernel of their op and write into their first input.

Longer than ~800 lines for a reason: half of it (~640 lines) is the Args / Returns / Raises
docstrings of its ~45 public ops, which editors and help() read from each def; the code is ~650."""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Union

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import as_tensor, broadcast_shapes, convert, same_dtype, spec
from popxl.tensor import Tensor, TensorSpec

__all__ = ["abs", "add", "add_", "cast", "ceil", "clamp", "clip", "cos", "detach", "detach_", "div", "equal", "exp", "exp_", "fmod", "gelu", "gelu_", "geluerf", "geluerf_", "greater", "identity", "isfinite", "isinf", "isnan", "log", "logical_and", "logical_not", "logical_or", "maximum", "mul", "negate", "pow", "relu", "relu_", "rename", "scaled_add", "scaled_add_", "sign", "sin", "sqrt", "sub", "swish", "swish_", "tanh", "where"]

_FLOAT, _SIGNED, _NUMERIC, _INT, _ANY = "float", "signed", "numeric", "int", "any"


def _check_kind(s: TensorSpec, kind: str) -> None:
    dt = s.dtype
    ok = {
        _FLOAT: dt.is_floating_point,
        _SIGNED: dt.is_floating_point or (dt.is_int and dt.is_signed),
        _NUMERIC: dt.is_floating_point or dt.is_int,
        _INT: dt.is_int,
        _ANY: True,
    }[kind]
    if not ok:
        need = {_FLOAT: "a floating point", _SIGNED: "a signed numeric", _NUMERIC: "a numeric",
                _INT: "an integer"}[kind]
        raise TypeError(f"needs {need} dtype, got {dt.name}")


def _unary_infer(kind: str, out_dtype: Optional[dtypes.dtype] = None) -> Callable:
    def infer(specs):
        _check_kind(specs[0], kind)
        return [spec(specs[0].shape, out_dtype or specs[0].dtype)]
    return infer


def _in_float(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Compute in at least float32 (float16/float8 inputs), return in the input dtype."""
    def k(x):
        wide = x.astype(np.promote_types(x.dtype, np.float32)) if x.dtype.itemsize < 4 else x
        return np.asarray(fn(wide)).astype(x.dtype, copy=False)
    return k


_erf = np.frompyfunc(math.erf, 1, 1)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf(x):
    return 0.5 * x * (1.0 + np.asarray(_erf(x / np.sqrt(2.0))).astype(x.dtype))


def _sign(x):
    return np.nan_to_num(np.sign(x), nan=0.0) if x.dtype.kind == "f" else np.sign(x)


# name: (kernel, dtype kind, output dtype, has in-place variant, grad decision)
_UNARY: Dict[str, tuple] = {
    "abs": (np.abs, _SIGNED, None, False, None),
    "cos": (_in_float(np.cos), _FLOAT, None, False, None),
    "sin": (_in_float(np.sin), _FLOAT, None, False, None),
    "tanh": (_in_float(np.tanh), _FLOAT, None, False, None),
    "exp": (_in_float(np.exp), _FLOAT, None, True, None),
    "log": (_in_float(np.log), _FLOAT, None, False, None),
    "log2": (_in_float(np.log2), _FLOAT, None, False, None),
    "sqrt": (_in_float(np.sqrt), _FLOAT, None, False, None),
    "negate": (np.negative, _SIGNED, None, False, None),
    "relu": (lambda x: np.maximum(x, np.zeros((), x.dtype)), _SIGNED, None, True, None),
    "gelu": (_in_float(_gelu_tanh), _FLOAT, None, True, None),
    "geluerf": (_in_float(_gelu_erf), _FLOAT, None, True, None),
    "swish": (_in_float(lambda x: x / (1.0 + np.exp(-x))), _FLOAT, None, True, None),
    "sigmoid": (_in_float(lambda x: 1.0 / (1.0 + np.exp(-x))), _FLOAT, None, False, None),
    "floor": (np.floor, _FLOAT, None, False, Grad.ZERO),
    "ceil": (np.ceil, _FLOAT, None, False, Grad.ZERO),
    "sign": (_sign, _SIGNED, None, False, Grad.ZERO),
    "isnan": (np.isnan, _ANY, dtypes.bool, False, Grad.STOP),
    "isinf": (np.isinf, _ANY, dtypes.bool, False, Grad.STOP),
    "isfinite": (np.isfinite, _ANY, dtypes.bool, False, Grad.RAISE),
    "logical_not": (lambda x: np.logical_not(x.astype(bool)), _ANY, dtypes.bool, False, Grad.RAISE),
}

for _name, (_kernel, _kind, _out, _has_inplace, _grad) in _UNARY.items():
    register(OpDef(_name, _unary_infer(_kind, _out), _kernel, grad=_grad, family="elementwise", elementwise=True))
    if _has_inplace:
        register(OpDef(_name + "_", _unary_infer(_kind, _out), _kernel, inplace=0, grad=Grad.STOP,
                       family="elementwise"))


def _unary(opname: str, t: Tensor) -> Tensor:
    return create_op(opname, [t])[0]


def abs(t: Tensor) -> Tensor:
    """Elementwise absolute value.

    Args:
        t: A signed integer or floating point tensor.

    Returns:
        A tensor of ``t``'s shape and dtype holding ``|t|``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is unsigned, bool or complex.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("abs", t)


def cos(t: Tensor) -> Tensor:
    """Elementwise cosine (radians).

    Args:
        t: A floating point tensor.

    Returns:
        ``cos(t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("cos", t)


def sin(t: Tensor) -> Tensor:
    """Elementwise sine (radians).

    Args:
        t: A floating point tensor.

    Returns:
        ``sin(t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("sin", t)


def tanh(t: Tensor) -> Tensor:
    """Elementwise hyperbolic tangent.

    Args:
        t: A floating point tensor.

    Returns:
        ``tanh(t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("tanh", t)


def exp(t: Tensor) -> Tensor:
    """Elementwise natural exponential.

    Args:
        t: A floating point tensor.

    Returns:
        ``e ** t``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("exp", t)


def exp_(t: Tensor) -> Tensor:
    """Elementwise natural exponential, in place.

    In place: ``t`` itself is overwritten, and the result aliases it. No gradient flows through it.

    Args:
        t: A floating point tensor, overwritten.

    Returns:
        An alias of ``t``, now holding ``e ** t``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("exp_", t)


def log(t: Tensor) -> Tensor:
    """Elementwise natural logarithm.

    Args:
        t: A floating point tensor.

    Returns:
        ``ln(t)``, same shape and dtype (NaN below 0, -inf at 0).

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("log", t)


def log2(t: Tensor) -> Tensor:
    """Elementwise base-2 logarithm.

    Args:
        t: A floating point tensor.

    Returns:
        ``log2(t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("log2", t)


def sqrt(t: Tensor) -> Tensor:
    """Elementwise square root.

    Args:
        t: A floating point tensor.

    Returns:
        The square root of ``t`` (NaN where ``t`` is negative), same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("sqrt", t)


def negate(t: Tensor) -> Tensor:
    """Elementwise negation.

    Args:
        t: A signed integer or floating point tensor.

    Returns:
        ``-t``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is unsigned, bool or complex.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("negate", t)


def relu(t: Tensor) -> Tensor:
    """Rectified linear unit: ``max(t, 0)`` elementwise.

    Args:
        t: A signed integer or floating point tensor.

    Returns:
        ``max(t, 0)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is unsigned, bool or complex.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("relu", t)


def relu_(t: Tensor) -> Tensor:
    """Rectified linear unit, in place.

    In place: ``t`` itself is overwritten, and the result aliases it. No gradient flows through it.

    Args:
        t: A signed integer or floating point tensor, overwritten.

    Returns:
        An alias of ``t``, now holding ``max(t, 0)``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is unsigned, bool or complex.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("relu_", t)


def gelu(t: Tensor) -> Tensor:
    """Gaussian error linear unit, tanh approximation.

    The exact (erf) form is `geluerf`.

    Args:
        t: A floating point tensor.

    Returns:
        ``0.5 t (1 + tanh(sqrt(2/pi) (t + 0.044715 t^3)))``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("gelu", t)


def gelu_(t: Tensor) -> Tensor:
    """Gaussian error linear unit (tanh approximation), in place.

    In place: ``t`` itself is overwritten, and the result aliases it. No gradient flows through it.

    Args:
        t: A floating point tensor, overwritten.

    Returns:
        An alias of ``t``, now holding ``gelu(t)``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("gelu_", t)


def geluerf(t: Tensor) -> Tensor:
    """Gaussian error linear unit, exact form ``0.5 t (1 + erf(t / sqrt(2)))``.

    Args:
        t: A floating point tensor.

    Returns:
        ``geluerf(t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("geluerf", t)


def geluerf_(t: Tensor) -> Tensor:
    """Gaussian error linear unit (exact erf form), in place.

    In place: ``t`` itself is overwritten, and the result aliases it. No gradient flows through it.

    Args:
        t: A floating point tensor, overwritten.

    Returns:
        An alias of ``t``, now holding ``geluerf(t)``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("geluerf_", t)


def swish(t: Tensor) -> Tensor:
    """Swish (SiLU): ``t * sigmoid(t)`` elementwise.

    Args:
        t: A floating point tensor.

    Returns:
        ``t / (1 + e ** -t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("swish", t)


def swish_(t: Tensor) -> Tensor:
    """Swish (SiLU), in place.

    In place: ``t`` itself is overwritten, and the result aliases it. No gradient flows through it.

    Args:
        t: A floating point tensor, overwritten.

    Returns:
        An alias of ``t``, now holding ``swish(t)``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("swish_", t)


def sigmoid(t: Tensor) -> Tensor:
    """Logistic sigmoid ``1 / (1 + e ** -t)`` elementwise (an extension: PopXL has no such op).

    Args:
        t: A floating point tensor.

    Returns:
        ``sigmoid(t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("sigmoid", t)


def floor(t: Tensor) -> Tensor:
    """Round down to an integral value, elementwise.

    Args:
        t: A floating point tensor.

    Returns:
        The largest integral values not above ``t`` (NaN stays NaN), same shape and dtype. Its gradient is zero.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("floor", t)


def ceil(t: Tensor) -> Tensor:
    """Round up to an integral value, elementwise.

    Args:
        t: A floating point tensor.

    Returns:
        The smallest integral values not below ``t`` (NaN stays NaN), same shape and dtype. Its gradient is zero.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("ceil", t)


def sign(t: Tensor) -> Tensor:
    """Elementwise sign.

    Args:
        t: A signed integer or floating point tensor.

    Returns:
        -1, 0 or 1 in ``t``'s dtype (NaN gives 0). Its gradient is zero.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is unsigned, bool or complex.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("sign", t)


def isnan(t: Tensor) -> Tensor:
    """Elementwise test for NaN.

    Args:
        t: A tensor of any dtype.

    Returns:
        A bool tensor of ``t``'s shape, True where ``t`` is NaN.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("isnan", t)


def isinf(t: Tensor) -> Tensor:
    """Elementwise test for positive or negative infinity.

    Args:
        t: A tensor of any dtype.

    Returns:
        A bool tensor of ``t``'s shape, True where ``t`` is infinite.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("isinf", t)


def isfinite(t: Tensor) -> Tensor:
    """Elementwise test for finite values.

    Args:
        t: A tensor of any dtype.

    Returns:
        A bool tensor of ``t``'s shape, True where ``t`` is neither NaN nor infinite. Not differentiable.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("isfinite", t)


def logical_not(t: Tensor) -> Tensor:
    """Elementwise logical not.

    Args:
        t: A tensor of any dtype, read as bool (non-zero is True).

    Returns:
        A bool tensor of ``t``'s shape. Not differentiable.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("logical_not", t)


# erf is not a PopXL op: it is what the ONNX importer makes of Erf (and fuse_decomposed finds
# inside an erf-form GELU). Reachable as popxl.ops.elementwise.erf, outside ``__all__``.
register(OpDef("erf", _unary_infer(_FLOAT), _in_float(lambda x: np.asarray(_erf(x), x.dtype)), family="elementwise",
               elementwise=True))


def erf(t: Tensor) -> Tensor:
    """Elementwise error function, 2/sqrt(pi) times the integral of exp(-u**2) from 0 to t.

    Args:
        t: A floating point tensor.

    Returns:
        ``erf(t)``, same shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or its dtype is not floating point.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return _unary("erf", t)


# binary ---------------------------------------------------------------------------------------------
# Integer division and remainder are defined for every operand pair, in both engines: a divisor
# of 0 gives 0 (NumPy's result), and the most negative value divided by -1 wraps to itself (two's
# complement; its remainder is 0). Spelled out here rather than left to NumPy's handling of those
# pairs, which has changed between versions.
def _int_divisor(b: np.ndarray) -> np.ndarray:
    """``b`` with 0 and (signed) -1 replaced by 1: the divisors the special cases handle."""
    special = (b == 0) | (b == -1) if b.dtype.kind == "i" else b == 0
    return np.where(special, np.ones((), b.dtype), b)


def _div(a, b):
    if a.dtype.kind not in "iu":
        with np.errstate(divide="ignore", invalid="ignore"):  # IEEE: +-inf or NaN
            return np.divide(a, b)
    q = np.floor_divide(a, _int_divisor(b))
    if a.dtype.kind == "i":
        q = np.where(b == -1, np.negative(a), q)  # wraps for the most negative value
    return np.where(b == 0, np.zeros((), a.dtype), q)


def _fmod(a, b):
    if a.dtype.kind in "iu":
        return np.fmod(a, _int_divisor(b))  # x fmod 1 is 0: the value for divisors 0 and -1
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b)


def _pow(a, b):
    if a.dtype.kind in "iu":
        return np.power(a, np.maximum(b, 0)).astype(a.dtype)
    return _in_float(lambda x: np.power(x, b.astype(x.dtype)))(a)


def _arith_infer(kind: str = _NUMERIC) -> Callable:
    def infer(specs):
        dt = same_dtype(specs)
        _check_kind(specs[0], kind)
        return [spec(broadcast_shapes(*(s.shape for s in specs)), dt)]
    return infer


def _inplace_infer(base: Callable) -> Callable:
    def infer(specs):
        (out,) = base(specs)
        if out.shape != specs[0].shape:
            raise ValueError(f"the in-place result would have shape {out.shape}, but the tensor modified "
                             f"in place has shape {specs[0].shape}; broadcasting may only grow the other operand")
        return [out]
    return infer


def _compare_infer(specs):
    return [spec(broadcast_shapes(*(s.shape for s in specs)), dtypes.bool)]


def _as_bool(f):
    return lambda a, b: f(a.astype(bool), b.astype(bool))


def _relu_grad(g, x):
    """relu's input gradient g * (x > 0): a product, so an infinite or NaN g stays NaN where x <= 0."""
    with np.errstate(invalid="ignore"):
        return g * (x > 0).astype(g.dtype)


def _grad_from_output(slope: Callable[[np.ndarray], np.ndarray]) -> Callable:
    """An input gradient g * slope(y) from the op's output y, computed in at least float32 and
    rounded once (float16), as the native kernel computes it."""
    def k(g, y):
        wide = np.promote_types(g.dtype, np.float32)
        return (g.astype(wide) * slope(y.astype(wide))).astype(g.dtype)
    return k


_BINARY = {
    # name: (kernel, infer, grad)
    "add": (np.add, _arith_infer(), None),
    "sub": (np.subtract, _arith_infer(), None),
    "mul": (np.multiply, _arith_infer(), None),
    "div": (_div, _arith_infer(), None),
    "fmod": (_fmod, _arith_infer(), None),
    "pow": (_pow, _arith_infer(), None),
    "equal": (np.equal, _compare_infer, Grad.RAISE),
    "greater": (np.greater, _compare_infer, Grad.RAISE),
    "logical_and": (_as_bool(np.logical_and), _compare_infer, Grad.RAISE),
    "logical_or": (_as_bool(np.logical_or), _compare_infer, Grad.RAISE),
    # unary ops' input gradients in one pass each (see _FUSED_GRADS)
    "relu_grad": (_relu_grad, _arith_infer(_SIGNED), Grad.RAISE),
    "tanh_grad": (_grad_from_output(lambda y: 1 - y * y), _arith_infer(_FLOAT), Grad.RAISE),
    "sigmoid_grad": (_grad_from_output(lambda y: y * (1 - y)), _arith_infer(_FLOAT), Grad.RAISE),
}
for _name, (_kernel, _infer, _grad) in _BINARY.items():
    register(OpDef(_name, _infer, _kernel, grad=_grad, family="elementwise", elementwise=True))
register(OpDef("add_", _inplace_infer(_arith_infer()), np.add, inplace=0, grad=Grad.STOP, family="elementwise"))


# integer bit operations: PopXL has no functions for them; the ONNX importer creates them by name
def _shift(left: bool) -> Callable:
    # ONNX's rules: left shifts wrap (in unsigned arithmetic), right shifts of signed values
    # sign-extend, and a negative shift or one by the width or more leaves only the sign fill
    def k(a, b):
        out = (b < 0) | (b >= 8 * a.dtype.itemsize)
        s = np.where(out, 0, b).astype(a.dtype)
        if left:
            u = np.dtype(f"u{a.dtype.itemsize}")
            shifted = np.left_shift(a.view(u), s.view(u)).view(a.dtype)
        else:
            shifted = np.right_shift(a, s)
        fill = np.where(a < 0, -1, 0) if not left and a.dtype.kind == "i" else 0
        return np.where(out, fill, shifted).astype(a.dtype)
    return k


for _name, _kernel, _kind in (("bitwise_and", np.bitwise_and, _INT), ("bitwise_or", np.bitwise_or, _INT),
                              ("bitwise_xor", np.bitwise_xor, _INT), ("bitshift_left", _shift(True), _INT),
                              ("bitshift_right", _shift(False), _INT)):
    register(OpDef(_name, _arith_infer(_kind), _kernel, grad=Grad.RAISE, family="elementwise", elementwise=True))
register(OpDef("bitwise_not", _unary_infer(_INT), np.invert, grad=Grad.RAISE, family="elementwise", elementwise=True))


def _binary(opname: str, lhs: Tensor, rhs: Tensor) -> Tensor:
    return create_op(opname, [lhs, rhs])[0]


def add(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise sum ``lhs + rhs``.

    Shapes broadcast as in NumPy; both operands must have the same dtype.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A new tensor of the broadcast shape and the operands' dtype.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes differ or the op does not take them.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("add", lhs, rhs)


def add_(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise sum, in place: ``lhs += rhs``.

    ``rhs`` broadcasts to ``lhs``'s shape (``lhs`` cannot grow). No gradient flows through it.

    Args:
        lhs: The first operand.
        rhs: The operand added, broadcast to ``lhs``'s shape.

    Returns:
        An alias of ``lhs``, now holding the sum.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes differ or the op does not take them.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("add_", lhs, rhs)


def sub(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise difference ``lhs - rhs``.

    Shapes broadcast as in NumPy; both operands must have the same dtype.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A new tensor of the broadcast shape and the operands' dtype.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes differ or the op does not take them.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("sub", lhs, rhs)


def mul(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise product ``lhs * rhs``.

    Shapes broadcast as in NumPy; both operands must have the same dtype.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A new tensor of the broadcast shape and the operands' dtype.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes differ or the op does not take them.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("mul", lhs, rhs)


def div(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise quotient ``lhs / rhs``.

    Shapes broadcast as in NumPy; both operands must have the same dtype.
    Integer operands floor-divide; an integer division by 0 gives 0, and the most negative
    value divided by -1 wraps to itself.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A new tensor of the broadcast shape and the operands' dtype.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes differ or the op does not take them.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("div", lhs, rhs)


def fmod(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise remainder with the sign of ``lhs`` (C's ``fmod``).

    Shapes broadcast as in NumPy; both operands must have the same dtype.
    For integers a divisor of 0 gives 0. The gradient flows to ``lhs`` only.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A new tensor of the broadcast shape and the operands' dtype.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes differ or the op does not take them.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("fmod", lhs, rhs)


def pow(t: Tensor, e: Union[float, int, "Tensor"]) -> Tensor:
    """Elementwise power ``t ** e``.

    A Python number ``e`` becomes a constant of ``t``'s dtype; a tensor ``e`` must have ``t``'s dtype.

    Args:
        t: The base.
        e: The exponent: a tensor, or a Python number.

    Returns:
        A new tensor of the broadcast shape and ``t``'s dtype.

    Raises:
        TypeError: If an operand is not a Tensor, or a tensor ``e`` has another dtype.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("pow", t, as_tensor(e, like=t))


def equal(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise equality test ``lhs == rhs``.

    Shapes broadcast as in NumPy.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A bool tensor of the broadcast shape. Not differentiable.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes cannot be compared.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("equal", lhs, rhs)


def greater(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise comparison ``input > other``.

    Shapes broadcast as in NumPy.

    Args:
        input: The left-hand side.
        other: The right-hand side, broadcast against ``input``.

    Returns:
        A bool tensor of the broadcast shape. Not differentiable.

    Raises:
        TypeError: If an operand is not a Tensor, or the dtypes cannot be compared.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("greater", input, other)


def logical_and(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise logical and.

    Both operands are read as bool (non-zero is True); shapes broadcast as in NumPy.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A bool tensor of the broadcast shape. Not differentiable.

    Raises:
        TypeError: If an operand is not a Tensor, or an operand cannot be read as bool.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("logical_and", lhs, rhs)


def logical_or(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise logical or.

    Both operands are read as bool (non-zero is True); shapes broadcast as in NumPy.

    Args:
        lhs: The first operand.
        rhs: The second operand, broadcast against ``lhs``.

    Returns:
        A bool tensor of the broadcast shape. Not differentiable.

    Raises:
        TypeError: If an operand is not a Tensor, or an operand cannot be read as bool.
        ValueError: If an operand is not a tensor of the current graph, or the shapes do not broadcast.
    """
    return _binary("logical_or", lhs, rhs)


def _maximum_infer(specs):
    if not specs:
        raise ValueError("needs at least one tensor")
    return [spec(broadcast_shapes(*(s.shape for s in specs)), same_dtype(specs))]


register(OpDef("maximum", _maximum_infer, lambda *xs: np.maximum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1
               else xs[0].copy(), family="elementwise"))


def maximum(*ts: Tensor) -> Tensor:
    """Elementwise maximum of any number of tensors.

    Shapes broadcast as in NumPy; every tensor must have the same dtype. In the gradient, every
    input equal to the maximum receives the full incoming gradient.

    Args:
        *ts: The tensors compared (at least one).

    Returns:
        A new tensor of the broadcast shape and the inputs' dtype.

    Raises:
        TypeError: If an input is not a Tensor, or the dtypes differ.
        ValueError: If no tensor is given, an input is not in the current graph, or the shapes do
            not broadcast.
    """
    return create_op("maximum", list(ts))[0]


# Internal N-ary sum (PopART's Sum): autodiff adds up several gradient contributions with it;
# transforms.decompose_sum turns it into binary adds.
register(OpDef("add_n", _maximum_infer, lambda *xs: np.sum(np.broadcast_arrays(*xs), axis=0, dtype=xs[0].dtype),
               family="elementwise"))


def _where_infer(specs):
    c, a, b = specs
    dt = same_dtype([a, b])
    return [spec(broadcast_shapes(c.shape, a.shape, b.shape), dt)]


register(OpDef("where", _where_infer, lambda c, a, b: np.where(c.astype(bool), a, b), family="elementwise"))


def where(condition: Tensor, lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise choice: ``lhs`` where ``condition`` holds, ``rhs`` elsewhere.

    The three shapes broadcast together. A Python number or array for ``lhs`` or ``rhs`` becomes a
    constant of the other operand's dtype.

    Args:
        condition: The selector, read as bool (non-zero is True).
        lhs: The values taken where ``condition`` is True.
        rhs: The values taken where ``condition`` is False.

    Returns:
        A new tensor of the broadcast shape and the dtype of ``lhs`` and ``rhs``.

    Raises:
        TypeError: If ``condition`` is not a Tensor, or ``lhs`` and ``rhs`` have different dtypes.
        ValueError: If a tensor is not in the current graph, or the shapes do not broadcast.
    """
    lhs = as_tensor(lhs, like=rhs if isinstance(rhs, Tensor) else None)
    rhs = as_tensor(rhs, like=lhs)
    return create_op("where", [condition, lhs, rhs])[0]


# casts, identities, clipping ----------------------------------------------------------------------
def _cast_infer(specs, data_type):
    if not isinstance(data_type, dtypes.dtype):
        raise TypeError(f"data_type must be a popxl dtype, not {data_type!r}")
    if data_type in (dtypes.float8_143, dtypes.float8_152):
        raise TypeError("cannot cast to float8 with ops.cast: use ops.pow2scale_cast_to_fp8")
    return [spec(specs[0].shape, data_type)]


register(OpDef("cast", _cast_infer, lambda x, data_type: convert(x, dtypes.ml_dtype(data_type)),
               family="elementwise"))


def cast(t: Tensor, data_type: dtypes.dtype) -> Tensor:
    """Convert a tensor to another dtype.

    Floats convert to integers by truncation toward zero, saturating at the integer type's limits
    (NaN gives 0); integers convert to narrower integers by wrapping.

    Args:
        t: The tensor converted.
        data_type: The target dtype (not a float8 type: see `pow2scale_cast_to_fp8`).

    Returns:
        A new tensor of ``t``'s shape in ``data_type``.

    Raises:
        TypeError: If ``t`` is not a Tensor, ``data_type`` is not a popxl dtype, or it is a float8
            type.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return create_op("cast", [t], {"data_type": data_type})[0]


def _same_infer(specs, **_):
    return [spec(specs[0].shape, specs[0].dtype, specs[0].meta_shape)]


register(OpDef("identity", _same_infer, lambda x: x.copy(), view=lambda x: x, copy=True, family="elementwise"))
register(OpDef("detach", _same_infer, lambda x: x.copy(), view=lambda x: x, copy=True, grad=Grad.STOP,
               family="elementwise"))
register(OpDef("detach_", _same_infer, lambda x: x, view=lambda x: x, grad=Grad.STOP, family="elementwise"))


def identity(t: Tensor, output_name: Optional[str] = None) -> Tensor:
    """A copy of a tensor (``rename`` is the same function).

    Args:
        t: The tensor copied.
        output_name: The name of the result; ``identity_<name of t>`` when None.

    Returns:
        A new tensor equal to ``t``.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return create_op("identity", [t], name="identity", output_names=[output_name or f"identity_{t.name}"])[0]


rename = identity


def detach(t: Tensor) -> Tensor:
    """A copy of a tensor through which no gradient flows.

    Args:
        t: The tensor copied.

    Returns:
        A new tensor equal to ``t``; autodiff treats it as a constant.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return create_op("detach", [t])[0]


def detach_(t: Tensor) -> Tensor:
    """An alias of a tensor through which no gradient flows.

    Args:
        t: The tensor aliased.

    Returns:
        A tensor sharing ``t``'s storage; autodiff treats it as a constant.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not a tensor of the current graph.
    """
    return create_op("detach_", [t])[0]


def _clip_kernel(x, min, max):
    if x.dtype.kind in "iu":  # the integers in [min, max]: bounds rounded inward, within the dtype's range
        lo, hi = convert(np.ceil(np.float64(min)), x.dtype), convert(np.floor(np.float64(max)), x.dtype)
        return np.minimum(np.maximum(x, lo), hi)
    return np.minimum(np.maximum(x, np.asarray(min, x.dtype)), np.asarray(max, x.dtype))


def _clip_infer(specs, min, max):
    _check_kind(specs[0], _NUMERIC)
    if min > max:
        raise ValueError(f"min ({min}) is greater than max ({max})")
    return [spec(specs[0].shape, specs[0].dtype)]


register(OpDef("clip", _clip_infer, _clip_kernel, family="elementwise", elementwise=True))


def clip(t: Tensor, min: float = float("-inf"), max: float = float("inf")) -> Tensor:
    """Limit the values of a tensor to ``[min, max]`` (``clamp`` is the same function).

    An integer tensor is limited to the integers within the interval. The gradient flows where
    ``min <= t <= max``.

    Args:
        t: A numeric tensor.
        min: The lower bound.
        max: The upper bound.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``min`` is greater than ``max``, or ``t`` is not in the current graph.
    """
    return create_op("clip", [t], {"min": float(min), "max": float(max)})[0]


clamp = clip


def _scaled_add_kernel(x, y, *scales, a, b):
    it = iter(scales)
    sa = next(it) if a is None else a
    sb = next(it) if b is None else b
    wide = np.promote_types(x.dtype, np.float32) if x.dtype.kind == "f" else x.dtype
    return (np.asarray(sa, wide) * x.astype(wide) + np.asarray(sb, wide) * y.astype(wide)).astype(x.dtype)


def _scaled_add_infer(specs, a, b):
    x, y = specs[:2]
    if x.shape != y.shape:
        raise ValueError(f"X and Y must have the same shape (no broadcasting), got {x.shape} and {y.shape}")
    for s in specs[2:]:
        if s.shape not in ((), (1,)):
            raise ValueError(f"scale tensors must be scalars, got shape {s.shape}")
    return [spec(x.shape, x.dtype)]


register(OpDef("scaled_add", _scaled_add_infer, _scaled_add_kernel, grad=Grad.STOP, family="elementwise",
               elementwise=True))
register(OpDef("scaled_add_", _scaled_add_infer, _scaled_add_kernel, inplace=0, grad=Grad.STOP,
               family="elementwise"))


def _scaled_add(opname: str, X: Tensor, Y: Tensor, a, b) -> Tensor:
    ins = [X, Y] + [s for s in (a, b) if isinstance(s, Tensor)]
    attrs = {"a": None if isinstance(a, Tensor) else float(a), "b": None if isinstance(b, Tensor) else float(b)}
    return create_op(opname, ins, attrs)[0]


def scaled_add(X: Tensor, Y: Tensor, a: Union[float, Tensor] = 1.0, b: Union[float, Tensor] = 1.0) -> Tensor:
    """Weighted sum ``a * X + b * Y`` of two tensors of one shape.

    No broadcasting; the dtypes may differ (the result has ``X``'s). No gradient flows through it.

    Args:
        X: The first tensor.
        Y: The second tensor, of ``X``'s shape.
        a: The weight of ``X``: a Python number or a scalar tensor.
        b: The weight of ``Y``: a Python number or a scalar tensor.

    Returns:
        A new tensor of ``X``'s shape and dtype.

    Raises:
        TypeError: If ``X`` or ``Y`` is not a Tensor.
        ValueError: If the shapes differ, a weight tensor is not a scalar, or a tensor is not in
            the current graph.
    """
    return _scaled_add("scaled_add", X, Y, a, b)


def scaled_add_(X: Tensor, Y: Tensor, a: Union[float, Tensor] = 1.0, b: Union[float, Tensor] = 1.0) -> Tensor:
    """Weighted sum in place: ``X = a * X + b * Y``.

    No broadcasting; the dtypes may differ. No gradient flows through it.

    Args:
        X: The tensor updated in place.
        Y: The second tensor, of ``X``'s shape.
        a: The weight of ``X``: a Python number or a scalar tensor.
        b: The weight of ``Y``: a Python number or a scalar tensor.

    Returns:
        An alias of ``X``, now holding the sum.

    Raises:
        TypeError: If ``X`` or ``Y`` is not a Tensor.
        ValueError: If the shapes differ, a weight tensor is not a scalar, or a tensor is not in
            the current graph.
    """
    return _scaled_add("scaled_add_", X, Y, a, b)


# gradients ------------------------------------------------------------------------------------------
# Rules trace the input gradients from the output gradient ``ctx.grad(0)``; see transforms/autodiff.py.
def _mask(cond: Tensor, like: Tensor) -> Tensor:
    """A bool tensor as 0/1 of ``like``'s dtype."""
    return cast(cond, like.dtype)


def _elementwise_rule(derivative: Callable[..., Tensor]) -> Callable:
    """Rule of a unary op with d out / d x = ``derivative(ctx.input(0), ctx.output(0))``."""
    def rule(ctx):
        return [ctx.grad(0) * derivative(ctx.input(0), ctx.output(0))]
    return rule


_UNARY_DERIVATIVES: Dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "abs": lambda x, y: create_op("sign", [x])[0],
    "cos": lambda x, y: negate(create_op("sin", [x])[0]),
    "sin": lambda x, y: create_op("cos", [x])[0],
    "exp": lambda x, y: y,
    "log": lambda x, y: 1.0 / x,
    "log2": lambda x, y: 1.0 / (x * math.log(2.0)),
    "sqrt": lambda x, y: 0.5 / y,
    "negate": lambda x, y: as_tensor(-1.0, like=x),
    "swish": lambda x, y: _swish_derivative(x),
    "erf": lambda x, y: create_op("exp", [negate(x * x)])[0] * (2.0 / math.sqrt(math.pi)),
}


def _swish_derivative(x: Tensor) -> Tensor:
    s = create_op("sigmoid", [x])[0]
    return s * (1.0 + x * (1.0 - s))


for _name, _derivative in _UNARY_DERIVATIVES.items():
    grad_rule(_name)(_elementwise_rule(_derivative))


# Unary ops whose input gradient is one op of (g, x) or (g, y): one pass instead of a chain of
# elementwise ops (relu: greater, cast, mul; tanh: mul, sub, mul), same values in float32.
_FUSED_GRADS = {"relu": ("relu_grad", "input"), "tanh": ("tanh_grad", "output"),
                "sigmoid": ("sigmoid_grad", "output")}


def _fused_grad_rule(grad_op: str, reads: str) -> Callable:
    def rule(ctx):
        operand = ctx.input(0) if reads == "input" else ctx.output(0)
        return [create_op(grad_op, [ctx.grad(0), operand])[0]]
    return rule


for _name, (_grad_op, _reads) in _FUSED_GRADS.items():
    grad_rule(_name)(_fused_grad_rule(_grad_op, _reads))


def _gelu_grad_kernel(form: Callable) -> Callable:
    def k(g, x, *gelu_of_x):  # the reference computes from x alone
        wide = np.promote_types(x.dtype, np.float32)
        xf = x.astype(wide)
        return (g.astype(wide) * form(xf)).astype(x.dtype)
    return k


def _d_gelu_tanh(x):
    c = np.sqrt(2.0 / np.pi)
    inner = c * (x + 0.044715 * x ** 3)
    t = np.tanh(inner)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


def _d_gelu_erf(x):
    cdf = 0.5 * (1.0 + np.asarray(_erf(x / np.sqrt(2.0))).astype(x.dtype))
    return cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)


# Dedicated gradient ops, gelu_grad(g, x, gelu(x)) and geluerf_grad(g, x): one fused kernel instead
# of a dozen elementwise ops. gelu_grad also reads the forward's output, which training keeps anyway
# for the next layer's weight gradient: the native float32 kernel takes tanh's gate as gelu(x) / x
# from it instead of recomputing an exponential (about 3x faster).
def _gelu_grad_infer(name: str, operands: int) -> Callable:
    def infer(specs):
        if len(specs) != operands or any(s.shape != specs[1].shape for s in specs):
            raise ValueError(f"{name} takes {operands} tensors of one shape (the gradient, x"
                             f"{', gelu(x)' if operands == 3 else ''}), got {[s.shape for s in specs]}")
        return [specs[1]]
    return infer


for _name, _form, _reads_output in (("gelu", _d_gelu_tanh, True), ("geluerf", _d_gelu_erf, False)):
    register(OpDef(_name + "_grad", _gelu_grad_infer(_name + "_grad", 3 if _reads_output else 2),
                   _gelu_grad_kernel(_form), grad=Grad.RAISE, family="elementwise", elementwise=True))
    grad_rule(_name)(lambda ctx, _op=_name + "_grad", _out=_reads_output: [
        create_op(_op, [ctx.grad(0), ctx.input(0), *([ctx.output(0)] if _out else [])])[0]])


@grad_rule("add", "add_n")
def _add_grad(ctx):
    return [ctx.unbroadcast(ctx.grad(0), i) for i in range(len(ctx.op.inputs))]


@grad_rule("sub")
def _sub_grad(ctx):
    return [ctx.unbroadcast(ctx.grad(0), 0), ctx.unbroadcast(negate(ctx.grad(0)), 1)]


@grad_rule("mul")
def _mul_grad(ctx):
    g, a, b = ctx.grad(0), ctx.input(0), ctx.input(1)
    return [ctx.unbroadcast(g * b, 0) if ctx.needs(0) else None,
            ctx.unbroadcast(g * a, 1) if ctx.needs(1) else None]


@grad_rule("div")
def _div_grad(ctx):
    g, b = ctx.grad(0), ctx.input(1)
    return [ctx.unbroadcast(g / b, 0) if ctx.needs(0) else None,
            ctx.unbroadcast(negate(g * ctx.output(0) / b), 1) if ctx.needs(1) else None]


@grad_rule("pow")
def _pow_grad(ctx):
    g, a, e, y = ctx.grad(0), ctx.input(0), ctx.input(1), ctx.output(0)
    return [ctx.unbroadcast(g * e * _binary("pow", a, e - 1.0), 0) if ctx.needs(0) else None,
            ctx.unbroadcast(g * y * create_op("log", [a])[0], 1) if ctx.needs(1) else None]


@grad_rule("fmod")
def _fmod_grad(ctx):  # d/d lhs = 1 (the quotient is piecewise constant); no gradient for rhs, as PopXL
    return [ctx.unbroadcast(ctx.grad(0), 0), None]


@grad_rule("maximum")
def _maximum_grad(ctx):  # every input equal to the maximum receives the full gradient
    g, y = ctx.grad(0), ctx.output(0)
    return [ctx.unbroadcast(g * _mask(equal(ctx.input(i), y), g), i) if ctx.needs(i) else None
            for i in range(len(ctx.op.inputs))]


@grad_rule("where")
def _where_grad(ctx):
    g, c = ctx.grad(0), ctx.input(0)
    zero = as_tensor(0, like=g)
    return [None, ctx.unbroadcast(where(c, g, zero), 1) if ctx.needs(1) else None,
            ctx.unbroadcast(where(c, zero, g), 2) if ctx.needs(2) else None]


@grad_rule("clip")
def _clip_grad(ctx):  # passes where min <= x <= max
    x, a = ctx.input(0), ctx.attrs
    inside = logical_and(logical_not(greater(as_tensor(a["min"], like=x), x)),
                         logical_not(greater(x, as_tensor(a["max"], like=x))))
    return [ctx.grad(0) * _mask(inside, x)]


@grad_rule("cast")
def _cast_grad(ctx):  # only from float16/float32 (other sources never need a gradient)
    src = ctx.op.inputs[0].dtype
    return [cast(ctx.grad(0), src) if src in (dtypes.float16, dtypes.float32) else None]


@grad_rule("identity")
def _identity_grad(ctx):
    return [ctx.grad(0)]
