"""Arithmetic with NumPy broadcasting: add (and add_), sub, mul, div, fmod, pow, maximum, the
internal N-ary add_n, scaled_add (and scaled_add_), and the integer bit operations and shifts that
the ONNX importer creates by name."""
from __future__ import annotations

from typing import Callable, Union

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.elementwise._common import INT, arith_infer, binary, in_float, register_elementwise, unary_infer
from popxl.ops.elementwise.casts import as_mask
from popxl.ops.elementwise.logic import equal
from popxl.ops.elementwise.unary import log, negate
from popxl.ops.utils import as_tensor, broadcast_shapes, same_dtype, spec
from popxl.tensor import Tensor

__all__ = ["add", "add_", "div", "fmod", "maximum", "mul", "pow", "scaled_add", "scaled_add_", "sub"]


def _inplace_infer(base: Callable) -> Callable:
    def infer(specs):
        (out,) = base(specs)
        if out.shape != specs[0].shape:
            raise ValueError(f"the in-place result would have shape {out.shape}, but the tensor modified "
                             f"in place has shape {specs[0].shape}; broadcasting may only grow the other operand")
        return [out]
    return infer


def _nary_infer(specs):  # maximum and add_n: one or more tensors of one dtype, broadcast together
    if not specs:
        raise ValueError("needs at least one tensor")
    return [spec(broadcast_shapes(*(s.shape for s in specs)), same_dtype(specs))]


register_elementwise("add", arith_infer(), np.add)
register(OpDef("add_", _inplace_infer(arith_infer()), np.add, inplace=0, grad=Grad.STOP, family="elementwise",
               attributes={}))
# Internal N-ary sum (PopART's Sum): autodiff adds up several gradient contributions with it;
# transforms.decompose_sum turns it into binary adds.
register(OpDef("add_n", _nary_infer, lambda *xs: np.sum(np.broadcast_arrays(*xs), axis=0, dtype=xs[0].dtype),
               family="elementwise", attributes={}))


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
    return binary("add", lhs, rhs)


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
    return binary("add_", lhs, rhs)


@grad_rule("add", "add_n")
def _add_grad(ctx):
    return [ctx.unbroadcast(ctx.grad(0), i) for i in range(len(ctx.op.inputs))]


register_elementwise("sub", arith_infer(), np.subtract)


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
    return binary("sub", lhs, rhs)


@grad_rule("sub")
def _sub_grad(ctx):
    return [ctx.unbroadcast(ctx.grad(0), 0), ctx.unbroadcast(negate(ctx.grad(0)), 1)]


register_elementwise("mul", arith_infer(), np.multiply)


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
    return binary("mul", lhs, rhs)


@grad_rule("mul")
def _mul_grad(ctx):
    g, a, b = ctx.grad(0), ctx.input(0), ctx.input(1)
    return [ctx.unbroadcast(g * b, 0) if ctx.needs(0) else None,
            ctx.unbroadcast(g * a, 1) if ctx.needs(1) else None]


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


register_elementwise("div", arith_infer(), _div)


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
    return binary("div", lhs, rhs)


@grad_rule("div")
def _div_grad(ctx):
    g, b = ctx.grad(0), ctx.input(1)
    return [ctx.unbroadcast(g / b, 0) if ctx.needs(0) else None,
            ctx.unbroadcast(negate(g * ctx.output(0) / b), 1) if ctx.needs(1) else None]


def _fmod(a, b):
    if a.dtype.kind in "iu":
        return np.fmod(a, _int_divisor(b))  # x fmod 1 is 0: the value for divisors 0 and -1
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b)


register_elementwise("fmod", arith_infer(), _fmod)


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
    return binary("fmod", lhs, rhs)


@grad_rule("fmod")
def _fmod_grad(ctx):  # d/d lhs = 1 (the quotient is piecewise constant); no gradient for rhs, as PopXL
    return [ctx.unbroadcast(ctx.grad(0), 0), None]


def _pow(a, b):
    if a.dtype.kind in "iu":
        return np.power(a, np.maximum(b, 0)).astype(a.dtype)
    return in_float(lambda x: np.power(x, b.astype(x.dtype)))(a)


register_elementwise("pow", arith_infer(), _pow)


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
    return binary("pow", t, as_tensor(e, like=t))


@grad_rule("pow")
def _pow_grad(ctx):
    g, a, e, y = ctx.grad(0), ctx.input(0), ctx.input(1), ctx.output(0)
    return [ctx.unbroadcast(g * e * pow(a, e - 1.0), 0) if ctx.needs(0) else None,
            ctx.unbroadcast(g * y * log(a), 1) if ctx.needs(1) else None]


register(OpDef("maximum", _nary_infer, lambda *xs: np.maximum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1
               else xs[0].copy(), family="elementwise", attributes={}))


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


@grad_rule("maximum")
def _maximum_grad(ctx):  # every input equal to the maximum receives the full gradient
    g, y = ctx.grad(0), ctx.output(0)
    return [ctx.unbroadcast(g * as_mask(equal(ctx.input(i), y), g), i) if ctx.needs(i) else None
            for i in range(len(ctx.op.inputs))]


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
               elementwise=True,
               attributes={"a": "float?", "b": "float?"}))
register(OpDef("scaled_add_", _scaled_add_infer, _scaled_add_kernel, inplace=0, grad=Grad.STOP,
               family="elementwise",
               attributes={"a": "float?", "b": "float?"}))


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


for _name, _kernel in (("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or), ("bitwise_xor", np.bitwise_xor),
                       ("bitshift_left", _shift(True)), ("bitshift_right", _shift(False))):
    register_elementwise(_name, arith_infer(INT), _kernel, Grad.RAISE)
register_elementwise("bitwise_not", unary_infer(INT), np.invert, Grad.RAISE)
