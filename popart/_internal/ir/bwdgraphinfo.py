"""How a gradient graph connects to its forward graph, in PopART's terms: plain records of tensor
ids (popxl's `GradGraphInfo._from_pb` turns them into popxl objects)."""
from __future__ import annotations

from enum import Enum
from typing import Any, Iterable, List

__all__ = ["ExpectedConnectionType", "ExpectedConnection", "BwdGraphInfo"]


class ExpectedConnectionType(Enum):
    """Whether a gradient-graph input or output is a forward tensor or the gradient of one."""
    Fwd = 0
    FwdGrad = 1


class ExpectedConnection:
    """One gradient-graph input or output: ``fwdId``, the id of a forward-graph tensor, and
    ``type``, whether the value is that tensor (Fwd) or its gradient (FwdGrad)."""

    def __init__(self, fwdId: Any, type: ExpectedConnectionType) -> None:
        if not isinstance(type, ExpectedConnectionType):
            raise TypeError(f"ExpectedConnection: type must be an ExpectedConnectionType, not {type!r}.")
        self.fwdId = _tensor_id(fwdId, "ExpectedConnection")
        self.type = type

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ExpectedConnection) and (self.fwdId, self.type) == (other.fwdId, other.type)

    def __hash__(self) -> int:
        return hash((self.fwdId, self.type))

    def __repr__(self) -> str:
        return f"ExpectedConnection({self.fwdId!r}, {self.type.name})"


class BwdGraphInfo:
    """A gradient graph's id and the forward tensors its inputs and outputs are connected to."""

    def __init__(self, bwdGraphId: Any, expectedInputs: Iterable[ExpectedConnection],
                 expectedOutputs: Iterable[ExpectedConnection]) -> None:
        from popart._internal.ir.graph import GraphId
        self.bwdGraphId = GraphId(bwdGraphId)
        self.expectedInputs: List[ExpectedConnection] = _connections(expectedInputs, "expectedInputs")
        self.expectedOutputs: List[ExpectedConnection] = _connections(expectedOutputs, "expectedOutputs")

    def __repr__(self) -> str:
        return (f"BwdGraphInfo({self.bwdGraphId!r}, expectedInputs={self.expectedInputs}, "
                f"expectedOutputs={self.expectedOutputs})")


def _tensor_id(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: a tensor id must be a str, not {type(value).__name__} ({value!r}).")
    return value


def _connections(items: Iterable[ExpectedConnection], what: str) -> List[ExpectedConnection]:
    items = list(items)
    for c in items:
        if not isinstance(c, ExpectedConnection):
            raise TypeError(f"BwdGraphInfo: {what} must hold ExpectedConnection objects, not {c!r}.")
    return items
