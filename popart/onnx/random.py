"""ONNX entries of the random number ops (RandomNormal, RandomUniform, their -Like forms,
Bernoulli)."""
from __future__ import annotations

from typing import List

import numpy as np

import popxl
import popxl.ops as ops
from popxl import dtypes
from popart.onnx.elementwise import _cast_to, _less
from popart.onnx.table import Node, Value, _popxl_dtype_of_onnx, onnx_op

__all__: List[str] = []


# random numbers ------------------------------------------------------------------------------------
# Never folded (their results are not known at import). With a `seed` attribute the values are
# the same every run (a constant seed from it, as ONNX Runtime does); without one they come from
# the session's seed (setRandomSeed), fresh each step.
RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli")


def _random_seed(n: Node) -> popxl.Tensor:
    seed = n.attr("seed")
    if seed is not None:
        s = int(np.float64(seed).view(np.uint64))  # every float seed its own stream
        return popxl.constant(np.array([s & 0xFFFFFFFF, s >> 32], np.uint32))
    if n.imp.random is None:
        # the session's seed reaches the top-level graph only
        raise n.fail("a random op without a seed attribute inside an If/Loop/Scan body is not supported; "
                     "give it a seed attribute")
    return n.imp.random.split()


@onnx_op(*RANDOM_OPS, foldable=False)
def _random(n: Node) -> List[Value]:
    like = n.op_type.endswith("Like") or n.op_type == "Bernoulli"
    if like:
        shape = tuple(n.shape(0))
    else:
        given = n.ints("shape")
        if given is None:
            raise n.fail("the shape attribute is required")
        shape = tuple(given)
    code = n.attr("dtype")
    out = _popxl_dtype_of_onnx(code) if code is not None else n.x(0).dtype if like else dtypes.float32
    draw = out if out in (dtypes.float16, dtypes.float32) else dtypes.float32
    seed = _random_seed(n)
    if n.op_type == "Bernoulli":  # 1 with the input's probability: u < p for u uniform in [0, 1)
        p = n.x(0)
        u = ops.random_uniform(seed, shape, 0.0, 1.0, p.dtype if p.dtype == dtypes.float16 else dtypes.float32)
        return [ops.cast(_less(u, _cast_to(n, p, u.dtype)), out)]
    if "Normal" in n.op_type:
        y = ops.random_normal(seed, shape, float(n.attr("mean", 0.0)), float(n.attr("scale", 1.0)), draw)
    else:
        y = ops.random_uniform(seed, shape, float(n.attr("low", 0.0)), float(n.attr("high", 1.0)), draw)
    return [y if draw == out else ops.cast(y, out)]
