"""Tensor parallelism as PopXL's model zoo does it, with popxl-addons' ReplicatedAllReduceTP made
through its PopART binding: an MLP whose first layer is split over 2 replicas by output columns
and its second by input rows trains to the same weights and losses as the unsharded MLP; an
embedding sharded by vocabulary rows (token ids minus the shard's offset, gathered with zero_OOR so
that ids of other shards give 0) with its tied LM head gives the unsharded values and gradients."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popart._internal.ir.addons_bindings import ReplicatedAllReduceTPOp
from popxl.context import get_current_context
from popxl.transforms import autodiff

from engine_harness import engine
from grad_harness import apply_pre_alias_patterns

BATCH, D_IN, HIDDEN, D_OUT, STEPS, LR = 4, 6, 8, 3, 5, 0.1


def all_reduce_tp(t, identical_inputs, identical_grad_inputs):
    """The zoo's tensor-parallel all-reduce, as popxl-addons' wrapper creates it."""
    ctx = get_current_context()
    g = ctx.graph
    op = ReplicatedAllReduceTPOp.createOpInGraph(
        g._pb_graph, {0: t.id}, {0: g._create_tensor_id("all_reduce_tp")}, "add",
        g.ir.replica_grouping()._pb_replica_grouping, identical_inputs, identical_grad_inputs,
        ctx._get_op_settings("ReplicatedAllReduceTP"))
    ctx._op_created(op)
    return popxl.Tensor._from_pb_tensor(op.outTensor(0))


def train(w1, w2, xs, targets, shards, engine_name):
    """SGD on mean((gelu(x @ w1) @ w2 - target)^2); with ``shards`` > 1 each replica holds its
    columns of w1 and rows of w2. Returns (losses per step, w1, w2 per replica)."""
    ir = popxl.Ir(replication=shards)
    each = ir.replica_grouping(group_size=1) if shards > 1 else None  # every replica its own shard
    with ir.main_graph:
        v1 = popxl.variable(w1, name="w1", replica_grouping=each)
        v2 = popxl.variable(w2, name="w2", replica_grouping=each)
        x_s = popxl.h2d_stream((BATCH, D_IN), popxl.float32, "x")
        t_s = popxl.h2d_stream((BATCH, D_OUT), popxl.float32, "target")

        def mlp(x, target, a, b):
            if shards > 1:  # x is the same everywhere: its gradient is the sum of the replicas' parts
                x = all_reduce_tp(x, identical_inputs=True, identical_grad_inputs=False)
            partial = ops.gelu(x @ a) @ b
            # the partial products add up to the output; its gradient is the same everywhere
            y = all_reduce_tp(partial, False, True) if shards > 1 else partial
            return ops.mean((y - target) * (y - target))

        fwd = ir.create_graph(mlp, x_s.spec, t_s.spec, v1, v2)
        grads = autodiff(fwd, grads_required=fwd.inputs[2:])
        site = ops.call_with_info(fwd, ops.host_load(x_s), ops.host_load(t_s), v1, v2)
        d1, d2 = ops.call(grads.graph, popxl.constant(1.0), inputs_dict=grads.inputs_dict(site))
        ops.scaled_add_(v1, d1, b=-LR)
        ops.scaled_add_(v2, d2, b=-LR)
        loss_s = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_s, site.outputs[0])
    apply_pre_alias_patterns(ir)  # as the zoo's scripts: all-reduces with identical inputs become identities
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    losses = []
    with session:
        for x, t in zip(xs, targets):
            feed = {x_s: np.stack([x] * shards), t_s: np.stack([t] * shards)} if shards > 1 else {x_s: x, t_s: t}
            losses.append(session.run(feed)[loss_s])
    return np.array(losses), session.get_tensor_data(v1), session.get_tensor_data(v2)


@pytest.mark.parametrize("engine_name", ["native", "reference"])
def test_sharded_mlp_trains_as_the_unsharded_one(engine_name):
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((D_IN, HIDDEN)).astype(np.float32) / 3
    w2 = rng.standard_normal((HIDDEN, D_OUT)).astype(np.float32) / 3
    xs = rng.standard_normal((STEPS, BATCH, D_IN)).astype(np.float32)
    targets = rng.standard_normal((STEPS, BATCH, D_OUT)).astype(np.float32)

    losses, w1_trained, w2_trained = train(w1, w2, xs, targets, 1, engine_name)
    half = HIDDEN // 2
    sharded = train(np.stack([w1[:, :half], w1[:, half:]]), np.stack([w2[:half], w2[half:]]), xs, targets, 2,
                    engine_name)
    sharded_losses, w1_shards, w2_shards = sharded
    assert losses[-1] < losses[0]  # it learns
    np.testing.assert_allclose(sharded_losses[:, 0], losses, rtol=1e-5)
    np.testing.assert_allclose(sharded_losses[:, 1], losses, rtol=1e-5)  # every replica sees the same loss
    np.testing.assert_allclose(np.concatenate(list(w1_shards), axis=1), w1_trained, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(list(w2_shards), axis=0), w2_trained, rtol=1e-5, atol=1e-6)
    assert not np.allclose(w1_trained, w1)


N_TOKENS, SHARD, EMBED = 6, 4, 3


def tied_embedding(w, ids, d, c, shards, engine_name):
    """Embedding of ``ids`` by ``w`` (vocabulary rows, split over ``shards`` replicas) and the tied LM
    head's logits ``e @ w.T``; loss = sum(logits * d) + sum(e * c). Returns (loss, e, d loss / d w)
    per replica (shard)."""
    ir = popxl.Ir(replication=shards)
    each = ir.replica_grouping(group_size=1) if shards > 1 else None
    rows = w.shape[-2]
    with ir.main_graph:
        vw = popxl.variable(w, name="w", replica_grouping=each)
        offsets = np.arange(shards, dtype=np.int32) * rows if shards > 1 else np.int32(0)
        vo = popxl.variable(offsets, name="offset", replica_grouping=each)
        ids_s = popxl.h2d_stream((N_TOKENS,), popxl.int32, "ids")
        d_s = popxl.h2d_stream((N_TOKENS, rows), popxl.float32, "d")  # this shard's logit columns
        c_s = popxl.h2d_stream((N_TOKENS, EMBED), popxl.float32, "c")

        def model(ids, d, c, offset, table):
            e = ops.gather(table, ids - offset, zero_OOR=True)  # other shards' ids give 0 here
            if shards > 1:
                e = all_reduce_tp(e, identical_inputs=False, identical_grad_inputs=True)
            h = all_reduce_tp(e, identical_inputs=True, identical_grad_inputs=False) if shards > 1 else e
            head = ops.sum(ops.matmul(h, ops.transpose(table)) * d)
            if shards > 1:
                head = all_reduce_tp(head, identical_inputs=False, identical_grad_inputs=True)
            return head + ops.sum(e * c), e

        fwd = ir.create_graph(model, ids_s.spec, d_s.spec, c_s.spec, vo, vw)
        grads = autodiff(fwd, grads_provided=fwd.outputs[:1], grads_required=fwd.inputs[4:])
        site = ops.call_with_info(fwd, ops.host_load(ids_s), ops.host_load(d_s), ops.host_load(c_s), vo, vw)
        (dw,) = ops.call(grads.graph, popxl.constant(1.0), inputs_dict=grads.inputs_dict(site))
        outs = {}
        for name, t in (("loss", site.outputs[0]), ("e", site.outputs[1]), ("dw", dw)):
            outs[name] = popxl.d2h_stream(t.shape, t.dtype, name)
            ops.host_store(outs[name], t)
    apply_pre_alias_patterns(ir)  # as the zoo's scripts: all-reduces with identical inputs become identities
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    if shards > 1:
        feed = {ids_s: np.stack([ids] * shards), c_s: np.stack([c] * shards),
                d_s: np.stack([d[:, r * rows:(r + 1) * rows] for r in range(shards)])}
    else:
        feed = {ids_s: ids, d_s: d, c_s: c}
    with session:
        res = session.run(feed)
    return tuple(res[outs[k]].reshape((shards,) + res[outs[k]].shape[1 if shards > 1 else 0:])
                 for k in ("loss", "e", "dw"))


@pytest.mark.parametrize("engine_name", ["native", "reference"])
@pytest.mark.parametrize("shards", [2, 4])
def test_vocabulary_sharded_embedding_and_tied_head_equal_the_unsharded_ones(shards, engine_name):
    rng = np.random.default_rng(shards)
    vocab = shards * SHARD
    w = rng.standard_normal((vocab, EMBED)).astype(np.float32)
    ids = rng.integers(0, vocab, N_TOKENS).astype(np.int32)
    ids[:2] = [0, vocab - 1]  # the first and last shards: every other shard sees them out of range
    d = rng.standard_normal((N_TOKENS, vocab)).astype(np.float32)
    c = rng.standard_normal((N_TOKENS, EMBED)).astype(np.float32)

    # the formulas: e = w[ids]; loss = sum((e @ w.T) * d) + sum(e * c)
    e_ref = w[ids].astype(np.float64)
    de = d @ w + c
    dw_ref = d.T.astype(np.float64) @ e_ref
    np.add.at(dw_ref, ids, de)
    loss_ref = float(((e_ref @ w.T) * d).sum() + (e_ref * c).sum())

    loss, e, dw = tied_embedding(w, ids, d, c, 1, engine_name)
    np.testing.assert_allclose(loss[0], loss_ref, rtol=1e-5)
    np.testing.assert_allclose(e[0], e_ref, rtol=1e-6)
    np.testing.assert_allclose(dw[0], dw_ref, rtol=1e-5, atol=1e-5)

    shard_w = w.reshape(shards, SHARD, EMBED)
    s_loss, s_e, s_dw = tied_embedding(shard_w, ids, d, c, shards, engine_name)
    for r in range(shards):  # every replica: the unsharded loss and embedding, its rows of the gradient
        np.testing.assert_allclose(s_loss[r], loss[0], rtol=1e-5)
        np.testing.assert_allclose(s_e[r], e[0], rtol=1e-6)
    np.testing.assert_allclose(s_dw.reshape(vocab, EMBED), dw[0], rtol=1e-5, atol=1e-5)
