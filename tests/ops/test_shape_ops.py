"""split, concat_, scatter, scatter_reduce, dynamic_slice/update(_), groupedgather, tied_gather, onehot,
interpolate through popxl.Session, against independent NumPy formulas."""
import itertools
import math

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.op import REGISTRY, Grad
from tests.engine_harness import run_program

RNG = np.random.RandomState(3)
X = RNG.randn(4, 1, 6).astype(np.float32)


def _run(build, inputs, engine="native"):
    return run_program(build, inputs, engine)[0]


def _traced(fn):
    """Run ``fn(make)`` while tracing, ``make(array)`` giving a variable."""
    ir = popxl.Ir()
    with ir.main_graph:
        return fn(lambda a: popxl.variable(np.asarray(a)))


# split / concat_ ------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["native", "reference"])
def test_split(engine):
    outs = _run(lambda t: [*ops.split(t, 2), *ops.split(t, [1, 0, 5], -1)], [X], engine)
    assert [o.shape for o in outs] == [(2, 1, 6), (2, 1, 6), (4, 1, 1), (4, 1, 0), (4, 1, 5)]
    np.testing.assert_array_equal(outs[0], X[:2])
    np.testing.assert_array_equal(outs[1], X[2:])
    np.testing.assert_array_equal(outs[2], X[..., :1])
    np.testing.assert_array_equal(outs[4], X[..., 1:])


def test_split_errors_and_return_type():
    def body(v):
        t = v(X)
        assert isinstance(ops.split(t, 4), list)
        with pytest.raises(ValueError, match="ops.split.*3 equal parts"):
            ops.split(t, 3)
        with pytest.raises(ValueError, match="ops.split.*add up"):
            ops.split(t, [1, 2], 2)
        with pytest.raises(ValueError, match="ops.split.*out of range"):
            ops.split(t, 1, 3)
    _traced(body)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_concat_inplace_variant(engine):
    y = RNG.randint(0, 9, (4, 2, 6)).astype(np.float32)
    (c,) = _run(lambda a, b: [ops.concat_([a, b], axis=-2)], [X, y], engine)
    np.testing.assert_array_equal(c, np.concatenate([X, y], 1))
    with pytest.raises(TypeError, match="ops.concat_: All inputs to a concat operation must have the same type: got float32, int32"):
        _traced(lambda v: ops.concat_([v(X), v(y.astype(np.int32))]))


# scatter --------------------------------------------------------------------------------------------
def _scatter_numpy(t, idx, vals, axis):
    out = t.copy()
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[axis] = idx[pos] % t.shape[axis]
        out[tuple(target)] = vals[pos]
    return out


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter(engine, axis):
    t = np.arange(20, dtype=np.int32).reshape(4, 5)
    idx = np.array([[1, 0, 3], [2, -1, 0]], np.int32) if axis == 0 else np.array([[4, 0, 2], [1, 3, -2]], np.int16)
    vals = -np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    (out,) = _run(lambda a, i, v: [ops.scatter(a, i, v, axis)], [t, idx, vals], engine)
    np.testing.assert_array_equal(out, _scatter_numpy(t, idx, vals, axis % 2))


def test_scatter_errors():
    def body(v):
        t = v(np.zeros((3, 3), np.float32))
        with pytest.raises(ValueError, match="ops.scatter.*same shape"):
            ops.scatter(t, v(np.zeros((2, 2), np.int32)), v(np.zeros((2, 3), np.float32)))
        with pytest.raises(TypeError, match="ops.scatter.*dtype"):
            ops.scatter(t, v(np.zeros((2, 2), np.int32)), v(np.zeros((2, 2), np.int32)))
        with pytest.raises(TypeError, match="ops.scatter.*integer"):
            ops.scatter(t, v(np.zeros((2, 2), np.float32)), v(np.zeros((2, 2), np.float32)))
    _traced(body)


