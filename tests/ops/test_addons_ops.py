"""popxl-addons' thirteen custom ops (popxl/ops/addons/): values against NumPy formulas written
here, gradients against the formulas (and finite differences where the op is smooth), on 1, 2
and 4 replicas for the ops that span replicas, on both engines."""
import re

import numpy as np
import pytest

import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from popxl.ops import addons
from popxl.transforms import expand_ops

from engine_harness import compare_engines, engine
from grad_harness import GradProgram, check_grad

RNG = np.random.default_rng(7)
ENGINES = ["reference", "native"]


def grads(build, inputs, wrt, replication, seeds=None, engine_name="native"):
    """(outputs, gradients) of ``build`` for the given seeds (random if None), every array with a
    leading replica axis when ``replication`` > 1. PopART's default pre-alias patterns run first
    (the all-reduces with identical inputs need OpToIdentity)."""
    with engine(engine_name):
        prog = GradProgram(build, inputs, wrt, replication=replication, pre_alias_patterns=True)
    try:
        if seeds is None:
            lead = (replication,) if replication > 1 else ()
            seeds = [RNG.standard_normal(lead + s.shape).astype(s.dtype.as_numpy()) for s in prog.seed_streams]
        ys, gs = prog.run(inputs, seeds)
        return ys, gs, seeds
    finally:
        prog.close()


def per_replica(a, replication):
    return a if replication > 1 else a[None]


def group_members(assignment):
    out = {}
    for r, g in enumerate(assignment):
        out.setdefault(g, []).append(r)
    return list(out.values())


GROUPINGS = [(1, {}), (2, {}), (4, {}), (4, {"group_size": 2}), (4, {"stride": 2, "group_size": 2})]


def _assignment(replication, args):
    return popxl.Ir(replication=replication).replica_grouping(**args).assignment


# ---- the tensor-parallel and strided all-reduce --------------------------------------------------
@pytest.mark.parametrize("replication,args", GROUPINGS)
@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("engine_name", ENGINES)
def test_all_reduce_tp_values_and_gradient(replication, args, flags, engine_name):
    identical_inputs, identical_grad_inputs = flags
    x = RNG.standard_normal((replication, 2, 3)).astype(np.float32)

    def build(t):
        group = popxl.gcg().ir.replica_grouping(**args) if args else None
        return addons.replicated_all_reduce_tp(t, group=group, identical_inputs=identical_inputs,
                                               identical_grad_inputs=identical_grad_inputs)

    (y,), (dx,), (dy,) = grads(build, [x if replication > 1 else x[0]], [0], replication, engine_name=engine_name)
    y, dx, dy = (per_replica(a, replication) for a in (y, dx, dy))
    summed_x, summed_dy = x.copy(), dy.copy()
    for members in group_members(_assignment(replication, args)):
        summed_x[members] = x[members].sum(0)
        summed_dy[members] = dy[members].sum(0)
    np.testing.assert_allclose(y, x if identical_inputs else summed_x, rtol=1e-6)
    # the gradient is the same all-reduce with the flags swapped
    np.testing.assert_allclose(dx, dy if identical_grad_inputs else summed_dy, rtol=1e-6)


@pytest.mark.parametrize("op", ["add", "mean"])
def test_strided_all_reduce_over_strided_groups(op):
    x = RNG.standard_normal((4, 5)).astype(np.float32)

    def build(t):
        return addons.replicated_all_reduce_strided(t, op, stride=2, group_size=2)

    (y,), (dx,), (dy,) = grads(build, [x], [0], 4)
    reduce = np.sum if op == "add" else np.mean
    for members in ([0, 2], [1, 3]):  # stride 2: replicas 0 and 2 meet, 1 and 3
        np.testing.assert_allclose(y[members], np.broadcast_to(reduce(x[members], 0), (2, 5)), rtol=1e-6)
        np.testing.assert_allclose(dx[members], np.broadcast_to(reduce(dy[members], 0), (2, 5)), rtol=1e-6)


