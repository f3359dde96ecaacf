"""Remote memory: RemoteBuffer, remote_load(_)/remote_store/remote_code_load, remote variables and
replica-sharded variables, on both engines: round trips across runs and slots, aliasing of
remote_load_, tensor offsets, in_sequence ordering, loops over slots, Session data in and out
(get_tensor_data / write_variables_data), sharding over 2 and 4 replicas, and every error."""
import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from engine_harness import engine
from popxl.op import REGISTRY, Grad
from popxl.remote_buffer import _buffers_of

ENGINES = ["native", "reference"]
RNG = np.random.default_rng(11)


@pytest.fixture(params=ENGINES)
def eng(request):
    return request.param


def _session(ir, eng):
    with engine(eng):
        return popxl.Session(ir, "ipu_model")


def _out(t, name):
    s = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(s, t)
    return s


# round trips ---------------------------------------------------------------------------------------
def test_store_then_load_across_runs_and_slots(eng):
    """Data stored in one run is loaded in later runs, from whichever slot it went to."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2, 3), popxl.float32, entries=3)
        xs = popxl.h2d_stream((2, 3), popxl.float32, "x")
        store_at = popxl.h2d_stream((), popxl.int32, "store_at")
        load_at = popxl.h2d_stream((), popxl.uint32, "load_at")
        ops.remote_store(buf, ops.host_load(store_at), ops.host_load(xs))
        out = _out(ops.remote_load(buf, ops.host_load(load_at)), "y")
    data = [RNG.normal(size=(2, 3)).astype(np.float32) for _ in range(4)]
    sess = _session(ir, eng)
    with sess:
        def run(i, store, load):
            return sess.run({xs: data[i], store_at: np.int32(store), load_at: np.uint32(load)})[out]
        np.testing.assert_array_equal(run(0, 0, 0), data[0])  # same run
        np.testing.assert_array_equal(run(1, 2, 0), data[0])  # slot 0 kept across runs
        np.testing.assert_array_equal(run(2, 1, 2), data[1])
        np.testing.assert_array_equal(run(3, 0, 1), data[2])
        np.testing.assert_array_equal(run(0, 2, 0), data[3])


def test_int_offsets_several_slots_in_one_run(eng):
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((4,), popxl.int32, 2)
        a = popxl.constant(np.arange(4, dtype=np.int32))
        ops.remote_store(buf, 0, a)
        ops.remote_store(buf, 1, a * 10)
        second = ops.remote_load(buf, 1, name="second")
        first = ops.remote_load(buf, 0)
        outs = [_out(second, "s"), _out(first, "f")]
    assert second.name == "second_remote_loaded" and second.shape == (4,) and second.dtype == popxl.int32
    assert first.name.startswith("id_1_offset_offset") and first.name.endswith("_remote_loaded")
    with _session(ir, eng) as sess:
        res = sess.run()
    np.testing.assert_array_equal(res[outs[0]], np.arange(4) * 10)
    np.testing.assert_array_equal(res[outs[1]], np.arange(4))


def test_remote_load_inplace_aliases_its_target(eng):
    """remote_load_ overwrites t: later reads of t (and the variable it is) see the slot's value."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((3,), popxl.float32, 2)
        v = popxl.variable(np.zeros(3, np.float32), name="v")
        ops.remote_store(buf, 1, popxl.constant(np.array([1, 2, 3], np.float32)))
        alias = ops.remote_load_(buf, 1, v)
        doubled = v * 2  # reads v after the in-place load
        ops.var_updates.accumulate_(alias, popxl.constant(np.ones(3, np.float32)))
        outs = [_out(doubled, "d"), _out(v, "v")]
    assert alias.shape == v.shape and REGISTRY["remote_load_"].inplace == 0
    with _session(ir, eng) as sess:
        res = sess.run()
        np.testing.assert_array_equal(res[outs[0]], [2, 4, 6])
        np.testing.assert_array_equal(res[outs[1]], [2, 3, 4])
        np.testing.assert_array_equal(sess.get_tensor_data(v), [2, 3, 4])


