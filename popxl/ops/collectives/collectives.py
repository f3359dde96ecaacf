"""Collectives across replicas (and across IPUs within a replica).

Replicas run in lockstep; a collective op's reference kernel sees every replica's input at once.
Groups come from a ``ReplicaGrouping`` (default: all replicas) and are stored on the op as the
replica -> group assignment. With one replica every collective is a copy.
"""
from __future__ import annotations

import enum
from typing import Dict, List, Literal, Optional, Sequence

import numpy as np

from popxl.context import get_current_context
from popxl.op import Grad, OpDef, create_op, grad_rule, register, user_location
from popxl.ops.utils import convert, normalize_axes, spec
from popxl.replica_grouping import ReplicaGrouping
from popxl.tensor import Tensor

__all__ = ["CollectiveOps", "to_collective_op", "CommGroupType", "CommGroup", "replicated_all_reduce",
           "replicated_all_reduce_", "replicated_reduce_scatter", "replica_sharded_slice", "replicated_slice",
           "replicated_all_gather", "all_reduce", "all_reduce_identical_inputs", "all_reduce_identical_grad_inputs"]

CollectiveOps = Literal["add", "mean", "mul", "min", "max", "and", "or", "square_add"]

_REDUCERS = {
    "add": lambda xs: np.sum(xs, axis=0),
    "mean": lambda xs: np.mean(xs, axis=0),
    "mul": lambda xs: np.prod(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "and": lambda xs: np.all(xs.astype(bool), axis=0),
    "or": lambda xs: np.any(xs.astype(bool), axis=0),
    "square_add": lambda xs: np.sum(xs * xs, axis=0),
}


def to_collective_op(op: CollectiveOps) -> str:
    """Check a collective reduction name.

    PopXL maps "mul" onto a mean; that is a bug, so here "mul" multiplies.

    Args:
        op: The name: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".

    Returns:
        The name, checked.

    Raises:
        ValueError: If the name is not one of the reductions.
    """
    if op not in _REDUCERS:
        raise ValueError(f"Unknown collective op {op!r}; expected one of {sorted(_REDUCERS)}.")
    return op


class CommGroupType(enum.Enum):
    """How a `CommGroup` groups replicas: ``All``, ``Consecutive``, ``Orthogonal`` or ``Ungrouped``."""
    All = "All"
    Consecutive = "Consecutive"
    Orthogonal = "Orthogonal"
    Ungrouped = "Ungrouped"


class CommGroup:
    """A communication group description (type and replica group size), kept for PopXL compatibility; no op takes one.

    Args:
        type: The kind of grouping.
        replicaGroupSize: The number of replicas per group (0 = all).
    """

    def __init__(self, type: CommGroupType = CommGroupType.All, replicaGroupSize: int = 0) -> None:
        self.type = type
        self.replicaGroupSize = replicaGroupSize

    def __repr__(self) -> str:
        return f"CommGroup(type={self.type}, replicaGroupSize={self.replicaGroupSize})"


def _assignment(group) -> tuple:
    """The replica -> group assignment of ``group`` (default: all replicas). Any grouping works,
    constant or not (PopXL's collectives take constant ones only): members of a group meet in
    replica order."""
    ir = get_current_context().ir
    group = ir.replica_grouping() if group is None else group
    if not isinstance(group, ReplicaGrouping):
        raise TypeError(f"collectives: group must be a popxl.ReplicaGrouping (ir.replica_grouping(...)), "
                        f"not {type(group).__name__}.")
    if len(group.assignment) != ir.replication_factor:
        raise ValueError(f"collectives: {group!r} groups {len(group.assignment)} replicas, but the Ir has "
                         f"{ir.replication_factor}.")
    return tuple(int(a) for a in group.assignment)


def _groups(replicas: Sequence[int], assignment: Sequence[int]):
    """Yield lists of positions (into ``replicas``) of the members of each group, in replica order."""
    by_group: Dict[int, List[int]] = {}
    for pos, r in enumerate(replicas):
        by_group.setdefault(assignment[r], []).append(pos)
    for g, members in by_group.items():
        expected = sum(1 for a in assignment if a == g)
        if len(members) != expected:
            raise RuntimeError("a collective ran on only part of its replica group (inside a conditional "
                               "taken differently by different replicas?)")
        yield members


def _per_group(fn):
    """Kernel wrapper: call ``fn(list of group members' inputs, index in group, **attrs)`` per replica."""
    def kernel(per_replica, replicas, groups, **attrs):
        out = [None] * len(replicas)
        for members in _groups(replicas, groups):
            xs = [per_replica[p][0] for p in members]
            for j, p in enumerate(members):
                out[p] = fn(xs, j, **attrs)
        return out
    return kernel


def _group_size(assignment) -> int:
    return sum(1 for a in assignment if a == assignment[0])


# all-reduce ----------------------------------------------------------------------------------------
def _all_reduce_infer(specs, op, groups):
    return [spec(specs[0].shape, specs[0].dtype, specs[0].meta_shape)]


def _all_reduce(xs, j, op):
    return convert(_REDUCERS[op](np.stack(xs)), xs[0].dtype)


register(OpDef("replicated_all_reduce", _all_reduce_infer, _per_group(_all_reduce), collective=True,
               grad=Grad.STOP, family="collectives",
               attributes={"op": "str", "groups": "ints"}))
register(OpDef("replicated_all_reduce_", _all_reduce_infer, _per_group(_all_reduce), collective=True,
               inplace=0, grad=Grad.STOP, family="collectives",
               attributes={"op": "str", "groups": "ints"}))


def replicated_all_reduce(t: Tensor, op: CollectiveOps = "add", group: Optional[ReplicaGrouping] = None) -> Tensor:
    """Reduce a tensor over the replicas of each group; every member gets the result.

    With one replica this is a copy. Not differentiable.

    Args:
        t: The tensor reduced.
        op: The reduction: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".
        group: The replicas communicating; default all replicas (``ir.replica_grouping()``).

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``group`` is not a ReplicaGrouping.
        ValueError: If ``op`` is unknown, or ``t`` is not in the current graph.
    """
    return create_op("replicated_all_reduce", [t], {"op": to_collective_op(op), "groups": _assignment(group)})[0]


def replicated_all_reduce_(t: Tensor, op: CollectiveOps = "add", group: Optional[ReplicaGrouping] = None) -> Tensor:
    """`replicated_all_reduce` in place: ``t`` is overwritten with the reduction.

    Args:
        t: The tensor reduced and overwritten.
        op: The reduction: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".
        group: The replicas communicating; default all replicas (``ir.replica_grouping()``).

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``group`` is not a ReplicaGrouping.
        ValueError: If ``op`` is unknown, or ``t`` is not in the current graph.
    """
    return create_op("replicated_all_reduce_", [t], {"op": to_collective_op(op), "groups": _assignment(group)})[0]


# reduce-scatter / sharded slices -------------------------------------------------------------------
def _shard(x: np.ndarray, j: int, n: int) -> np.ndarray:
    flat = x.reshape(-1)
    size = -(-flat.size // n)
    padded = np.zeros(size * n, x.dtype)
    padded[:flat.size] = flat
    return padded[j * size:(j + 1) * size]


def _reduce_scatter_infer(specs, op, groups, rts):
    s = specs[0]
    n = _group_size(groups)
    nelms = int(np.prod(s.shape, dtype=np.int64))
    return [spec((-(-nelms // n),), s.dtype, s.shape if rts else ())]


register(OpDef("replicated_reduce_scatter", _reduce_scatter_infer,
               _per_group(lambda xs, j, op, rts: _shard(_all_reduce(xs, j, op), j, len(xs))),
               collective=True, grad=Grad.RAISE, family="collectives",
               attributes={"op": "str", "groups": "ints", "rts": "bool"}))


def replicated_reduce_scatter(t: Tensor, op: CollectiveOps = "add", group: Optional[ReplicaGrouping] = None,
                              configure_output_for_replicated_tensor_sharding: bool = False) -> Tensor:
    """Flatten a tensor, reduce it over the group, and keep this member's chunk.

    Member j keeps chunk j of length ``ceil(t.nelms / group_size)`` (zero padded).

    Args:
        t: The tensor reduced.
        op: The reduction: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".
        group: The replicas communicating; default all replicas (``ir.replica_grouping()``).
        configure_output_for_replicated_tensor_sharding: Set the result's meta shape to ``t.shape``
            (a replica-sharded tensor).

    Returns:
        A new 1-D tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``group`` is not a ReplicaGrouping.
        ValueError: If ``op`` is unknown, or ``t`` is not in the current graph.
    """
    return create_op("replicated_reduce_scatter", [t],
                     {"op": to_collective_op(op), "groups": _assignment(group),
                      "rts": bool(configure_output_for_replicated_tensor_sharding)})[0]


def _sharded_slice_infer(specs, groups):
    s = specs[0]
    n = _group_size(groups)
    nelms = int(np.prod(s.shape, dtype=np.int64))
    return [spec((-(-nelms // n),), s.dtype, s.shape)]


register(OpDef("replica_sharded_slice", _sharded_slice_infer,
               _per_group(lambda xs, j: _shard(xs[j], j, len(xs))), collective=True, family="collectives",
               attributes={"groups": "ints"}))


def replica_sharded_slice(t: Tensor, group: Optional[ReplicaGrouping] = None) -> Tensor:
    """This replica's 1-D shard of a tensor (flattened, zero padded), without any reduction.

    Args:
        t: The tensor sharded.
        group: The replicas communicating; default all replicas (``ir.replica_grouping()``).

    Returns:
        A new 1-D tensor whose meta shape is ``t.shape``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``group`` is not a ReplicaGrouping.
        ValueError: If ``t`` is not in the current graph.
    """
    return create_op("replica_sharded_slice", [t], {"groups": _assignment(group)})[0]


@grad_rule("replica_sharded_slice")
def _sharded_slice_grad(ctx):
    x = ctx.op.inputs[0]
    return [create_op("replicated_all_gather", [ctx.grad(0)], {"axis": 0, "groups": ctx.attrs["groups"],
                                                               "output_shape": "meta_shape",
                                                               "meta_shape": tuple(x.shape)})[0]]


def _replicated_slice_infer(specs, axis, groups):
    s = specs[0]
    n = _group_size(groups)
    if s.shape[axis] % n:
        raise ValueError(f"axis {axis} of size {s.shape[axis]} cannot be split equally over {n} replicas")
    shape = list(s.shape)
    shape[axis] //= n
    return [spec(shape, s.dtype)]


register(OpDef("replicated_slice", _replicated_slice_infer,
               _per_group(lambda xs, j, axis: np.split(xs[j], len(xs), axis=axis)[j].copy()),
               collective=True, family="collectives",
               attributes={"axis": "int", "groups": "ints"}))


def replicated_slice(t: Tensor, axis: int = 0, group: Optional[ReplicaGrouping] = None) -> Tensor:
    """This replica's equal slice of a tensor along an axis.

    As in PopXL, a slice of length 1 (an axis as long as the group) loses the axis: (4, 3) sliced
    over 4 replicas gives (3,) on each.

    Args:
        t: The tensor sliced.
        axis: The axis sliced (negative counts from the end).
        group: The replicas communicating; default all replicas (``ir.replica_grouping()``).

    Returns:
        A new tensor, ``t``'s shape with ``axis`` divided by the group size, or without ``axis``
        where that leaves 1.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``group`` is not a ReplicaGrouping.
        ValueError: If the axis length is not divisible by the group size, ``axis`` is out of range,
            or ``t`` is not in the current graph.
    """
    try:
        ax = normalize_axes(t.rank, axis)[0]
    except (ValueError, TypeError) as e:
        raise type(e)(f"ops.collectives.replicated_slice: {e} (tensor {t.id!r} of shape {t.shape}) (at {user_location()})") from None
    y = create_op("replicated_slice", [t], {"axis": ax, "groups": _assignment(group)})[0]
    if y.shape[ax] != 1:
        return y
    return create_op("reshape", [y], {"shape": y.shape[:ax] + y.shape[ax + 1:]})[0]


@grad_rule("replicated_slice")
def _replicated_slice_grad(ctx):
    return [create_op("replicated_all_gather", [ctx.grad(0)], {"axis": ctx.attrs["axis"],
                                                               "groups": ctx.attrs["groups"],
                                                               "output_shape": "concat", "meta_shape": ()})[0]]


# all-gather ----------------------------------------------------------------------------------------
def _all_gather_infer(specs, axis, groups, output_shape, meta_shape):
    s = specs[0]
    n = _group_size(groups)
    if output_shape == "new_axis":
        return [spec((n, *s.shape), s.dtype)]
    if output_shape == "meta_shape":
        shape = tuple(meta_shape) or s.meta_shape
        if not shape:
            raise ValueError("output_shape='meta_shape' needs a tensor with a meta_shape")
        return [spec(shape, s.dtype)]
    if not s.shape:
        raise ValueError("cannot concatenate scalars; use output_shape='new_axis'")
    shape = list(s.shape)
    shape[axis] *= n
    return [spec(shape, s.dtype)]


def _all_gather(xs, j, axis, output_shape, meta_shape):
    if output_shape == "new_axis":
        return np.stack(xs)
    if output_shape == "meta_shape":
        n = int(np.prod(meta_shape, dtype=np.int64))
        return np.concatenate([x.reshape(-1) for x in xs])[:n].reshape(meta_shape)
    return np.concatenate(xs, axis=axis)


register(OpDef("replicated_all_gather", _all_gather_infer,
               _per_group(_all_gather),
               collective=True, family="collectives",
               attributes={"axis": "int", "groups": "ints", "output_shape": "str", "meta_shape": "ints"}))


def replicated_all_gather(t: Tensor, axis: int = 0, group: Optional[ReplicaGrouping] = None,
                          output_shape: Literal["new_axis", "concat", "meta_shape", "auto"] = "auto") -> Tensor:
    """Gather a tensor from every member of the group.

    Args:
        t: The tensor gathered.
        axis: The axis joined along for "concat".
        group: The replicas communicating; default all replicas (``ir.replica_grouping()``).
        output_shape: "new_axis" (a new leading axis), "concat" (along ``axis``), "meta_shape"
            (reassembled to ``t.meta_shape``) or "auto" (meta_shape if ``t`` has one, else concat).

    Returns:
        A new tensor of ``t``'s dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor, or ``group`` is not a ReplicaGrouping.
        ValueError: If ``axis`` is not an int, ``output_shape`` is unknown, or ``t`` is not in the
            current graph.
    """
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise ValueError(f"ops.collectives.replicated_all_gather: axis must be an int, not {axis!r}")
    if output_shape not in ("new_axis", "concat", "meta_shape", "auto"):
        raise ValueError(f"ops.collectives.replicated_all_gather: bad output_shape {output_shape!r}")
    if output_shape == "auto":
        output_shape = "meta_shape" if t.meta_shape else "concat"
    ax = axis % t.rank if t.rank and output_shape == "concat" else axis
    return create_op("replicated_all_gather", [t], {"axis": ax, "groups": _assignment(group),
                                                    "output_shape": output_shape,
                                                    "meta_shape": tuple(t.meta_shape)})[0]


@grad_rule("replicated_all_gather")
def _all_gather_grad(ctx):
    """The local reduce-scatter: each replica keeps the part of its own gradient that its input
    became (gradients are not summed across replicas, as in PopXL)."""
    a, g = ctx.attrs, ctx.grad(0)
    if a["output_shape"] == "new_axis":
        g = g.reshape((g.shape[0] * g.shape[1],) + g.shape[2:]) if g.rank > 1 else g
        part = create_op("replicated_slice", [g], {"axis": 0, "groups": a["groups"]})[0]
        return [part.reshape(ctx.op.inputs[0].shape)]
    if a["output_shape"] == "meta_shape":
        return [create_op("replica_sharded_slice", [g], {"groups": a["groups"]})[0]]
    return [create_op("replicated_slice", [g], {"axis": a["axis"], "groups": a["groups"]})[0]]


# across IPUs within a replica ----------------------------------------------------------------------
def _all_reduce_ipus_infer(specs, op, identity, backward):
    if not specs:
        raise ValueError("needs at least one tensor")
    if len({(s.shape, s.dtype) for s in specs}) > 1:
        raise ValueError("all tensors must have the same shape and dtype")
    return [spec(s.shape, s.dtype) for s in specs]


def _all_reduce_ipus(*xs, op, identity, backward):
    if identity:
        return tuple(x.copy() for x in xs)
    r = convert(_REDUCERS[op](np.stack(xs)), xs[0].dtype)
    return tuple(r.copy() for _ in xs)


register(OpDef("all_reduce", _all_reduce_ipus_infer, _all_reduce_ipus, family="collectives",
               attributes={"op": "str", "identity": "bool", "backward": "str"}))


def _ipu_all_reduce(ts: List[Tensor], ipus: Optional[List[int]], op: CollectiveOps, identity: bool,
                    backward: str = "all_reduce") -> List[Tensor]:
    if ipus is not None and len(ipus) != len(ts):
        raise ValueError(f"ops.collectives.all_reduce: {len(ts)} tensors but {len(ipus)} ipus")
    if op != "add":
        to_collective_op(op)
    return list(create_op("all_reduce", list(ts), {"op": op, "identity": identity, "backward": backward}))


def all_reduce(ts: List[Tensor], ipus: Optional[List[int]] = None, op: CollectiveOps = "add") -> List[Tensor]:
    """Reduce tensors held on different IPUs of one replica; every output is the reduction.

    Args:
        ts: One tensor per IPU, all of one shape and dtype.
        ipus: The IPU of each tensor; inferred from the ops that produced them when None.
        op: The reduction: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".

    Returns:
        One new tensor per input, each on its input's IPU.

    Raises:
        TypeError: If an entry of ``ts`` is not a Tensor.
        ValueError: If ``op`` is unknown, the IPUs cannot be inferred or repeat, or the shapes differ.
    """
    return _ipu_all_reduce(ts, ipus, op, identity=False)


def all_reduce_identical_inputs(ts: List[Tensor], ipus: Optional[List[int]] = None,
                                op: CollectiveOps = "add") -> List[Tensor]:
    """Forward: identity (the inputs are known to be identical). Backward: all-reduce of the gradients.

    Args:
        ts: One tensor per IPU, all of one shape and dtype.
        ipus: The IPU of each tensor; inferred from the ops that produced them when None.
        op: The reduction: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".

    Returns:
        One new tensor per input, each on its input's IPU.

    Raises:
        TypeError: If an entry of ``ts`` is not a Tensor.
        ValueError: If ``op`` is unknown, the IPUs cannot be inferred or repeat, or the shapes differ.
    """
    return _ipu_all_reduce(ts, ipus, op, identity=True)


def all_reduce_identical_grad_inputs(ts: List[Tensor], ipus: Optional[List[int]] = None,
                                     op: CollectiveOps = "add") -> List[Tensor]:
    """Forward: all-reduce. Backward: identity (the gradients are known to be identical).

    Args:
        ts: One tensor per IPU, all of one shape and dtype.
        ipus: The IPU of each tensor; inferred from the ops that produced them when None.
        op: The reduction: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".

    Returns:
        One new tensor per input, each on its input's IPU.

    Raises:
        TypeError: If an entry of ``ts`` is not a Tensor.
        ValueError: If ``op`` is unknown, the IPUs cannot be inferred or repeat, or the shapes differ.
    """
    return _ipu_all_reduce(ts, ipus, op, identity=False, backward="identity")


@grad_rule("all_reduce")
def _all_reduce_grad(ctx):
    """Every output is the sum (or an identical copy) of the inputs, so each input's gradient is
    the sum of the output gradients, unless the op was declared to pass gradients through."""
    if ctx.attrs["op"] != "add":
        raise RuntimeError(f"autodiff: all_reduce with op {ctx.attrs['op']!r} has no gradient (only 'add' has) "
                           f"(created at {ctx.op.location})")
    grads = [ctx.grad_or_zeros(i) for i in range(len(ctx.op.inputs))]
    if ctx.attrs["backward"] == "identity":
        return grads
    return list(create_op("all_reduce", grads, {"op": "add", "identity": False, "backward": "all_reduce"}))
