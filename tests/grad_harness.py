"""Check gradients from popxl.transforms.autodiff against central finite differences, all through
a Session: the forward graph and its gradient graph run in one program; the finite differences
rerun the same session with perturbed inputs."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np

import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from popxl import transforms


def apply_pre_alias_patterns(ir: popxl.Ir) -> None:
    """PopART's default pre-alias patterns on every graph of ``ir``, through its internal IR."""
    pb_ir = ir._pb_ir
    pb_ir.setPatterns(_ir.patterns.Patterns(_ir.patterns.PatternsLevel.Default))
    for g in pb_ir.getAllGraphs():
        pb_ir.applyPreAliasPatterns(g)


class GradProgram:
    """One Ir computing the outputs of ``build(*inputs)`` and, for seeds ``dy``, the gradients of
    ``sum(dy * y)`` with respect to the inputs listed in ``wrt``."""

    def __init__(self, build: Callable, inputs: Sequence[np.ndarray], wrt: Sequence[int],
                 dtypes: Optional[Sequence[popxl.dtype]] = None, replication: int = 1,
                 pre_alias_patterns: bool = False) -> None:
        """With ``replication`` > 1 each input holds every replica's value (a leading axis of
        ``replication``), as do the seeds and the results. ``pre_alias_patterns`` applies PopART's
        default pre-alias patterns to every graph before the Session is made (as popxl-addons'
        programs do; its all-reduces with identical inputs need it)."""
        self.inputs = [np.asarray(x) for x in inputs]
        dts = list(dtypes) if dtypes else [popxl.dtypes.from_numpy(x.dtype) for x in self.inputs]
        shapes = [x.shape[1:] if replication > 1 else x.shape for x in self.inputs]
        ir = popxl.Ir(replication=replication)
        with ir.main_graph:
            fwd = ir.create_graph(build, *[popxl.TensorSpec(s, dt) for s, dt in zip(shapes, dts)])
            self.info = transforms.autodiff(fwd, grads_required=[fwd.inputs[i] for i in wrt])
            in_streams = [popxl.h2d_stream(s, dt, f"x{i}") for i, (s, dt) in enumerate(zip(shapes, dts))]
            xs = [ops.host_load(s) for s in in_streams]
            call = ops.call_with_info(fwd, *xs)
            n_seeds = sum(c.connection_type is transforms.ExpectedConnectionType.FwdGrad
                          for c in self.info.expected_inputs)
            ys = call.outputs[:n_seeds]  # the original outputs; later ones are exposed activations
            seed_streams = [popxl.h2d_stream(y.shape, y.dtype, f"dy{i}") for i, y in enumerate(ys)]
            seeds = [ops.host_load(s) for s in seed_streams]
            grads = ops.call(self.info.graph, *seeds, inputs_dict=self.info.inputs_dict(call))
            self.y_streams = [popxl.d2h_stream(y.shape, y.dtype, f"y{i}") for i, y in enumerate(ys)]
            self.g_streams = [popxl.d2h_stream(g.shape, g.dtype, f"g{i}") for i, g in enumerate(grads)]
            for s, t in zip(self.y_streams + self.g_streams, list(ys) + list(grads)):
                ops.host_store(s, t)
        self.in_streams, self.seed_streams = in_streams, seed_streams
        if pre_alias_patterns:
            apply_pre_alias_patterns(ir)
        self.session = popxl.Session(ir, "ipu_model")
        self.session.__enter__()

    def run(self, inputs: Sequence[np.ndarray], seeds: Sequence[np.ndarray]):
        feed = {s: np.array(x, order="C") for s, x in zip(self.in_streams, inputs)}
        feed.update({s: np.array(d, order="C") for s, d in zip(self.seed_streams, seeds)})
        out = self.session.run(feed, downcast_inputs=False)
        return [out[s] for s in self.y_streams], [out[s] for s in self.g_streams]

    def close(self) -> None:
        self.session.__exit__(None, None, None)


def check_grad(build: Callable, inputs: Sequence[np.ndarray], wrt: Optional[Sequence[int]] = None,
               eps: float = 1e-3, rtol: float = 1e-2, atol: float = 1e-3, seed: int = 0,
               directions: int = 4) -> List[np.ndarray]:
    """Assert that autodiff's gradients of ``sum(dy * build(*inputs))`` match central differences.
    Inputs of a float dtype are perturbed in float64 and cast back. Returns the gradients."""
    rng = np.random.default_rng(seed)
    wrt = list(range(len(inputs))) if wrt is None else list(wrt)
    prog = GradProgram(build, inputs, wrt)
    try:
        dys = [rng.standard_normal(s.shape).astype(s.dtype.as_numpy()) for s in prog.seed_streams]
        ys, grads = prog.run(prog.inputs, dys)

        def loss(xs) -> float:
            y, _ = prog.run(xs, dys)
            return float(sum(np.sum(a.astype(np.float64) * d.astype(np.float64)) for a, d in zip(y, dys)))

        for k, (i, g) in enumerate(zip(wrt, grads)):
            x = prog.inputs[i]
            assert g.shape == x.shape, f"gradient of input {i} has shape {g.shape}, expected {x.shape}"
            n = x.size
            dirs = list(np.eye(n)) if n <= 12 else [rng.standard_normal(n) for _ in range(directions)]
            for v in dirs:
                v = v.reshape(x.shape)
                plus = [*prog.inputs]
                minus = [*prog.inputs]
                plus[i] = (x.astype(np.float64) + eps * v).astype(x.dtype)
                minus[i] = (x.astype(np.float64) - eps * v).astype(x.dtype)
                step = (plus[i].astype(np.float64) - minus[i].astype(np.float64))
                denom = float(np.sum(step * v)) / float(np.sum(v * v))  # the step actually taken (rounding)
                fd = (loss(plus) - loss(minus)) / denom
                ad = float(np.sum(g.astype(np.float64) * v))
                assert abs(fd - ad) <= atol + rtol * max(abs(fd), abs(ad)), (
                    f"input {i}: autodiff directional derivative {ad:.6g} vs finite difference {fd:.6g}")
        return grads
    finally:
        prog.close()
