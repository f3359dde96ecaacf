"""NN ops (conv, pools, norms, losses, roi_align, float8 family) through popxl.Session, checked
against independent loop/formula references written here."""
import itertools
import math

import ml_dtypes
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import dtypes
from popxl.fp8_utils import host_pow2scale_cast_from_fp8, host_pow2scale_cast_to_fp8
from popxl.op import REGISTRY, Grad
from engine_harness import run_program

RNG = np.random.default_rng(1234)


def run(build, *inputs):
    outs, _ = run_program(build, list(inputs), "native")
    return outs[0] if len(outs) == 1 else outs


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# independent references ---------------------------------------------------------------------------
def ref_conv(x, w, stride, pads, dil, groups):
    """Direct nested-loop convolution (cross-correlation) in float64."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    r = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[r + i]) for i in range(r)])
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    out_sz = [(xp.shape[2 + i] - (k[i] - 1) * dil[i] - 1) // stride[i] + 1 for i in range(r)]
    out = np.zeros((n, m, *out_sz))
    mg = m // groups
    for b, o in itertools.product(range(n), range(m)):
        g = o // mg
        for pos in itertools.product(*[range(s) for s in out_sz]):
            acc = 0.0
            for ci in range(cg):
                for kk in itertools.product(*[range(s) for s in k]):
                    idx = tuple(pos[i] * stride[i] + kk[i] * dil[i] for i in range(r))
                    acc += xp[(b, g * cg + ci) + idx] * w[(o, ci) + kk]
            out[(b, o) + pos] = acc
    return out


def ref_conv_transpose(x, w, stride, pads, dil, groups, out_pad):
    """Scatter form: every input element adds input * kernel onto the output."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    r = x.ndim - 2
    n, c = x.shape[:2]
    mg = w.shape[1]
    k = w.shape[2:]
    full = [stride[i] * (x.shape[2 + i] - 1) + (k[i] - 1) * dil[i] + 1 + out_pad[i] for i in range(r)]
    big = np.zeros((n, mg * groups, *full))
    cg = c // groups
    for b, ci in itertools.product(range(n), range(c)):
        g = ci // cg
        for pos in itertools.product(*[range(s) for s in x.shape[2:]]):
            for kk in itertools.product(*[range(s) for s in k]):
                idx = tuple(pos[i] * stride[i] + kk[i] * dil[i] for i in range(r))
                for mo in range(mg):
                    big[(b, g * mg + mo) + idx] += x[(b, ci) + pos] * w[(ci, mo) + kk]
    sl = tuple(slice(pads[i], full[i] - pads[r + i]) for i in range(r))
    return big[(slice(None), slice(None)) + sl]


def ref_pool(x, kernel, stride, pads, dil, mode, out_sz):
    """Loop pool over explicit output sizes; padding is skipped (never max, not counted)."""
    r = x.ndim - 2
    out = np.zeros(x.shape[:2] + tuple(out_sz))
    for b, c in itertools.product(*[range(s) for s in x.shape[:2]]):
        for pos in itertools.product(*[range(s) for s in out_sz]):
            vals = []
            for kk in itertools.product(*[range(s) for s in kernel]):
                idx = tuple(pos[i] * stride[i] - pads[i] + kk[i] * dil[i] for i in range(r))
                if all(0 <= idx[i] < x.shape[2 + i] for i in range(r)):
                    vals.append(float(x[(b, c) + idx]))
            out[(b, c) + pos] = max(vals) if mode == "max" else sum(vals) / len(vals)
    return out