# scatter_reduce -------------------------------------------------------------------------------------
def _scatter_reduce_numpy(data, idx, reduction, init, axis, size):
    """Loop formula. ``idx`` already has data's shape."""
    shape = list(data.shape)
    shape[axis] = size
    out = np.zeros(shape, data.dtype) if init is None else init.copy()
    seen = set()
    for pos in np.ndindex(*data.shape):
        tgt = list(pos)
        tgt[axis] = idx[pos]
        tgt = tuple(tgt)
        v = data[pos]
        first = init is None and tgt not in seen
        seen.add(tgt)
        if reduction == "none" or first:
            out[tgt] = v
        elif reduction == "sum":
            out[tgt] += v
        elif reduction == "max":
            out[tgt] = max(out[tgt], v)
        else:
            out[tgt] = min(out[tgt], v)
    return out


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("reduction", ["sum", "max", "min", "none"])
def test_scatter_reduce_elementwise_indices(engine, reduction):
    data = RNG.randn(5, 3).astype(np.float32)
    idx = np.array([[0, 2, 1], [3, 3, 1], [0, 0, 0], [2, 1, 3], [0, 2, 2]], np.int32)
    init = RNG.randn(4, 3).astype(np.float32)
    a, b = _run(lambda d, i, iv: [ops.scatter_reduce(d, i, reduction, axis_size=4),
                                  ops.scatter_reduce(d, i, reduction, initial_values=iv)], [data, idx, init], engine)
    np.testing.assert_allclose(a, _scatter_reduce_numpy(data, idx, reduction, None, 0, 4), rtol=1e-6)
    np.testing.assert_allclose(b, _scatter_reduce_numpy(data, idx, reduction, init, 0, 4), rtol=1e-6)


def test_scatter_reduce_broadcast_indices_axis1_int():
    data = RNG.randint(-9, 9, (2, 4, 3)).astype(np.int32)
    idx = np.array([1, 0, 1, 1], np.int32)  # one target per position along axis 1
    (out,) = _run(lambda d, i: [ops.scatter_reduce(d, i, "max", axis=1, axis_size=3)], [data, idx])
    full = np.broadcast_to(idx.reshape(1, 4, 1), data.shape)
    np.testing.assert_array_equal(out, _scatter_reduce_numpy(data, full, "max", None, 1, 3))
    assert (out[:, 2] == 0).all()  # never written


def test_scatter_reduce_errors():
    def body(v):
        d = v(np.zeros((4, 3), np.float32))
        i = v(np.zeros((4, 3), np.int32))
        with pytest.raises(ValueError, match="ops.scatter_reduce.*initial_values or axis_size"):
            ops.scatter_reduce(d, i, "sum")
        with pytest.raises(ValueError, match="ops.scatter_reduce.*reduction must be one of"):
            ops.scatter_reduce(d, i, "mean", axis_size=2)
        with pytest.raises(ValueError, match="ops.scatter_reduce.*enable_index_broadcast"):
            ops.scatter_reduce(d, v(np.zeros((4,), np.int32)), "sum", axis_size=2, enable_index_broadcast=False)
        with pytest.raises(ValueError, match="ops.scatter_reduce.*initial_values has shape"):
            ops.scatter_reduce(d, i, "sum", initial_values=v(np.zeros((2, 2), np.float32)))
    _traced(body)


# dynamic_slice / dynamic_update ---------------------------------------------------------------------
T3 = np.arange(4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3)


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("offsets", [[1, 2], [0, 0], [3, 4], [100, 7]])
def test_dynamic_slice(engine, offsets):
    off = np.array(offsets, np.uint32)
    (out,) = _run(lambda t, i: [ops.dynamic_slice(t, i, [0, -2], [2, 3], False)], [T3, off], engine)
    a = min(offsets[0], 4 - 2)  # clamped so the region stays inside
    b = min(offsets[1], 5 - 3)
    np.testing.assert_array_equal(out, T3[a:a + 2, b:b + 3, :])


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_dynamic_update_and_in_place(engine):
    off = np.array([2], np.uint32)
    upd = -np.ones((4, 2, 3), np.float32)

    def build(t, i, u):
        fresh = ops.dynamic_update(t, i, u, [1], [2], True)
        before = t * 1.0
        alias = ops.dynamic_update_(t, i, u, [1], [2], True)
        after = t * 1.0  # a later read of t sees the in-place write
        return [fresh, before, alias, after]

    fresh, before, alias, after = _run(build, [T3, off, upd], engine)
    want = T3.copy()
    want[:, 2:4, :] = -1
    np.testing.assert_array_equal(fresh, want)
    np.testing.assert_array_equal(before, T3)
    np.testing.assert_array_equal(alias, want)
    np.testing.assert_array_equal(after, want)


