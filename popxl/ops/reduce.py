"""Reductions over axes: sum, mean, prod, max, min, median, l1, l2, logsum, logsumexp, sumsquare."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, Union

import numpy as np

from popxl.op import OpDef, create_op, register
from popxl.ops.utils import normalize_axes, spec
from popxl.tensor import Tensor

__all__ = ["l1", "l2", "logsum", "logsumexp", "max", "mean", "median", "min", "prod", "sum", "sumsquare"]


def _reduce_infer(specs, axis, keepdims):
    s = specs[0]
    if s.dtype.is_complex or s.dtype.name == "bool":
        raise TypeError(f"cannot reduce a {s.dtype.name} tensor")
    shape = [1 if i in axis else d for i, d in enumerate(s.shape)] if keepdims else \
        [d for i, d in enumerate(s.shape) if i not in axis]
    return [spec(shape, s.dtype)]


def _wide(fn: Callable) -> Callable:
    """Reduce in float32 or wider for low-precision floats, return the input dtype."""
    def k(x, axis, keepdims):
        w = x.astype(np.float32) if x.dtype.kind == "f" and x.dtype.itemsize < 4 else x
        return np.asarray(fn(w, axis=axis, keepdims=keepdims)).astype(x.dtype)
    return k


def _logsumexp(x, axis, keepdims):
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


_REDUCTIONS: Dict[str, tuple] = {
    "sum": (np.sum, "Sum over axes."),
    "mean": (np.mean, "Mean over axes."),
    "prod": (np.prod, "Product over axes."),
    "max": (np.max, "Maximum over axes."),
    "min": (np.min, "Minimum over axes."),
    "median": (np.median, "Median over axes (mean of the two middle values for even counts)."),
    "l1": (lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims), "Sum of |x|."),
    "l2": (lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)), "sqrt(sum x^2)."),
    "logsum": (lambda x, axis, keepdims: np.log(np.sum(x, axis=axis, keepdims=keepdims)), "log(sum x)."),
    "logsumexp": (_logsumexp, "log(sum exp x), computed stably."),
    "sumsquare": (lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims), "Sum of x^2."),
}


def _make(opname: str, doc: str) -> Callable:
    def fn(t: Tensor, axis: Optional[Union[int, Iterable[int]]] = None, keepdims: bool = False) -> Tensor:
        try:
            axes = normalize_axes(t.rank, axis) if t.rank else ()
        except (ValueError, TypeError) as e:
            raise type(e)(f"ops.{opname}: {e} (tensor {t.id!r} of shape {t.shape})") from None
        return create_op(opname, [t], {"axis": axes, "keepdims": bool(keepdims)})[0]
    fn.__name__ = fn.__qualname__ = opname
    fn.__doc__ = doc + " ``axis`` None reduces all axes; negative axes count from the end."
    return fn


for _name, (_fn, _doc) in _REDUCTIONS.items():
    register(OpDef(_name, _reduce_infer, _wide(_fn), family="reduce"))
    globals()[_name] = _make(_name, _doc)
