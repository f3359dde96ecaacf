"""bert_infer and bert_train: the BERT-base encoder layer (hidden 768, 12 heads of 64, FFN 3072,
erf GELU, post-LayerNorm, eps 1e-12, additive attention mask over padded keys).

bert_infer: the 12-layer encoder with BERT's embeddings (words 30522, positions, token type 0,
LayerNorm), written in plain PyTorch with random weights (nothing downloaded), exported once by
``torch.onnx.export`` (TorchScript exporter, opset 17) and run by ``popart.InferenceSession``
(the popxl line), ONNX Runtime (every graph optimisation on: it fuses LayerNorm, GELU, attention
and the MatMul transposes) and PyTorch eager, at batch 8 x seq 128 (sequences/s) and batch 1 x
seq 128 (latency). The output compared is the last hidden state.

bert_train: 2 of those layers between a small token embedding (vocab 1024, learned positions,
LayerNorm) and a per-token Linear(768, 1024) head, softmax cross-entropy against random tokens,
plain SGD; popxl runs 20 steps per session.run (``ops.repeat``), against PyTorch eager,
torch.compile, JAX jit and a 20-step JAX lax.scan (see training.py).

``--quick`` shrinks both (2 layers, hidden 256, 4 heads, FFN 1024; training at batch 4 x seq 64,
4 steps) to a smoke test of the same code.
"""
from __future__ import annotations

import functools
import io
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List

import numpy as np

from benchmarks.common import Bench, Case, Unavailable, import_or_unavailable
from benchmarks.workloads.training import TrainSpec, training_builders

EPS = 1e-12  # BERT's LayerNorm epsilon
MASKED = -10000.0  # what BERT adds to the scores of padded keys
OPSET = 17
LR = 0.005


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    batch: int
    seq: int
    steps: int = 20  # training: batches, and popxl's steps per run

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


BERT_BASE = Config(layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, batch=8, seq=128)
QUICK = Config(layers=2, hidden=256, heads=4, ffn=1024, vocab=1024, batch=8, seq=128)
TRAIN = Config(layers=2, hidden=768, heads=12, ffn=3072, vocab=1024, batch=8, seq=128, steps=20)
TRAIN_QUICK = Config(layers=2, hidden=256, heads=4, ffn=1024, vocab=1024, batch=4, seq=64, steps=4)

LAYER_NAMES = ["wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln1_g", "ln1_b", "w1", "b1", "w2", "b2",
               "ln2_g", "ln2_b"]


def make_params(cfg: Config, seed: int = 0, head: bool = False) -> Dict[str, np.ndarray]:
    """BERT's init (normal 0.02 weights (in, out)), with biases and LayerNorm gains perturbed
    likewise so that none is zero or the identity (the exporter would merge equal initializers);
    embeddings, layers ``l{i}.*``, and with ``head`` the token classifier."""
    rng = np.random.default_rng(seed)
    d, f = cfg.hidden, cfg.ffn
    shapes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, f), "w2": (f, d)}

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    p = {"wte": normal(cfg.vocab, d), "wpe": normal(cfg.seq, d), "lne_g": 1 + normal(d), "lne_b": normal(d)}
    for i in range(cfg.layers):
        for name in LAYER_NAMES:
            if name in shapes:
                p[f"l{i}.{name}"] = normal(*shapes[name])
            else:
                p[f"l{i}.{name}"] = (1 if name.endswith("_g") else 0) + normal(f if name == "b1" else d)
    if head:
        p["w_head"], p["b_head"] = normal(d, cfg.vocab), normal(cfg.vocab)
    return p


def padding(cfg: Config) -> np.ndarray:
    """(batch, seq) 1/0 attention mask: sequence b keeps seq - 16 * (b % 4) tokens (padding at the end)."""
    keep = cfg.seq - (cfg.seq // 8) * (np.arange(cfg.batch) % 4)
    return (np.arange(cfg.seq)[None, :] < keep[:, None]).astype(np.int64)


def additive_mask(cfg: Config) -> np.ndarray:
    """(batch, 1, 1, seq): 0 for kept keys, MASKED for padded ones, added to the attention scores."""
    return ((1 - padding(cfg)) * MASKED).astype(np.float32)[:, None, None, :]


# PyTorch: one encoder layer, shared by the exported model, PyTorch eager and torch.compile ------------
def torch_layer(h, mask, p, cfg: Config):
    """One post-LN encoder layer on h (batch, seq, hidden); weights (in, out) in ``p``."""
    import torch
    import torch.nn.functional as F

    b, s, d = h.shape

    def split(t):  # (b, s, d) -> (b, heads, s, head_dim)
        return t.view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)

    q, k, v = (split(h @ p[f"w{n}"] + p[f"b{n}"]) for n in "qkv")
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim) + mask
    att = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, d)
    # Linear layers then the residual: (x @ w + b) + h, as BERT's modules compute them
    h = F.layer_norm((att @ p["wo"] + p["bo"]) + h, (d,), p["ln1_g"], p["ln1_b"], EPS)
    ff = F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    return F.layer_norm(ff + h, (d,), p["ln2_g"], p["ln2_b"], EPS)


