"""The kinds of programs the foundation must run unchanged, end to end through Session."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops


def test_two_streamed_inputs_added_run_and_run_with_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        a_h2d = popxl.h2d_stream((2, 3), popxl.float32, name="a_stream")
        b_h2d = popxl.h2d_stream((2, 3), popxl.float32, name="b_stream")
        a = ops.host_load(a_h2d, "a")
        b = ops.host_load(b_h2d, "b")
        o = a + b
        o_d2h = popxl.d2h_stream(o.shape, o.dtype, name="o_stream")
        ops.host_store(o_d2h, o)
    a_data = np.arange(6, dtype=np.float32).reshape(2, 3)
    b_data = np.full((2, 3), 0.5, np.float32)
    session = popxl.Session(ir, "ipu_model")
    assert set(session.expected_inputs()) == {a_h2d, b_h2d}
    with session:
        outputs = session.run({a_h2d: a_data, b_h2d: b_data})
        np.testing.assert_array_equal(outputs[o_d2h], a_data + b_data)
        outs = session.create_host_outputs()
        assert outs[o_d2h].shape == (2, 3)
        session.run_with_outputs({a_h2d: a_data, b_h2d: 2 * b_data}, outs)
        np.testing.assert_array_equal(outs[o_d2h], a_data + 2 * b_data)


def test_subgraph_called_twice_with_variable_through_inputs_dict():
    class Scale(popxl.Module):
        def build(self, x: popxl.Tensor) -> popxl.Tensor:
            self.w = popxl.graph_input(x.shape, x.dtype, "w")
            return x * self.w + 1.0

    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.array([2.0, 3.0], np.float32), name="w")
        x = popxl.constant(np.array([1.0, -1.0], np.float32), name="x")
        m = Scale()
        g = ir.create_graph(m, x)
        (y1,) = ops.call(g, x, inputs_dict={m.w: w})
        (y2,) = ops.call(g, y1, inputs_dict={m.w: w})
        d = popxl.d2h_stream(y2.shape, y2.dtype)
        ops.host_store(d, y2)
    with popxl.Session(ir, "cpu") as s:
        out = s.run()[d]
    w_np, x_np = np.array([2.0, 3.0]), np.array([1.0, -1.0])
    np.testing.assert_allclose(out, (x_np * w_np + 1) * w_np + 1)


def test_repeat_with_loop_carried_tensors():
    def body(acc: popxl.Tensor, i: popxl.Tensor, step: popxl.Tensor):
        return acc + i * step, i + step

    ir = popxl.Ir()
    with ir.main_graph:
        acc0 = popxl.constant(np.zeros(3, np.float32))
        i0 = popxl.constant(np.ones(3, np.float32))
        step = popxl.constant(np.array([1.0, 2.0, 0.5], np.float32))
        g = ir.create_graph(body, acc0, i0, step)
        acc, i = ops.repeat(g, 4, acc0, i0, step)
        d1, d2 = popxl.d2h_stream((3,), popxl.float32), popxl.d2h_stream((3,), popxl.float32)
        ops.host_store(d1, acc)
        ops.host_store(d2, i)
    with popxl.Session(ir) as s:
        out = s.run()
    acc_np, i_np, st = np.zeros(3), np.ones(3), np.array([1.0, 2.0, 0.5])
    for _ in range(4):
        acc_np, i_np = acc_np + i_np * st, i_np + st
    np.testing.assert_allclose(out[d1], acc_np)
    np.testing.assert_allclose(out[d2], i_np)


def test_variable_plus_constant_and_weights_round_trip():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.array([1, 2, 3], np.int32), name="v")
        c = popxl.constant(np.array([10, 20, 30], np.int32), name="c")
        ops.add_(v, c)  # v += c on the device
        d = popxl.d2h_stream((3,), popxl.int32)
        ops.host_store(d, v + c)
    s = popxl.Session(ir)
    with s:
        out = s.run()[d]
        np.testing.assert_array_equal(out, [21, 42, 63])
        np.testing.assert_array_equal(s.get_tensor_data(v), [11, 22, 33])
        out2 = s.run()[d]
        np.testing.assert_array_equal(out2, [31, 62, 93])
    # after exit the host copy is synced
    np.testing.assert_array_equal(s.get_tensor_data(v), [21, 42, 63])
    np.testing.assert_array_equal(s.get_tensor_data(c), [10, 20, 30])


def test_nested_with_session_blocks():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((2,), np.float32), name="v")
        ops.add_(v, popxl.constant(np.ones((2,), np.float32)))
    s = popxl.Session(ir)
    assert not s.is_attached
    with s:
        assert s.is_attached
        s.run()
        with s:  # inner level: attached already, so it neither syncs nor detaches
            s.run()
        assert s.is_attached
        s.run()
    assert not s.is_attached
    np.testing.assert_array_equal(s.get_tensor_data(v), [3, 3])
    with s:  # re-entering copies the host weights back to the device
        s.run()
    np.testing.assert_array_equal(s.get_tensor_data(v), [4, 4])


def test_get_and_write_variable_data_attached_and_detached():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.array([1.0, 2.0], np.float32), name="v")
        w = popxl.variable(np.array([5.0], np.float32), name="w")
        ops.add_(v, popxl.constant(np.ones(2, np.float32)))
        ops.add_(w, popxl.constant(np.ones(1, np.float32)))
    s = popxl.Session(ir)
    # detached: host only
    s.write_variable_data(v, np.array([10.0, 20.0], np.float32))
    np.testing.assert_array_equal(s.get_tensor_data(v), [10, 20])
    with s:  # enter sends the written value
        s.run()
        np.testing.assert_array_equal(s.get_tensor_data(v), [11, 21])
        s.run()
        # attached: host and device; w keeps its device value (it was trained)
        s.write_variable_data(v, np.array([0.0, 0.0], np.float32))
        s.run()
        data = s.get_tensors_data([v, w])
        np.testing.assert_array_equal(data[v], [1, 1])
        np.testing.assert_array_equal(data[w], [8])
    with pytest.raises(TypeError, match="dtype"):
        s.write_variable_data(v, np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match=r"expects shape \(2,\)"):
        s.write_variable_data(v, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="is not of type Variable"):
        s.write_variable_data(popxl.Ir, np.zeros(3, np.float32))


def test_num_host_transfers_with_several_loads_and_stores_per_step():
    ir = popxl.Ir()
    ir.num_host_transfers = 3
    with ir.main_graph:
        x_s = popxl.h2d_stream((2,), popxl.float32, "x")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")
        z_s = popxl.d2h_stream((), popxl.float32, "z")

        def step(total: popxl.Tensor):
            x = ops.host_load(x_s)
            ops.host_store(y_s, x * 2.0)
            total = total + ops.sum(x)
            ops.host_store(z_s, total)
            return total

        total0 = popxl.constant(np.float32(0))
        g = ir.create_graph(step, total0)
        ops.repeat(g, 3, total0)
    s = popxl.Session(ir)
    outs = s.create_host_outputs()
    assert outs[y_s].shape == (3, 2) and outs[z_s].shape == (3,)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with s:
        out = s.run({x_s: x})
    np.testing.assert_array_equal(out[y_s], 2 * x)
    np.testing.assert_array_equal(out[z_s], np.cumsum(x.sum(1)))


def test_replication_factor_stream_shapes():
    ir = popxl.Ir(replication=4)
    ir.num_host_transfers = 2
    with ir.main_graph:
        x_s = popxl.h2d_stream((3,), popxl.float32, "x")
        y_s = popxl.d2h_stream((3,), popxl.float32, "y")
        v = popxl.variable(np.ones(3, np.float32), name="v")
        g = ir.create_graph(lambda v_: ops.host_store(y_s, ops.host_load(x_s) + v_), v)
        ops.repeat(g, 2, inputs_dict={g.inputs[0]: v})
    s = popxl.Session(ir, "ipu_model")
    outs = s.create_host_outputs()
    assert outs[y_s].shape == (2, 4, 3)
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    with s:
        out = s.run({x_s: x})
    np.testing.assert_allclose(out[y_s], x + 1)
    with pytest.raises(ValueError, match="replication"):
        popxl.Session(_tiny_ir(replication=2), "cpu")


def _tiny_ir(replication=1):
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        ops.add(popxl.constant(1.0), popxl.constant(2.0))
    return ir


def test_host_shapes_follow_the_d_r_rule():
    for nht, rf, expected in [(4, 16, (4, 16, 2, 4)), (1, 16, (16, 2, 4)), (4, 1, (4, 2, 4)), (1, 1, (2, 4))]:
        ir = popxl.Ir(replication=rf)
        ir.num_host_transfers = nht
        with ir.main_graph:
            d = popxl.d2h_stream((2, 4), popxl.float32)
            zeros = popxl.constant(np.zeros((2, 4), np.float32))
            ops.repeat(ir.create_graph(lambda z: ops.host_store(d, z), zeros), nht, zeros)
        s = popxl.Session(ir, "ipu_model")
        assert s.create_host_outputs()[d].shape == expected
