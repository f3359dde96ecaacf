"""The static program (values computed from weights alone, see popxl.compiler.lower) on both
engines: results stay fresh after every kind of weight write, replicas holding different weights
each see their own, and programs that update their weights every step are unchanged. The native
engine runs the static program and re-reorders convolution weights, and repacks a matmul's
static right operand, only when variables changed; the reference engine runs it every time, so
comparing the two catches stale caching."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from engine_harness import engine

N, C, O, H = 2, 8, 16, 6  # a conv big enough for oneDNN's blocked weight layout
STEPS = 2
RNG = np.random.default_rng(0)
WEIGHTS = [RNG.standard_normal((O, C, 3, 3)).astype(np.float32) for _ in range(6)]
SCALES = [RNG.uniform(0.5, 2, O).astype(np.float32) for _ in range(2)]
# x (ROWS, K) @ (w * scale) (K, O): past a million multiply-adds, so the native engine keeps the
# static product packed in oneDNN's layout
ROWS, K = 128, 96
MM_WEIGHTS = [RNG.standard_normal((K, O * 8)).astype(np.float32) for _ in range(6)]
MM_SCALES = [RNG.uniform(0.5, 2, O * 8).astype(np.float32) for _ in range(2)]
# float16 convolutions compute in float32 and round once, on both engines: an ulp of float16 apart
TOLS = {np.float32: dict(rtol=1e-4, atol=1e-4), np.float16: dict(rtol=2e-3, atol=1e-2)}
TOL = TOLS[np.float32]
ENGINES = ("reference", "native")
DTYPES = {np.float32: popxl.float32, np.float16: popxl.float16}


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NCHW x OIHW, stride 1, padding 1."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", windows, w, dtype=np.float64).astype(np.float32)


def _shapes(op: str) -> Tuple[tuple, tuple, tuple]:
    """(x, w, y) shapes of one step of ``op``."""
    return ((N, C, H, H), (O, C, 3, 3), (N, O, H, H)) if op == "conv" else ((ROWS, K), (K, O * 8), (ROWS, O * 8))


def _weights(op: str) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    return (WEIGHTS, SCALES) if op == "conv" else (MM_WEIGHTS, MM_SCALES)


def _folded(where: str, replicas: int = 1, dtype=np.float32, op: str = "conv"):
    """y = conv(x, w * scale), or x @ (w * scale) for op "matmul": the product (a batch norm folded
    into the weights) depends on the weights alone. ``where``: the op in the main graph, or in a
    loop body reading the product by reference (as popart.InferenceSession builds it). With
    replicas, each holds its own ``w``. Weights, scale and data of ``dtype``."""
    ir = popxl.Ir(replication=replicas)
    steps = STEPS if where == "loop" else 1
    ir.num_host_transfers = steps
    grouping = ir.replica_grouping(group_size=1) if replicas > 1 else None
    x_shape, _, y_shape = _shapes(op)
    weights, scales = _weights(op)
    with ir.main_graph:
        w = popxl.variable((np.stack(weights[:replicas]) if grouping else weights[0]).astype(dtype), name="w",
                           replica_grouping=grouping)
        scale = popxl.variable(scales[0].astype(dtype), name="scale")
        x_s = popxl.h2d_stream(x_shape, DTYPES[dtype], "x")
        y_s = popxl.d2h_stream(y_shape, DTYPES[dtype], "y")
        folded = w * (ops.reshape(scale, (O, 1, 1, 1)) if op == "conv" else scale)

        def step(f: popxl.TensorByRef):
            x = ops.host_load(x_s)
            ops.host_store(y_s, ops.conv(x, f, padding=(1, 1, 1, 1)) if op == "conv" else x @ f)

        if where == "main":
            step(folded)
        else:
            ops.repeat(ir.create_graph(step, folded), steps, folded)
    x = np.random.default_rng(1).standard_normal((steps, replicas, *x_shape)).astype(dtype)
    return ir, w, scale, x_s, y_s, x


def _expected(x: np.ndarray, weights: List[np.ndarray], scale: np.ndarray, op: str = "conv") -> np.ndarray:
    """Per step and replica: the op with that replica's weights (the product w * scale in x's dtype)."""
    dt = x.dtype

    def one(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if op == "conv":
            return _conv(x, w.astype(dt) * scale.astype(dt)[:, None, None, None])
        return np.matmul(x, w.astype(dt) * scale.astype(dt), dtype=np.float64).astype(dt)
    return np.stack([np.stack([one(x[s, r], weights[r]) for r in range(x.shape[1])]) for s in range(x.shape[0])])


def _host_shape(x: np.ndarray) -> np.ndarray:
    return x.reshape(tuple(d for d in x.shape[:2] if d > 1) + x.shape[2:])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("where", ["main", "loop"])
@pytest.mark.parametrize("op", ["conv", "matmul"])
def test_weight_writes_between_runs_are_seen(op, where, replicas, dtype):
    """write_variable_data, weights_from_host of changed host data and attach with new host data:
    every run after a write computes with the new weights, on both engines. (float16 weights are
    converted to float32 as they are reordered: the same caching.)"""
    results: Dict[str, List[np.ndarray]] = {}
    tol = TOLS[dtype]
    weights, scales = _weights(op)
    for name in ENGINES:
        ir, w, scale, x_s, y_s, x = _folded(where, replicas, dtype, op)
        with engine(name):
            session = popxl.Session(ir, "ipu_model")
        assert session._exe.static_graph >= 0
        assert op not in getattr(session._engine, "fallback_ops", ())
        (instr,) = [i for g in session._exe.graphs for i in g["program"] if i.get("type") == op]
        assert instr["static_inputs"] == [1]  # the folded weights: kernels may keep them reordered

        def run():
            return session.run({x_s: _host_shape(x)})[y_s].reshape(x.shape[:2] + _shapes(op)[2])

        def grouped(k: int) -> np.ndarray:  # replica r holds weights[k + r]
            return (np.stack(weights[k:k + replicas]) if replicas > 1 else weights[k]).astype(dtype)

        outs, want = [], []
        with session:
            outs.append(run())
            want.append(_expected(x, weights[0:replicas], scales[0], op))
            session.write_variable_data(w, grouped(2))
            outs += [run(), run()]  # and nothing stale once the new weights are in use
            want += [_expected(x, weights[2:2 + replicas], scales[0], op)] * 2
            session.get_tensor_data(scale)[...] = scales[1].astype(dtype)  # the host data, sent by weights_from_host
            session.weights_from_host()
            outs.append(run())
            want.append(_expected(x, weights[2:2 + replicas], scales[1], op))
        session.write_variable_data(w, grouped(4))  # detached: sent when attached again
        with session:
            outs.append(run())
            want.append(_expected(x, weights[4:4 + replicas], scales[1], op))
        for k, (got, expect) in enumerate(zip(outs, want)):
            np.testing.assert_allclose(got, expect, err_msg=f"{name} engine, run {k}", **tol)
        results[name] = outs
    for k, (nat, ref) in enumerate(zip(results["native"], results["reference"])):
        np.testing.assert_allclose(nat, ref, err_msg=f"run {k}", **tol)


def _static_calls(session: popxl.Session) -> Tuple[int, ...]:
    """Calls per replica of the static program's op (the folding ``mul``) since the profile was reset."""
    exe = session._exe
    (k,) = [k for k, i in enumerate(exe.graphs[exe.static_graph]["program"]) if i.get("type") == "mul"]
    profile = session._engine.op_profile()
    calls = profile.get((exe.static_graph, k), (None, np.zeros(exe.replication_factor, np.int64)))[1]
    return tuple(int(c) for c in calls)


