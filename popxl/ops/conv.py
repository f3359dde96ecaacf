"""Convolutions: ``conv``, ``conv_transpose`` and their float8 (pow2-scaled) forms, ``conv_fused``
(what ``popxl.transforms.fuse_conv`` makes of conv + batch norm / bias + relu or clip + residual +
max pool) and ``conv_grad``. Also PopXL's module path: ``from popxl.ops.conv import conv, PadType``;
``popxl.ops.conv`` stays the function, as in PopXL (the package imports this module before it binds
its op names).

Convolution is the windows of `popxl.ops.windows` contracted with the weights (im2col + einsum);
the transposed convolution is a convolution of the stride-dilated input with the flipped,
channel-swapped kernel."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.fp8 import FP8, check_fp8_operands, check_log2_scale, scale_value
from popxl.ops.normalisation import channel_column, per_channel_check
from popxl.ops.pooling import max_pool_kernel, pool_infer
from popxl.ops.utils import op_error, per_dim_ints, same_dtype, spec, tensor_shape_of, wide_dtype
from popxl.ops.windows import LAYOUTS, PadType, check_pad_type, out_shape, resolve_pads, windows, windows_adjoint
from popxl.tensor import Tensor

__all__ = ["conv", "conv_transpose", "conv_pow2scaled", "conv_transpose_pow2scaled", "PadType"]


_CONV_ATTRS = {"strides": "ints", "dilations": "ints", "groups": "int", "pads": "ints"}  # every convolution

def _conv_check(x, w, strides, pads, dilations, groups, transposed: bool, fp8: bool) -> int:
    """Validate a (transposed) convolution; returns the number of output channels."""
    r = len(x.shape) - 2
    if r < 1 or r > 3:
        raise ValueError(f"input must be (N, C, spatial...) with 1 to 3 spatial dims, got shape {x.shape}")
    if len(w.shape) != r + 2:
        raise ValueError(f"weight must have rank {r + 2} for a {r}-D convolution, got shape {w.shape}")
    if fp8:
        check_fp8_operands([x, w])
    else:
        dt = same_dtype([x, w])
        if not dt.is_floating_point or dt in FP8:
            raise TypeError(f"needs float16/float32/float64 tensors, got {dt.name} (float8: use the pow2scaled op)")
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if len(strides) != r or len(dilations) != r or len(pads) != 2 * r:
        raise ValueError(f"need {r} strides, {r} dilations and {2 * r} pads, got {strides}, {dilations}, {pads}")
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise ValueError(f"strides and dilations must be >= 1, got {strides} and {dilations}")
    c = x.shape[1]
    if c % groups:
        raise ValueError(f"input channels ({c}) are not divisible by groups ({groups})")
    if transposed:
        if w.shape[0] != c:
            raise ValueError(f"weight must be (C={c}, M/groups, k...) for conv_transpose, got {w.shape}")
        return w.shape[1] * groups
    if any(p < 0 for p in pads):
        raise ValueError(f"padding must be >= 0, got {pads}")
    m = w.shape[0]
    if w.shape[1] != c // groups:
        raise ValueError(f"weight must be (M, C/groups={c // groups}, k...), got {w.shape} "
                         f"(input has {c} channels, groups={groups})")
    if m % groups:
        raise ValueError(f"output channels ({m}) are not divisible by groups ({groups})")
    return m


def _conv_infer(specs, strides, pads, dilations, groups, fp8=False):
    x, w = specs[:2]
    if fp8:
        check_log2_scale(specs[2])
    m = _conv_check(x, w, strides, pads, dilations, groups, False, fp8)
    out = out_shape(x.shape[2:], w.shape[2:], strides, dilations, pads)
    return [spec((x.shape[0], m) + out, dtypes.float16 if fp8 else x.dtype)]


def _conv_compute(x, w, strides, pads, dilations, groups) -> np.ndarray:
    """Grouped N-D convolution in the accumulation dtype: gather windows, contract with weights."""
    wide = wide_dtype(x.dtype)
    r = x.ndim - 2
    k = w.shape[2:]
    win = windows(x.astype(wide), k, strides, dilations, pads)  # (N, C, *O, *K)
    n, c = x.shape[:2]
    out = win.shape[2:2 + r]
    m, g = w.shape[0], groups
    win = win.reshape((n, g, c // g) + out + k)
    wg = w.astype(wide).reshape((g, m // g, c // g) + k)
    o_ax, k_ax = "opq"[:r], "xyz"[:r]
    res = np.einsum(f"ngc{o_ax}{k_ax},gmc{k_ax}->ngm{o_ax}", win, wg, optimize=True)
    return res.reshape((n, m) + out)


def _conv_kernel(x, w, strides, pads, dilations, groups):
    return _conv_compute(x, w, strides, pads, dilations, groups).astype(x.dtype)


def _conv_pow2_kernel(x, w, s, strides, pads, dilations, groups):
    scale = scale_value(s, "conv_pow2scaled")
    return (_conv_compute(x, w, strides, pads, dilations, groups) * scale).astype(np.float16)


register(OpDef("conv", _conv_infer, _conv_kernel, family="nn",
               attributes=_CONV_ATTRS))


# conv_fused: relu(conv(x, w) + bias[c] + residual), the residual and the relu optional; or, with
# ``clip`` = (lo, hi) in place of the relu, clip(..., lo, hi) (ReLU6 is clip 0, 6). Not a public
# op: `popxl.transforms.fuse_conv` makes it from conv / batch_norm_inference / add / relu / clip
# chains so that the native engine runs the chain as one oneDNN convolution with post-ops.
#
# ``layouts`` (optional, native engine only) says how x, y and the residual are laid out in memory:
# "nchw" (the default) or "nhwc" for a 4-D tensor that only conv_fused ops read and write, so
# consecutive convolutions skip the reorders to and from NCHW (`keep_channels_last`). The values
# are the same either way, so the reference kernel ignores it.
#
# ``pool_kernel``, ``pool_strides``, ``pool_pads``, ``pool_dilations``, ``pool_ceil_mode`` (optional,
# all or none): a 2-D max pool of that result, attributes as max_pool's; the output is the pooled
# value. `fuse_conv_post_ops` makes it from a conv_fused whose only reader is a max_pool (ResNet's
# stem) so that the native engine pools each batch slice while the slice's result is still in
# cache. Not with a residual.


_POOL_ATTRS = ("pool_kernel", "pool_strides", "pool_pads", "pool_dilations", "pool_ceil_mode")


def conv_pool_attrs(max_pool_attrs: dict) -> dict:
    """A max_pool op's attributes as the pool_* attributes of the conv_fused it joins."""
    return {name: max_pool_attrs[name[len("pool_"):]] for name in _POOL_ATTRS}


