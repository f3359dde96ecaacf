"""Tensor locations and placement enums."""
from __future__ import annotations

import enum

__all__ = ["TensorStorage", "ReplicatedTensorSharding", "TensorLocation", "TileSet", "ExecutionContext"]


class TensorStorage(enum.Enum):
    """Where a tensor is stored: ``OnChip`` or ``OffChip``."""
    OnChip = "OnChip"
    OffChip = "OffChip"


class ReplicatedTensorSharding(enum.Enum):
    """Whether a tensor is sharded over replicas: ``On`` or ``Off``."""
    On = "On"
    Off = "Off"


class TensorLocation:
    """Where a tensor lives (on or off chip) and whether it is sharded over replicas.

    No popxl function takes one; kept for PopXL compatibility.

    Args:
        storage: On or off chip.
        replicated_tensor_sharding: Sharded over replicas or not.
    """

    def __init__(self, storage: TensorStorage = TensorStorage.OnChip,
                 replicated_tensor_sharding: ReplicatedTensorSharding = ReplicatedTensorSharding.Off) -> None:
        self._storage = storage
        self._rts = replicated_tensor_sharding

    @property
    def storage(self) -> TensorStorage:
        """On or off chip."""
        return self._storage

    @property
    def replicated_tensor_sharding(self) -> ReplicatedTensorSharding:
        """Sharded over replicas or not."""
        return self._rts

    def __repr__(self) -> str:
        return f"TensorLocation({self._storage}, {self._rts})"


class TileSet(enum.Enum):
    """The tile set an op runs on: ``Compute``, ``IO`` (or ``Undefined``, ``N``)."""
    Compute = 0
    IO = 1
    Undefined = 2
    N = 3


class ExecutionContext(enum.Enum):
    """The part of the program an op belongs to (only ``Normal`` and ``Subgraph`` are supported)."""
    Normal = 0
    AccumulateOuterFragment = 1
    WeightsFromHostFragment = 2
    WeightsToHostFragment = 3
    OptimizerFromHostFragment = 4
    Subgraph = 5