def test_in_sequence_orders_loads_and_stores(eng):
    """A load traced before a store sees the previous run's value; one traced after sees the new one."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2,), popxl.float32, 1)
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        before = ops.remote_load(buf, 0)
        ops.remote_store(buf, 0, ops.host_load(xs))
        after = ops.remote_load(buf, 0)
        outs = [_out(before, "before"), _out(after, "after")]
    x1, x2 = np.array([1, 2], np.float32), np.array([3, 4], np.float32)
    with _session(ir, eng) as sess:
        np.testing.assert_array_equal(sess.run({xs: x1})[outs[1]], x1)
        res = sess.run({xs: x2})
    np.testing.assert_array_equal(res[outs[0]], x1)
    np.testing.assert_array_equal(res[outs[1]], x2)


def test_loop_over_slots_with_a_tensor_offset(eng):
    """In a repeat body the slot index is a carried counter: each iteration doubles one slot."""
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 4)
        init = RNG.normal(size=(4, 2)).astype(np.float32)
        rvs = [popxl.remote_variable(init[k], buf, k, name=f"r{k}") for k in range(4)]

        def body(i: popxl.Tensor, total: popxl.Tensor):
            with popxl.in_sequence():
                x = ops.remote_load(buf, i)
                ops.remote_store(buf, i, x * 2)
                return i + 1, total + x

        g = ir.create_graph(body, popxl.constant(np.uint32(0)), popxl.constant(np.zeros(2, np.float32)))
        _, total = ops.repeat(g, 4, popxl.constant(np.uint32(0)), popxl.constant(np.zeros(2, np.float32)))
        out = _out(total, "total")
    with _session(ir, eng) as sess:
        np.testing.assert_allclose(sess.run()[out], init.sum(0), rtol=1e-6)
        np.testing.assert_allclose(sess.run()[out], 2 * init.sum(0), rtol=1e-6)
        for k, rv in enumerate(rvs):
            np.testing.assert_array_equal(sess.get_tensor_data(rv), init[k] * 4)


def test_remote_code_load_is_a_no_op(eng):
    ir = popxl.Ir()
    g = ir.create_graph(lambda x: x + 1, popxl.TensorSpec((2,), popxl.float32))

    def loader(graph: popxl.Graph) -> None:
        ops.remote_code_load(graph, destination="executable")

    loads_g = ir.create_graph(loader, g)  # code loads nested in other graphs
    loads_loader = ir.create_graph(loader, loads_g)
    with ir.main_graph, popxl.in_sequence():
        ops.remote_code_load(g, "executable")
        ops.call(loads_g)
        ops.remote_code_load(loads_loader, "executable")
        ops.call(loads_loader)
        (y,) = ops.call(g, popxl.constant(np.array([1, 2], np.float32)))
        out = _out(y, "y")
    assert "remote_code_load" not in ops.__all__
    with _session(ir, eng) as sess:
        np.testing.assert_array_equal(sess.run()[out], [2, 3])


# remote variables ---------------------------------------------------------------------------------
def test_remote_variable_get_and_write_data(eng):
    ir = popxl.Ir()
    init = np.array([[1, 2], [3, 4]], np.float32)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2, 2), popxl.float32, 2)
        rv = popxl.remote_variable(init, buf, 1, name="rv")
        other = popxl.remote_variable(init * 0, buf, 0, name="other")
        x = ops.remote_load(buf, 1)
        ops.remote_store(buf, 1, x + 1)
        out = _out(x, "x")
    assert isinstance(rv, popxl.tensor.Variable) and rv.shape == (2, 2) and rv.dtype == popxl.float32
    assert rv in ir.main_graph.variables
    sess = _session(ir, eng)
    np.testing.assert_array_equal(sess.get_tensor_data(rv), init)  # detached: the host copy
    with sess:
        np.testing.assert_array_equal(sess.run()[out], init)
        np.testing.assert_array_equal(sess.get_tensor_data(rv), init + 1)
        sess.write_variables_data({rv: np.full((2, 2), 10, np.float32)})
        np.testing.assert_array_equal(sess.run()[out], np.full((2, 2), 10))
        np.testing.assert_array_equal(sess.get_tensors_data([rv, other])[other], np.zeros((2, 2)))
        sess.write_variable_data(other, np.ones((2, 2), np.float32))  # same buffer, other slot
        np.testing.assert_array_equal(sess.run()[out], np.full((2, 2), 11))
    np.testing.assert_array_equal(sess.get_tensor_data(rv), np.full((2, 2), 12))
    np.testing.assert_array_equal(sess.get_tensor_data(other), np.ones((2, 2)))
    with sess:  # re-attaching writes the host copies back into remote memory
        np.testing.assert_array_equal(sess.run()[out], np.full((2, 2), 12))


def test_remote_variable_with_replica_groups(eng):
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(stride=2, group_size=2)  # replicas 0,2 and 1,3
    values = np.arange(2 * 5, dtype=np.int32).reshape(2, 5)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((5,), popxl.int32)
        rv = popxl.remote_variable(values, buf, replica_grouping=rg)
        v = ops.remote_load(buf, 0)
        v += 1
        ops.remote_store(buf, 0, v)
        out = _out(v, "v")
    assert rv.shape == (5,) and rv.shape_on_host == (2, 5)
    with _session(ir, eng) as sess:
        res = sess.run()[out]
    np.testing.assert_array_equal(res, values[[0, 1, 0, 1]] + 1)
    np.testing.assert_array_equal(sess.get_tensor_data(rv), values + 1)


def test_remote_variable_takes_a_group_axis_of_one(eng):
    """Data written per group, (num_groups, *shape), for a grouping of one group fits a slot of
    ``shape``: the leading axis of 1 is the group axis."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((3,), popxl.int32, entries=2)
        rv = popxl.remote_variable(np.array([[4, 5, 6]], np.int32), buf, 1, replica_grouping=ir.replica_grouping())
        out = _out(ops.remote_load(buf, 1), "v")
        with pytest.raises(ValueError, match=r"shape \(2, 3\) != \(3,\)"):
            popxl.remote_variable(np.zeros((2, 3), np.int32), buf, 0)  # only an axis of 1 is a group axis
    assert rv.shape == (3,)
    with _session(ir, eng) as sess:
        np.testing.assert_array_equal(sess.run()[out], [[4, 5, 6]] * 2)
        np.testing.assert_array_equal(sess.get_tensor_data(rv), [4, 5, 6])


