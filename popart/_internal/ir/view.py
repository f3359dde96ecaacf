"""``view.Region``: which part of a tensor an op reads or writes. popxl tracks whole tensors, so
a region here is all of a tensor or none of it."""
from __future__ import annotations

import operator
from typing import Iterable, Tuple

__all__ = ["Region"]


class Region:
    """All of a tensor of some shape (``getFull``) or none of it (``getEmpty``)."""

    _rank: int
    _full: bool
    _shape: Tuple[int, ...]  # the tensor's shape, for a full region

    def __init__(self) -> None:
        raise TypeError("view.Region is made with Region.getFull(shape) or Region.getEmpty(rank).")

    @classmethod
    def _make(cls, rank: int, full: bool, shape: Tuple[int, ...] = ()) -> "Region":
        r = object.__new__(cls)
        r._rank, r._full, r._shape = rank, full, shape
        return r

    @staticmethod
    def getFull(shape: Iterable[int]) -> "Region":
        dims = tuple(map(operator.index, shape))
        return Region._make(len(dims), True, dims)

    @staticmethod
    def getEmpty(rank: int) -> "Region":
        return Region._make(operator.index(rank), False)

    def isEmpty(self) -> bool:
        # a full region of a tensor with no elements covers nothing either
        return not self._full or any(d == 0 for d in self._shape)

    def rank(self) -> int:
        return self._rank

    def _key(self) -> Tuple[int, object]:
        return (self._rank, None if self.isEmpty() else self._shape)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Region) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return f"[full {list(self._shape)}]" if not self.isEmpty() else f"[empty rank {self._rank}]"

    __repr__ = __str__