@pytest.mark.parametrize("name, expected", [("reference", [1, 2, 3, 4]), ("native", [1, 1, 2, 2])])
def test_static_program_runs_when_variables_change(name, expected):
    """The reference engine runs it every time; the native engine after attach and after writes."""
    ir, w, _, x_s, y_s, x = _folded("main", replicas=2)
    with engine(name):
        session = popxl.Session(ir, "ipu_model")
    counts = []
    with session:
        session._engine.profiling = True
        for k in range(4):
            if k == 2:
                session.write_variable_data(w, np.stack(WEIGHTS[2:4]))
            session.run({x_s: _host_shape(x)})
            counts.append(_static_calls(session))
    assert counts == [(c, c) for c in expected]  # for every replica


@pytest.mark.parametrize("name", ENGINES)
def test_weights_updated_every_step_are_not_static(name):
    """A training-like program: the weight is read, then updated in place each run. Nothing
    computed from it is static, and every run sees the previous run's update."""
    ir = popxl.Ir()
    delta = RNG.standard_normal((O, C, 3, 3)).astype(np.float32) * 0.1
    with ir.main_graph:
        w = popxl.variable(WEIGHTS[0], name="w")
        x_s = popxl.h2d_stream((N, C, H, H), popxl.float32, "x")
        y_s = popxl.d2h_stream((N, O, H, H), popxl.float32, "y")
        ops.host_store(y_s, ops.conv(ops.host_load(x_s), w * 2.0, padding=(1, 1, 1, 1)))
        ops.var_updates.accumulate_(w, popxl.constant(delta))
    x = RNG.standard_normal((N, C, H, H)).astype(np.float32)
    with engine(name):
        session = popxl.Session(ir, "ipu_model")
    exe = session._exe
    assert exe.static_graph == -1
    (conv,) = [i for i in exe.graphs[0]["program"] if i.get("type") == "conv"]
    assert "static_inputs" not in conv
    with session:
        for k in range(3):
            np.testing.assert_allclose(session.run({x_s: x})[y_s], _conv(x, 2 * (WEIGHTS[0] + k * delta)), **TOL)
    np.testing.assert_allclose(session.get_tensor_data(w), WEIGHTS[0] + 3 * delta, rtol=1e-6, atol=1e-6)
