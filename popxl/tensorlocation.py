"""Tensor locations and placement enums."""
from __future__ import annotations

import enum

__all__ = ["TensorStorage", "ReplicatedTensorSharding", "TensorLocation", "TileSet", "ExecutionContext"]


class TensorStorage(enum.Enum):
    OnChip = "OnChip"
    OffChip = "OffChip"


class ReplicatedTensorSharding(enum.Enum):
    On = "On"
    Off = "Off"


class TensorLocation:
    """Where a tensor lives (on or off chip) and whether it is sharded over replicas."""

    def __init__(self, storage: TensorStorage = TensorStorage.OnChip,
                 replicated_tensor_sharding: ReplicatedTensorSharding = ReplicatedTensorSharding.Off) -> None:
        self._storage = storage
        self._rts = replicated_tensor_sharding

    @property
    def storage(self) -> TensorStorage:
        return self._storage

    @property
    def replicated_tensor_sharding(self) -> ReplicatedTensorSharding:
        return self._rts

    def __repr__(self) -> str:
        return f"TensorLocation({self._storage}, {self._rts})"


class TileSet(enum.Enum):
    Compute = 0
    IO = 1
    Undefined = 2
    N = 3


class ExecutionContext(enum.Enum):
    Normal = 0
    AccumulateOuterFragment = 1
    WeightsFromHostFragment = 2
    WeightsToHostFragment = 3
    OptimizerFromHostFragment = 4
    Subgraph = 5