@pytest.mark.parametrize("replication,stride,size", [(1, 1, 1), (2, 1, 2), (4, 1, 4), (4, 2, 2), (4, 1, 2)])
def test_strided_all_gather_and_reduce_scatter(replication, stride, size):
    x = RNG.standard_normal((replication, 2, 3)).astype(np.float32)
    groups = group_members(_assignment(replication, {"stride": stride, "group_size": size}))

    def gathered(engine_name):
        with engine(engine_name):
            return run(lambda t: addons.replicated_all_gather_strided(t, stride, size), x, replication)

    def scattered(engine_name):
        with engine(engine_name):
            return run(lambda t: addons.replicated_reduce_scatter_strided(t, "add", stride, size, rts=True), x,
                       replication)

    g, spec = gathered("native")
    assert spec == ((size * 6,), ())
    np.testing.assert_array_equal(g, gathered("reference")[0])
    s, spec = scattered("native")
    chunk = -(-6 // size)
    assert spec == ((chunk,), (2, 3))  # the shard records the full shape (replicated tensor sharding)
    np.testing.assert_allclose(s, scattered("reference")[0], rtol=1e-6)
    for members in groups:
        flat = np.concatenate([x[r].reshape(-1) for r in members])
        total = np.zeros(chunk * size, np.float32)
        total[:6] = x[members].sum(0).reshape(-1)
        for j, r in enumerate(members):
            np.testing.assert_array_equal(g[r], flat)
            np.testing.assert_allclose(s[r], total[j * chunk:(j + 1) * chunk], rtol=1e-6)


def run(build, x, replication):
    """Stream x (a leading replica axis) through ``build``; (result per replica, (shape, meta_shape))."""
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        x_s = popxl.h2d_stream(x.shape[1:], popxl.float32, "x")
        y = build(ops.host_load(x_s))
        y_s = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(y_s, y)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({x_s: x if replication > 1 else x[0]})[y_s]
    return per_replica(out, replication), (y.shape, y.meta_shape)


def test_collective_arguments_are_checked():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        t = popxl.variable(np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="'mean' is not implemented; it takes 'add'"):
            addons.replicated_all_reduce_tp(t, "mean")
        with pytest.raises(ValueError, match="replicated_all_reduce_strided: replica_grouping.*stride"):
            addons.replicated_all_reduce_strided(t, "add", stride=3, group_size=1)
        with pytest.raises(ValueError, match="the group size must be an int > 0"):
            addons.replicated_all_gather_strided(t, 1, 0)
        with pytest.raises(ValueError, match="groups 2 replicas, but the Ir has 4"):
            addons.replicated_all_reduce_tp(t, group=popxl.Ir(replication=2).replica_grouping())


def test_a_session_runs_them_as_popxl_collectives():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        t = popxl.variable(np.ones(3, np.float32))
        a = addons.replicated_all_reduce_tp(t)
        b = addons.replicated_all_reduce_tp(t, identical_inputs=True)
        c = addons.replicated_all_gather_strided(t)
    assert [op.type for op in ir.main_graph.ops] == ["replicated_all_reduce_tp"] * 2 + ["replicated_all_gather_strided"]
    expand_ops(ir)
    assert [op.type for op in ir.main_graph.ops] == ["replicated_all_reduce", "identity", "replicated_all_gather"]
    assert [a.producer.type, b.producer.type, c.producer.type] == ["replicated_all_reduce", "identity",
                                                                    "replicated_all_gather"]


def _run_replicas(ir, x_stream, y_stream, x):
    with popxl.Session(ir, "ipu_model") as session:
        return session.run({x_stream: x})[y_stream]


@pytest.mark.parametrize("make", [
    lambda t, **kw: addons.replicated_all_reduce_tp(t, **kw),
    lambda t, **kw: addons.replicated_all_reduce_strided(t, "add", stride=1, group_size=4, **kw),
], ids=["tp", "strided"])
def test_identical_inputs_need_popart_op_to_identity_pattern(make):
    # popxl-addons' all-reduces with identical_inputs run only as the identity PopART's OpToIdentity
    # pattern makes of them (their lowering refuses them otherwise); a PopXL Session applies only
    # the Minimal patterns, which leave them, so it refuses the program, naming the op.
    def program():
        ir = popxl.Ir(replication=4)
        with ir.main_graph:
            xs = popxl.h2d_stream((3,), popxl.float32, "x")
            y = make(ops.host_load(xs), identical_inputs=True)
            ys = popxl.d2h_stream(y.shape, y.dtype, "y")
            ops.host_store(ys, y)
        return ir, xs, ys

    ir, xs, ys = program()
    (reduce_op,) = [op for op in ir.main_graph._pb_graph.getOps() if op.canBeReplacedByIdentity()]
    with pytest.raises(popxl.errors.popart_exception, match=r"has identical_inputs=True.*OpToIdentity") as e:
        popxl.Session(ir, "ipu_model")
    assert reduce_op.name() in str(e.value) and "main graph" in str(e.value)
    # The Minimal patterns (what the Session itself applies) leave the op.
    pb_ir = ir._pb_ir
    pb_ir.setPatterns(_ir.patterns.Patterns(_ir.patterns.PatternsLevel.Minimal))
    pb_ir.applyPreAliasPatterns(ir.main_graph._pb_graph)
    with pytest.raises(popxl.errors.popart_exception, match="OpToIdentity"):
        popxl.Session(ir, "ipu_model")
    # The default ones replace it by an identity, which keeps the op's output tensor: each replica
    # then gets its own values back (a sum would give every replica the total).
    pb_ir.setPatterns(_ir.patterns.Patterns(_ir.patterns.PatternsLevel.Default))
    pb_ir.applyPreAliasPatterns(ir.main_graph._pb_graph)
    assert [op.type for op in ir.main_graph.ops] == ["host_load", "identity", "host_store"]
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(_run_replicas(ir, xs, ys, x), x)
    # Without identical_inputs the op stays an all-reduce through the patterns.
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        y = make(ops.host_load(xs))
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    ir._pb_ir.applyPreAliasPatterns(ir.main_graph._pb_graph)
    assert not any(op.canBeReplacedByIdentity() for op in ir.main_graph._pb_graph.getOps())
    np.testing.assert_allclose(_run_replicas(ir, xs, ys, x), np.broadcast_to(x.sum(0), x.shape), rtol=1e-6)


def test_the_gradient_of_identical_grad_inputs_needs_the_pattern_too():
    # The gradient of an all-reduce with identical_grad_inputs is one with identical_inputs, in
    # the gradient graph (which popxl-addons' autodiff patterns, popxl's does not): refused, named
    # by its graph, until the pattern runs on that graph.
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        fwd = ir.create_graph(lambda t: addons.replicated_all_reduce_tp(t, identical_grad_inputs=True), xs.spec)
        bwd = popxl.transforms.autodiff(fwd).graph
        (dx,) = ops.call(bwd, ops.host_load(xs))
        ys = popxl.d2h_stream(dx.shape, dx.dtype, "dx")
        ops.host_store(ys, dx)
    with pytest.raises(popxl.errors.popart_exception, match=f"in graph '{re.escape(bwd.id)}'.*OpToIdentity"):
        popxl.Session(ir, "ipu_model")
    ir._pb_ir.applyPreAliasPatterns(bwd._pb_graph)  # an Ir's patterns are the default ones until set
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(_run_replicas(ir, xs, ys, x), x)


def test_pattern_levels_of_op_to_identity():
    # OpToIdentity is on by default but not mandatory: the Minimal level leaves it out.
    levels = _ir.patterns.PatternsLevel
    assert not _ir.patterns.Patterns(levels.Minimal).isPatternEnabled("OpToIdentity")
    assert _ir.patterns.Patterns(levels.Default).isPatternEnabled("OpToIdentity")
    assert _ir.patterns.Patterns(levels.All).isPatternEnabled("OpToIdentity")
    assert _ir.patterns.Patterns().isPatternEnabled("OpToIdentity")


# ---- rotary position embeddings ------------------------------------------------------------------
def rotary_numpy(x, sin, cos, rotary_dim, direction=1):
    """Each pair (x[2i], x[2i+1]) as a complex number, times exp(j * direction * angle)."""
    z = x[..., :rotary_dim:2].astype(np.complex128) + 1j * x[..., 1:rotary_dim:2]
    turn = (cos.astype(np.float64) + 1j * direction * sin.astype(np.float64))[:, :, None, :]
    out = x.astype(np.float64)
    out[..., :rotary_dim:2], out[..., 1:rotary_dim:2] = (z * turn).real, (z * turn).imag
    return out


def trig(batch, seq, rotary_dim):
    angles = np.outer(np.arange(seq), 10000.0 ** (-np.arange(0, rotary_dim, 2) / rotary_dim))[None]
    angles = np.broadcast_to(angles, (batch, seq, rotary_dim // 2)) + RNG.uniform(0, 0.1, (batch, 1, 1))
    return np.sin(angles).astype(np.float32), np.cos(angles).astype(np.float32)


@pytest.mark.parametrize("rotary_dim,table_batch,dtype", [(8, 1, np.float32), (4, 3, np.float32),
                                                          (6, 1, np.float16)])
def test_rotary_pos_embed_values_gradient_and_engines(rotary_dim, table_batch, dtype):
    x = RNG.standard_normal((3, 5, 2, 8)).astype(dtype)
    sin, cos = (a.astype(dtype) for a in trig(table_batch, 5, rotary_dim))

    def build(t, s, c):
        return addons.rotary_pos_embed(t, s, c, rotary_dim)

    y = compare_engines(build, [x, sin, cos], native_ops=["rotary_pos_embed"])[0]
    tol = 1e-6 if dtype == np.float32 else 1e-3
    np.testing.assert_allclose(y, rotary_numpy(x, sin, cos, rotary_dim), rtol=tol, atol=tol)
    (_,), (dx,), (dy,) = grads(build, [x, sin, cos], [0], 1)
    np.testing.assert_allclose(dx, rotary_numpy(dy, sin, cos, rotary_dim, direction=-1), rtol=tol, atol=tol)


def rotary_halves_numpy(x, sin, cos, rotary_dim, direction=1):
    """Pair i is (x[i], x[i + rotary_dim/2]) (GPT-NeoX's form), as a complex number, turned."""
    half = rotary_dim // 2
    z = x[..., :half].astype(np.complex128) + 1j * x[..., half:rotary_dim]
    turn = (cos.astype(np.float64) + 1j * direction * sin.astype(np.float64))[:, :, None, :]
    out = x.astype(np.float64)
    out[..., :half], out[..., half:rotary_dim] = (z * turn).real, (z * turn).imag
    return out


@pytest.mark.parametrize("rotary_dim,table_batch,dtype", [(8, 1, np.float32), (4, 3, np.float32),
                                                          (6, 1, np.float16)])
def test_rotary_pos_embed_halves_values_gradient_and_engines(rotary_dim, table_batch, dtype):
    x = RNG.standard_normal((3, 5, 2, 8)).astype(dtype)
    sin, cos = (a.astype(dtype) for a in trig(table_batch, 5, rotary_dim))

    def build(t, s, c):
        return addons.rotary_pos_embed(t, s, c, rotary_dim, pairing="halves")

    y = compare_engines(build, [x, sin, cos], native_ops=["rotary_pos_embed"])[0]
    tol = 1e-6 if dtype == np.float32 else 1e-3
    np.testing.assert_allclose(y, rotary_halves_numpy(x, sin, cos, rotary_dim), rtol=tol, atol=tol)
    assert not np.allclose(y, rotary_numpy(x, sin, cos, rotary_dim), atol=1e-2)  # not the interleaved form
    (_,), (dx,), (dy,) = grads(build, [x, sin, cos], [0], 1)
    np.testing.assert_allclose(dx, rotary_halves_numpy(dy, sin, cos, rotary_dim, direction=-1), rtol=tol, atol=tol)
    check_grad(lambda t: addons.rotary_pos_embed(t, popxl.constant(sin[:1].astype(np.float32)),
                                                 popxl.constant(cos[:1].astype(np.float32)), rotary_dim,
                                                 pairing="halves"),
               [x[:1].astype(np.float32)])


@pytest.mark.parametrize("model", ["llama", "gpt_neox"])
def test_rotary_pos_embed_halves_is_huggingface_rotary_embedding(model):
    """HuggingFace's Llama and GPT-NeoX code (rotate_half; GPT-NeoX rotates the first rotary_ndims
    of each head), values and gradients through torch autograd, against the op as Graphcore's
    Llama / Dolly applications call it: (batch, seq, heads, head) and tables of half width."""
    torch = pytest.importorskip("torch")
    module = pytest.importorskip(f"transformers.models.{model}.modeling_{model}")
    batch, seq, heads, head = 2, 6, 3, 8
    rotary_dim = head if model == "llama" else 4
    x = RNG.standard_normal((batch, seq, heads, head)).astype(np.float32)
    g = RNG.standard_normal((batch, seq, heads, head)).astype(np.float32)
    sin, cos = trig(1, seq, rotary_dim)  # (1, seq, rotary_dim / 2)

    q = torch.tensor(x).transpose(1, 2).requires_grad_()  # HuggingFace: (batch, heads, seq, head)
    full_cos = torch.tensor(np.concatenate([cos, cos], -1))  # (1, seq, rotary_dim): both halves
    full_sin = torch.tensor(np.concatenate([sin, sin], -1))
    rot, rest = q[..., :rotary_dim], q[..., rotary_dim:]
    rotated, _ = module.apply_rotary_pos_emb(rot, rot, full_cos, full_sin)
    want = torch.cat([rotated, rest], -1)
    (want * torch.tensor(g).transpose(1, 2)).sum().backward()
    want_x = want.detach().transpose(1, 2).numpy()
    want_dx = q.grad.transpose(1, 2).numpy()

    def build(t, s, c):
        return addons.rotary_pos_embed(t, s, c, rotary_dim, pairing="halves")

    (y,), (dx,), _ = grads(build, [x, sin, cos], [0], 1, seeds=[g])
    np.testing.assert_allclose(y, want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6)


def test_rotary_pos_embed_gradient_by_finite_differences():
    sin, cos = trig(1, 3, 4)
    x = RNG.standard_normal((1, 3, 2, 6))
    check_grad(lambda t: addons.rotary_pos_embed(t, popxl.constant(sin), popxl.constant(cos), 4),
               [x.astype(np.float32)])


def test_rotary_pos_embed_checks_shapes():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((1, 4, 2, 8), np.float32))
        s = popxl.variable(np.zeros((1, 4, 4), np.float32))
        with pytest.raises(ValueError, match="rotary_dim must be an even number from 2 to the head size 8, not 3"):
            addons.rotary_pos_embed(x, s, s, 3)
        with pytest.raises(ValueError, match=r"sin must have shape \(1 or batch, seq, rotary_dim / 2\)"):
            addons.rotary_pos_embed(x, s, s, 4)
        with pytest.raises(ValueError, match="must have rank 4"):
            addons.rotary_pos_embed(s, s, s, 4)
        with pytest.raises(ValueError, match=r"pairing must be one of \('interleaved', 'halves'\), not 'neox'"):
            addons.rotary_pos_embed(x, s, s, 8, pairing="neox")


# ---- sharded cross entropy ---------------------------------------------------------------------------
def log_softmax(z):
    z = z.astype(np.float64)
    m = z.max(1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(1, keepdims=True))


def split_logits(logits, labels, shards):
    """Each shard's classes and its labels shifted to them (outside: another shard's class)."""
    width = logits.shape[1] // shards
    return (np.stack([logits[:, r * width:(r + 1) * width] for r in range(shards)]),
            np.stack([(labels - r * width).astype(np.int32) for r in range(shards)]))


@pytest.mark.parametrize("replication,group_size", [(1, 1), (2, 2), (4, 4), (4, 2)])
@pytest.mark.parametrize("engine_name", ENGINES)
def test_cross_entropy_sharded_over_replicas(replication, group_size, engine_name):
    n, classes = 5, 8 * group_size
    groups = replication // group_size
    logits = 3 * RNG.standard_normal((groups, n, classes)).astype(np.float32)
    labels = RNG.integers(0, classes, (groups, n))
    shards, shifted = zip(*(split_logits(logits[g], labels[g], group_size) for g in range(groups)))
    x, idx = np.concatenate(shards), np.concatenate(shifted)  # replica r = group r // group_size

    def build(t, i):
        group = popxl.gcg().ir.replica_grouping(group_size=group_size)
        return addons.cross_entropy_sharded(t, i, group)

    inputs = [x, idx] if replication > 1 else [x[0], idx[0]]
    (loss, nls), (dx,), (dloss, dnls) = grads(build, inputs, [0], replication, engine_name=engine_name)
    loss, nls, dx, dloss, dnls = (per_replica(a, replication) for a in (loss, nls, dx, dloss, dnls))
    for r in range(replication):
        g, k = divmod(r, group_size)
        lsm = log_softmax(logits[g])
        np.testing.assert_allclose(loss[r], -lsm[np.arange(n), labels[g]], rtol=1e-5)
        shard = slice(k * 8, (k + 1) * 8)
        np.testing.assert_allclose(nls[r], -lsm[:, shard], rtol=1e-5, atol=1e-6)
        # the logits' gradient flows from the loss only (the nls output's gradient is not used)
        grad = np.exp(lsm) * dloss[r][:, None]
        grad[np.arange(n), labels[g]] -= dloss[r]
        np.testing.assert_allclose(dx[r], grad[:, shard], rtol=1e-5, atol=1e-6)


def test_cross_entropy_sharded_float16_and_engines_agree():
    logits = (2 * RNG.standard_normal((6, 10))).astype(np.float16)
    labels = np.array([0, 3, 9, -1, 12, 5], np.int32)  # -1 and 12: outside this shard

    def build(t, i):
        loss, nls = addons.cross_entropy_sharded(t, i)
        return loss, nls

    loss, nls = compare_engines(build, [logits, labels], rtol=2e-3, atol=2e-3,
                                native_ops=["cross_entropy_sharded_denominator", "cross_entropy_sharded_nll"])
    lsm = log_softmax(logits)
    inside = (labels >= 0) & (labels < 10)
    want = np.where(inside, -lsm[np.arange(6), np.clip(labels, 0, 9)], 0)
    np.testing.assert_allclose(loss, want, rtol=3e-3, atol=3e-3)
    np.testing.assert_allclose(nls, -lsm, rtol=3e-3, atol=3e-3)


def test_cross_entropy_sharded_gradient_by_finite_differences():
    labels = np.array([1, 4, 2], np.int32)
    check_grad(lambda t: addons.cross_entropy_sharded(t, popxl.constant(labels))[0],
               [RNG.standard_normal((3, 5)).astype(np.float32)])


@pytest.mark.parametrize("widths", [(4,), (3, 5), (2, 4, 3)])
@pytest.mark.parametrize("engine_name", ENGINES)
def test_cross_entropy_sharded_within_a_replica(widths, engine_name):
    n = 4
    full = 2 * RNG.standard_normal((n, sum(widths))).astype(np.float32)
    labels = RNG.integers(0, sum(widths), n).astype(np.int32)
    edges = np.cumsum((0,) + widths)
    pieces = [full[:, a:b] for a, b in zip(edges[:-1], edges[1:])]

    def build(*ts):
        k = len(ts) // 2
        loss, nls = addons.cross_entropy_sharded_wr(list(ts[:k]), list(ts[k:]))
        return (loss, *nls)

    outs, dxs, seeds = grads(build, pieces + [labels] * len(widths), list(range(len(widths))), 1,
                             engine_name=engine_name)
    lsm = log_softmax(full)
    np.testing.assert_allclose(outs[0], -lsm[np.arange(n), labels], rtol=1e-5)
    grad = np.exp(lsm) * seeds[0][:, None]
    grad[np.arange(n), labels] -= seeds[0]
    for s, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        np.testing.assert_allclose(outs[1 + s], -lsm[:, a:b], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dxs[s], grad[:, a:b], rtol=1e-5, atol=1e-6)


def test_cross_entropy_checks_shapes():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((3, 4), np.float32))
        with pytest.raises(ValueError, match=r"indices must have shape \(3,\), one per sample"):
            addons.cross_entropy_sharded(x, popxl.variable(np.zeros(4, np.int32)))
        with pytest.raises(TypeError, match="indices must be integers"):
            addons.cross_entropy_sharded(x, popxl.variable(np.zeros(3, np.float32)))
        with pytest.raises(ValueError, match="needs as many logits as indices"):
            addons.cross_entropy_sharded_wr([x, x], [popxl.variable(np.zeros(3, np.int32))])


# ---- layer norm over a sharded hidden axis ---------------------------------------------------------
def layer_norm_numpy(x, w, b, eps, dy):
    """(y, mean, 1/std, dx, dw, db) of a layer norm over the last axis, in float64."""
    x, w, b, dy = (a.astype(np.float64) for a in (x, w, b, dy))
    mean = x.mean(1)
    inv_std = 1 / np.sqrt(x.var(1) + eps)
    xh = (x - mean[:, None]) * inv_std[:, None]
    g = dy * w
    dx = inv_std[:, None] * (g - g.mean(1, keepdims=True) - xh * (g * xh).mean(1, keepdims=True))
    return xh * w + b, mean, inv_std, dx, (dy * xh).sum(0), dy.sum(0)


@pytest.mark.parametrize("replication,group_size", [(1, 1), (2, 2), (4, 4), (4, 2)])
@pytest.mark.parametrize("engine_name", ENGINES)
def test_layer_norm_distributed(replication, group_size, engine_name):
    n, width = 3, 4
    hidden = width * group_size
    groups = replication // group_size
    x = (RNG.standard_normal((groups, n, hidden)) + 2).astype(np.float32)
    w = RNG.uniform(0.5, 1.5, (groups, hidden)).astype(np.float32)  # not 1: the scale's part in dx shows
    b = RNG.standard_normal((groups, hidden)).astype(np.float32)

    def shards(a):  # replica r holds columns k*width.. of its group's value
        return np.stack([a[r // group_size][..., (r % group_size) * width:(r % group_size + 1) * width]
                         for r in range(replication)])

    def build(t, ww, bb):
        group = popxl.gcg().ir.replica_grouping(group_size=group_size)
        return addons.layer_norm_distributed(t, ww, bb, 1e-5, group)[0]

    inputs = [shards(x), shards(w), shards(b)]
    inputs = inputs if replication > 1 else [a[0] for a in inputs]
    (y,), (dx, dw, db), (dy,) = grads(build, inputs, [0, 1, 2], replication, engine_name=engine_name)
    y, dx, dw, db, dy = (per_replica(a, replication) for a in (y, dx, dw, db, dy))
    for g in range(groups):
        members = list(range(g * group_size, (g + 1) * group_size))
        full_dy = np.concatenate([dy[r] for r in members], axis=1)
        want = layer_norm_numpy(x[g], w[g], b[g], 1e-5, full_dy)
        for k, r in enumerate(members):
            cols = slice(k * width, (k + 1) * width)
            np.testing.assert_allclose(y[r], want[0][:, cols], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(dx[r], want[3][:, cols], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(dw[r], want[4][cols], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(db[r], want[5][cols], rtol=1e-4, atol=1e-5)


def test_layer_norm_distributed_statistics_and_finite_differences():
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    w, b = RNG.uniform(0.5, 1.5, 6).astype(np.float32), RNG.standard_normal(6).astype(np.float32)

    def stats(t, ww, bb):
        return addons.layer_norm_distributed(t, ww, bb, 1e-3)

    y, mean, inv_std = compare_engines(stats, [x, w, b], rtol=1e-6, atol=1e-6)
    want = layer_norm_numpy(x, w, b, 1e-3, np.zeros_like(x))
    for got, exp in zip((y, mean, inv_std), want):
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)
    check_grad(lambda t, ww, bb: addons.layer_norm_distributed(t, ww, bb)[0], [x, w, b])


# ---- local ops -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_grad_reduce_square_add(dtype):
    x = RNG.standard_normal((4, 7)).astype(dtype)
    scale = np.array(1 / 64 ** 2, np.float32)
    (out,) = compare_engines(lambda t, s: addons.grad_reduce_square_add(t, s), [x, scale], rtol=1e-6)
    assert out.dtype == np.float32 and out.shape == ()
    np.testing.assert_allclose(out, scale * np.sum(x.astype(np.float64) ** 2), rtol=1e-5)


def pack_nibbles(v):
    """(rows, groups, 4k) 4-bit values -> (rows, groups, k) uint16, the first of each four highest."""
    q = v.reshape(*v.shape[:-1], -1, 4).astype(np.uint16)
    return (q[..., 0] << 12) | (q[..., 1] << 8) | (q[..., 2] << 4) | q[..., 3]


def test_group_quantize_decompress():
    values = RNG.integers(0, 16, (3, 2, 8))
    scale = RNG.uniform(0.1, 1, (3, 2, 1)).astype(np.float16)
    bias = RNG.standard_normal((3, 2, 1)).astype(np.float16)
    (out,) = compare_engines(addons.group_quantize_decompress, [pack_nibbles(values), scale, bias])
    want = (values.astype(np.float16) * scale + bias).reshape(3, 16)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, want)


def fp8_expected(binade, min_index, span):
    """The bias chosen for values all in [2**binade, 2**(binade+1)): every candidate that puts the
    binade inside the format's range costs the same, and the middle of that run is taken."""
    c = binade + 126  # the binade's index among the 2**-126 .. 2**127 bounds
    first = c - min_index - span + 1
    return 31 - first - span // 2


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("fmt", [(85, 18, 2.0 ** -40), (78, 33, 2.0 ** -42)])  # float8_143, float8_152
def test_fp8_mse_scale(dtype, fmt):
    x = -RNG.uniform(2 ** 5, 2 ** 6 - 1, 10).astype(dtype)

    def build(t):
        return addons.fp8_mse_scale(t, *fmt)

    (bias,) = compare_engines(build, [x], native_ops=["fp8_mse_scale"])
    assert bias.dtype == np.int32 and bias.shape == ()
    assert bias == fp8_expected(5, fmt[0], fmt[1])
    mixed = RNG.standard_normal(1000).astype(dtype) * 10.0 ** RNG.integers(-3, 3, 1000)
    compare_engines(build, [mixed.astype(dtype)], native_ops=["fp8_mse_scale"])


@pytest.mark.parametrize("src_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("fp8", [popxl.float8_143, popxl.float8_152])
@pytest.mark.parametrize("binade", [5, -6, 12])
def test_fp8_mse_scale_agrees_with_the_host_estimate(src_dtype, fp8, binade):
    # popxl-addons hands the op its format's lowest binade as a float32 exponent index (lowest
    # exponent - 31 + 126), the number of binades the format spans, and a rounding error taken from
    # float16's 10 mantissa bits; on values that share one binade the device's choice is PopXL's
    # host_fp8_mse_scale (which takes the rounding error from the data's own type).
    from popxl.fp8_utils import host_fp8_mse_scale
    lowest, highest, mant = {"float8_143": (-10, 7, 3), "float8_152": (-17, 15, 2)}[fp8.name]
    params = (lowest - 31 + 126, highest - lowest + 1, 2.0 ** (-2.0 * (10 - mant)))
    x = -RNG.uniform(2.0 ** binade, 2.0 ** (binade + 1) * 0.999, 16).astype(src_dtype)
    (bias,) = compare_engines(lambda t: addons.fp8_mse_scale(t, *params), [x], native_ops=["fp8_mse_scale"])
    assert bias == host_fp8_mse_scale(x, fp8)[1] == fp8_expected(binade, params[0], params[1])


def test_linear_layout_is_a_copy():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    (out,) = compare_engines(lambda t: addons.linear_layout(t, 4), [x])
    np.testing.assert_array_equal(out, x)
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match="grain size bs must be an int > 0"):
            addons.linear_layout(popxl.variable(x), 0)


def csr(dense):
    rows = np.concatenate([[0], np.cumsum((dense != 0).sum(1))])
    cols = np.concatenate([np.nonzero(r)[0] for r in dense])
    return dense[dense != 0], cols, rows


@pytest.mark.parametrize("lhs_shape,dtype", [((5, 6), np.float32), ((1, 5, 6), np.float16)])
def test_dense_sparse_matmul(lhs_shape, dtype):
    rhs = RNG.standard_normal((6, 7)) * (RNG.uniform(size=(6, 7)) < 0.4)
    lhs = RNG.standard_normal(lhs_shape).astype(dtype)
    (out,) = compare_engines(lambda t: addons.dense_sparse_matmul(t, *csr(rhs), 7), [lhs], rtol=1e-3, atol=1e-3)
    assert out.shape == lhs_shape[:-1] + (7,) and out.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-2
    np.testing.assert_allclose(out, lhs.astype(np.float64) @ rhs.astype(dtype).astype(np.float64), rtol=tol, atol=tol)
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match="not a CSR matrix"):
            addons.dense_sparse_matmul(popxl.variable(lhs), [1.0], [0], [0, 2], 7)
        with pytest.raises(ValueError, match="has 6 columns but the sparse matrix 5 rows"):
            addons.dense_sparse_matmul(popxl.variable(lhs), [], [], [0] * 6, 7)
