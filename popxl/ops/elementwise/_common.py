"""What the elementwise families share: the dtype kinds an op takes, the shape rules of unary and
broadcasting ops, computing narrow floats in float32, and registering and tracing one op."""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, register
from popxl.ops.utils import broadcast_shapes, same_dtype, spec
from popxl.tensor import Tensor, TensorSpec

FLOAT, SIGNED, NUMERIC, INT, ANY = "float", "signed", "numeric", "int", "any"


def check_kind(s: TensorSpec, kind: str) -> None:
    """Raise a TypeError unless ``s``'s dtype is of ``kind`` (one of the constants above)."""
    dt = s.dtype
    ok = {
        FLOAT: dt.is_floating_point,
        SIGNED: dt.is_floating_point or (dt.is_int and dt.is_signed),
        NUMERIC: dt.is_floating_point or dt.is_int,
        INT: dt.is_int,
        ANY: True,
    }[kind]
    if not ok:
        need = {FLOAT: "a floating point", SIGNED: "a signed numeric", NUMERIC: "a numeric",
                INT: "an integer"}[kind]
        raise TypeError(f"needs {need} dtype, got {dt.name}")


def unary_infer(kind: str, out_dtype: Optional[dtypes.dtype] = None) -> Callable[[List[TensorSpec]], List[TensorSpec]]:
    """The shape rule of a unary op on ``kind`` dtypes: the input's shape, in ``out_dtype`` or its own."""
    def infer(specs):
        check_kind(specs[0], kind)
        return [spec(specs[0].shape, out_dtype or specs[0].dtype)]
    return infer


def arith_infer(kind: str = NUMERIC) -> Callable[[List[TensorSpec]], List[TensorSpec]]:
    """The shape rule of an op on tensors of one ``kind`` dtype whose shapes broadcast together."""
    def infer(specs):
        dt = same_dtype(specs)
        check_kind(specs[0], kind)
        return [spec(broadcast_shapes(*(s.shape for s in specs)), dt)]
    return infer


def in_float(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Compute in at least float32 (float16/float8 inputs), return in the input dtype."""
    def k(x):
        wide = x.astype(np.promote_types(x.dtype, np.float32)) if x.dtype.itemsize < 4 else x
        return np.asarray(fn(wide)).astype(x.dtype, copy=False)
    return k


erf_of = np.frompyfunc(math.erf, 1, 1)  # NumPy has no erf; an object array, cast by the caller


def register_elementwise(name: str, infer: Callable, kernel: Callable, grad: Optional[str] = None,
                         attributes: Optional[Dict[str, str]] = None) -> OpDef:
    """Register an op whose every output value depends on the inputs at its position alone; it takes
    no attributes unless it declares some (``attributes``, see popxl.op.OpDef)."""
    return register(OpDef(name, infer, kernel, grad=grad, family="elementwise", elementwise=True,
                          attributes=attributes or {}))


def register_unary(name: str, kernel: Callable, kind: str, out_dtype: Optional[dtypes.dtype] = None,
                   grad: Optional[str] = None, inplace: bool = False) -> None:
    """Register a unary op on ``kind`` dtypes and, with ``inplace``, its variant ``name_`` that
    overwrites its input (no gradient flows through an in-place op)."""
    register_elementwise(name, unary_infer(kind, out_dtype), kernel, grad)
    if inplace:
        register(OpDef(name + "_", unary_infer(kind, out_dtype), kernel, inplace=0, grad=Grad.STOP,
                       family="elementwise", attributes={}))


def unary(opname: str, t: Tensor) -> Tensor:
    return create_op(opname, [t])[0]


def binary(opname: str, lhs: Tensor, rhs: Tensor) -> Tensor:
    return create_op(opname, [lhs, rhs])[0]


def derivative_rule(derivative: Callable[[Tensor, Tensor], Tensor]) -> Callable:
    """The gradient rule of a unary op whose d out / d x is ``derivative(x, out)``.

    Use under ``@grad_rule(name)``. The rule traces g * derivative(x, out) from the output gradient
    g; it reads both forward values, so both reach the gradient graph (see transforms/autodiff.py)."""
    def rule(ctx):
        return [ctx.grad(0) * derivative(ctx.input(0), ctx.output(0))]
    return rule
