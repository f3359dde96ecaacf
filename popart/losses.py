"""Losses: ``ReductionType`` and the loss description objects of older PopART programs
(``NllLoss``, ``L1Loss``, ``IdentityLoss``), which a ``TrainingSession`` appends to its model.

A loss is an ONNX node of PopART's own domain (``ai.graphcore``: ``Nll``, ``L1``,
``IdentityLoss``), exactly what ``Builder.aiGraphcore.nllloss`` and friends add, so a loss
object and a Builder loss are imported by the same op table entries.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, Dict, List, Optional, Union

import onnx
from onnx import helper

from popart.errors import popart_exception

__all__ = ["ReductionType", "Loss", "NllLoss", "L1Loss", "IdentityLoss", "GRAPHCORE_DOMAIN", "loss_node"]

GRAPHCORE_DOMAIN = "ai.graphcore"


class ReductionType(Enum):
    """How a loss reduces its per-element values (the attribute value stored in the node)."""
    Sum = 0
    Mean = 1
    NoReduction = 2


def reduction_of(value: Union[ReductionType, int, str]) -> ReductionType:
    """A ``ReductionType`` from the enum, its value or its name (case-insensitive)."""
    if isinstance(value, ReductionType):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return ReductionType(value)
        except ValueError:
            pass
    if isinstance(value, str):
        for r in ReductionType:
            if r.name.lower() == value.lower():
                return r
    raise popart_exception(f"unknown loss reduction {value!r}; use popart.ReductionType.Sum, Mean or NoReduction.")


def loss_node(op_type: str, inputs: List[str], output: str, reduction: Union[ReductionType, int, str],
              name: str = "", **attrs: Any) -> onnx.NodeProto:
    """An ``ai.graphcore`` loss node (attributes as PopART stores them: ``reduction`` as an int)."""
    return helper.make_node(op_type, inputs, [output], name=name or output, domain=GRAPHCORE_DOMAIN,
                            reduction=reduction_of(reduction).value,
                            **{k: v for k, v in attrs.items() if v is not None})


class Loss:
    """A loss of an older PopART program: added to the model by the TrainingSession."""

    def __init__(self, inputs: List[str], output: str, reduction: Union[ReductionType, int, str]) -> None:
        self._inputs = list(inputs)
        self._output = output
        self.reduction = reduction_of(reduction)

    def input(self, i: int) -> str:
        return self._inputs[i]

    def output(self, i: int = 0) -> str:
        return self._output

    def getInputIds(self) -> List[str]:
        return list(self._inputs)

    def node(self) -> onnx.NodeProto:
        # each subclass says which node it is
        raise popart_exception(f"{type(self).__name__} is not a loss popart can build: use NllLoss, L1Loss or "
                               f"IdentityLoss (or builder.aiGraphcore losses).")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inputs} -> {self._output!r}, {self.reduction.name})"


class NllLoss(Loss):
    """Negative log likelihood of ``labels`` under the probabilities ``probs``:
    ``NllLoss(probs, labels, output, reduction=ReductionType.Mean, ignore_index=None)``."""

    def __init__(self, probs: str, labels: str, output: str,
                 reduction: Union[ReductionType, int, str] = ReductionType.Mean,
                 ignore_index: Optional[int] = None, inputIsLogProbability: bool = False) -> None:
        super().__init__([probs, labels], output, reduction)
        self.ignore_index = ignore_index
        self.inputIsLogProbability = bool(inputIsLogProbability)

    def node(self) -> onnx.NodeProto:
        return loss_node("Nll", self._inputs, self._output, self.reduction, ignoreIndex=self.ignore_index,
                         inputIsLogProbability=int(self.inputIsLogProbability))


class L1Loss(Loss):
    """``lambda * |input|`` reduced: ``L1Loss(input, output, lambda, reduction=ReductionType.Mean)``."""

    def __init__(self, input: str, output: str, lmbda: float,
                 reduction: Union[ReductionType, int, str] = ReductionType.Mean) -> None:
        super().__init__([input], output, reduction)
        self.lmbda = float(lmbda)

    def node(self) -> onnx.NodeProto:
        # ``lambda`` (a Python keyword) comes in a ** dict, so ``name`` goes by position.
        return loss_node("L1", self._inputs, self._output, self.reduction, "", **{"lambda": self.lmbda})


class IdentityLoss(Loss):
    """The input itself as the loss (reduced): ``IdentityLoss(input, output, reduction=ReductionType.Mean)``."""

    def __init__(self, input: str, output: str,
                 reduction: Union[ReductionType, int, str] = ReductionType.Mean) -> None:
        super().__init__([input], output, reduction)

    def node(self) -> onnx.NodeProto:
        return loss_node("IdentityLoss", self._inputs, self._output, self.reduction)


def loss_attrs(node: onnx.NodeProto) -> Dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}
