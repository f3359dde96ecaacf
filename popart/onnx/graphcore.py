"""Op table entries for PopART's own ONNX domain (``ai.graphcore``): the losses ``Nll``, ``L1``
and ``IdentityLoss`` that ``Builder.aiGraphcore`` and the loss objects add to a model.

They are lowered to popxl ops that have gradient rules, so a TrainingSession differentiates
through them like any other node. They are never folded at import (ONNX's reference evaluator
does not know the domain)."""
from __future__ import annotations

from typing import Dict, List


import popxl
import popxl.ops as ops
from popxl import dtypes
from popxl.ops.negative_log_likelihood import REDUCTION_TYPE
from popart.losses import GRAPHCORE_DOMAIN, ReductionType, reduction_of
from popart.onnx.table import OPS, Entry, Node, Value

__all__: List[str] = []

_POPXL_REDUCTION: Dict[ReductionType, REDUCTION_TYPE] = {ReductionType.Sum: "sum", ReductionType.Mean: "mean", ReductionType.NoReduction: "none"}


def _reduce(x: popxl.Tensor, reduction: ReductionType) -> popxl.Tensor:
    if reduction is ReductionType.NoReduction:
        return x
    axes = list(range(x.rank))
    if not axes:
        return x
    return ops.sum(x, axes) if reduction is ReductionType.Sum else ops.mean(x, axes)


def _reduction(n: Node) -> ReductionType:
    try:
        return reduction_of(int(n.attr("reduction", ReductionType.Mean.value)))
    except Exception as e:
        raise n.fail(str(e)) from None


def _nll(n: Node) -> List[Value]:
    probs, labels = n.x(0), n.x(1)
    if not probs.dtype.is_floating_point:
        raise n.fail(f"the probabilities must be floating point, not {probs.dtype.name}")
    if labels.dtype.is_floating_point:
        raise n.fail(f"the labels must be integers, not {labels.dtype.name}")
    if labels.dtype != dtypes.int32:
        labels = ops.cast(labels, dtypes.int32)
    ignore = n.attr("ignoreIndex", None)
    loss = ops.nll_loss(probs, labels, ignore_index=None if ignore is None else int(ignore),
                        reduction=_POPXL_REDUCTION[_reduction(n)],
                        log_prob=bool(n.attr("inputIsLogProbability", 0)))
    return [loss]


def _l1(n: Node) -> List[Value]:
    x = n.x(0)
    lmbda = float(n.attr("lambda", 1.0))
    return [_reduce(ops.mul(ops.abs(x), n.scalar(lmbda, x)), _reduction(n))]


def _identity_loss(n: Node) -> List[Value]:
    return [_reduce(n.x(0), _reduction(n))]


for _op, _fn in (("Nll", _nll), ("L1", _l1), ("IdentityLoss", _identity_loss)):
    OPS[f"{GRAPHCORE_DOMAIN}.{_op}"] = Entry(_fn, foldable=False)