def test_dynamic_slice_python_index_and_int_dtype():
    t = np.arange(10, dtype=np.uint8)
    (out,) = _run(lambda x: [ops.dynamic_slice(x, [6], [0], [3], False)], [t])
    np.testing.assert_array_equal(out, [6, 7, 8])


def test_dynamic_errors():
    def body(v):
        t = v(T3)
        i2 = v(np.zeros(2, np.uint32))
        with pytest.raises(ValueError, match="ops.dynamic_slice.*one offset per axis"):
            ops.dynamic_slice(t, v(np.zeros(3, np.uint32)), [0, 1], [1, 1], False)
        with pytest.raises(ValueError, match="ops.dynamic_slice.*size 6 on axis 1"):
            ops.dynamic_slice(t, i2, [0, 1], [1, 6], False)
        with pytest.raises(TypeError, match="ops.dynamic_slice.*integer"):
            ops.dynamic_slice(t, v(np.zeros(2, np.float32)), [0, 1], [1, 1], False)
        with pytest.raises(ValueError, match="ops.dynamic_update.*t_update has shape"):
            ops.dynamic_update(t, i2, v(np.zeros((1, 1, 1), np.float32)), [0, 1], [1, 2], False)
        with pytest.raises(ValueError, match="ops.dynamic_update_.*out of range"):
            ops.dynamic_update_(t, i2, v(np.zeros((1, 1, 3), np.float32)), [0, 3], [1, 1], False)
    _traced(body)


# tied_gather / groupedgather ------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["native", "reference"])
def test_tied_gather(engine):
    idx = np.array([[3, 0], [1, -1]], np.int32)
    a, b = _run(lambda t, i: [ops.tied_gather(t, i), ops.tied_gather(t, i, axis=-1)], [X, idx], engine)
    np.testing.assert_array_equal(a, X[idx % 4])
    np.testing.assert_array_equal(b, X[:, :, idx % 6])


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_zero_OOR_gives_zero_for_every_index_outside_the_axis(engine):
    # PopART's zero_OOR: negative indices are out of range too (vocabulary-sharded embeddings
    # subtract their shard's offset from the token ids); without it they count from the end.
    idx = np.array([-2, 1, 5, -5, 3], np.int32)
    rows = [0, 1, 0, 0, 1]
    want = np.where(np.array(rows)[:, None, None] == 1, X[np.clip(idx, 0, 3)], 0)
    outs = _run(lambda t, i: [ops.gather(t, i, zero_OOR=True), ops.tied_gather(t, i, zero_OOR=True),
                              ops.gather(t, i), ops.groupedgather(ops.reshape(t, (1, 4, 1, 6)),
                                                                  ops.reshape(i, (1, 5)), zero_OOR=True)],
                [X, idx], engine)
    np.testing.assert_array_equal(outs[0], want)
    np.testing.assert_array_equal(outs[1], want)
    np.testing.assert_array_equal(outs[3][0].reshape(want.shape), want)
    plain = np.where((idx >= -4) & (idx < 4), 1, 0)[:, None, None] * X[idx % 4]  # negatives from the end
    np.testing.assert_array_equal(outs[2], plain)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_groupedgather(engine):
    t = RNG.randn(3, 5, 2).astype(np.float32)  # 3 groups of (5, 2)
    idx = np.array([[0, 4], [2, 2], [1, 3]], np.int32)
    a, b = _run(lambda x, i: [ops.groupedgather(x, i, 0, 3), ops.groupedgather(x, i[:, :1] % 2, -1, 3)],
                [t, idx], engine)
    assert a.shape == (3, 2, 2) and b.shape == (3, 5, 1)
    for g in range(3):
        np.testing.assert_array_equal(a[g], t[g][idx[g]])
        np.testing.assert_array_equal(b[g], t[g][:, idx[g, :1] % 2])


