"""Collectives on the reference engine with several replicas in lockstep."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.ops import collectives as coll

R = 4


def _run_replicated(build, data, replication=R, group_args=None):
    """``build(x, group)`` -> tensor; ``data`` is (R, *shape). Returns (R, *out_shape)."""
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        x_s = popxl.h2d_stream(data.shape[1:], popxl.dtypes.from_numpy(data.dtype), "x")
        group = ir.replica_grouping(**group_args) if group_args else None
        y = build(ops.host_load(x_s), group)
        y_s = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(y_s, y)
    with popxl.Session(ir, "ipu_model") as s:
        return s.run({x_s: data})[y_s], y


DATA = np.arange(R * 6, dtype=np.float32).reshape(R, 2, 3) - 7


@pytest.mark.parametrize("op,fn", [("add", np.sum), ("mean", np.mean), ("mul", np.prod), ("min", np.min),
                                   ("max", np.max), ("square_add", lambda x, axis: np.sum(x * x, axis=axis))])
def test_all_reduce_ops(op, fn):
    out, _ = _run_replicated(lambda x, g: coll.replicated_all_reduce(x, op, g), DATA)
    np.testing.assert_allclose(out, np.broadcast_to(fn(DATA, axis=0), DATA.shape), rtol=1e-6)


def test_all_reduce_in_groups_and_in_place():
    # group_size 2, stride 1: replicas {0,1}, {2,3}
    def build(x, g):
        coll.replicated_all_reduce_(x, "add", g)
        return x * 1.0

    out, _ = _run_replicated(build, DATA, group_args={"stride": 1, "group_size": 2})
    expected = np.concatenate([np.broadcast_to(DATA[:2].sum(0), (2, 2, 3)), np.broadcast_to(DATA[2:].sum(0), (2, 2, 3))])
    np.testing.assert_allclose(out, expected)


def test_reduce_scatter_then_all_gather_round_trips_through_meta_shape():
    def build(x, g):
        shard = coll.replicated_reduce_scatter(x, "add", g, configure_output_for_replicated_tensor_sharding=True)
        assert shard.shape == (2,) and shard.meta_shape == (2, 3)
        return coll.replicated_all_gather(shard, group=g)

    out, y = _run_replicated(build, DATA)
    assert y.shape == (2, 3)
    np.testing.assert_allclose(out, np.broadcast_to(DATA.sum(0), DATA.shape))


def test_reduce_scatter_chunks_and_sharded_slice():
    out, _ = _run_replicated(lambda x, g: coll.replicated_reduce_scatter(x, "add", g), DATA)
    flat = np.concatenate([DATA.sum(0).reshape(-1), np.zeros(2, np.float32)])  # 6 elements padded to 8
    np.testing.assert_allclose(out, flat.reshape(R, 2))
    out, y = _run_replicated(lambda x, g: coll.replica_sharded_slice(x, g), DATA)
    assert y.meta_shape == (2, 3)
    for r in range(R):
        np.testing.assert_allclose(out[r], np.concatenate([DATA[r].reshape(-1), [0, 0]])[2 * r:2 * r + 2])


def test_replicated_slice_and_gather_modes():
    data = np.arange(R * 8, dtype=np.float32).reshape(R, 8)
    out, y = _run_replicated(lambda x, g: coll.replicated_slice(x, 0, g), data)
    assert y.shape == (2,)
    for r in range(R):
        np.testing.assert_array_equal(out[r], data[r, 2 * r:2 * r + 2])
    out, y = _run_replicated(lambda x, g: coll.replicated_all_gather(x, 0, g, "new_axis"), data)
    assert y.shape == (R, 8)
    np.testing.assert_array_equal(out[1], data)
    out, _ = _run_replicated(lambda x, g: coll.replicated_all_gather(x, 0, g, "concat"), data)
    np.testing.assert_array_equal(out[3], data.reshape(-1))


def test_replicated_slice_of_length_one_drops_the_axis():
    """As in PopXL: (R, 2, 3) sliced on axis 0 over R replicas is (2, 3) on each replica (not
    (1, 2, 3)), (3, 2) on axis 1 over 2 replicas is (3,); the gradient has the input's shape."""
    out, y = _run_replicated(lambda x, g: coll.replicated_slice(x, 0, g), np.stack([DATA] * R))
    assert y.shape == (2, 3)
    np.testing.assert_array_equal(out, DATA)
    data = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    out, y = _run_replicated(lambda x, g: coll.replicated_slice(x, 1, g), data, replication=2)
    assert y.shape == (3,)
    np.testing.assert_array_equal(out, [data[0, :, 0], data[1, :, 1]])

    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        x = popxl.variable(np.ones((R, 3), np.float32))
        graph = ir.create_graph(lambda t: coll.replicated_slice(t), x)
        grad = popxl.transforms.autodiff(graph)
        assert graph.outputs[0].shape == (3,) and grad.graph.outputs[0].shape == (R, 3)