def _pool_of(pool: dict) -> Optional[dict]:
    """conv_fused's pool_* attributes as max_pool's (kernel, strides, ...); None without a pool."""
    if not pool:
        return None
    if set(pool) != set(_POOL_ATTRS):
        raise ValueError(f"a pooled conv_fused needs all of {_POOL_ATTRS}, got {sorted(pool)}")
    return {k[len("pool_"):]: v for k, v in pool.items()}


def _conv_fused_infer(specs, strides, pads, dilations, groups, residual: bool, relu: bool, layouts=None, clip=None,
                      **pool):
    if layouts is not None and (len(layouts) != 3 or any(v not in LAYOUTS for v in layouts)):
        raise ValueError(f"layouts must be three of {LAYOUTS} (x, y, residual), got {layouts!r}")
    if clip is not None and (relu or len(clip) != 2 or not clip[0] <= clip[1]):
        raise ValueError(f"clip must be two bounds lo <= hi, and not with relu; got clip={clip!r}, relu={relu}")
    if len(specs) != 3 + int(residual):
        raise ValueError(f"takes (x, weight, bias{', residual' if residual else ''}), got {len(specs)} inputs")
    (y,) = _conv_infer(specs[:2], strides, pads, dilations, groups)
    per_channel_check(y, specs[2:3], ("bias",))
    if residual and (specs[3].shape != y.shape or specs[3].dtype is not y.dtype):
        raise ValueError(f"residual must be {y.shape} {y.dtype.name} like the convolution's output, "
                         f"got {specs[3].shape} {specs[3].dtype.name}")
    pooled = _pool_of(pool)
    if pooled is None:
        return [y]
    if residual or len(y.shape) != 4:
        raise ValueError(f"a max pool is fused only into a 2-D convolution without a residual (output {y.shape}, "
                         f"residual {residual})")
    return pool_infer([y], **pooled)


