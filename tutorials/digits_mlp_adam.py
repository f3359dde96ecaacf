"""Tutorial: a custom optimiser. Adam (or AdamW), written as a popxl.Module from var_updates, trains
the MLP of digits_mlp.py.

The Module's graph updates one variable in place: its moment estimates ``m`` and ``v`` and the
step counter are by-reference inputs (state variables of the main graph, passed into the training
step), so the whole update runs on the device with no host round trip.

    python tutorials/digits_mlp_adam.py
"""
from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl.ops import var_updates

try:
    from digits_mlp import report, train
except ImportError:  # imported as tutorials.digits_mlp_adam
    from tutorials.digits_mlp import report, train  # type: ignore[no-redef]


class Adam(popxl.Module):
    """Adam: m <- b1 m + (1-b1) g, v <- b2 v + (1-b2) g^2, w <- w - lr * m^/(sqrt(v^) + eps)
    with bias-corrected m^, v^; with ``weight_decay`` the decoupled (AdamW) term wd * w is added
    to the update."""

    def __init__(self, lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-7,
                 weight_decay: float = 0.0) -> None:
        self.lr, self.beta1, self.beta2, self.eps, self.weight_decay = lr, beta1, beta2, eps, weight_decay
        self._graphs: Dict[Tuple, popxl.Graph] = {}

    def build(self, var: popxl.TensorByRef, grad: popxl.Tensor, m: popxl.TensorByRef, v: popxl.TensorByRef,
              step: popxl.TensorByRef) -> None:
        var_updates.accumulate_moving_average_(m, grad, self.beta1)
        var_updates.accumulate_moving_average_square_(v, grad, self.beta2)
        wd = self.weight_decay or None
        update = var_updates.adam_updater(m, v, weight=var if wd else None, time_step=step, weight_decay=wd,
                                          beta1=self.beta1, beta2=self.beta2, epsilon=self.eps)
        ops.scaled_add_(var, update, b=-self.lr)

    # the optimiser interface train() uses --------------------------------------------------------
    def state(self, var: popxl.Variable) -> List[np.ndarray]:
        zeros = np.zeros(var.shape, np.float32)
        return [zeros, zeros.copy(), np.zeros((), np.float32)]  # m, v, time step

    def update(self, var: popxl.Tensor, grad: popxl.Tensor, m: popxl.Tensor, v: popxl.Tensor,
               step: popxl.Tensor) -> None:
        key = (var.shape, var.dtype)
        if key not in self._graphs:  # one update graph per variable shape, called for each variable
            self._graphs[key] = var.ir.create_graph(self, var.spec, grad.spec, m.spec, v.spec, step.spec)
        ops.call(self._graphs[key], var, grad, m, v, step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    args = parser.parse_args()
    report(train(args.epochs, optimizer=Adam(args.lr, weight_decay=args.weight_decay)))


if __name__ == "__main__":
    main()