def _torch_bert(cfg: Config):
    """The inference model: a torch.nn.Module taking (input_ids, attention_mask), both int64
    (batch, seq), returning the last hidden state."""
    import torch
    import torch.nn.functional as F

    params = make_params(cfg)
    params["wtt"] = (np.random.default_rng(1).standard_normal((2, cfg.hidden)) * 0.02).astype(np.float32)

    class Bert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # ParameterDict keys may not contain dots
            self.p = torch.nn.ParameterDict({k.replace(".", "_"): torch.from_numpy(v) for k, v in params.items()})

        def forward(self, input_ids, attention_mask):
            p = self.p
            h = p["wte"][input_ids] + p["wpe"][: input_ids.shape[1]] + p["wtt"][0]
            h = F.layer_norm(h, (cfg.hidden,), p["lne_g"], p["lne_b"], EPS)
            mask = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * MASKED
            for i in range(cfg.layers):
                h = torch_layer(h, mask, {n: p[f"l{i}_{n}"] for n in LAYER_NAMES}, cfg)
            return h

    return Bert().eval()


def _inputs(cfg: Config) -> Dict[str, np.ndarray]:
    ids = np.random.default_rng(2).integers(0, cfg.vocab, (cfg.batch, cfg.seq)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": padding(cfg)}


@functools.lru_cache(maxsize=1)
def _model(cfg: Config):
    """(torch module, ONNX bytes) for ``cfg``: built and exported once, shared by a case's builders."""
    torch = import_or_unavailable("torch")
    module = _torch_bert(cfg)
    feeds = {k: torch.from_numpy(v) for k, v in _inputs(cfg).items()}
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about Python values taken as constants
        torch.onnx.export(module, tuple(feeds.values()), f, input_names=list(feeds), output_names=["hidden"],
                          opset_version=OPSET, dynamo=False)
    return module, f.getvalue()


def build_torch_infer(cfg: Config) -> Bench:
    torch = import_or_unavailable("torch")
    module = _model(cfg)[0]
    feeds = [torch.from_numpy(v) for v in _inputs(cfg).values()]

    def call():
        with torch.inference_mode():
            return module(*feeds).numpy()
    return Bench(call, items=cfg.batch)


def build_ort_infer(cfg: Config) -> Bench:
    ort = import_or_unavailable("onnxruntime")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads, opts.inter_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "0")), 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see cnn.build_ort
    try:
        sess = ort.InferenceSession(_model(cfg)[1], opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise Unavailable(f"onnxruntime could not load the model: {e}") from e
    feeds = _inputs(cfg)
    return Bench(lambda: sess.run(None, feeds)[0], items=cfg.batch)


def build_popart_infer(cfg: Config) -> Bench:
    import popart

    session = popart.InferenceSession(_model(cfg)[1], popart.DataFlow(1, {"hidden": popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    stepio = popart.PyStepIO(_inputs(cfg), anchors)

    def call():
        session.run(stepio)
        return anchors["hidden"]
    return Bench(call, items=cfg.batch, close=session.detach, session=session._px)


def infer_cases(quick: bool) -> List[Case]:
    base = QUICK if quick else BERT_BASE
    cases = []
    for batch in (8, 1):
        cfg = Config(**{**base.__dict__, "batch": batch})
        builders = {"popxl": functools.partial(build_popart_infer, cfg),
                    "torch": functools.partial(build_torch_infer, cfg), "ort": functools.partial(build_ort_infer, cfg)}
        name = f"{cfg.layers} layers, hidden {cfg.hidden}, batch {batch} x seq {cfg.seq}"
        # 12 float32 layers summed in different orders: the hidden states agree to ~1e-5 of their largest.
        if batch == 1:
            cases.append(Case("bert_infer", name, "ms", builders, lower_is_better=True, scale=1e3, rtol=1e-3))
        else:
            cases.append(Case("bert_infer", name, "sequences/s", builders, rtol=1e-3))
    return cases


# Training ---------------------------------------------------------------------------------------------
def train_names(cfg: Config) -> List[str]:
    """Parameter order, shared by every framework's forward."""
    return (["wte", "wpe", "lne_g", "lne_b"] + [f"l{i}.{n}" for i in range(cfg.layers) for n in LAYER_NAMES]
            + ["w_head", "b_head"])


def make_train_spec(cfg: Config) -> TrainSpec:
    """cfg.steps batches of random tokens, labels random tokens too (one class per token)."""
    p = make_params(cfg, head=True)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, cfg.vocab, (cfg.steps, cfg.batch, cfg.seq)).astype(np.int32)
    labels = rng.integers(0, cfg.vocab, (cfg.steps, cfg.batch * cfg.seq)).astype(np.int32)
    # A step takes about a second: one-step-per-call benches check the first 3. Attention fused
    # before autodiff: 8% less peak memory (the probabilities are recomputed, not stored) for ~0.2%
    # of a step's time (its 12 heads' forward and backward take ~1.03x the unfused time).
    return TrainSpec([p[n] for n in train_names(cfg)], tokens, labels, LR, check_steps=min(3, cfg.steps),
                     fuse_attention=True)


def popxl_train_forward(cfg: Config, tokens, *params):
    """Activations as (batch * seq, hidden) rows: popxl's layer_norm normalises each row of a 2-D tensor."""
    import popxl
    import popxl.ops as ops

    p = dict(zip(train_names(cfg), params))
    rows, d = cfg.batch * cfg.seq, cfg.hidden
    mask = popxl.constant(additive_mask(cfg))

    def split(t):  # (rows, d) -> (batch, heads, seq, head_dim)
        return ops.transpose(ops.reshape(t, (cfg.batch, cfg.seq, cfg.heads, cfg.head_dim)), (0, 2, 1, 3))

    h = ops.reshape(ops.gather(p["wte"], tokens) + p["wpe"], (rows, d))
    h = ops.layer_norm(h, p["lne_g"], p["lne_b"], EPS)
    for i in range(cfg.layers):
        w = {n: p[f"l{i}.{n}"] for n in LAYER_NAMES}
        q, k, v = (split(h @ w[f"w{n}"] + w[f"b{n}"]) for n in "qkv")
        scores = (q @ ops.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(cfg.head_dim)) + mask
        att = ops.reshape(ops.transpose(ops.softmax(scores, axis=-1) @ v, (0, 2, 1, 3)), (rows, d))
        h = ops.layer_norm((att @ w["wo"] + w["bo"]) + h, w["ln1_g"], w["ln1_b"], EPS)
        h = ops.layer_norm((ops.geluerf(h @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]) + h, w["ln2_g"], w["ln2_b"], EPS)
    return h @ p["w_head"] + p["b_head"]


def torch_train_forward(cfg: Config, tokens, params):
    import torch.nn.functional as F

    p = dict(zip(train_names(cfg), params))
    mask = _torch_mask(cfg)
    h = F.layer_norm(p["wte"][tokens] + p["wpe"], (cfg.hidden,), p["lne_g"], p["lne_b"], EPS)
    for i in range(cfg.layers):
        h = torch_layer(h, mask, {n: p[f"l{i}.{n}"] for n in LAYER_NAMES}, cfg)
    return h.reshape(-1, cfg.hidden) @ p["w_head"] + p["b_head"]


_TORCH_MASKS: Dict[Config, Any] = {}


def _torch_mask(cfg: Config):
    """The additive mask as a tensor, made once per config. A plain dict, not functools.lru_cache:
    torch.compile traces this function, and Dynamo warns that it ignores lru_cache wrappers."""
    if cfg not in _TORCH_MASKS:
        import torch
        _TORCH_MASKS[cfg] = torch.from_numpy(additive_mask(cfg))
    return _TORCH_MASKS[cfg]


def jax_train_forward(cfg: Config, tokens, params):
    import jax
    import jax.numpy as jnp

    p = dict(zip(train_names(cfg), params))
    b, s, d = cfg.batch, cfg.seq, cfg.hidden

    def layer_norm(t, g, beta):
        mu = t.mean(-1, keepdims=True)
        return (t - mu) * jax.lax.rsqrt(((t - mu) ** 2).mean(-1, keepdims=True) + EPS) * g + beta

    def split(t):
        return t.reshape(b, s, cfg.heads, cfg.head_dim).transpose(0, 2, 1, 3)

    mask = jnp.asarray(additive_mask(cfg))
    h = layer_norm(p["wte"][tokens] + p["wpe"], p["lne_g"], p["lne_b"])
    for i in range(cfg.layers):
        w = {n: p[f"l{i}.{n}"] for n in LAYER_NAMES}
        q, k, v = (split(h @ w[f"w{n}"] + w[f"b{n}"]) for n in "qkv")
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(cfg.head_dim) + mask
        att = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
        h = layer_norm((att @ w["wo"] + w["bo"]) + h, w["ln1_g"], w["ln1_b"])
        h = layer_norm((jax.nn.gelu(h @ w["w1"] + w["b1"], approximate=False) @ w["w2"] + w["b2"]) + h,
                       w["ln2_g"], w["ln2_b"])
    return h.reshape(b * s, d) @ p["w_head"] + p["b_head"]


def train_cases(quick: bool) -> List[Case]:
    cfg = TRAIN_QUICK if quick else TRAIN
    def popxl_forward(tokens, *params):  # a plain function: what Ir.create_graph takes
        return popxl_train_forward(cfg, tokens, *params)
    builders = training_builders(functools.partial(make_train_spec, cfg), popxl_forward,
                                 functools.partial(torch_train_forward, cfg), functools.partial(jax_train_forward, cfg),
                                 torch_compile=True)
    # float32 sums in different orders over the checked steps: the losses agree to ~1e-5.
    return [Case("bert_train", f"{cfg.layers} layers, hidden {cfg.hidden}, batch {cfg.batch} x seq {cfg.seq}",
                 "steps/s", builders, rtol=1e-3, steps_per_run=cfg.steps)]
