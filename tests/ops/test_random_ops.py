"""Random ops: the Philox generator against published answers, the bit recipe against an
independent pure-Python model, statistics, determinism and trace-time validation."""
import math

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.ops.random import philox4x32
from engine_harness import run_program

SEED = popxl.create_seeds(42)
SEED2 = popxl.create_seeds(43)


# An independent scalar Philox4x32-10 (Python ints), used to check the recipe bit for bit.
def _philox_py(ctr, key):
    c, k = list(ctr), list(key)
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k[1], p0 & 0xFFFFFFFF]
        k = [(k[0] + 0x9E3779B9) & 0xFFFFFFFF, (k[1] + 0xBB67AE85) & 0xFFFFFFFF]
    return c


def _word(seed, w, purpose):
    j = w // 4
    return _philox_py([j & 0xFFFFFFFF, j >> 32, purpose, 0], [int(seed[0]), int(seed[1])])[w % 4]


KAT = [  # Random123 known-answer vectors for Philox4x32-10
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers(ctr, key, want):
    assert tuple(int(w) for w in philox4x32(ctr, key)) == want
    assert tuple(_philox_py(ctr, key)) == want


def test_philox_vectorised_matches_scalar():
    rng = np.random.default_rng(0)
    ctr = rng.integers(0, 2 ** 32, size=(4, 50), dtype=np.uint64).astype(np.uint32)
    key = (0x12345678, 0xDEADBEEF)
    out = philox4x32(ctr, key)
    for i in range(50):
        assert [int(w) for w in out[:, i]] == _philox_py([int(c) for c in ctr[:, i]], key)


def _run(build, *inputs, engine="reference"):
    out, _ = run_program(build, list(inputs) or [SEED], engine)
    return out


def test_uniform_bits_follow_the_recipe():
    (got,) = _run(lambda s: ops.random_uniform(s, (3, 3), low=-2.0, high=3.0))
    lo, hi = np.float32(-2.0), np.float32(3.0)
    want = [lo + (hi - lo) * np.float32((_word(SEED, i, 0) >> 8) * 2.0 ** -24) for i in range(9)]
    np.testing.assert_array_equal(got, np.array(want, np.float32).reshape(3, 3))
    assert got.dtype == np.float32


def test_normal_bits_follow_the_recipe():
    (got,) = _run(lambda s: ops.random_normal(s, (5,), mean=1.0, std=2.0))
    want = []
    for i in range(5):
        u1 = ((_word(SEED, 2 * i, 1) >> 8) + 1) * 2.0 ** -24
        u2 = (_word(SEED, 2 * i + 1, 1) >> 8) * 2.0 ** -24
        want.append(1.0 + 2.0 * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))
    np.testing.assert_allclose(got, np.array(want, np.float32), rtol=1e-6)


def test_dropout_mask_follows_the_recipe():
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    (got,) = _run(lambda s, t: ops.dropout(t, s, 0.3), SEED, x)
    keep = np.array([(_word(SEED, i, 2) >> 8) >= math.ceil(0.3 * 2 ** 24) for i in range(12)]).reshape(3, 4)
    np.testing.assert_array_equal(got, np.where(keep, x * np.float32(1 / 0.7), 0).astype(np.float32))


def test_split_random_seed_follows_the_recipe():
    got = _run(lambda s: ops.split_random_seed(s, 3))
    for k, g in enumerate(got):
        assert g.dtype == np.uint32 and g.shape == (2,)
        assert list(g) == _philox_py([k, 0, 4, 0], [int(SEED[0]), int(SEED[1])])[:2]


@pytest.mark.parametrize("dtype", [popxl.float32, popxl.float16])
def test_uniform_statistics(dtype):
    (u,) = _run(lambda s: ops.random_uniform(s, (200, 500), low=-1.0, high=3.0, dtype=dtype))
    assert u.dtype == dtype.as_numpy() and u.shape == (200, 500)
    u = u.astype(np.float64)
    assert u.min() >= -1.0 and u.max() <= 3.0
    assert abs(u.mean() - 1.0) < 0.02
    assert abs(u.std() - 4 / math.sqrt(12)) < 0.02
    hist, _ = np.histogram(u, bins=8, range=(-1, 3))
    assert np.all(np.abs(hist / u.size - 1 / 8) < 0.005)