def _conv_fused_kernel(x, w, bias, *rest, strides, pads, dilations, groups, residual: bool, relu: bool,
                       layouts=None, clip=None, **pool):
    """In the accumulation dtype, rounded once at the end (as the oneDNN kernel does); a fused max
    pool picks among the rounded values."""
    y = _conv_compute(x, w, strides, pads, dilations, groups) + channel_column(bias, x.ndim, wide_dtype(x.dtype))
    if residual:
        y = y + rest[0].astype(y.dtype)
    if clip is not None:
        y = np.clip(y, *clip)
    y = (np.maximum(y, 0) if relu else y).astype(x.dtype)
    pooled = _pool_of(pool)
    return y if pooled is None else max_pool_kernel(y, storage_order="row", **pooled)


def _conv_fused_overwritable(residual: bool, layouts=None, **_) -> Tuple[int, ...]:
    """The result may be written over a residual laid out as it is: the kernels add the residual
    into the destination before the convolution writes it (oneDNN's sum post-op)."""
    same = layouts is None or layouts[1] == layouts[2]
    return (3,) if residual and same else ()


register(OpDef("conv_fused", _conv_fused_infer, _conv_fused_kernel, grad=Grad.RAISE, family="nn",
               overwritable=_conv_fused_overwritable,
               attributes={**_CONV_ATTRS, "residual": "bool", "relu": "bool", "clip": "floats?",
                           "pool_kernel": "ints?", "pool_strides": "ints?", "pool_pads": "ints?",
                           "pool_dilations": "ints?", "pool_ceil_mode": "bool?", "layouts": "strs?"}))


def conv_fused(t: Tensor, weight: Tensor, bias: Tensor, residual: Optional[Tensor] = None, relu: bool = False,
               clip: Optional[Tuple[float, float]] = None, **conv_attrs: Any) -> Tensor:
    """relu(conv(t, weight) + bias + residual) as one op, or clip(..., *clip) instead of the relu;
    ``conv_attrs`` are the explicit attributes of a `conv` op (strides, pads, dilations, groups),
    and optionally the pool_* attributes of a max pool of the result."""
    inputs = [t, weight, bias] + ([residual] if residual is not None else [])
    attrs = {**conv_attrs, "residual": residual is not None, "relu": relu}
    if clip is not None:
        attrs["clip"] = (float(clip[0]), float(clip[1]))
    return create_op("conv_fused", inputs, attrs)[0]


register(OpDef("conv_pow2scaled", lambda specs, **a: _conv_infer(specs, fp8=True, **a), _conv_pow2_kernel,
               grad=Grad.RAISE, family="nn",
               attributes=_CONV_ATTRS))