# replica-sharded variables ------------------------------------------------------------------------
@pytest.mark.parametrize("replicas", [2, 4])
def test_replica_sharded_variable(eng, replicas):
    """The shard tensor holds this replica's chunk (flattened, zero padded); in-place updates of it
    reach the full variable's host value; new host data reaches the shards."""
    ir = popxl.Ir(replication=replicas)
    full = np.arange(1, 10, dtype=np.float32).reshape(3, 3)
    size = -(-9 // replicas)
    with ir.main_graph, popxl.in_sequence():
        var, shard = popxl.replica_sharded_variable(full, popxl.float32, name="w")
        out_before = _out(shard, "before")
        ops.var_updates.accumulate_(shard, popxl.constant(np.ones(size, np.float32)))
        gathered = ops.collectives.replicated_all_gather(shard)
        outs = [_out(gathered, "full")]
    assert shard.shape == (size,) and shard.meta_shape == (3, 3)
    assert var.shape == (3, 3) and var.meta_shape == (3, 3)
    assert not isinstance(shard, popxl.tensor.Variable) and gathered.shape == (3, 3)
    padded = np.zeros(size * replicas, np.float32)
    padded[:9] = full.reshape(-1)
    with _session(ir, eng) as sess:
        res = sess.run()
        np.testing.assert_array_equal(res[out_before], padded.reshape(replicas, size))
        np.testing.assert_array_equal(res[outs[0]], np.broadcast_to(full + 1, (replicas, 3, 3)))
        np.testing.assert_array_equal(sess.get_tensor_data(var), full + 1)
        sess.write_variable_data(var, np.zeros((3, 3), np.float32))
        res = sess.run()
        np.testing.assert_array_equal(res[out_before], np.zeros((replicas, size)))
    np.testing.assert_array_equal(sess.get_tensor_data(var), np.ones((3, 3)))
    with pytest.raises(TypeError):
        sess.get_tensor_data(shard)
    with sess:  # attaching again fills the shards from the host value
        np.testing.assert_array_equal(sess.run()[outs[0]], np.full((replicas, 3, 3), 2))


@pytest.mark.parametrize("replicas", [2, 4])
def test_remote_replica_sharded_variable_gather_update_scatter(eng, replicas):
    ir = popxl.Ir(replication=replicas)
    x = np.arange(2 * replicas, dtype=np.int32)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2,), popxl.int32, 1)
        remote_x = popxl.remote_replica_sharded_variable(x, buf, 0)
        loaded = ops.remote_load(buf, 0)
        full_x = ops.collectives.replicated_all_gather(loaded)
        ops.var_updates.accumulate_(full_x, popxl.variable(np.full(x.shape, 5, np.int32)))
        ops.remote_store(buf, 0, ops.collectives.replica_sharded_slice(full_x))
    assert buf.meta_shape == x.shape and loaded.meta_shape == x.shape and full_x.shape == x.shape
    with _session(ir, eng) as sess:
        sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(remote_x), x + 5)
        sess.run()
    np.testing.assert_array_equal(sess.get_tensor_data(remote_x), x + 10)


