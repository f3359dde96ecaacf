"""Native kernels against the NumPy reference kernels, op family by op family: var updates,
random ops (bit for bit), data movement, normalisations and losses, index reductions,
oneDNN convolution/pooling, resampling (interpolate, roi_align), remote memory and print_tensor
(the printed text). Each test also asserts the op ran natively (no Python fallback).

Longer than our ~800-line rule on purpose: every family's comparisons share the one harness near
the top (compare_engines and the ran-natively check), and a file per family would only move that
harness into a helper module for the sake of the count."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.ops import collectives as coll
from popxl.ops import elementwise
from popxl.ops import var_updates as vu
from engine_harness import compare_engines, run_program
from popxl.op import create_op

RNG = np.random.default_rng(1)
ODD_SHAPES = [(), (0,), (1,), (3, 1, 5), (17, 33), (2, 0, 3)]


def rand(shape, dtype=np.float32, low=-3.0, high=3.0):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return RNG.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    return RNG.uniform(low, high, size=shape).astype(dtype)


# ---- var updates ------------------------------------------------------------------------------------
ACCUMULATORS = {
    "accumulate_": lambda t, x, s: vu.accumulate_(t, x, s),
    "accumulate_square_": lambda t, x, s: vu.accumulate_square_(t, x, s),
    "accumulate_mean_": lambda t, x, s: vu.accumulate_mean_(t, x, s),
    "accumulate_moving_average_": lambda t, x, s: vu.accumulate_moving_average_(t, x, s),
    "accumulate_moving_average_square_": lambda t, x, s: vu.accumulate_moving_average_square_(t, x, s),
    "accumulator_scale_": lambda t, x, s: vu.accumulator_scale_(t, s),
    "accumulator_zero_": lambda t, x, s: vu.accumulator_zero_(t),
    "copy_var_update_": lambda t, x, s: vu.copy_var_update_(t, x),
}
DTYPE_PAIRS = [(np.float32, np.float32), (np.float16, np.float16), (np.float32, np.float16),
               (np.float16, np.float32), (np.int32, np.float32), (np.float32, np.int32)]


@pytest.mark.parametrize("dtypes", DTYPE_PAIRS, ids=str)
@pytest.mark.parametrize("name", sorted(ACCUMULATORS))
def test_accumulators(name, dtypes):
    t, x = rand((5, 7), dtypes[0]), rand((5, 7), dtypes[1])
    if t.dtype.kind == "f":
        t.flat[3] = np.nan
    compare_engines(lambda a, b: (ACCUMULATORS[name](a, b, 0.3), a + 0), [t, x], native_ops=[name])


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(ACCUMULATORS))
def test_accumulators_odd_shapes_and_tensor_scalars(name, shape):
    t, x = rand(shape), rand(shape, np.float16)
    s = np.asarray(2.5 if name == "accumulate_mean_" else 0.7, np.float32)
    compare_engines(lambda a, b, c: ACCUMULATORS[name](a, b, c.reshape(())), [t, x, s.reshape(1)],
                    native_ops=[name])


def test_accumulate_through_a_strided_view():
    t, x = rand((4, 6)), rand((6, 4))
    def build(a, b):
        vu.accumulate_(ops.transpose_(a), b, 0.25)
        return a + 0
    compare_engines(build, [t, x], native_ops=["accumulate_"])


UPDATERS = ["adam_updater", "lamb_updater", "adamax_updater"]


@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("step", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", UPDATERS)
def test_updaters(name, dtype, step, weight):
    if name == "adamax_updater" and not step:
        pytest.skip("adamax needs a time step")
    m, v, w = rand((3, 9), dtype), np.abs(rand((3, 9), dtype)), rand((3, 9), np.float32)
    ts = np.asarray([2.0], np.float32)

    def build(a, b, c, d):
        kw = dict(epsilon=1e-5)
        if weight:
            kw.update(weight=c, weight_decay=0.01)
        if step:
            kw.update(time_step=d, beta1=0.9)
            if name != "adamax_updater":
                kw.update(beta2=0.999)
        return getattr(vu, name)(a, b, **kw), d + 0
    compare_engines(build, [m, v, w, ts], native_ops=[name])


def test_updater_with_tensor_scalars_and_odd_shapes():
    for shape in [(), (0, 2), (1,)]:
        m, v = rand(shape), np.abs(rand(shape))
        sc = np.asarray([0.9, 0.99, 1e-3, 0.1], np.float32)

        def build(a, b, s):
            return vu.adam_updater(a, b, weight=a, time_step=s[3:4].reshape(()) + 0, weight_decay=s[2:3].reshape(()),
                                   beta1=s[0:1].reshape(()), beta2=s[1:2].reshape(()), epsilon=s[2:3].reshape(()))
        compare_engines(build, [m, v, sc], native_ops=["adam_updater"])


@pytest.mark.parametrize("norms", [(4.0, 9.0, 1.5), (0.0, 9.0, 1.5), (4.0, 9.0, 0.0), (4.0, 0.0, 5.0)], ids=str)
@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float16, np.float32), (np.float32, np.float16)],
                         ids=str)
def test_adam_var_update(dtypes, norms):
    t, x = rand((6, 5), dtypes[0]), rand((6, 5), dtypes[1])
    r = np.asarray(norms[:2], np.float32)

    def build(a, b, rr):
        out = vu.adam_var_update(a, b, rr[0:1].reshape(()), rr[1:2].reshape(()), learning_rate=0.01,
                                 max_weight_norm=norms[2])
        return out, a + 0
    compare_engines(build, [t, x, r], native_ops=["adam_var_update"])


def test_adam_var_update_tensor_learning_rate():
    t, x = rand((0, 3)), rand((0, 3))
    compare_engines(lambda a, b: vu.adam_var_update(a, b, ops.sum(a) + 1, ops.sum(a) + 2, learning_rate=ops.sum(a) + 0.1),
                    [t, x], native_ops=["adam_var_update"])


# ---- random ------------------------------------------------------------------------------------
SEEDS = [np.array([0, 0], np.uint32), np.array([12345, 0xFFFFFFFF], np.uint32)]
RANDOM_SHAPES = [(1,), (3,), (4,), (5,), (2, 3, 7), (257,), (64, 65)]


@pytest.mark.parametrize("dtype", [popxl.float32, popxl.float16])
@pytest.mark.parametrize("shape", RANDOM_SHAPES, ids=str)
@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_random_uniform_and_normal_are_bit_identical(seed, shape, dtype):
    def build(s):
        return (ops.random_uniform(s, shape, low=-2.0, high=5.0, dtype=dtype),
                ops.random_normal(s, shape, mean=0.5, std=3.0, dtype=dtype))
    compare_engines(build, [SEEDS[seed]], native_ops=["random_uniform", "random_normal"])


def test_random_normal_many_draws():
    compare_engines(lambda s: ops.random_normal(s, (100003,)), [SEEDS[1]], native_ops=["random_normal"])


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.999])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 7), (0, 4), (33, 65)], ids=str)
def test_dropout(shape, dtype, p):
    x = rand(shape, dtype)
    compare_engines(lambda a, s: ops.dropout(a, s, p), [x, SEEDS[1]], native_ops=["dropout"])


def test_dropout_of_a_strided_view():
    x = rand((5, 6))
    compare_engines(lambda a, s: ops.dropout(ops.transpose_(a), s, 0.3), [x, SEEDS[0]], native_ops=["dropout"])


@pytest.mark.parametrize("mask", [(1, 7), (3, 1), (3, 7), (7,), (1,)], ids=str)
def test_shaped_dropout(mask):
    x = rand((3, 7), np.float16)
    compare_engines(lambda a, s: ops.shaped_dropout(a, s, mask, 0.4), [x, SEEDS[1]], native_ops=["shaped_dropout"])


@pytest.mark.parametrize("n", [1, 2, 5])
def test_split_random_seed(n):
    compare_engines(lambda s: ops.split_random_seed(s, n), [SEEDS[1]], native_ops=["split_random_seed"])


# ---- data movement -------------------------------------------------------------------------------
MOVE_DTYPES = [np.float32, np.float16, np.int32, np.bool_, np.uint8]


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@pytest.mark.parametrize("case", [((2, 3), (2, 0), (2, 5), 1), ((1,), (4,), 0), ((3, 1, 2), (1, 1, 2), -3)], ids=str)
def test_concat_and_split(case, dtype):
    *shapes, axis = case
    xs = [rand(s, dtype) for s in shapes]
    for name in ("concat", "concat_"):
        compare_engines(lambda *ts: getattr(ops, name)(ts, axis), xs, native_ops=[name])
    joined = np.concatenate(xs, axis)
    sizes = [s[axis] for s in shapes]
    compare_engines(lambda t: ops.split(t, sizes, axis), [joined], native_ops=["split"])


def test_concat_of_strided_views():
    a, b = rand((3, 4)), rand((4, 2))
    compare_engines(lambda x, y: ops.concat([ops.transpose_(x), y], 1), [a, b], native_ops=["concat"])


GATHER_CASES = [((5, 3), (4,), 0), ((5, 3), (2, 2), 1), ((4,), (), 0), ((2, 0, 3), (3,), 2), ((6, 2), (0,), 0),
                ((3, 4, 2), (2, 3), 1)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.bool_])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.uint32, np.int16])
@pytest.mark.parametrize("case", GATHER_CASES, ids=str)
def test_gather(case, idx_dtype, dtype):
    shape, ishape, axis = case
    d = shape[axis]
    low = 0 if np.dtype(idx_dtype).kind == "u" else -d - 2
    idx = RNG.integers(low, d + 2, size=ishape).astype(idx_dtype)  # out of range gives zeros
    x = rand(shape, dtype)
    for name in ("gather", "tied_gather"):
        for zero_oor in (False, True):
            compare_engines(lambda t, i: getattr(ops, name)(t, i, axis, zero_OOR=zero_oor), [x, idx], native_ops=[name])


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, np.int64, np.uint16])
@pytest.mark.parametrize("shape,axis", [((300, 1000), 1), ((2, 300, 1000), 2), ((1000, 3, 40), 0)], ids=str)
def test_gather_on_both_threads(shape, axis, dtype):
    """Rows of 1, 2, 4 and 8 bytes moved as values, wider ones copied; 699 indices (in range, negative,
    out of range), so the threads' shares start part-way through a line."""
    d = shape[axis]
    idx = RNG.integers(-d - 5, d + 5, size=699).astype(np.int32)
    compare_engines(lambda t, i: ops.gather(t, i, axis), [rand(shape, dtype), idx], native_ops=["gather"])


