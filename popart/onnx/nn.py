"""ONNX entries of the neural-network ops: Softmax, LogSoftmax and Hardmax, the losses, convolution
and pooling, and the normalisations (with Dropout)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes
from popart.onnx.elementwise import _reciprocal
from popart.onnx.indexing import _element_positions
from popart.onnx.shape import _pad_tensor, _repeat_axis
from popart.onnx.table import Node, Value, _as_int32, _axis, _i32, _prod, _scalar, onnx_fold, onnx_op

__all__: List[str] = []


# softmax ----------------------------------------------------------------------------------------------
def _log_softmax(x: popxl.Tensor, axis: int) -> popxl.Tensor:
    # (x - max) - log(sum(exp(x - max))): x - logsumexp(x) loses the digits of large x (1e4 + 3.44
    # holds 3.44 to ~5e-4 in float32). The max only shifts: no gradient flows through it.
    shifted = ops.sub(x, ops.detach(ops.max(x, axis, keepdims=True)))
    return ops.sub(shifted, ops.log(ops.sum(ops.exp(shifted), axis, keepdims=True)))


def _softmax_view(n: Node, shape: Tuple[int, ...]) -> Tuple[Tuple[int, ...], int]:
    """The shape Softmax, LogSoftmax and Hardmax see their input in, and the axis they work along:
    from opset 13 the input itself along ``axis`` (default -1); before, the input seen as 2-D,
    [prod(shape[:axis]), prod(shape[axis:])] (default axis 1), along its second axis."""
    if n.opset >= 13:
        return tuple(shape), _axis(int(n.attr("axis", -1)), len(shape), n, scalar_axis=False)
    axis = _axis(int(n.attr("axis", 1)), len(shape), n)
    return (_prod(shape[:axis]), _prod(shape[axis:])), 1


@onnx_op("Softmax", "LogSoftmax")
def _softmax(n: Node) -> List[Value]:
    x = n.x(0)
    fn = ops.softmax if n.op_type == "Softmax" else _log_softmax
    view, axis = _softmax_view(n, x.shape)
    return [ops.reshape(fn(ops.reshape(x, view), axis), x.shape)]


# losses -----------------------------------------------------------------------------------------------
_REDUCTIONS = ("none", "sum", "mean")


def _nll(n: Node, log_prob: popxl.Tensor, target: popxl.Tensor, weight: Optional[popxl.Tensor]) -> popxl.Tensor:
    """-log_prob[n, target[n, d...], d...] (times weight[target]), reduced as the node asks.
    Targets equal to ignore_index give 0 and count for no weight in the mean."""
    reduction = n.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise n.fail(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if log_prob.rank < 2:
        raise n.fail(f"the input must be (N, C) or (N, C, d1, ...), got shape {log_prob.shape}")
    nb, c = log_prob.shape[:2]
    spatial = tuple(log_prob.shape[2:])
    if tuple(target.shape) != (nb,) + spatial:
        raise n.fail(f"the target's shape {target.shape} must be {(nb,) + spatial} for input shape {log_prob.shape}")
    if weight is not None and tuple(weight.shape) != (c,):
        raise n.fail(f"the weight's shape {weight.shape} must be ({c},)")
    if target.dtype.is_floating_point:
        raise n.fail(f"the target must hold integer class indices, got {target.dtype.name}")
    target = _as_int32(target)
    valid: Optional[popxl.Tensor] = None
    ignore = n.attr("ignore_index")
    if ignore is not None and -2 ** 31 <= int(ignore) < 2 ** 31:
        # ignore_index may lie outside [0, C): point ignored targets at class 0 before any gather.
        valid = ops.logical_not(ops.equal(target, _i32(int(ignore))))
        target = ops.where(valid, target, _i32(0))
    # The target class's element of each (n, d) line of the input seen as (N, C, D).
    d = _prod(spatial)
    flat = _element_positions(ops.reshape(target, (nb, 1, d)), (nb, c, d), 1, (nb, 1, d))
    loss = ops.negate(ops.gather(ops.reshape(log_prob, (log_prob.nelms,)), ops.reshape(flat, target.shape), 0))
    zero = n.scalar(0.0, loss)
    w: Optional[popxl.Tensor] = None
    if weight is not None:
        w = ops.gather(weight, target, 0)
        if valid is not None:
            w = ops.where(valid, w, zero)
        loss = ops.mul(loss, w)
    elif valid is not None:
        w = ops.cast(valid, loss.dtype)
    if valid is not None:
        loss = ops.where(valid, loss, zero)  # exactly 0, even where log_prob is -inf
    if reduction == "none":
        return loss
    total = ops.sum(loss)
    if reduction == "sum":
        return total
    return ops.mean(loss) if w is None else ops.div(total, ops.sum(w))


@onnx_op("NegativeLogLikelihoodLoss")
def _nll_loss(n: Node) -> List[Value]:
    return [_nll(n, n.x(0), n.x(1), n.x(2) if n.has(2) else None)]


@onnx_op("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(n: Node) -> List[Value]:
    scores = n.x(0)
    if scores.rank < 2:
        raise n.fail(f"the scores must be (N, C) or (N, C, d1, ...), got shape {scores.shape}")
    log_prob = _log_softmax(scores, 1)
    return [_nll(n, log_prob, n.x(1), n.x(2) if n.has(2) else None), log_prob]


# convolution and pooling ------------------------------------------------------------------------------
_AUTO_PAD = {"NOTSET": "not_set", "SAME_UPPER": "same_upper", "SAME_LOWER": "same_lower", "VALID": "valid"}


def _window_attrs(n: Node, rank: int) -> Dict[str, Any]:
    auto_pad = n.attr("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PAD:
        raise n.fail(f"unknown auto_pad {auto_pad!r}")
    return {"stride": tuple(n.ints("strides", [1] * rank)),
            "dilation": tuple(n.ints("dilations", [1] * rank)),
            "padding": tuple(n.ints("pads", [0] * (2 * rank))),
            "pad_type": _AUTO_PAD[auto_pad]}


def _add_channel_bias(y: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.add(y, ops.reshape(b, (b.shape[0],) + (1,) * (y.rank - 2)))


@onnx_op("Conv", "ConvTranspose")
def _conv(n: Node) -> List[Value]:
    x, w = n.x(0), n.x(1)
    rank = w.rank - 2
    kw = _window_attrs(n, rank)
    groups = int(n.attr("group", 1))
    if n.op_type == "Conv":
        y = ops.conv(x, w, groups=groups, **kw)
    else:
        y = ops.conv_transpose(x, w, groups=groups, output_padding=tuple(n.ints("output_padding", [])),
                               output_shape=tuple(n.ints("output_shape", [])), **kw)
    return [_add_channel_bias(y, n.x(2)) if n.has(2) else y]


def _pad_explicit(x: popxl.Tensor, pads: Sequence[int], value: float, n: Node) -> popxl.Tensor:
    """Constant-pad the spatial axes of an (N, C, ...) tensor by ONNX-ordered ``pads``."""
    r = x.rank - 2
    full = [0, 0] + list(pads[:r]) + [0, 0] + list(pads[r:])
    return _pad_tensor(x, full, "constant", value, n)


def _kernel_shape(n: Node) -> List[int]:
    kernel = n.ints("kernel_shape")
    if kernel is None:
        raise n.fail("kernel_shape is required")
    return kernel


@onnx_op("MaxPool", "AveragePool")
def _pool(n: Node) -> List[Value]:
    x = n.x(0)
    kernel = _kernel_shape(n)
    rank = len(kernel)
    kw = _window_attrs(n, rank)
    ceil_mode = bool(n.attr("ceil_mode", 0))
    kw["auto_pad"] = kw.pop("pad_type")  # the pooling ops name it after the ONNX attribute
    if n.op_type == "MaxPool":
        if n.attr("storage_order", 0):
            raise n.fail("storage_order=1 only affects the Indices output, which is not supported")
        if not x.dtype.is_floating_point and x.dtype.itemsize <= 2:
            # popxl pools floats only; 8- and 16-bit integers are exact in float32, and the maximum
            # is one of the inputs, so the round trip is exact.
            y = ops.max_pool(ops.cast(x, dtypes.float32), tuple(kernel), ceil_mode=ceil_mode, **kw)
            return [ops.cast(y, x.dtype)]
        return [ops.max_pool(x, tuple(kernel), ceil_mode=ceil_mode, **kw)]
    if n.attr("count_include_pad", 0) and any(kw["padding"]):
        if kw["auto_pad"] != "not_set":
            raise n.fail("count_include_pad=1 is supported with explicit pads only, not with auto_pad")
        # Padding values take part in the average: pad with zeros first, then pool without pads.
        pads = kw["padding"]
        spatial = x.shape[2:]
        x = _pad_explicit(x, pads, 0.0, n)
        kw["padding"] = (0,) * (2 * rank)
        y = ops.average_pool(x, tuple(kernel), ceil_mode=ceil_mode, **kw)
        if ceil_mode:
            # With the padding now part of the input, a last window that starts in the end padding
            # is no longer recognised as such: drop it, as pooling the unpadded input would.
            want = [_ceil_pool_len(spatial[i], kernel[i], kw["stride"][i], kw["dilation"][i], pads[i],
                                   pads[rank + i]) for i in range(rank)]
            if list(y.shape[2:]) != want:
                y = ops.slice(y, start=[0] * rank, stop=want, axis=list(range(2, 2 + rank)))
        return [y]
    return [ops.average_pool(x, tuple(kernel), ceil_mode=ceil_mode, **kw)]


def _ceil_pool_len(size: int, k: int, s: int, d: int, begin: int, end: int) -> int:
    """Output length of a ceil-mode pooling window along one axis: windows may run past the end
    padding, but none may start in it."""
    span = size + begin + end - ((k - 1) * d + 1)
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= size + begin else out


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(n: Node) -> List[Value]:
    x = n.x(0)
    axes = list(range(2, x.rank))
    fn = ops.mean if n.op_type == "GlobalAveragePool" else ops.max
    return [fn(x, axes, keepdims=True)]


# Lp pools: the sum of |x|^p over each window, to the power 1/p
def _abs_pow(x: popxl.Tensor, p: int) -> popxl.Tensor:
    return ops.abs(x) if p == 1 else ops.mul(x, x) if p == 2 else ops.pow(ops.abs(x), _scalar(float(p), x))


def _root(x: popxl.Tensor, p: int) -> popxl.Tensor:
    return x if p == 1 else ops.sqrt(x) if p == 2 else ops.pow(x, _scalar(1.0 / p, x))


def _lp_norm(x: popxl.Tensor, axes: Sequence[int], p: int) -> popxl.Tensor:
    """The p-norm over ``axes`` (kept): popxl's l1 / l2 reductions for p = 1, 2."""
    if p in (1, 2):
        return (ops.l1 if p == 1 else ops.l2)(x, list(axes), keepdims=True)
    return _root(ops.sum(_abs_pow(x, p), list(axes), keepdims=True), p)


