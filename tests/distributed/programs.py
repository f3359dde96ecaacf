"""Programs the distributed tests launch with poprun (one process per instance), or run alone.

    python programs.py MODE OUTDIR

Every instance builds the program with ``Ir(replication="popdist")``, runs it, and saves what it
saw to ``OUTDIR/<mode>_<instance>.npz``: its replicas' host outputs (with the global index of its
first replica) and the variables as ``get_tensor_data`` returns them. The tests put the instances'
files together and compare layouts (1 x 4, 2 x 2, 4 x 1) bit for bit.

Modes: ``collectives`` (every collective, with several groupings and dtypes, on both engines),
``mlp`` (data-parallel training of a small MLP), ``popart`` (a PopART TrainingSession), and the fault programs (``raise``, ``die``,
``differ``, ``other_engine``, ``early_end``, ``hang``), which end badly on purpose.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Dict

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository (benchmarks/)

import popdist  # noqa: E402
import popxl  # noqa: E402
import popxl.ops as ops  # noqa: E402


def replica_data(shape, replica: int, salt: int, dtype=np.float32) -> np.ndarray:
    """Deterministic per-replica values: the same for a replica whichever instance runs it."""
    rng = np.random.default_rng(1000 * salt + replica)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-9, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def local_rows(ir: popxl.Ir, make) -> np.ndarray:
    """This instance's replicas' rows of a per-replica input, shaped as the host buffer wants it."""
    offset = popdist.getReplicaIndexOffset() if popdist.getNumInstances() > 1 else 0
    rows = np.stack([make(offset + r) for r in range(ir.instance_replication_factor)])
    return rows if ir.instance_replication_factor > 1 else rows[0]


# every collective -------------------------------------------------------------------------------
def collectives(engine: str) -> Dict[str, np.ndarray]:
    os.environ["POPXL_ENGINE"] = engine
    ir = popxl.Ir(replication="popdist")
    R = ir.replication_factor
    groupings = {"all": ir.replica_grouping(),
                 "stride2": ir.replica_grouping(stride=2, group_size=2),
                 "pairs": ir.replica_grouping(group_size=2),
                 "irregular": ir.replica_grouping_from_assignments([0, 1, 1, 0][:R] if R == 4 else [0] * R)}
    inputs, outputs = {}, {}
    with ir.main_graph:
        def stream_in(name, shape, dtype, salt):
            s = popxl.h2d_stream(shape, dtype, name)
            inputs[s] = lambda r: replica_data(shape, r, salt, dtype.as_numpy())
            return ops.host_load(s)

        def stream_out(name, t):
            s = popxl.d2h_stream(t.shape, t.dtype, name)
            ops.host_store(s, t)
            outputs[name] = s

        x = stream_in("x", (5, 3), popxl.float32, 1)
        h = stream_in("h", (7,), popxl.float16, 2)
        i = stream_in("i", (8,), popxl.int32, 3)
        nan_x = ops.where(x > 1.5, x * float("nan"), x)  # some NaNs for min / max
        for gname, g in groupings.items():
            for op in ("add", "mean", "mul", "min", "max", "square_add"):
                stream_out(f"f32_{op}_{gname}", ops.collectives.replicated_all_reduce(x, op, g))
            for op in ("min", "max"):
                stream_out(f"nan_{op}_{gname}", ops.collectives.replicated_all_reduce(nan_x, op, g))
            for op in ("add", "mean"):
                stream_out(f"f16_{op}_{gname}", ops.collectives.replicated_all_reduce(h, op, g))
            for op in ("add", "mul", "min", "max", "mean"):
                stream_out(f"i32_{op}_{gname}", ops.collectives.replicated_all_reduce(i, op, g))
            for op in ("and", "or"):  # bool: the NumPy kernel runs it (the native engine's fallback)
                stream_out(f"bool_{op}_{gname}", ops.collectives.replicated_all_reduce(x > 0.0, op, g))
            inplace = x * 1.0
            ops.collectives.replicated_all_reduce_(inplace, "add", g)
            stream_out(f"inplace_{gname}", inplace)
            scattered = ops.collectives.replicated_reduce_scatter(x, "add", g, True)  # 15 over 2 or 4: padded
            stream_out(f"scatter_{gname}", scattered)
            stream_out(f"regather_{gname}", ops.collectives.replicated_all_gather(scattered, group=g))
            stream_out(f"gather_new_{gname}", ops.collectives.replicated_all_gather(x, 0, g, "new_axis"))
            stream_out(f"gather_concat_{gname}", ops.collectives.replicated_all_gather(x, 1, g, "concat"))
            stream_out(f"shard_{gname}", ops.collectives.replica_sharded_slice(x, g))
            stream_out(f"slice_{gname}", ops.collectives.replicated_slice(i, 0, g))
        # large enough that each instance's range of the elements goes in several chunks
        big = stream_in("big", (3, 100003), popxl.float32, 4)
        big_h = stream_in("big_h", (150001,), popxl.float16, 5)
        for gname in ("all", "stride2"):
            g = groupings[gname]
            for op in ("add", "mean"):
                stream_out(f"big_{op}_{gname}", ops.collectives.replicated_all_reduce(big, op, g))
            stream_out(f"big_h_mean_{gname}", ops.collectives.replicated_all_reduce(big_h, "mean", g))
            stream_out(f"big_scatter_{gname}", ops.collectives.replicated_reduce_scatter(big, "add", g, True))
        # popxl-addons' strided all-reduce (a custom op expanding into popxl's collectives)
        from popxl.ops.addons import replicated_all_reduce_strided
        stream_out("addons_strided", replicated_all_reduce_strided(x, "add", stride=2, group_size=R // 2 or 1))
        # variables: one value per replica (their groups live on every instance), every replica's
        # value of a shared one, and a replica-sharded one (shards spread over the instances)
        own = popxl.variable(np.zeros((R, 3), np.float32), name="own", replica_grouping=ir.replica_grouping(group_size=1))
        ops.add_(own, x[0])
        every = popxl.variable(np.zeros(3, np.float32), name="every", retrieval_mode="all_replicas")
        ops.add_(every, x[1])
        spread = groupings["stride2"]  # in 2 x 2, each group has a replica on each instance
        rts, shard = popxl.replica_sharded_variable(np.arange(2 * 10, dtype=np.float32).reshape(2, 10), name="rts",
                                                    replica_grouping=spread)
        ops.add_(shard, x[0, 0:1])
        stream_out("rts_full", ops.collectives.replicated_all_gather(shard, group=spread))
    with popxl.Session(ir, "ipu_model") as session:
        feed = {s: local_rows(ir, make) for s, make in inputs.items()}
        out = session.run(feed)
        weights = {v: value.copy() for v, value in session.get_tensors_data([own, every, rts]).items()}
        # written from every instance (each writes its replicas' groups), then run once more
        session.write_variables_data({own: np.arange(R * 3, dtype=np.float32).reshape(R, 3),
                                      rts: np.full((2, 10), 0.5, np.float32)})
        session.run(feed)
        rewritten = session.get_tensors_data([own, rts])
    result = {f"{engine}/{name}": out[s] for name, s in outputs.items()}
    result.update({f"{engine}/var_{v.name}": weights[v] for v in (own, every, rts)})
    result.update({f"{engine}/var_{v.name}_rewritten": rewritten[v].copy() for v in (own, rts)})
    return result


# data-parallel training ---------------------------------------------------------------------------
def mlp() -> Dict[str, np.ndarray]:
    from benchmarks.workloads.mlp import init_params, popxl_forward
    from benchmarks.workloads.training import TrainSpec, build_popxl_program

    ir = popxl.Ir(replication="popdist")
    steps, batch, sizes = 3, 6, (12, 16, 5)
    spec = TrainSpec(init_params(sizes, seed=7), np.zeros((steps, batch, sizes[0]), np.float32),
                     np.zeros((steps, batch), np.int32), lr=0.1)
    ir, x_stream, y_stream, loss_stream = build_popxl_program(spec, popxl_forward, steps, ir=ir, data_parallel=True)
    params = sorted((v for v in ir.main_graph.variables), key=lambda v: v.name)

    def per_replica(r, what):
        rng = np.random.default_rng(50 + r)
        x = rng.standard_normal((steps, batch, sizes[0])).astype(np.float32)
        y = rng.integers(0, sizes[-1], (steps, batch)).astype(np.int32)
        return x if what == "x" else y

    def host(what):  # (steps, local replicas, ...) with the size-1 replica axis dropped
        rows = local_rows(ir, lambda r: per_replica(r, what))
        return np.moveaxis(rows, 0, 1) if ir.instance_replication_factor > 1 else rows

    with popxl.Session(ir, "ipu_model") as session:
        losses = [session.run({x_stream: host("x"), y_stream: host("y")})[loss_stream] for _ in range(2)]
        weights = session.get_tensors_data(params)
    result = {"loss": np.stack(losses)}
    result.update({f"param_{v.name}": weights[v].copy() for v in params})
    return result


# a PopART training session under poprun -----------------------------------------------------------
def popart_training() -> Dict[str, np.ndarray]:
    """softmax(x W + b) with an NLL loss, SGD, 2 batches per step; the replicas' gradients summed
    across instances (configureSessionOptions) and averaged (Mean reduction)."""
    os.environ["POPXL_IPU_HW"] = "cpu"  # popdist.popart.getDevice acquires "hardware"
    import popart
    import popdist.popart

    feat, classes, batch, bps = 6, 4, 3, 2
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, feat]), "x")
    labels = b.addInputTensor("INT32", [batch], "labels")
    w = b.addInitializedInputTensor(replica_data((feat, classes), 0, 9) * 0.3, "W")
    bias = b.addInitializedInputTensor(np.zeros(classes, np.float32), "b")
    probs = b.aiOnnx.softmax([b.aiOnnx.add([b.aiOnnx.matmul([x, w]), bias])], axis=1)
    loss = b.aiGraphcore.nllloss([probs, labels], popart.ReductionType.Mean)
    opts = popart.SessionOptions()
    opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    popdist.popart.configureSessionOptions(opts)
    session = popart.TrainingSession(b.getModelProto(), popart.DataFlow(bps, {loss: popart.AnchorReturnType("ALL")}),
                                     loss, popart.ConstSGD(0.3), popdist.popart.getDevice(), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    local = session.replicationFactor
    offset = popdist.getReplicaIndexOffset() if popdist.getNumInstances() > 1 else 0
    rows = [replica_data((bps, batch, feat), offset + r, 10) for r in range(local)]
    xs = np.stack(rows, 1) if local > 1 else rows[0]
    ys = (np.argmax(xs[..., :classes], -1)).astype(np.int32)
    anchors = session.initAnchorArrays()
    losses = []
    for _ in range(2):
        session.run(popart.PyStepIO({x: xs, labels: ys}, anchors))
        losses.append(anchors[loss].copy())
    session.weightsToHost()
    weights = {n: np.zeros(session.getInfo(n).shape(), np.float32) for n in (w, bias)}
    session.readWeights(popart.PyWeightsIO(weights))
    return {"loss": np.stack(losses), "param_W": weights[w], "param_b": weights[bias]}


# faults -------------------------------------------------------------------------------------------
def small_program(steps: int = 1):
    ir = popxl.Ir(replication="popdist")
    ir.num_host_transfers = steps
    with ir.main_graph:
        s = popxl.h2d_stream((4,), popxl.float32, "x")
        o = popxl.d2h_stream((4,), popxl.float32, "y")

        def body():
            ops.host_store(o, ops.collectives.replicated_all_reduce(ops.host_load(s)))
        ops.repeat(ir.create_graph(body), steps)
    return ir, s


def fault(mode: str) -> None:
    me = popdist.getInstanceIndex()
    if mode == "differ":  # instance 1 builds another program: refused at attach
        ir, s = small_program(steps=2 if me == 1 else 1)
        with popxl.Session(ir, "ipu_model"):
            pass
        return
    if mode == "other_engine":  # the same program, instance 1 on the reference engine: refused at attach
        ir, s = small_program()
        if me == 1:
            os.environ["POPXL_ENGINE"] = "reference"
        with popxl.Session(ir, "ipu_model"):
            pass
        return
    ir, s = small_program()
    with popxl.Session(ir, "ipu_model") as session:
        data = np.ones(4, np.float32)
        session.run({s: data})  # all instances meet once
        if me == 1:
            if mode == "raise":
                raise ValueError("instance 1 gives up")
            if mode == "die":
                os.kill(os.getpid(), 9)
            if mode == "early_end":
                return
            if mode == "interrupt":  # only instance 0's wait can end on Ctrl-C
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            if mode in ("hang", "interrupt"):
                time.sleep(60)
        if mode == "interrupt":  # tell the test that instance 0 is about to wait in the collective
            (Path(sys.argv[2]) / "waiting").write_text(str(me))
        session.run({s: data})  # the others wait here for instance 1


def main() -> None:
    mode, outdir = sys.argv[1], Path(sys.argv[2])
    if mode == "collectives":
        result = {**collectives("native"), **collectives("reference")}
    elif mode == "mlp":
        result = mlp()
    elif mode == "popart":
        result = popart_training()
    else:
        fault(mode)
        print(f"instance {popdist.getInstanceIndex()} done", flush=True)
        return
    index = popdist.getInstanceIndex() if popdist.getNumInstances() > 1 else 0
    offset = popdist.getReplicaIndexOffset() if popdist.getNumInstances() > 1 else 0
    np.savez(outdir / f"{mode}_{index}.npz", offset=offset, **result)


if __name__ == "__main__":
    main()
