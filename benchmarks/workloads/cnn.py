"""cnn_infer: ResNet-18 layout inference, batch 8 of 3x224x224, images/s.

One description of the network (`resnet18`, walking `Ops`) drives every framework: popxl built
directly with ops.conv / batch_norm_inference / relu / max_pool / average_pool / matmul, PyTorch
eager functional ops, a jitted JAX function, and an ONNX model (the same weights as initializers)
for ONNX Runtime. Only the tensor type behind the `Ops` methods changes.

The primary popxl line is that ONNX model imported through `popart.InferenceSession`
(`batchesPerStep` batches looped in the engine per run), as the user's documents serve a model;
the directly built popxl program is a second column. The tests import `resnet18_onnx` too.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from benchmarks.common import Bench, Case, Unavailable, import_or_unavailable

BATCH, CLASSES, EPS = 8, 1000, 1e-5
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block)


def conv_bn_specs() -> List[Tuple[str, int, int, int]]:
    """(name, in channels, out channels, kernel) of every conv+BN pair, in network order."""
    specs = [("stem", 3, 64, 7)]
    cin = 64
    for s, (c, stride) in enumerate(STAGES):
        for blk in range(2):
            name = f"s{s}b{blk}"
            specs += [(f"{name}c1", cin, c, 3), (f"{name}c2", c, c, 3)]
            if blk == 0 and (stride != 1 or cin != c):
                specs.append((f"{name}down", cin, c, 1))
            cin = c
    return specs


def make_params(seed: int = 0) -> Dict[str, np.ndarray]:
    """He-normal conv weights (OIHW) and BN statistics near, but not at, identity."""
    rng = np.random.default_rng(seed)
    p: Dict[str, np.ndarray] = {}
    for name, cin, cout, k in conv_bn_specs():
        p[f"{name}.w"] = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        p[f"{name}.scale"] = (1 + 0.1 * rng.standard_normal(cout)).astype(np.float32)
        p[f"{name}.bias"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        p[f"{name}.mean"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        p[f"{name}.var"] = rng.uniform(0.5, 1.5, cout).astype(np.float32)
    p["fc.w"] = (rng.standard_normal((512, CLASSES)) / np.sqrt(512)).astype(np.float32)
    p["fc.b"] = np.zeros(CLASSES, np.float32)
    return p


def make_input(seed: int = 1, batch: int = BATCH, image: int = 224) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, image, image)).astype(np.float32)


class Ops:
    """The operations ResNet-18 needs; each framework implements them on its tensor type."""

    def conv_bn(self, x: Any, name: str, stride: int, pad: int, relu: bool) -> Any: ...
    def max_pool(self, x: Any) -> Any: ...  # 3x3, stride 2, pad 1
    def add_relu(self, x: Any, y: Any) -> Any: ...
    def head(self, x: Any) -> Any: ...  # global average pool, flatten, fully connected


def resnet18(x: Any, f: Ops) -> Any:
    x = f.max_pool(f.conv_bn(x, "stem", 2, 3, relu=True))
    cin = 64
    for s, (c, stride) in enumerate(STAGES):
        for blk in range(2):
            name, st = f"s{s}b{blk}", stride if blk == 0 else 1
            y = f.conv_bn(f.conv_bn(x, f"{name}c1", st, 1, relu=True), f"{name}c2", 1, 1, relu=False)
            short = f.conv_bn(x, f"{name}down", st, 0, relu=False) if blk == 0 and (st != 1 or cin != c) else x
            x = f.add_relu(y, short)
            cin = c
    return f.head(x)


# popxl --------------------------------------------------------------------------------------------
class PopxlOps(Ops):
    def __init__(self, params: Dict[str, np.ndarray]) -> None:
        import popxl
        import popxl.ops as ops
        self.ops = ops
        self.v = {k: popxl.variable(a, name=k) for k, a in params.items()}

    def conv_bn(self, x, name, stride, pad, relu):
        v, ops = self.v, self.ops
        y = ops.conv(x, v[f"{name}.w"], stride=(stride, stride), padding=(pad,) * 4)
        y = ops.batch_norm_inference(y, v[f"{name}.scale"], v[f"{name}.bias"], v[f"{name}.mean"], v[f"{name}.var"],
                                     epsilon=EPS)
        return ops.relu(y) if relu else y

    def max_pool(self, x):
        return self.ops.max_pool(x, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1))

    def add_relu(self, x, y):
        return self.ops.relu(x + y)

    def head(self, x):
        pooled = self.ops.average_pool(x, kernel_size=tuple(x.shape[2:]))
        return self.ops.reshape(pooled, (x.shape[0], x.shape[1])) @ self.v["fc.w"] + self.v["fc.b"]


def build_popxl() -> Bench:
    import popxl
    import popxl.ops as ops

    x_host = make_input()
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream(x_host.shape, popxl.float32, name="x")
        y_stream = popxl.d2h_stream((BATCH, CLASSES), popxl.float32, name="logits")
        ops.host_store(y_stream, resnet18(ops.host_load(x_stream), PopxlOps(make_params())))
    session = popxl.Session(ir, "cpu")
    session.__enter__()
    return Bench(lambda: session.run({x_stream: x_host})[y_stream], items=BATCH,
                 close=lambda: session.__exit__(None, None, None))


# PyTorch eager ------------------------------------------------------------------------------------
class TorchOps(Ops):
    def __init__(self, params: Dict[str, np.ndarray]) -> None:
        import torch
        self.F = torch.nn.functional
        self.p = {k: torch.from_numpy(a) for k, a in params.items()}

    def conv_bn(self, x, name, stride, pad, relu):
        p, F = self.p, self.F
        y = F.batch_norm(F.conv2d(x, p[f"{name}.w"], stride=stride, padding=pad), p[f"{name}.mean"],
                         p[f"{name}.var"], p[f"{name}.scale"], p[f"{name}.bias"], training=False, eps=EPS)
        return F.relu(y) if relu else y

    def max_pool(self, x):
        return self.F.max_pool2d(x, 3, 2, 1)

    def add_relu(self, x, y):
        return self.F.relu(x + y)

    def head(self, x):
        return self.F.adaptive_avg_pool2d(x, 1).flatten(1) @ self.p["fc.w"] + self.p["fc.b"]


def build_torch() -> Bench:
    torch = import_or_unavailable("torch")
    f, x = TorchOps(make_params()), torch.from_numpy(make_input())

    def call():
        with torch.inference_mode():
            return resnet18(x, f).numpy()
    return Bench(call, items=BATCH)


# JAX ----------------------------------------------------------------------------------------------
class JaxOps(Ops):
    def __init__(self, params) -> None:
        import jax
        self.jax, self.p = jax, params

    def conv_bn(self, x, name, stride, pad, relu):
        lax, p = self.jax.lax, self.p
        y = lax.conv_general_dilated(x, p[f"{name}.w"], (stride, stride), [(pad, pad)] * 2,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
        c = (1, -1, 1, 1)
        inv = p[f"{name}.scale"] * lax.rsqrt(p[f"{name}.var"] + EPS)
        y = (y - p[f"{name}.mean"].reshape(c)) * inv.reshape(c) + p[f"{name}.bias"].reshape(c)
        return self.jax.nn.relu(y) if relu else y

    def max_pool(self, x):
        lax = self.jax.lax
        return lax.reduce_window(x, -np.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 1), (1, 1)])

    def add_relu(self, x, y):
        return self.jax.nn.relu(x + y)

    def head(self, x):
        return x.mean(axis=(2, 3)) @ self.p["fc.w"] + self.p["fc.b"]


def build_jax() -> Bench:
    import_or_unavailable("jax")
    import jax
    import jax.numpy as jnp

    params = {k: jnp.asarray(a) for k, a in make_params().items()}
    x = jnp.asarray(make_input())
    # Weights are arguments, not closed-over constants, as a served model's would be.
    fwd = jax.jit(lambda ps, x: resnet18(x, JaxOps(ps)))
    return Bench(lambda: fwd(params, x).block_until_ready(), items=BATCH)


# ONNX Runtime -------------------------------------------------------------------------------------
class OnnxOps(Ops):
    """Emits ONNX nodes; the "tensors" are value names."""

    def __init__(self, folded: bool = False) -> None:
        import onnx.helper
        self.helper, self.nodes, self.count, self.folded = onnx.helper, [], 0, folded

    def _node(self, op: str, inputs: List[str], **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}{self.count}"
        self.nodes.append(self.helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv_bn(self, x, name, stride, pad, relu):
        if self.folded:  # the batch norm is in the weights and the Conv's bias (see fold_batch_norms)
            y = self._node("Conv", [x, f"{name}.w", f"{name}.b"], strides=[stride] * 2, pads=[pad] * 4)
        else:
            y = self._node("Conv", [x, f"{name}.w"], strides=[stride] * 2, pads=[pad] * 4)
            y = self._node("BatchNormalization", [y] + [f"{name}.{k}" for k in ("scale", "bias", "mean", "var")],
                           epsilon=EPS)
        return self._node("Relu", [y]) if relu else y

    def max_pool(self, x):
        return self._node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])

    def add_relu(self, x, y):
        return self._node("Relu", [self._node("Add", [x, y])])

    def head(self, x):
        flat = self._node("Flatten", [self._node("GlobalAveragePool", [x])])
        return self._node("Gemm", [flat, "fc.w", "fc.b"])


def fold_batch_norms(params: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``params`` with each conv's batch norm folded into its weights and a bias (``name.b``), as
    torch.onnx.export writes a model in eval mode: w * s and bias - mean * s, s = scale / sqrt(var + eps)."""
    out = {k: v for k, v in params.items() if not k.startswith(tuple(f"{n}." for n, *_ in conv_bn_specs()))}
    for name, *_ in conv_bn_specs():
        s = params[f"{name}.scale"] / np.sqrt(params[f"{name}.var"] + EPS)
        out[f"{name}.w"] = (params[f"{name}.w"] * s[:, None, None, None]).astype(np.float32)
        out[f"{name}.b"] = (params[f"{name}.bias"] - params[f"{name}.mean"] * s).astype(np.float32)
    return out


