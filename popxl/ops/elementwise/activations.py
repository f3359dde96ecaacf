"""Activations: relu, tanh, sigmoid, gelu (tanh approximation), geluerf (exact) and swish, with the
in-place variants ``name_``. relu, tanh, sigmoid and the two GELUs have dedicated gradient ops
(``name_grad``): one pass computing the input gradient instead of a chain of elementwise ops, in
float32 for float16 values, as the native kernels compute it."""
from __future__ import annotations

from typing import Callable

import numpy as np

from popxl.op import Grad, create_op, grad_rule
from popxl.ops.elementwise._common import (FLOAT, SIGNED, arith_infer, derivative_rule, erf_of, in_float,
                                           register_elementwise, register_unary, unary)
from popxl.tensor import Tensor

__all__ = ["gelu", "gelu_", "geluerf", "geluerf_", "relu", "relu_", "sigmoid", "swish", "swish_", "tanh"]

register_unary("relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), SIGNED, inplace=True)


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
    return unary("relu", t)


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
    return unary("relu_", t)


def _relu_grad_kernel(g, x):
    """relu's input gradient g * (x > 0): a product, so an infinite or NaN g stays NaN where x <= 0."""
    with np.errstate(invalid="ignore"):
        return g * (x > 0).astype(g.dtype)


register_elementwise("relu_grad", arith_infer(SIGNED), _relu_grad_kernel, Grad.RAISE)


@grad_rule("relu")
def _relu_grad(ctx):
    return [create_op("relu_grad", [ctx.grad(0), ctx.input(0)])[0]]


def _grad_from_output(slope: Callable[[np.ndarray], np.ndarray]) -> Callable:
    """An input gradient g * slope(y) from the op's output y, computed in at least float32 and
    rounded once (float16), as the native kernel computes it."""
    def k(g, y):
        wide = np.promote_types(g.dtype, np.float32)
        return (g.astype(wide) * slope(y.astype(wide))).astype(g.dtype)
    return k


register_unary("tanh", in_float(np.tanh), FLOAT)


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
    return unary("tanh", t)


register_elementwise("tanh_grad", arith_infer(FLOAT), _grad_from_output(lambda y: 1 - y * y), Grad.RAISE)


@grad_rule("tanh")
def _tanh_grad(ctx):
    return [create_op("tanh_grad", [ctx.grad(0), ctx.output(0)])[0]]


register_unary("sigmoid", in_float(lambda x: 1.0 / (1.0 + np.exp(-x))), FLOAT)


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
    return unary("sigmoid", t)


register_elementwise("sigmoid_grad", arith_infer(FLOAT), _grad_from_output(lambda y: y * (1 - y)), Grad.RAISE)


@grad_rule("sigmoid")
def _sigmoid_grad(ctx):
    return [create_op("sigmoid_grad", [ctx.grad(0), ctx.output(0)])[0]]


register_unary("swish", in_float(lambda x: x / (1.0 + np.exp(-x))), FLOAT, inplace=True)


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
    return unary("swish", t)


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
    return unary("swish_", t)


@grad_rule("swish")
@derivative_rule
def _swish_grad(x: Tensor, y: Tensor) -> Tensor:
    s = sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


# GELU ---------------------------------------------------------------------------------------------
# Its gradient ops, gelu_grad(g, x, gelu(x)) and geluerf_grad(g, x): one fused kernel instead of a
# dozen elementwise ops. gelu_grad also reads the forward's output, which training keeps anyway for
# the next layer's weight gradient: the native float32 kernel takes tanh's gate as gelu(x) / x from
# it instead of recomputing an exponential (about 3x faster).
def _gelu_grad_infer(name: str, operands: int) -> Callable:
    def infer(specs):
        if len(specs) != operands or any(s.shape != specs[1].shape for s in specs):
            raise ValueError(f"{name} takes {operands} tensors of one shape (the gradient, x"
                             f"{', gelu(x)' if operands == 3 else ''}), got {[s.shape for s in specs]}")
        return [specs[1]]
    return infer


def _gelu_grad_kernel(form: Callable) -> Callable:
    def k(g, x, *gelu_of_x):  # the reference computes from x alone
        wide = np.promote_types(x.dtype, np.float32)
        xf = x.astype(wide)
        return (g.astype(wide) * form(xf)).astype(x.dtype)
    return k


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _d_gelu_tanh(x):
    c = np.sqrt(2.0 / np.pi)
    inner = c * (x + 0.044715 * x ** 3)
    t = np.tanh(inner)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


register_unary("gelu", in_float(_gelu_tanh), FLOAT, inplace=True)


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
    return unary("gelu", t)


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
    return unary("gelu_", t)


register_elementwise("gelu_grad", _gelu_grad_infer("gelu_grad", 3), _gelu_grad_kernel(_d_gelu_tanh), Grad.RAISE)


@grad_rule("gelu")
def _gelu_grad(ctx):
    return [create_op("gelu_grad", [ctx.grad(0), ctx.input(0), ctx.output(0)])[0]]


def _gelu_erf(x):
    return 0.5 * x * (1.0 + np.asarray(erf_of(x / np.sqrt(2.0))).astype(x.dtype))


def _d_gelu_erf(x):
    cdf = 0.5 * (1.0 + np.asarray(erf_of(x / np.sqrt(2.0))).astype(x.dtype))
    return cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)


register_unary("geluerf", in_float(_gelu_erf), FLOAT, inplace=True)


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
    return unary("geluerf", t)


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
    return unary("geluerf_", t)


register_elementwise("geluerf_grad", _gelu_grad_infer("geluerf_grad", 2), _gelu_grad_kernel(_d_gelu_erf),
                     Grad.RAISE)


@grad_rule("geluerf")
def _geluerf_grad(ctx):
    return [create_op("geluerf_grad", [ctx.grad(0), ctx.input(0)])[0]]
