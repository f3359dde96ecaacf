"""Neural-network ops: matmul, softmax, convolutions, pooling, normalisation, losses, roi_align and
the float8 family (pow2-scaled matmul/conv and the pow2-scaled casts).

Convolutions and pools share one windowing helper (`_windows`): it pads (or crops) the spatial
axes and returns a strided view of every receptive field, ``(N, C, *out, *kernel)``. Convolution is
that gather contracted with the weights (im2col + einsum); the transposed convolution is rewritten
as a convolution of the stride-dilated input with the flipped, channel-swapped kernel.

Attributes reach the kernels fully resolved: per-dimension strides/dilations, explicit
``pads = begins + ends`` (``pad_type`` / ``auto_pad`` already turned into numbers).
"""
from __future__ import annotations

import math
from typing import Any, List, Literal, Optional, Sequence, Tuple, Union

import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register, user_location
from popxl.ops.utils import as_tensor, broadcast_shapes, normalize_axes, same_dtype, spec
from popxl.tensor import Tensor

__all__ = ["matmul", "softmax", "conv", "conv_transpose", "average_pool", "max_pool", "batch_norm_inference",
           "group_norm", "layer_norm", "nll_loss", "nll_loss_with_softmax_grad", "roi_align", "matmul_pow2scaled",
           "conv_pow2scaled", "conv_transpose_pow2scaled", "pow2scale_cast_to_fp8", "pow2scale_cast_from_fp8"]

PadType = Literal["not_set", "same_upper", "same_lower", "valid"]
_PAD_TYPES = ("not_set", "same_upper", "same_lower", "valid")
_FP8 = (dtypes.float8_143, dtypes.float8_152)


# shared helpers ---------------------------------------------------------------------------------------
def _wide(dt: np.dtype) -> np.dtype:
    """The dtype a kernel accumulates in: float32 for float8/float16, else the dtype itself."""
    return np.dtype(np.float32) if dt.itemsize < 4 or dt.kind != "f" else dt


def _fail(opname: str, e: Exception) -> Exception:
    return type(e)(f"ops.{opname}: {e} (at {user_location()})")


def _shape_of(t: Any, what: str, opname: str) -> Tuple[int, ...]:
    if not isinstance(t, Tensor):
        raise TypeError(f"ops.{opname}: {what} must be a popxl.Tensor, not {type(t).__name__} ({t!r}) "
                        f"(at {user_location()})")
    return t.shape


def _ints(value: Any, n: int, what: str, neutral: int) -> Tuple[int, ...]:
    """``value`` as ``n`` ints: an int is repeated; None, () or an all-``neutral`` sequence of another
    length (the 2-D defaults used for a 1-D/3-D op) mean ``neutral`` everywhere."""
    if value is None:
        return (neutral,) * n
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{what} must be an int or a sequence of ints, not {value!r}") from None
    if any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in items):
        raise TypeError(f"{what} must contain ints, got {value!r}")
    if len(items) != n:
        if all(v == neutral for v in items):
            return (neutral,) * n
        raise ValueError(f"{what} needs {n} values for this tensor, got {len(items)}: {tuple(items)}")
    return tuple(int(v) for v in items)


def _check_pad_type(pad_type: Any, what: str = "pad_type") -> str:
    if pad_type is None:
        return "not_set"
    if pad_type not in _PAD_TYPES:
        raise ValueError(f"{what} must be one of {_PAD_TYPES}, not {pad_type!r}")
    return pad_type


def _resolve_pads(sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                  pads: Sequence[int], pad_type: str) -> Tuple[int, ...]:
    """Explicit ``begins + ends`` for a convolution/pool window (ONNX auto_pad rules): "same_*"
    keeps ceil(size/stride) outputs, the odd padding element going to the end (upper) or the
    beginning (lower); "valid" pads nothing; "not_set" keeps ``pads``."""
    r = len(sizes)
    if pad_type == "not_set":
        return tuple(pads)
    if pad_type == "valid":
        return (0,) * (2 * r)
    begins, ends = [], []
    for n, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-n // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
        small = total // 2
        begins.append(small if pad_type == "same_upper" else total - small)
        ends.append(total - begins[-1])
    return tuple(begins + ends)


def _out_len(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool = False) -> int:
    span = n + pb + pe - ((k - 1) * d + 1)
    if span < 0:
        raise ValueError(f"the window (kernel {k}, dilation {d}) is larger than the padded input ({n + pb + pe})")
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + pb:  # the last window would start in the end padding: drop it
        out -= 1
    return out


def _out_shape(sizes, kernel, strides, dilations, pads, ceil_mode=False) -> Tuple[int, ...]:
    r = len(sizes)
    return tuple(_out_len(sizes[i], kernel[i], strides[i], dilations[i], pads[i], pads[r + i], ceil_mode)
                 for i in range(r))


def _windows(x: np.ndarray, kernel, strides, dilations, pads, ceil_mode: bool = False, fill: float = 0.0):
    """Every receptive field of ``x`` (N, C, *S) as a view of shape (N, C, *out, *kernel).
    Negative pads crop. Positions outside ``x`` hold ``fill``."""
    r = x.ndim - 2
    out = _out_shape(x.shape[2:], kernel, strides, dilations, pads, ceil_mode)
    widths, crops = [(0, 0), (0, 0)], [slice(None), slice(None)]
    for i in range(r):
        n, pb = x.shape[2 + i], pads[i]
        need = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1  # padded length used
        pe = need - n - pb
        widths.append((max(pb, 0), max(pe, 0)))
        crops.append(slice(max(-pb, 0), n - max(-pe, 0)))
    x = x[tuple(crops)]
    if any(w != (0, 0) for w in widths):
        x = np.pad(x, widths, constant_values=np.asarray(fill, dtype=x.dtype))
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    v = sliding_window_view(x, eff, axis=tuple(range(2, 2 + r)))
    return v[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
             + tuple(slice(None, None, d) for d in dilations)]


def _check_log2_scale(s) -> None:
    if s.dtype is not dtypes.int32:
        raise TypeError(f"log2_scale must be an int32 tensor, got {s.dtype.name}")
    if math.prod(s.shape) != 1:
        raise ValueError(f"log2_scale must be a scalar, got shape {s.shape}")


def _scale_value(s: np.ndarray, opname: str) -> float:
    v = int(np.asarray(s).reshape(-1)[0])
    if not -32 <= v < 32:
        raise ValueError(f"{opname}: log2_scale must be in [-32, 32), got {v}")
    return float(2.0 ** v)


def _check_fp8_operands(specs) -> None:
    for i, s in enumerate(specs):
        if s.dtype not in _FP8:
            raise TypeError(f"operand {i} must be float8_143 or float8_152, got {s.dtype.name}")


# matmul / softmax -------------------------------------------------------------------------------------
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
    dt = same_dtype(specs)
    if not (dt.is_floating_point or dt.is_int):
        raise TypeError(f"matmul needs numeric operands, got {dt.name}")
    return [spec(_matmul_shape(*specs), output_type or dt)]