def test_remote_replica_sharded_variable_in_slots_larger_than_a_shard(eng):
    """A buffer whose slots have the whole value's size (as PopXL programs sometimes make it):
    each replica keeps a slot's worth of consecutive elements, the rest is zero padding, and the
    value round-trips between host and device."""
    ir = popxl.Ir(replication=2)
    x = np.array([1.5, -2.0, 3.0], np.float32)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.RemoteBuffer((3,), popxl.float32, 1)
        var = popxl.remote_replica_sharded_variable(x, buf, 0)
        loaded = ops.remote_load(buf, 0)
        slot = _out(loaded, "slot")
        full = _out(ops.collectives.replicated_all_gather(loaded), "full")
    assert buf.meta_shape == (3,) and loaded.shape == (3,) and loaded.meta_shape == (3,)
    with _session(ir, eng) as sess:
        res = sess.run()
        np.testing.assert_array_equal(res[slot], [x, np.zeros(3)])  # replica 0 holds all three elements
        np.testing.assert_array_equal(res[full], [x, x])
        sess.write_variable_data(var, -x)
        np.testing.assert_array_equal(sess.run()[full], [-x, -x])
        np.testing.assert_array_equal(sess.get_tensor_data(var), -x)


def test_replica_sharded_variable_groups_and_shard_over(eng):
    """4 replicas: two groups of 2 with their own values; and one group sharded over 2 (replicas
    0,1 and 2,3 each hold a whole copy)."""
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(group_size=2)
    grouped = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)
    single = np.arange(5, dtype=np.float32) + 100
    with ir.main_graph:
        gvar, gshard = popxl.replica_sharded_variable(grouped, replica_grouping=rg)
        svar, sshard = popxl.replica_sharded_variable(single, shard_over=2)
        outs = [_out(gshard, "g"), _out(sshard, "s")]
        ops.var_updates.accumulator_scale_(gshard, 2.0)
    assert gvar.shape == (6,) and gvar.shape_on_host == (2, 6) and gshard.shape == (3,)
    assert sshard.shape == (3,) and sshard.meta_shape == (5,)
    with _session(ir, eng) as sess:
        res = sess.run()
    np.testing.assert_array_equal(res[outs[0]], grouped.reshape(4, 3))
    padded = np.append(single, 0).reshape(2, 3)
    np.testing.assert_array_equal(res[outs[1]], np.concatenate([padded, padded]))
    np.testing.assert_array_equal(sess.get_tensor_data(gvar), grouped * 2)
    np.testing.assert_array_equal(sess.get_tensor_data(svar), single)