def resnet18_onnx(batch: int = BATCH, image: int = 224, input_name: str = "x", output_name: str = "logits",
                  folded: bool = False):
    """The network as an ONNX ModelProto (opset 13), weights included, for (batch, 3, image, image)
    inputs (image a multiple of 32, the network's total stride). ``folded``: Conv (with bias) + Relu,
    the batch norms folded into the convolutions, as PyTorch exports the network in eval mode."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    f = OnnxOps(folded)
    resnet18(input_name, f)
    f.nodes[-1].output[0] = output_name
    params = fold_batch_norms(make_params()) if folded else make_params()
    graph = helper.make_graph(
        f.nodes, "resnet18",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch, CLASSES])],
        [numpy_helper.from_array(a, k) for k, a in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def build_ort() -> Bench:
    ort = import_or_unavailable("onnxruntime")
    import os

    opts = ort.SessionOptions()
    threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    # ORT's idle pool threads otherwise spin on, taking a core from whichever framework runs next
    # (popxl's images/s fell ~8% with an ORT session alive); ORT's own speed is the same without.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        sess = ort.InferenceSession(resnet18_onnx().SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise Unavailable(f"onnxruntime could not load the model: {e}") from e
    feed = {"x": make_input()}
    return Bench(lambda: sess.run(None, feed)[0], items=BATCH)


# popxl through the PopART front end --------------------------------------------------------------
BATCHES_PER_STEP = 2  # batches per session.run, looped in the engine


def build_popart() -> Bench:
    import popart

    data_flow = popart.DataFlow(BATCHES_PER_STEP, {"logits": popart.AnchorReturnType("All")})
    session = popart.InferenceSession(resnet18_onnx().SerializeToString(), data_flow,
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    # The same batch each step, so the logits compare with the other frameworks' single batch.
    stepio = popart.PyStepIO({"x": np.stack([make_input()] * BATCHES_PER_STEP)}, anchors)

    def call():
        session.run(stepio)
        return anchors["logits"]
    return Bench(call, items=BATCH * BATCHES_PER_STEP, close=session.detach)


def cases(quick: bool) -> List[Case]:
    # Convolution algorithms (direct, Winograd, im2col) round differently through 20 layers.
    return [Case("cnn_infer", f"ResNet-18, batch {BATCH}, 3x224x224", "images/s",
                 {"popxl": build_popart, "popxl_ops": build_popxl, "torch": build_torch, "jax": build_jax, "ort": build_ort}, rtol=1e-3)]
