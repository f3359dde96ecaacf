"""popxl-addons' sharded cross entropies: ``cross_entropy_sharded`` (the classes split over the
replicas of a group: tensor parallelism) and ``cross_entropy_sharded_wr`` (split over tensors
within one replica, popxl-addons' "within replica" op).

Both output the unreduced loss per sample (equal on every shard) and each shard's negative log
softmax, ``nls = log(sum_all exp(x - m)) + m - x`` with ``m`` the row maximum over all shards.
The gradient of the logits is local to each shard: ``dlogits = dloss * exp(-nls) - dloss *
onehot(label)`` (the label's column only where it falls in the shard). Indices of the sharded op
are already shifted by the caller to the shard's class range (out-of-range ones contribute 0 to
the loss and nothing to the gradient); the within-replica op shifts them itself.

The ops run as three local kernels (native ones in native/src/kernels/addons.cpp; pieces that only
a Session's expansion and the gradient rules create, with no gradient of their own), with the row
maxima, the softmax denominators and the picked losses combined by ``replicated_all_reduce`` over
the group (sharded op) or by elementwise maximum and sums (within-replica op).
"""
from __future__ import annotations

import itertools
from typing import List, Sequence, Tuple

import numpy as np

from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.addons.collectives import groups_of
from popxl.ops.elementwise import add, maximum, sub
from popxl.ops.reduce import max as reduce_max
from popxl.ops.utils import spec
from popxl.tensor import Tensor, constant

__all__ = ["cross_entropy_sharded", "cross_entropy_sharded_wr"]

_FAMILY = "addons"


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """float16 values are summed in float32 (as Poplar's reductions do); others in their own type."""
    return np.dtype(np.float32) if dt == np.float16 else dt


def _check_logits(s, what: str, name: str = "logits") -> None:
    if len(s.shape) != 2:
        raise ValueError(f"{what}: {name} must have rank 2, (n_samples, n_classes), not shape {s.shape}")
    if not s.dtype.is_floating_point:
        raise TypeError(f"{what}: {name} must be float16 or float32, not {s.dtype.name}")


def _check_indices(s, n: int, what: str, name: str = "indices") -> None:
    if len(s.shape) != 1 or s.shape[0] != n:
        raise ValueError(f"{what}: {name} must have shape ({n},), one per sample, not {s.shape}")
    if not s.dtype.is_int:
        raise TypeError(f"{what}: {name} must be integers, not {s.dtype.name}")


def _check_rows(s, ref, what: str, name: str) -> None:
    if tuple(s.shape) != (ref.shape[0],) or s.dtype != ref.dtype:
        raise ValueError(f"{what}: {name} must be ({ref.shape[0]},) {ref.dtype.name}, not {s.shape} {s.dtype.name}")


# local kernels --------------------------------------------------------------------------------------
def _denominator_infer(specs):
    logits, row_max = specs
    _check_logits(logits, "cross_entropy_sharded_denominator")
    _check_rows(row_max, logits, "cross_entropy_sharded_denominator", "row maxima")
    return [spec((logits.shape[0],), logits.dtype)]


def _denominator(x, m):
    """sum_j exp(x_ij - m_i) of this shard: the differences and exponentials in x's type, the sum
    in float32 for float16."""
    e = np.exp(x - m[:, None])
    return e.sum(axis=1, dtype=_compute_dtype(x.dtype)).astype(x.dtype)


register(OpDef("cross_entropy_sharded_denominator", _denominator_infer, _denominator, grad=Grad.RAISE, family=_FAMILY,
               attributes={}))


def _nll_infer(specs):
    logits, row_max, denominator, indices = specs
    what = "cross_entropy_sharded_nll"
    _check_logits(logits, what)
    _check_rows(row_max, logits, what, "row maxima")
    _check_rows(denominator, logits, what, "denominators")
    _check_indices(indices, logits.shape[0], what)
    return [spec(logits.shape, logits.dtype), spec((logits.shape[0],), logits.dtype)]