def test_every_variable_kind_with_a_non_constant_grouping(eng, tmp_path, capsys):
    """On-chip, remote, remote replica-sharded and replica-sharded variables with groups
    [0, 0, 1, 1, 0, 0, 1, 1]; the sharded ones are sharded over const_rg's groups of 2 (pairs of
    neighbours), gathered and re-sliced over const_rg. Host data is a np.memmap, which PopXL copies
    (with a warning naming the variable) for a non-constant grouping: the files stay as they were."""
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping_from_assignments([0, 0, 1, 1, 0, 0, 1, 1])
    sub = rg.const_rg  # [0, 0, 1, 1, 2, 2, 3, 3]
    data = {k: np.memmap(tmp_path / f"{k}.bin", np.float32, "w+", shape=(2, 6)) for k in ("on", "rem", "rrts", "rts")}
    for i, d in enumerate(data.values()):
        d[:] = np.arange(12, dtype=np.float32).reshape(2, 6) * (i + 1)
    outs = {}
    with ir.main_graph, popxl.in_sequence():
        on = popxl.variable(data["on"], replica_grouping=rg)
        outs["on"] = _out(on + 1, "on")
        buf = popxl.remote_buffer((6,), popxl.float32)
        rem = popxl.remote_variable(data["rem"], buf, replica_grouping=rg)
        outs["rem"] = _out(ops.remote_load(buf, 0) + 1, "rem")
        sbuf = popxl.replica_sharded_buffer((2, 6), popxl.float32, replica_grouping=rg, shard_over=sub.group_size)
        rrts = popxl.remote_replica_sharded_variable(data["rrts"], sbuf, replica_grouping=rg)
        loaded = ops.remote_load(sbuf, 0)
        full = ops.collectives.replicated_all_gather(loaded, group=sub)
        outs["rrts"] = _out(full, "rrts")
        ops.remote_store(sbuf, 0, ops.collectives.replica_sharded_slice(full + 1, group=sub))
        rts, shard = popxl.replica_sharded_variable(data["rts"], replica_grouping=rg, shard_over=sub.group_size)
        ops.var_updates.accumulate_(shard, popxl.constant(np.ones(3, np.float32)))
        outs["rts"] = _out(ops.collectives.replicated_all_gather(shard, group=sub), "rts")
    per_replica = {k: v[rg.assignment] for k, v in data.items()}
    expected = {"on": per_replica["on"] + 1, "rem": per_replica["rem"] + 1, "rrts": per_replica["rrts"],
                "rts": per_replica["rts"] + 1}
    with _session(ir, eng) as sess:
        res = sess.run()
    for k, stream in outs.items():
        np.testing.assert_array_equal(res[stream], expected[k], err_msg=k)
    np.testing.assert_array_equal(sess.get_tensor_data(rrts), np.arange(12).reshape(2, 6) * 3 + 1)
    np.testing.assert_array_equal(sess.get_tensor_data(rts), np.arange(12).reshape(2, 6) * 4 + 1)
    for i, (k, d) in enumerate(data.items()):  # the files are not written back
        np.testing.assert_array_equal(d, np.arange(12).reshape(2, 6) * (i + 1), err_msg=k)
    warned = [line for line in capsys.readouterr().err.splitlines()
              if "you have passed np.memmap data and a non-const replica grouping" in line]
    assert len(warned) == 4 and all(f"Variable {v.id} (" in w for v, w in zip((on, rem, rrts, rts), warned)), warned


def test_replica_sharded_buffer_shapes():
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        b = popxl.replica_sharded_buffer((3, 5), popxl.float16)
        assert b.tensor_shape == (2,) and b.meta_shape == (3, 5) and b.tensor_dtype == popxl.float16
        b = popxl.replica_sharded_buffer((3, 5), popxl.float16, shard_over=4, entries=3)
        assert b.tensor_shape == (4,) and b.entries == 3
        rg = ir.replica_grouping(group_size=4)
        b = popxl.replica_sharded_buffer((2, 7), popxl.float32, rg)
        assert b.tensor_shape == (2,) and b.meta_shape == (7,)


def test_executable_lists_regions_and_mirrors():
    from popxl.compiler import lower
    from popxl.compiler.executable import Executable
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        buf = popxl.remote_buffer((2, 3), popxl.float16, 5)
        _, shard = popxl.replica_sharded_variable(np.zeros(4, np.float32), name="w")
        ops.remote_store(buf, 4, popxl.constant(np.zeros((2, 3), np.float16)))
    exe = lower(ir)
    state = Executable.from_json(exe.to_json()).variables
    assert [e.get("remote_buffer") for e in state] == [1, 2, None]
    assert state[2] == {"name": shard.id, "buffer": state[2]["buffer"], "mirror_of": [2, 0]}
    region = exe.buffers[state[0]["buffer"]]
    assert region["shape"] == (5, 2, 3) and region["dtype"] == "float16"
    (store,) = [i for i in exe.graphs[0]["program"] if i.get("type") == "remote_store"]
    assert store["inputs"][-1] == state[0]["buffer"] and store["attrs"]["remote_buffer"] == 1