# conv ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("xshape,wshape,stride,pads,dil,groups", [
    ((2, 4, 7, 6), (6, 2, 3, 2), (1, 1), (0, 0, 0, 0), (1, 1), 2),
    ((1, 3, 8, 9), (4, 3, 3, 3), (2, 3), (1, 0, 2, 1), (1, 2), 1),  # strides, dilation, asymmetric pads
    ((1, 4, 6, 6), (4, 1, 2, 2), (1, 2), (0, 1, 1, 0), (2, 1), 4),  # depthwise
    ((2, 2, 9), (3, 2, 3), (2,), (1, 2), (2,), 1),  # 1-D
    ((1, 2, 4, 5, 4), (2, 1, 2, 3, 2), (1, 2, 1), (1, 0, 0, 0, 1, 1), (1, 1, 2), 2),  # 3-D
])
def test_conv_matches_loops(xshape, wshape, stride, pads, dil, groups):
    x, w = rand(*xshape), rand(*wshape)
    got = run(lambda a, b: ops.conv(a, b, stride, pads, dil, groups), x, w)
    want = ref_conv(x, w, stride, pads, dil, groups)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_defaults_and_float16():
    x, w = rand(1, 3, 5, 5, dtype=np.float16), rand(2, 3, 3, 3, dtype=np.float16)
    got = run(lambda a, b: ops.conv(a, b), x, w)
    assert got.dtype == np.float16 and got.shape == (1, 2, 3, 3)
    np.testing.assert_allclose(got.astype(np.float64), ref_conv(x, w, (1, 1), (0,) * 4, (1, 1), 1),
                               rtol=1e-2, atol=2e-2)
    # the 2-D defaults also serve 1-D and 3-D inputs
    x1, w1 = rand(1, 1, 6), rand(1, 1, 2)
    np.testing.assert_allclose(run(lambda a, b: ops.conv(a, b), x1, w1),
                               ref_conv(x1, w1, (1,), (0, 0), (1,), 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pad_type,size,k,s,d,expected_pads", [
    ("same_upper", 5, 2, 1, 1, (0, 1)), ("same_lower", 5, 2, 1, 1, (1, 0)),
    ("same_upper", 7, 3, 2, 1, (1, 1)), ("same_upper", 6, 3, 2, 1, (0, 1)), ("same_lower", 6, 3, 2, 1, (1, 0)),
    ("same_upper", 5, 3, 1, 2, (2, 2)), ("valid", 6, 3, 2, 1, (0, 0)),
])
def test_conv_pad_types(pad_type, size, k, s, d, expected_pads):
    x, w = rand(1, 2, size, size + 1), rand(3, 2, k, k)
    got = run(lambda a, b: ops.conv(a, b, (s, s), (9, 9, 9, 9), (d, d), pad_type=pad_type), x, w)
    # width: size + 1; recompute expected pads there with the ONNX rule written out
    out_w = math.ceil((size + 1) / s) if pad_type != "valid" else None
    tot_w = max(0, (out_w - 1) * s + (k - 1) * d + 1 - (size + 1)) if out_w else 0
    wb = {"same_upper": tot_w // 2, "same_lower": tot_w - tot_w // 2, "valid": 0}[pad_type]
    pads = (expected_pads[0], wb, expected_pads[1], tot_w - wb)
    want = ref_conv(x, w, (s, s), pads, (d, d), 1)
    if pad_type != "valid":
        assert got.shape[2:] == (math.ceil(size / s), math.ceil((size + 1) / s))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# conv_transpose -----------------------------------------------------------------------------------
@pytest.mark.parametrize("xshape,wshape,stride,pads,dil,groups,out_pad", [
    ((1, 2, 3, 4), (2, 3, 3, 2), (1, 1), (0, 0, 0, 0), (1, 1), 1, (0, 0)),
    ((2, 4, 3, 3), (4, 1, 3, 3), (2, 3), (1, 0, 0, 2), (1, 1), 2, (1, 2)),
    ((1, 2, 4), (2, 2, 3), (2,), (1, 1), (2,), 1, (1,)),  # 1-D with dilation
    ((1, 2, 2, 3, 2), (2, 1, 2, 2, 2), (2, 1, 2), (0, 0, 1, 1, 0, 0), (1, 1, 1), 2, (0, 0, 1)),  # 3-D
])
def test_conv_transpose_matches_scatter(xshape, wshape, stride, pads, dil, groups, out_pad):
    x, w = rand(*xshape), rand(*wshape)
    got = run(lambda a, b: ops.conv_transpose(a, b, stride, pads, dil, groups, output_padding=out_pad), x, w)
    want = ref_conv_transpose(x, w, stride, pads, dil, groups, out_pad)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_transpose_output_shape_and_same():
    x, w = rand(1, 2, 3, 3), rand(2, 1, 3, 3)
    # full size = 2*(3-1)+3 = 7; ask for 6 -> total crop 1, at the beginning by default
    got = run(lambda a, b: ops.conv_transpose(a, b, (2, 2), output_shape=(6, 5)), x, w)
    full = ref_conv_transpose(x, w, (2, 2), (0,) * 4, (1, 1), 1, (0, 0))
    assert got.shape == (1, 1, 6, 5)
    np.testing.assert_allclose(got, full[:, :, 1:, 1:6], rtol=1e-5, atol=1e-5)
    got = run(lambda a, b: ops.conv_transpose(a, b, (2, 2), pad_type="same_upper"), x, w)
    assert got.shape == (1, 1, 6, 6)  # input * stride
    np.testing.assert_allclose(got, full[:, :, :6, :6], rtol=1e-5, atol=1e-5)
    got = run(lambda a, b: ops.conv_transpose(a, b, (2, 2), pad_type="same_lower"), x, w)
    np.testing.assert_allclose(got, full[:, :, 1:, 1:], rtol=1e-5, atol=1e-5)


def test_conv_transpose_is_the_input_gradient_of_conv():
    # <conv(x, w), y> == <x, conv_transpose(y, w)>
    x, w = rand(1, 2, 7, 6), rand(3, 2, 3, 2)
    conv_x = ref_conv(x, w, (2, 1), (1, 0, 1, 1), (1, 2), 1)
    y = rand(*conv_x.shape)
    ct = run(lambda a, b: ops.conv_transpose(a, b, (2, 1), (1, 0, 1, 1), (1, 2)), y, w)
    assert ct.shape == x.shape
    np.testing.assert_allclose(np.sum(conv_x * y), np.sum(x * ct), rtol=1e-4)


# pools --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("xshape,kernel,stride,pads,dil,ceil_mode,out_sz", [
    ((2, 3, 6, 7), (2, 3), (2, 2), (0, 1, 0, 1), (1, 1), False, (3, 4)),
    ((1, 2, 5, 5), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True, (3, 3)),  # last window would start in padding
    ((1, 2, 5, 4), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), True, (3, 2)),
    ((1, 1, 4, 4), (2, 2), (2, 2), (1, 1, 1, 1), (1, 1), True, (3, 3)),
    ((1, 2, 9), (3,), (2,), (2, 1), (2,), False, (4,)),  # 1-D, dilation
    ((1, 1, 4, 5, 3), (2, 2, 2), (1, 2, 1), (0, 1, 0, 1, 0, 1), (1, 1, 1), False, (4, 3, 3)),  # 3-D
])
def test_pools_match_loops(mode, xshape, kernel, stride, pads, dil, ceil_mode, out_sz):
    x = rand(*xshape)
    fn = ops.max_pool if mode == "max" else ops.average_pool
    got = run(lambda a: fn(a, kernel, stride, pads, dilation=dil, ceil_mode=ceil_mode), x)
    assert got.shape == x.shape[:2] + out_sz
    np.testing.assert_allclose(got, ref_pool(x, kernel, stride, pads, dil, mode, out_sz), rtol=1e-5, atol=1e-6)


