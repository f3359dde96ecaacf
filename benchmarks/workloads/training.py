"""The training loop of every training workload, once per framework.

A model is a list of parameters (NumPy, popxl's layout: W is (in, out)) and a forward function
per framework mapping (inputs, params) to 2-D logits (rows, classes). Everything else is shared:
softmax cross-entropy against int32 labels (mean over rows), gradients of all parameters, plain
SGD, and the data: ``STEPS`` batches made up front, step i of any framework using batch i % STEPS,
so the losses of the first STEPS steps are comparable across frameworks (the warm-up check).
A workload may make fewer batches (``TrainSpec.steps``): its device loop and scan then run that many.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List

import numpy as np

from benchmarks.common import Bench, import_or_unavailable

STEPS = 100  # steps per run of popxl's device loop and of the JAX scan; also the checked steps


@dataclass
class TrainSpec:
    params: List[np.ndarray]
    inputs: np.ndarray  # (STEPS, *input shape): float32 features or int32 tokens
    labels: np.ndarray  # (STEPS, rows) int32
    lr: float
    check_steps: int = STEPS  # steps a one-step-per-call bench checks (its warm-up); fewer if slow
    # popxl: fuse the forward's attention before autodiff (transforms.fuse_attention): the
    # gradient recomputes the probabilities instead of storing them, memory for a little time
    fuse_attention: bool = False

    @property
    def steps(self) -> int:
        """Batches made up front: the steps of one device loop or scan, and of the checked losses."""
        return len(self.inputs)


# popxl --------------------------------------------------------------------------------------------
def build_popxl_program(spec: TrainSpec, forward: Callable, steps_per_run: int, ir: Any = None,
                        data_parallel: bool = False):
    """The training Ir: the forward pass is one graph, differentiated with autodiff; a step graph
    loads a batch, calls forward, the fused softmax-NLL gradient and the gradient graph, and
    updates every parameter in place; ``ops.repeat`` runs ``steps_per_run`` steps per run.
    ``ir``: an empty Ir to build in (say, a replicated one); ``data_parallel``: every replica takes
    the mean of the replicas' gradients (``replicated_all_reduce``) before its update.
    Returns (ir, input stream, label stream, loss stream)."""
    import popxl
    import popxl.ops as ops
    from popxl import transforms

    ir = popxl.Ir() if ir is None else ir
    ir.num_host_transfers = steps_per_run
    in_dtype = popxl.float32 if spec.inputs.dtype == np.float32 else popxl.int32
    with ir.main_graph:
        x_stream = popxl.h2d_stream(spec.inputs.shape[1:], in_dtype, name="x")
        y_stream = popxl.h2d_stream(spec.labels.shape[1:], popxl.int32, name="labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, name="loss")
        params = [popxl.variable(p, name=f"p{i}") for i, p in enumerate(spec.params)]
        fwd = ir.create_graph(forward, popxl.TensorSpec(x_stream.shape, in_dtype), *params)
        if spec.fuse_attention:
            transforms.fuse_attention(fwd)
        grad = transforms.autodiff(fwd, grads_required=fwd.inputs[1:])

        def step(*ps: popxl.TensorByRef) -> None:
            x = ops.host_load(x_stream, "x")
            labels = ops.host_load(y_stream, "labels")
            info = ops.call_with_info(fwd, x, *ps)
            loss, dlogits = ops.nll_loss_with_softmax_grad(ops.softmax(info.outputs[0], axis=-1), labels)
            ops.host_store(loss_stream, loss)
            grad_info = ops.call_with_info(grad.graph, dlogits, inputs_dict=grad.inputs_dict(info))
            grads = grad.fwd_parent_ins_to_grad_parent_outs(info, grad_info)
            for p in ps:
                g = ops.collectives.replicated_all_reduce(grads[p], "mean") if data_parallel else grads[p]
                ops.scaled_add_(p, g, b=-spec.lr)

        ops.repeat(ir.create_graph(step, *params), steps_per_run, *params)
    return ir, x_stream, y_stream, loss_stream


def popxl_trainer(spec: TrainSpec, forward: Callable, steps_per_run: int) -> Bench:
    """A `Bench` whose call is one session.run of ``steps_per_run`` steps (data streamed per step)."""
    import popxl

    ir, x_stream, y_stream, loss_stream = build_popxl_program(spec, forward, steps_per_run)
    session = popxl.Session(ir, "cpu")
    session.__enter__()  # attached for the bench's lifetime; close() detaches
    runs = spec.steps // steps_per_run
    k = steps_per_run

    def feed(r: int) -> dict:
        # Host buffers are (num_host_transfers, *shape), that leading dim dropped when it is 1.
        x, y = spec.inputs[r * k:(r + 1) * k], spec.labels[r * k:(r + 1) * k]
        return {x_stream: x[0] if k == 1 else x, y_stream: y[0] if k == 1 else y}
    feeds = [feed(r) for r in range(runs)]
    counter = iter(range(1 << 62))

    def call() -> Any:
        return session.run(feeds[next(counter) % runs])[loss_stream]

    return Bench(call, items=steps_per_run, check_calls=max(1, spec.check_steps // steps_per_run),
                 close=lambda: session.__exit__(None, None, None), session=session)


# PyTorch eager ------------------------------------------------------------------------------------
def torch_trainer(spec: TrainSpec, forward: Callable, compiled: bool = False) -> Bench:
    """Autograd + torch.optim.SGD, one Python call per step; ``compiled``: the loss (forward and
    backward) through ``torch.compile``."""
    torch = import_or_unavailable("torch")
    params = [torch.tensor(p, requires_grad=True) for p in spec.params]
    opt = torch.optim.SGD(params, lr=spec.lr)
    xs = torch.from_numpy(spec.inputs)
    if spec.inputs.dtype == np.int32:  # embedding indices must be int64 in torch
        xs = xs.long()
    ys = torch.from_numpy(spec.labels).long()  # cross_entropy wants int64 targets
    counter = iter(range(1 << 62))
    loss_fn = _torch_loss(forward)
    if compiled:
        # Inductor compiles the forward and (through AOTAutograd) the backward at their first call:
        # made here on copies of the parameters, so that neither the compilation nor a step of
        # training is part of the bench's first (checked) calls.
        loss_fn = torch.compile(loss_fn, backend="inductor")
        copies = [p.detach().clone().requires_grad_() for p in params]
        loss_fn(xs[0], ys[0], copies).backward()

    def call() -> Any:
        i = next(counter) % spec.steps
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(xs[i], ys[i], params)
        loss.backward()
        opt.step()
        return loss.detach()

    return Bench(call, items=1, check_calls=spec.check_steps)


def _torch_loss(forward: Callable) -> Callable:
    import torch.nn.functional as F

    def loss_fn(x, y, params):
        return F.cross_entropy(forward(x, params), y)
    return loss_fn


# JAX ----------------------------------------------------------------------------------------------
def _jax_loss(forward: Callable) -> Callable:
    import jax
    import jax.numpy as jnp

    def loss_fn(params, x, y):
        logp = jax.nn.log_softmax(forward(x, params), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))
    return loss_fn


def jax_step_fn(forward: Callable, lr: float) -> Callable:
    """The pure SGD step (params, x, y) -> (params, loss), not yet jitted."""
    import jax

    grad_fn = jax.value_and_grad(_jax_loss(forward))

    def step(params, x, y):
        loss, grads = grad_fn(params, x, y)
        return [p - lr * g for p, g in zip(params, grads)], loss
    return step


def jax_trainer(spec: TrainSpec, forward: Callable, scan: bool) -> Bench:
    """One jitted step per call with donated parameters, or (``scan``) all ``spec.steps`` steps per
    call in one jitted lax.scan."""
    import_or_unavailable("jax")
    import jax
    import jax.numpy as jnp

    step = jax_step_fn(forward, spec.lr)
    state = {"params": [jnp.asarray(p) for p in spec.params]}
    xs, ys = jnp.asarray(spec.inputs), jnp.asarray(spec.labels)
    # Compiled ahead of time (lower + compile), so that the first, checked call does not compile.
    if scan:
        def many(params, xs, ys):
            return jax.lax.scan(lambda ps, xy: step(ps, *xy), params, (xs, ys))
        run = jax.jit(many, donate_argnums=0).lower(state["params"], xs, ys).compile()

        def call() -> Any:
            state["params"], losses = run(state["params"], xs, ys)
            return losses.block_until_ready()
        return Bench(call, items=spec.steps, check_calls=1)

    batches = [(xs[i], ys[i]) for i in range(spec.steps)]  # device-resident slices, made once
    run = jax.jit(step, donate_argnums=0).lower(state["params"], *batches[0]).compile()
    counter = iter(range(1 << 62))

    def call() -> Any:
        state["params"], loss = run(state["params"], *batches[next(counter) % spec.steps])
        return loss.block_until_ready()
    return Bench(call, items=1, check_calls=spec.check_steps)


def training_builders(make_spec: Callable[[], TrainSpec], popxl_fwd: Callable, torch_fwd: Callable,
                      jax_fwd: Callable, torch_compile: bool = False) -> dict:
    """The per-framework builders of a training case (see `benchmarks.common.FRAMEWORKS`); with
    ``torch_compile``, PyTorch's step through torch.compile too."""
    builders = {
        "popxl": lambda: (lambda spec: popxl_trainer(spec, popxl_fwd, spec.steps))(make_spec()),
        "popxl_1": lambda: popxl_trainer(make_spec(), popxl_fwd, 1),
        "torch": lambda: torch_trainer(make_spec(), torch_fwd),
        "jax": lambda: jax_trainer(make_spec(), jax_fwd, scan=False),
        "jax_scan": lambda: jax_trainer(make_spec(), jax_fwd, scan=True),
    }
    if torch_compile:
        builders["torch_compile"] = lambda: torch_trainer(make_spec(), torch_fwd, compiled=True)
    return builders