def test_gather_of_a_strided_view_and_groupedgather():
    x, idx = rand((4, 5)), np.array([[0, 3, -1], [7, 2, 2]], np.int32)
    compare_engines(lambda t, i: ops.gather(ops.transpose_(t), i, 1), [x, idx], native_ops=["gather"])
    g = rand((2, 5, 3))
    for zero_oor in (False, True):
        compare_engines(lambda t, i: ops.groupedgather(t, i, 0, group_size=2, zero_OOR=zero_oor), [g, idx],
                        native_ops=["groupedgather"])
    compare_engines(lambda t, i: ops.groupedgather(t, i, 1, group_size=2), [g, idx[:, :2] % 3],
                    native_ops=["groupedgather"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", [((5, 3), (6,), 0), ((5, 3), (2, 2), 1), ((2, 4, 3), (4, 2), 1)], ids=str)
def test_gather_grad(case, dtype):
    shape, ishape, axis = case
    d = shape[axis]
    idx = RNG.integers(-d - 1, d + 1, size=ishape).astype(np.int32)  # repeats add up, out of range drop
    gshape = shape[:axis] + ishape + shape[axis + 1:]
    g = rand(gshape, dtype)
    for zero_oor in (False, True):
        compare_engines(lambda t, i: create_op("gather_grad", [t, i], {"axis": axis, "size": d, "zero_OOR": zero_oor})[0],
                        [g, idx], native_ops=["gather_grad"])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
@pytest.mark.parametrize("case", [((4, 5), (2, 5), 0), ((4, 5), (4, 3), 1), ((6,), (6,), 0), ((3, 0), (3, 0), 1)],
                         ids=str)
def test_scatter(case, dtype):
    shape, ishape, axis = case
    d = shape[axis]
    t, vals = rand(shape, dtype), rand(ishape, dtype)
    idx = RNG.integers(-d - 1, d + 1, size=ishape).astype(np.int32)  # repeats: the last write wins
    compare_engines(lambda a, i, v: ops.scatter(a, i, v, axis), [t, idx, vals], native_ops=["scatter"])


@pytest.mark.parametrize("offsets", [(0, 0), (2, 1), (9, -4), (1, 100)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_dynamic_slice_and_update(offsets, dtype):
    t, upd = rand((5, 6, 3), dtype), rand((2, 6, 3), dtype)
    off = np.asarray(offsets, np.uint32 if min(offsets) >= 0 else np.int32)
    axes, sizes = [0, 1], [2, 4]
    upd = upd[:, :4]
    compare_engines(lambda a, i: ops.dynamic_slice(a, i, axes, sizes, False), [t, off], native_ops=["dynamic_slice"])
    compare_engines(lambda a, i, u: ops.dynamic_update(a, i, u, axes, sizes, False), [t, off, upd],
                    native_ops=["dynamic_update"])
    compare_engines(lambda a, i, u: (ops.dynamic_update_(a, i, u, axes, sizes, False), a + 0), [t, off, upd],
                    native_ops=["dynamic_update_"])


def test_dynamic_slice_of_size_zero():
    t = rand((4, 3))
    compare_engines(lambda a, i: ops.dynamic_slice(a, i, [1], [0], True), [t, np.array([2], np.uint32)],
                    native_ops=["dynamic_slice"])


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.float32])
def test_onehot(axis, idx_dtype):
    idx = np.array([[0, 3, -1], [5, -7, 2]], idx_dtype)
    if idx_dtype == np.float32:
        idx = idx + np.float32(0.5)
    for values in (np.array([0.0, 1.0], np.float32), np.array([-2, 7], np.int32)):
        compare_engines(lambda i, v: ops.onehot(i, 4, v, axis), [idx, values], native_ops=["onehot"])


@pytest.mark.parametrize("dtype", [popxl.float32, popxl.int32, popxl.float16, popxl.bool])
def test_init(dtype):
    x = rand((2,))
    compare_engines(lambda t: (ops.init((3, 0, 2) if dtype is popxl.bool else (3, 2), dtype), t + 0), [x],
                    native_ops=["init"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.int16])
def test_increment_mod(dtype):
    x = rand((3, 5), dtype, low=-20 if np.dtype(dtype).kind != "u" else 0, high=20)
    inc, mod = (3, 7) if np.dtype(dtype).kind in "iu" else (0.75, 2.5)
    compare_engines(lambda t: ops.increment_mod(t, inc, mod), [x], native_ops=["increment_mod"])
    compare_engines(lambda t: (ops.increment_mod_(t, inc, -mod), t + 0), [x], native_ops=["increment_mod_"])


# ---- normalisations and losses ---------------------------------------------------------------------
NORM_TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float16: dict(rtol=2e-3, atol=2e-3)}
NORM_SHAPES = [(2, 6), (3, 6, 5), (1, 6, 2, 3), (0, 6, 4), (2, 6, 0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_batch_norm_inference_is_bit_identical(shape, dtype):
    x = rand(shape, dtype)
    scale, bias, mean = rand((6,), dtype), rand((6,), dtype), rand((6,), dtype)
    var = np.abs(rand((6,), dtype))
    compare_engines(lambda *ts: ops.batch_norm_inference(*ts, epsilon=1e-3), [x, scale, bias, mean, var],
                    native_ops=["batch_norm_inference"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference averages empty groups to NaN
def test_group_and_layer_norm(groups, shape, dtype):
    x, w, b = rand(shape, dtype) + dtype(1.5), rand((6,), dtype), rand((6,), dtype)
    g = rand(shape, dtype)
    compare_engines(lambda t, ww, bb: ops.group_norm(t, ww, bb, groups, eps=1e-4), [x, w, b],
                    native_ops=["group_norm"], **NORM_TOL[dtype])
    if groups == 1:
        compare_engines(lambda t, ww, bb: ops.layer_norm(t, ww, bb), [x, w, b], native_ops=["layer_norm"],
                        **NORM_TOL[dtype])
    compare_engines(lambda t, ww, gg: create_op("group_norm_grad", [t, ww, gg], {"num_groups": groups, "eps": 1e-4}),
                    [x, w, g], native_ops=["group_norm_grad"], rtol=1e-3 if dtype == np.float32 else 1e-2,
                    atol=1e-4 if dtype == np.float32 else 2e-2)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape,groups", [((64, 6, 100), 1), ((64, 6, 100), 3), ((1024, 96), 1), ((3, 6, 3000), 2)],
                         ids=str)
def test_group_norm_over_threads(shape, groups, dtype):
    """Big enough for the groups to be split over threads (the gradient's dweight/dbias summed per
    thread), with one value per channel (layer norm of rows) and with many; groups of 9000 values
    check the statistics' accuracy."""
    x, w, b = rand(shape, dtype) + dtype(1.5), rand(shape[1:2], dtype), rand(shape[1:2], dtype)
    g = rand(shape, dtype)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-2, atol=2e-2)
    compare_engines(lambda t, ww, bb: ops.group_norm(t, ww, bb, groups, eps=1e-4), [x, w, b], native_ops=["group_norm"],
                    **NORM_TOL[dtype])
    compare_engines(lambda t, ww, gg: create_op("group_norm_grad", [t, ww, gg], {"num_groups": groups, "eps": 1e-4}),
                    [x, w, g], native_ops=["group_norm_grad"], **tol)


def test_group_norm_of_strided_views():
    x, w, b, g = rand((5, 6, 4)) + np.float32(1.5), rand((6,)), rand((6,)), rand((5, 6, 4))
    compare_engines(lambda t, ww, bb: ops.group_norm(ops.transpose_(t, (2, 1, 0)), ww, bb, 3, eps=1e-4),
                    [x.transpose(2, 1, 0).copy(), w, b], native_ops=["group_norm"], **NORM_TOL[np.float32])
    compare_engines(lambda t, ww, gg: create_op("group_norm_grad", [ops.transpose_(t, (2, 1, 0)), ww,
                                                                    ops.transpose_(gg, (2, 1, 0))],
                                                {"num_groups": 2, "eps": 1e-4}),
                    [x.transpose(2, 1, 0).copy(), w, g.transpose(2, 1, 0).copy()], native_ops=["group_norm_grad"],
                    rtol=1e-4, atol=1e-4)


def _probs(shape, dtype):
    z = np.exp(rand(shape, np.float32))
    return (z / z.sum(-1, keepdims=True)).astype(dtype)


NLL_CASES = [((4, 5), None), ((2, 3, 4), 1), ((1, 3), None), ((0, 3), None), ((6,), 2),
             ((300, 200), 3)]  # rows spread over threads


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", NLL_CASES, ids=str)
def test_nll_loss_and_gradients(case, reduction, dtype):
    shape, ignore = case
    p = _probs(shape, dtype)
    labels = RNG.integers(0, shape[-1], size=shape[:-1]).astype(np.int32)
    if labels.size:
        p.reshape(-1, shape[-1])[0, labels.reshape(-1)[0]] = 0  # the eps clamp
    tol = NORM_TOL[dtype]
    for log_prob in (False, True):
        compare_engines(lambda a, l: ops.nll_loss(a, l, ignore_index=ignore, reduction=reduction, log_prob=log_prob),
                        [p, labels], native_ops=["nll_loss"], **tol)
        attrs = {"ignore_index": ignore, "reduction": reduction, "log_prob": log_prob}
        lg = rand(shape[:-1] if reduction == "none" else (), dtype)
        compare_engines(lambda a, l, g: create_op("nll_loss_grad", [a, l, g], attrs)[0], [p, labels, lg],
                        native_ops=["nll_loss_grad"], **tol)
    for lg in (np.asarray(0.5, np.float32), rand(shape[:-1], np.float32)):
        if reduction != "none" and lg.ndim:
            continue
        compare_engines(lambda a, l, g: ops.nll_loss_with_softmax_grad(a, l, g, ignore_index=ignore,
                                                                       reduction=reduction),
                        [p, labels, lg], native_ops=["nll_loss_with_softmax_grad"], **tol)


SOFTMAX_CASES = [((4, 7), 1), ((4, 7), 0), ((2, 3, 5), 1), ((1, 1), 1), ((0, 5), 1), ((6,), 0),
                 ((5, 1037), 1),  # eight-wide rows with a tail
                 ((300, 200), 1), ((20, 40, 50), 1)]  # rows and blocks spread over threads
SOFTMAX_TOL = {np.float32: dict(rtol=1e-6, atol=1e-7), np.float16: dict(rtol=1e-3, atol=1e-4),
               np.float64: dict(rtol=1e-12, atol=1e-15)}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=str)
def test_softmax_kernel(case, dtype):
    shape, axis = case
    x = rand(shape, dtype, -20.0, 20.0)
    compare_engines(lambda t: ops.softmax(t, axis), [x], native_ops=["softmax"], **SOFTMAX_TOL[dtype])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf
@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_special_values(axis):
    """A NaN or +inf makes its row NaN, -inf gives 0, logits far below the maximum underflow to 0."""
    x = rand((7, 1030), np.float32, -5.0, 5.0)
    x[0, 3], x[1, 1029], x[2, 10] = np.nan, np.nan, np.inf
    x[3, :] = -np.inf
    x[4, 100:200] = -np.inf
    x[5, 0], x[6, 1024] = 200.0, 300.0  # the rest underflows
    if axis == 0:
        x = np.ascontiguousarray(x.T)
    compare_engines(lambda t: ops.softmax(t, axis if axis == 0 else 1), [x], native_ops=["softmax"],
                    rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fmt", [popxl.float8_143, popxl.float8_152])
def test_softmax_of_float8(fmt):
    x, scale = rand((3, 9), np.float32, -4.0, 4.0), np.zeros((), np.int32)
    compare_engines(lambda t, l: ops.softmax(ops.pow2scale_cast_to_fp8(t, l, fmt), 1), [x, scale],
                    native_ops=["softmax"])


SOFTMAX_GRAD_CASES = [((4, 7), 1), ((4, 7), 0), ((2, 3, 5), 1), ((1, 5), 1), ((0, 5), 1), ((3, 0), 1),
                      ((6,), 0), ((64, 1100), 1), ((40, 30, 50), 1)]  # the last two spread over threads


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", SOFTMAX_GRAD_CASES, ids=str)
def test_softmax_grad(case, dtype):
    """The fused softmax gradient g * y - y * sum(g * y) along each axis, also of strided views."""
    shape, axis = case
    y, g = _probs(shape, dtype) if shape[-1] else rand(shape, dtype), rand(shape, dtype)
    if axis != len(shape) - 1:
        y = rand(shape, dtype, 0.0, 1.0)
    # y * sum(g * y) can be ~50 where the result is ~1 (the sums differ in their last bits)
    tol = dict(rtol=1e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=2e-3, atol=1e-2)
    compare_engines(lambda gg, yy: create_op("softmax_grad", [gg, yy], {"axis": axis})[0], [g, y],
                    native_ops=["softmax_grad"], **tol)


def test_softmax_grad_of_strided_views_and_its_rule():
    """Transposed operands, and the softmax gradient rule (which now emits softmax_grad) through autodiff."""
    g, y = rand((5, 6)), _probs((5, 6), np.float32)
    compare_engines(lambda gg, yy: create_op("softmax_grad", [ops.transpose_(gg), ops.transpose_(yy)], {"axis": 1})[0],
                    [g.T.copy(), y.T.copy()], native_ops=["softmax_grad"], rtol=1e-5, atol=1e-6)
    x, dy = rand((3, 4, 5)), rand((3, 4, 5))
    want = None
    for axis in (0, 1, 2):
        z = np.exp(x - x.max(axis, keepdims=True))
        p = z / z.sum(axis, keepdims=True)
        want = p * (dy - (dy * p).sum(axis, keepdims=True))

        def build(xx, gg, axis=axis):
            graph = popxl.gcg().ir.create_graph(lambda t: ops.softmax(t, axis), xx)
            grad = popxl.transforms.autodiff(graph)
            info = ops.call_with_info(graph, xx)
            return ops.call(grad.graph, gg, inputs_dict=grad.inputs_dict(info))[0]
        got = compare_engines(build, [x, dy], native_ops=["softmax_grad"], rtol=1e-5, atol=1e-6)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nll_loss_label_out_of_range_raises():
    p, labels = _probs((2, 3), np.float32), np.array([1, 5], np.int32)
    with pytest.raises(ValueError, match="out of range"):
        run_program(lambda a, l: ops.nll_loss(a, l), [p, labels], "native")


# ---- oneDNN convolution and pooling ------------------------------------------------------------------
CONV_TOL = dict(rtol=1e-4, atol=1e-4)
CONV_CASES = [  # x shape, weight shape, stride, padding, dilation, groups
    ((2, 3, 9, 8), (4, 3, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 4, 10, 7), (6, 2, 3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 2),
    ((2, 2, 11), (3, 2, 4), (3,), (2, 1), (2,), 1),
    ((1, 2, 5, 4, 6), (2, 1, 2, 3, 2), (1, 2, 1), (0, 1, 1, 1, 0, 0), (1, 1, 2), 2),
    ((1, 1, 1, 1), (5, 1, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv(case):
    xs, ws, stride, pad, dil, g = case
    x, w = rand(xs), rand(ws)
    compare_engines(lambda a, b: ops.conv(a, b, stride, pad, dil, g), [x, w], native_ops=["conv"], **CONV_TOL)


def test_conv_of_a_strided_input():
    x, w = rand((2, 6, 5, 3)), rand((4, 3, 2, 2))
    compare_engines(lambda a, b: ops.conv(ops.transpose_(a, (0, 3, 1, 2)), b, (1, 1), (1, 1, 0, 0), (1, 1), 1),
                    [x, w], native_ops=["conv"], **CONV_TOL)


TCONV_CASES = [  # x shape, weight shape, stride, padding, dilation, groups, output_padding
    ((2, 3, 5, 4), (3, 2, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1, (0, 0)),
    ((1, 4, 4, 3), (4, 3, 3, 2), (2, 3), (1, 0, 1, 1), (1, 1), 2, (1, 2)),
    ((2, 2, 6), (2, 3, 4), (2,), (1, 2), (2,), 1, (1,)),
]


@pytest.mark.parametrize("case", TCONV_CASES, ids=str)
def test_conv_transpose(case):
    xs, ws, stride, pad, dil, g, opad = case
    x, w = rand(xs), rand(ws)
    compare_engines(lambda a, b: ops.conv_transpose(a, b, stride, pad, dil, g, output_padding=opad), [x, w],
                    native_ops=["conv_transpose"], **CONV_TOL)


POOL_CASES = [  # x shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 8, 7), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False),
    ((1, 2, 9, 8), (3, 2), (2, 3), (1, 0, 1, 1), (1, 1), True),
    ((1, 2, 10), (3,), (2,), (2, 1), (2,), False),
    ((1, 1, 5, 5, 5), (2, 3, 2), (1, 2, 2), (0, 1, 1, 1, 0, 0), (1, 1, 1), True),
    ((3, 2, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), False),
    ((1, 2, 9, 10), (3, 2), (1, 2), (2, 1, 1, 0), (2, 2), True),
]


@pytest.mark.parametrize("name", ["max_pool", "average_pool"])
@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_pooling(case, name):
    xs, k, stride, pad, dil, ceil = case
    x = rand(xs)
    tol = {} if name == "max_pool" else dict(rtol=1e-5, atol=1e-6)  # a max is exact
    compare_engines(lambda a: getattr(ops, name)(a, k, stride, pad, dilation=dil, ceil_mode=ceil), [x],
                    native_ops=[name], **tol)


def test_float16_runs_through_float32_primitives():
    """oneDNN ops stage float16 operands in float32 (the reference computes them in float32 too)."""
    tol = dict(rtol=2e-3, atol=2e-3)
    x, w = rand((2, 4, 7, 6), np.float16), rand((6, 2, 3, 3), np.float16)
    compare_engines(lambda a, b: ops.conv(a, b, (1, 2), (1, 1, 0, 1), (1, 1), 2), [x, w], native_ops=["conv"], **tol)
    wt = rand((4, 3, 2, 2), np.float16)
    compare_engines(lambda a, b: ops.conv_transpose(a, b, (2, 2), (0, 0, 0, 0), (1, 1), 1), [x, wt],
                    native_ops=["conv_transpose"], **tol)
    for name in ("max_pool", "average_pool"):
        compare_engines(lambda a: getattr(ops, name)(ops.transpose_(a, (0, 1, 3, 2)), (2, 3), (1, 2), ceil_mode=True),
                        [x], native_ops=[name], **tol)
    compare_engines(lambda a: ops.softmax(ops.transpose_(a, (0, 1, 3, 2)), 2), [x], native_ops=["softmax"], **tol)
    m1, m2 = rand((3, 5, 4), np.float16), rand((4, 2), np.float16)
    # strided (transposed) float16 operands are packed into the float32 staging
    compare_engines(lambda a, b: ops.matmul(ops.transpose_(a, (0, 2, 1)), ops.transpose_(b)),
                    [m1.transpose(0, 2, 1).copy(), m2.T.copy()], native_ops=["matmul"], **tol)


# ---- index reductions, statistics, small elementwise ----------------------------------------------
ARG_DTYPES = [np.float32, np.float16, np.int32, np.uint8]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", ARG_DTYPES)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(name, dtype, dim, keepdim):
    x = rand((4, 5, 3), dtype, low=0, high=3)  # many ties: the first extreme wins
    if np.dtype(dtype).kind == "f":
        x[1, 2, 0] = np.nan
    compare_engines(lambda t: getattr(ops, name)(t, dim, keepdim), [x], native_ops=[name])


@pytest.mark.parametrize("dim", [0, 1, None])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_argmax_argmin_on_both_threads(dtype, dim):
    """Lines long enough for the eight-lane pass and columns in several blocks, with ties (small
    integers as values: the first wins) and NaNs (the first NaN wins) in some rows and columns."""
    x = RNG.integers(-20, 20, size=(300, 700)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[5, 17] = x[5, 3] = x[9, 699] = x[200, 40] = np.nan
        x[::37, 11] = np.nan
    for op in ("argmax", "argmin"):
        compare_engines(lambda t: getattr(ops, op)(t, dim), [x], native_ops=[op])


def test_argmax_of_a_scalar_and_a_view():
    compare_engines(lambda t: ops.argmax(t, None), [np.asarray(3.0, np.float32)], native_ops=["argmax"])
    compare_engines(lambda t: ops.argmin(ops.transpose_(t), 1), [rand((3, 6))], native_ops=["argmin"])


@pytest.mark.parametrize("dim", [None, 0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.uint8])
def test_cumsum(dtype, dim):
    x = rand((6, 7), dtype, low=0 if np.dtype(dtype).kind == "u" else -100, high=100)  # int8 wraps
    compare_engines(lambda t: ops.cumsum(t, dim), [x], native_ops=["cumsum"])
    compare_engines(lambda t: ops.cumsum(t, dim), [rand((0, 3), dtype)], native_ops=["cumsum"])


@pytest.mark.parametrize("shape,dim", [((3, 700, 300), 1), ((300, 200), 1), ((5, 40, 600), 2)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_cumsum_on_both_threads(shape, dim, dtype):
    """Big enough to share out: blocks of running sums (more than one 256-column chunk a row), and
    whole lines along the last axis; bit-identical, as the order of additions is np.cumsum's."""
    x = rand(shape, dtype, low=-100, high=100)
    compare_engines(lambda t: ops.cumsum(t, dim), [x], native_ops=["cumsum"])


@pytest.mark.parametrize("sorted_", [True, False])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("case", [((5, 8), 3, 1), ((9,), 9, 0), ((4, 3, 2), 2, 0), ((3, 4), 0, 1)], ids=str)
def test_topk(case, dtype, largest, sorted_):
    shape, k, axis = case
    x = rand(shape, dtype, low=0, high=4)  # ties keep the lower index first
    if np.dtype(dtype).kind == "f" and x.size > 3:
        x.flat[2] = np.nan
    compare_engines(lambda t: ops.topk(t, k, axis, largest, sorted_), [x], native_ops=["topk"])


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("case", [((64, 700), 5, 1), ((200, 60, 3), 7, 1)], ids=str)
def test_topk_of_many_lines(case, largest):
    """Lines over both threads; many ties, NaNs (several in some lines), -0.0 beside 0.0."""
    shape, k, axis = case
    x = rand(shape, np.float32, low=0, high=6).round() - 3
    x.flat[::97] = np.nan
    x.flat[5::89] = -0.0
    compare_engines(lambda t: ops.topk(t, k, axis, largest, True), [x], native_ops=["topk"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_lamb_square_and_histogram(dtype):
    x = rand((33, 17), dtype, low=-5, high=5)
    compare_engines(lambda t: ops.lamb_square(t), [x], native_ops=["lamb_square"], rtol=1e-6)
    compare_engines(lambda t: ops.lamb_square(t), [rand((0,), dtype)], native_ops=["lamb_square"])
    if np.dtype(dtype).kind == "f":
        x[0, 0], x[0, 1] = np.nan, -np.inf
    for absolute in (False, True):
        compare_engines(lambda t: ops.histogram(t, [-2.0, 0.0, 0.5, 3.0], absolute), [x], native_ops=["histogram"])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.float16])
def test_logical_not(dtype):
    x = rand((4, 5), dtype, low=-1, high=1)
    if np.dtype(dtype).kind == "f":
        x[0, 0] = np.nan
    compare_engines(lambda t: ops.logical_not(t), [x], native_ops=["logical_not"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", ["gelu_grad", "geluerf_grad"])
def test_gelu_gradients(name, dtype):
    g, x = rand((7, 9), dtype), rand((7, 9), dtype, low=-6, high=6)
    # float32 terms of size ~1 cancel where the derivative crosses 0: absolute error ~1e-6 there
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=2e-3, atol=2e-3)
    given = (lambda x: [ops.gelu(x)]) if name == "gelu_grad" else (lambda x: [])  # noqa: E731
    compare_engines(lambda a, b: create_op(name, [a, b, *given(b)])[0], [g, x], native_ops=[name], **tol)


# ---- collectives across replicas ---------------------------------------------------------------------
def compare_replicated(build, data, replication, native_ops, **group_args):
    """Like compare_engines, with ``replication`` replicas; ``data`` is (replicas, *shape)."""

    def program(x):
        ir = x.ir
        group = ir.replica_grouping(**group_args) if group_args else None
        return build(x, group)
    want, _ = run_program(program, [data], "reference", replication=replication)
    got, eng = run_program(program, [data], "native", replication=replication)
    assert not set(native_ops) & set(eng.fallback_ops), eng.fallback_ops
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_array_equal(g, w)


COLL_DTYPES = [np.float32, np.float16, np.int32, np.uint8]


@pytest.mark.parametrize("groups", [{}, {"stride": 1, "group_size": 2}, {"stride": 2, "group_size": 2}], ids=str)
@pytest.mark.parametrize("dtype", COLL_DTYPES)
@pytest.mark.parametrize("op", ["add", "mean", "mul", "min", "max", "and", "or", "square_add"])
def test_replicated_all_reduce(op, dtype, groups):
    data = rand((4, 3, 5), dtype, low=0 if np.dtype(dtype).kind == "u" else -4, high=4)
    if np.dtype(dtype).kind == "f":
        data[1, 0, 0] = np.nan
    compare_replicated(lambda x, g: coll.replicated_all_reduce(x, op, g), data, 4,
                       ["replicated_all_reduce"], **groups)


def test_replicated_all_reduce_in_place_and_reduce_scatter():
    data = rand((4, 2, 3))
    def build(x, g):
        coll.replicated_all_reduce_(x, "add", g)
        return x + 0, coll.replicated_reduce_scatter(x, "max", g)
    compare_replicated(build, data, 4, ["replicated_all_reduce_", "replicated_reduce_scatter"])
    compare_replicated(lambda x, g: coll.replicated_reduce_scatter(x, "add", g), rand((2, 7), np.float16), 2,
                       ["replicated_reduce_scatter"])


@pytest.mark.parametrize("output_shape", ["new_axis", "concat", "meta_shape"])
def test_gathers_and_slices(output_shape):
    data = rand((4, 4, 8))
    def build(x, g):
        if output_shape == "meta_shape":
            shard = coll.replica_sharded_slice(x, g)
            return shard, coll.replicated_all_gather(shard, group=g, output_shape="meta_shape")
        sliced = coll.replicated_slice(x, 1, g)
        return sliced, coll.replicated_all_gather(sliced, axis=1, group=g, output_shape=output_shape)
    ops_ = ["replicated_all_gather", "replica_sharded_slice" if output_shape == "meta_shape" else "replicated_slice"]
    compare_replicated(build, data, 4, ops_)
    compare_replicated(build, data, 4, ops_, stride=2, group_size=2)


@pytest.mark.parametrize("identity", [False, True])
def test_all_reduce_across_ipus(identity):
    a, b = rand((3, 4)), rand((3, 4))
    compare_engines(lambda x, y: create_op("all_reduce", [x, y], {"op": "add", "identity": identity,
                                                                  "backward": "all_reduce"}),
                    [a, b], native_ops=["all_reduce"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", ["max_pool", "average_pool"])
@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_pooling_gradients_are_bit_identical(case, name, dtype):
    xs, k, stride, pad, dil, ceil = case
    x = rand(xs, dtype, low=0, high=3).round()  # ties: the first maximum takes the gradient
    def build(a, g):
        y = getattr(ops, name)(a, k, stride, pad, dilation=dil, ceil_mode=ceil)
        return create_op(name + "_grad", [a, g], dict(y.producer.attrs))[0]
    y_shape = _pool_out_shape(xs, k, stride, pad, dil, ceil)
    compare_engines(build, [x, rand(y_shape, dtype)], native_ops=[name + "_grad"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_max_pool_gradient_with_nan_and_infinities(dtype):
    """Planes enough to run on both threads; NaNs (the first in a window takes its gradient) and
    -infs, some in windows whose first position is padding (-inf beats nothing there: the
    gradient is dropped, as the reference's argmax picks the padding)."""
    x = rand((4, 16, 33, 31), dtype, low=0, high=4).round()
    x[:, :, 0, :] = -np.inf  # the top row: windows hanging over the top edge see only -inf there
    x[:, :, 1, 1::2] = -np.inf
    x[:, ::3, 5:9, 7:12] = -np.inf
    x[0, 1, 10, 10] = x[0, 1, 11, 11] = x[1, 3, 3, 0] = np.nan
    x[2, 5, 20:24, 20:24] = np.nan

    def build(a, g):
        y = ops.max_pool(a, (3, 3), (2, 2), (1, 1, 1, 1))
        return create_op("max_pool_grad", [a, g], dict(y.producer.attrs))[0]
    y_shape = _pool_out_shape(x.shape, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False)
    (dx,) = compare_engines(build, [x, rand(y_shape, dtype)], native_ops=["max_pool_grad"])
    assert np.count_nonzero(dx[:, :, 0, :]) == 0  # no -inf in the top row won a window


def _pool_out_shape(xs, k, stride, pad, dil, ceil):
    (y,), _ = run_program(lambda a: ops.max_pool(a, k, stride, pad, dilation=dil, ceil_mode=ceil),
                          [np.zeros(xs, np.float32)], "reference")
    return y.shape


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_add_n(dtype):
    xs = [rand((3, 4), dtype), rand((4,), dtype), rand((3, 1), dtype), rand((3, 4), dtype)]
    compare_engines(lambda *ts: create_op("add_n", list(ts))[0], xs, native_ops=["add_n"])
    compare_engines(lambda t: create_op("add_n", [t])[0], xs[:1], native_ops=["add_n"])
    big = [rand((300, 257), dtype), rand((257,), dtype), rand((300, 257), dtype)]  # spread over threads
    compare_engines(lambda *ts: create_op("add_n", list(ts))[0], big, native_ops=["add_n"])


@pytest.mark.parametrize("grads", [None, ("dx",), ("dweight",)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv_grad(case, dtype, grads):
    """Both gradients (no `grads` attribute: as before it existed) or one; the one computed alone
    equals its value from the pair."""
    xs, ws, stride, pad, dil, g = case
    x, w = rand(xs, dtype), rand(ws, dtype)
    (y,), _ = run_program(lambda a, b: ops.conv(a, b, stride, pad, dil, g), [x, w],
                                                       "reference")
    gy = rand(y.shape, dtype)

    def build(a, b, gy, grads=grads):
        attrs = dict(ops.conv(a, b, stride, pad, dil, g).producer.attrs)
        return create_op("conv_grad", [a, b, gy], attrs if grads is None else {**attrs, "grads": grads})
    tol = CONV_TOL if dtype == np.float32 else dict(rtol=1e-2, atol=1e-2)
    got = compare_engines(build, [x, w, gy], native_ops=["conv_grad"], **tol)
    if grads is not None:
        both, _ = run_program(lambda *t: build(*t, grads=None), [x, w, gy], "native")
        (alone,) = got
        np.testing.assert_array_equal(alone, both[("dx", "dweight").index(grads[0])])


@pytest.mark.parametrize("grads", [(), ("dweight", "dx"), ("dw",)], ids=str)
def test_conv_grad_names_its_outputs(grads):
    with popxl.Ir().main_graph:
        x, w = popxl.constant(rand((1, 2, 4, 4))), popxl.constant(rand((3, 2, 3, 3)))
        attrs = dict(ops.conv(x, w).producer.attrs)
        with pytest.raises(ValueError, match=r"grads must be a non-empty ordered subset of \('dx', 'dweight'\)"):
            create_op("conv_grad", [x, w, popxl.constant(rand((1, 3, 2, 2)))], {**attrs, "grads": grads})


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float16, np.float16), (np.float32, np.float16),
                                    (np.int32, np.float32)], ids=str)
@pytest.mark.parametrize("case", [((6, 3), (5,), 0), ((4, 5), (2, 3), 1), ((3, 4, 2), (4,), 1), ((4,), (0,), 0)],
                         ids=str)
def test_sparse_accumulate(case, dtypes):
    shape, ishape, axis = case
    t = rand(shape, dtypes[0])
    idx = RNG.integers(-2, shape[axis] + 2, size=ishape).astype(np.int32)  # repeats add; out of range drop
    x = rand(shape[:axis] + ishape + shape[axis + 1:], dtypes[1])
    compare_engines(lambda a, b, i: (vu.sparse_accumulate_(a, b, i, axis, 0.5), a + 0), [t, x, idx],
                    native_ops=["sparse_accumulate_"])
    compare_engines(lambda a, b, i, f: vu.sparse_accumulate_(a, b, i, axis, f.reshape(())), [t, x, idx,
                    np.array([1.5], np.float32)], native_ops=["sparse_accumulate_"])


@pytest.mark.parametrize("axis", [0, 1])
def test_groupedgather_grad(axis):
    g_shape = (2, 4, 3) if axis == 0 else (2, 5, 4)
    idx = RNG.integers(-6, 6, size=(2, 4)).astype(np.int32)
    size = 5 if axis == 0 else 3
    for zero_oor in (False, True):
        attrs = {"axis": axis, "size": size, "group_size": 2, "zero_OOR": zero_oor}
        compare_engines(lambda g, i: create_op("groupedgather_grad", [g, i], attrs)[0],
                        [rand(g_shape), idx], native_ops=["groupedgather_grad"])


@pytest.mark.parametrize("case", [((4, 5), (4, 5), 0, ()), ((4, 5), (2, 3), 1, ()), ((4, 5), (3,), 1, (3, 5)),
                                  ((4, 5), (3,), 0, (3, 5)), ((6,), (4,), 0, ())], ids=str)
def test_gather_elements(case):
    gshape, ishape, axis, data_shape = case
    idx = RNG.integers(-gshape[axis] - 1, gshape[axis] + 1, size=ishape).astype(np.int32)
    compare_engines(lambda g, i: create_op("gather_elements", [g, i], {"axis": axis, "data_shape": data_shape})[0],
                    [rand(gshape), idx], native_ops=["gather_elements"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, True), (1, False), ((0, 2), False), (-1, True)], ids=str)
def test_median(axis, keepdims, dtype):
    x = rand((4, 5, 6), dtype, low=-9, high=9)
    compare_engines(lambda t: ops.median(t, axis, keepdims), [x], native_ops=["median"])
    if np.dtype(dtype).kind == "f":
        x[1, 2, 3] = np.nan  # a NaN makes its slices NaN
        compare_engines(lambda t: ops.median(t, axis, keepdims), [x], native_ops=["median"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("reduction", ["sum", "max", "min", "none"])
@pytest.mark.parametrize("case", [((6, 3), (6, 3), 0, 4), ((6, 3), (6,), 0, 5), ((4, 5), (4, 1), 1, 3),
                                  ((5,), (5,), 0, 2)], ids=str)
def test_scatter_reduce(case, reduction, dtype):
    dshape, ishape, axis, size = case
    data = rand(dshape, dtype)
    idx = RNG.integers(-size - 1, size + 1, size=ishape).astype(np.int32)  # repeats reduce; out of range drop
    out_shape = dshape[:axis] + (size,) + dshape[axis + 1:]
    compare_engines(lambda d, i: ops.scatter_reduce(d, i, reduction, axis=axis, axis_size=size), [data, idx],
                    native_ops=["scatter_reduce"])
    compare_engines(lambda d, i, v: ops.scatter_reduce(d, i, reduction, initial_values=v, axis=axis), [
        data, idx, rand(out_shape, dtype)], native_ops=["scatter_reduce"])


@pytest.mark.parametrize("scale", [0, 3, -5])
@pytest.mark.parametrize("fmt", [popxl.float8_143, popxl.float8_152])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # beyond-range inputs are the point
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pow2scale_fp8_casts_are_bit_identical(dtype, fmt, scale):
    limit = 240.0 if fmt is popxl.float8_143 else 57344.0
    x = np.clip(RNG.standard_normal(500) * np.exp(RNG.uniform(-12, 12, 500)), -6e4, 6e4).astype(dtype)
    x[:6] = [0.0, -0.0, np.nan, limit, -limit * 2, 1e-9]
    s = np.array(scale, np.int32)
    compare_engines(lambda t, l: ops.pow2scale_cast_to_fp8(t, l, fmt), [x, s], native_ops=["pow2scale_cast_to_fp8"])
    compare_engines(lambda t, l: ops.pow2scale_cast_from_fp8(ops.pow2scale_cast_to_fp8(t, l, fmt), l * -1,
                                                             popxl.dtypes.from_numpy(np.dtype(dtype))),
                    [x, s], native_ops=["pow2scale_cast_to_fp8", "pow2scale_cast_from_fp8"])


@pytest.mark.parametrize("fmts", [(popxl.float8_143, popxl.float8_143), (popxl.float8_152, popxl.float8_143)], ids=str)
@pytest.mark.parametrize("scale", [0, -3])
def test_pow2scaled_matmul_and_conv(fmts, scale):
    tol = dict(rtol=2e-3, atol=2e-3)
    s = np.array(scale, np.int32)
    zero = np.array(0, np.int32)

    def to8(t, z, fmt):
        return ops.pow2scale_cast_to_fp8(t, z, fmt)
    a, b = rand((3, 5, 4), np.float32, -4, 4), rand((4, 6), np.float32, -4, 4)
    compare_engines(lambda x, y, l, z: ops.matmul_pow2scaled(to8(x, z, fmts[0]), to8(y, z, fmts[1]), l), [a, b, s, zero],
                    native_ops=["matmul_pow2scaled"], **tol)
    x, w = rand((2, 4, 7, 6), np.float32, -4, 4), rand((6, 2, 3, 3), np.float32, -4, 4)
    compare_engines(lambda t, k, l, z: ops.conv_pow2scaled(to8(t, z, fmts[0]), to8(k, z, fmts[1]), l, (1, 2),
                                                           (1, 1, 0, 1), (1, 1), 2),
                    [x, w, s, zero], native_ops=["conv_pow2scaled"], **tol)
    wt = rand((4, 3, 2, 2), np.float32, -4, 4)
    compare_engines(lambda t, k, l, z: ops.conv_transpose_pow2scaled(to8(t, z, fmts[0]), to8(k, z, fmts[1]), l,
                                                                     (2, 2), (0, 0, 0, 0), (1, 1), 1),
                    [x, wt, s, zero], native_ops=["conv_transpose_pow2scaled"], **tol)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the reference's x ** 3 at the ends
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # its inf * 0 at -inf
@pytest.mark.parametrize("name", ["gelu", "gelu_grad"])
def test_gelu_over_the_whole_float32_range(name):
    # the native float32 gelu uses its own vectorised exp: check the tails (underflow, overflow of
    # exp), the infinities, NaN and a row long enough for the vector loop and its remainder
    x = np.concatenate([np.linspace(-120, 120, 2001), [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    tol = dict(rtol=2e-6, atol=1e-6) if name == "gelu" else dict(rtol=1e-5, atol=1e-5)
    if name == "gelu":
        compare_engines(lambda a: ops.gelu(a), [x], native_ops=["gelu"], **tol)
    else:
        g = np.ones_like(x)
        compare_engines(lambda a, b: create_op("gelu_grad", [a, b, ops.gelu(b)])[0], [g, x], native_ops=["gelu_grad"],
                        **tol)


# The ops whose work is a libm call per value (native/src/kernels/vec_math.hpp, Libm), as float64
# formulas: the truth a float32 result is measured against. sigmoid and swish are their float32
# formulas around the float64 exp rounded once (as both engines compute them, e**-x is infinite
# below x = -88.7, so they give 0 there).
def _exp_neg(x):
    return np.exp(-x).astype(np.float32)


_erf = np.vectorize(math.erf, otypes=[np.float64])


LIBM_OPS = {
    "exp": np.exp, "log": np.log, "log2": np.log2, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
    "sigmoid": lambda x: np.float32(1) / (np.float32(1) + _exp_neg(x)),
    "swish": lambda x: x.astype(np.float32) / (np.float32(1) + _exp_neg(x)),
    "geluerf": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),
    "geluerf_grad": lambda x: 0.5 * (1.0 + _erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi),
}
LIBM_BUILD = {"geluerf_grad": lambda t, g: create_op("geluerf_grad", [g, t])[0]}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the truth's exp overflows, log of negatives
@pytest.mark.parametrize("name", list(LIBM_OPS))
def test_libm_ops_over_the_whole_float32_range(name):
    """Within 8 float32 ulps of the float64 truth everywhere (geluerf: plus |x| 2**-21 where 1 + erf
    cancels; geluerf_grad: plus 2**-21 where its two terms cancel), the truth's NaNs, infinities
    and zeros exactly, and the same bits from a strided view as from a dense row (eight at a time,
    then a padded remainder)."""
    rng = np.random.default_rng(7)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1e-30, 88.7, 89.0, -87.5, -104.0, -200.0,
               1e5, -1e5, 1e30, 1.0, -1.0, 0.5]
    mags = 10.0 ** rng.uniform(-8, 4, 3 * 613 - len(special))
    x = np.concatenate([special, mags * rng.choice([-1.0, 1.0], mags.size)]).astype(np.float32)
    build = LIBM_BUILD.get(name, lambda t, g: getattr(elementwise, name)(t))
    ones = np.ones((3, 613), np.float32)  # the incoming gradient of geluerf_grad
    (dense,), eng = run_program(build, [x.reshape(3, 613), ones], "native")
    assert name not in eng.fallback_ops
    (strided,), _ = run_program(lambda t, g: build(ops.transpose_(t), g), [x.reshape(3, 613).T.copy(), ones],
                                "native")
    np.testing.assert_array_equal(dense.view(np.int32), strided.view(np.int32))
    truth = LIBM_OPS[name](x.astype(np.float64)).astype(np.float32)
    got = dense.reshape(-1)
    exact = ~np.isfinite(truth) | (truth == 0)
    np.testing.assert_array_equal(got[exact], truth[exact])
    err = np.abs(got[~exact].astype(np.float64) - truth[~exact])
    allowed = 8 * np.spacing(np.abs(truth[~exact])).astype(np.float64)
    if name == "geluerf":
        allowed += np.abs(x[~exact]) * 2.0**-21
    if name == "geluerf_grad":
        allowed += 2.0**-21
    worst = np.argmax(err - allowed)
    assert err[worst] <= allowed[worst], (name, x[~exact][worst], got[~exact][worst], truth[~exact][worst])


# Float16 rows are converted eight values at a time and computed in float a chunk (256 values) at a
# time: rows longer than a chunk, with vector remainders, broadcast operands and strided views.
F16_ROW_CASES = {
    "gelu": lambda a, b: ops.gelu(a),
    "gelu_grad": lambda a, b: create_op("gelu_grad", [b, a, ops.gelu(a)])[0],
    "add": lambda a, b: a + b,
    "mul_by_row": lambda a, b: a * b[0:1],
    "sub_scalar": lambda a, b: a - popxl.constant(np.float16(0.75)),
    "div_of_strided_view": lambda a, b: ops.transpose(ops.transpose(a) / ops.transpose(b)),
    "sum_last_axis": lambda a, b: ops.sum(a, -1),
    "sum_leading_axis": lambda a, b: ops.sum(a, 0),
    "max_last_axis": lambda a, b: ops.max(a, -1),
    "softmax": lambda a, b: ops.softmax(a, -1),
    "softmax_grad": lambda a, b: create_op("softmax_grad", [b, ops.softmax(a, -1)], {"axis": 1})[0],
    "layer_norm": lambda a, b: ops.layer_norm(a, b[0], b[1]),
    "cast": lambda a, b: ops.cast(ops.cast(a, popxl.float32) * 3.0, popxl.float16),
    "clip": lambda a, b: ops.clip(a, -1.0, 2.0),
    "scaled_add": lambda a, b: ops.scaled_add(a, b, 0.5, -0.25),
}


# float16 ulps (of the reference value) the native result may be off: both engines compute in float32
# and round once, so arithmetic and data movement agree exactly; exp-based ops and sums taken in
# another order can round the other way; layer norm's (x - mean) cancels, which magnifies that.
F16_ROW_ULPS = {"gelu": 2, "gelu_grad": 2, "softmax": 2, "softmax_grad": 2, "layer_norm": 8}


@pytest.mark.parametrize("case", list(F16_ROW_CASES))
def test_float16_rows_longer_than_a_staging_chunk(case):
    a, b = rand((5, 613), np.float16), rand((5, 613), np.float16)
    op = {"mul_by_row": "mul", "sub_scalar": "sub", "div_of_strided_view": "div", "sum_last_axis": "sum",
          "sum_leading_axis": "sum", "max_last_axis": "max"}.get(case, case)
    want, _ = run_program(F16_ROW_CASES[case], [a, b], "reference")
    got, eng = run_program(F16_ROW_CASES[case], [a, b], "native")
    assert op not in eng.fallback_ops
    for w, g in zip(want, got):
        assert g.dtype == w.dtype == np.float16 and g.shape == w.shape
        ulps = np.abs(g.astype(np.float64) - w.astype(np.float64)) / np.spacing(np.abs(w)).astype(np.float64)
        assert ulps.max() <= F16_ROW_ULPS.get(case, 0), (case, ulps.max())


def test_float16_sums_are_rounded_once():
    # 1 + 2**-11 + 2**-24: just above the float16 tie between 1 and 1 + 2**-10, but a float32
    # tie, so rounding to float32 and then to float16 would give 1. The native sum rounds once.
    row = np.array([1.0, 2.0**-11, 2.0**-24] + [0.0] * 13, np.float16)
    x = np.stack([row, -row, row[::-1].copy()])
    leading = x.T.copy().reshape(2, 8, 3)  # the columns summed over two leading axes (RowSum)
    got, eng = run_program(lambda a, b: (ops.sum(a, -1), ops.sum(ops.transpose(a), 0), ops.sum(b, (0, 1))),
                           [x, leading], "native")
    assert "sum" not in eng.fallback_ops
    for y in got:
        np.testing.assert_array_equal(y, np.array([1 + 2.0**-10, -(1 + 2.0**-10), 1 + 2.0**-10], np.float16))


def test_kernels_share_one_scratch_region():
    """Float16 staging (of contiguous and strided operands), conv operands reordered into oneDNN's
    blocked layouts and oneDNN scratchpads all live in one engine-owned region that every kernel
    uses in turn: it must hold the largest kernel's pieces at once, and kernels that run one
    after another on it (twice here, so stale bytes from another kernel are in it) still agree
    with the reference."""
    a, b = rand((24, 40), np.float16), rand((24, 16), np.float16)
    x, w = rand((2, 8, 12, 12)), rand((16, 8, 3, 3))

    def build(a, b, x, w):
        conv = lambda x, w: ops.conv(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1)  # noqa: E731
        y = ops.matmul(ops.transpose_(a), b)  # a strided float16 operand: packed, then staged
        return y, conv(x, w), ops.matmul(ops.transpose_(a), b * 2), conv(x, w * 2)

    compare_engines(build, [a, b, x, w], native_ops=["matmul", "conv"], rtol=5e-3, atol=5e-3)
    _, eng = run_program(build, [a, b, x, w], "native")
    staged = (a.nbytes + a.size * 4) + b.size * 4 + 40 * 16 * 4  # a packed + as float32, b, y as float32
    assert eng.scratch_bytes >= staged


# ---- matmul_bias (lowering fuses x @ W + b into it) ---------------------------------------------------
MATMUL_BIAS_CASES = [((5, 7), (7, 3), (3,)), ((300, 64), (64, 200), (200,)),  # bands of rows
                     ((64, 64), (64, 300), (1, 300)),  # bands of columns
                     ((4, 30, 16), (16, 24), (24,)),  # a batch (oneDNN: small matrices)
                     ((2000, 40), (40, 10), (10,)),  # a thin side (oneDNN)
                     ((3, 0), (0, 4), (4,))]  # no terms: the bias alone


@pytest.mark.parametrize("case", MATMUL_BIAS_CASES, ids=str)
def test_matmul_bias(case):
    a_shape, b_shape, bias_shape = case
    a, b, bias = rand(a_shape), rand(b_shape), rand(bias_shape)
    # The engines sum the products in different orders: a float32 result that cancels to near 0
    # keeps an error on the scale of its terms' magnitudes (seen: 1.2e-5 with K = 64), not of itself.
    terms = float((np.abs(a) @ np.abs(b)).max()) if a.size and b.size else 0.0
    compare_engines(lambda x, w, c: create_op("matmul_bias", [x, w, c])[0], [a, b, bias], native_ops=["matmul_bias"],
                    rtol=1e-5, atol=max(1e-5, 1e-6 * terms))


def test_matmul_bias_of_strided_views():
    a, b, bias = rand((40, 30)), rand((50, 40)), rand((2, 50))
    compare_engines(lambda x, w, c: create_op("matmul_bias", [ops.transpose_(x), ops.transpose_(w),
                                                              ops.slice_(c, start=1, stop=2, axis=0)])[0],
                    [a, b, bias], native_ops=["matmul_bias"], rtol=1e-5, atol=1e-5)


# ---- vectorised rows --------------------------------------------------------------------------------
def _special_values(n):
    """Random values over gelu's whole range, with NaN, infinities, huge and tiny values mixed in."""
    x = RNG.uniform(-30, 30, size=n).astype(np.float32)
    x[:9] = [np.nan, np.inf, -np.inf, -100.0, 100.0, 0.0, -0.0, 1e-30, -1e-30]
    return x


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference multiplies infinities by 0
@pytest.mark.parametrize("name", ["gelu", "gelu_grad"])
def test_gelu_vector_rows_match_the_scalar_form(name):
    """Dense float32 rows go through an eight-wide kernel, strided ones through the scalar form:
    the two agree bit for bit (and with the reference within rounding)."""
    x, g = _special_values(4099), RNG.uniform(-2, 2, size=4099).astype(np.float32)
    pairs = [np.stack([v, np.zeros_like(v)], axis=1) for v in (x, g)]  # (4099, 2): column 0 is v

    def both(xx, gg, xx2, gg2):
        xs, gs = (ops.slice_(t, start=[0, 0], stop=[4099, 1]) for t in (xx2, gg2))  # a stride of 2 values
        if name == "gelu":
            return ops.gelu(xx), ops.gelu(xs)
        return (create_op("gelu_grad", [gg, xx, ops.gelu(xx)], {})[0],
                create_op("gelu_grad", [gs, xs, ops.gelu(xs)], {})[0])
    dense, scalar = run_program(both, [x, g, *pairs], "native")[0]
    np.testing.assert_array_equal(dense, scalar.reshape(-1))
    # gelu_grad's gate is gelu(x) / x: gelu(x)'s rounding, amplified up to ~20x around x = 4.7,
    # leaves gelu'(x) within ~4e-6 of exact (gelu_grad_row; |g| <= 2 here)
    compare_engines(both, [x, g, *pairs], native_ops=[name], rtol=2e-6, atol=1e-6 if name == "gelu" else 8e-6)


# ---- resampling: interpolate (ONNX Resize) and roi_align ------------------------------------------------
COORD_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# rank 5: an untouched axis, a length-1 axis upsampled, a resize to the same length (scale != 1),
# upsampling and downsampling
RESIZE_SHAPE, RESIZE_SCALES = (2, 1, 5, 4, 7), (1.0, 3.0, 1.1, 2.3, 0.6)
# the gradients sum in another order than the reference's BLAS contractions
GRAD_TOL = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=1e-6, atol=1e-6),
            np.float16: dict(rtol=1e-3, atol=1e-3)}


def _resized(shape, scales):
    return tuple(int(np.floor(d * f)) for d, f in zip(shape, scales))


def _interpolate(scales, mode, nearest_mode="round_prefer_floor", coords="half_pixel"):
    return lambda t: ops.interpolate(t, scales, mode, nearest_mode, coords)


def _interpolate_grad(scales, mode, nearest_mode="round_prefer_floor", coords="half_pixel"):
    attrs = {"scale_factor": tuple(scales), "mode": mode, "nearest_mode": nearest_mode,
             "coordinate_transformation_mode": coords}
    return lambda x, g: create_op("interpolate_grad", [x, g], attrs)[0]


@pytest.mark.parametrize("coords", COORD_MODES)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.int64])
def test_interpolate_nearest_is_bit_identical(dtype, nearest_mode, coords):
    x = rand(RESIZE_SHAPE, dtype, 0, 100)
    compare_engines(_interpolate(RESIZE_SCALES, "nearest", nearest_mode, coords), [x], native_ops=["interpolate"])
    if np.dtype(dtype).kind == "f":
        g = rand(_resized(RESIZE_SHAPE, RESIZE_SCALES), dtype)
        compare_engines(_interpolate_grad(RESIZE_SCALES, "nearest", nearest_mode, coords), [x, g],
                        native_ops=["interpolate_grad"], **GRAD_TOL[dtype])


@pytest.mark.parametrize("coords", COORD_MODES)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_interpolate_linear_and_cubic_are_bit_identical(dtype, mode, coords):
    x = rand(RESIZE_SHAPE, dtype)
    compare_engines(_interpolate(RESIZE_SCALES, mode, coords=coords), [x], native_ops=["interpolate"])
    g = rand(_resized(RESIZE_SHAPE, RESIZE_SCALES), dtype)
    compare_engines(_interpolate_grad(RESIZE_SCALES, mode, coords=coords), [x, g], native_ops=["interpolate_grad"],
                    **GRAD_TOL[dtype])


ODD_RESIZES = [((1,), (1.0,)), ((0,), (2.0,)), ((3, 0), (1.5, 2.0)), ((1, 1), (3.0, 0.5)),
               ((4, 1), (0.2, 1.0)), ((2, 0, 3), (1.0, 1.0, 1.7)), ((1, 6), (0.1, 0.2))]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("case", ODD_RESIZES, ids=str)
def test_interpolate_odd_shapes(case, mode):
    shape, scales = case
    x = rand(shape)
    compare_engines(_interpolate(scales, mode, coords="align_corners"), [x], native_ops=["interpolate"])
    compare_engines(_interpolate_grad(scales, mode, coords="align_corners"), [x, rand(_resized(shape, scales))],
                    native_ops=["interpolate_grad"], **GRAD_TOL[np.float32])


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_interpolate_of_a_scalar_is_the_scalar(mode):
    # (the reference kernel cannot run this: np.ascontiguousarray makes its 0-d result 1-d)
    x = rand(())
    out, eng = run_program(_interpolate((), mode), [x], "native")
    assert "interpolate" not in eng.fallback_ops
    np.testing.assert_array_equal(out[0], x)


@pytest.mark.parametrize("mode,dtype", [("nearest", np.float32), ("nearest", np.int16), ("linear", np.float32),
                                        ("cubic", np.float32)], ids=str)
def test_interpolate_of_strided_views(mode, dtype):
    x, scales = rand((5, 4, 3), dtype, 0, 50), (2.0, 0.5, 1.5)  # of the (3, 5, 4) transposed view
    view = lambda t: ops.transpose_(t, (2, 0, 1))  # noqa: E731
    compare_engines(lambda t: _interpolate(scales, mode)(view(t)), [x], native_ops=["interpolate"])
    if dtype == np.float32:  # a strided incoming gradient (6, 2, 6), given transposed
        compare_engines(lambda t, g: _interpolate_grad(scales, mode)(view(t), ops.transpose_(g)),
                        [x, rand((6, 2, 6))], native_ops=["interpolate_grad"], **GRAD_TOL[dtype])


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("fmt", [popxl.float8_143, popxl.float8_152])
def test_interpolate_of_float8_is_bit_identical(fmt, mode):
    # values up to the format's largest, so cubic overshoots it (rounding to the largest or NaN)
    limit = 240.0 if fmt is popxl.float8_143 else 57344.0
    x = rand((4, 9), np.float32, -limit, limit)
    x[0, :4] = [limit, -limit, limit, 0.0]

    def build(t):
        zero = popxl.constant(np.int32(0))
        y = ops.interpolate(ops.pow2scale_cast_to_fp8(t, zero, fmt), (1.7, 2.2), mode)
        return ops.pow2scale_cast_from_fp8(y, zero, popxl.float32)
    compare_engines(build, [x], native_ops=["interpolate"])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference's 0 * inf
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_interpolate_non_finite_values(mode):
    """NaN and inf inputs propagate as in the reference, and a non-finite incoming gradient reaches
    the whole line of its axis, as the reference's dense contraction (0 * inf = NaN) spreads it."""
    x = rand((3, 8))
    x[1, 2], x[2, 5] = np.nan, np.inf
    compare_engines(_interpolate((1.5, 0.6), mode), [x], native_ops=["interpolate"])
    g = rand((4, 19))
    g[1, 2], g[3, 7], g[0, 0] = np.nan, np.inf, -np.inf
    compare_engines(_interpolate_grad((1.5, 2.4), mode), [rand((3, 8)), g], native_ops=["interpolate_grad"],
                    **GRAD_TOL[np.float32])


# Inside the image, large, partly outside, degenerate (made 1x1), past the far edges, wholly
# outside (its samples weigh 0).
ROI_BOXES = np.array([[1, 1, 6, 7], [0.5, 2, 11, 9.5], [-2, -1, 3, 4], [5, 5, 5, 5], [10, 8, 14, 13],
                      [-9, -9, -7, -6]])
ROI_IMAGES = np.array([0, 1, 1, -1, 0, -2], np.int32)  # negative indices count from the end
ROI_TOL = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-6),
           np.float16: dict(rtol=2e-3, atol=2e-3)}


def _roi_align(size, scale, ratio, view=lambda t: t):
    return lambda t, r, b: ops.roi_align(view(t), r, b, size, scale, ratio)


def _roi_align_grad(size, scale, ratio, view=lambda t: t):
    attrs = {"output_size": size, "spatial_scale": scale, "sampling_ratio": ratio}
    return lambda t, r, b, g: create_op("roi_align_grad", [view(t), r, b, g], attrs)[0]


@pytest.mark.parametrize("ratio", [0, 1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_roi_align_and_its_gradient(dtype, ratio):
    img, boxes = rand((2, 3, 10, 12), dtype), ROI_BOXES.astype(dtype)
    for idx_dtype in (np.int32, np.int64):
        compare_engines(_roi_align((3, 2), 0.8, ratio), [img, boxes, ROI_IMAGES.astype(idx_dtype)],
                        native_ops=["roi_align"], **ROI_TOL[dtype])
    g = rand((6, 3, 3, 2), dtype)
    compare_engines(_roi_align_grad((3, 2), 0.8, ratio), [img, boxes, ROI_IMAGES, g], native_ops=["roi_align_grad"],
                    **ROI_TOL[dtype])


@pytest.mark.parametrize("case", [((2, 3, 10, 12), 0, (2, 2)), ((2, 0, 5, 5), 3, (2, 2)), ((1, 2, 1, 1), 2, (1, 1)),
                                  ((1, 2, 4, 3), 1, (5, 1))], ids=str)
def test_roi_align_odd_shapes(case):
    """No boxes, no channels, a 1x1 image and more bins than pixels."""
    shape, boxes, size = case
    img, rois, images = rand(shape), ROI_BOXES[:boxes].astype(np.float32), np.zeros(boxes, np.int32)
    compare_engines(_roi_align(size, 1.0, 2), [img, rois, images], native_ops=["roi_align"], **ROI_TOL[np.float32])
    compare_engines(_roi_align_grad(size, 1.0, 2), [img, rois, images, rand((boxes, shape[1]) + size)],
                    native_ops=["roi_align_grad"], **ROI_TOL[np.float32])


def test_roi_align_of_strided_views():
    img = rand((2, 3, 12, 10))  # seen as (2, 3, 10, 12)
    view = lambda t: ops.transpose_(t, (0, 1, 3, 2))  # noqa: E731
    boxes = ROI_BOXES.astype(np.float32)
    compare_engines(_roi_align((2, 3), 1.0, 0, view), [img, boxes, ROI_IMAGES], native_ops=["roi_align"],
                    **ROI_TOL[np.float32])
    g = rand((6, 3, 3, 2))  # seen as (6, 3, 2, 3)
    compare_engines(lambda t, r, b, gg: _roi_align_grad((2, 3), 1.0, 0, view)(t, r, b, ops.transpose_(gg, (0, 1, 3, 2))),
                    [img, boxes, ROI_IMAGES, g], native_ops=["roi_align_grad"], **ROI_TOL[np.float32])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference's 0 * inf
def test_roi_align_non_finite_values():
    """A NaN pixel spoils the bins that sample it (even with weight 0); a non-finite gradient
    reaches its whole image channel, as in the reference's dense products."""
    img, boxes = rand((2, 2, 10, 12)), ROI_BOXES[:3].astype(np.float32)
    img[0, 1, 2, 2], img[1, 0, 5, 5] = np.nan, np.inf
    compare_engines(_roi_align((3, 2), 1.0, 2), [img, boxes, ROI_IMAGES[:3]], native_ops=["roi_align"],
                    **ROI_TOL[np.float32])
    g = rand((3, 2, 3, 2))
    g[0, 1, 2, 1], g[2, 0, 0, 0] = np.nan, -np.inf
    compare_engines(_roi_align_grad((3, 2), 1.0, 2), [rand((2, 2, 10, 12)), boxes, ROI_IMAGES[:3], g],
                    native_ops=["roi_align_grad"], **ROI_TOL[np.float32])


def _both_raise(build, inputs, error):
    for name in ("reference", "native"):
        with pytest.raises(error):
            run_program(build, inputs, name)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # the reference's NaN index
@pytest.mark.parametrize("grad", [False, True])
def test_roi_align_errors_are_the_reference_errors(grad):
    img, boxes = rand((2, 1, 6, 6)), ROI_BOXES[:2].astype(np.float32)
    g = rand((2, 1, 2, 2))
    run = (lambda r: _roi_align_grad((2, 2), 1.0, r)) if grad else (lambda r: _roi_align((2, 2), 1.0, r))
    extra = [g] if grad else []
    _both_raise(run(0), [img, boxes, np.array([0, 2], np.int32)] + extra, IndexError)  # batch index
    _both_raise(run(0), [img, boxes, np.array([-3, 0], np.int32)] + extra, IndexError)
    _both_raise(run(2), [rand((2, 1, 0, 6)), boxes, np.array([0, 1], np.int32)] + extra, IndexError)  # no rows
    nan_box = boxes.copy()
    nan_box[1, 2] = np.nan
    _both_raise(run(0), [img, nan_box, np.array([0, 1], np.int32)] + extra, ValueError)  # adaptive sampling
    _both_raise(run(2), [img, nan_box, np.array([0, 1], np.int32)] + extra, IndexError)  # NaN sample position


# ---- remote memory -------------------------------------------------------------------------------------
@pytest.mark.parametrize("offset_dtype", [np.uint32, np.int8, np.int64])
@pytest.mark.parametrize("shape", [(2, 3), (), (1,), (0, 4)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint64, np.bool_])
def test_remote_store_and_loads(dtype, shape, offset_dtype):
    """Stores from a tensor and from a strided view, loads into new tensors and in place into a
    tensor and into a strided view, at a constant and at a tensor offset, bit for bit."""
    popxl_dtype = popxl.dtypes.from_numpy(np.dtype(dtype))

    def build(x, y, at):
        with popxl.in_sequence():
            buf = popxl.remote_buffer(shape, popxl_dtype, 3)
            ops.remote_store(buf, 0, x)
            ops.remote_store(buf, at, ops.transpose_(y))
            target, flipped = ops.init(shape, popxl_dtype), ops.init(shape[::-1], popxl_dtype)
            ops.remote_load_(buf, at, target)
            ops.remote_load_(buf, 0, ops.transpose_(flipped))
            return ops.remote_load(buf, 0), ops.remote_load(buf, at), target, flipped

    inputs = [np.asarray(rand(shape, dtype, 0, 100)), np.asarray(rand(shape[::-1], dtype, 0, 100)),
              np.asarray(2, offset_dtype)]
    compare_engines(build, inputs, native_ops=["remote_store", "remote_load", "remote_load_"])


@pytest.mark.parametrize("op", ["remote_load", "remote_load_", "remote_store"])
@pytest.mark.parametrize("offset", [np.int32(-1), np.int32(3), np.int8(-128), np.uint64(2**64 - 1)], ids=repr)
def test_remote_offset_out_of_range_raises_the_reference_error(op, offset):
    def build(x, at):
        buf = popxl.remote_buffer((2,), popxl.float32, 3)
        if op == "remote_load":
            return ops.remote_load(buf, at)
        if op == "remote_load_":
            return ops.remote_load_(buf, at, x)
        ops.remote_store(buf, at, x)
        return x + 0

    messages = []
    for name in ("reference", "native"):
        with pytest.raises(IndexError) as error:
            run_program(build, [rand((2,)), np.asarray(offset)], name)
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    assert messages[1].startswith(f"{op}: offset {int(offset)} is out of range for remote buffer")


def test_remote_code_load_runs_natively():
    def build(x):
        g = x.ir.create_graph(lambda t: t * 2, x)
        ops.remote_code_load(g, "executable")
        return ops.call(g, x)[0]
    compare_engines(build, [rand((3,))], native_ops=["remote_code_load"])


# ---- print_tensor ---------------------------------------------------------------------------------------
def _printed(build, inputs, engine_name, capfd, replication=1):
    capfd.readouterr()
    outs, eng = run_program(build, inputs, engine_name, replication)
    printed = capfd.readouterr()
    assert printed.out == "", f"{engine_name} printed to stdout: PopXL's print_tensor writes to stderr"
    return printed.err, outs, eng


def compare_printed(build, inputs, capfd, replication=1):
    """The text both engines print (to the process's stderr) is identical, and so are the outputs."""
    want, want_outs, _ = _printed(build, inputs, "reference", capfd, replication)
    got, got_outs, eng = _printed(build, inputs, "native", capfd, replication)
    assert "print_tensor" not in eng.fallback_ops
    assert got == want
    for w, g in zip(want_outs, got_outs):
        np.testing.assert_array_equal(g, w)
    return got


def _special_floats(shape, dtype):
    x = np.asarray(rand(shape, dtype) * (10.0 ** RNG.integers(-12, 12, size=shape)).astype(dtype))
    specials = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-310, 1e16, 1e15, 1e-5, 1e-4, 0.125, 2.5])
    n = min(x.size, specials.size)
    x.reshape(-1)[:n] = specials[:n].astype(dtype)
    return x


PRINT_FORMATS = [
    {},  # the defaults: wraps at 75, summarises over 1000 elements
    {"max_line_width": 20, "separator": ",", "open_bracket": "(", "close_bracket": ")"},
    {"max_line_width": 0, "summarise_threshold": 0, "edge_items": 0},  # the last item stays
    {"max_line_width": 1, "summarise_threshold": 30, "edge_items": 1, "separator": ";"},
    {"max_line_width": 200, "summarise_threshold": 10, "edge_items": 5, "separator": "\t"},
    {"digits": 0, "float_format": "auto", "separator": "\u3000"},  # unicode whitespace: stripped at line ends
    {"digits": 3, "float_format": "fixed", "open_bracket": " ", "close_bracket": "\u00a0"},
    {"digits": 17, "float_format": "scientific", "separator": "\u00e9", "open_bracket": "\u27e8"},
    {"float_format": "none", "separator": "]", "open_bracket": "\x1f", "close_bracket": "\x1d"},  # the stand-ins
    {"float_format": "none", "max_line_width": 40, "summarise_threshold": 50, "edge_items": 2},
]
PRINT_SHAPES = [(), (0,), (1,), (7,), (2, 0, 3), (17, 33), (3, 4, 5), (40, 30), (2, 3, 9, 9)]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # float16 infinities on purpose
@pytest.mark.parametrize("fmt", range(len(PRINT_FORMATS)))
@pytest.mark.parametrize("shape", PRINT_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint64, np.int64, np.bool_])
def test_print_tensor_text_is_the_reference_text(dtype, shape, fmt, capfd):
    x = _special_floats(shape, dtype) if np.dtype(dtype).kind == "f" else np.asarray(rand(shape, dtype, -120, 120))
    compare_printed(lambda t: ops.print_tensor(t, "x \u00e9", **PRINT_FORMATS[fmt]), [x], capfd)


@pytest.mark.parametrize("fmt", [popxl.float8_143, popxl.float8_152])
def test_print_tensor_of_float8(fmt, capfd):
    def build(t):
        f8 = ops.pow2scale_cast_to_fp8(t, popxl.constant(np.int32(0)), fmt)
        return ops.print_tensor(f8, "f8", float_format="none")
    compare_printed(build, [rand((5, 13), np.float32, -300, 300)], capfd)


def test_print_tensor_of_strided_views_and_replicas(capfd):
    x = _special_floats((6, 4, 5), np.float32)
    text = compare_printed(lambda t: ops.print_tensor(ops.transpose_(t, (2, 0, 1)), "v", max_line_width=30), [x], capfd)
    assert text.startswith("v: [[[")
    # each replica prints its own values
    compare_printed(lambda t: ops.print_tensor(t, "r"), [rand((2, 3, 4))], capfd, replication=2)


def test_print_tensor_without_print_self_prints_nothing(capfd):
    assert compare_printed(lambda t: ops.print_tensor(t, "quiet", print_self=False) * 2, [rand((3,))], capfd) == ""


def test_print_tensor_interleaves_with_python_output():
    """Text Python holds in sys.stdout's buffer comes out before the engine's print (on stderr,
    here the same pipe). A script whose output goes to a pipe has a block-buffered sys.stdout
    (pytest's capture does not)."""
    script = textwrap.dedent("""
        import numpy as np, popxl, popxl.ops as ops
        ir = popxl.Ir()
        with ir.main_graph:
            ops.print_tensor(popxl.constant(np.array([1, 2, 3], np.int32)), "t")
        session = popxl.Session(ir, "ipu_model")
        assert "print_tensor" not in session._engine.fallback_ops, session._engine.fallback_ops
        with session:
            print("before", end=" ")
            session.run()
            print("between")
            session.run()
            print("after")
        """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # which would unbuffer it
    env["POPXL_ENGINE"] = "native"
    out = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout
    assert out.stdout == "before t: [1 2 3]\nbetween\nt: [1 2 3]\nafter\n"


# ---- copies -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
def test_big_copies_over_threads(dtype):
    """Copies past 256 KB are shared out over the threads: strided ones (a transpose that must
    stay a copy because its result is written) and dense ones (a graph input copied in)."""
    x = rand((300, 501), dtype)

    def build(t):
        moved = ops.transpose(t)                       # (501, 300), written below: a real copy
        ops.add_(moved, popxl.constant(np.ones((501, 300), dtype)))
        g = popxl.gcg().ir.create_graph(lambda u: ops.negate(u) if dtype != np.int8 else u * 2, t)
        return moved, ops.call(g, t)[0]
    got = compare_engines(build, [x])
    np.testing.assert_array_equal(got[0], (x.T + dtype(1)).astype(dtype))


def test_print_tensor_titles_as_popxl(capfd):
    """The default title is ``print_<name>``; the gradient's is ``<title>_gradient``, or
    ``Gradient___<input id>`` when the title is empty (PopART's rule)."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")

        def fwd(t):
            return ops.print_tensor(t, print_gradient=True) * ops.print_tensor(t, "", print_gradient=True)

        graph = ir.create_graph(fwd, x)
        grads = popxl.transforms.autodiff(graph)
        info = ops.call_with_info(graph, x)
        (dx,) = ops.call(grads.graph, popxl.constant(np.ones(2, np.float32)), inputs_dict=grads.inputs_dict(info))
        ops.host_store(popxl.d2h_stream(dx.shape, dx.dtype, "dx"), dx)
    capfd.readouterr()
    with popxl.Session(ir, "ipu_model") as s:
        s.run()
    lines = capfd.readouterr().err.splitlines()
    inner = graph.inputs[0].id
    assert sorted(line.split(":")[0] for line in lines) == sorted(
        ["print_" + graph.inputs[0].name, "", "print_" + graph.inputs[0].name + "_gradient",
         "Gradient___" + inner])
