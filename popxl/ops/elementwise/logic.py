"""Comparisons and logic: equal, greater, logical_and, logical_or, logical_not (bool results,
not differentiable) and where (differentiable in its two value operands)."""
from __future__ import annotations

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.elementwise._common import ANY, binary, register_elementwise, register_unary, unary
from popxl.ops.utils import as_tensor, broadcast_shapes, same_dtype, spec
from popxl.tensor import Tensor

__all__ = ["equal", "greater", "logical_and", "logical_not", "logical_or", "where"]


def _compare_infer(specs):
    return [spec(broadcast_shapes(*(s.shape for s in specs)), dtypes.bool)]


def _as_bool(f):
    return lambda a, b: f(a.astype(bool), b.astype(bool))


register_elementwise("equal", _compare_infer, np.equal, Grad.RAISE)


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
    return binary("equal", lhs, rhs)


register_elementwise("greater", _compare_infer, np.greater, Grad.RAISE)


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
    return binary("greater", input, other)


register_elementwise("logical_and", _compare_infer, _as_bool(np.logical_and), Grad.RAISE)


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
    return binary("logical_and", lhs, rhs)


register_elementwise("logical_or", _compare_infer, _as_bool(np.logical_or), Grad.RAISE)


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
    return binary("logical_or", lhs, rhs)


register_unary("logical_not", lambda x: np.logical_not(x.astype(bool)), ANY, dtypes.bool, grad=Grad.RAISE)


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
    return unary("logical_not", t)


def _where_infer(specs):
    c, a, b = specs
    dt = same_dtype([a, b])
    return [spec(broadcast_shapes(c.shape, a.shape, b.shape), dt)]


register(OpDef("where", _where_infer, lambda c, a, b: np.where(c.astype(bool), a, b), family="elementwise",
               attributes={}))


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


@grad_rule("where")
def _where_grad(ctx):
    g, c = ctx.grad(0), ctx.input(0)
    zero = as_tensor(0, like=g)
    return [None, ctx.unbroadcast(where(c, g, zero), 1) if ctx.needs(1) else None,
            ctx.unbroadcast(where(c, zero, g), 2) if ctx.needs(2) else None]