def test_single_replica_collectives_are_copies_and_errors():
    data = np.arange(6, dtype=np.float32).reshape(1, 6)  # the host buffer drops the size-1 replica dim
    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((6,), popxl.float32)
        y_s = popxl.d2h_stream((6,), popxl.float32)
        ops.host_store(y_s, coll.replicated_all_reduce(ops.host_load(x_s)))
    with popxl.Session(ir) as s:
        np.testing.assert_array_equal(s.run({x_s: data[0]})[y_s], data[0])
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        x = popxl.variable(np.ones(6, np.float32))
        with pytest.raises(ValueError, match="Unknown collective op"):
            coll.replicated_all_reduce(x, "xor")
        with pytest.raises(ValueError, match="cannot be split equally"):
            coll.replicated_slice(popxl.variable(np.ones(6, np.float32)), 0)
        with pytest.raises(ValueError, match="bad output_shape"):
            coll.replicated_all_gather(x, output_shape="nope")


def test_all_reduce_across_ipus():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.constant(np.array([1.0, 2.0], np.float32))
        b = popxl.constant(np.array([10.0, 20.0], np.float32))
        ra, rb = coll.all_reduce([a, b], ipus=[0, 1])
        ia, ib = coll.all_reduce_identical_inputs([a, b])
        outs = [ra, rb, ia, ib]
        streams = [popxl.d2h_stream((2,), popxl.float32) for _ in outs]
        for s, t in zip(streams, outs):
            ops.host_store(s, t)
    with popxl.Session(ir) as s:
        res = s.run()
    np.testing.assert_array_equal(res[streams[0]], [11, 22])
    np.testing.assert_array_equal(res[streams[1]], [11, 22])
    np.testing.assert_array_equal(res[streams[2]], [1, 2])
    np.testing.assert_array_equal(res[streams[3]], [10, 20])


IRREGULAR = [0, 0, 1, 1, 0, 0, 1, 1]  # two groups of 4 with no constant stride


@pytest.mark.parametrize("eng", ["native", "reference"])
def test_collectives_over_a_non_constant_grouping(eng):
    """Every replica collective accepts a grouping made from irregular assignments: members of a
    group meet in replica order (PopXL takes constant groupings only)."""
    from engine_harness import engine
    data = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) * 0.5 - 3
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        g = ir.replica_grouping_from_assignments(IRREGULAR)
        assert not g.is_const
        x = ops.host_load(x_s := popxl.h2d_stream((4,), popxl.float32, "x"))
        results = {
            "sum": coll.replicated_all_reduce(x, "add", g),
            "max": coll.replicated_all_reduce(x, "max", g),
            "scatter": coll.replicated_reduce_scatter(x, "add", g),
            "gather": coll.replicated_all_gather(x, 0, g, "new_axis"),
            "slice": coll.replicated_slice(x, 0, g),
            "shard": coll.replica_sharded_slice(x, g),
        }
        y = x * 1.0
        coll.replicated_all_reduce_(y, "mul", g)
        results["prod_"] = y
        streams = {}
        for name, t in results.items():
            streams[name] = popxl.d2h_stream(t.shape, t.dtype, name)
            ops.host_store(streams[name], t)
    with engine(eng), popxl.Session(ir, "ipu_model") as s:
        res = s.run({x_s: data})
    out = {name: res[st] for name, st in streams.items()}
    members = {grp: [r for r, a in enumerate(IRREGULAR) if a == grp] for grp in (0, 1)}
    for r in range(8):
        mine = members[IRREGULAR[r]]
        j = mine.index(r)  # place in the group
        np.testing.assert_allclose(out["sum"][r], data[mine].sum(0))
        np.testing.assert_allclose(out["max"][r], data[mine].max(0))
        np.testing.assert_allclose(out["prod_"][r], data[mine].prod(0))
        np.testing.assert_allclose(out["scatter"][r], data[mine].sum(0)[j:j + 1])
        np.testing.assert_allclose(out["gather"][r], data[mine])
        np.testing.assert_allclose(out["slice"][r], data[r, j:j + 1])
        np.testing.assert_allclose(out["shard"][r], data[r, j:j + 1])


def test_collective_group_must_be_a_grouping_of_this_ir():
    ir = popxl.Ir(replication=4)
    other = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.ones(4, np.float32))
        with pytest.raises(TypeError, match="ReplicaGrouping"):
            coll.replicated_all_reduce(x, group=[0, 0, 1, 1])
        with pytest.raises(ValueError, match="groups 2 replicas, but the Ir has 4"):
            coll.replicated_all_gather(x, group=other.replica_grouping())