def _matmul_kernel(a, b, output_type, partials_type):
    out = np.matmul(a, b) if a.dtype.itemsize >= 4 else np.matmul(a.astype(np.float32), b.astype(np.float32))
    return out.astype(dtypes.ml_dtype(output_type) if output_type is not None else a.dtype)


register(OpDef("matmul", _matmul_infer, _matmul_kernel, family="nn"))


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
               family="nn"))


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
               inplace=2, grad=Grad.RAISE, family="nn"))


def matmul(lhs: Tensor, rhs: Tensor, available_memory_proportion: Optional[float] = None,
           output_type: Optional[dtypes.dtype] = None, partials_type: Optional[dtypes.dtype] = None) -> Tensor:
    """numpy.matmul semantics: batch dims broadcast, 1-D operands are promoted then squeezed."""
    if partials_type is not None and partials_type not in (dtypes.float16, dtypes.float32):
        raise ValueError(f"ops.matmul: partials_type must be float16 or float32, not {partials_type!r}")
    return create_op("matmul", [lhs, rhs], {"output_type": output_type, "partials_type": partials_type})[0]


def _matmul_pow2_infer(specs):
    a, b, s = specs
    _check_fp8_operands([a, b])
    _check_log2_scale(s)
    return [spec(_matmul_shape(a, b), dtypes.float16)]


def _matmul_pow2_kernel(a, b, s):
    scale = _scale_value(s, "matmul_pow2scaled")
    return (np.matmul(a.astype(np.float32), b.astype(np.float32)) * scale).astype(np.float16)


register(OpDef("matmul_pow2scaled", _matmul_pow2_infer, _matmul_pow2_kernel, grad=Grad.RAISE, family="nn"))


def matmul_pow2scaled(lhs: Tensor, rhs: Tensor, log2_scale: Tensor,
                      available_memory_proportion: Optional[float] = None) -> Tensor:
    """matmul of two float8 tensors, multiplied by 2**log2_scale, as float16.
    ``log2_scale`` is a scalar int32 tensor with a value in [-32, 32)."""
    return create_op("matmul_pow2scaled", [lhs, rhs, log2_scale])[0]


def _softmax_infer(specs, axis):
    s = specs[0]
    if not s.dtype.is_floating_point:
        raise TypeError(f"softmax needs a floating point tensor, got {s.dtype.name}")
    return [spec(s.shape, s.dtype)]


def _softmax_kernel(x, axis):
    if x.size == 0:  # nothing to normalise (an empty axis has no maximum)
        return x.copy()
    w = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    e = np.exp(w - np.max(w, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


register(OpDef("softmax", _softmax_infer, _softmax_kernel, family="nn"))


def softmax(t: Tensor, axis: int) -> Tensor:
    """exp(t) / sum(exp(t)) along ``axis`` (negative counts from the end)."""
    try:
        ax = normalize_axes(t.rank, axis)[0]
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.softmax: {e} (tensor {t.id!r} of shape {t.shape})") from None
    return create_op("softmax", [t], {"axis": ax})[0]


# convolution ------------------------------------------------------------------------------------------
def _conv_check(x, w, strides, pads, dilations, groups, transposed: bool, fp8: bool) -> int:
    """Validate a (transposed) convolution; returns the number of output channels."""
    r = len(x.shape) - 2
    if r < 1 or r > 3:
        raise ValueError(f"input must be (N, C, spatial...) with 1 to 3 spatial dims, got shape {x.shape}")
    if len(w.shape) != r + 2:
        raise ValueError(f"weight must have rank {r + 2} for a {r}-D convolution, got shape {w.shape}")
    if fp8:
        _check_fp8_operands([x, w])
    else:
        dt = same_dtype([x, w])
        if not dt.is_floating_point or dt in _FP8:
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
        _check_log2_scale(specs[2])
    m = _conv_check(x, w, strides, pads, dilations, groups, False, fp8)
    out = _out_shape(x.shape[2:], w.shape[2:], strides, dilations, pads)
    return [spec((x.shape[0], m) + out, dtypes.float16 if fp8 else x.dtype)]


def _conv_compute(x, w, strides, pads, dilations, groups) -> np.ndarray:
    """Grouped N-D convolution in the accumulation dtype: gather windows, contract with weights."""
    wide = _wide(x.dtype)
    r = x.ndim - 2
    k = w.shape[2:]
    win = _windows(x.astype(wide), k, strides, dilations, pads)  # (N, C, *O, *K)
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
    scale = _scale_value(s, "conv_pow2scaled")
    return (_conv_compute(x, w, strides, pads, dilations, groups) * scale).astype(np.float16)


register(OpDef("conv", _conv_infer, _conv_kernel, family="nn"))


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
_LAYOUTS = ("nchw", "nhwc")
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
    if layouts is not None and (len(layouts) != 3 or any(v not in _LAYOUTS for v in layouts)):
        raise ValueError(f"layouts must be three of {_LAYOUTS} (x, y, residual), got {layouts!r}")
    if clip is not None and (relu or len(clip) != 2 or not clip[0] <= clip[1]):
        raise ValueError(f"clip must be two bounds lo <= hi, and not with relu; got clip={clip!r}, relu={relu}")
    if len(specs) != 3 + int(residual):
        raise ValueError(f"takes (x, weight, bias{', residual' if residual else ''}), got {len(specs)} inputs")
    (y,) = _conv_infer(specs[:2], strides, pads, dilations, groups)
    _per_channel_check(y, specs[2:3], ("bias",))
    if residual and (specs[3].shape != y.shape or specs[3].dtype is not y.dtype):
        raise ValueError(f"residual must be {y.shape} {y.dtype.name} like the convolution's output, "
                         f"got {specs[3].shape} {specs[3].dtype.name}")
    pooled = _pool_of(pool)
    if pooled is None:
        return [y]
    if residual or len(y.shape) != 4:
        raise ValueError(f"a max pool is fused only into a 2-D convolution without a residual (output {y.shape}, "
                         f"residual {residual})")
    return _pool_infer([y], **pooled)


def _conv_fused_kernel(x, w, bias, *rest, strides, pads, dilations, groups, residual: bool, relu: bool,
                       layouts=None, clip=None, **pool):
    """In the accumulation dtype, rounded once at the end (as the oneDNN kernel does); a fused max
    pool picks among the rounded values."""
    y = _conv_compute(x, w, strides, pads, dilations, groups) + _channel(bias, x.ndim, _wide(x.dtype))
    if residual:
        y = y + rest[0].astype(y.dtype)
    if clip is not None:
        y = np.clip(y, *clip)
    y = (np.maximum(y, 0) if relu else y).astype(x.dtype)
    pooled = _pool_of(pool)
    return y if pooled is None else _max_pool_kernel(y, storage_order="row", **pooled)


def _conv_fused_overwritable(residual: bool, layouts=None, **_) -> Tuple[int, ...]:
    """The result may be written over a residual laid out as it is: the kernels add the residual
    into the destination before the convolution writes it (oneDNN's sum post-op)."""
    same = layouts is None or layouts[1] == layouts[2]
    return (3,) if residual and same else ()


register(OpDef("conv_fused", _conv_fused_infer, _conv_fused_kernel, grad=Grad.RAISE, family="nn",
               overwritable=_conv_fused_overwritable))


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
               grad=Grad.RAISE, family="nn"))


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
        _check_log2_scale(specs[2])
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
    spread = np.zeros((n, c) + tuple((d - 1) * s + 1 for d, s in zip(x.shape[2:], strides)), _wide(x.dtype))
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
    scale = _scale_value(s, "conv_transpose_pow2scaled")
    res = _conv_transpose_compute(x, w, strides, pads, dilations, groups, output_padding)
    return (res * scale).astype(np.float16)