def _picked(values, indices):
    """values[i, indices[i]] where the index lies in the row, else 0."""
    n, c = values.shape
    idx = indices.astype(np.int64)
    inside = (idx >= 0) & (idx < c)
    out = np.zeros(n, values.dtype)
    rows = np.nonzero(inside)[0]
    out[rows] = values[rows, idx[rows]]
    return out, rows, idx


def _nll(x, m, d, indices):
    """(negative log softmax of the shard, the loss of the samples whose label is in the shard)."""
    nls = -((x - m[:, None]) - np.log(d)[:, None])
    return nls, _picked(nls, indices)[0]


register(OpDef("cross_entropy_sharded_nll", _nll_infer, _nll, grad=Grad.RAISE, family=_FAMILY,
               attributes={}))


def _grad_infer(specs):
    dloss, nls, indices = specs
    what = "cross_entropy_sharded_grad"
    _check_logits(nls, what, "nls")
    _check_rows(dloss, nls, what, "the loss gradient")
    _check_indices(indices, nls.shape[0], what)
    return [spec(nls.shape, nls.dtype)]


def _grad(dloss, nls, indices):
    g = np.exp(-nls) * dloss[:, None]
    _, rows, idx = _picked(g, indices)
    g[rows, idx[rows]] -= dloss[rows]
    return g


register(OpDef("cross_entropy_sharded_grad", _grad_infer, _grad, grad=Grad.RAISE, family=_FAMILY,
               attributes={}))


def _shard_losses(logits: Sequence[Tensor], indices: Sequence[Tensor], max_of, sum_of) -> Tuple[Tensor, List[Tensor]]:
    """The loss and each shard's nls, the shards' row maxima combined by ``max_of`` and their
    denominators and picked losses by ``sum_of``."""
    m = max_of([reduce_max(x, axis=1) for x in logits])
    d = sum_of([create_op("cross_entropy_sharded_denominator", [x, m])[0] for x in logits])
    nls, picked = zip(*(create_op("cross_entropy_sharded_nll", [x, m, d, i]) for x, i in zip(logits, indices)))
    return sum_of(list(picked)), list(nls)


# across replicas ------------------------------------------------------------------------------------
def _sharded_infer(specs, groups, available_memory_proportion):
    logits, indices = specs
    what = "cross_entropy_sharded"
    _check_logits(logits, what)
    _check_indices(indices, logits.shape[0], what)
    return [spec((logits.shape[0],), logits.dtype), spec(logits.shape, logits.dtype)]


def _sharded_expand(op):
    groups = op.attrs["groups"]

    def all_reduce(how):
        return lambda ts: create_op("replicated_all_reduce", ts, {"op": how, "groups": groups})[0]

    loss, (nls,) = _shard_losses([op.inputs[0]], [op.inputs[1]], all_reduce("max"), all_reduce("add"))
    return [loss, nls]


register(OpDef("cross_entropy_sharded", _sharded_infer, expand=_sharded_expand, family=_FAMILY,
               attributes={"groups": "ints", "available_memory_proportion": "float"}))


@grad_rule("cross_entropy_sharded")
def _sharded_grad(ctx):
    dloss = ctx.grad_or_zeros(0)
    return [create_op("cross_entropy_sharded_grad", [dloss, ctx.output(1), ctx.input(1)])[0], None]


def cross_entropy_sharded(logits: Tensor, indices: Tensor, group=None,
                          available_memory_proportion: float = 0.4) -> Tuple[Tensor, Tensor]:
    """popxl-addons' ``CrossEntropySharded``: the cross entropy of logits sharded over replicas.

    The classes are split over the replicas of ``group`` in replica order; the loss is the same
    on every member. Its gradient flows to ``logits`` (each member its own shard).

    Args:
        logits: (n, classes of this shard), float16 or float32.
        indices: (n,) integer labels, the same on every member but shifted to this shard's class
            range (labels outside it pick nothing here).
        group: A ``popxl.ReplicaGrouping`` of the replicas sharing the classes; default all.
        available_memory_proportion: A planning hint for IPU memory; recorded only.

    Returns:
        (loss (n,), this shard's negative log softmax (n, shard classes)), in ``logits``' dtype.

    Raises:
        TypeError: If ``logits`` is not float16 / float32 or ``indices`` not integer, or ``group``
            is not a ReplicaGrouping.
        ValueError: If the shapes do not match.
    """
    attrs = {"groups": groups_of(group, "cross_entropy_sharded"), "available_memory_proportion": float(available_memory_proportion)}
    loss, nls = create_op("cross_entropy_sharded", [logits, indices], attrs)
    return loss, nls