def _p(n: Node) -> int:
    p = int(n.attr("p", 2))
    if p < 1:
        raise n.fail(f"p must be a positive integer, got {p}")
    return p



# Not computed at import: ONNX's reference has no implementation (constant inputs run on the device).
@onnx_op("GlobalLpPool", foldable=False)
def _global_lp_pool(n: Node) -> List[Value]:
    x, p = n.x(0), _p(n)
    return [_lp_norm(x, range(2, x.rank), p)]


def _window_sum(x: popxl.Tensor, kernel: Sequence[int], **window) -> popxl.Tensor:
    """The sum over each pooling window of every channel: a depthwise convolution with ones, whose
    zero padding adds nothing."""
    c = x.shape[1]
    ones = popxl.constant(np.ones((c, 1) + tuple(kernel), x.dtype.as_numpy()))
    return ops.conv(x, ones, groups=c, **window)


@onnx_op("LpPool")
def _lp_pool(n: Node) -> List[Value]:
    x, p = n.x(0), _p(n)
    kernel = _kernel_shape(n)
    rank = len(kernel)
    if x.rank != rank + 2:
        raise n.fail(f"a {rank}-D kernel needs a rank-{rank + 2} input, got shape {x.shape}")
    kw = _window_attrs(n, rank)
    if n.attr("ceil_mode", 0) and kw["pad_type"] == "not_set":
        # the windows a ceil-mode pool adds at the end read only padding beyond the input: more
        # end padding (zeros, which add nothing) gives the convolution those windows
        pads = list(kw["padding"])
        for i in range(rank):
            eff = (kernel[i] - 1) * kw["dilation"][i] + 1
            want = _ceil_pool_len(x.shape[2 + i], kernel[i], kw["stride"][i], kw["dilation"][i], pads[i],
                                  pads[rank + i])
            pads[rank + i] += max(0, (want - 1) * kw["stride"][i] + eff - (x.shape[2 + i] + pads[i] + pads[rank + i]))
        kw["padding"] = tuple(pads)
    return [_root(_window_sum(_abs_pow(x, p), kernel, **kw), p)]


