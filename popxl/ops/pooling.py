"""Pools: ``max_pool`` and ``average_pool`` over the windows of `popxl.ops.windows`, and their
gradients."""
from __future__ import annotations

from typing import Literal, Optional, Tuple

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.fp8 import FP8
from popxl.ops.utils import op_error, per_dim_ints, spec, tensor_shape_of, wide_dtype
from popxl.ops.windows import LAYOUTS, PadType, check_pad_type, out_shape, resolve_pads, windows, windows_adjoint
from popxl.tensor import Tensor

__all__ = ["average_pool", "max_pool"]


_POOL_ATTRS = {"kernel": "ints", "strides": "ints", "pads": "ints", "dilations": "ints", "ceil_mode": "bool"}  # every pooling op

def pool_infer(specs, kernel, strides, pads, dilations, ceil_mode, layouts=None, **_):
    x = specs[0]
    if layouts is not None and (len(layouts) != 2 or any(v not in LAYOUTS for v in layouts) or len(x.shape) != 4):
        raise ValueError(f"layouts must be two of {LAYOUTS} (x, y) for a 2-D pool, got {layouts!r}")
    r = len(x.shape) - 2
    if r < 1:
        raise ValueError(f"input must be (N, C, spatial...), got shape {x.shape}")
    if not x.dtype.is_floating_point or x.dtype in FP8:
        raise TypeError(f"needs a float16/float32/float64 tensor, got {x.dtype.name}")
    if len(kernel) != r or len(strides) != r or len(dilations) != r or len(pads) != 2 * r:
        raise ValueError(f"a {r}-D pool needs {r} kernel sizes, strides and dilations and {2 * r} pads, "
                         f"got {kernel}, {strides}, {dilations}, {pads}")
    if any(v < 1 for v in kernel + strides + dilations):
        raise ValueError(f"kernel sizes, strides and dilations must be >= 1, got {kernel}, {strides}, {dilations}")
    for i in range(r):
        eff = (kernel[i] - 1) * dilations[i] + 1
        if not (0 <= pads[i] < eff and 0 <= pads[r + i] < eff):
            raise ValueError(f"pads must be >= 0 and smaller than the (dilated) kernel, got {pads} for kernel {kernel}")
    return [spec(x.shape[:2] + out_shape(x.shape[2:], kernel, strides, dilations, pads, ceil_mode), x.dtype)]


# ``layouts`` (x, y; native engine only) as conv_fused's: the values are the same either way.
def max_pool_kernel(x, kernel, strides, pads, dilations, ceil_mode, storage_order, layouts=None):
    win = windows(x, kernel, strides, dilations, pads, ceil_mode, fill=-np.inf)
    r = len(kernel)
    return win.max(axis=tuple(range(-r, 0)))


def _average_pool_kernel(x, kernel, strides, pads, dilations, ceil_mode, layouts=None):
    r = len(kernel)
    k_axes = tuple(range(-r, 0))
    wide = x.astype(wide_dtype(x.dtype))
    total = windows(wide, kernel, strides, dilations, pads, ceil_mode).sum(axis=k_axes)
    ones = np.ones((1, 1) + x.shape[2:], wide.dtype)
    count = windows(ones, kernel, strides, dilations, pads, ceil_mode).sum(axis=k_axes)
    return (total / count).astype(x.dtype)


register(OpDef("max_pool", pool_infer, max_pool_kernel, family="nn",
               attributes={**_POOL_ATTRS, "storage_order": "str", "layouts": "strs?"}))


register(OpDef("average_pool", pool_infer, _average_pool_kernel, family="nn",
               attributes={**_POOL_ATTRS, "layouts": "strs?"}))


def _pool_attrs(opname, t, kernel_size, stride, padding, out_pads, dilation, in_dilations, auto_pad, ceil_mode):
    xs = tensor_shape_of(t, "t", opname)
    try:
        r = len(xs) - 2
        if r < 1:
            raise ValueError(f"input must be (N, C, spatial...), got shape {xs}")
        if kernel_size is None:
            raise ValueError("kernel_size is required")
        kernel = per_dim_ints(kernel_size, r, "kernel_size", -1)
        strides = per_dim_ints(stride, r, "stride", 1)
        dilations = per_dim_ints(dilation, r, "dilation", 1)
        pads = per_dim_ints(padding, 2 * r, "padding", 0)
        if any(v != 0 for v in per_dim_ints(out_pads, 2 * r, "out_pads", 0)):
            raise NotImplementedError(f"non-zero out_pads {tuple(out_pads)} are not supported")
        if any(v != 1 for v in per_dim_ints(in_dilations, r, "in_dilations", 1)):
            raise NotImplementedError(f"input dilations {tuple(in_dilations)} other than 1 are not supported")
        auto_pad = check_pad_type(auto_pad, "auto_pad")
        pads = resolve_pads(xs[2:], kernel, strides, dilations, pads, auto_pad)
        return {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations,
                "ceil_mode": bool(ceil_mode)}
    except (TypeError, ValueError, NotImplementedError) as e:
        raise op_error(opname, e) from None