# RemoteBuffer object ------------------------------------------------------------------------------
def test_remote_buffer_properties():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.RemoteBuffer((2, 3), popxl.float32, 4)
        b = popxl.remote_buffer((1,), popxl.int8)
        t = popxl.variable(np.zeros((2, 3), np.float32), name="t")
    assert (a.remote_buffer_id, b.remote_buffer_id) == (1, 2)
    assert a.tensor_shape == (2, 3) and a.tensor_dtype == popxl.float32 and a.entries == 4
    assert b.entries == 1 and b.meta_shape == ()
    assert len({a, b, a}) == 2
    a.entries = 6
    a.meta_shape = (4, 3)
    assert a.entries == 6 and a.meta_shape == (4, 3)
    a.validate_tensor_matches_buffer(t)
    b.set_remote_buffer_info(popxl.float32, (6,), 2)
    b.validate_tensor_matches_buffer(popxl.TensorSpec((4, 3), popxl.float32), num_shards=2)
    assert b.tensor_shape == (6,) and b.tensor_dtype == popxl.float32 and b.entries == 2
    with ir.main_graph:
        assert popxl.remote_buffer((1,), popxl.int8).remote_buffer_id == 3
    assert a._current_ir is ir  # PopXL's name for the owning Ir
    for name, value in (("tensor_shape", (1,)), ("tensor_dtype", popxl.int8)):  # only set_remote_buffer_info
        with pytest.raises(AttributeError, match=f"can't set attribute '{name}'"):
            setattr(a, name, value)
    with pytest.raises(ValueError, match="^Entries must be a non-zero, positive integer"):
        a.entries = 0
    assert a.entries == 6 and a.tensor_shape == (2, 3)
    with popxl.Ir().main_graph:
        assert popxl.remote_buffer((1,), popxl.int8).remote_buffer_id == 1  # ids count per Ir


def test_gradient_decisions():
    for name in ("remote_load", "remote_load_", "remote_store", "remote_code_load"):
        assert REGISTRY[name].grad == Grad.STOP


# errors -------------------------------------------------------------------------------------------
def test_remote_buffer_errors():
    with pytest.raises(RuntimeError):
        popxl.remote_buffer((2,), popxl.float32)  # no graph context
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match="^Entries must be a non-zero, positive integer"):
            popxl.remote_buffer((2,), popxl.float32, 0)
        with pytest.raises(TypeError, match="dtype"):
            popxl.remote_buffer((2,), np.float32)
        buf = popxl.remote_buffer((2,), popxl.float32)
        with pytest.raises(ValueError, match="^Entries must be"):
            buf.entries = 0
        t = popxl.variable(np.zeros((3,), np.float32), name="wrong")
        with pytest.raises(ValueError, match=r"Tensor wrong does not match buffer. RemoteBuffer\[id=1.*shape \(3,\) != \(2,\)"):
            buf.validate_tensor_matches_buffer(t)


