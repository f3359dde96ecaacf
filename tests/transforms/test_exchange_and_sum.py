"""transforms.merge_exchange / io_tile_exchange / decompose_sum: visible in the IR, values unchanged."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms


def test_merge_exchange_groups_transfers_and_keeps_values():
    ir = popxl.Ir()
    with ir.main_graph:
        a_s, b_s = popxl.h2d_stream((2,), popxl.float32, "a"), popxl.h2d_stream((2,), popxl.float32, "b")
        out_s = popxl.d2h_stream((2,), popxl.float32, "out")
        with popxl.in_sequence(False), transforms.merge_exchange():
            a, b = ops.host_load(a_s), ops.host_load(b_s)
        y = a * b
        with transforms.merge_exchange():
            ops.host_store(out_s, y)
        loads = [op for op in ir.main_graph.ops if op.type == "host_load"]
        store = next(op for op in ir.main_graph.ops if op.type == "host_store")
        assert loads[0].exchange_group == loads[1].exchange_group != store.exchange_group
        assert not hasattr(next(op for op in ir.main_graph.ops if op.type == "mul"), "exchange_group")
    with popxl.Session(ir, "ipu_model") as s:
        res = s.run({a_s: np.array([1, 2], np.float32), b_s: np.array([3, 4], np.float32)})
    np.testing.assert_array_equal(res[out_s], [3, 8])


def test_io_tile_exchange_places_on_io_tiles_and_verifies_overlap():
    ir = popxl.Ir()
    with ir.main_graph:
        a_s = popxl.h2d_stream((2,), popxl.float32, "a")
        with transforms.io_tile_exchange():
            a = ops.host_load(a_s)
            b = a + 1.0  # one op is fine
        assert a.tile_set == "io" and b.tile_set == "io"
        with pytest.raises(RuntimeError, match="more than one op"):
            with transforms.io_tile_exchange():
                ops.host_load(a_s) * 2.0 + 1.0
        with transforms.io_tile_exchange(verify_overlap=False):
            ops.host_load(a_s) * 2.0 + 1.0


def test_decompose_sum_turns_an_n_ary_gradient_sum_into_adds():
    x = np.array([0.5, -1.0, 2.0], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda t: ops.sin(t) + ops.exp(t) + t * t + ops.cos(t), popxl.TensorSpec((3,), popxl.float32))
        info = transforms.autodiff(g)
        sums = [op for op in info.graph.ops if op.type == "add_n"]
        assert len(sums) == 1 and len(sums[0].inputs) == 5  # five uses of t (t * t is two)
        n_adds = sum(op.type == "add" for op in info.graph.ops)
        assert transforms.decompose_sum(info.graph) is info.graph
        assert not any(op.type == "add_n" for op in info.graph.ops)
        assert sum(op.type == "add" for op in info.graph.ops) == n_adds + 4
        site = ops.call_with_info(g, popxl.constant(x))
        (dx,) = ops.call(info.graph, popxl.constant(np.ones(3, np.float32)), inputs_dict=info.inputs_dict(site))
        out = popxl.d2h_stream((3,), popxl.float32, "dx")
        ops.host_store(out, dx)
    with popxl.Session(ir, "ipu_model") as s:
        res = s.run()[out]
    np.testing.assert_allclose(res, np.cos(x) + np.exp(x) + 2 * x - np.sin(x), rtol=1e-6)
