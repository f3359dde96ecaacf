"""hoist_invariants: computations on weights alone leave a loop body and run once before it, with
the same values every iteration, values written in place stay in the body, and weights written
between runs are seen by the next run."""
from __future__ import annotations

from typing import Dict

import numpy as np

import popxl
import popxl.ops as ops
from popxl.transforms import hoist_invariants

STEPS = 3
rng = np.random.default_rng(0)
W, S = rng.standard_normal((2, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
XS = rng.standard_normal((STEPS, 2, 5)).astype(np.float32)


def _program():
    ir = popxl.Ir()
    ir.num_host_transfers = STEPS
    main = ir.main_graph
    with main:
        w, s = popxl.variable(W, name="w"), popxl.variable(S, name="s")
        acc = popxl.variable(np.zeros((2, 5), np.float32), name="acc")
        x_s = popxl.h2d_stream((2, 5), popxl.float32, "x")
        y_s, z_s = popxl.d2h_stream((2, 5), popxl.float32, "y"), popxl.d2h_stream((2, 5), popxl.float32, "z")
    body = ir.create_empty_graph("body")
    bound: Dict[popxl.Tensor, popxl.Tensor] = {}
    with body:
        for parent in (w, s, acc):
            bound[popxl.graph_input(parent.shape, parent.dtype, parent.name, by_ref=True)] = parent
        w_in, s_in, acc_in = bound
        x = ops.host_load(x_s)
        scaled = w_in * ops.exp(s_in + 1.0)  # weights and a constant only: hoisted
        ops.host_store(y_s, x * scaled)
        ops.add_(acc_in, x)  # acc is written by the body: nothing reading it is invariant
        z = w_in * 2.0  # invariant, but written in place below: must stay per iteration
        ops.add_(z, acc_in)
        ops.host_store(z_s, z)
    added = {}

    def bind(t: popxl.Tensor, name: str) -> popxl.Tensor:
        with body:
            g = popxl.graph_input(t.shape, t.dtype, name, by_ref=True)
        added[g] = t
        return g

    hoisted = hoist_invariants(body, main, bound, bind)
    with main:
        ops.repeat(body, STEPS, inputs_dict={**bound, **added})
    return ir, hoisted, body, (w, acc, x_s, y_s, z_s)


def test_weight_computations_leave_the_loop():
    ir, hoisted, body, _ = _program()
    assert sorted(op.type for op in hoisted) == ["add", "exp", "mul"]
    assert [op.type for op in ir.main_graph.ops].index("repeat") == len(ir.main_graph.ops) - 1
    body_types = [op.type for op in body.ops]
    assert "exp" not in body_types and body_types.count("mul") == 2  # x * scaled and w * 2


def test_hoisted_values_and_weight_writes():
    ir, _, _, (w, acc, x_s, y_s, z_s) = _program()
    with popxl.Session(ir, "cpu") as session:
        out = session.run({x_s: XS})
        scaled = W * np.exp(S + 1.0)
        np.testing.assert_allclose(out[y_s], XS * scaled, rtol=1e-6)
        np.testing.assert_allclose(out[z_s], W * 2 + np.cumsum(XS, axis=0), rtol=1e-5, atol=1e-6)
        # a weight written between runs reaches the hoisted computation
        W2 = W + 1.0
        session.write_variable_data(w, W2)
        session.write_variable_data(acc, np.zeros((2, 5), np.float32))
        out = session.run({x_s: XS})
        np.testing.assert_allclose(out[y_s], XS * (W2 * np.exp(S + 1.0)), rtol=1e-6)
        np.testing.assert_allclose(out[z_s], W2 * 2 + np.cumsum(XS, axis=0), rtol=1e-5, atol=1e-6)