def test_op_trace_time_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 2)
        bad_shape = popxl.variable(np.zeros(3, np.float32), name="bad_shape")
        bad_dtype = popxl.variable(np.zeros(2, np.int32), name="bad_dtype")
        for call in (lambda t: ops.remote_store(buf, 0, t), lambda t: ops.remote_load_(buf, 0, t)):
            with pytest.raises(ValueError, match=r"Tensor bad_shape does not match buffer\. RemoteBuffer\[id=1 .*shape \(3,\) != \(2,\)"):
                call(bad_shape)
            with pytest.raises(ValueError, match=r"Tensor bad_dtype does not match buffer\. RemoteBuffer\[id=1 .*dtype int32 != float32"):
                call(bad_dtype)
        with pytest.raises(ValueError, match="offset must be >= 0"):
            ops.remote_load(buf, -1)
        with pytest.raises(TypeError, match="offset"):
            ops.remote_load(buf, 1.0)
        with pytest.raises(ValueError, match="integer tensor with one element"):
            ops.remote_load(buf, popxl.constant(np.float32(0)))
        with pytest.raises(ValueError, match="integer tensor with one element"):
            ops.remote_load(buf, popxl.constant(np.zeros(2, np.int32)))
        with pytest.raises(TypeError, match="RemoteBuffer"):
            ops.remote_load("buffer", 0)
        g = ir.create_empty_graph("g")
        with pytest.raises(NotImplementedError, match="compute_buffer"):
            ops.remote_code_load(g, "compute_buffer")
        with pytest.raises(ValueError, match="destination"):
            ops.remote_code_load(g, "elsewhere")
    with g:
        with pytest.raises(ValueError, match="^The remote_code_load op cannot load the code"):
            ops.remote_code_load(g, "executable")
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="different Ir"):
            ops.remote_load(buf, 0)


def test_factory_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 2)
        n_vars = len(ir.main_graph.variables)
        with pytest.raises(ValueError, match=r"remote_variable 'x'.*shape \(3,\) != \(2,\)"):
            popxl.remote_variable(np.zeros(3, np.float32), buf, name="x")
        with pytest.raises(ValueError, match="dtype int32 != float32"):
            popxl.remote_variable(np.zeros(2, np.int32), buf)
        with pytest.raises(ValueError, match="offset"):
            popxl.remote_variable(np.zeros(2, np.float32), buf, -1)
        assert len(ir.main_graph.variables) == n_vars  # rejected calls leave no variable behind
        with pytest.raises(ValueError, match="replication"):
            popxl.remote_replica_sharded_variable(np.zeros(4, np.float32), buf)
        with pytest.raises(ValueError, match="replica_sharded_variable 'w'.*replication"):
            popxl.replica_sharded_variable(np.zeros(4, np.float32), name="w")
        assert [b.remote_buffer_id for b in _buffers_of(ir)] == [1]
        g = ir.create_empty_graph("sub")
    with g:
        with pytest.raises(ValueError, match="main graph"):
            popxl.remote_variable(np.zeros(2, np.float32), buf)
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32)
        buf.meta_shape = (8,)
        with pytest.raises(ValueError, match=r"meta_shape \(8,\)"):
            popxl.remote_replica_sharded_variable(np.zeros(7, np.float32), buf)
        with pytest.raises(ValueError, match=r"shards over 4 replicas need 1-D slots of at least 3 elements, not \(2,\)"):
            popxl.remote_replica_sharded_variable(np.zeros(9, np.float32), popxl.remote_buffer((2,), popxl.float32))
        with pytest.raises(ValueError, match=r"need 1-D slots of at least 1 elements, not \(2, 2\)"):
            popxl.remote_replica_sharded_variable(np.zeros(4, np.float32), popxl.remote_buffer((2, 2), popxl.float32))
        with pytest.raises(ValueError, match="shard_over"):
            popxl.replica_sharded_buffer((8,), popxl.float32, shard_over=3)
        with pytest.raises(ValueError, match="shard_over"):
            popxl.replica_sharded_variable(np.zeros(8, np.float32), shard_over=0)


def test_compile_time_errors(eng):
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 1)
        rv = popxl.remote_variable(np.zeros(2, np.float32), buf, name="rv")
        _out(rv + 1, "y")
    with pytest.raises(ValueError, match="remote variable 'rv'.*ops.remote_load"):
        _session(ir, eng)
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 1)
        rv = popxl.remote_variable(np.zeros(2, np.float32), buf, name="rv")
        g = ir.create_graph(lambda x: x + 1, rv)
        _out(ops.call(g, rv)[0], "y")  # as a subgraph argument too
    with pytest.raises(ValueError, match="remote variable 'rv'.*ops.remote_load"):
        _session(ir, eng)
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 1)
        popxl.remote_variable(np.zeros(2, np.float32), buf, 3, name="far")
        _out(ops.remote_load(buf, 0), "y")
    with pytest.raises(ValueError, match="'far' is in slot 3.*only 1 entries"):
        _session(ir, eng)


