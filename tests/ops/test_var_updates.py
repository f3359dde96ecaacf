"""popxl.ops.var_updates: in-place updates of variables checked against NumPy formulas, scalar
arguments as floats and as tensors, updaters with bias correction and their step counters,
repeated application in a loop, and trace-time errors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.ops import var_updates as vu

RNG = np.random.default_rng(7)
T0 = RNG.normal(size=(3, 4)).astype(np.float32)
X0 = RNG.normal(size=(3, 4)).astype(np.float32)


def _run_updates(build, **arrays):
    """Make a variable per array, apply ``build(**vars)`` once, return all variables' values
    after the run and whatever build returned, streamed out."""
    ir = popxl.Ir()
    with ir.main_graph:
        vs = {k: popxl.variable(a, popxl.dtypes.from_numpy(a.dtype), name=k) for k, a in arrays.items()}
        res = build(**vs)
        outs = []
        for i, t in enumerate(res if isinstance(res, (tuple, list)) else ([res] if res is not None else [])):
            s = popxl.d2h_stream(t.shape, t.dtype, f"out{i}")
            ops.host_store(s, t)
            outs.append(s)
    with popxl.Session(ir, "ipu_model") as sess:
        streamed = sess.run()
        values = {k: sess.get_tensor_data(v) for k, v in vs.items()}
    return values, [streamed[s] for s in outs]


# name, call(t, x, scalar), numpy formula(t, x, s), scalar value
CASES = [
    ("accumulate_", lambda t, x, s: vu.accumulate_(t, x), lambda t, x, s: t + x, None),
    ("accumulate_", lambda t, x, s: vu.accumulate_(t, x, s), lambda t, x, s: t + s * x, 0.3),
    ("accumulate_square_", lambda t, x, s: vu.accumulate_square_(t, x), lambda t, x, s: t + x * x, None),
    ("accumulate_square_", lambda t, x, s: vu.accumulate_square_(t, x, s), lambda t, x, s: t + s * x * x, -2.0),
    ("accumulate_mean_", lambda t, x, s: vu.accumulate_mean_(t, x, s),
     lambda t, x, s: t * s / (s + 1) + x / (s + 1), 3.0),
    ("accumulate_moving_average_", lambda t, x, s: vu.accumulate_moving_average_(t, x, s),
     lambda t, x, s: s * t + (1 - s) * x, 0.9),
    ("accumulate_moving_average_square_", lambda t, x, s: vu.accumulate_moving_average_square_(t, x, s),
     lambda t, x, s: s * t + (1 - s) * x * x, 0.99),
    ("accumulator_scale_", lambda t, x, s: vu.accumulator_scale_(t, s), lambda t, x, s: t * s, 0.125),
    ("accumulator_zero_", lambda t, x, s: vu.accumulator_zero_(t), lambda t, x, s: np.zeros_like(t), None),
    ("copy_var_update_", lambda t, x, s: vu.copy_var_update_(t, x), lambda t, x, s: x, None),
]


@pytest.mark.parametrize("scalar_as_tensor", [False, True])
@pytest.mark.parametrize("name,call,formula,s", CASES)
def test_accumulators(name, call, formula, s, scalar_as_tensor):
    if scalar_as_tensor and s is None:
        pytest.skip("no scalar argument")

    def build(t, x, **scalars):
        sc = scalars.get("s", s)
        out = call(t, x, sc)
        assert out.shape == t.shape and out.dtype == t.dtype
        return out * 1.0  # a later read of the alias sees the update

    extra = {"s": np.array(s, np.float32)} if scalar_as_tensor else {}
    values, (out,) = _run_updates(build, t=T0, x=X0, **extra)
    want = formula(T0.astype(np.float64), X0.astype(np.float64), s).astype(np.float32)
    np.testing.assert_allclose(values["t"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out, values["t"])
    np.testing.assert_array_equal(values["x"], X0)  # X untouched


def test_mixed_dtypes_compute_wide_and_write_in_t_dtype():
    t = np.full((4,), 1.0, np.float16)
    x = np.array([1e-4, 2e-4, 3e-4, 4e-4], np.float32)
    values, _ = _run_updates(lambda t, x: vu.accumulate_(t, x, 1000.0), t=t, x=x)
    assert values["t"].dtype == np.float16
    np.testing.assert_array_equal(values["t"], (1.0 + 1000.0 * x.astype(np.float32)).astype(np.float16))
    values, _ = _run_updates(lambda t, x: vu.copy_var_update_(t, x), t=np.zeros(4, np.float32),
                             x=np.arange(4, dtype=np.float16))
    np.testing.assert_array_equal(values["t"], [0, 1, 2, 3])


def test_scalar_tensor_of_shape_1_and_other_dtype():
    values, _ = _run_updates(lambda t, x, f: vu.accumulate_(t, x, f), t=T0, x=X0, f=np.array([2.0], np.float16))
    np.testing.assert_allclose(values["t"], T0 + 2 * X0, rtol=1e-6)


def test_var_update_twice_inside_repeat():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(T0, name="t")
        m = popxl.variable(np.zeros_like(T0), name="m")
        x = popxl.constant(X0)

        def body(t_in: popxl.TensorByRef, m_in: popxl.TensorByRef, x_in: popxl.Tensor):
            vu.accumulate_(t_in, x_in, 0.5)
            vu.accumulate_moving_average_(m_in, t_in, 0.9)

        g = ir.create_graph(body, t, m, x)
        ops.repeat(g, 2, t, m, x)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        got_t, got_m = sess.get_tensor_data(t), sess.get_tensor_data(m)
    want_t, want_m = T0.astype(np.float64), np.zeros_like(T0, np.float64)
    for _ in range(2):
        want_t = want_t + 0.5 * X0
        want_m = 0.9 * want_m + 0.1 * want_t
    np.testing.assert_allclose(got_t, want_t, rtol=1e-6)
    np.testing.assert_allclose(got_m, want_m, rtol=1e-5, atol=1e-7)


def test_update_persists_across_runs():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros(3, np.float32), name="t")
        vu.accumulate_(t, popxl.constant(np.ones(3, np.float32)))
    with popxl.Session(ir, "ipu_model") as sess:
        for _ in range(3):
            sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(t), [3, 3, 3])


# sparse_accumulate_ -------------------------------------------------------------------------------
def _np_sparse(t, x, idx, axis, f):
    out = t.astype(np.float64).copy()
    xs = np.moveaxis(x.reshape(t.shape[:axis] + (idx.size,) + t.shape[axis + 1:]), axis, 0)
    for j, i in enumerate(idx.reshape(-1)):
        if 0 <= i < t.shape[axis]:
            sl = [slice(None)] * t.ndim
            sl[axis] = i
            out[tuple(sl)] += f * xs[j]
    return out.astype(t.dtype)


@pytest.mark.parametrize("axis,idx,f", [
    (0, np.array([2, 0, 2], np.int32), None),
    (1, np.array([3, 3, 1, 0, 1], np.int32), 0.5),
    (-1, np.array([[0, 1], [3, 3]], np.int32), -1.0),
    (0, np.array([1, 7, -1], np.int32), 2.0),  # out-of-range rows are skipped
])
def test_sparse_accumulate(axis, idx, f):
    t0 = RNG.normal(size=(3, 4)).astype(np.float32)
    ax = axis % 2
    xshape = t0.shape[:ax] + idx.shape + t0.shape[ax + 1:]
    x0 = RNG.normal(size=xshape).astype(np.float32)

    def build(t, x, i):
        return vu.sparse_accumulate_(t, x, i, axis=axis, f=f) + 0.0

    values, (out,) = _run_updates(build, t=t0, x=x0, i=idx)
    want = _np_sparse(t0, x0, idx, ax, 1.0 if f is None else f)
    np.testing.assert_allclose(values["t"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out, values["t"])


def test_sparse_accumulate_tensor_scale_and_layout_hint():
    t0, x0, idx = np.zeros((4, 2), np.float32), np.ones((2, 2), np.float32), np.array([1, 1], np.int32)
    values, _ = _run_updates(lambda t, x, i, f: vu.sparse_accumulate_(t, x, i, f=f, W=t), t=t0, x=x0, i=idx,
                             f=np.array(3.0, np.float32))
    np.testing.assert_array_equal(values["t"], [[0, 0], [6, 6], [0, 0], [0, 0]])


# updaters -----------------------------------------------------------------------------------------
M0 = RNG.normal(size=(5,)).astype(np.float32)
V0 = RNG.uniform(0.01, 1.0, size=(5,)).astype(np.float32)
W0 = RNG.normal(size=(5,)).astype(np.float32)


def _np_adam(m, v, w, step, wd, b1, b2, eps, mode):
    m, v = m.astype(np.float64), v.astype(np.float64)
    if step is not None:
        m = m / (1 - b1 ** step)
        if mode != "adamax":
            v = v / (1 - b2 ** step)
    upd = m / (v + eps) if mode == "adamax" else m / (np.sqrt(v) + eps)
    return upd + (wd * w if wd is not None else 0)


@pytest.mark.parametrize("fn,mode", [(vu.adam_updater, "adam"), (vu.lamb_updater, "lamb")])
@pytest.mark.parametrize("with_step", [False, True])
@pytest.mark.parametrize("wd", [None, 0.01])
def test_adam_and_lamb_updater(fn, mode, with_step, wd):
    def build(m, v, w, step):
        kw = dict(time_step=step, beta1=0.9, beta2=0.999) if with_step else {}
        u = fn(m, v, weight=w if wd is not None else None, weight_decay=wd, epsilon=1e-5, **kw)
        assert u.shape == m.shape and u.dtype == m.dtype
        return u

    values, (u,) = _run_updates(build, m=M0, v=V0, w=W0, step=np.array(4.0, np.float32))
    want = _np_adam(M0, V0, W0, 5.0 if with_step else None, wd, 0.9, 0.999, 1e-5, mode)
    np.testing.assert_allclose(u, want, rtol=1e-5)
    assert values["step"] == (5.0 if with_step else 4.0)  # incremented in place, before use
    np.testing.assert_array_equal(values["m"], M0)  # the accumulators are only read


def test_adam_updater_scalar_tensors():
    def build(m, v, w, step, b1, b2, wd, eps):
        return vu.adam_updater(m, v, w, step, wd, b1, b2, eps)

    scal = {k: np.array(val, np.float32) for k, val in dict(b1=0.8, b2=0.99, wd=0.1, eps=1e-3).items()}
    values, (u,) = _run_updates(build, m=M0, v=V0, w=W0, step=np.array(0.0, np.float32), **scal)
    want = _np_adam(M0, V0, W0, 1.0, 0.1, np.float32(0.8), np.float32(0.99), np.float32(1e-3), "adam")
    np.testing.assert_allclose(u, want, rtol=1e-5)
    assert values["step"] == 1.0


def test_adamax_updater_and_int_step():
    def build(m, v, w, step):
        return vu.adamax_updater(m, v, w, step, weight_decay=0.05, beta1=0.8, epsilon=1e-6)

    values, (u,) = _run_updates(build, m=M0, v=V0, w=W0, step=np.array(2, np.int32))
    np.testing.assert_allclose(u, _np_adam(M0, V0, W0, 3, 0.05, 0.8, None, 1e-6, "adamax"), rtol=1e-5)
    assert values["step"] == 3 and values["step"].dtype == np.int32


def test_float16_first_moment_rounds_as_popart_does():
    """A float16 first moment (popxl-addons' Adam default): the moving average's f and 1 - f and
    the bias correction 1 - beta1**step are held in float16, and m / (1 - beta1) is rounded to
    float16, so one Adam step from zero moments gives g / (|g| + eps) rounded once, like float32
    Adam, instead of the 2**-11 error of a float16 moment divided by the exact 0.1. The updater of
    a weight decay of 0 takes no weight, and has the first moment's type."""
    g = np.array([-0.23415338, -0.23413695, 1.5792128, 0.7674347], np.float32)

    def build(m, v, g, step, step2, w):  # each updater counts its own step
        vu.accumulate_moving_average_(m, g, 0.9)
        vu.accumulate_moving_average_square_(v, g, 0.999)
        upd = vu.adam_updater(m, v, w, step, 0.0, 0.9, 0.999, 1e-5)
        upd_wd = vu.adam_updater(m, v, w, step2, 0.5, 0.9, 0.999, 1e-5)
        assert len(upd.producer.inputs) == 3 and upd.dtype == popxl.float16
        assert upd_wd.dtype == popxl.float32  # with a weight: the weight's type
        return upd, upd_wd

    values, (upd, upd_wd) = _run_updates(build, m=np.zeros(4, np.float16), v=np.zeros(4, np.float32), g=g,
                                         step=np.array(0.0, np.float32), step2=np.array(0.0, np.float32),
                                         w=np.full(4, 2.0, np.float32))
    h = np.float16
    m = (np.float32(h(np.float32(1) - np.float32(0.9))) * g).astype(h)
    np.testing.assert_array_equal(values["m"], m)
    np.testing.assert_array_equal(upd, h(1.0) * np.sign(g).astype(h))  # g / (|g| + 1e-5) within float16
    m_hat = (m.astype(np.float32) / np.float32(h(0.1))).astype(h).astype(np.float32)
    want = m_hat / (np.sqrt(values["v"] / np.float32(1 - 0.999)) + np.float32(1e-5)) + 0.5 * 2.0
    np.testing.assert_allclose(upd_wd, want, rtol=1e-6)


def test_adam_step_counts_in_a_loop():
    """One training step per iteration: accumulate moments, compute the update, apply it."""
    g0 = RNG.normal(size=(5,)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(W0, name="w")
        m = popxl.variable(np.zeros(5, np.float32), name="m")
        v = popxl.variable(np.zeros(5, np.float32), name="v")
        step = popxl.variable(np.zeros((), np.float32), name="step")
        grad = popxl.constant(g0)

        def train(w_: popxl.TensorByRef, m_: popxl.TensorByRef, v_: popxl.TensorByRef,
                  step_: popxl.TensorByRef, g_: popxl.Tensor):
            vu.accumulate_moving_average_(m_, g_, 0.9)
            vu.accumulate_moving_average_square_(v_, g_, 0.999)
            upd = vu.adam_updater(m_, v_, time_step=step_, beta1=0.9, beta2=0.999, epsilon=1e-8)
            vu.adam_var_update(w_, upd, popxl.constant(1.0), popxl.constant(1.0), learning_rate=0.01)

        g = ir.create_graph(train, w, m, v, step, grad)
        ops.repeat(g, 3, w, m, v, step, grad)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        got = {k: sess.get_tensor_data(t) for k, t in dict(w=w, m=m, v=v, step=step).items()}
    ww, mm, vv = W0.astype(np.float64), np.zeros(5), np.zeros(5)
    for k in range(1, 4):
        mm = 0.9 * mm + 0.1 * g0
        vv = 0.999 * vv + 0.001 * g0 * g0
        ww = ww - 0.01 * (mm / (1 - 0.9 ** k)) / (np.sqrt(vv / (1 - 0.999 ** k)) + 1e-8)
    # w is ~1 minus updates of ~0.01: an entry near 0 has float32's absolute error (~1e-7) there
    np.testing.assert_allclose(got["w"], ww, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["m"], mm, rtol=1e-5)
    assert got["step"] == 3.0


# adam_var_update ----------------------------------------------------------------------------------
@pytest.mark.parametrize("r1,r2,lr,mwn", [
    (4.0, 16.0, 0.1, 10.0),   # ratio sqrt(4)/sqrt(16) = 0.5
    (400.0, 16.0, 0.1, 3.0),  # clipped: min(20, 3)/4
    (0.0, 16.0, 0.1, 3.0),    # r1 == 0 -> ratio 1
    (4.0, 0.0, 0.1, 3.0),     # r2 == 0 -> ratio 1
    (4.0, 16.0, 0.1, 0.0),    # mwn == 0 -> ratio 1
    (4.0, 16.0, 0.1, None),   # mwn omitted counts as 0 -> ratio 1
    (4.0, 16.0, None, 3.0),   # learning rate omitted counts as 0 -> no change
])
@pytest.mark.parametrize("as_tensors", [False, True])
def test_adam_var_update(r1, r2, lr, mwn, as_tensors):
    def build(t, x, r1_, r2_, **sc):
        a = sc.get("lr", lr)
        b = sc.get("mwn", mwn)
        return vu.adam_var_update(t, x, r1_, r2_, learning_rate=a, max_weight_norm=b) * 1.0

    extra = {}
    if as_tensors:
        extra = {k: np.array(val, np.float32) for k, val in dict(lr=lr, mwn=mwn).items() if val is not None}
    values, (out,) = _run_updates(build, t=T0, x=X0, r1_=np.array(r1, np.float32), r2_=np.array(r2, np.float32),
                                  **extra)
    n1, n2, m = np.sqrt(r1), np.sqrt(r2), 0.0 if mwn is None else mwn
    ratio = 1.0 if (r1 == 0 or r2 == 0 or m == 0) else min(n1, m) / n2
    want = T0 - (0.0 if lr is None else lr) * ratio * X0.astype(np.float64)
    np.testing.assert_allclose(values["t"], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out, values["t"])


# errors -------------------------------------------------------------------------------------------
def _trace(fn):
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((3, 4), np.float32))
        x = popxl.variable(np.zeros((3, 4), np.float32))
        y = popxl.variable(np.zeros((4, 3), np.float32))
        step = popxl.variable(np.zeros((), np.float32))
        vec = popxl.variable(np.zeros((2,), np.float32))
        idx = popxl.variable(np.zeros((2,), np.int32))
        fn(t=t, x=x, y=y, step=step, vec=vec, idx=idx)


@pytest.mark.parametrize("call,exc,msg", [
    (lambda t, x, y, **_: vu.accumulate_(t, y), ValueError, r"accumulate_: t and X must have the same shape"),
    (lambda t, x, y, **_: vu.accumulate_square_(t, y), ValueError, r"accumulate_square_: .*same shape"),
    (lambda t, x, y, **_: vu.accumulate_mean_(t, y, 1.0), ValueError, r"accumulate_mean_: .*same shape"),
    (lambda t, x, y, **_: vu.accumulate_moving_average_(t, y, 0.5), ValueError, "accumulate_moving_average_: "),
    (lambda t, x, y, **_: vu.accumulate_moving_average_square_(t, y, 0.5), ValueError,
     "accumulate_moving_average_square_: "),
    (lambda t, x, y, **_: vu.copy_var_update_(t, y), ValueError, r"copy_var_update_: .*same shape"),
    (lambda t, x, vec, **_: vu.accumulate_(t, x, vec), ValueError, r"accumulate_: f must be a scalar"),
    (lambda t, vec, **_: vu.accumulator_scale_(t, vec), ValueError, r"accumulator_scale_: f must be a scalar"),
    (lambda t, x, **_: vu.accumulate_(t, x, "big"), TypeError, r"accumulate_: f must be a float"),
    (lambda t, x, **_: vu.accumulate_(t, ops.cast(x, popxl.bool)), TypeError, r"accumulate_: X must have a num"),
    (lambda t, x, step, **_: vu.adam_updater(t, x, time_step=step, beta1=0.9), ValueError,
     r"adam_updater: time_step .*needs beta2"),
    (lambda t, x, step, **_: vu.lamb_updater(t, x, time_step=step), ValueError,
     r"lamb_updater: time_step .*needs beta1 and beta2"),
    (lambda t, x, **_: vu.adam_updater(t, x, weight_decay=0.1), ValueError, r"adam_updater: weight_decay needs"),
    (lambda t, x, **_: vu.adamax_updater(t, x), ValueError, r"adamax_updater: time_step is required"),
    (lambda t, x, step, **_: vu.adamax_updater(t, x, time_step=step, weight_decay=0.1), ValueError,
     "adamax_updater: weight_decay needs"),
    (lambda t, y, **_: vu.adam_updater(t, y), ValueError, r"adam_updater: .*same shape"),
    (lambda t, x, vec, **_: vu.adam_updater(t, x, time_step=vec, beta1=0.9, beta2=0.9), ValueError,
     r"adam_updater: time_step must be a scalar"),
    (lambda t, x, vec, **_: vu.adam_var_update(t, x, vec, vec), ValueError, r"adam_var_update: r1 must be a scalar"),
    (lambda t, y, step, **_: vu.adam_var_update(t, y, step, step), ValueError, r"adam_var_update: .*same shape"),
    (lambda t, x, idx, **_: vu.sparse_accumulate_(t, x, idx), ValueError,
     r"sparse_accumulate_: X must have shape .*\(2, 4\)"),
    (lambda t, vec, idx, **_: vu.sparse_accumulate_(t, t, vec), TypeError, r"sparse_accumulate_: indices must"),
    (lambda t, x, idx, **_: vu.sparse_accumulate_(t, x, idx, axis=2), ValueError, r"sparse_accumulate_: axis"),
])
def test_errors_name_the_op(call, exc, msg):
    with pytest.raises(exc, match=msg):
        _trace(call)


def test_public_module_surface():
    expected = {"accumulate_", "accumulate_square_", "accumulate_mean_", "accumulate_moving_average_",
                "accumulate_moving_average_square_", "accumulator_scale_", "accumulator_zero_", "sparse_accumulate_",
                "copy_var_update_", "adam_updater", "lamb_updater", "adamax_updater", "adam_var_update"}
    assert set(vu.__all__) == expected
    assert ops.var_updates is vu
    from popxl.op import REGISTRY, Grad
    for name in expected:
        assert REGISTRY[name].grad == Grad.STOP
        assert REGISTRY[name].inplace == (None if name.endswith("updater") else 0)
