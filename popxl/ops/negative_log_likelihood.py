"""Negative log-likelihood losses: ``nll_loss`` and ``nll_loss_with_softmax_grad`` (with their
gradient), under PopXL's module path, with its ``REDUCTION_TYPE``."""
from __future__ import annotations

import math
from typing import Literal, Optional, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.fp8 import FP8
from popxl.ops.utils import as_tensor, op_error, spec, wide_dtype
from popxl.tensor import Tensor

__all__ = ["nll_loss", "nll_loss_with_softmax_grad", "REDUCTION_TYPE"]

REDUCTION_TYPE = Literal["mean", "sum", "none"]


_REDUCTIONS = ("mean", "sum", "none")


def _nll_check(probs, labels, reduction, any_label_shape: bool = False) -> Tuple[int, ...]:
    """The loss's shape. Labels have shape ``probs.shape[:-1]``, or with ``any_label_shape`` (PopART's
    softmax-gradient op checks no shape) any shape of as many elements, which a "none" loss takes."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, not {reduction!r}")
    if not probs.shape:
        raise ValueError("probs must have a class axis (rank >= 1)")
    if not probs.dtype.is_floating_point or probs.dtype in FP8:
        raise TypeError(f"probs must be float16/float32/float64, got {probs.dtype.name}")
    if not labels.dtype.is_int:
        raise TypeError(f"labels must be integers, got {labels.dtype.name}")
    if any_label_shape and math.prod(labels.shape) != math.prod(probs.shape[:-1]):
        raise ValueError(f"labels must have as many elements as probs.shape[:-1] = {probs.shape[:-1]} "
                         f"({math.prod(probs.shape[:-1])}), got shape {labels.shape}")
    if not any_label_shape and labels.shape != probs.shape[:-1]:
        raise ValueError(f"labels must have shape probs.shape[:-1] = {probs.shape[:-1]}, got {labels.shape}")
    return labels.shape if reduction == "none" else ()


def _nll_infer(specs, ignore_index, reduction, log_prob):
    probs, labels = specs
    return [spec(_nll_check(probs, labels, reduction), probs.dtype)]


def _nll_items(probs, labels, ignore_index, log_prob, opname):
    """Per-item losses (float32 or wider), the mask of counted items and the clamped labels;
    errors name the op ``opname``."""
    c = probs.shape[-1]
    keep = np.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
    bad = keep & ((labels < 0) | (labels >= c))
    if bad.any():
        raise ValueError(f"{opname}: label {labels[bad].reshape(-1)[0]} is out of range for {c} classes")
    idx = np.where(keep, labels, 0).astype(np.int64)
    w = wide_dtype(probs.dtype)
    picked = np.take_along_axis(probs.astype(w), idx[..., None], axis=-1)[..., 0]
    if log_prob:
        item = -picked
    else:
        eps = 6.104e-5 if probs.dtype == np.float16 else 1e-7
        item = -np.log(np.maximum(picked, w.type(eps)))
    return np.where(keep, item, 0).astype(w), keep, idx


def _reduce_loss(item, keep, reduction):
    if reduction == "none":
        return item
    total = item.sum()
    return total / max(int(keep.sum()), 1) if reduction == "mean" else total


def _nll_kernel(probs, labels, ignore_index, reduction, log_prob):
    item, keep, _ = _nll_items(probs, labels, ignore_index, log_prob, "nll_loss")
    return np.asarray(_reduce_loss(item, keep, reduction)).astype(probs.dtype)


register(OpDef("nll_loss", _nll_infer, _nll_kernel, family="nn",
               attributes={"ignore_index": "int?", "reduction": "str", "log_prob": "bool"}))


def _nll_args(opname, ignore_index, reduction):
    if reduction not in _REDUCTIONS:
        raise op_error(opname, ValueError(f"reduction must be one of {_REDUCTIONS}, not {reduction!r}"))
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer))):
        raise op_error(opname, TypeError(f"ignore_index must be an int or None, not {ignore_index!r}"))
    return None if ignore_index is None else int(ignore_index)


def nll_loss(probs: Tensor, labels: Tensor, ignore_index: Optional[int] = None,
             reduction: Literal["mean", "sum", "none"] = "mean", log_prob: bool = False) -> Tensor:
    """Negative log likelihood of integer labels under class probabilities (classes on the last axis).

    Each item's loss is ``-log(max(p[label], eps))`` with eps 1e-7 (6.104e-5 for float16), or
    ``-p[label]`` when ``log_prob`` says the inputs are log-probabilities already.

    Args:
        probs: Probabilities (or log-probabilities), classes on the last axis.
        labels: Integer labels of shape ``probs.shape[:-1]``.
        ignore_index: A label whose items count 0 (and are not counted by "mean").
        reduction: "mean" (divided by the counted items, at least 1), "sum", or "none" (the
            per-item losses in the labels' shape).
        log_prob: Whether ``probs`` holds log-probabilities.

    Returns:
        A new tensor: a scalar, or the labels' shape for "none".

    Raises:
        TypeError: If ``probs`` or ``labels`` is not a Tensor, or ``labels`` is not integer.
        ValueError: If ``reduction`` is unknown, the labels' shape is not ``probs.shape[:-1]``, or a
            tensor is not in the current graph.
    """
    ignore_index = _nll_args("nll_loss", ignore_index, reduction)
    return create_op("nll_loss", [probs, labels], {"ignore_index": ignore_index, "reduction": reduction,
                                                   "log_prob": bool(log_prob)})[0]


def _nll_softmax_infer(specs, ignore_index, reduction):
    probs, labels, lg = specs
    out = _nll_check(probs, labels, reduction, any_label_shape=True)
    if not lg.dtype.is_floating_point or lg.dtype in FP8:
        raise TypeError(f"loss_grad must be a float16/float32/float64 tensor, got {lg.dtype.name}")
    allowed = (labels.shape,) if reduction == "none" else ()
    if math.prod(lg.shape) != 1 and lg.shape not in allowed:
        raise ValueError(f"loss_grad must be a scalar{' or have the labels shape' if allowed else ''}, "
                         f"got shape {lg.shape}")
    return [spec(out, probs.dtype), spec(probs.shape, probs.dtype)]


def _nll_softmax_kernel(probs, labels, loss_grad, ignore_index, reduction):
    labels_shape = labels.shape
    labels = labels.reshape(probs.shape[:-1])  # any shape of as many elements (PopART)
    if reduction == "none" and loss_grad.size != 1:
        loss_grad = loss_grad.reshape(labels.shape)
    item, keep, idx = _nll_items(probs, labels, ignore_index, False, "nll_loss_with_softmax_grad")
    w = item.dtype
    grad = probs.astype(w).copy()
    np.put_along_axis(grad, idx[..., None], np.take_along_axis(grad, idx[..., None], -1) - 1, axis=-1)
    if reduction == "none":
        scale = np.broadcast_to(loss_grad.astype(w).reshape(loss_grad.shape if loss_grad.size != 1 else ()),
                                labels.shape)
    else:
        scale = np.full(labels.shape, loss_grad.astype(w).reshape(-1)[0], w)
        if reduction == "mean":
            scale = scale / max(int(keep.sum()), 1)
    grad = grad * np.where(keep, scale, 0)[..., None]
    loss = np.asarray(_reduce_loss(item, keep, reduction)).astype(probs.dtype)
    return (loss.reshape(labels_shape) if reduction == "none" else loss), grad.astype(probs.dtype)


register(OpDef("nll_loss_with_softmax_grad", _nll_softmax_infer, _nll_softmax_kernel, grad=Grad.STOP, family="nn",
               attributes={"ignore_index": "int?", "reduction": "str"}))


def nll_loss_with_softmax_grad(probs: Tensor, labels: Tensor, loss_grad: Union[float, Tensor] = 1,
                               ignore_index: Optional[int] = None,
                               reduction: Literal["mean", "sum", "none"] = "mean") -> Tuple[Tensor, Tensor]:
    """`nll_loss` of ``probs = softmax(x)`` together with its gradient with respect to the logits ``x``.

    The gradient is ``(probs - onehot(labels)) * loss_grad``, divided by the counted items for
    "mean", and zero for ignored items. No gradient flows through this op.

    Args:
        probs: Softmax probabilities, classes on the last axis.
        labels: Integer labels, one per row of ``probs``: shape ``probs.shape[:-1]`` or any other of
            as many elements (read in C order, as PopART does); a "none" loss has the labels' shape.
        loss_grad: The incoming gradient of the loss: a float (made a float32 constant) or a tensor
            (of the labels' shape for "none").
        ignore_index: A label whose items count 0.
        reduction: "mean", "sum" or "none", as for `nll_loss`.

    Returns:
        ``(loss, gradient)``: the loss as `nll_loss` gives it, and a tensor of ``probs``' shape.

    Raises:
        TypeError: If ``probs`` or ``labels`` is not a Tensor, or ``labels`` is not integer.
        ValueError: If ``reduction`` is unknown, the labels' element count is not that of
            ``probs.shape[:-1]``, or a tensor is not in the current graph.
    """
    ignore_index = _nll_args("nll_loss_with_softmax_grad", ignore_index, reduction)
    if not isinstance(loss_grad, Tensor):
        loss_grad = as_tensor(float(loss_grad), dtype=dtypes.float32)
    loss, grad = create_op("nll_loss_with_softmax_grad", [probs, labels, loss_grad],
                           {"ignore_index": ignore_index, "reduction": reduction})
    return loss, grad


def _nll_grad_infer(specs, ignore_index, reduction, log_prob):
    return [specs[0]]


def _nll_grad_kernel(probs, labels, grad, ignore_index, reduction, log_prob):
    item, keep, idx = _nll_items(probs, labels, ignore_index, log_prob, "nll_loss_grad")
    w = item.dtype
    scale = np.broadcast_to(grad.astype(w), labels.shape) if reduction == "none" else \
        np.full(labels.shape, grad.astype(w).reshape(-1)[0], w)
    if reduction == "mean":
        scale = scale / max(int(keep.sum()), 1)
    picked = np.take_along_axis(probs.astype(w), idx[..., None], -1)[..., 0]
    eps = 6.104e-5 if probs.dtype == np.float16 else 1e-7
    # d(-log max(p, eps))/dp = -1/p above eps, 0 where the clamp holds
    local = np.full_like(picked, -1.0) if log_prob else np.where(picked > eps, -1.0 / np.maximum(picked, eps), 0.0)
    out = np.zeros(probs.shape, w)
    np.put_along_axis(out, idx[..., None], np.where(keep, scale * local, 0)[..., None], axis=-1)
    return out.astype(probs.dtype)


register(OpDef("nll_loss_grad", _nll_grad_infer, _nll_grad_kernel, grad=Grad.RAISE, family="nn",
               attributes={"ignore_index": "int?", "reduction": "str", "log_prob": "bool"}))


@grad_rule("nll_loss")
def _nll_loss_grad(ctx):
    return [create_op("nll_loss_grad", [ctx.input(0), ctx.input(1), ctx.grad(0)], ctx.attrs)[0], None]