def test_groupedgather_errors():
    def body(v):
        t = v(np.zeros((3, 5), np.float32))
        with pytest.raises(ValueError, match="ops.groupedgather.*group_size=2"):
            ops.groupedgather(t, v(np.zeros((3, 1), np.int32)), 0, 2)
    _traced(body)


# onehot ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(engine, axis):
    labels = np.array([[0, 3], [-1, 9]], np.int32)  # -1 is the last class, 9 out of range

    def build(lab):
        return [ops.onehot(lab, popxl.constant(4, popxl.int32), popxl.constant(np.array([0.5, 2.0], np.float16)),
                           axis)]

    (out,) = _run(build, [labels], engine)
    assert out.dtype == np.float16
    want = np.full((2, 2, 4), 0.5, np.float16)
    for (r, c) in itertools.product(range(2), range(2)):
        k = labels[r, c]
        if -4 <= k < 4:
            want[r, c, k % 4] = 2.0
    np.testing.assert_array_equal(out, np.moveaxis(want, -1, axis))


def test_onehot_errors():
    def body(v):
        lab = v(np.zeros((3,), np.int32))
        vals = popxl.constant(np.array([0, 1], np.float32))
        with pytest.raises(ValueError, match="ops.onehot.*constant"):
            ops.onehot(lab, v(np.array(3, np.int32)), vals, -1)
        with pytest.raises(ValueError, match="ops.onehot.*values must have shape"):
            ops.onehot(lab, popxl.constant(3), popxl.constant(np.zeros(3, np.float32)), -1)
    _traced(body)


# interpolate ----------------------------------------------------------------------------------------
def _coord(x_out, n_in, n_out, scale, ctm):
    if ctm == "half_pixel":
        return (x_out + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (x_out + 0.5) / scale - 0.5 if n_out > 1 else 0.0
    if ctm == "asymmetric":
        return x_out / scale
    # ONNX: length_resized = n_in * scale, unrounded (the output length n_out is floored)
    if ctm == "align_corners":
        return 0.0 if n_out == 1 else x_out * (n_in - 1) / (n_in * scale - 1)
    return 0.5 * (n_in - 1) if n_out == 1 else x_out * (n_in - 1) / (n_in * scale - 1)


def _weights_1d(x, n_in, mode, nearest_mode):
    """{input index: weight} for one output sample (scalar loops, ONNX Resize rules)."""
    if mode == "nearest":
        f = math.floor(x)
        r = x - f
        up = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5, "floor": False, "ceil": r > 0}[nearest_mode]
        return {min(max(f + up, 0), n_in - 1): 1.0}
    if mode == "linear":
        x = min(max(x, 0.0), n_in - 1.0)
        f = math.floor(x)
        w = {}
        for p, c in ((f, 1 - (x - f)), (min(f + 1, n_in - 1), x - f)):
            w[p] = w.get(p, 0.0) + c
        return w
    a = -0.75
    f = math.floor(x)
    w = {}
    for p in range(f - 1, f + 3):
        d = abs(x - p)
        c = ((a + 2) * d ** 3 - (a + 3) * d ** 2 + 1) if d <= 1 else (a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
                                                                     if d < 2 else 0.0)
        q = min(max(p, 0), n_in - 1)
        w[q] = w.get(q, 0.0) + c
    return w


