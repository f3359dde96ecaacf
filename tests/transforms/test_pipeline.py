"""The transform pipeline (popxl.transforms.PIPELINE): one ordered list of passes with their
conditions, applied by every popxl.Session (popart's sessions build a popxl Ir and use
popxl.Session, so they apply it too); printable, and each Session records what it did."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.transforms import PIPELINE, pipeline

rng = np.random.default_rng(0)
STEPS = 3
ORDER = ["expand_ops", "order_weight_fragments", "fuse_conv", "hoist_invariants", "fuse_decomposed",
         "fuse_attention", "fuse_matmul"]


def test_order_and_conditions():
    assert PIPELINE.names() == ORDER
    assert [p.mark for p in PIPELINE] == [None, None, "inference", "inference", None, None, None]
    assert PIPELINE["hoist_invariants"].scope == "the repeat loops of graphs marked 'inference'"
    with pytest.raises(KeyError, match="fuse_matmul"):
        PIPELINE["no_such_pass"]


def test_description_lists_every_pass_in_order_with_its_condition():
    text = str(PIPELINE)
    assert text == PIPELINE.describe()
    lines = [line for line in text.splitlines() if line[:5].strip().rstrip(".").isdigit()]
    assert [line.split()[1] for line in lines] == ORDER
    assert all(" on " in line for line in lines)
    assert "on graphs marked 'inference'" in lines[2] and "on every program" in lines[0]


def _linear_program():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(rng.standard_normal((4, 3)).astype(np.float32), name="w")
        b = popxl.variable(rng.standard_normal(3).astype(np.float32), name="b")
        x_s = popxl.h2d_stream((2, 4), popxl.float32, "x")
        y_s = popxl.d2h_stream((2, 3), popxl.float32, "y")
        ops.host_store(y_s, ops.host_load(x_s) @ w + b)
    return ir, x_s, y_s


def test_a_session_applies_it_and_records_what_each_pass_did():
    ir, x_s, y_s = _linear_program()
    session = popxl.Session(ir, "cpu")
    record = session.transforms_applied
    assert [r.name for r in record] == ORDER
    assert record.ran == [n for n in ORDER if n not in ("fuse_conv", "hoist_invariants")]  # nothing marked
    assert not record["fuse_conv"].ran and "skipped" in str(record["fuse_conv"])
    mm = record["fuse_matmul"]
    assert mm.changes == {"add": -1, "matmul": -1, "matmul_bias": 1}
    assert (mm.ops_before, mm.ops_after) == (4, 3)
    assert not record["expand_ops"].changed
    text = str(record)
    assert text.splitlines()[0] == "transforms applied (4 -> 3 ops):"
    assert "fuse_matmul: 4 -> 3 ops (-1 add, -1 matmul, +1 matmul_bias)" in text
    assert [op.type for op in ir.main_graph.ops] == ["host_load", "matmul_bias", "host_store"]


C = 4
CONV_WEIGHTS = {"cw": rng.standard_normal((C, 2, 3, 3)).astype(np.float32) * 0.3,
                "scale": rng.random(C).astype(np.float32) + 0.5, "bias": rng.standard_normal(C).astype(np.float32),
                "mean": rng.standard_normal(C).astype(np.float32) * 0.1, "var": rng.random(C).astype(np.float32) + 0.5}


def _conv_loop(marked: bool):
    """A batch loop of conv + batch norm + relu on weights, its body marked 'inference' or not."""
    ir = popxl.Ir()
    ir.num_host_transfers = STEPS
    main = ir.main_graph
    with main:
        vs = [popxl.variable(v, name=n) for n, v in CONV_WEIGHTS.items()]
        x_s = popxl.h2d_stream((1, 2, 6, 6), popxl.float32, "x")
        y_s = popxl.d2h_stream((1, C, 6, 6), popxl.float32, "y")
    body = ir.create_empty_graph("step")
    with body:
        ins = [popxl.graph_input(v.shape, v.dtype, v.name, by_ref=True) for v in vs]
        cw, scale, bias, mean, var = ins
        y = ops.conv(ops.host_load(x_s), cw, padding=(1, 1, 1, 1))
        ops.host_store(y_s, ops.relu(ops.batch_norm_inference(y, scale, bias, mean, var)))
    if marked:
        assert pipeline.mark(body, pipeline.INFERENCE) is body
    with main:
        ops.repeat(body, STEPS, inputs_dict=dict(zip(ins, vs)))
    return ir, body, x_s, y_s


def test_marked_graphs_get_the_inference_passes_with_the_same_values():
    x = rng.standard_normal((STEPS, 1, 2, 6, 6)).astype(np.float32)
    outs = {}
    for marked in (False, True):
        ir, body, x_s, y_s = _conv_loop(marked)
        assert pipeline.is_marked(body, pipeline.INFERENCE) is marked
        with popxl.Session(ir, "cpu") as session:
            outs[marked] = session.run({x_s: x})[y_s]
            record = session.transforms_applied
        assert record["fuse_conv"].ran is marked and record["hoist_invariants"].ran is marked
        body_types = [op.type for op in body.ops]
        if not marked:
            assert "conv" in body_types and "batch_norm_inference" in body_types
            continue
        assert record["fuse_conv"].changes["conv_fused"] == 1
        assert body_types == ["host_load", "conv_fused", "host_store"]  # folding and relu fused in
        # the folded weights are computed before the loop, from the variables, and read by reference
        main_types = [op.type for op in ir.main_graph.ops]
        assert main_types[-1] == "repeat" and "sqrt" in main_types
        assert record["hoist_invariants"].changes == {}  # the ops moved, none were added or removed
        (site,) = [op for op in ir.main_graph.ops if op.type == "repeat"]
        assert len(site.inputs) == len(body.inputs) == 5 + 2
        assert all(body.is_input_by_ref(t) for t in body.inputs)
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-5, atol=1e-5)


def test_mark_refuses_an_ir_a_session_owns():
    ir, body, _, _ = _conv_loop(False)
    popxl.Session(ir, "cpu")
    with pytest.raises(RuntimeError, match="cannot be modified"):
        pipeline.mark(body, pipeline.INFERENCE)
