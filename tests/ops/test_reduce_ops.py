"""argmax, argmin, cumsum, topk, histogram, lamb_square through popxl.Session, against NumPy."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.op import REGISTRY, Grad
from tests.engine_harness import run_program

RNG = np.random.RandomState(7)
X = RNG.randn(3, 1, 4).astype(np.float32)
XI = RNG.randint(-5, 6, size=(2, 5)).astype(np.int32)


def _run(build, inputs, engine="native"):
    return run_program(build, inputs, engine)[0]


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("dim,keep", [(0, False), (2, False), (-1, True), (1, True), (None, False), (None, True)])
def test_argmax_argmin(engine, dim, keep):
    amax, amin = _run(lambda t: [ops.argmax(t, dim, keep), ops.argmin(t, dim, keep)], [X], engine)
    if dim is None:
        want_max = np.array(np.argmax(X)).reshape([1] * 3 if keep else [])
        want_min = np.array(np.argmin(X)).reshape([1] * 3 if keep else [])
    else:
        want_max = np.expand_dims(X.argmax(dim), dim) if keep else X.argmax(dim)
        want_min = np.expand_dims(X.argmin(dim), dim) if keep else X.argmin(dim)
    assert amax.dtype == np.int32 and amin.dtype == np.int32
    np.testing.assert_array_equal(amax, want_max)
    np.testing.assert_array_equal(amin, want_min)


def test_argmax_ties_integer_and_scalar():
    t = np.array([[1, 3, 3], [2, 2, 0]], np.int16)
    a, b, s = _run(lambda x: [ops.argmax(x, 1), ops.argmin(x, 1), ops.argmax(x[0, 0])], [t])
    np.testing.assert_array_equal(a, [1, 0])  # first of equal values
    np.testing.assert_array_equal(b, [0, 2])
    assert s.shape == () and s == 0


def test_argmax_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="ops.argmax.*out of range"):
            ops.argmax(t, 2)
        b = popxl.variable(np.zeros((2,), bool))
        with pytest.raises(TypeError, match="ops.argmin.*numeric"):
            ops.argmin(b)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_cumsum(engine):
    c0, c2, cn, ci, cs = _run(lambda x, xi: [ops.cumsum(x), ops.cumsum(x, -1), ops.cumsum(x, None),
                                             ops.cumsum(xi, 1), ops.cumsum(x[0, 0, 0])], [X, XI], engine)
    np.testing.assert_allclose(c0, np.stack([X[:k + 1].sum(0) for k in range(3)]), rtol=1e-6)
    want = np.zeros_like(X)
    acc = np.zeros(X.shape[:2], np.float32)
    for k in range(X.shape[2]):
        acc = acc + X[..., k]
        want[..., k] = acc
    np.testing.assert_allclose(c2, want, rtol=1e-6)
    np.testing.assert_allclose(cn, np.cumsum(X.ravel()), rtol=1e-6)
    assert ci.dtype == np.int32
    np.testing.assert_array_equal(ci, np.cumsum(XI, axis=1))
    assert cs.shape == () and cs == X[0, 0, 0]


def test_cumsum_float16_accumulates_wide():
    x = np.full((4096,), 0.1, np.float16)
    (c,) = _run(lambda t: [ops.cumsum(t)], [x])
    assert c.dtype == np.float16
    assert abs(float(c[-1]) - 409.6) < 0.5


def _topk_numpy(x, k, axis, largest):
    """Independent formula: python sort per lane with (value, index) keys."""
    x = np.moveaxis(x, axis, -1)
    vals = np.empty(x.shape[:-1] + (k,), x.dtype)
    idxs = np.empty(x.shape[:-1] + (k,), np.int32)
    for pos in np.ndindex(*x.shape[:-1]):
        lane = list(enumerate(x[pos].tolist()))
        lane.sort(key=lambda p: ((-p[1] if largest else p[1]), p[0]))
        idxs[pos] = [i for i, _ in lane[:k]]
        vals[pos] = [v for _, v in lane[:k]]
    return np.moveaxis(vals, -1, axis), np.moveaxis(idxs, -1, axis)


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("axis,k,largest", [(2, 2, True), (-1, 4, False), (0, 1, True), (1, 1, False)])
def test_topk_sorted(engine, axis, k, largest):
    v, i = _run(lambda t: list(ops.topk(t, k, axis, largest, True)), [X], engine)
    wv, wi = _topk_numpy(X, k, axis, largest)
    assert v.shape == wv.shape and i.dtype == np.int32
    np.testing.assert_array_equal(v, wv)
    np.testing.assert_array_equal(i, wi)


def test_topk_ties_ints_and_unsorted():
    x = np.array([[5, 1, 5, 3, 5]], np.int32)
    v, i, uv, ui = _run(lambda t: [*ops.topk(t, 2, 1, True, True), *ops.topk(t, 3, 1, False, False)], [x])
    np.testing.assert_array_equal(v, [[5, 5]])
    np.testing.assert_array_equal(i, [[0, 2]])
    # unsorted: the 3 smallest (1, 3 and the first 5), returned in index order
    np.testing.assert_array_equal(ui, [[0, 1, 3]])
    np.testing.assert_array_equal(uv, [[5, 1, 3]])


def test_topk_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="ops.topk.*k=4"):
            ops.topk(t, 4, 1, True, True)
        with pytest.raises(ValueError, match="ops.topk.*out of range"):
            ops.topk(t, 1, 3, True, True)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_histogram(engine):
    x = np.array([[-3.0, -1.0, -0.5, 0.0], [0.5, 1.0, 2.0, 7.0]], np.float32)
    levels = [-1.0, 0.0, 1.5]
    h, ha = _run(lambda t: [ops.histogram(t, levels, False), ops.histogram(t, levels, True)], [x], engine)
    assert h.dtype == np.uint32 and h.shape == (4,)
    edges = [-np.inf] + levels + [np.inf]

    def count(v):
        return [int(np.sum((v >= lo) & (v < hi))) for lo, hi in zip(edges[:-1], edges[1:])]

    np.testing.assert_array_equal(h, count(x))
    np.testing.assert_array_equal(ha, count(np.abs(x)))
    assert h.sum() == x.size


def test_histogram_integer_input_and_errors():
    (h,) = _run(lambda t: [ops.histogram(t, [0.0], False)], [XI])
    np.testing.assert_array_equal(h, [np.sum(XI < 0), np.sum(XI >= 0)])
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="ops.histogram.*strictly increasing"):
            ops.histogram(t, [0.0, 0.0, 1.0], False)
        with pytest.raises(ValueError, match="ops.histogram.*strictly increasing"):
            ops.histogram(t, [2.0, 1.0], False)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_lamb_square(engine):
    x16 = X.astype(np.float16)
    a, b, c = _run(lambda t, ti, th: [ops.lamb_square(t), ops.lamb_square(ti), ops.lamb_square(th)],
                   [X, XI, x16], engine)
    for out, src in ((a, X), (b, XI), (c, x16)):
        assert out.shape == () and out.dtype == np.float32
        np.testing.assert_allclose(out, sum(float(v) ** 2 for v in src.ravel()), rtol=1e-5)


def test_gradient_decisions():
    for name in ("argmax", "argmin", "histogram", "lamb_square"):
        assert REGISTRY[name].grad == Grad.STOP
    for name in ("cumsum", "topk"):
        assert callable(REGISTRY[name].grad), name