@pytest.mark.parametrize("dtype", [popxl.float32, popxl.float16])
def test_normal_statistics(dtype):
    (z,) = _run(lambda s: ops.random_normal(s, (100000,), mean=-3.0, std=0.5, dtype=dtype))
    assert z.dtype == dtype.as_numpy()
    z = (z.astype(np.float64) + 3.0) / 0.5
    assert np.all(np.isfinite(z))
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1.0) < 0.02
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6827) < 0.01
    assert abs(np.mean(z ** 3)) < 0.05  # symmetric


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_dropout_keep_rate_and_scaling(p):
    x = np.random.default_rng(1).uniform(0.5, 2.0, (300, 300)).astype(np.float32)
    (y,) = _run(lambda s, t: ops.dropout(t, s, p), SEED, x)
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    np.testing.assert_array_equal(y[kept], x[kept] * np.float32(1 / (1 - p)))
    if p == 0.0:
        np.testing.assert_array_equal(y, x)


def test_dropout_float16():
    x = np.ones((64, 64), np.float16)
    (y,) = _run(lambda s, t: ops.dropout(t, s, 0.25), SEED, x)
    assert y.dtype == np.float16
    assert set(np.unique(y)) <= {np.float16(0), np.float16(1 / 0.75)}


def test_shaped_dropout_broadcasts_one_mask():
    x = np.ones((8, 50, 6), np.float32)
    (y,) = _run(lambda s, t: ops.shaped_dropout(t, s, (8, 50, 1), 0.4), SEED, x)
    assert np.all(y == y[:, :, :1])  # whole rows kept or dropped
    rows = y[:, :, 0]
    assert set(np.unique(rows)) <= {0.0, np.float32(1 / 0.6)}
    assert 0.45 < (rows != 0).mean() < 0.75
    (y2,) = _run(lambda s, t: ops.shaped_dropout(t, s, (50, 1), 0.4), SEED, x)  # fewer dims: numpy broadcast
    assert np.all(y2 == y2[:1, :, :1])


def test_same_seed_same_bits_different_seed_different_numbers():
    def build(s):
        return (ops.random_uniform(s, (1000,)), ops.random_normal(s, (1000,)),
                ops.dropout(ops.random_uniform(s, (1000,)) + 1.0, s, 0.5))
    a = _run(build, SEED)
    b = _run(build, SEED.copy())
    c = _run(build, SEED2)
    for x, y, z in zip(a, b, c):
        np.testing.assert_array_equal(x, y)
        assert np.mean(x != z) > 0.4
    # the result does not depend on anything else in the program (e.g. an earlier op)
    (u,) = _run(lambda s: (ops.random_normal(s, (7,)), ops.random_uniform(s, (1000,)))[1], SEED)
    np.testing.assert_array_equal(u, a[0])
    # a prefix of a larger draw is the smaller draw
    (small,) = _run(lambda s: ops.random_uniform(s, (10,)), SEED)
    np.testing.assert_array_equal(small, a[0][:10])


def test_split_random_seed_gives_distinct_streams():
    def build(s):
        s1, s2 = ops.split_random_seed(s)
        s3, s4 = ops.split_random_seed(s1)
        return s1, s2, s3, s4, ops.random_uniform(s1, (100,)), ops.random_uniform(s2, (100,))
    s1, s2, s3, s4, u1, u2 = _run(build)
    seeds = {tuple(x) for x in (SEED, s1, s2, s3, s4)}
    assert len(seeds) == 5
    assert np.mean(u1 != u2) > 0.95
    again = _run(build)
    for x, y in zip((s1, s2, s3, s4, u1, u2), again):
        np.testing.assert_array_equal(x, y)


def test_random_ops_with_seed_variable_and_in_repeat():
    """A seed variable split inside a repeat: each iteration draws different numbers."""
    ir = popxl.Ir()
    with ir.main_graph:
        seed = popxl.variable(SEED, popxl.uint32, name="seed")
        acc = popxl.variable(np.zeros((4,), np.float32), name="acc")

        def step(seed_in: popxl.TensorByRef, acc_in: popxl.TensorByRef):
            new, s1 = ops.split_random_seed(seed_in)
            ops.var_updates.copy_var_update_(seed_in, new)
            ops.var_updates.accumulate_(acc_in, ops.random_uniform(s1, (4,)))

        g = ir.create_graph(step, seed, acc)
        ops.repeat(g, 3, seed, acc)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        got = sess.get_tensor_data(acc)
    want = np.zeros(4, np.float32)
    s = [int(w) for w in SEED]
    for _ in range(3):
        new, s1 = _philox_py([0, 0, 4, 0], s)[:2], _philox_py([1, 0, 4, 0], s)[:2]
        want += np.array([np.float32((_word(s1, i, 0) >> 8) * 2.0 ** -24) for i in range(4)], np.float32)
        s = new
    np.testing.assert_array_equal(got, want)


