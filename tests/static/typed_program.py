"""A short user program that a type checker must accept without complaint (tests/typing checks
it with mypy, and runs it): ops, operators, subgraphs, autodiff, streams and a Session, written
the way PopXL programs are. Every name it uses must be visible to static tools with its real
signature; a false error here means a public signature or return type is wrong."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.transforms.autodiff import GradGraphInfo


class Linear(popxl.Module):
    def __init__(self, features: int) -> None:
        self.features = features

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        self.W = popxl.graph_input((x.shape[-1], self.features), popxl.float32, "W")
        self.b = popxl.graph_input((self.features,), popxl.float32, "b")
        return ops.gelu(x @ self.W + self.b)


def train_step() -> Tuple[np.ndarray, float]:
    ir = popxl.Ir()
    rng = np.random.default_rng(0)
    with ir.main_graph, popxl.in_sequence(True):
        W = popxl.variable(rng.normal(size=(4, 3)).astype(np.float32), name="W")
        b = popxl.variable(np.zeros(3, np.float32), name="b")
        x_stream = popxl.h2d_stream((2, 4), popxl.float32, "x")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        x = ops.host_load(x_stream, "x")

        layer = Linear(3)
        graph = ir.create_graph(layer, x)
        info = ops.call_with_info(graph, x, inputs_dict={layer.W: W, layer.b: b})
        y = info.outputs[0]
        probs = ops.softmax(y, axis=-1)
        loss = ops.mean(ops.sum(probs * probs, axis=[1]))
        ops.host_store(loss_stream, loss)

        grad_info: GradGraphInfo = transforms.autodiff(graph)
        dy = ops.init(y.shape, y.dtype, "dy", "zero") + 1.0
        grad_call = ops.call_with_info(grad_info.graph, dy, inputs_dict=grad_info.inputs_dict(info))
        grads: Tuple[popxl.Tensor, ...] = grad_call.outputs
        by_tensor: Dict[popxl.Tensor, popxl.Tensor] = grad_info.fwd_parent_ins_to_grad_parent_outs(info, grad_call)
        assert by_tensor[W] is grads[1]
        again = ops.call(graph, x, inputs_dict={layer.W: W, layer.b: b})[0]  # autodiff added outputs
        every: Dict[popxl.Graph, GradGraphInfo] = transforms.autodiff(graph, return_all_grad_graphs=True)
        assert graph in every
        _, gW, gb = grads
        ops.scaled_add_(W, gW, b=-0.1)
        ops.var_updates.accumulate_(b, gb, -0.1)

        values, indices = ops.topk(y, 2, axis=-1, largest=True, sorted=True)
        parts: List[popxl.Tensor] = ops.split(values, 2, axis=1)
        _ = ops.cast(indices, popxl.float32) + parts[0] - 2 * parts[1] / 3.0 ** ops.abs(-parts[0])
        _ = ops.reshape(ops.relu(y).T, (-1,))[1:3]
        _ = ops.collectives.replicated_all_reduce(loss + ops.mean(again), op="add")

    x_data = rng.normal(size=(2, 4)).astype(np.float32)
    assert isinstance(x_data, popxl.tensor.host_tensor_types)
    with popxl.Session(ir, "cpu") as session:
        outputs = session.run({x_stream: x_data})
        weights: np.ndarray = session.get_tensor_data(W)
    return weights, float(outputs[loss_stream])


if __name__ == "__main__":
    new_weights, loss_value = train_step()
    print(new_weights.shape, loss_value)