# within a replica ----------------------------------------------------------------------------------
def _wr_infer(specs, ipus):
    what = "cross_entropy_sharded_wr"
    k = len(ipus)
    if k == 0 or len(specs) != 2 * k:
        raise ValueError(f"{what}: needs as many logits as indices, one pair per shard ({len(ipus)} ipus), "
                         f"got {len(specs)} inputs")
    logits, indices = specs[:k], specs[k:]
    n = logits[0].shape[0] if len(logits[0].shape) == 2 else None
    for i, (s, t) in enumerate(zip(logits, indices)):
        _check_logits(s, what, f"logits {i}")
        if s.shape[0] != n or s.dtype != logits[0].dtype:
            raise ValueError(f"{what}: every logits tensor must be ({n}, classes) {logits[0].dtype.name}; "
                             f"logits {i} is {s.shape} {s.dtype.name}")
        _check_indices(t, n, what, f"indices {i}")
    return [spec((n,), logits[0].dtype)] + [spec(s.shape, s.dtype) for s in logits]


def _shifted(indices: Sequence[Tensor], logits: Sequence[Tensor]) -> List[Tensor]:
    """Each shard's labels shifted to its class range (the shards' classes follow one another)."""
    starts = itertools.accumulate([0] + [x.shape[1] for x in logits[:-1]])
    return [i if start == 0 else sub(i, constant(np.array(start, i.dtype.as_numpy()), i.dtype))
            for i, start in zip(indices, starts)]


def _add_all(ts: List[Tensor]) -> Tensor:
    total = ts[0]
    for t in ts[1:]:
        total = add(total, t)
    return total


def _wr_expand(op):
    k = len(op.attrs["ipus"])
    logits = list(op.inputs[:k])
    loss, nls = _shard_losses(logits, _shifted(op.inputs[k:], logits),
                              lambda ts: ts[0] if len(ts) == 1 else maximum(*ts), _add_all)
    return [loss, *nls]


register(OpDef("cross_entropy_sharded_wr", _wr_infer, expand=_wr_expand, family=_FAMILY,
               attributes={"ipus": "ints"}))


@grad_rule("cross_entropy_sharded_wr")
def _wr_grad(ctx):
    k = len(ctx.attrs["ipus"])
    dloss = ctx.grad_or_zeros(0)
    logits = [ctx.input(i) for i in range(k)]
    labels = _shifted([ctx.input(k + i) for i in range(k)], logits)
    grads = [create_op("cross_entropy_sharded_grad", [dloss, ctx.output(1 + i), labels[i]])[0] for i in range(k)]
    return grads + [None] * k


def cross_entropy_sharded_wr(logits: Sequence[Tensor], indices: Sequence[Tensor],
                             ipus: Sequence[int] = ()) -> Tuple[Tensor, List[Tensor]]:
    """popxl-addons' within-replica sharded cross entropy: the classes split over tensors of one replica.

    Args:
        logits: One (n, classes of shard i) tensor per shard, the shards' classes in order.
        indices: One (n,) integer tensor of labels over all classes per shard (the op shifts them
            to each shard's range).
        ipus: The IPU of each shard (default 0, 1, ...); recorded only.

    Returns:
        (loss (n,), the list of each shard's negative log softmax), in the logits' dtype.

    Raises:
        TypeError: If the logits are not float16 / float32 or the labels not integer.
        ValueError: If there are not as many labels as logits, or the shapes do not match.
    """
    logits, indices = list(logits), list(indices)
    ipus = tuple(int(i) for i in ipus) if ipus else tuple(range(len(logits)))
    loss, *nls = create_op("cross_entropy_sharded_wr", logits + indices, {"ipus": ipus})
    return loss, nls

