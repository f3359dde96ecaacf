"""Every differentiable op's gradient against central finite differences, through the Session.
float64 wherever the op allows it, so the tolerances are tight enough to catch any wrong term."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from grad_harness import check_grad

R = np.random.default_rng(1)


def rnd(*shape, lo=None):
    x = R.standard_normal(shape)
    return np.abs(x) + lo if lo is not None else x


def labels(n, c):
    return R.integers(0, c, n).astype(np.int32)


# name: (build, inputs, wrt)
CASES = {
    "add_broadcast": (lambda a, b: a + b, [rnd(3, 4), rnd(4)], None),
    "sub_broadcast": (lambda a, b: a - b, [rnd(2, 1, 3), rnd(4, 1)], None),
    "mul": (lambda a, b: a * b, [rnd(3, 4), rnd(3, 1)], None),
    "div": (lambda a, b: a / b, [rnd(3, 4), rnd(4, lo=0.5)], None),
    "pow": (lambda a, b: ops.pow(a, b), [rnd(3, 4, lo=0.5), rnd(3, 4)], None),
    "fmod": (lambda a, b: ops.fmod(a, b), [rnd(5) * 3, rnd(5, lo=1.0) + 10], [0]),
    "maximum": (lambda a, b, c: ops.maximum(a, b, c), [rnd(3, 4), rnd(4), rnd(3, 1)], None),
    "abs": (ops.abs, [rnd(3, 4, lo=0.1) * np.sign(rnd(3, 4))], None),
    "cos": (ops.cos, [rnd(7)], None),
    "sin": (ops.sin, [rnd(7)], None),
    "tanh": (ops.tanh, [rnd(7)], None),
    "exp": (ops.exp, [rnd(7)], None),
    "log": (ops.log, [rnd(7, lo=0.3)], None),
    "log2": (ops.log2, [rnd(7, lo=0.3)], None),
    "sqrt": (ops.sqrt, [rnd(7, lo=0.3)], None),
    "negate": (ops.negate, [rnd(7)], None),
    "relu": (ops.relu, [rnd(3, 4, lo=0.1) * np.sign(rnd(3, 4))], None),
    "gelu": (ops.gelu, [rnd(3, 5)], None),
    "geluerf": (ops.geluerf, [rnd(3, 5)], None),
    "swish": (ops.swish, [rnd(3, 5)], None),
    "clip": (lambda a: ops.clip(a, -0.5, 0.7), [np.array([-2.0, -0.3, 0.1, 0.5, 1.5, 3.0])], None),
    "identity": (ops.identity, [rnd(3)], None),
    "cast": (lambda a: ops.cast(a, popxl.float32) * 1.0, [rnd(4).astype(np.float32)], None),
    "where": (lambda c, a, b: ops.where(c, a, b), [rnd(3, 4) > 0, rnd(3, 4), rnd(4)], [1, 2]),
    "print_tensor": (lambda a: ops.print_tensor(a, "t") * 2.0, [rnd(3)], None),
    "floor_zero": (lambda a: ops.floor(a) + a, [rnd(5) + 0.25], None),
    # reductions
    "sum": (lambda a: ops.sum(a, 1), [rnd(3, 4, 2)], None),
    "sum_all": (lambda a: ops.sum(a), [rnd(3, 4)], None),
    "mean": (lambda a: ops.mean(a, [0, 2], keepdims=True), [rnd(3, 4, 2)], None),
    "prod": (lambda a: ops.prod(a, -1), [rnd(3, 4, lo=0.5)], None),
    "max": (lambda a: ops.max(a, 1), [rnd(3, 5)], None),
    "min": (lambda a: ops.min(a, 0), [rnd(3, 5)], None),
    "median": (lambda a: ops.median(a, 1), [rnd(3, 5)], None),
    "l1": (lambda a: ops.l1(a, 1), [rnd(3, 4, lo=0.1) * np.sign(rnd(3, 4))], None),
    "l2": (lambda a: ops.l2(a, 1), [rnd(3, 4)], None),
    "logsum": (lambda a: ops.logsum(a, 1), [rnd(3, 4, lo=0.5)], None),
    "logsumexp": (lambda a: ops.logsumexp(a, 1), [rnd(3, 4)], None),
    "sumsquare": (lambda a: ops.sumsquare(a, 0), [rnd(3, 4)], None),
    "cumsum": (lambda a: ops.cumsum(a, 1), [rnd(3, 4)], None),
    "cumsum_flat": (lambda a: ops.cumsum(a, None), [rnd(2, 3)], None),
    "topk": (lambda a: ops.topk(a, 2, 1, True, True)[0], [rnd(3, 5)], None),
    # shape and indexing
    "reshape": (lambda a: a.reshape((6, 2)) * a.reshape((6, 2)), [rnd(3, 4)], None),
    "flatten_squeeze": (lambda a: ops.squeeze(a) + ops.flatten(a), [rnd(1, 5)], None),
    "transpose": (lambda a: a.transpose((2, 0, 1)) * 3.0, [rnd(2, 3, 4)], None),
    "slice": (lambda a: ops.slice(a, [1, 3], [3, 0], [1, -1], [0, 1]) * 2.0, [rnd(4, 5)], None),
    "getitem": (lambda a: a[1:, ::2] * a[1:, ::2], [rnd(3, 5)], None),
    "subsample": (lambda a: ops.subsample(a, [2, 3]) * 2.0, [rnd(5, 7)], None),
    "concat": (lambda a, b: ops.concat([a, b, a], 1) * 2.0, [rnd(2, 3), rnd(2, 1)], None),
    "split": (lambda a: ops.split(a, [1, 3], 1)[1] * 2.0, [rnd(2, 4)], None),
    "gather": (lambda a, i: ops.gather(a, i, 0), [rnd(5, 3), np.array([[0, 4], [4, 2]], np.int32)], [0]),
    "tied_gather": (lambda a, i: ops.tied_gather(a, i, 1), [rnd(2, 5), np.array([3, 3, 0], np.int32)], [0]),
    "dynamic_slice": (lambda a, i: ops.dynamic_slice(a, i, [1], [2], True) * 2.0,
                      [rnd(3, 5), np.array([2], np.uint32)], [0]),
    "dynamic_update": (lambda a, i, u: ops.dynamic_update(a, i, u, [0], [1], True) * 2.0,
                       [rnd(4, 2), np.array([1], np.uint32), rnd(1, 2)], [0, 2]),
    "scatter": (lambda t, i, v: ops.scatter(t, i, v, 1) * 2.0,
                [rnd(3, 4), np.array([[0, 3], [1, 2], [2, 0]], np.int32), rnd(3, 2)], [0, 2]),
    "scatter_reduce_sum": (lambda d, i, init: ops.scatter_reduce(d, i, "sum", init, axis=0, axis_size=3),
                           [rnd(5, 2), np.array([0, 2, 2, 1, 0], np.int32), rnd(3, 2)], [0, 2]),
    "scatter_reduce_max": (lambda d, i, init: ops.scatter_reduce(d, i, "max", init, axis=0, axis_size=3),
                           [rnd(5, 2), np.array([0, 2, 2, 1, 0], np.int32), rnd(3, 2) - 3.0], [0, 2]),
    "scatter_reduce_min_no_init": (lambda d, i: ops.scatter_reduce(d, i, "min", axis=1, axis_size=4),
                                   [rnd(2, 3), np.array([[0, 3, 3], [1, 1, 2]], np.int32)], [0]),
    "scatter_reduce_none": (lambda d, i, init: ops.scatter_reduce(d, i, "none", init, axis=0, axis_size=4),
                            [rnd(2, 2), np.array([[3, 0], [1, 2]], np.int32), rnd(4, 2)], [0, 2]),
    "groupedgather": (lambda t, i: ops.groupedgather(t, i, 0, 2),
                      [rnd(2, 4, 3), np.array([[0, 0, 3], [2, 1, 2]], np.int32)], [0]),
    "onehot": (lambda i, v: ops.onehot(i, popxl.constant(4), v, -1),
               [np.array([0, 3, 1], np.int32), np.array([-0.5, 2.0])], [1]),
    "interpolate_linear": (lambda x: ops.interpolate(x, (1.0, 1.0, 2.5, 0.75), "linear"), [rnd(1, 2, 3, 4)], None),
    "interpolate_cubic_align": (lambda x: ops.interpolate(x, (1.0, 1.0, 1.5, 2.0), "cubic",
                                                          coordinate_transformation_mode="align_corners"),
                                [rnd(1, 1, 4, 3)], None),
    "interpolate_nearest": (lambda x: ops.interpolate(x, (1.0, 1.0, 2.0, 0.5), "nearest"), [rnd(1, 1, 3, 4)], None),
    # nn
    "matmul": (lambda a, b: a @ b, [rnd(3, 4), rnd(4, 2)], None),
    "matmul_batched_broadcast": (lambda a, b: a @ b, [rnd(2, 3, 4), rnd(4, 5)], None),
    "matmul_vec": (lambda a, b: a @ b, [rnd(4), rnd(2, 4, 3)], None),
    "softmax": (lambda a: ops.softmax(a, 1), [rnd(3, 4)], None),
    "nll_loss": (lambda p, l: ops.nll_loss(ops.softmax(p, 1), l), [rnd(4, 3), labels(4, 3)], [0]),
    "nll_loss_sum_ignore": (lambda p, l: ops.nll_loss(ops.softmax(p, 1), l, ignore_index=1, reduction="sum"),
                            [rnd(5, 3), np.array([0, 1, 2, 1, 0], np.int32)], [0]),
    "nll_loss_logprob_none": (lambda p, l: ops.nll_loss(p, l, reduction="none", log_prob=True),
                              [rnd(4, 3), labels(4, 3)], [0]),
    "roi_align": (lambda x, r, b: ops.roi_align(x, r, b, (2, 3), 0.5, 2),
                  [rnd(2, 2, 5, 6), np.array([[0.5, 1.0, 9.0, 8.0], [-1.0, 0.0, 4.0, 3.5]]),
                   np.array([1, 0], np.int32)], [0]),
    "layer_norm": (lambda x, w, b: ops.layer_norm(x, w, b), [rnd(3, 4), rnd(4), rnd(4)], None),
    "group_norm": (lambda x, w, b: ops.group_norm(x, w, b, 2), [rnd(2, 4, 3), rnd(4), rnd(4)], None),
    "batch_norm_inference": (lambda x, s, b, m, v: ops.batch_norm_inference(x, s, b, m, v),
                             [rnd(2, 3, 2), rnd(3), rnd(3), rnd(3), rnd(3, lo=0.5)], None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    build, inputs, wrt = CASES[name]
    check_grad(build, inputs, wrt, eps=1e-6, rtol=1e-5, atol=1e-7)


def test_dropout_gradient_uses_the_forward_mask():
    x = rnd(50).astype(np.float32)  # dropout takes float16/float32 only; it is linear, so FD is exact
    seed = np.array([7, 11], np.uint32)
    (g,) = check_grad(lambda a, s: ops.dropout(a, s, 0.3), [x, seed], [0], eps=1e-2, rtol=1e-3, atol=1e-4)
    assert 0 < np.count_nonzero(g) < g.size  # some dropped, some kept


def test_float32_gradients_catch_errors_too():
    check_grad(lambda a, b: ops.gelu(a @ b), [rnd(3, 4).astype(np.float32), rnd(4, 2).astype(np.float32)],
               eps=1e-2, rtol=2e-2, atol=2e-3)


CONV_CASES = {
    "conv_plain": (lambda x, w: ops.conv(x, w), [rnd(2, 3, 5, 5), rnd(4, 3, 3, 3)]),
    "conv_stride_pad_dilation": (lambda x, w: ops.conv(x, w, stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2)),
                                 [rnd(1, 2, 6, 7), rnd(3, 2, 2, 3)]),
    "conv_groups_1d": (lambda x, w: ops.conv(x, w, groups=2, stride=(2,), padding=(1, 1)),
                       [rnd(2, 4, 7), rnd(6, 2, 3)]),
    "max_pool": (lambda x: ops.max_pool(x, (2, 2), stride=(2, 1), padding=(0, 1, 1, 0)), [rnd(2, 2, 5, 4)]),
    "max_pool_ceil": (lambda x: ops.max_pool(x, (3,), stride=(2,), ceil_mode=True), [rnd(1, 2, 8)]),
    "average_pool": (lambda x: ops.average_pool(x, (3, 2), stride=(1, 2), padding=(1, 1, 1, 0)), [rnd(2, 1, 4, 5)]),
}


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv_and_pool_gradients(name):
    build, inputs = CONV_CASES[name]
    check_grad(build, inputs, eps=1e-6, rtol=1e-5, atol=1e-7, directions=6)


@pytest.mark.parametrize("wrt", [[0], [1]], ids=["dx", "dweight"])
def test_conv_gradient_computes_only_what_is_required(wrt):
    """A convolution whose input needs no gradient (a first layer reading the data) gets a
    conv_grad computing dweight alone, and the other way round; the value is checked against
    finite differences."""
    build, inputs = CONV_CASES["conv_stride_pad_dilation"]
    grads = check_grad(build, inputs, wrt=wrt, eps=1e-6, rtol=1e-5, atol=1e-7, directions=6)
    assert [g.shape for g in grads] == [inputs[wrt[0]].shape]
    from grad_harness import GradProgram
    prog = GradProgram(build, inputs, wrt)
    try:
        (op,) = [op for op in prog.info.graph.ops if op.type == "conv_grad"]
        assert op.attrs["grads"] == (("dx",) if wrt == [0] else ("dweight",)) and len(op.outputs) == 1
    finally:
        prog.close()