def _interp_numpy(x, scales, mode, nearest_mode, ctm):
    out_shape = [int(math.floor(d * s)) for d, s in zip(x.shape, scales)]
    per_axis = [[_weights_1d(_coord(o, d, n, s, ctm), d, mode, nearest_mode) for o in range(n)]
                for d, n, s in zip(x.shape, out_shape, scales)]
    out = np.zeros(out_shape, np.float64)
    for pos in np.ndindex(*out_shape):
        acc = 0.0
        for combo in itertools.product(*[per_axis[a][p].items() for a, p in enumerate(pos)]):
            idx = tuple(c[0] for c in combo)
            acc += float(np.prod([c[1] for c in combo])) * float(x[idx])
        out[pos] = acc
    return out


IMG = RNG.rand(1, 2, 3, 4).astype(np.float32)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("ctm", ["half_pixel", "asymmetric", "align_corners"])
def test_interpolate_nearest(nearest_mode, ctm):
    scales = (1.0, 1.0, 2.0, 1.5)
    (out,) = _run(lambda t: [ops.interpolate(t, scales, "nearest", nearest_mode, ctm)], [IMG])
    assert out.shape == (1, 2, 6, 6) and out.dtype == np.float32
    np.testing.assert_array_equal(out, _interp_numpy(IMG, scales, "nearest", nearest_mode, ctm).astype(np.float32))


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                 "tf_crop_and_resize"])
def test_interpolate_linear_cubic(engine, mode, ctm):
    scales = (1.0, 0.5, 2.5, 0.75)  # up- and down-sampling, one axis to length 1
    (out,) = _run(lambda t: [ops.interpolate(t, scales, mode, coordinate_transformation_mode=ctm)], [IMG], engine)
    assert out.shape == (1, 1, 7, 3)
    np.testing.assert_allclose(out, _interp_numpy(IMG, scales, mode, None, ctm), rtol=1e-5, atol=1e-6)


def test_interpolate_default_and_integer_nearest():
    img = np.arange(6, dtype=np.int32).reshape(1, 1, 2, 3)
    a, b, c = _run(lambda t: [ops.interpolate(t), ops.interpolate(t, (1, 1, 2, 2)), ops.interpolate(t, None)], [img])
    np.testing.assert_array_equal(a, img)
    np.testing.assert_array_equal(b, img.repeat(2, 2).repeat(2, 3))
    np.testing.assert_array_equal(c, img)  # None: the default scale factors (it used to fail iterating None)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_scalars_keep_their_shape_through_interpolate_and_transpose(engine):
    """np.ascontiguousarray makes a 0-d array 1-d: the reference kernels must not pass that on."""
    x = np.array(2.5, np.float32)
    outs = _run(lambda t: [ops.interpolate(t, ()), ops.transpose(t)], [x], engine)
    for out in outs:
        assert out.shape == () and out.dtype == np.float32 and out == x


def test_interpolate_errors():
    def body(v):
        t = v(IMG)
        with pytest.raises(ValueError, match="ops.interpolate.*rank 4"):
            ops.interpolate(t, (2.0, 2.0))
        with pytest.raises(ValueError, match="ops.interpolate.*mode must be one of"):
            ops.interpolate(t, mode="bilinear")
        with pytest.raises(ValueError, match="ops.interpolate.*nearest_mode"):
            ops.interpolate(t, nearest_mode="round")
        with pytest.raises(ValueError, match="ops.interpolate.*coordinate_transformation_mode"):
            ops.interpolate(t, coordinate_transformation_mode="half")
        with pytest.raises(TypeError, match="ops.interpolate.*floating point"):
            ops.interpolate(v(np.zeros((2, 2), np.int32)), (2.0, 2.0), "linear")
    _traced(body)


def test_gradient_decisions():
    assert REGISTRY["dynamic_update_"].grad == Grad.STOP
    assert REGISTRY["dynamic_update_"].inplace == 0
    for name in ("split", "concat_", "scatter", "scatter_reduce", "dynamic_slice", "dynamic_update",
                 "groupedgather", "tied_gather", "onehot", "interpolate"):
        assert callable(REGISTRY[name].grad), name
