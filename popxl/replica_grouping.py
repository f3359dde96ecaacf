"""Replica groupings: which replicas share a variable's value, and which communicate."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

from popxl import _pb

__all__ = ["ReplicaGrouping"]


def _members_by_group(assignment: Sequence[int]) -> Dict[int, List[int]]:
    out: Dict[int, List[int]] = {}
    for r, g in enumerate(assignment):
        out.setdefault(g, []).append(r)
    return out


class ReplicaGrouping:
    """A partition of the Ir's replicas into equal groups. Made by ``ir.replica_grouping(stride,
    group_size)`` or ``ir.replica_grouping_from_assignments(assignment)``.

    Group i starts at the lowest replica not yet in a group, ``o``, and takes
    ``o, o + stride, ..., o + (group_size - 1) * stride``.

    Raises:
        RuntimeError: If constructed directly.
    """

    __hash__ = None  # type: ignore[assignment]  # unhashable, as in PopXL

    _ir: Any
    _assignment: List[int]
    _stride: Optional[int]
    _group_size: int

    def __init__(self) -> None:
        raise RuntimeError("ReplicaGrouping cannot be constructed directly: use ir.replica_grouping(...).")

    @classmethod
    def _make(cls, ir: Any, assignment: List[int], stride: Optional[int], group_size: int) -> "ReplicaGrouping":
        g = object.__new__(cls)
        g._ir = ir
        g._assignment = list(assignment)
        g._stride = stride
        g._group_size = group_size
        return g

    @staticmethod
    def _assign(R: int, stride: int, group_size: int) -> Optional[List[int]]:
        assignment: List[Optional[int]] = [None] * R
        for gi in range(R // group_size):
            o = assignment.index(None)
            for k in range(group_size):
                r = o + k * stride
                if r >= R or assignment[r] is not None:
                    return None
                assignment[r] = gi
        return assignment  # type: ignore[return-value]

    @classmethod
    def _from_params(cls, ir: Any, stride: int = 1, group_size: Optional[int] = None) -> "ReplicaGrouping":
        R = ir.replication_factor
        if not isinstance(stride, int) or not 0 < stride <= R or R % stride:
            raise ValueError(f"replica_grouping: stride must divide the replication factor {R} "
                             f"(0 < stride <= {R}), got {stride!r}.")
        if group_size is None:
            group_size = R // stride
        if not isinstance(group_size, int) or not 0 < group_size <= R or R % group_size:
            raise ValueError(f"replica_grouping: group_size must divide the replication factor {R}, "
                             f"got {group_size!r}.")
        if group_size == 1:
            stride = 1
        assignment = cls._assign(R, stride, group_size)
        if assignment is None:
            raise ValueError(f"replica_grouping(stride={stride}, group_size={group_size}) does not partition "
                             f"{R} replicas into equal groups.")
        return cls._make(ir, assignment, stride, group_size)

    @classmethod
    def _from_assignments(cls, ir: Any, assignment: List[int]) -> "ReplicaGrouping":
        R = ir.replication_factor
        assignment = [int(a) for a in assignment]
        if len(assignment) != R:
            raise ValueError(f"replica_grouping_from_assignments: {len(assignment)} entries for {R} replicas.")
        order = list(dict.fromkeys(assignment))
        if order != list(range(len(order))):
            raise ValueError("replica_grouping_from_assignments: group ids must be 0..k-1 in order of first "
                             f"appearance, got {assignment}.")
        sizes = {assignment.count(g) for g in order}
        if len(sizes) != 1:
            raise ValueError(f"replica_grouping_from_assignments: groups must have equal sizes, got {assignment}.")
        group_size = sizes.pop()
        members = [r for r, a in enumerate(assignment) if a == 0]
        stride = members[1] - members[0] if len(members) > 1 else 1
        if cls._assign(R, stride, group_size) == assignment:
            return cls._make(ir, assignment, stride, group_size)
        return cls._make(ir, assignment, None, group_size)

    # properties -------------------------------------------------------------------------------------
    @property
    def _pb_replica_grouping(self) -> Any:
        """This grouping as PopART's internal IR shows it (what custom ops' bindings take)."""
        return _pb.replica_grouping_view(self)

    @property
    def is_const(self) -> bool:
        """True if the grouping is described by a stride and a group size."""
        return self._stride is not None

    @property
    def const_rg(self) -> "ReplicaGrouping":
        """A constant grouping whose groups each lie within one group of this one: this grouping
        itself if it is constant. For a non-constant grouping, PopXL's choice: with ``s`` the
        smallest distance between consecutive members of a group, every group is cut where its
        members are further apart than ``s``; the result has stride ``s`` and, as group size, the
        greatest common divisor of the pieces' sizes (each replica alone if that is 1)."""
        if self.is_const:
            return self
        if not hasattr(self, "_const_rg"):
            self._const_rg = self._refining_const_grouping()
        return self._const_rg

    def _refining_const_grouping(self) -> "ReplicaGrouping":
        members = list(self._members().values())
        gaps = [b - a for group in members for a, b in zip(group, group[1:])]
        step = min(gaps) if gaps else 1
        pieces = []
        for group in members:
            pieces.append(1)
            for a, b in zip(group, group[1:]):
                if b - a > step:
                    pieces.append(0)
                pieces[-1] += 1
        size = math.gcd(*pieces)
        stride = step if size > 1 else 1
        R = len(self._assignment)
        assignment = self._assign(R, stride, size) if R % size == 0 else None
        if assignment is None or any(len({self._assignment[r] for r in grp}) > 1
                                     for grp in _members_by_group(assignment).values()):
            return ReplicaGrouping._make(self._ir, list(range(R)), 1, 1)  # each replica alone always fits
        return ReplicaGrouping._make(self._ir, assignment, stride, size)

    @property
    def to_device_map(self) -> Optional[List[int]]:
        """For each group of ``const_rg``, the group of this grouping it lies in (None when this
        grouping is constant): how per-group host data expands to ``const_rg``'s groups."""
        if self.is_const:
            return None
        const = self.const_rg._assignment
        out: Dict[int, int] = {}
        for r, g in enumerate(const):
            out.setdefault(g, self._assignment[r])
        return [out[g] for g in range(len(out))]

    @property
    def to_host_map(self) -> Optional[List[int]]:
        """For each group of this grouping, the first group of ``const_rg`` in it (None when this
        grouping is constant): where a group's value is read back from."""
        if self.is_const:
            return None
        const = self.const_rg._assignment
        out: Dict[int, int] = {}
        for r, g in enumerate(self._assignment):
            out.setdefault(g, const[r])
        return [out[g] for g in range(len(out))]

    @property
    def stride(self) -> int:
        """The distance between consecutive members of a group."""
        if self._stride is None:
            raise NotImplementedError("This ReplicaGrouping has no constant stride (it was made from irregular "
                                      "assignments); use const_rg for a constant grouping within it.")
        return self._stride

    @property
    def group_size(self) -> int:
        """The number of replicas per group."""
        return self._group_size

    @property
    def num_groups(self) -> int:
        """The number of groups."""
        return len(self._assignment) // self._group_size

    @property
    def assignment(self) -> List[int]:
        """Group index of each replica."""
        return list(self._assignment)

    def _members(self) -> Dict[int, List[int]]:
        """For each group, its replicas in order."""
        return _members_by_group(self._assignment)

    def transpose(self) -> "ReplicaGrouping":
        """The grouping whose group j holds the j-th member of every group of this one."""
        new = [0] * len(self._assignment)
        for members in self._members().values():
            for j, r in enumerate(members):
                new[r] = j
        return ReplicaGrouping._from_assignments(self._ir, new)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, ReplicaGrouping):
            raise TypeError(f"Cannot compare a ReplicaGrouping with {type(other).__name__}.")
        return self._ir is other._ir and self._assignment == other._assignment

    def __repr__(self) -> str:
        if self.is_const:
            return (f"ReplicaGrouping(num_replicas={len(self._assignment)}, stride={self._stride}, "
                    f"group_size={self._group_size})")
        return f"ReplicaGrouping(assignment={self._assignment})"