def test_pool_defaults_auto_pad_and_float16():
    x = rand(1, 2, 5, 5, dtype=np.float16)
    got = run(lambda a: ops.max_pool(a, (3, 3)), x)
    assert got.dtype == np.float16 and got.shape == (1, 2, 3, 3)
    np.testing.assert_array_equal(got, ref_pool(x, (3, 3), (1, 1), (0,) * 4, (1, 1), "max", (3, 3)).astype(np.float16))
    got = run(lambda a: ops.average_pool(a, (2, 2), (2, 2), auto_pad="same_upper"), x)
    assert got.shape == (1, 2, 3, 3)  # pads (0, 0, 1, 1)
    np.testing.assert_allclose(got.astype(np.float64), ref_pool(x, (2, 2), (2, 2), (0, 0, 1, 1), (1, 1), "avg", (3, 3)),
                               rtol=2e-3, atol=2e-3)
    got = run(lambda a: ops.average_pool(a, (2, 2), (2, 2), auto_pad="same_lower"), x)
    np.testing.assert_allclose(got.astype(np.float64), ref_pool(x, (2, 2), (2, 2), (1, 1, 0, 0), (1, 1), "avg", (3, 3)),
                               rtol=2e-3, atol=2e-3)
    got = run(lambda a: ops.max_pool(a, (2, 2), (2, 2), (1, 1, 1, 1), auto_pad="valid"), x)
    assert got.shape == (1, 2, 2, 2)


# norms --------------------------------------------------------------------------------------------
def test_batch_norm_inference():
    x = rand(2, 3, 4, 2)
    s, b, m = rand(3), rand(3), rand(3)
    v = np.abs(rand(3)) + 0.1
    got = run(lambda *a: ops.batch_norm_inference(*a, epsilon=1e-3), x, s, b, m, v)
    c = lambda p: p[None, :, None, None]  # noqa: E731
    np.testing.assert_allclose(got, c(s) * (x - c(m)) / np.sqrt(c(v) + 1e-3) + c(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 5e-3)])
def test_group_norm(dtype, tol):
    x = (rand(2, 6, 3, 2) * 3 + 1).astype(dtype)
    w, b = rand(6, dtype=dtype), rand(6, dtype=dtype)
    got = run(lambda *a: ops.group_norm(*a, num_groups=3, eps=1e-4), x, w, b)
    assert got.dtype == dtype
    xf = x.astype(np.float64)
    want = np.empty_like(xf)
    for n, g in itertools.product(range(2), range(3)):
        blk = xf[n, 2 * g:2 * g + 2]
        want[n, 2 * g:2 * g + 2] = (blk - blk.mean()) / np.sqrt(blk.var() + 1e-4)
    want = want * w.astype(np.float64)[None, :, None, None] + b.astype(np.float64)[None, :, None, None]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 4)


def test_layer_norm_2d_and_3d():
    x, w, b = rand(4, 5) * 2 + 3, rand(5), rand(5)
    got = run(lambda *a: ops.layer_norm(*a), x, w, b)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    x3 = rand(2, 3, 4)  # all non-batch dims normalised together; weight per axis-1 channel
    got = run(lambda *a: ops.layer_norm(*a, eps=1e-3), x3, w[:3], b[:3])
    flat = x3.reshape(2, -1)
    norm = ((flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-3)).reshape(x3.shape)
    np.testing.assert_allclose(got, norm * w[:3, None] + b[:3, None], rtol=1e-5, atol=1e-5)