def test_run_time_bad_offset(eng):
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 3)
        at = popxl.h2d_stream((), popxl.int32, "at")
        out = _out(ops.remote_load(buf, ops.host_load(at)), "y")
        ops.remote_store(buf, 5, popxl.constant(np.zeros(2, np.float32)))  # int offsets: checked at run time too
    with _session(ir, eng) as sess:
        msg = re.escape("remote_load: offset 7 is out of range for remote buffer 1, which has 3 entries")
        with pytest.raises(IndexError, match=msg):
            sess.run({at: np.int32(7)})
        with pytest.raises(IndexError, match="remote_store: offset 5"):
            sess.run({at: np.int32(1)})
    assert out is not None


# weight fragments: state loaded before the main program and stored after it ------------------------
def _fragment_state(ir, values, grouping=None):
    """popxl-addons' seed_variable pattern in our words: a remote variable loaded into a tensor in
    the WeightsFromHostFragment and stored back in the WeightsToHostFragment, both made before
    the main program's ops (which then read and change the tensor in place)."""
    from popxl.context import _execution_context
    buf = popxl.remote_buffer(values.shape[1:] if grouping is not None else values.shape, popxl.float32)
    var = popxl.remote_variable(values, buf, replica_grouping=grouping, name="state")
    with _execution_context(popxl.ExecutionContext.WeightsFromHostFragment):
        state = ops.remote_load(buf, 0, "state_from_host")
    with _execution_context(popxl.ExecutionContext.WeightsToHostFragment):
        ops.remote_store(buf, 0, state)
    return var, state


def test_weight_fragments_run_around_the_main_program(eng):
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(group_size=2)  # replicas 0,1 and 2,3
    values = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)
    with ir.main_graph:
        var, state = _fragment_state(ir, values, rg)
        seen = _out(state + 0.0, "seen")  # what this run started from
        ops.var_updates.accumulate_(state, popxl.constant(np.ones(2, np.float32)))  # changed in place
    ops_order = [op.type for op in ir.main_graph.schedule()]
    with _session(ir, eng) as sess:
        assert [op.type for op in ir.main_graph.schedule()] == ["remote_load", "add", "host_store", "accumulate_",
                                                                 "remote_store"] != ops_order
        np.testing.assert_array_equal(sess.run()[seen], values[[0, 0, 1, 1]])
        np.testing.assert_array_equal(sess.run()[seen], values[[0, 0, 1, 1]] + 1)  # the stored state
        np.testing.assert_array_equal(sess.get_tensor_data(var), values + 2)
        sess.write_variable_data(var, np.zeros((2, 2), np.float32))  # the next run loads it
        np.testing.assert_array_equal(sess.run()[seen], np.zeros((4, 2)))
    np.testing.assert_array_equal(sess.get_tensor_data(var), np.ones((2, 2)))


def test_weight_fragment_misuse_is_named():
    from popxl.context import _execution_context
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32)
        popxl.remote_variable(np.zeros(2, np.float32), buf, name="state")
        x = popxl.variable(np.ones(2, np.float32), name="x")
        y = x * 2.0
        with _execution_context(popxl.ExecutionContext.WeightsFromHostFragment):
            ops.remote_store(buf, 0, y)
    with pytest.raises(ValueError, match=r"remote_store .* runs in the WeightsFromHostFragment, before the main "
                                         r"program, but reads 'mul.*', which mul"):
        popxl.Session(ir, "ipu_model")
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32)
        popxl.remote_variable(np.zeros(2, np.float32), buf, name="state")
        with _execution_context(popxl.ExecutionContext.WeightsToHostFragment):
            late = ops.remote_load(buf, 0)
        _out(late + 1.0, "y")
    with pytest.raises(ValueError, match="add 'add' .* reads '.*remote_loaded', which remote_load 'remote_load' makes in the "
                                         "WeightsToHostFragment"):
        popxl.Session(ir, "ipu_model")
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")

        def body(t):
            with _execution_context(popxl.ExecutionContext.WeightsFromHostFragment):
                return t + 1.0

        with pytest.raises(ValueError, match="WeightsFromHostFragment holds main-graph ops only"):
            ir.create_graph(body, x)