def _conv_transpose_pads(sizes, kernel, strides, dilations, pads, pad_type, output_padding, output_shape):
    """Explicit output crops (begins + ends) of a transposed convolution, ONNX ConvTranspose rules:
    with ``output_shape`` (or "same_*", whose output is size*stride) the total crop is derived from
    the wanted size and split in two halves, the larger half at the end for "same_upper" and at
    the beginning otherwise; "valid" crops nothing."""
    r = len(sizes)
    if pad_type == "valid":
        return (0,) * (2 * r)
    if not output_shape and pad_type in ("same_upper", "same_lower"):
        output_shape = tuple(n * s for n, s in zip(sizes, strides))
    if not output_shape:
        return tuple(pads)
    begins, ends = [], []
    for i in range(r):
        full = strides[i] * (sizes[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1
        total = full - output_shape[i]
        half = total // 2
        begins.append(half if pad_type == "same_upper" else total - half)
        ends.append(total - begins[-1])
    return tuple(begins + ends)


def _conv_transpose_infer(specs, strides, pads, dilations, groups, output_padding, fp8=False):
    x, w = specs[:2]
    if fp8:
        check_log2_scale(specs[2])
    m = _conv_check(x, w, strides, pads, dilations, groups, True, fp8)
    r = len(strides)
    if len(output_padding) != r:
        raise ValueError(f"output_padding needs {r} values, got {output_padding}")
    for i in range(r):
        if not 0 <= output_padding[i] < max(strides[i], dilations[i]):
            raise ValueError(f"output_padding must be in [0, max(stride, dilation)), got {output_padding}")
    out = []
    for i in range(r):
        o = strides[i] * (x.shape[2 + i] - 1) + output_padding[i] + (w.shape[2 + i] - 1) * dilations[i] + 1 \
            - pads[i] - pads[r + i]
        if o < 1:
            raise ValueError(f"the output would have spatial size {o} in dim {i} (padding {pads})")
        out.append(o)
    return [spec((x.shape[0], m) + tuple(out), dtypes.float16 if fp8 else x.dtype)]


def _conv_transpose_compute(x, w, strides, pads, dilations, groups, output_padding) -> np.ndarray:
    """A convolution of the input spread out by the strides with the flipped kernel whose
    in/out channel axes are swapped per group."""
    r = x.ndim - 2
    n, c = x.shape[:2]
    g = groups
    k = w.shape[2:]
    spread = np.zeros((n, c) + tuple((d - 1) * s + 1 for d, s in zip(x.shape[2:], strides)), wide_dtype(x.dtype))
    spread[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)] = x
    wt = w.astype(spread.dtype).reshape((g, c // g, w.shape[1]) + k).swapaxes(1, 2)
    wt = np.flip(wt.reshape((g * w.shape[1], c // g) + k), axis=tuple(range(2, 2 + r)))
    eff = [(kk - 1) * d for kk, d in zip(k, dilations)]
    cpads = tuple(eff[i] - pads[i] for i in range(r)) + \
        tuple(eff[i] - pads[r + i] + output_padding[i] for i in range(r))
    return _conv_compute(spread, wt, (1,) * r, cpads, dilations, g)


def _conv_transpose_kernel(x, w, strides, pads, dilations, groups, output_padding):
    return _conv_transpose_compute(x, w, strides, pads, dilations, groups, output_padding).astype(x.dtype)


def _conv_transpose_pow2_kernel(x, w, s, strides, pads, dilations, groups, output_padding):
    scale = scale_value(s, "conv_transpose_pow2scaled")
    res = _conv_transpose_compute(x, w, strides, pads, dilations, groups, output_padding)
    return (res * scale).astype(np.float16)


register(OpDef("conv_transpose", _conv_transpose_infer, _conv_transpose_kernel, grad=Grad.STOP, family="nn",
               attributes={**_CONV_ATTRS, "output_padding": "ints"}))


register(OpDef("conv_transpose_pow2scaled", lambda specs, **a: _conv_transpose_infer(specs, fp8=True, **a),
               _conv_transpose_pow2_kernel, grad=Grad.RAISE, family="nn",
               attributes={**_CONV_ATTRS, "output_padding": "ints"}))


def _conv_attrs(opname, t, weight, stride, padding, dilation, groups, pad_type,
                transposed=False, output_padding=(), output_shape=()):
    """Resolve the user's convolution parameters into the explicit attributes of the op."""
    xs = tensor_shape_of(t, "t", opname)
    ws = tensor_shape_of(weight, "weight", opname)
    try:
        r = len(xs) - 2
        if r < 1:
            raise ValueError(f"input must be (N, C, spatial...), got shape {xs}")
        if len(ws) != len(xs):
            raise ValueError(f"weight must have rank {len(xs)}, got shape {ws}")
        strides = per_dim_ints(stride, r, "stride", 1)
        dilations = per_dim_ints(dilation, r, "dilation", 1)
        pads = per_dim_ints(padding, 2 * r, "padding", 0)
        pad_type = check_pad_type(pad_type)
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
            raise TypeError(f"groups must be an int, not {groups!r}")
        attrs = {"strides": strides, "dilations": dilations, "groups": int(groups)}
        if not transposed:
            attrs["pads"] = resolve_pads(xs[2:], ws[2:], strides, dilations, pads, pad_type)
            return attrs
        out_pad = per_dim_ints(output_padding, r, "output_padding", 0)
        out_shape = per_dim_ints(output_shape, r, "output_shape", 0) if output_shape else ()
        if out_shape and any(o < 1 for o in out_shape):
            raise ValueError(f"output_shape must be positive, got {out_shape}")
        attrs["pads"] = _conv_transpose_pads(xs[2:], ws[2:], strides, dilations, pads, pad_type, out_pad, out_shape)
        attrs["output_padding"] = out_pad
        return attrs
    except (TypeError, ValueError) as e:
        raise op_error(opname, e) from None


def conv(t: Tensor, weight: Tensor, stride: Optional[Tuple[int, ...]] = (1, 1), padding: Optional[Tuple[int, ...]] = (0, 0, 0, 0),
         dilation: Optional[Tuple[int, ...]] = (1, 1), groups: Optional[int] = 1, pad_type: Optional[PadType] = "not_set",
         available_memory_proportions: Optional[List[float]] = None, partials_types: Optional[List[str]] = None,
         enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """Grouped convolution (cross-correlation) with 1 to 3 spatial dimensions, as ONNX Conv.

    Args:
        t: The input, ``(N, C, *spatial)`` with 1 to 3 spatial dimensions.
        weight: The filters, ``(M, C / groups, *kernel)``.
        stride: The step per spatial dimension (or one int for all).
        padding: The begin pads of each spatial dimension, then the end pads (or one int for all).
        dilation: The kernel dilation per spatial dimension (or one int for all).
        groups: The number of channel groups; C and M must be multiples of it.
        pad_type: "not_set" (use ``padding``), "same_upper", "same_lower" or "valid".
        available_memory_proportions: An IPU planning hint, accepted and ignored on CPUs.
        partials_types: An IPU planning hint, accepted and ignored on CPUs.
        enable_conv_dithering: An IPU planning hint, accepted and ignored on CPUs.

    Returns:
        A new tensor ``(N, M, *out)`` of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` or ``weight`` is not a Tensor, or their dtypes differ or are not
            floating point.
        ValueError: If the ranks, channels, groups, strides, pads or dilations do not fit together,
            ``pad_type`` is unknown, or a tensor is not in the current graph.
    """
    attrs = _conv_attrs("conv", t, weight, stride, padding, dilation, groups, pad_type)
    return create_op("conv", [t, weight], attrs)[0]


def conv_pow2scaled(t: Tensor, weight: Tensor, log2_scale: Tensor, stride: Optional[Tuple[int, ...]] = (1, 1),
                    padding: Optional[Tuple[int, ...]] = (0, 0, 0, 0), dilation: Optional[Tuple[int, ...]] = (1, 1),
                    groups: Optional[int] = 1, pad_type: Optional[PadType] = "not_set",
                    available_memory_proportions: Optional[List[float]] = None,
                    enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """`conv` of float8 tensors, scaled by a power of two, in float16.

    Args:
        t: The float8 input, ``(N, C, *spatial)`` with 1 to 3 spatial dimensions.
        weight: The float8 filters, ``(M, C / groups, *kernel)``.
        log2_scale: A scalar int32 tensor with a value in [-32, 32): the result is multiplied by
            ``2 ** log2_scale``.
        stride: The step per spatial dimension (or one int for all).
        padding: The begin pads of each spatial dimension, then the end pads (or one int for all).
        dilation: The kernel dilation per spatial dimension (or one int for all).
        groups: The number of channel groups; C and M must be multiples of it.
        pad_type: "not_set" (use ``padding``), "same_upper", "same_lower" or "valid".
        available_memory_proportions: An IPU planning hint, accepted and ignored on CPUs.
        enable_conv_dithering: An IPU planning hint, accepted and ignored on CPUs.

    Returns:
        A new float16 tensor ``(N, M, *out)``.

    Raises:
        TypeError: If ``t`` or ``weight`` is not a float8 Tensor, or ``log2_scale`` is not int32.
        ValueError: If ``log2_scale`` is not a scalar, the shapes or window parameters do not fit
            together, ``pad_type`` is unknown, or a tensor is not in the current graph.
    """
    attrs = _conv_attrs("conv_pow2scaled", t, weight, stride, padding, dilation, groups, pad_type)
    return create_op("conv_pow2scaled", [t, weight, log2_scale], attrs)[0]


def conv_transpose(t: Tensor, weight: Tensor, stride: Optional[Tuple[int, ...]] = (1, 1),
                   padding: Optional[Tuple[int, ...]] = (0, 0, 0, 0), dilation: Optional[Tuple[int, ...]] = (1, 1),
                   groups: Optional[int] = 1, pad_type: Optional[PadType] = "not_set",
                   output_padding: Optional[Tuple[int, ...]] = (), output_shape: Optional[Tuple[int, ...]] = (),
                   available_memory_proportions: Optional[List[float]] = None,
                   partials_types: Optional[List[str]] = None,
                   enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """Transposed convolution (the gradient of `conv` with respect to its input), as ONNX ConvTranspose.

    The output length per spatial dimension is ``stride * (S - 1) + output_padding +
    (k - 1) * dilation + 1 - pad_begin - pad_end``. With ``output_shape`` the crop needed is split
    in two, the larger half at the beginning ("not_set", "same_lower") or at the end
    ("same_upper").

    Args:
        t: The input, ``(N, C, *spatial)`` with 1 to 3 spatial dimensions.
        weight: The filters, ``(C, M / groups, *kernel)``.
        stride: The step per spatial dimension (or one int for all).
        padding: The begin pads of each spatial dimension, then the end pads (or one int for all).
        dilation: The kernel dilation per spatial dimension (or one int for all).
        groups: The number of channel groups; C and M must be multiples of it.
        pad_type: "not_set" (use ``padding``), "same_upper", "same_lower" or "valid".
        output_padding: Extra length added at the end of each spatial output dimension.
        output_shape: The spatial output sizes; when given, the padding is derived from them.
        available_memory_proportions: An IPU planning hint, accepted and ignored on CPUs.
        partials_types: An IPU planning hint, accepted and ignored on CPUs.
        enable_conv_dithering: An IPU planning hint, accepted and ignored on CPUs.

    Returns:
        A new tensor ``(N, M, *out)`` of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` or ``weight`` is not a Tensor, or their dtypes differ or are not
            floating point.
        ValueError: If the ranks, channels, groups, strides, pads or dilations do not fit together,
            ``pad_type`` is unknown, or a tensor is not in the current graph.
    """
    attrs = _conv_attrs("conv_transpose", t, weight, stride, padding, dilation, groups, pad_type, True,
                        output_padding, output_shape)
    return create_op("conv_transpose", [t, weight], attrs)[0]


def conv_transpose_pow2scaled(t: Tensor, weight: Tensor, log2_scale: Tensor, stride: Optional[Tuple[int, ...]] = (1, 1),
                              padding: Optional[Tuple[int, ...]] = (0, 0, 0, 0),
                              dilation: Optional[Tuple[int, ...]] = (1, 1), groups: Optional[int] = 1,
                              pad_type: Optional[PadType] = "not_set", output_padding: Optional[Tuple[int, ...]] = (),
                              output_shape: Optional[Tuple[int, ...]] = (),
                              available_memory_proportions: Optional[List[float]] = None,
                              enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """`conv_transpose` of float8 tensors, scaled by a power of two, in float16.

    Args:
        t: The float8 input, ``(N, C, *spatial)`` with 1 to 3 spatial dimensions.
        weight: The float8 filters, ``(C, M / groups, *kernel)``.
        log2_scale: A scalar int32 tensor with a value in [-32, 32): the result is multiplied by
            ``2 ** log2_scale``.
        stride: The step per spatial dimension (or one int for all).
        padding: The begin pads of each spatial dimension, then the end pads (or one int for all).
        dilation: The kernel dilation per spatial dimension (or one int for all).
        groups: The number of channel groups; C and M must be multiples of it.
        pad_type: "not_set" (use ``padding``), "same_upper", "same_lower" or "valid".
        output_padding: Extra length added at the end of each spatial output dimension.
        output_shape: The spatial output sizes; when given, the padding is derived from them.
        available_memory_proportions: An IPU planning hint, accepted and ignored on CPUs.
        enable_conv_dithering: An IPU planning hint, accepted and ignored on CPUs.

    Returns:
        A new float16 tensor ``(N, M, *out)``.

    Raises:
        TypeError: If ``t`` or ``weight`` is not a float8 Tensor, or ``log2_scale`` is not int32.
        ValueError: If ``log2_scale`` is not a scalar, the shapes or window parameters do not fit
            together, ``pad_type`` is unknown, or a tensor is not in the current graph.
    """
    attrs = _conv_attrs("conv_transpose_pow2scaled", t, weight, stride, padding, dilation, groups, pad_type,
                        True, output_padding, output_shape)
    return create_op("conv_transpose_pow2scaled", [t, weight, log2_scale], attrs)[0]


# conv_grad's outputs: the ``grads`` attribute names the ones computed, in this order (the gradient
# rule asks only for those autodiff needs: no dx for a first layer reading the data).
_CONV_GRADS = ("dx", "dweight")


def _conv_grad_infer(specs, strides, pads, dilations, groups, grads=_CONV_GRADS):
    if not grads or list(grads) != [g for g in _CONV_GRADS if g in grads]:
        raise ValueError(f"grads must be a non-empty ordered subset of {_CONV_GRADS}, got {grads!r}")
    x, w = specs[:2]
    made = {"dx": spec(x.shape, x.dtype), "dweight": spec(w.shape, w.dtype)}
    return [made[g] for g in grads]


def _conv_grad_kernel(x, w, g, strides, pads, dilations, groups, grads=_CONV_GRADS):
    """(dx, dweight) of `_conv_compute`, those that ``grads`` names: the window contraction run backwards."""
    wide = wide_dtype(x.dtype)
    r = x.ndim - 2
    k = w.shape[2:]
    n, c = x.shape[:2]
    m = w.shape[0]
    gg = g.astype(wide).reshape((n, groups, m // groups) + g.shape[2:])
    o_ax, k_ax = "opq"[:r], "xyz"[:r]
    out = []
    if "dx" in grads:
        wg = w.astype(wide).reshape((groups, m // groups, c // groups) + k)
        dwin = np.einsum(f"ngm{o_ax},gmc{k_ax}->ngc{o_ax}{k_ax}", gg, wg, optimize=True)
        dx = windows_adjoint(dwin.reshape((n, c) + g.shape[2:] + k), x.shape, k, strides, dilations, pads)
        out.append(dx.astype(x.dtype))
    if "dweight" in grads:
        win = windows(x.astype(wide), k, strides, dilations, pads)
        win = win.reshape((n, groups, c // groups) + win.shape[2:2 + r] + k)
        dw = np.einsum(f"ngc{o_ax}{k_ax},ngm{o_ax}->gmc{k_ax}", win, gg, optimize=True)
        out.append(dw.reshape(w.shape).astype(w.dtype))
    return tuple(out)


# Dedicated gradient ops for convolution and pooling (one kernel each instead of a composite).
register(OpDef("conv_grad", _conv_grad_infer, _conv_grad_kernel, grad=Grad.RAISE, family="nn",
               attributes={**_CONV_ATTRS, "grads": "strs?"}))


@grad_rule("conv")
def _conv_grad(ctx):
    needed = [i for i in (0, 1) if ctx.needs(i)]
    if not needed:
        return [None, None]
    grads = create_op("conv_grad", [ctx.input(0), ctx.input(1), ctx.grad(0)],
                      {**ctx.attrs, "grads": tuple(_CONV_GRADS[i] for i in needed)})
    made = dict(zip(needed, grads))
    return [made.get(0), made.get(1)]
