"""popxl-addons' collectives: the tensor-parallel all-reduce (``ReplicatedAllReduceTP``) and the
strided all-reduce, all-gather and reduce-scatter (groups given as a stride and a size).

Each is one op while tracing (so autodiff applies its own rule) and runs as the collective of
``popxl.ops.collectives`` over the same replica groups (``OpDef.expand``; a Session rewrites it).
The all-reduces carry popxl-addons' two flags: ``identical_inputs`` (every member already holds
the sum, so the op passes its input through) and ``identical_grad_inputs`` (every member's
gradient is the same, so the gradient passes through); the gradient of either all-reduce is the
same all-reduce with the two flags swapped. The strided all-gather and reduce-scatter have no
gradient (popxl-addons' ops define none).

As popxl-addons' ops, an all-reduce with ``identical_inputs`` runs only once PopART's
OpToIdentity pattern has made it an identity: ``ir._pb_ir.applyPreAliasPatterns(graph)`` with
patterns of level Default (popxl-addons' ``patterns.apply_pre_alias_patterns(ir)``; its
``autodiff`` does it for the gradient graphs it makes). A Session refuses it before.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

from popxl.context import get_current_context
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.collectives.collectives import _group_size
from popxl.ops.utils import spec
from popxl.replica_grouping import ReplicaGrouping
from popxl.tensor import Tensor

__all__ = ["replicated_all_reduce_tp", "replicated_all_reduce_strided", "replicated_all_gather_strided",
           "replicated_reduce_scatter_strided"]

_FAMILY = "addons"


def reduction(op: object, allowed: Tuple[str, ...], what: str) -> str:
    """A collective reduction given as popxl's name (``"add"``) or PopART's enum
    (``CollectiveOperator.Add``), checked against the ones ``what`` implements."""
    name: Any = getattr(op, "name", op)
    name = {"Add": "add", "Mean": "mean", "Mul": "mul", "Min": "min", "Max": "max", "LogicalAnd": "and",
            "LogicalOr": "or", "SquareAdd": "square_add"}.get(name, name)
    if name not in allowed:
        raise ValueError(f"{what}: the collective operator {op!r} is not implemented; "
                         f"it takes {' or '.join(repr(a) for a in allowed)}.")
    return name


def strided_groups(stride: int, group_size: Optional[int], what: str, ir: Any = None) -> Tuple[int, ...]:
    """The replica -> group assignment of groups ``r, r + stride, ... `` of ``group_size`` replicas
    (default: all replicas) in ``ir`` (default: the Ir being traced)."""
    ir = ir or get_current_context().ir
    size = ir.replication_factor if group_size is None else group_size
    for name, v in (("stride", stride), ("group size", size)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{what}: the {name} must be an int > 0, not {v!r}.")
    try:
        return tuple(ir.replica_grouping(stride, size).assignment)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def groups_of(group: Any, what: str, ir: Any = None) -> Tuple[int, ...]:
    """The replica -> group assignment of a ``popxl.ReplicaGrouping`` (or PopART's view of one;
    None: all replicas) of ``ir`` (default: the Ir being traced)."""
    ir = ir or get_current_context().ir
    group = ir.replica_grouping() if group is None else getattr(group, "_popxl", group)
    if not isinstance(group, ReplicaGrouping):
        raise TypeError(f"{what}: the group must be a popxl.ReplicaGrouping, not {type(group).__name__}.")
    if len(group.assignment) != ir.replication_factor:
        raise ValueError(f"{what}: {group!r} groups {len(group.assignment)} replicas, but the Ir has "
                         f"{ir.replication_factor}.")
    return tuple(group.assignment)


def flag(v: object, name: str, what: str) -> bool:
    if not isinstance(v, (bool, int)):
        raise TypeError(f"{what}: {name} must be a bool, not {v!r}.")
    return bool(v)


# all-reduce (tensor parallel and strided) ---------------------------------------------------------
def _all_reduce_infer(specs, op, groups, identical_inputs, identical_grad_inputs):
    return [spec(specs[0].shape, specs[0].dtype, specs[0].meta_shape)]


def _all_reduce_expand(op):
    x = op.inputs[0]
    if op.attrs["identical_inputs"]:
        return create_op("identity", [x], name="identity")
    return create_op("replicated_all_reduce", [x], {"op": op.attrs["op"], "groups": op.attrs["groups"]},
                     name="replicated_all_reduce")


def _identical_inputs(**attrs: Any) -> bool:
    return bool(attrs["identical_inputs"])


# With identical_inputs the op is an identity, but only PopART's OpToIdentity pattern makes it one:
# popxl-addons' op refuses to be lowered as it is, so a Session refuses it until the pattern ran
# (Ir.applyPreAliasPatterns; popxl-addons' patterns.apply_pre_alias_patterns and autodiff run it).
for _name in ("replicated_all_reduce_tp", "replicated_all_reduce_strided"):
    register(OpDef(_name, _all_reduce_infer, expand=_all_reduce_expand, identity_when=_identical_inputs,
                   family=_FAMILY, attributes={"op": "str", "groups": "ints", "identical_inputs": "bool",
                                               "identical_grad_inputs": "bool"}))


@grad_rule("replicated_all_reduce_tp", "replicated_all_reduce_strided")
def _all_reduce_grad(ctx):
    a = dict(ctx.attrs)
    a["identical_inputs"], a["identical_grad_inputs"] = a["identical_grad_inputs"], a["identical_inputs"]
    return [create_op(ctx.op.type, [ctx.grad(0)], a, name=ctx.op.type)[0]]


def all_reduce_tp_attrs(op: object, group: Any, identical_inputs: bool, identical_grad_inputs: bool,
                        ir: Any = None) -> dict:
    what = "replicated_all_reduce_TP"
    return {"op": reduction(op, ("add",), what), "groups": groups_of(group, what, ir),
            "identical_inputs": flag(identical_inputs, "identical_inputs", what),
            "identical_grad_inputs": flag(identical_grad_inputs, "identical_grad_inputs", what)}


def replicated_all_reduce_tp(t: Tensor, op: object = "add", group=None, identical_inputs: bool = False,
                             identical_grad_inputs: bool = False) -> Tensor:
    """popxl-addons' ``ReplicatedAllReduceTP``: sum ``t`` over the replicas of each group.

    With ``identical_inputs`` the op is an identity (every member already holds the result). Its
    gradient is the same op with the two ``identical`` flags swapped, which gives the two halves
    of a tensor-parallel layer: an identity whose gradient is a sum, and a sum whose gradient (with
    ``identical_grad_inputs``) is an identity. As in popxl-addons, an op with ``identical_inputs``
    must be replaced by PopART's OpToIdentity pattern (``ir._pb_ir.applyPreAliasPatterns``) before
    a Session compiles the program; the Session refuses it otherwise.

    Args:
        t: The tensor summed.
        op: The reduction: only "add" (or PopART's ``CollectiveOperator.Add``).
        group: A ``popxl.ReplicaGrouping`` of the replicas communicating; default all replicas.
        identical_inputs: Every member holds the same ``t`` (the result is then ``t`` itself).
        identical_grad_inputs: Every member gets the same output gradient.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If ``group`` is not a ReplicaGrouping or a flag is not a bool.
        ValueError: If ``op`` is not "add" or ``group`` belongs to another replication factor.
    """
    attrs = all_reduce_tp_attrs(op, group, identical_inputs, identical_grad_inputs)
    return create_op("replicated_all_reduce_tp", [t], attrs, name="replicated_all_reduce_TP")[0]


def all_reduce_strided_attrs(op: object, stride: int, group_size: Optional[int], identical_inputs: bool,
                             identical_grad_inputs: bool, ir: Any = None) -> dict:
    what = "replicated_all_reduce_strided"
    return {"op": reduction(op, ("add", "mean"), what), "groups": strided_groups(stride, group_size, what, ir),
            "identical_inputs": flag(identical_inputs, "identical_inputs", what),
            "identical_grad_inputs": flag(identical_grad_inputs, "identical_grad_inputs", what)}


def replicated_all_reduce_strided(t: Tensor, op: object = "add", stride: int = 1, group_size: Optional[int] = None,
                                  identical_inputs: bool = False, identical_grad_inputs: bool = False) -> Tensor:
    """popxl-addons' ``ReplicatedAllReduceStrided``: reduce ``t`` over strided replica groups.

    Groups are ``group_size`` replicas ``stride`` apart (``r, r + stride, ...``); the gradient is
    the same all-reduce with the ``identical`` flags swapped.

    Args:
        t: The tensor reduced.
        op: The reduction: "add" or "mean" (or PopART's ``CollectiveOperator`` of them).
        stride: The distance between the replicas of a group.
        group_size: The replicas per group; default all replicas.
        identical_inputs: Every member holds the same ``t``.
        identical_grad_inputs: Every member gets the same output gradient.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If a flag is not a bool.
        ValueError: If ``op`` is not "add" or "mean", or ``stride`` / ``group_size`` do not divide
            the replicas into groups.
    """
    attrs = all_reduce_strided_attrs(op, stride, group_size, identical_inputs, identical_grad_inputs)
    return create_op("replicated_all_reduce_strided", [t], attrs, name="replicated_all_reduce_strided")[0]


# all-gather ---------------------------------------------------------------------------------------
def _all_gather_infer(specs, groups):
    s = specs[0]
    return [spec((_group_size(groups) * math.prod(s.shape),), s.dtype)]


def _all_gather_expand(op):
    (y,) = op.outputs
    return create_op("replicated_all_gather", [op.inputs[0]],
                     {"axis": 0, "groups": op.attrs["groups"], "output_shape": "meta_shape", "meta_shape": y.shape},
                     name="replicated_all_gather")


register(OpDef("replicated_all_gather_strided", _all_gather_infer, expand=_all_gather_expand, grad=Grad.STOP,
               family=_FAMILY,
               attributes={"groups": "ints"}))


def replicated_all_gather_strided(t: Tensor, stride: int = 1, group_size: Optional[int] = None) -> Tensor:
    """popxl-addons' ``ReplicatedAllGatherStrided``: every member's ``t``, flattened, in replica order.

    Args:
        t: The tensor gathered.
        stride: The distance between the replicas of a group.
        group_size: The replicas per group; default all replicas.

    Returns:
        A new 1-D tensor of ``group_size`` times ``t``'s number of values, ``t``'s dtype.

    Raises:
        ValueError: If ``stride`` / ``group_size`` do not divide the replicas into groups.
    """
    what = "replicated_all_gather_strided"
    return create_op(what, [t], all_gather_strided_attrs(stride, group_size), name=what)[0]


def all_gather_strided_attrs(stride: int, group_size: Optional[int], ir: Any = None) -> dict:
    return {"groups": strided_groups(stride, group_size, "replicated_all_gather_strided", ir)}


# reduce-scatter ----------------------------------------------------------------------------------
def _reduce_scatter_infer(specs, op, groups, rts):
    s = specs[0]
    n = _group_size(groups)
    return [spec((-(-math.prod(s.shape) // n),), s.dtype, s.shape if rts else ())]


def _reduce_scatter_expand(op):
    return create_op("replicated_reduce_scatter", [op.inputs[0]], dict(op.attrs), name="replicated_reduce_scatter")


register(OpDef("replicated_reduce_scatter_strided", _reduce_scatter_infer, expand=_reduce_scatter_expand,
               grad=Grad.STOP, family=_FAMILY,
               attributes={"op": "str", "groups": "ints", "rts": "bool"}))


def replicated_reduce_scatter_strided(t: Tensor, op: object = "add", stride: int = 1,
                                      group_size: Optional[int] = None, rts: bool = False) -> Tensor:
    """popxl-addons' ``ReplicatedReduceScatterStrided``: reduce ``t`` over the group, keep this member's chunk.

    ``t`` is flattened and zero padded to a multiple of ``group_size`` values; member ``k`` of a
    group keeps chunk ``k`` of the reduction.

    Args:
        t: The tensor reduced.
        op: The reduction: "add", "mean", "mul", "min", "max", "and", "or" or "square_add".
        stride: The distance between the replicas of a group.
        group_size: The replicas per group; default all replicas.
        rts: The result records ``t``'s shape as its meta_shape (replicated tensor sharding).

    Returns:
        A new 1-D tensor of ``ceil(t.nelms / group_size)`` values, ``t``'s dtype.

    Raises:
        TypeError: If ``rts`` is not a bool.
        ValueError: If ``op`` is unknown, or ``stride`` / ``group_size`` do not divide the replicas
            into groups.
    """
    what = "replicated_reduce_scatter_strided"
    return create_op(what, [t], reduce_scatter_strided_attrs(op, stride, group_size, rts), name=what)[0]


def reduce_scatter_strided_attrs(op: object, stride: int, group_size: Optional[int], rts: bool,
                                 ir: Any = None) -> dict:
    what = "replicated_reduce_scatter_strided"
    return {"op": reduction(op, ("add", "mean"), what), "groups": strided_groups(stride, group_size, what, ir),
            "rts": flag(rts, "configure_output_for_replicated_tensor_sharding", what)}