register(OpDef("conv_transpose", _conv_transpose_infer, _conv_transpose_kernel, grad=Grad.STOP, family="nn"))
register(OpDef("conv_transpose_pow2scaled", lambda specs, **a: _conv_transpose_infer(specs, fp8=True, **a),
               _conv_transpose_pow2_kernel, grad=Grad.RAISE, family="nn"))


def _conv_attrs(opname, t, weight, stride, padding, dilation, groups, pad_type,
                transposed=False, output_padding=(), output_shape=()):
    """Resolve the user's convolution parameters into the explicit attributes of the op."""
    xs = _shape_of(t, "t", opname)
    ws = _shape_of(weight, "weight", opname)
    try:
        r = len(xs) - 2
        if r < 1:
            raise ValueError(f"input must be (N, C, spatial...), got shape {xs}")
        if len(ws) != len(xs):
            raise ValueError(f"weight must have rank {len(xs)}, got shape {ws}")
        strides = _ints(stride, r, "stride", 1)
        dilations = _ints(dilation, r, "dilation", 1)
        pads = _ints(padding, 2 * r, "padding", 0)
        pad_type = _check_pad_type(pad_type)
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
            raise TypeError(f"groups must be an int, not {groups!r}")
        attrs = {"strides": strides, "dilations": dilations, "groups": int(groups)}
        if not transposed:
            attrs["pads"] = _resolve_pads(xs[2:], ws[2:], strides, dilations, pads, pad_type)
            return attrs
        out_pad = _ints(output_padding, r, "output_padding", 0)
        out_shape = _ints(output_shape, r, "output_shape", 0) if output_shape else ()
        if out_shape and any(o < 1 for o in out_shape):
            raise ValueError(f"output_shape must be positive, got {out_shape}")
        attrs["pads"] = _conv_transpose_pads(xs[2:], ws[2:], strides, dilations, pads, pad_type, out_pad, out_shape)
        attrs["output_padding"] = out_pad
        return attrs
    except (TypeError, ValueError) as e:
        raise _fail(opname, e) from None


