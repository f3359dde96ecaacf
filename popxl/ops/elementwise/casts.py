"""Casts and identities: cast, identity (``rename``), detach and detach_."""
from __future__ import annotations

from typing import Optional

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import convert, spec
from popxl.tensor import Tensor

__all__ = ["cast", "detach", "detach_", "identity", "rename"]


def _cast_infer(specs, data_type):
    if not isinstance(data_type, dtypes.dtype):
        raise TypeError(f"data_type must be a popxl dtype, not {data_type!r}")
    if data_type in (dtypes.float8_143, dtypes.float8_152):
        raise TypeError("cannot cast to float8 with ops.cast: use ops.pow2scale_cast_to_fp8")
    return [spec(specs[0].shape, data_type)]


register(OpDef("cast", _cast_infer, lambda x, data_type: convert(x, dtypes.ml_dtype(data_type)),
               family="elementwise",
               attributes={"data_type": "dtype"}))


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


@grad_rule("cast")
def _cast_grad(ctx):  # only from float16/float32 (other sources never need a gradient)
    src = ctx.op.inputs[0].dtype
    return [cast(ctx.grad(0), src) if src in (dtypes.float16, dtypes.float32) else None]


def as_mask(cond: Tensor, like: Tensor) -> Tensor:
    """A bool tensor as 0/1 of ``like``'s dtype: the factor of gradients that pass where ``cond`` holds."""
    return cast(cond, like.dtype)


def _same_infer(specs, **_):
    return [spec(specs[0].shape, specs[0].dtype, specs[0].meta_shape)]


register(OpDef("identity", _same_infer, lambda x: x.copy(), view=lambda x: x, copy=True, family="elementwise",
               attributes={}))


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


@grad_rule("identity")
def _identity_grad(ctx):
    return [ctx.grad(0)]


register(OpDef("detach", _same_infer, lambda x: x.copy(), view=lambda x: x, copy=True, grad=Grad.STOP,
               family="elementwise",
               attributes={}))


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


register(OpDef("detach_", _same_infer, lambda x: x, view=lambda x: x, grad=Grad.STOP, family="elementwise",
               attributes={}))


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