def test_native_engine_gives_the_same_bits():
    x = np.linspace(-1, 1, 40, dtype=np.float32).reshape(5, 8)

    def build(s, t):
        a, b, c = ops.split_random_seed(s, 3)
        return (ops.random_uniform(a, (5, 8)), ops.random_normal(b, (3,), dtype=popxl.float16),
                ops.dropout(t, c, 0.5), ops.shaped_dropout(t, c, (1, 8), 0.5), a)
    for want, got in zip(_run(build, SEED, x), _run(build, SEED, x, engine="native")):
        np.testing.assert_array_equal(got, want)


def _trace(fn, seed_dtype=popxl.uint32, seed_shape=(2,)):
    ir = popxl.Ir()
    with ir.main_graph:
        seed = popxl.variable(np.zeros(seed_shape, seed_dtype.as_numpy()), seed_dtype)
        x = popxl.variable(np.zeros((4, 3), np.float32))
        return fn(seed, x)


@pytest.mark.parametrize("name,call", [
    ("random_uniform", lambda s, x: ops.random_uniform(s, (2,))),
    ("random_normal", lambda s, x: ops.random_normal(s, (2,))),
    ("dropout", lambda s, x: ops.dropout(x, s, 0.5)),
    ("shaped_dropout", lambda s, x: ops.shaped_dropout(x, s, (4, 1), 0.5)),
    ("split_random_seed", lambda s, x: ops.split_random_seed(s)),
])
@pytest.mark.parametrize("dtype,shape", [(popxl.int32, (2,)), (popxl.uint32, (3,)), (popxl.uint32, (1, 2))])
def test_bad_seed(name, call, dtype, shape):
    with pytest.raises(ValueError, match=f"ops.{name}.*uint32 tensor of shape"):
        _trace(call, dtype, shape)


@pytest.mark.parametrize("name,call,exc,msg", [
    ("dropout", lambda s, x: ops.dropout(x, s, 1.0), ValueError, r"p must be .*\[0, 1\)"),
    ("dropout", lambda s, x: ops.dropout(x, s, -0.1), ValueError, "p must be"),
    ("dropout", lambda s, x: ops.dropout(ops.cast(x, popxl.int32), s, 0.1), TypeError, "float16 or float32"),
    ("shaped_dropout", lambda s, x: ops.shaped_dropout(x, s, (4, 1), 1.5), ValueError, "ratio must be"),
    ("shaped_dropout", lambda s, x: ops.shaped_dropout(x, s, (2, 3), 0.5), ValueError, "does not broadcast"),
    ("shaped_dropout", lambda s, x: ops.shaped_dropout(x, s, (4, 0), 0.5), ValueError, "positive"),
    ("random_uniform", lambda s, x: ops.random_uniform(s, (2, -1)), ValueError, "positive"),
    ("random_uniform", lambda s, x: ops.random_uniform(s, (2,), dtype=popxl.float64), TypeError, "float16 or"),
    ("random_normal", lambda s, x: ops.random_normal(s, (2, 0)), ValueError, "positive"),
    ("random_normal", lambda s, x: ops.random_normal(s, (2,), dtype=popxl.int32), TypeError, "float16 or"),
    ("split_random_seed", lambda s, x: ops.split_random_seed(s, 0), ValueError, "positive int"),
])
def test_bad_arguments(name, call, exc, msg):
    with pytest.raises(exc, match=f"ops.{name}: .*{msg}"):
        _trace(call)


def test_trace_shapes_and_int_shape():
    def fn(s, x):
        u = ops.random_uniform(s, 5, dtype=popxl.float16)
        assert u.shape == (5,) and u.dtype == popxl.float16
        n = ops.random_normal(s, [2, 3])
        assert n.shape == (2, 3) and n.dtype == popxl.float32
        seeds = ops.split_random_seed(s, 4)
        assert isinstance(seeds, tuple) and len(seeds) == 4
        assert all(t.shape == (2,) and t.dtype == popxl.uint32 for t in seeds)
        d = ops.dropout(x, s, 0.5)
        assert d.shape == x.shape and d.dtype == x.dtype
    _trace(fn)


def test_grad_decisions():
    from popxl.op import REGISTRY, Grad
    for name in ("random_uniform", "random_normal", "split_random_seed"):
        assert REGISTRY[name].grad == Grad.STOP
    for name in ("dropout", "shaped_dropout"):
        assert REGISTRY[name].grad is None or callable(REGISTRY[name].grad)
