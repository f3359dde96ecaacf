"""Matrix products: ``matmul`` (NumPy's semantics), ``matmul_pow2scaled`` (float8), and the
fused forms that ``popxl.transforms.fuse_matmul`` makes (``matmul_bias``, ``matmul_bias_add``,
``matmul_update_``)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from popxl import dtypes
from popxl.analysis import reachable_graphs
from popxl.errors import popart_exception
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.fp8 import FP8, check_fp8_operands, check_log2_scale, scale_value
from popxl.ops.utils import broadcast_shapes, spec
from popxl.tensor import Tensor

__all__ = ["matmul", "matmul_pow2scaled"]


def _matmul_shape(a, b) -> Tuple[int, ...]:
    if not a.shape or not b.shape:
        raise ValueError("matmul operands must have rank >= 1")
    sa = (1,) + a.shape if len(a.shape) == 1 else a.shape
    sb = b.shape + (1,) if len(b.shape) == 1 else b.shape
    if sa[-1] != sb[-2]:
        raise ValueError(f"contracted dimensions differ: {a.shape} @ {b.shape} ({sa[-1]} != {sb[-2]})")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    shape = batch + sa[-2:-1] + sb[-1:]
    if len(a.shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b.shape) == 1:
        shape = shape[:-1]
    return shape


def _matmul_infer(specs, output_type, partials_type):
    a, b = specs
    if a.dtype != b.dtype and (a.dtype in FP8 or b.dtype in FP8):
        raise TypeError(f"a float8 operand needs a float8 partner (and matmul_pow2scaled), got "
                        f"{a.dtype.name} @ {b.dtype.name}")
    for s in specs:
        if not (s.dtype.is_floating_point or s.dtype.is_int):
            raise TypeError(f"matmul needs numeric operands, got {s.dtype.name}")
    # As PopART's MatMulOp: the result takes the lhs's dtype and the rhs's is not checked here. A
    # product of two dtypes cannot run; a Session refuses it (refuse_mixed_dtypes).
    return [spec(_matmul_shape(*specs), output_type or a.dtype)]


_PRODUCTS = ("matmul", "matmul_bias", "matmul_bias_add", "matmul_update_")  # operands 0 and 1 multiply


def refuse_mixed_dtypes(ir) -> None:
    """Refuse a program whose graphs (those the main graph runs) hold a matmul of two dtypes.
    PopXL traces one (PopART takes the lhs's dtype for the result and checks no more), and the IPU
    compiler refuses it when the Session compiles the program; so does this, at Session creation.

    Raises:
        popart_exception: Naming the op, its graph and both dtypes.
    """
    for g in reachable_graphs(ir):
        for op in g.schedule():
            if op.type in _PRODUCTS and op.inputs[0].dtype != op.inputs[1].dtype:
                a, b = op.inputs
                where = "the main graph" if g is ir.main_graph else f"graph {g.id!r}"
                raise popart_exception(
                    f"Session: {op.type} {op.name!r} in {where} (at {op.location}) multiplies {a.dtype.name} "
                    f"{a.id!r} by {b.dtype.name} {b.id!r}; both operands must have one dtype (the IPU's matmul takes "
                    f"no mix). Cast one of them with ops.cast before the matmul.")


def _matmul_kernel(a, b, output_type, partials_type):
    out = np.matmul(a, b) if a.dtype.itemsize >= 4 else np.matmul(a.astype(np.float32), b.astype(np.float32))
    return out.astype(dtypes.ml_dtype(output_type) if output_type is not None else a.dtype)


register(OpDef("matmul", _matmul_infer, _matmul_kernel, family="nn",
               attributes={"output_type": "dtype?", "partials_type": "dtype?"}))


def _matmul_bias_infer(specs):
    a, b, bias = specs
    (out,) = _matmul_infer([a, b], None, None)
    if bias.dtype != out.dtype or not bias.shape or bias.shape[-1] != out.shape[-1] \
            or any(d != 1 for d in bias.shape[:-1]) or len(bias.shape) > len(out.shape):
        raise ValueError(f"matmul_bias: the bias ({bias.dtype.name} {bias.shape}) must be a row of the "
                         f"product's last dimension ({out.dtype.name} {out.shape})")
    return [out]


# matmul then the addition of a row vector (a Linear layer's bias), as one instruction: lowering
# makes it of an adjacent matmul and add (popxl/compiler/lower.py); it is not traced by users.
register(OpDef("matmul_bias", _matmul_bias_infer, lambda a, b, bias: np.matmul(a, b) + bias, grad=Grad.RAISE,
               family="nn",
               attributes={}))


def _matmul_bias_add_infer(specs):
    a, b, bias, residual = specs
    (out,) = _matmul_bias_infer([a, b, bias])
    if residual.shape != out.shape or residual.dtype != out.dtype:
        raise ValueError(f"matmul_bias_add: the added tensor ({residual.dtype.name} {residual.shape}) must match the "
                         f"product ({out.dtype.name} {out.shape})")
    return [out]


# matmul_bias whose result is added to a tensor of its shape (a residual connection), as one
# instruction: fuse_matmul makes it; the GEMM starts from bias + residual instead of the bias.
register(OpDef("matmul_bias_add", _matmul_bias_add_infer, lambda a, b, bias, r: np.matmul(a, b) + bias + r,
               grad=Grad.RAISE, family="nn",
               attributes={}))


def _matmul_update_infer(specs, b):
    a, w_, t = specs
    (out,) = _matmul_infer([a, w_], None, None)
    if t.shape != out.shape or t.dtype != out.dtype:
        raise ValueError(f"matmul_update_: the updated tensor ({t.dtype.name} {t.shape}) must match the product "
                         f"({out.dtype.name} {out.shape})")
    return [t]


# t += b * (a @ w), in place on t: lowering makes it of a gradient's matmul and the SGD update
# scaled_add_(t, gradient, b=...) that consumes it (popxl/compiler/lower.py); not traced by users.
register(OpDef("matmul_update_", _matmul_update_infer, lambda a, w, t, b: t + np.float32(b) * np.matmul(a, w),
               inplace=2, grad=Grad.RAISE, family="nn",
               attributes={"b": "float"}))


def matmul(lhs: Tensor, rhs: Tensor, available_memory_proportion: Optional[float] = None,
           output_type: Optional[dtypes.dtype] = None, partials_type: Optional[dtypes.dtype] = None) -> Tensor:
    """Matrix product with ``numpy.matmul``'s rules.

    Batch dimensions broadcast; a 1-D operand is promoted to a matrix and the added dimension is
    removed from the result.

    Args:
        lhs: The left operand.
        rhs: The right operand. Its dtype should be ``lhs``'s: as in PopXL, a product of two
            dtypes is traced (the result takes ``lhs``'s dtype) but a Session refuses it.
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.
        output_type: The result's dtype; default the operands' dtype.
        partials_type: The accumulation type, float16 or float32 (a precision hint; CPUs accumulate
            in at least float32).

    Returns:
        A new tensor of the product's shape.

    Raises:
        TypeError: If an operand is not a Tensor or not numeric, or only one is float8.
        ValueError: If the inner dimensions differ, the batch dimensions do not broadcast,
            ``partials_type`` is not float16 or float32, or a tensor is not in the current graph.
    """
    if partials_type is not None and partials_type not in (dtypes.float16, dtypes.float32):
        raise ValueError(f"ops.matmul: partials_type must be float16 or float32, not {partials_type!r}")
    return create_op("matmul", [lhs, rhs], {"output_type": output_type, "partials_type": partials_type})[0]


def _matmul_pow2_infer(specs):
    a, b, s = specs
    check_fp8_operands([a, b])
    check_log2_scale(s)
    return [spec(_matmul_shape(a, b), dtypes.float16)]


def _matmul_pow2_kernel(a, b, s):
    scale = scale_value(s, "matmul_pow2scaled")
    return (np.matmul(a.astype(np.float32), b.astype(np.float32)) * scale).astype(np.float16)


register(OpDef("matmul_pow2scaled", _matmul_pow2_infer, _matmul_pow2_kernel, grad=Grad.RAISE, family="nn",
               attributes={}))


def matmul_pow2scaled(lhs: Tensor, rhs: Tensor, log2_scale: Tensor,
                      available_memory_proportion: Optional[float] = None) -> Tensor:
    """Matrix product of two float8 tensors, scaled by a power of two, in float16.

    Args:
        lhs: The left operand, float8.
        rhs: The right operand, float8.
        log2_scale: A scalar int32 tensor with a value in [-32, 32): the result is multiplied by
            ``2 ** log2_scale``.
        available_memory_proportion: An IPU memory hint, accepted and ignored on CPUs.

    Returns:
        A new float16 tensor ``(lhs @ rhs) * 2 ** log2_scale``.

    Raises:
        TypeError: If an operand is not a float8 Tensor, or ``log2_scale`` is not int32.
        ValueError: If ``log2_scale`` is not a scalar, the shapes do not multiply, or a tensor is not
            in the current graph.
    """
    return create_op("matmul_pow2scaled", [lhs, rhs, log2_scale])[0]


@grad_rule("matmul")
def _matmul_grad(ctx):
    """dA = g @ B^T and dB = A^T @ g on operands promoted to rank >= 2, summed over broadcast
    batch dimensions, then back to the operands' shapes."""
    a_t, b_t = ctx.op.inputs
    a, b, g = ctx.input(0), ctx.input(1), ctx.grad(0)
    if ctx.op.outputs[0].dtype is not a_t.dtype:  # output_type given: differentiate in the operands' dtype
        g = create_op("cast", [g], {"data_type": a_t.dtype})[0]
    a2 = a.reshape((1, a_t.shape[0])) if a_t.rank == 1 else a
    b2 = b.reshape((b_t.shape[0], 1)) if b_t.rank == 1 else b
    out2 = broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1])
    g2 = g.reshape(out2) if g.shape != out2 else g

    def last2_t(t: Tensor) -> Tensor:
        perm = tuple(range(t.rank - 2)) + (t.rank - 1, t.rank - 2)
        return create_op("transpose_", [t], {"permutation": perm})[0]

    def back(d: Tensor, like2: Tuple[int, ...], i: int) -> Tensor:
        lead = len(d.shape) - len(like2)
        axes = list(range(lead)) + [lead + k for k, n in enumerate(like2[:-2]) if n == 1 and d.shape[lead + k] != 1]
        if axes:
            d = create_op("sum", [d], {"axis": tuple(axes), "keepdims": True})[0]
        return d.reshape(ctx.op.inputs[i].shape) if d.shape != ctx.op.inputs[i].shape else d

    # Operands of two dtypes (which a Session refuses): each gradient in its operand's dtype, as
    # PopART's MatMulLhsGradOp / MatMulRhsGradOp.
    b_type = b_t.dtype if b_t.dtype != a_t.dtype else None
    return [back(matmul(g2, last2_t(b2)), a2.shape, 0) if ctx.needs(0) else None,
            back(matmul(last2_t(a2), g2, output_type=b_type), b2.shape, 1) if ctx.needs(1) else None]
