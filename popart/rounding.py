"""Stochastic rounding to float16 (``SessionOptions.enableStochasticRounding``), composed from
popxl ops.

A float32 value x lies between two adjacent float16 values lo <= x < lo + q (q the float16
spacing there). Stochastic rounding returns lo + q with probability (x - lo) / q and lo
otherwise, so its expectation is x: updates smaller than half a float16 step still move a
weight on average, where round-to-nearest would lose them.

The spacing comes from the binary exponent e = floor(log2|x|) (corrected where log2 rounds
across a power of two): q = 2^(max(e, -14) - 10), the subnormal spacing below 2^-14. Then
lo = floor(x / q) * q and x / q are exact in float32. Values that overflow float16, NaN and
zero fall back to round-to-nearest (which is exact or the same for them).

For autodiff the result is ``cast(x) + detach(SR(x) - cast(x))``: the value is SR(x) exactly
(the difference of neighbouring float16 values is exact) and the gradient is the cast's.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes

__all__ = ["StochasticRounder"]

_F16_MAX = float(np.finfo(np.float16).max)


# float32 helpers, shared with the ONNX sampling ops (which also compute in float32)
def _c(value: float) -> popxl.Tensor:
    """A float32 scalar constant."""
    return popxl.constant(np.asarray(value, np.float32))


def _f32(t: popxl.Tensor) -> popxl.Tensor:
    return t if t.dtype == dtypes.float32 else ops.cast(t, dtypes.float32)


def _round_f16(x: popxl.Tensor, u: popxl.Tensor) -> popxl.Tensor:
    """SR(x) as float16, for float32 ``x`` and uniform [0, 1) ``u`` of the same shape."""
    ax = ops.abs(x)
    e = ops.floor(ops.log2(ax))
    p = ops.pow(_c(2.0), e)
    # log2 rounds to the nearest float32: just below a power of two it can give the power itself.
    e = ops.where(ops.greater(p, ax), ops.sub(e, _c(1.0)), e)
    p = ops.pow(_c(2.0), e)
    e = ops.where(ops.logical_not(ops.greater(ops.mul(p, _c(2.0)), ax)), ops.add(e, _c(1.0)), e)
    q = ops.pow(_c(2.0), ops.sub(ops.maximum(e, _c(-14.0)), _c(10.0)))
    scaled = ops.div(x, q)
    low = ops.floor(scaled)
    up = ops.cast(ops.greater(ops.sub(scaled, low), u), dtypes.float32)
    sr = ops.cast(ops.mul(ops.add(low, up), q), dtypes.float16)
    nearest = ops.cast(x, dtypes.float16)
    special = ops.logical_or(ops.logical_or(ops.greater(ax, _c(_F16_MAX)), ops.isnan(x)),
                             ops.logical_not(ops.greater(ax, _c(0.0))))
    return ops.where(special, nearest, sr)


class StochasticRounder:
    """Rounds float32 tensors to float16 stochastically in the current graph. Each call draws
    its own random numbers from a fresh split of ``seed`` (uint32[2], a tensor of the current
    graph); ``seed`` then holds the seed for whatever comes next, which the caller stores back
    into the session's seed variable so the next step rounds differently."""

    def __init__(self, seed: popxl.Tensor) -> None:
        self.seed = seed

    def __call__(self, x: popxl.Tensor) -> popxl.Tensor:
        if x.dtype is dtypes.float16:
            return x
        x32 = _f32(x)
        use, self.seed = ops.split_random_seed(self.seed)
        u = ops.random_uniform(use, x32.shape, 0.0, 1.0, dtypes.float32)
        nearest = ops.cast(x32, dtypes.float16)
        return ops.add(nearest, ops.detach(ops.sub(_round_f16(x32, u), nearest)))

    def split(self) -> popxl.Tensor:
        """A seed for another graph (e.g. a called subgraph with its own rounder)."""
        use, self.seed = ops.split_random_seed(self.seed)
        return use


def seed_value(seed: Optional[int]) -> np.ndarray:
    """The uint32[2] seed of an integer (None: a random one)."""
    s = int(np.random.default_rng().integers(0, 2 ** 63)) if seed is None else int(seed)
    return np.array([s & 0xFFFFFFFF, (s >> 32) & 0xFFFFFFFF], np.uint32)
