"""gpt_block: one pre-LayerNorm GPT-2 decoder block + LM head, next-token cross-entropy, SGD.

tokens[8,128] int32 -> token embedding (vocab 1024, d 256) + learned positions -> LN -> causal
self-attention (4 heads of 64, explicit softmax with an additive -1e9 mask) -> residual -> LN ->
MLP (256 -> 1024 -> gelu(tanh) -> 256) -> residual -> LN -> Linear(256, 1024) -> softmax
cross-entropy against the next tokens. Activations are kept as (batch*seq, d) rows, because
popxl's layer_norm normalises each row of a 2-D tensor.
"""
from __future__ import annotations

from typing import List

import numpy as np

from benchmarks.common import Case
from benchmarks.workloads.training import STEPS, TrainSpec, training_builders

VOCAB, D, HEADS, SEQ, BATCH = 1024, 256, 4, 128, 8
HEAD_DIM = D // HEADS
LR = 0.005
# Parameter order, shared by every framework's forward.
NAMES = ["wte", "wpe", "ln1_g", "ln1_b", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
         "ln2_g", "ln2_b", "w1", "b1", "w2", "b2", "lnf_g", "lnf_b", "w_head", "b_head"]


def make_spec(seed: int = 0) -> TrainSpec:
    """GPT-2 style init (normal 0.02 weights, zero biases, unit LayerNorm gains) and STEPS batches
    of random token sequences; the labels are the inputs shifted by one token."""
    rng = np.random.default_rng(seed)
    shapes = {"wte": (VOCAB, D), "wpe": (SEQ, D), "wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D),
              "w1": (D, 4 * D), "w2": (4 * D, D), "w_head": (D, VOCAB)}
    params = []
    for name in NAMES:
        if name in shapes:
            params.append((rng.standard_normal(shapes[name]) * 0.02).astype(np.float32))
        else:
            width = 4 * D if name == "b1" else VOCAB if name == "b_head" else D
            params.append(np.full(width, 1.0 if name.endswith("_g") else 0.0, np.float32))
    tokens = rng.integers(0, VOCAB, (STEPS, BATCH, SEQ + 1)).astype(np.int32)
    # A step takes a good fraction of a second: one-step-per-call benches check 10 steps.
    return TrainSpec(params, tokens[:, :, :-1].copy(), tokens[:, :, 1:].reshape(STEPS, BATCH * SEQ).copy(), LR,
                     check_steps=10)


def causal_mask() -> np.ndarray:
    """0 on and below the diagonal, -1e9 above: added to the scores before the softmax."""
    return np.triu(np.full((SEQ, SEQ), -1e9, np.float32), k=1)


def popxl_forward(tokens, *params):
    import popxl
    import popxl.ops as ops

    p = dict(zip(NAMES, params))
    rows = BATCH * SEQ

    def heads(t):  # (rows, D) -> (BATCH, HEADS, SEQ, HEAD_DIM)
        return ops.transpose(ops.reshape(t, (BATCH, SEQ, HEADS, HEAD_DIM)), (0, 2, 1, 3))

    h = ops.reshape(ops.gather(p["wte"], tokens) + p["wpe"], (rows, D))
    a = ops.layer_norm(h, p["ln1_g"], p["ln1_b"])
    q, k, v = (heads(a @ p[f"w{n}"] + p[f"b{n}"]) for n in "qkv")
    scores = (q @ ops.transpose(k, (0, 1, 3, 2))) * (1.0 / np.sqrt(HEAD_DIM)) + popxl.constant(causal_mask())
    att = ops.softmax(scores, axis=-1) @ v
    h = h + ops.reshape(ops.transpose(att, (0, 2, 1, 3)), (rows, D)) @ p["wo"] + p["bo"]
    m = ops.layer_norm(h, p["ln2_g"], p["ln2_b"])
    h = h + ops.gelu(m @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    return ops.layer_norm(h, p["lnf_g"], p["lnf_b"]) @ p["w_head"] + p["b_head"]


def torch_forward(tokens, params):
    import torch
    import torch.nn.functional as F

    p = dict(zip(NAMES, params))
    rows = BATCH * SEQ
    mask = torch.from_numpy(causal_mask())

    def heads(t):
        return t.view(BATCH, SEQ, HEADS, HEAD_DIM).transpose(1, 2)

    h = (F.embedding(tokens, p["wte"]) + p["wpe"]).view(rows, D)
    a = F.layer_norm(h, (D,), p["ln1_g"], p["ln1_b"])
    q, k, v = (heads(torch.addmm(p[f"b{n}"], a, p[f"w{n}"])) for n in "qkv")
    scores = (q @ k.transpose(-1, -2)) * (1.0 / np.sqrt(HEAD_DIM)) + mask
    att = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(rows, D)
    h = h + torch.addmm(p["bo"], att, p["wo"])
    m = F.layer_norm(h, (D,), p["ln2_g"], p["ln2_b"])
    h = h + torch.addmm(p["b2"], F.gelu(torch.addmm(p["b1"], m, p["w1"]), approximate="tanh"), p["w2"])
    return torch.addmm(p["b_head"], F.layer_norm(h, (D,), p["lnf_g"], p["lnf_b"]), p["w_head"])


def jax_forward(tokens, params):
    import jax
    import jax.numpy as jnp

    p = dict(zip(NAMES, params))
    rows = BATCH * SEQ

    def heads(t):
        return t.reshape(BATCH, SEQ, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)

    def layer_norm(t, g, b):
        mu = t.mean(-1, keepdims=True)
        return (t - mu) * jax.lax.rsqrt(((t - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    h = (p["wte"][tokens] + p["wpe"]).reshape(rows, D)
    a = layer_norm(h, p["ln1_g"], p["ln1_b"])
    q, k, v = (heads(a @ p[f"w{n}"] + p[f"b{n}"]) for n in "qkv")
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / np.sqrt(HEAD_DIM)) + jnp.asarray(causal_mask())
    att = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(rows, D)
    h = h + att @ p["wo"] + p["bo"]
    m = layer_norm(h, p["ln2_g"], p["ln2_b"])
    h = h + jax.nn.gelu(m @ p["w1"] + p["b1"], approximate=True) @ p["w2"] + p["b2"]
    return layer_norm(h, p["lnf_g"], p["lnf_b"]) @ p["w_head"] + p["b_head"]


def cases(quick: bool) -> List[Case]:
    # float32 accumulations in different orders over 100 steps: the losses agree to ~1e-5.
    return [Case("gpt_block", f"batch {BATCH}, seq {SEQ}, d {D}", "steps/s",
                 training_builders(make_spec, popxl_forward, torch_forward, jax_forward, torch_compile=True), rtol=1e-3,
                 must_match=False)]