def conv(t: Tensor, weight: Tensor, stride: Optional[Tuple[int]] = (1, 1), padding: Optional[Tuple[int]] = (0, 0, 0, 0),
         dilation: Optional[Tuple[int]] = (1, 1), groups: Optional[int] = 1, pad_type: Optional[PadType] = "not_set",
         available_memory_proportions: Optional[List[float]] = None, partials_types: Optional[List[str]] = None,
         enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """Grouped N-D convolution (cross-correlation, 1 to 3 spatial dims) of ``t`` (N, C, *S) with
    ``weight`` (M, C/groups, *k) -> (N, M, *out). ``padding`` lists the begin pads then the end pads;
    ``pad_type`` "same_upper"/"same_lower"/"valid" replaces it. stride/dilation/padding accept
    one int or one value per spatial dim. The memory/partials/dithering options are IPU planning
    hints and do not change the result here."""
    attrs = _conv_attrs("conv", t, weight, stride, padding, dilation, groups, pad_type)
    return create_op("conv", [t, weight], attrs)[0]


def conv_pow2scaled(t: Tensor, weight: Tensor, log2_scale: Tensor, stride: Optional[Tuple[int]] = (1, 1),
                    padding: Optional[Tuple[int]] = (0, 0, 0, 0), dilation: Optional[Tuple[int]] = (1, 1),
                    groups: Optional[int] = 1, pad_type: Optional[PadType] = "not_set",
                    available_memory_proportions: Optional[List[float]] = None,
                    enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """`conv` of float8 ``t`` and ``weight``, multiplied by 2**log2_scale (scalar int32), in float16."""
    attrs = _conv_attrs("conv_pow2scaled", t, weight, stride, padding, dilation, groups, pad_type)
    return create_op("conv_pow2scaled", [t, weight, log2_scale], attrs)[0]


def conv_transpose(t: Tensor, weight: Tensor, stride: Optional[Tuple[int]] = (1, 1),
                   padding: Optional[Tuple[int]] = (0, 0, 0, 0), dilation: Optional[Tuple[int]] = (1, 1),
                   groups: Optional[int] = 1, pad_type: Optional[PadType] = "not_set",
                   output_padding: Optional[Tuple[int]] = (), output_shape: Optional[Tuple[int]] = (),
                   available_memory_proportions: Optional[List[float]] = None,
                   partials_types: Optional[List[str]] = None,
                   enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """Transposed convolution (the gradient of `conv` w.r.t. its input) of ``t`` (N, C, *S) with
    ``weight`` (C, M/groups, *k) -> (N, M, *out), out = stride*(S-1) + output_padding +
    (k-1)*dilation + 1 - pad_begin - pad_end. ``output_shape`` (spatial sizes) overrides
    ``padding``: the needed crop is split in two, the larger half at the beginning ("not_set",
    "same_lower") or at the end ("same_upper"); "same_*" alone asks for out = S*stride."""
    attrs = _conv_attrs("conv_transpose", t, weight, stride, padding, dilation, groups, pad_type, True,
                        output_padding, output_shape)
    return create_op("conv_transpose", [t, weight], attrs)[0]


def conv_transpose_pow2scaled(t: Tensor, weight: Tensor, log2_scale: Tensor, stride: Optional[Tuple[int]] = (1, 1),
                              padding: Optional[Tuple[int]] = (0, 0, 0, 0),
                              dilation: Optional[Tuple[int]] = (1, 1), groups: Optional[int] = 1,
                              pad_type: Optional[PadType] = "not_set", output_padding: Optional[Tuple[int]] = (),
                              output_shape: Optional[Tuple[int]] = (),
                              available_memory_proportions: Optional[List[float]] = None,
                              enable_conv_dithering: Optional[List[int]] = None) -> Tensor:
    """`conv_transpose` of float8 ``t`` and ``weight``, multiplied by 2**log2_scale, in float16."""
    attrs = _conv_attrs("conv_transpose_pow2scaled", t, weight, stride, padding, dilation, groups, pad_type,
                        True, output_padding, output_shape)
    return create_op("conv_transpose_pow2scaled", [t, weight, log2_scale], attrs)[0]


# pooling ----------------------------------------------------------------------------------------------
def _pool_infer(specs, kernel, strides, pads, dilations, ceil_mode, layouts=None, **_):
    x = specs[0]
    if layouts is not None and (len(layouts) != 2 or any(v not in _LAYOUTS for v in layouts) or len(x.shape) != 4):
        raise ValueError(f"layouts must be two of {_LAYOUTS} (x, y) for a 2-D pool, got {layouts!r}")
    r = len(x.shape) - 2
    if r < 1:
        raise ValueError(f"input must be (N, C, spatial...), got shape {x.shape}")
    if not x.dtype.is_floating_point or x.dtype in _FP8:
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
    return [spec(x.shape[:2] + _out_shape(x.shape[2:], kernel, strides, dilations, pads, ceil_mode), x.dtype)]


# ``layouts`` (x, y; native engine only) as conv_fused's: the values are the same either way.
def _max_pool_kernel(x, kernel, strides, pads, dilations, ceil_mode, storage_order, layouts=None):
    win = _windows(x, kernel, strides, dilations, pads, ceil_mode, fill=-np.inf)
    r = len(kernel)
    return win.max(axis=tuple(range(-r, 0)))


def _average_pool_kernel(x, kernel, strides, pads, dilations, ceil_mode, layouts=None):
    r = len(kernel)
    k_axes = tuple(range(-r, 0))
    wide = x.astype(_wide(x.dtype))
    total = _windows(wide, kernel, strides, dilations, pads, ceil_mode).sum(axis=k_axes)
    ones = np.ones((1, 1) + x.shape[2:], wide.dtype)
    count = _windows(ones, kernel, strides, dilations, pads, ceil_mode).sum(axis=k_axes)
    return (total / count).astype(x.dtype)


register(OpDef("max_pool", _pool_infer, _max_pool_kernel, family="nn"))
register(OpDef("average_pool", _pool_infer, _average_pool_kernel, family="nn"))


def _pool_attrs(opname, t, kernel_size, stride, padding, out_pads, dilation, in_dilations, auto_pad, ceil_mode):
    xs = _shape_of(t, "t", opname)
    try:
        r = len(xs) - 2
        if r < 1:
            raise ValueError(f"input must be (N, C, spatial...), got shape {xs}")
        if kernel_size is None:
            raise ValueError("kernel_size is required")
        kernel = _ints(kernel_size, r, "kernel_size", -1)
        strides = _ints(stride, r, "stride", 1)
        dilations = _ints(dilation, r, "dilation", 1)
        pads = _ints(padding, 2 * r, "padding", 0)
        if any(v != 0 for v in _ints(out_pads, 2 * r, "out_pads", 0)):
            raise NotImplementedError(f"non-zero out_pads {tuple(out_pads)} are not supported")
        if any(v != 1 for v in _ints(in_dilations, r, "in_dilations", 1)):
            raise NotImplementedError(f"input dilations {tuple(in_dilations)} other than 1 are not supported")
        auto_pad = _check_pad_type(auto_pad, "auto_pad")
        pads = _resolve_pads(xs[2:], kernel, strides, dilations, pads, auto_pad)
        return {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations,
                "ceil_mode": bool(ceil_mode)}
    except (TypeError, ValueError, NotImplementedError) as e:
        raise _fail(opname, e) from None


def average_pool(t: Tensor, kernel_size: Tuple[int], stride: Optional[Tuple[int]] = None,
                 padding: Optional[Tuple[int]] = None, out_pads: Optional[Tuple[int]] = None,
                 dilation: Optional[Tuple[int]] = None, in_dilations: Optional[Tuple[int]] = None,
                 auto_pad: Optional[PadType] = "not_set", ceil_mode: bool = False) -> Tensor:
    """Mean over each window of the spatial dims of ``t`` (N, C, *S). stride defaults to 1,
    padding (begins then ends) to 0; padded positions are not counted in the mean. ``ceil_mode``
    rounds the output size up, dropping a last window that would start inside the end padding.
    Only zero ``out_pads`` and unit ``in_dilations`` are supported (NotImplementedError)."""
    attrs = _pool_attrs("average_pool", t, kernel_size, stride, padding, out_pads, dilation, in_dilations,
                        auto_pad, ceil_mode)
    return create_op("average_pool", [t], attrs)[0]


def max_pool(t: Tensor, kernel_size: Tuple[int], stride: Optional[Tuple[int]] = None,
             padding: Optional[Tuple[int]] = None, out_pads: Optional[Tuple[int]] = None,
             dilation: Optional[Tuple[int]] = None, in_dilations: Optional[Tuple[int]] = None,
             auto_pad: Optional[PadType] = "not_set", ceil_mode: bool = False,
             storage_order: Literal["row", "column"] = "row") -> Tensor:
    """Maximum over each (optionally dilated) window of the spatial dims of ``t`` (N, C, *S);
    padding never wins. Parameters as for `average_pool`; ``storage_order`` only concerns the
    layout of indices, which this op does not return."""
    if storage_order not in ("row", "column"):
        raise _fail("max_pool", ValueError(f"storage_order must be 'row' or 'column', not {storage_order!r}"))
    attrs = _pool_attrs("max_pool", t, kernel_size, stride, padding, out_pads, dilation, in_dilations,
                        auto_pad, ceil_mode)
    attrs["storage_order"] = storage_order
    return create_op("max_pool", [t], attrs)[0]


# normalisation ----------------------------------------------------------------------------------------
def _per_channel_check(x, params, names) -> None:
    if len(x.shape) < 2:
        raise ValueError(f"input must be (N, C, ...), got shape {x.shape}")
    if not x.dtype.is_floating_point or x.dtype in _FP8:
        raise TypeError(f"needs a float16/float32/float64 tensor, got {x.dtype.name}")
    c = x.shape[1]
    for name, p in zip(names, params):
        if p.shape != (c,):
            raise ValueError(f"{name} must have shape ({c},) (one value per channel), got {p.shape}")
        if p.dtype is not x.dtype:
            raise TypeError(f"{name} must have the input's dtype {x.dtype.name}, got {p.dtype.name}")


def _channel(p: np.ndarray, rank: int, dt) -> np.ndarray:
    return p.astype(dt).reshape((1, -1) + (1,) * (rank - 2))


def _batch_norm_infer(specs, epsilon):
    _per_channel_check(specs[0], specs[1:], ("scale", "bias", "mean", "var"))
    return [spec(specs[0].shape, specs[0].dtype)]


def _batch_norm_kernel(x, scale, bias, mean, var, epsilon):
    w = _wide(x.dtype)
    ch = [_channel(p, x.ndim, w) for p in (scale, bias, mean, var)]
    y = ch[0] * (x.astype(w) - ch[2]) / np.sqrt(ch[3] + w.type(epsilon)) + ch[1]
    return y.astype(x.dtype)


register(OpDef("batch_norm_inference", _batch_norm_infer, _batch_norm_kernel, family="nn"))


def batch_norm_inference(t: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor,
                         epsilon: float = 1e-5, momentum: float = 0.9) -> Tensor:
    """Normalise ``t`` (N, C, ...) per channel with the given running statistics:
    scale * (t - mean) / sqrt(var + epsilon) + bias; all four are (C,). ``momentum`` only matters
    for training and is ignored."""
    return create_op("batch_norm_inference", [t, scale, bias, mean, var], {"epsilon": float(epsilon)})[0]


def _group_norm_infer(specs, num_groups, eps):
    x = specs[0]
    _per_channel_check(x, specs[1:], ("weight", "bias"))
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    if x.shape[1] % num_groups:
        raise ValueError(f"channels ({x.shape[1]}) are not divisible by num_groups ({num_groups})")
    return [spec(x.shape, x.dtype)]


def _grouped(x: np.ndarray, num_groups: int, dt) -> np.ndarray:
    """``x`` (N, C, ...) as (N, groups, values per group) in ``dt``; explicit sizes, as -1 cannot
    be inferred when N is 0."""
    return x.astype(dt).reshape(x.shape[0], num_groups, x.size // max(x.shape[0] * num_groups, 1))


def _group_norm_kernel(x, weight, bias, num_groups, eps):
    w = _wide(x.dtype)
    g = _grouped(x, num_groups, w)
    mean = g.mean(axis=-1, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=-1, keepdims=True)
    y = ((g - mean) / np.sqrt(var + w.type(eps))).reshape(x.shape)
    return (y * _channel(weight, x.ndim, w) + _channel(bias, x.ndim, w)).astype(x.dtype)


register(OpDef("group_norm", _group_norm_infer, _group_norm_kernel, family="nn"))
register(OpDef("layer_norm", lambda specs, eps: _group_norm_infer(specs, 1, eps),
               lambda x, weight, bias, eps: _group_norm_kernel(x, weight, bias, 1, eps), family="nn"))


def group_norm(t: Tensor, weight: Tensor, bias: Tensor, num_groups: int, eps: float = 1e-5) -> Tensor:
    """Group normalisation of ``t`` (N, C, ...): the channels are split into ``num_groups`` groups,
    each normalised over its channels and all spatial positions (biased variance, ``eps`` added to
    it), then scaled and shifted per channel by ``weight`` and ``bias`` (C,)."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
        raise _fail("group_norm", TypeError(f"num_groups must be an int, not {num_groups!r}"))
    return create_op("group_norm", [t, weight, bias], {"num_groups": int(num_groups), "eps": float(eps)})[0]


def layer_norm(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """`group_norm` with a single group: each sample is normalised over all its non-batch values,
    then ``weight``/``bias`` of shape (t.shape[1],) apply per channel (axis 1)."""
    return create_op("layer_norm", [t, weight, bias], {"eps": float(eps)})[0]


# losses -----------------------------------------------------------------------------------------------
_REDUCTIONS = ("mean", "sum", "none")


def _nll_check(probs, labels, reduction) -> Tuple[int, ...]:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, not {reduction!r}")
    if not probs.shape:
        raise ValueError("probs must have a class axis (rank >= 1)")
    if not probs.dtype.is_floating_point or probs.dtype in _FP8:
        raise TypeError(f"probs must be float16/float32/float64, got {probs.dtype.name}")
    if not labels.dtype.is_int:
        raise TypeError(f"labels must be integers, got {labels.dtype.name}")
    if labels.shape != probs.shape[:-1]:
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
    w = _wide(probs.dtype)
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


register(OpDef("nll_loss", _nll_infer, _nll_kernel, family="nn"))


def _nll_args(opname, ignore_index, reduction):
    if reduction not in _REDUCTIONS:
        raise _fail(opname, ValueError(f"reduction must be one of {_REDUCTIONS}, not {reduction!r}"))
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer))):
        raise _fail(opname, TypeError(f"ignore_index must be an int or None, not {ignore_index!r}"))
    return None if ignore_index is None else int(ignore_index)


def nll_loss(probs: Tensor, labels: Tensor, ignore_index: Optional[int] = None,
             reduction: Literal["mean", "sum", "none"] = "mean", log_prob: bool = False) -> Tensor:
    """Negative log likelihood of integer ``labels`` (shape probs.shape[:-1]) under ``probs``
    (classes on the last axis): per item -log(max(p[label], eps)) with eps = 1e-7 (6.104e-5 for
    float16), or -p[label] when ``log_prob`` says probs are already log-probabilities. Items whose
    label is ``ignore_index`` count 0. "mean" divides the sum by the number of counted items (at
    least 1), "sum" adds, "none" returns the per-item losses."""
    ignore_index = _nll_args("nll_loss", ignore_index, reduction)
    return create_op("nll_loss", [probs, labels], {"ignore_index": ignore_index, "reduction": reduction,
                                                   "log_prob": bool(log_prob)})[0]


def _nll_softmax_infer(specs, ignore_index, reduction):
    probs, labels, lg = specs
    out = _nll_check(probs, labels, reduction)
    if not lg.dtype.is_floating_point or lg.dtype in _FP8:
        raise TypeError(f"loss_grad must be a float16/float32/float64 tensor, got {lg.dtype.name}")
    allowed = (labels.shape,) if reduction == "none" else ()
    if math.prod(lg.shape) != 1 and lg.shape not in allowed:
        raise ValueError(f"loss_grad must be a scalar{' or have the labels shape' if allowed else ''}, "
                         f"got shape {lg.shape}")
    return [spec(out, probs.dtype), spec(probs.shape, probs.dtype)]


def _nll_softmax_kernel(probs, labels, loss_grad, ignore_index, reduction):
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
    return loss, grad.astype(probs.dtype)


register(OpDef("nll_loss_with_softmax_grad", _nll_softmax_infer, _nll_softmax_kernel, grad=Grad.STOP, family="nn"))


def nll_loss_with_softmax_grad(probs: Tensor, labels: Tensor, loss_grad: Union[float, Tensor] = 1,
                               ignore_index: Optional[int] = None,
                               reduction: Literal["mean", "sum", "none"] = "mean") -> Tuple[Tensor, Tensor]:
    """`nll_loss` of ``probs`` = softmax(x) together with its gradient w.r.t. the logits x:
    (probs - onehot(labels)) * loss_grad, divided by the counted items for "mean", zero for ignored
    items. A float ``loss_grad`` becomes a float32 constant; for "none" it may have the labels'
    shape. Returns ``(loss, dE/dx)``; no gradient flows through this op."""
    ignore_index = _nll_args("nll_loss_with_softmax_grad", ignore_index, reduction)
    if not isinstance(loss_grad, Tensor):
        loss_grad = as_tensor(float(loss_grad), dtype=dtypes.float32)
    loss, grad = create_op("nll_loss_with_softmax_grad", [probs, labels, loss_grad],
                           {"ignore_index": ignore_index, "reduction": reduction})
    return loss, grad


# roi_align --------------------------------------------------------------------------------------------
def _roi_align_infer(specs, output_size, spatial_scale, sampling_ratio):
    x, rois, bidx = specs
    if len(x.shape) != 4:
        raise ValueError(f"t must be (N, C, H, W), got shape {x.shape}")
    if not x.dtype.is_floating_point or x.dtype in _FP8:
        raise TypeError(f"t must be float16/float32/float64, got {x.dtype.name}")
    if len(rois.shape) != 2 or rois.shape[1] != 4:
        raise ValueError(f"rois must be (R, 4) boxes x1, y1, x2, y2, got shape {rois.shape}")
    if rois.dtype is not x.dtype:
        raise TypeError(f"rois must have t's dtype {x.dtype.name}, got {rois.dtype.name}")
    if bidx.shape != (rois.shape[0],) or not bidx.dtype.is_int:
        raise ValueError(f"batch_index must be ({rois.shape[0]},) integers, got {bidx.shape} {bidx.dtype.name}")
    if len(output_size) != 2 or any(v < 1 for v in output_size):
        raise ValueError(f"output_size must be two positive ints (h, w), got {output_size}")
    if sampling_ratio < 0:
        raise ValueError(f"sampling_ratio must be >= 0, got {sampling_ratio}")
    return [spec((rois.shape[0], x.shape[1]) + tuple(output_size), x.dtype)]


def _bilinear_weights(pos: np.ndarray, size: int):
    """Low/high indices and weights of 1-D linear interpolation at ``pos`` (ONNX RoiAlign edge
    rules: outside [-1, size] contributes nothing, else clamped to the border)."""
    inside = (pos >= -1.0) & (pos <= size)
    p = np.clip(pos, 0.0, size)  # a position beyond the image (weight 0) reads the border
    lo = np.minimum(np.floor(p).astype(np.int64), size - 1)
    hi = np.minimum(lo + 1, size - 1)
    p = np.where(lo >= size - 1, lo, p)
    frac = p - lo
    return lo, hi, (1.0 - frac) * inside, frac * inside


# The most bilinear samples one box may take (both sides' counts multiplied): a box of billions of
# pixels sampled adaptively would otherwise run for hours or exhaust memory.
_ROI_MAX_SAMPLES = 2 ** 26


def _samples_per_bin(opname: str, ratio: int, extent: float, bins: int, box: int) -> int:
    """Samples per bin along a side of length ``extent`` (sampling_ratio, or adaptive); huge counts
    are capped at 2**62, which the sample limit then refuses."""
    if ratio > 0:
        return ratio
    if math.isnan(extent):
        raise ValueError(f"{opname}: box {box} has NaN coordinates; adaptive sampling (sampling_ratio 0) "
                         f"needs finite boxes")
    return int(min(math.ceil(extent / bins) if math.isfinite(extent) else math.inf, 2.0 ** 62))


def _roi_samples(opname: str, roi: np.ndarray, output_size, spatial_scale: float, sampling_ratio: int, box: int,
                 x_shape: Tuple[int, ...], image: int):
    """Sample positions of box ``box`` on image ``image`` of a batch ``x_shape``: ys (ph, gh) and
    xs (pw, gw), gh/gw samples per bin and side, and the image index (negative counts from the
    end). Errors naming the op ``opname`` (with the native kernel's messages) for NaN positions,
    too many samples and images out of range."""
    ph, pw = output_size
    x1, y1, x2, y2 = (float(v) * spatial_scale for v in roi.astype(np.float64))
    rh, rw = max(y2 - y1, 1.0), max(x2 - x1, 1.0)
    gh = _samples_per_bin(opname, sampling_ratio, rh, ph, box)
    gw = _samples_per_bin(opname, sampling_ratio, rw, pw, box)
    if float(ph) * gh * pw * gw > _ROI_MAX_SAMPLES:
        raise ValueError(f"{opname}: box {box} would take {gh} x {gw} samples in each of its {ph} x {pw} bins, "
                         f"more than 2**26 in all; give a smaller sampling_ratio (0 samples adaptively, by the "
                         f"box's size)")
    n = x_shape[0]
    if not -n <= image < n:
        raise IndexError(f"{opname}: batch_index[{box}] = {image} is out of range for a batch of {n} images")
    ys = y1 + (np.arange(ph)[:, None] + (np.arange(gh)[None, :] + 0.5) / gh) * (rh / ph)
    xs = x1 + (np.arange(pw)[:, None] + (np.arange(gw)[None, :] + 0.5) / gw) * (rw / pw)
    for axis, pos, size in (("y", ys, x_shape[2]), ("x", xs, x_shape[3])):
        bad = np.isnan(pos) if size else np.ones(pos.shape, bool)
        if bad.any():
            raise IndexError(f"{opname}: box {box} samples {axis} position {pos[bad].reshape(-1)[0]:f}, outside "
                             f"the image's {size} pixels")
    return ys, xs, gh, gw, image % n


def _roi_align_kernel(x, rois, batch_index, output_size, spatial_scale, sampling_ratio):
    w = _wide(x.dtype)
    xf = x.astype(w)
    _, c, height, width = x.shape
    ph, pw = output_size
    out = np.zeros((rois.shape[0], c, ph, pw), w)
    for r in range(rois.shape[0]):
        ys, xs, gh, gw, image = _roi_samples("roi_align", rois[r], output_size, spatial_scale, sampling_ratio, r,
                                             x.shape, int(batch_index[r]))
        ylo, yhi, wyl, wyh = _bilinear_weights(ys.reshape(-1), height)
        xlo, xhi, wxl, wxh = _bilinear_weights(xs.reshape(-1), width)
        img = xf[image]
        val = sum(img[:, yi][:, :, xi] * (wy[:, None] * wx[None, :]).astype(w)
                  for yi, wy in ((ylo, wyl), (yhi, wyh)) for xi, wx in ((xlo, wxl), (xhi, wxh)))
        out[r] = val.reshape(c, ph, gh, pw, gw).mean(axis=(2, 4))
    return out.astype(x.dtype)


register(OpDef("roi_align", _roi_align_infer, _roi_align_kernel, family="nn"))


def roi_align(t: Tensor, rois: Tensor, batch_index: Tensor, output_size: Tuple[int], spatial_scale: float,
              sampling_ratio: int) -> Tensor:
    """Average RoI align: for each box ``rois[r]`` = (x1, y1, x2, y2) on image
    ``batch_index[r]`` of ``t`` (N, C, H, W), an (h, w) = ``output_size`` grid of bins, each the
    mean of bilinear samples on a regular sub-grid (``sampling_ratio`` per side, 0 = adaptive
    ceil(box size / output size)). Boxes are multiplied by ``spatial_scale`` with no half-pixel
    shift (ONNX's "output_half_pixel" mode, as in RoiAlign-10) and are at least 1x1. Samples
    beyond one pixel outside the image count as 0. A box may take at most 2**26 samples in all
    (a ValueError names it otherwise)."""
    try:
        size = _ints(output_size, 2, "output_size", -1)
        if isinstance(sampling_ratio, bool) or not isinstance(sampling_ratio, (int, np.integer)):
            raise TypeError(f"sampling_ratio must be an int, not {sampling_ratio!r}")
    except (TypeError, ValueError) as e:
        raise _fail("roi_align", e) from None
    return create_op("roi_align", [t, rois, batch_index], {"output_size": size, "spatial_scale": float(spatial_scale),
                                                            "sampling_ratio": int(sampling_ratio)})[0]


# float8 casts -----------------------------------------------------------------------------------------
def _to_fp8_infer(specs, data_type):
    x, s = specs
    if data_type not in _FP8:
        raise TypeError(f"data_type must be float8_143 or float8_152, not {data_type!r}")
    if not x.dtype.is_floating_point or x.dtype in _FP8:
        raise TypeError(f"t must be float16/float32/float64, got {x.dtype.name}")
    _check_log2_scale(s)
    return [spec(x.shape, data_type)]


def _to_fp8_kernel(x, s, data_type):
    fmt = dtypes.ml_dtype(data_type)
    v = x.astype(np.float64) * _scale_value(s, "pow2scale_cast_to_fp8")
    limit = float(ml_dtypes.finfo(fmt).max)
    v = np.where(np.abs(v) > limit, np.nan, v)
    return v.astype(fmt)


def _from_fp8_infer(specs, data_type):
    x, s = specs
    if x.dtype not in _FP8:
        raise TypeError(f"t must be float8_143 or float8_152, got {x.dtype.name}")
    if data_type not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"data_type must be float16 or float32, not {data_type!r}")
    _check_log2_scale(s)
    return [spec(x.shape, data_type)]


def _from_fp8_kernel(x, s, data_type):
    return (x.astype(np.float64) * _scale_value(s, "pow2scale_cast_from_fp8")).astype(dtypes.ml_dtype(data_type))


register(OpDef("pow2scale_cast_to_fp8", _to_fp8_infer, _to_fp8_kernel, grad=Grad.RAISE, family="nn"))
register(OpDef("pow2scale_cast_from_fp8", _from_fp8_infer, _from_fp8_kernel, grad=Grad.RAISE, family="nn"))


def pow2scale_cast_to_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """``t * 2**log2_scale`` rounded to the float8 ``data_type`` (nearest, ties to even); values
    beyond the format's largest magnitude become NaN, as the host conversion does by default.
    ``log2_scale`` is a scalar int32 tensor with a value in [-32, 32)."""
    return create_op("pow2scale_cast_to_fp8", [t, log2_scale], {"data_type": data_type})[0]


def pow2scale_cast_from_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """Float8 ``t`` decoded to float16/float32 ``data_type`` and multiplied by 2**log2_scale."""
    return create_op("pow2scale_cast_from_fp8", [t, log2_scale], {"data_type": data_type})[0]


# gradients ------------------------------------------------------------------------------------------
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

    return [back(matmul(g2, last2_t(b2)), a2.shape, 0) if ctx.needs(0) else None,
            back(matmul(last2_t(a2), g2), b2.shape, 1) if ctx.needs(1) else None]


def _softmax_grad_infer(specs, axis):
    g, y = specs
    if g.shape != y.shape or g.dtype != y.dtype:
        raise ValueError(f"softmax_grad: the gradient ({g.dtype.name} {g.shape}) must match softmax's output "
                         f"({y.dtype.name} {y.shape})")
    return [spec(y.shape, y.dtype)]


def _softmax_grad_kernel(g, y, axis):
    """g * y - y * sum(g * y) along ``axis``: the gradient w.r.t. the logits of y = softmax(x)."""
    w = _wide(y.dtype)
    gy = g.astype(w) * y.astype(w)
    return (gy - y.astype(w) * gy.sum(axis=axis, keepdims=True)).astype(y.dtype)


# One fused kernel: as a composite (mul, sum, mul, sub) it made four passes over attention's
# (batch, heads, seq, seq) probabilities.
register(OpDef("softmax_grad", _softmax_grad_infer, _softmax_grad_kernel, grad=Grad.RAISE, family="nn"))


@grad_rule("softmax")
def _softmax_grad(ctx):
    return [create_op("softmax_grad", [ctx.grad(0), ctx.output(0)], {"axis": ctx.attrs["axis"]})[0]]


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


register(OpDef("nll_loss_grad", _nll_grad_infer, _nll_grad_kernel, grad=Grad.RAISE, family="nn"))


@grad_rule("nll_loss")
def _nll_loss_grad(ctx):
    return [create_op("nll_loss_grad", [ctx.input(0), ctx.input(1), ctx.grad(0)], ctx.attrs)[0], None]


def _group_norm_grad_infer(specs, num_groups, eps):
    x, w = specs[0], specs[1]
    return [spec(x.shape, x.dtype), spec(w.shape, w.dtype), spec(w.shape, w.dtype)]


def _group_norm_grad_kernel(x, weight, g, num_groups, eps):
    """(dx, dweight, dbias) of group_norm, with the statistics recomputed from x."""
    w = _wide(x.dtype)
    grouped = _grouped(x, num_groups, w)
    mean = grouped.mean(axis=-1, keepdims=True)
    inv_std = 1.0 / np.sqrt(((grouped - mean) ** 2).mean(axis=-1, keepdims=True) + w.type(eps))
    xhat = ((grouped - mean) * inv_std).reshape(x.shape)
    gw = g.astype(w)
    per_channel = (0,) + tuple(range(2, x.ndim))
    dweight, dbias = (gw * xhat).sum(axis=per_channel), gw.sum(axis=per_channel)
    dxhat = _grouped(gw * _channel(weight, x.ndim, w), num_groups, w)
    xh = _grouped(xhat, num_groups, w)
    dx = (dxhat - dxhat.mean(axis=-1, keepdims=True) - xh * (dxhat * xh).mean(axis=-1, keepdims=True)) * inv_std
    return dx.reshape(x.shape).astype(x.dtype), dweight.astype(weight.dtype), dbias.astype(weight.dtype)


# One fused kernel for the three gradients of a normalisation (a composite would take ~15 ops).
register(OpDef("group_norm_grad", _group_norm_grad_infer, _group_norm_grad_kernel, grad=Grad.RAISE, family="nn"))


@grad_rule("group_norm", "layer_norm")
def _group_norm_grad(ctx):
    groups = ctx.attrs.get("num_groups", 1)
    dx, dw, db = create_op("group_norm_grad", [ctx.input(0), ctx.input(1), ctx.grad(0)],
                           {"num_groups": groups, "eps": ctx.attrs["eps"]})
    return [dx, dw, db]


@grad_rule("batch_norm_inference")
def _batch_norm_grad(ctx):
    """y = scale * (x - mean) * r + bias with r = 1/sqrt(var + eps): gradients for all five inputs."""
    x, scale, mean, var, g = ctx.input(0), ctx.input(1), ctx.input(3), ctx.input(4), ctx.grad(0)
    c_shape = (1, x.shape[1]) + (1,) * (x.rank - 2)
    per_channel = (0,) + tuple(range(2, x.rank))

    def chan(t: Tensor) -> Tensor:
        return t.reshape(c_shape)

    def total(t: Tensor) -> Tensor:
        return create_op("sum", [t], {"axis": per_channel, "keepdims": False})[0]

    r = 1.0 / create_op("sqrt", [var + ctx.attrs["epsilon"]])[0]
    centred = x - chan(mean)
    g_scaled = g * chan(scale * r)
    return [g_scaled if ctx.needs(0) else None,
            total(g * centred) * r if ctx.needs(1) else None,
            total(g) if ctx.needs(2) else None,
            create_op("negate", [total(g_scaled)])[0] if ctx.needs(3) else None,
            total(g * centred) * scale * r * r * r * -0.5 if ctx.needs(4) else None]


def _windows_adjoint(dwin: np.ndarray, x_shape: Tuple[int, ...], kernel, strides, dilations, pads,
                     ceil_mode: bool = False) -> np.ndarray:
    """The transpose of `_windows`: adds every window element back onto the input position it was
    read from (padding positions are dropped). Works for any pads/crops by taking the windows of
    an array of flat positions (0 marks padding)."""
    positions = np.arange(1, math.prod(x_shape) + 1, dtype=np.int64).reshape(x_shape)
    where = _windows(positions, kernel, strides, dilations, pads, ceil_mode, fill=0)
    hit = where > 0
    out = np.zeros(math.prod(x_shape), dwin.dtype)
    np.add.at(out, where[hit] - 1, dwin[hit])
    return out.reshape(x_shape)


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
    wide = _wide(x.dtype)
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
        dx = _windows_adjoint(dwin.reshape((n, c) + g.shape[2:] + k), x.shape, k, strides, dilations, pads)
        out.append(dx.astype(x.dtype))
    if "dweight" in grads:
        win = _windows(x.astype(wide), k, strides, dilations, pads)
        win = win.reshape((n, groups, c // groups) + win.shape[2:2 + r] + k)
        dw = np.einsum(f"ngc{o_ax}{k_ax},ngm{o_ax}->gmc{k_ax}", win, gg, optimize=True)
        out.append(dw.reshape(w.shape).astype(w.dtype))
    return tuple(out)


# Dedicated gradient ops for convolution and pooling (one kernel each instead of a composite).
register(OpDef("conv_grad", _conv_grad_infer, _conv_grad_kernel, grad=Grad.RAISE, family="nn"))


@grad_rule("conv")
def _conv_grad(ctx):
    needed = [i for i in (0, 1) if ctx.needs(i)]
    if not needed:
        return [None, None]
    grads = create_op("conv_grad", [ctx.input(0), ctx.input(1), ctx.grad(0)],
                      {**ctx.attrs, "grads": tuple(_CONV_GRADS[i] for i in needed)})
    made = dict(zip(needed, grads))
    return [made.get(0), made.get(1)]


def _pool_grad_infer(specs, **_):
    return [specs[0]]


def _max_pool_grad_kernel(x, g, kernel, strides, pads, dilations, ceil_mode, storage_order):
    """The gradient goes to the first maximum of each window."""
    r = len(kernel)
    win = _windows(x, kernel, strides, dilations, pads, ceil_mode, fill=-np.inf)
    flat = win.reshape(win.shape[:-r] + (-1,))
    first = np.argmax(flat, axis=-1)[..., None]
    wide = g.astype(_wide(g.dtype))
    dflat = np.zeros(flat.shape, wide.dtype)
    np.put_along_axis(dflat, first, wide[..., None], axis=-1)
    dx = _windows_adjoint(dflat.reshape(win.shape), x.shape, kernel, strides, dilations, pads, ceil_mode)
    return dx.astype(x.dtype)


def _average_pool_grad_kernel(x, g, kernel, strides, pads, dilations, ceil_mode):
    """Each output's gradient is shared equally by the input positions it averaged."""
    r = len(kernel)
    wide = _wide(x.dtype)
    ones = np.ones((1, 1) + x.shape[2:], wide)
    count = _windows(ones, kernel, strides, dilations, pads, ceil_mode).sum(axis=tuple(range(-r, 0)))
    share = g.astype(wide) / count
    dwin = np.broadcast_to(share.reshape(share.shape + (1,) * r), share.shape + tuple(kernel))
    return _windows_adjoint(dwin, x.shape, kernel, strides, dilations, pads, ceil_mode).astype(x.dtype)


register(OpDef("max_pool_grad", _pool_grad_infer, _max_pool_grad_kernel, grad=Grad.RAISE, family="nn"))
register(OpDef("average_pool_grad", _pool_grad_infer, _average_pool_grad_kernel, grad=Grad.RAISE, family="nn"))


@grad_rule("max_pool", "average_pool")
def _pool_grad(ctx):
    return [create_op(ctx.op.type + "_grad", [ctx.input(0), ctx.grad(0)], ctx.attrs)[0]]


def _bin_matrix(pos: np.ndarray, size: int) -> np.ndarray:
    """(bins, size): row b averages the bilinear samples pos[b, :] of a line of ``size`` pixels."""
    bins, per_bin = pos.shape
    lo, hi, w_lo, w_hi = _bilinear_weights(pos.reshape(-1), size)
    rows = np.repeat(np.arange(bins), per_bin)
    m = np.zeros((bins, size))
    np.add.at(m, (rows, lo), w_lo / per_bin)
    np.add.at(m, (rows, hi), w_hi / per_bin)
    return m


def _roi_align_grad_kernel(x, rois, batch_index, g, output_size, spatial_scale, sampling_ratio):
    """Each box's output is A_y @ image @ A_x^T per channel (bilinear sampling and bin averaging
    are separable), so the image gradient adds A_y^T @ g @ A_x to that box's image."""
    _, _, height, width = x.shape
    dx = np.zeros(x.shape, np.float64)
    for r in range(rois.shape[0]):
        ys, xs, _, _, image = _roi_samples("roi_align_grad", rois[r], output_size, spatial_scale, sampling_ratio, r,
                                           x.shape, int(batch_index[r]))
        ay, ax = _bin_matrix(ys, height), _bin_matrix(xs, width)
        dx[image] += np.einsum("ph,cpq,qw->chw", ay, g[r].astype(np.float64), ax)
    return dx.astype(x.dtype)


register(OpDef("roi_align_grad", lambda specs, **_: [specs[0]], _roi_align_grad_kernel, grad=Grad.RAISE,
               family="nn"))


@grad_rule("roi_align")
def _roi_align_grad(ctx):  # the boxes and indices get no gradient
    return [create_op("roi_align_grad", [ctx.input(0), ctx.input(1), ctx.input(2), ctx.grad(0)], ctx.attrs)[0],
            None, None]
