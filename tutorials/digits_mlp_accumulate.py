"""Tutorial: gradient accumulation. Each optimiser step averages the gradients of several
micro-batches before updating, as if the batch were that many times larger.

The micro-batch graph accumulates each gradient into an accumulator variable with
``var_updates.accumulate_(acc, grad, 1/N)``; the step graph repeats it N times on the device,
applies the optimiser to the accumulated gradients, then clears them with
``var_updates.accumulator_zero_``. See ``build_training_ir`` in digits_mlp.py.

    python tutorials/digits_mlp_accumulate.py --accumulate 4
"""
from __future__ import annotations

import argparse

try:
    from digits_mlp import SGD, report, train
except ImportError:  # imported as tutorials.digits_mlp_accumulate
    from tutorials.digits_mlp import SGD, report, train  # type: ignore[no-redef]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    report(train(args.epochs, batch=args.micro_batch, steps_per_run=10, optimizer=SGD(args.lr),
                 accumulate=args.accumulate))


if __name__ == "__main__":
    main()
