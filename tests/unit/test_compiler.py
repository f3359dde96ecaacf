"""Lowering: the executable is plain data that round-trips through JSON, and the memory plan
reuses storage by liveness while keeping aliases in place."""
import json

import numpy as np

import popxl
import popxl.ops as ops
from popxl.compiler import Executable, lower
from popxl.engines.reference import ReferenceEngine


def _chain_ir(n=6, size=256):
    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((size,), popxl.float32, "x")
        y_s = popxl.d2h_stream((size,), popxl.float32, "y")
        t = ops.host_load(x_s)
        for i in range(n):
            t = ops.relu(t * 2.0 - 1.0)
        ops.host_store(y_s, t)
    return ir


def _expected_chain(x, n=6):
    for _ in range(n):
        x = np.maximum(x * 2 - 1, 0)
    return x


def test_executable_round_trips_through_json_and_runs_the_same():
    ir = _chain_ir()
    exe = lower(ir)
    text = exe.to_json()
    json.loads(text)  # plain JSON
    again = Executable.from_json(text)
    assert again.to_json() == text
    x = np.linspace(-1, 2, 256, dtype=np.float32)
    results = []
    for e in (exe, again):
        eng = ReferenceEngine(e)
        eng.attach()
        out = np.zeros((1, 1, 256), np.float32)
        eng.run([x.reshape(1, 1, 256)], [out])
        results.append(out.reshape(256))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], _expected_chain(x))


def test_lowering_is_deterministic():
    assert lower(_chain_ir()).to_json() == lower(_chain_ir()).to_json()


def test_liveness_reuses_memory():
    n, size = 20, 1024
    exe = lower(_chain_ir(n, size))
    # 3 intermediates per layer live briefly: far less than one buffer per intermediate
    assert exe.arena_bytes < 8 * size * 4, exe.arena_bytes
    x = np.linspace(-1, 2, size, dtype=np.float32)
    eng = ReferenceEngine(exe)
    eng.attach()
    out = np.zeros((1, 1, size), np.float32)
    eng.run([x.reshape(1, 1, size)], [out])
    np.testing.assert_allclose(out.reshape(size), _expected_chain(x, n))


def test_views_share_their_inputs_storage():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((4, 6), np.float32), name="v")
        t = v.transpose_()
        s = ops.slice_(t, start=2, stop=4, axis=0)
        r = ops.reshape_(v, (24,))
        ops.add_(s, popxl.constant(np.ones((2, 4), np.float32)))
        ops.host_store(popxl.d2h_stream((24,), popxl.float32), r)
    exe = lower(ir)
    var_buf = exe.buffers[exe.variables[0]["buffer"]]
    offsets = {b["offset"] for b in exe.buffers}
    assert var_buf["offset"] in offsets
    views = [b for b in exe.buffers if b["offset"] - var_buf["offset"] in range(96)]
    assert {b["shape"] for b in views} >= {(2, 4), (24,)}
    (sliced,) = [b for b in views if b["strides"] == (4, 24)]  # rows 2..3 of v.T, inside v
    assert sliced["shape"] == (2, 4) and sliced["offset"] == var_buf["offset"] + 8
    assert all(ins["kind"] != "op" or ins["type"] not in ("transpose_", "slice_", "reshape_")
               for ins in exe.graphs[0]["program"])


def _instr(exe, kind):
    return [i for g in exe.graphs for i in g["program"] if i["kind"] == kind]


def test_single_site_inputs_use_the_callers_storage():
    """A loop body updating variables by reference works on the variables themselves: no copy
    in, no copy back, and no second buffer for them."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros((64, 64), np.float32), name="w")
        x = popxl.variable(np.ones((64, 64), np.float32), name="x")

        def step(w: popxl.TensorByRef, x):
            ops.scaled_add_(w, x, b=0.5)

        ops.repeat(ir.create_graph(step, w, x), 4, w, x)
    exe = lower(ir)
    (rep,) = _instr(exe, "repeat")
    assert rep["copy_in"] == [] and rep["copy_out"] == []
    assert exe.arena_bytes < 3 * 64 * 64 * 4  # w and x once each (plus alignment), not twice
    with popxl.Session(ir, "ipu_model") as s:
        s.run()
    np.testing.assert_array_equal(s.get_tensor_data(w), np.full((64, 64), 2.0, np.float32))


def test_by_value_input_written_inside_is_still_copied():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(3, np.float32), name="a")

        def f(t):
            ops.relu_(ops.negate(t))
            return ops.add_(t, popxl.constant(np.ones(3, np.float32)))  # writes its by-value input

        (y,) = ops.call(ir.create_graph(f, a), a)
        out = popxl.d2h_stream((3,), popxl.float32, "y")
        ops.host_store(out, y)
    exe = lower(ir)
    (call,) = _instr(exe, "call")
    assert len(call["copy_in"]) == 1
    with popxl.Session(ir, "ipu_model") as s:
        res = s.run()
    np.testing.assert_array_equal(res[out], [2, 2, 2])
    np.testing.assert_array_equal(s.get_tensor_data(a), [1, 1, 1])  # the caller's tensor is unchanged


def test_graph_called_twice_keeps_its_own_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.constant(np.ones(3, np.float32))
        g = ir.create_graph(lambda t: t * 2.0, a)
        ops.call(g, a)
        ops.call(g, a + 1.0)
    calls = _instr(lower(ir), "call")
    assert all(len(c["copy_in"]) == 1 for c in calls)


def test_single_site_call_outputs_are_computed_in_the_callers_storage():
    """Outputs a called graph computes itself land where the caller wants them: no copy out.
    An output that is one of the graph's inputs, or a graph called from two sites, still copies."""
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.arange(6, dtype=np.float32), name="a")

        def f(t):
            y = ops.relu(t - 2.0)
            return y, y * 3.0, t  # two outputs it owns, one passed-through input

        y, z, t = ops.call(ir.create_graph(f, a), a)
        w = y + z  # the outputs stay usable, and the caller's later tensors do not clobber them
        streams = [popxl.d2h_stream((6,), popxl.float32, n) for n in "yztw"]
        for s_, v in zip(streams, (y, z, t, w)):
            ops.host_store(s_, v)
    exe = lower(ir)
    (call,) = _instr(exe, "call")
    assert len(call["copy_out"]) == 1  # only the passed-through input
    with popxl.Session(ir, "ipu_model") as s:
        res = s.run()
    want_y = np.maximum(np.arange(6, dtype=np.float32) - 2, 0)
    for stream, want in zip(streams, (want_y, 3 * want_y, np.arange(6), 4 * want_y)):
        np.testing.assert_array_equal(res[stream], want)

    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.constant(np.ones(3, np.float32))
        g = ir.create_graph(lambda t: t * 2.0, a)
        (b,) = ops.call(g, a)
        (c,) = ops.call(g, b)
        out = popxl.d2h_stream((3,), popxl.float32, "c")
        ops.host_store(out, c)
    calls = _instr(lower(ir), "call")
    assert all(len(c_["copy_out"]) == 1 for c_ in calls)  # two sites: one output storage inside g
    with popxl.Session(ir, "ipu_model") as s:
        np.testing.assert_array_equal(s.run()[out], [4, 4, 4])
