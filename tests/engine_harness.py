"""Run one small popxl program on a chosen engine, for tests that compare engines."""
from __future__ import annotations

import contextlib
import os
from typing import Callable, List, Sequence, Tuple

import numpy as np

import popxl
import popxl.ops as ops


@contextlib.contextmanager
def engine(name: str):
    old = os.environ.get("POPXL_ENGINE")
    os.environ["POPXL_ENGINE"] = name
    try:
        yield
    finally:
        if old is None:
            del os.environ["POPXL_ENGINE"]
        else:
            os.environ["POPXL_ENGINE"] = old


def run_program(build: Callable, inputs: Sequence[np.ndarray], engine_name: str,
                replication: int = 1) -> Tuple[List[np.ndarray], object]:
    """Stream ``inputs`` in, apply ``build(*tensors) -> tensor(s)``, stream the results out.
    Returns the outputs and the Session's engine (to inspect, e.g., ``fallback_ops``)."""
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        streams = [popxl.h2d_stream(a.shape[1:] if replication > 1 else a.shape,
                                    popxl.dtypes.from_numpy(a.dtype), f"in{i}") for i, a in enumerate(inputs)]
        outs = build(*[ops.host_load(s) for s in streams])
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        d2h = []
        for i, t in enumerate(outs):
            d2h.append(popxl.d2h_stream(t.shape, t.dtype, f"out{i}"))
            ops.host_store(d2h[-1], t)
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    with session:
        res = session.run(dict(zip(streams, inputs)))
    return [res[s] for s in d2h], session._engine


def compare_engines(build: Callable, inputs: Sequence[np.ndarray], rtol: float = 0.0, atol: float = 0.0,
                    native_ops: Sequence[str] = ()) -> List[np.ndarray]:
    """Run on both engines; outputs must agree (bit-identical when rtol = atol = 0). ``native_ops``
    must have run natively (not through the Python fallback)."""
    want, _ = run_program(build, inputs, "reference")
    got, eng = run_program(build, inputs, "native")
    fell_back = set(native_ops) & set(eng.fallback_ops)
    assert not fell_back, f"ops ran through the Python fallback: {sorted(fell_back)}"
    for w, g in zip(want, got):
        assert w.shape == g.shape and w.dtype == g.dtype, (w.shape, w.dtype, g.shape, g.dtype)
        if rtol == 0 and atol == 0:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                       equal_nan=True)
    return got