def test_softmax_of_a_scalar_is_refused_at_trace():
    """A scalar has no axis to normalise over (the native engine's kernel used to fail at load)."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.float32(2.0), name="s")
        with pytest.raises(ValueError, match=r"ops.softmax: softmax needs a tensor of rank >= 1"):
            ops.softmax(x, 0)


# losses -------------------------------------------------------------------------------------------
def softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_nll(p, labels, ignore, reduction, log_prob=False, eps=1e-7):
    p = p.astype(np.float64)
    items = np.zeros(labels.shape)
    keep = np.ones(labels.shape, bool) if ignore is None else labels != ignore
    for idx in np.ndindex(labels.shape):
        if keep[idx]:
            v = p[idx + (labels[idx],)]
            items[idx] = -v if log_prob else -np.log(max(v, eps))
    if reduction == "none":
        return items
    return items.sum() / max(keep.sum(), 1) if reduction == "mean" else items.sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [None, 2])
def test_nll_loss(reduction, ignore):
    p = softmax64(rand(3, 4, 5)).astype(np.float32)
    p[0, 0, 1] = 0.0  # clamped by eps
    labels = RNG.integers(0, 5, (3, 4)).astype(np.int32)
    labels[0, 0] = 1
    got = run(lambda a, b: ops.nll_loss(a, b, ignore, reduction), p, labels)
    assert got.shape == ((3, 4) if reduction == "none" else ())
    np.testing.assert_allclose(got, ref_nll(p, labels, ignore, reduction), rtol=1e-5)
    got = run(lambda a, b: ops.nll_loss(a, b, ignore, reduction, log_prob=True), np.log(p + 1e-3), labels)
    np.testing.assert_allclose(got, ref_nll(np.log(p + 1e-3), labels, ignore, reduction, log_prob=True), rtol=1e-5)


def test_nll_loss_float16_eps_and_all_ignored():
    p = np.array([[0.0, 1.0], [0.5, 0.5]], np.float16)
    got = run(lambda a, b: ops.nll_loss(a, b, reduction="none"), p, np.array([0, 1], np.int32))
    np.testing.assert_allclose(got.astype(np.float64), [-np.log(6.104e-5), -np.log(0.5)], rtol=1e-3)
    got = run(lambda a, b: ops.nll_loss(a, b, ignore_index=1), p, np.array([1, 1], np.int32))
    assert got == 0.0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_with_softmax_grad_is_the_logit_gradient(reduction):
    logits = rand(4, 3).astype(np.float64)
    labels = np.array([0, 2, 1, 2], np.int32)
    probs = softmax64(logits).astype(np.float32)
    loss, grad = run(lambda a, b: ops.nll_loss_with_softmax_grad(a, b, 0.5, ignore_index=1, reduction=reduction),
                     probs, labels)
    np.testing.assert_allclose(loss, ref_nll(probs, labels, 1, reduction), rtol=1e-5)
    # central differences of loss_grad * total loss w.r.t. the logits
    def total(lg):
        return np.sum(ref_nll(softmax64(lg), labels, 1, reduction)) * 0.5
    num = np.zeros_like(logits)
    for idx in np.ndindex(logits.shape):
        d = np.zeros_like(logits)
        d[idx] = 1e-6
        num[idx] = (total(logits + d) - total(logits - d)) / 2e-6
    np.testing.assert_allclose(grad, num, rtol=1e-4, atol=1e-6)
    assert np.all(grad[2] == 0)  # ignored row


def test_nll_loss_with_softmax_grad_tensor_loss_grad():
    probs = softmax64(rand(2, 3)).astype(np.float32)
    labels = np.array([1, 0], np.int32)
    lg = np.array([2.0, -1.0], np.float32)
    loss, grad = run(lambda a, b, g: ops.nll_loss_with_softmax_grad(a, b, g, reduction="none"), probs, labels, lg)
    onehot = np.eye(3)[labels]
    np.testing.assert_allclose(grad, (probs - onehot) * lg[:, None], rtol=1e-6)
    np.testing.assert_allclose(loss, -np.log(probs[[0, 1], labels]), rtol=1e-6)


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_with_softmax_grad_takes_labels_of_any_shape_with_one_per_row(engine, reduction):
    # PopART's op checks only the element count: BERT pretraining hands (2, 20) uint32 labels for
    # (40, vocab) float16 probabilities. A "none" loss takes the labels' shape.
    probs = softmax64(rand(6, 5)).astype(np.float16)
    labels = np.array([[4, 0, 2], [1, 1, 3]], np.uint32)
    lg = np.array([[1.0, -2.0, 0.5], [3.0, 1.0, 2.0]], np.float16)
    build = (lambda a, b, g: ops.nll_loss_with_softmax_grad(a, b, g, reduction="none")) if reduction == "none" \
        else (lambda a, b, g: ops.nll_loss_with_softmax_grad(a, b, 0.5, reduction=reduction))
    (loss, grad), _ = run_program(build, [probs, labels, lg], engine)
    flat = labels.reshape(-1)
    per_row = -np.log(probs.astype(np.float64)[np.arange(6), flat])
    scale = lg.astype(np.float64).reshape(-1) if reduction == "none" else np.full(6, 0.5 / (6 if reduction == "mean" else 1))
    want_grad = (probs.astype(np.float64) - np.eye(5)[flat]) * scale[:, None]
    np.testing.assert_allclose(grad.astype(np.float64), want_grad, rtol=2e-3, atol=1e-4)
    want_loss = {"none": per_row.reshape(2, 3), "sum": per_row.sum(), "mean": per_row.mean()}[reduction]
    assert loss.shape == np.shape(want_loss) and loss.dtype == np.float16
    np.testing.assert_allclose(loss.astype(np.float64), want_loss, rtol=2e-3)


def test_nll_label_shapes_are_checked_where_popart_checks_them():
    def body():
        probs = popxl.variable(np.zeros((6, 5), np.float32))
        with pytest.raises(ValueError, match=r"ops\.nll_loss_with_softmax_grad: labels must have as many elements "
                                             r"as probs\.shape\[:-1\] = \(6,\) \(6\), got shape \(4,\)"):
            ops.nll_loss_with_softmax_grad(probs, popxl.variable(np.zeros(4, np.int32)))
        # nll_loss (PopART's NllOp) checks the shape itself
        with pytest.raises(ValueError, match=r"ops\.nll_loss: labels must have shape probs\.shape\[:-1\] = \(6,\), "
                                             r"got \(2, 3\)"):
            ops.nll_loss(probs, popxl.variable(np.zeros((2, 3), np.int32)))
    ir = popxl.Ir()
    with ir.main_graph:
        body()


# roi_align ----------------------------------------------------------------------------------------
def ref_roi_align(x, rois, bidx, out_hw, scale, ratio):
    """Scalar transcription of average RoI align (no half-pixel shift, boxes at least 1x1)."""
    _, c, h, w = x.shape
    ph, pw = out_hw

    def sample(img, y, xx):
        if y < -1.0 or y > h or xx < -1.0 or xx > w:
            return np.zeros(c)
        y, xx = max(y, 0.0), max(xx, 0.0)
        y0, x0 = int(y), int(xx)
        if y0 >= h - 1:
            y0 = y1 = h - 1
            y = float(y0)
        else:
            y1 = y0 + 1
        if x0 >= w - 1:
            x0 = x1 = w - 1
            xx = float(x0)
        else:
            x1 = x0 + 1
        ly, lx = y - y0, xx - x0
        return ((1 - ly) * (1 - lx) * img[:, y0, x0] + (1 - ly) * lx * img[:, y0, x1]
                + ly * (1 - lx) * img[:, y1, x0] + ly * lx * img[:, y1, x1])

    out = np.zeros((len(rois), c, ph, pw))
    for r, (bx1, by1, bx2, by2) in enumerate(rois.astype(np.float64) * scale):
        rh, rw = max(by2 - by1, 1.0), max(bx2 - bx1, 1.0)
        gh = ratio if ratio > 0 else math.ceil(rh / ph)
        gw = ratio if ratio > 0 else math.ceil(rw / pw)
        for i, j in itertools.product(range(ph), range(pw)):
            acc = np.zeros(c)
            for a, b in itertools.product(range(gh), range(gw)):
                y = by1 + i * rh / ph + (a + 0.5) * rh / ph / gh
                xx = bx1 + j * rw / pw + (b + 0.5) * rw / pw / gw
                acc += sample(x[bidx[r]].astype(np.float64), y, xx)
            out[r, :, i, j] = acc / (gh * gw)
    return out


@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align(ratio):
    x = rand(2, 3, 6, 7)
    rois = np.array([[0.5, 1.0, 5.0, 4.5], [1.0, 0.0, 13.0, 11.0], [-2.0, -1.5, 3.0, 2.0], [3.0, 3.0, 3.2, 3.1]],
                    np.float32)
    bidx = np.array([0, 1, 1, 0], np.int32)
    got = run(lambda a, b, c: ops.roi_align(a, b, c, (2, 3), 0.5, ratio), x, rois, bidx)
    assert got.shape == (4, 3, 2, 3)
    np.testing.assert_allclose(got, ref_roi_align(x, rois, bidx, (2, 3), 0.5, ratio), rtol=1e-5, atol=1e-5)


# float8 -------------------------------------------------------------------------------------------
E4, E5 = ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz


def fp8(a, fmt):
    """Values rounded to ``fmt`` (ml_dtypes, to compute with)."""
    return np.asarray(a, np.float32).astype(fmt)


def codes(a):
    """ml_dtypes float8 values as the raw-code host arrays popxl streams carry."""
    dt = dtypes.float8_143 if a.dtype == E4 else dtypes.float8_152
    return np.ascontiguousarray(a).view(np.uint8).view(dt.as_numpy())


@pytest.mark.parametrize("fmt_a,fmt_b", [(E4, E4), (E5, E4)])
def test_matmul_pow2scaled(fmt_a, fmt_b):
    a, b = fp8(rand(2, 3, 4), fmt_a), fp8(rand(4, 5), fmt_b)
    got = run(lambda x, y, s: ops.matmul_pow2scaled(x, y, s), codes(a), codes(b), np.array(-3, np.int32))
    assert got.dtype == np.float16 and got.shape == (2, 3, 5)
    want = (a.astype(np.float64) @ b.astype(np.float64)) * 2.0 ** -3
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=1e-3)


def test_matmul_of_two_dtypes_traces_and_a_session_refuses_it():
    # PopXL traces a float32 @ float16 product (PopART's MatMulOp takes the lhs's dtype and does
    # not look at the rhs's); the IPU's matmul takes no mix, so compiling it fails: here the Session
    # refuses it, naming the op and both dtypes.
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(rand(2, 3).astype(np.float32), name="x")
        w = popxl.variable(rand(3, 4).astype(np.float16), name="w")
        y = ops.matmul(x, w)
        assert (y.dtype, y.shape) == (popxl.float32, (2, 4))
        assert ops.matmul(w.T, x.T).dtype == popxl.float16
        assert ops.matmul(x, w, output_type=popxl.float16).dtype == popxl.float16
        # the gradients come in their operands' dtypes (PopART's MatMulLhsGradOp / RhsGradOp)
        g = ir.create_graph(lambda a, b: a @ b, x, w)
        assert [t.dtype for t in popxl.transforms.autodiff(g).graph.outputs] == [popxl.float32, popxl.float16]
        ops.host_store(popxl.d2h_stream(y.shape, y.dtype), y)
    with pytest.raises(popxl.errors.popart_exception) as e:
        popxl.Session(ir, "ipu_model")
    msg = str(e.value)
    assert "matmul" in msg and "float32 'x' by float16 'w'" in msg and "main graph" in msg and "ops.cast" in msg
    assert ir._frozen_by is None  # the refusal leaves the Ir free
    # The product in a called graph is refused too, naming that graph.
    ir2 = popxl.Ir()
    with ir2.main_graph:
        a = popxl.variable(rand(2, 2).astype(np.float16), name="a")
        b = popxl.variable(rand(2, 2).astype(np.float32), name="b")
        inner = ir2.create_graph(lambda p, q: p @ q, a, b)
        (c,) = ops.call(inner, a, b)
        ops.host_store(popxl.d2h_stream(c.shape, c.dtype), c)
    with pytest.raises(popxl.errors.popart_exception, match=r"in graph '.*subgraph.* multiplies float16 .* by float32 "):
        popxl.Session(ir2, "ipu_model")
    # float8 keeps its own rule: both operands float8, through matmul_pow2scaled.
    with ir2.main_graph:
        q = popxl.variable(codes(fp8(rand(2, 2), E4)), popxl.float8_143)
        with pytest.raises(TypeError, match="float8 operand needs a float8 partner"):
            ops.matmul(a, q)


def test_matmul_after_cast_runs():
    xv, wv = rand(2, 3).astype(np.float32), rand(3, 4).astype(np.float16)
    got = run(lambda x, w: ops.matmul(x, ops.cast(w, popxl.float32)), xv, wv)
    np.testing.assert_allclose(got, xv @ wv.astype(np.float32), rtol=1e-6)


def test_conv_pow2scaled_and_transpose():
    x, w = fp8(rand(1, 2, 5, 5), E4), fp8(rand(4, 1, 3, 3), E5)
    s = np.array(2, np.int32)
    got = run(lambda a, b, c: ops.conv_pow2scaled(a, b, c, (2, 1), (1, 1, 0, 1), groups=2), codes(x), codes(w), s)
    assert got.dtype == np.float16
    want = ref_conv(x.astype(np.float32), w.astype(np.float32), (2, 1), (1, 1, 0, 1), (1, 1), 2) * 4
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-2)
    wt = fp8(rand(2, 3, 2, 2), E4)
    got = run(lambda a, b, c: ops.conv_transpose_pow2scaled(a, b, c, (2, 2), output_padding=(1, 0)), codes(x), codes(wt), s)
    want = ref_conv_transpose(x.astype(np.float32), wt.astype(np.float32), (2, 2), (0,) * 4, (1, 1), 1, (1, 0)) * 4
    assert got.shape == want.shape and got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("dt,fmt", [(dtypes.float8_143, E4), (dtypes.float8_152, E5)])
def test_pow2scale_casts_match_host_conversions(dt, fmt):
    x = (rand(3, 4) * 10).astype(np.float16)
    x[0, 0] = 1e4  # beyond float8_143's range after scaling
    got = run(lambda a, s: ops.pow2scale_cast_to_fp8(a, s, dt), x, np.array(1, np.int32))
    host = host_pow2scale_cast_to_fp8(x, dt, 1)
    assert got.dtype == dt.as_numpy()
    np.testing.assert_array_equal(got.view(np.uint8), host.view(np.uint8))
    assert np.isnan(got[:1, :1].view(np.uint8).view(fmt)).all() == (dt is dtypes.float8_143)
    back = run(lambda a, s: ops.pow2scale_cast_from_fp8(a, s, dtypes.float32), got, np.array(-1, np.int32))
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, host_pow2scale_cast_from_fp8(host, dtypes.float32, -1))
    ok = np.isfinite(back)
    np.testing.assert_allclose(back[ok], x.astype(np.float32)[ok], rtol=0.13)


# trace-time errors --------------------------------------------------------------------------------
F32, F16, I32 = dtypes.float32, dtypes.float16, dtypes.int32
FP8 = (dtypes.float8_143, dtypes.float8_152)


@pytest.mark.parametrize("build,specs,exc,match", [
    (lambda x, w: ops.conv(x, w, groups=2), [((1, 3, 5, 5), F32), ((4, 1, 3, 3), F32)], ValueError,
     r"ops\.conv: .*divisible by groups"),
    (lambda x, w: ops.conv(x, w), [((1, 3, 5, 5), F32), ((4, 2, 3, 3), F32)], ValueError, r"ops\.conv: .*weight"),
    (lambda x, w: ops.conv(x, w), [((1, 3, 5, 5), F32), ((4, 3, 3, 3), F16)], TypeError, r"ops\.conv: .*dtype"),
    (lambda x, w: ops.conv(x, w, pad_type="same"), [((1, 3, 5, 5), F32), ((4, 3, 3, 3), F32)], ValueError,
     r"ops\.conv: pad_type"),
    (lambda x, w: ops.conv(x, w, stride=(1, 2, 1)), [((1, 3, 5, 5), F32), ((4, 3, 3, 3), F32)], ValueError,
     r"ops\.conv: stride"),
    (lambda x, w: ops.conv(x, w), [((3, 5), F32), ((4, 3), F32)], ValueError, r"ops\.conv: .*spatial"),
    (lambda x, w: ops.conv(x, w), [((1, 3, 5), F32), ((4, 3, 3, 3), F32)], ValueError, r"ops\.conv: .*rank"),
    (lambda x, w: ops.conv(x, w), [((1, 3, 2, 2), F32), ((4, 3, 3, 3), F32)], ValueError,
     r"ops\.conv: .*larger than the padded input"),
    (lambda x, w: ops.conv_transpose(x, w), [((1, 3, 5, 5), F32), ((2, 3, 3, 3), F32)], ValueError,
     r"ops\.conv_transpose: .*weight"),
    (lambda x, w: ops.conv_transpose(x, w, output_padding=(2, 0)), [((1, 2, 5, 5), F32), ((2, 3, 3, 3), F32)],
     ValueError, r"ops\.conv_transpose: output_padding"),
    (lambda x: ops.max_pool(x, (2, 2), padding=(2, 0, 0, 0)), [((1, 1, 5, 5), F32)], ValueError,
     r"ops\.max_pool: pads"),
    (lambda x: ops.average_pool(x, (2, 2, 2)), [((1, 1, 5, 5), F32)], ValueError, r"ops\.average_pool: kernel_size"),
    (lambda x: ops.average_pool(x, (2, 2), auto_pad="SAME"), [((1, 1, 5, 5), F32)], ValueError,
     r"ops\.average_pool: auto_pad"),
    (lambda x: ops.max_pool(x, (2, 2), storage_order="diag"), [((1, 1, 5, 5), F32)], ValueError,
     r"ops\.max_pool: storage_order"),
    (lambda x: ops.max_pool(x, (2, 2), in_dilations=(2, 2)), [((1, 1, 5, 5), F32)], NotImplementedError,
     r"ops\.max_pool: input dilations"),
    (lambda x: ops.max_pool(x, (2, 2)), [((1, 1, 5, 5), I32)], TypeError, r"ops\.max_pool: .*float"),
    (lambda x, w, b: ops.group_norm(x, w, b, 4), [((2, 6, 3), F32), ((6,), F32), ((6,), F32)], ValueError,
     r"ops\.group_norm: .*num_groups"),
    (lambda x, w, b: ops.layer_norm(x, w, b), [((2, 6), F32), ((5,), F32), ((5,), F32)], ValueError,
     r"ops\.layer_norm: weight"),
    (lambda x, s, b, m, v: ops.batch_norm_inference(x, s, b, m, v),
     [((2, 3, 4), F32), ((3,), F32), ((3,), F32), ((3,), F16), ((3,), F32)], TypeError,
     r"ops\.batch_norm_inference: mean"),
    (lambda p, l: ops.nll_loss(p, l, reduction="avg"), [((4, 3), F32), ((4,), I32)], ValueError,
     r"ops\.nll_loss: reduction"),
    (lambda p, l: ops.nll_loss(p, l), [((4, 3), F32), ((3,), I32)], ValueError, r"ops\.nll_loss: labels"),
    (lambda p, l: ops.nll_loss(p, l), [((4, 3), F32), ((4,), F32)], TypeError, r"ops\.nll_loss: labels"),
    (lambda p, l: ops.nll_loss_with_softmax_grad(p, l, reduction="max"), [((4, 3), F32), ((4,), I32)], ValueError,
     r"ops\.nll_loss_with_softmax_grad: reduction"),
    (lambda p, l, g: ops.nll_loss_with_softmax_grad(p, l, g), [((4, 3), F32), ((4,), I32), ((4,), F32)], ValueError,
     r"ops\.nll_loss_with_softmax_grad: loss_grad"),
    (lambda x, r, b: ops.roi_align(x, r, b, (2, 2), 1.0, 0), [((1, 2, 4, 4), F32), ((3, 5), F32), ((3,), I32)],
     ValueError, r"ops\.roi_align: rois"),
    (lambda x, r, b: ops.roi_align(x, r, b, (2, 2), 1.0, 0), [((1, 2, 4, 4), F32), ((3, 4), F32), ((3,), F32)],
     ValueError, r"ops\.roi_align: batch_index"),
    (lambda a, b, s: ops.matmul_pow2scaled(a, b, s), [((2, 3), F16), ((3, 2), F16), ((), I32)], TypeError,
     r"ops\.matmul_pow2scaled: operand 0 must be float8"),
    (lambda a, b, s: ops.matmul_pow2scaled(a, b, s),
     [((2, 3), dtypes.float8_143), ((3, 2), dtypes.float8_143), ((), F32)], TypeError,
     r"ops\.matmul_pow2scaled: log2_scale must be an int32"),
    (lambda a, b, s: ops.matmul_pow2scaled(a, b, s),
     [((2, 3), dtypes.float8_143), ((3, 2), dtypes.float8_143), ((2,), I32)], ValueError,
     r"ops\.matmul_pow2scaled: log2_scale must be a scalar"),
    (lambda x, w, s: ops.conv_pow2scaled(x, w, s), [((1, 3, 5, 5), F32), ((4, 3, 3, 3), F32), ((), I32)],
     TypeError, r"ops\.conv_pow2scaled: operand 0 must be float8"),
    (lambda x, w, s: ops.conv_transpose_pow2scaled(x, w, s),
     [((1, 3, 5, 5), dtypes.float8_152), ((3, 2, 3, 3), dtypes.float8_143), ((2, 2), I32)], ValueError,
     r"ops\.conv_transpose_pow2scaled: log2_scale must be a scalar"),
    (lambda x, s: ops.pow2scale_cast_to_fp8(x, s, dtypes.float16), [((3,), F32), ((), I32)], TypeError,
     r"ops\.pow2scale_cast_to_fp8: data_type"),
    (lambda x, s: ops.pow2scale_cast_to_fp8(x, s, dtypes.float8_143), [((3,), F32), ((), dtypes.int64)], TypeError,
     r"ops\.pow2scale_cast_to_fp8: log2_scale"),
    (lambda x, s: ops.pow2scale_cast_from_fp8(x, s, dtypes.float32), [((3,), F32), ((), I32)], TypeError,
     r"ops\.pow2scale_cast_from_fp8: t must be float8"),
    (lambda x, s: ops.pow2scale_cast_from_fp8(x, s, dtypes.float8_152), [((3,), dtypes.float8_143), ((), I32)],
     TypeError, r"ops\.pow2scale_cast_from_fp8: data_type"),
])
def test_trace_time_errors(build, specs, exc, match):
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(exc, match=match):
        build(*[popxl.variable(np.zeros(shape, np.float32 if dt in FP8 else dt.as_numpy()), dtype=dt)
                for shape, dt in specs])


def test_non_tensor_input_is_a_type_error():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros((1, 1, 1, 1), np.float32))
        with pytest.raises(TypeError, match=r"ops\.conv: t must be a popxl\.Tensor"):
            ops.conv(np.zeros((1, 1, 2, 2)), w)


def test_gradient_decisions():
    for name in ("conv_transpose", "nll_loss_with_softmax_grad"):
        assert REGISTRY[name].grad == Grad.STOP
    for name in ("matmul_pow2scaled", "conv_pow2scaled", "conv_transpose_pow2scaled", "pow2scale_cast_to_fp8",
                 "pow2scale_cast_from_fp8"):
        assert REGISTRY[name].grad == Grad.RAISE
    for name in ("conv", "average_pool", "max_pool", "batch_norm_inference", "group_norm", "layer_norm",
                 "nll_loss", "roi_align"):
        assert callable(REGISTRY[name].grad), name  # a rule (transforms/autodiff.py)


def test_all_public():
    for name in ("conv", "conv_transpose", "average_pool", "max_pool", "batch_norm_inference", "group_norm",
                 "layer_norm", "nll_loss", "nll_loss_with_softmax_grad", "roi_align", "matmul_pow2scaled",
                 "conv_pow2scaled", "conv_transpose_pow2scaled", "pow2scale_cast_to_fp8", "pow2scale_cast_from_fp8",
                 "matmul", "softmax"):
        assert name in ops.__all__ and callable(getattr(ops, name))