def _hardmax_along(x: popxl.Tensor, axis: int) -> popxl.Tensor:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    on_off = popxl.constant(np.asarray([0, 1], x.dtype.as_numpy()))
    return ops.onehot(ops.argmax(x, axis, False), _i32(x.shape[axis]), on_off, axis)


@onnx_op("Hardmax")
def _hardmax(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank == 0:
        raise n.fail("needs a tensor of rank >= 1")
    view, axis = _softmax_view(n, x.shape)
    return [ops.reshape(_hardmax_along(ops.reshape(x, view), axis), x.shape)]


@onnx_fold("Softmax", "LogSoftmax", "Hardmax")
def _softmax_at_import(n: Node, x: np.ndarray) -> List[np.ndarray]:
    # ONNX's reference implementations know only opset 13's form (no 2-D view before it).
    if x.ndim == 0:
        raise n.fail("needs a tensor of rank >= 1")
    view, axis = _softmax_view(n, x.shape)
    v = x.reshape(view)
    if n.op_type == "Hardmax":  # 1 at the first maximum
        y = (np.arange(v.shape[axis]).reshape([-1 if a == axis else 1 for a in range(v.ndim)])
             == np.expand_dims(np.argmax(v, axis), axis)).astype(x.dtype)
        return [y.reshape(x.shape)]
    # float16 is computed in float32 and rounded once, as on the device
    shifted = v.astype(np.promote_types(x.dtype, np.float32)) - np.max(v, axis, keepdims=True)
    total = np.sum(np.exp(shifted), axis, keepdims=True)
    y = np.exp(shifted) / total if n.op_type == "Softmax" else shifted - np.log(total)
    return [y.astype(x.dtype).reshape(x.shape)]


# normalisation ----------------------------------------------------------------------------------------
@onnx_op("BatchNormalization")
def _batch_norm(n: Node) -> List[Value]:
    training = bool(n.attr("training_mode", 0)) or n.imp.training
    if not training:
        y = ops.batch_norm_inference(n.x(0), n.x(1), n.x(2), n.x(3), n.x(4), epsilon=float(n.attr("epsilon", 1e-5)))
        return [y]
    if not n.imp.training:
        raise n.fail("training_mode=1 needs a TrainingSession (an inference session cannot update the running "
                     "statistics)")
    return _batch_norm_training(n)


def _batch_norm_training(n: Node) -> List[Value]:
    """Normalise with the batch's statistics (biased variance) and compute the new running
    statistics, momentum * running + (1 - momentum) * batch, as ONNX's training mode defines them;
    the importer records them so the session writes them back into the statistics' variables."""
    x = n.x(0)
    axes = [0] + list(range(2, x.rank))
    channel = (1, x.shape[1]) + (1,) * (x.rank - 2)
    mean = ops.mean(x, axes, keepdims=True)
    d = ops.sub(x, mean)
    var = ops.mean(ops.mul(d, d), axes, keepdims=True)
    y = ops.mul(d, _reciprocal(ops.sqrt(ops.add(var, n.scalar(float(n.attr("epsilon", 1e-5)), var)))))
    y = ops.add(ops.mul(y, ops.reshape(n.x(1), channel)), ops.reshape(n.x(2), channel))
    m = float(n.attr("momentum", 0.9))
    stats: List[Value] = []
    for k, batch in ((3, mean), (4, var)):
        running = n.x(k)
        new = ops.add(ops.mul(running, n.scalar(m, running)),
                      ops.mul(ops.detach(ops.reshape(batch, running.shape)), n.scalar(1.0 - m, running)))
        n.imp.stat_updates.append((n.proto.input[k], new))
        stats.append(new)
    return [y] + stats


def _standardise(x: popxl.Tensor, axes: Sequence[int], eps: float,
                 n: Node) -> Tuple[popxl.Tensor, popxl.Tensor, popxl.Tensor]:
    """(x - mean) / sqrt(var + eps) over ``axes`` (biased variance), with the mean and 1/std."""
    mean = ops.mean(x, list(axes), keepdims=True)
    d = ops.sub(x, mean)
    var = ops.mean(ops.mul(d, d), list(axes), keepdims=True)
    inv_std = _reciprocal(ops.sqrt(ops.add(var, n.scalar(eps, var))))
    return ops.mul(d, inv_std), mean, inv_std


@onnx_op("LayerNormalization")
def _layer_norm(n: Node) -> List[Value]:
    x = n.x(0)
    axis = _axis(int(n.attr("axis", -1)), x.rank, n)
    y, mean, inv_std = _standardise(x, range(axis, x.rank), float(n.attr("epsilon", 1e-5)), n)
    y = ops.mul(y, n.x(1))
    if n.has(2):
        y = ops.add(y, n.x(2))
    return [y, mean, inv_std]


def _per_channel(p: popxl.Tensor, rank: int) -> popxl.Tensor:
    return ops.reshape(p, (p.shape[0],) + (1,) * (rank - 2))


@onnx_op("InstanceNormalization")
def _instance_norm(n: Node) -> List[Value]:
    x = n.x(0)
    if x.rank < 2:
        raise n.fail(f"the input must be (N, C, ...), got shape {x.shape}")
    scale, bias = n.x(1), n.x(2)
    if x.shape[1] == 0:  # no channels: nothing to normalise (group_norm needs at least one group)
        return [ops.add(ops.mul(x, _per_channel(scale, x.rank)), _per_channel(bias, x.rank))]
    # popxl's group_norm with one group per channel: each (n, c) normalised over its positions
    return [ops.group_norm(x, scale, bias, x.shape[1], float(n.attr("epsilon", 1e-5)))]


# Not computed at import: ONNX's reference fails on its opset-21 form (constant inputs run on the device).
@onnx_op("GroupNormalization", foldable=False)
def _group_norm(n: Node) -> List[Value]:
    x = n.x(0)
    groups = int(n.attr("num_groups"))
    if x.rank < 2 or groups < 1:
        raise n.fail(f"the input must be (N, C, ...) and num_groups positive, got shape {x.shape}, {groups} groups")
    c = x.shape[1]
    if c % groups:
        raise n.fail(f"{c} channels do not split into {groups} groups")
    scale, bias = n.x(1), n.x(2)
    if n.opset < 21 and scale.shape[0] == groups and groups != c:
        # Opsets 18-20 scale and shift per group: give each channel its group's value.
        per = np.repeat(np.arange(groups), c // groups)
        scale, bias = _repeat_axis(scale, 0, per), _repeat_axis(bias, 0, per)
    return [ops.group_norm(x, scale, bias, groups, float(n.attr("epsilon", 1e-5)))]


@onnx_op("Dropout")
def _dropout(n: Node) -> List[Optional[Value]]:
    training = n.optional_static(2, "training_mode") if n.opset >= 12 else None
    x = n.x(0)
    if n.imp.training and (training is None or bool(training)):
        # A TrainingSession drops (as PopART does), with a fresh seed per call of the forward graph.
        ratio = n.static_float(1, "ratio") if n.opset >= 12 and n.has(1) else float(n.attr("ratio", 0.5))
        if ratio == 0.0:
            return [x, np.ones(x.shape, np.bool_)]
        if n.imp.random is None:  # the session's seed reaches the top-level graph and bodies imported inline
            raise n.fail("dropout when training is not supported in a body lowered as a graph of its own (a "
                         "branch of an If whose condition is computed on the device): it has no random seed")
        return [ops.dropout(x, n.imp.random.split(), ratio), None]
    if training is not None and bool(training):
        raise n.fail("training_mode=true is not supported by an inference session")
    # Inference: the identity, and a mask of all ones.
    return [x, np.ones(x.shape, np.bool_)]


@onnx_op("LpNormalization")
def _lp_normalization(n: Node) -> List[Value]:
    x = n.x(0)
    p = _p(n)
    if p not in (1, 2):
        raise n.fail(f"p must be 1 or 2, got {p}")
    axis = _axis(int(n.attr("axis", -1)), x.rank, n)
    norm = _lp_norm(x, [axis], p)
    zero = _scalar(0.0, x)
    # an all-zero line stays zero (its norm is 0; the division's NaN is not selected)
    return [ops.where(ops.equal(norm, zero), zero, ops.div(x, norm))]



@onnx_op("LRN")
def _lrn(n: Node) -> List[Value]:
    x = n.x(0)
    size = n.attr("size")
    if size is None or int(size) < 1:
        raise n.fail(f"size must be a positive integer, got {size}")
    size = int(size)
    if x.rank < 2:
        raise n.fail(f"needs an (N, C, ...) input, got shape {x.shape}")
    alpha, beta, bias = float(n.attr("alpha", 1e-4)), float(n.attr("beta", 0.75)), float(n.attr("bias", 1.0))
    # The channel window [c - (size - 1) // 2, c + ceil((size - 1) / 2)]: channels as the one
    # spatial axis of a window sum, the other axes flattened beside them.
    lead, c = x.shape[:2]
    rest = _prod(x.shape[2:])
    sq = ops.reshape(ops.mul(x, x), (lead, 1, c, rest))
    lo, hi = (size - 1) // 2, size // 2
    ss = ops.reshape(_window_sum(sq, (size, 1), padding=(lo, 0, hi, 0)), x.shape)
    scale = ops.add(_scalar(bias, x), ops.mul(_scalar(alpha / size, x), ss))
    return [ops.div(x, ops.pow(scale, _scalar(beta, x)))]


@onnx_op("MeanVarianceNormalization")
def _mean_variance_normalization(n: Node) -> List[Value]:
    x = n.x(0)
    axes = sorted({_axis(a, x.rank, n, "axes") for a in n.ints("axes", [0, 2, 3])})
    centred = ops.sub(x, ops.mean(x, axes, keepdims=True))
    std = ops.sqrt(ops.mean(ops.mul(centred, centred), axes, keepdims=True))
    return [ops.div(centred, ops.add(std, _scalar(1e-9, x)))]
