"""Native kernels against the NumPy reference kernels, op family by op family: var updates,
random ops (bit for bit), data movement, normalisations and losses, index reductions and
oneDNN convolution/pooling. Each test also asserts the op ran natively (no Python fallback)."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.ops import var_updates as vu
from engine_harness import compare_engines

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