def average_pool(t: Tensor, kernel_size: Tuple[int, ...], stride: Optional[Tuple[int, ...]] = None,
                 padding: Optional[Tuple[int, ...]] = None, out_pads: Optional[Tuple[int, ...]] = None,
                 dilation: Optional[Tuple[int, ...]] = None, in_dilations: Optional[Tuple[int, ...]] = None,
                 auto_pad: Optional[PadType] = "not_set", ceil_mode: bool = False) -> Tensor:
    """Mean over each window of the spatial dimensions, as ONNX AveragePool.

    Padded positions are not counted in the mean.

    Args:
        t: The input, ``(N, C, *spatial)``.
        kernel_size: The window size per spatial dimension.
        stride: The step per spatial dimension; default 1.
        padding: The begin pads of each spatial dimension, then the end pads; default 0.
        out_pads: Output padding; only zeros are supported.
        dilation: The window dilation per spatial dimension; default 1.
        in_dilations: Input dilation; only ones are supported.
        auto_pad: "not_set" (use ``padding``), "same_upper", "same_lower" or "valid".
        ceil_mode: Round the output size up instead of down (a last window that would start inside
            the end padding is dropped).

    Returns:
        A new tensor ``(N, C, *out)`` of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If the window parameters do not fit ``t``'s spatial dimensions, ``auto_pad`` is
            unknown, or ``t`` is not in the current graph.
        NotImplementedError: If ``out_pads`` is not zero or ``in_dilations`` is not one.
    """
    attrs = _pool_attrs("average_pool", t, kernel_size, stride, padding, out_pads, dilation, in_dilations,
                        auto_pad, ceil_mode)
    return create_op("average_pool", [t], attrs)[0]


def max_pool(t: Tensor, kernel_size: Tuple[int, ...], stride: Optional[Tuple[int, ...]] = None,
             padding: Optional[Tuple[int, ...]] = None, out_pads: Optional[Tuple[int, ...]] = None,
             dilation: Optional[Tuple[int, ...]] = None, in_dilations: Optional[Tuple[int, ...]] = None,
             auto_pad: Optional[PadType] = "not_set", ceil_mode: bool = False,
             storage_order: Literal["row", "column"] = "row") -> Tensor:
    """Maximum over each (optionally dilated) window of the spatial dimensions, as ONNX MaxPool.

    Padding never wins.

    Args:
        t: The input, ``(N, C, *spatial)``.
        kernel_size: The window size per spatial dimension.
        stride: The step per spatial dimension; default 1.
        padding: The begin pads of each spatial dimension, then the end pads; default 0.
        out_pads: Output padding; only zeros are supported.
        dilation: The window dilation per spatial dimension; default 1.
        in_dilations: Input dilation; only ones are supported.
        auto_pad: "not_set" (use ``padding``), "same_upper", "same_lower" or "valid".
        ceil_mode: Round the output size up instead of down (a last window that would start inside
            the end padding is dropped).
        storage_order: "row" or "column": the layout of indices, which this op does not return.

    Returns:
        A new tensor ``(N, C, *out)`` of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If the window parameters do not fit ``t``'s spatial dimensions, ``auto_pad`` is
            unknown, or ``t`` is not in the current graph.
        NotImplementedError: If ``out_pads`` is not zero or ``in_dilations`` is not one.
    """
    if storage_order not in ("row", "column"):
        raise op_error("max_pool", ValueError(f"storage_order must be 'row' or 'column', not {storage_order!r}"))
    attrs = _pool_attrs("max_pool", t, kernel_size, stride, padding, out_pads, dilation, in_dilations,
                        auto_pad, ceil_mode)
    attrs["storage_order"] = storage_order
    return create_op("max_pool", [t], attrs)[0]


def _pool_grad_infer(specs, **_):
    return [specs[0]]


def _max_pool_grad_kernel(x, g, kernel, strides, pads, dilations, ceil_mode, storage_order):
    """The gradient goes to the first maximum of each window."""
    r = len(kernel)
    win = windows(x, kernel, strides, dilations, pads, ceil_mode, fill=-np.inf)
    flat = win.reshape(win.shape[:-r] + (-1,))
    first = np.argmax(flat, axis=-1)[..., None]
    wide = g.astype(wide_dtype(g.dtype))
    dflat = np.zeros(flat.shape, wide.dtype)
    np.put_along_axis(dflat, first, wide[..., None], axis=-1)
    dx = windows_adjoint(dflat.reshape(win.shape), x.shape, kernel, strides, dilations, pads, ceil_mode)
    return dx.astype(x.dtype)


def _average_pool_grad_kernel(x, g, kernel, strides, pads, dilations, ceil_mode):
    """Each output's gradient is shared equally by the input positions it averaged."""
    r = len(kernel)
    wide = wide_dtype(x.dtype)
    ones = np.ones((1, 1) + x.shape[2:], wide)
    count = windows(ones, kernel, strides, dilations, pads, ceil_mode).sum(axis=tuple(range(-r, 0)))
    share = g.astype(wide) / count
    dwin = np.broadcast_to(share.reshape(share.shape + (1,) * r), share.shape + tuple(kernel))
    return windows_adjoint(dwin, x.shape, kernel, strides, dilations, pads, ceil_mode).astype(x.dtype)


register(OpDef("max_pool_grad", _pool_grad_infer, _max_pool_grad_kernel, grad=Grad.RAISE, family="nn",
               attributes={**_POOL_ATTRS, "storage_order": "str"}))


register(OpDef("average_pool_grad", _pool_grad_infer, _average_pool_grad_kernel, grad=Grad.RAISE, family="nn",
               attributes=_POOL_ATTRS))


@grad_rule("max_pool", "average_pool")
def _pool_grad(ctx):
    return [create_op(ctx.op.type + "_grad", [ctx.input(0), ctx.grad(0)], ctx.attrs)[0]]
