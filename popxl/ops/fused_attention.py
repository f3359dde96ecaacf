"""Fused scaled dot-product attention, made by ``popxl.transforms.fuse_attention`` (not traced by
users): ``attention(q, k, v[, mask], scale) = softmax(q @ k^T * scale + mask) @ v`` over the last
two axes, the leading axes (batch, heads) matched one to one, and ``attention_grad``, its three
gradients in one op.

The native kernels never hold the (seq, seq) scores of a head: they go over blocks of query rows,
each block's scores and probabilities living in a small per-thread buffer, and the gradient
recomputes the probabilities instead of keeping them, so attention needs O(seq) memory per head
on top of its inputs and outputs, and no pass over a (batch, heads, seq, seq) tensor.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import broadcast_shapes, spec, wide_dtype
from popxl.tensor import Tensor

__all__: List[str] = []  # internal ops: made by a transform


def _check_operands(specs, what: str):
    q, k, v = specs[:3]
    mask = specs[3] if len(specs) > 3 else None
    if len({s.dtype for s in specs}) != 1 or not q.dtype.is_floating_point:
        raise TypeError(f"{what}: q, k, v (and mask) must share one floating point dtype, got "
                        f"{[s.dtype.name for s in specs]}")
    if len(q.shape) < 2 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
        raise ValueError(f"{what}: q, k and v must have one rank >= 2, got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"{what}: the leading axes of q, k and v must match, got {q.shape}, {k.shape}, {v.shape}")
    if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
        raise ValueError(f"{what}: need q (..., Sq, D), k (..., Sk, D), v (..., Sk, Dv), got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    scores = q.shape[:-1] + (k.shape[-2],)
    if mask is not None and (len(mask.shape) > len(scores) or broadcast_shapes(mask.shape, scores) != scores):
        raise ValueError(f"{what}: the mask {mask.shape} must broadcast to the scores' shape {scores}")
    return q, v


def _attention_infer(specs, scale):
    if len(specs) not in (3, 4):
        raise ValueError(f"attention takes q, k, v and an optional additive mask, got {len(specs)} inputs")
    q, v = _check_operands(specs, "attention")
    return [spec(q.shape[:-1] + (v.shape[-1],), q.dtype)]


def _probabilities(q, k, mask, scale, w):
    """softmax(q @ k^T * scale + mask) in the compute dtype ``w``, as the unfused ops compute it."""
    s = np.matmul(q.astype(w), np.swapaxes(k.astype(w), -1, -2)) * w.type(scale)
    if mask is not None:
        s = s + mask.astype(w)
    if s.size == 0:
        return s
    e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _attention_kernel(q, k, v, *mask, scale):
    w = wide_dtype(q.dtype)
    p = _probabilities(q, k, mask[0] if mask else None, scale, w)
    return np.matmul(p, v.astype(w)).astype(q.dtype)


register(OpDef("attention", _attention_infer, _attention_kernel, family="nn",
               attributes={"scale": "float"}))


def _attention_grad_infer(specs, scale):
    if len(specs) not in (5, 6):
        raise ValueError(f"attention_grad takes q, k, v, an optional mask, the output and its gradient, "
                         f"got {len(specs)} inputs")
    operands, out, g = specs[:-2], specs[-2], specs[-1]
    q, v = _check_operands(operands, "attention_grad")
    want = q.shape[:-1] + (v.shape[-1],)
    if out.shape != want or g.shape != want or out.dtype != q.dtype or g.dtype != q.dtype:
        raise ValueError(f"attention_grad: the output and its gradient must be {q.dtype.name} {want}, got "
                         f"{out.dtype.name} {out.shape} and {g.dtype.name} {g.shape}")
    return [spec(s.shape, s.dtype) for s in operands[:3]]


def _attention_grad_kernel(q, k, v, *rest, scale):
    """(dq, dk, dv) with the probabilities recomputed: with P the probabilities and dO the output's
    gradient, dv = P^T dO, dS = P * (dO v^T - rowsum(dO * O)), dq = dS k * scale, dk = dS^T q * scale."""
    mask = rest[0] if len(rest) == 3 else None
    out, g = rest[-2], rest[-1]
    w = wide_dtype(q.dtype)
    p = _probabilities(q, k, mask, scale, w)
    gw = g.astype(w)
    dv = np.matmul(np.swapaxes(p, -1, -2), gw)
    ds = p * (np.matmul(gw, np.swapaxes(v.astype(w), -1, -2)) - np.sum(gw * out.astype(w), axis=-1, keepdims=True))
    dq = np.matmul(ds, k.astype(w)) * w.type(scale)
    dk = np.matmul(np.swapaxes(ds, -1, -2), q.astype(w)) * w.type(scale)
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)


register(OpDef("attention_grad", _attention_grad_infer, _attention_grad_kernel, grad=Grad.RAISE, family="nn",
               attributes={"scale": "float"}))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, scale: float = 1.0) -> Tensor:
    """The fused op (what ``fuse_attention`` makes): softmax(q @ k^T * scale + mask) @ v.

    Args:
        q: Queries (..., Sq, D).
        k: Keys (..., Sk, D), the leading axes as q's.
        v: Values (..., Sk, Dv), the leading axes as q's.
        mask: Added to the scores before the softmax; broadcasts to (..., Sq, Sk).
        scale: Multiplies q @ k^T.

    Returns:
        The attention output (..., Sq, Dv).

    Raises:
        TypeError: If the operands are not of one floating point dtype.
        ValueError: If their shapes do not fit together.
    """
    return create_op("attention", [q, k, v] + ([mask] if mask is not None else []), {"scale": float(scale)})[0]


@grad_rule("attention")
def _attention_grad(ctx):
    n = len(ctx.op.inputs)
    if n == 4 and ctx.needs(3):
        raise ValueError(f"attention {ctx.op.name!r}: the gradient of the additive mask "
                         f"({ctx.op.inputs[3].id!r}) is not computed; fuse_attention leaves attention with a "
                         "mask that needs one unfused")
    ins = [ctx.input(i) for i in range(n)]
    dq, dk, dv = create_op("attention_grad", [*ins, ctx.output(0), ctx.grad(0)], {"scale": ctx.attrs["scale"]})
    return [dq if ctx.needs(0) else None, dk if ctx.needs(1) else None, dv if ctx.needs(2) else None] + [None] * (n - 3)
