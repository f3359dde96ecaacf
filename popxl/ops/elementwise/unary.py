"""Unary math: abs, cos, sin, exp, log, log2, sqrt, negate, the roundings floor, ceil and sign, the
predicates isnan, isinf and isfinite, erf, and clip. Each op's registration, function and gradient
stand together."""
from __future__ import annotations

import math

import numpy as np

from popxl import dtypes
from popxl.op import Grad, create_op, grad_rule
from popxl.ops.elementwise._common import (ANY, FLOAT, NUMERIC, SIGNED, check_kind, derivative_rule, erf_of, in_float,
                                           register_elementwise, register_unary, unary)
from popxl.ops.elementwise.casts import as_mask
from popxl.ops.elementwise.logic import greater, logical_and, logical_not
from popxl.ops.utils import as_tensor, convert, spec
from popxl.tensor import Tensor

__all__ = ["abs", "ceil", "clamp", "clip", "cos", "erf", "exp", "exp_", "floor", "isfinite", "isinf", "isnan", "log",
           "log2", "negate", "sign", "sin", "sqrt"]

register_unary("abs", np.abs, SIGNED)


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
    return unary("abs", t)


@grad_rule("abs")
@derivative_rule
def _abs_grad(x: Tensor, y: Tensor) -> Tensor:
    return sign(x)


register_unary("cos", in_float(np.cos), FLOAT)


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
    return unary("cos", t)


@grad_rule("cos")
@derivative_rule
def _cos_grad(x: Tensor, y: Tensor) -> Tensor:
    return negate(sin(x))


register_unary("sin", in_float(np.sin), FLOAT)


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
    return unary("sin", t)


@grad_rule("sin")
@derivative_rule
def _sin_grad(x: Tensor, y: Tensor) -> Tensor:
    return cos(x)


register_unary("exp", in_float(np.exp), FLOAT, inplace=True)


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
    return unary("exp", t)


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
    return unary("exp_", t)


@grad_rule("exp")
@derivative_rule
def _exp_grad(x: Tensor, y: Tensor) -> Tensor:
    return y


register_unary("log", in_float(np.log), FLOAT)


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
    return unary("log", t)


@grad_rule("log")
@derivative_rule
def _log_grad(x: Tensor, y: Tensor) -> Tensor:
    return 1.0 / x


register_unary("log2", in_float(np.log2), FLOAT)


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
    return unary("log2", t)


@grad_rule("log2")
@derivative_rule
def _log2_grad(x: Tensor, y: Tensor) -> Tensor:
    return 1.0 / (x * math.log(2.0))


register_unary("sqrt", in_float(np.sqrt), FLOAT)


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
    return unary("sqrt", t)


@grad_rule("sqrt")
@derivative_rule
def _sqrt_grad(x: Tensor, y: Tensor) -> Tensor:
    return 0.5 / y


register_unary("negate", np.negative, SIGNED)


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
    return unary("negate", t)


@grad_rule("negate")
@derivative_rule
def _negate_grad(x: Tensor, y: Tensor) -> Tensor:
    return as_tensor(-1.0, like=x)


# Piecewise constant: differentiable, with a zero gradient.
register_unary("floor", np.floor, FLOAT, grad=Grad.ZERO)


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
    return unary("floor", t)


register_unary("ceil", np.ceil, FLOAT, grad=Grad.ZERO)


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
    return unary("ceil", t)


def _sign_kernel(x):
    return np.nan_to_num(np.sign(x), nan=0.0) if x.dtype.kind == "f" else np.sign(x)


register_unary("sign", _sign_kernel, SIGNED, grad=Grad.ZERO)


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
    return unary("sign", t)


# Predicates: bool results, through which no gradient flows (isfinite refuses to be differentiated).
register_unary("isnan", np.isnan, ANY, dtypes.bool, grad=Grad.STOP)


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
    return unary("isnan", t)


register_unary("isinf", np.isinf, ANY, dtypes.bool, grad=Grad.STOP)


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
    return unary("isinf", t)


register_unary("isfinite", np.isfinite, ANY, dtypes.bool, grad=Grad.RAISE)


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
    return unary("isfinite", t)


# erf is not a PopXL op: it is what the ONNX importer makes of Erf (and fuse_decomposed finds
# inside an erf-form GELU). Reachable as popxl.ops.elementwise.erf, outside that package's ``__all__``.
register_unary("erf", in_float(lambda x: np.asarray(erf_of(x), x.dtype)), FLOAT)


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
    return unary("erf", t)


@grad_rule("erf")
@derivative_rule
def _erf_grad(x: Tensor, y: Tensor) -> Tensor:
    return exp(negate(x * x)) * (2.0 / math.sqrt(math.pi))


def _clip_kernel(x, min, max):
    if x.dtype.kind in "iu":  # the integers in [min, max]: bounds rounded inward, within the dtype's range
        lo, hi = convert(np.ceil(np.float64(min)), x.dtype), convert(np.floor(np.float64(max)), x.dtype)
        return np.minimum(np.maximum(x, lo), hi)
    return np.minimum(np.maximum(x, np.asarray(min, x.dtype)), np.asarray(max, x.dtype))


def _clip_infer(specs, min, max):
    check_kind(specs[0], NUMERIC)
    if min > max:
        raise ValueError(f"min ({min}) is greater than max ({max})")
    return [spec(specs[0].shape, specs[0].dtype)]


register_elementwise("clip", _clip_infer, _clip_kernel, attributes={"min": "float", "max": "float"})


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


@grad_rule("clip")
def _clip_grad(ctx):  # passes where min <= x <= max
    x, a = ctx.input(0), ctx.attrs
    inside = logical_and(logical_not(greater(as_tensor(a["min"], like=x), x)),
                         logical_not(greater(x, as_tensor(a["max"], like=x))))
    return [ctx.grad(0) * as_mask(inside, x)]
