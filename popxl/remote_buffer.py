"""Remote memory: `RemoteBuffer`, the remote-variable factories, and the Session's remote sync.

A remote buffer is ``entries`` slots of one tensor shape and dtype, per replica, outside the
on-chip memory of a program (PopXL's "Streaming Memory"). Ops move tensors in and out of slots
(``ops.remote_load`` / ``ops.remote_store``). On the CPU each buffer is a persistent arena
region of shape ``(entries, *tensor_shape)`` per replica, kept across runs like a variable;
lowering hands that region to the remote ops as an extra input, so their kernels are plain
NumPy slicing.

Remote variables have no on-chip storage: their value lives in slot ``offset`` of their buffer,
and the Session moves it between the host and that slot. A replica-sharded (RTS) variable keeps
one 1-D shard per replica in its slot: the flattened value, zero padded to the shard count times
the slot size, split into slot-sized chunks (a slot is normally ``ceil(nelms / shards)`` long). Within each replica group, the members (in replica order)
are split into consecutive sub-groups of ``shards`` replicas; member ``j`` of a sub-group holds
chunk ``j``, so every sub-group holds a whole copy.
"""
from __future__ import annotations

import builtins
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Literal, Optional, Tuple, Union

import numpy as np

from popxl import dtypes
from popxl.context import get_current_context
from popxl.tensor import (HostScalarTensor, Tensor, TensorSpec, Variable, _create_variable, _host_data)

if TYPE_CHECKING:  # pragma: no cover
    from popxl.ir import Ir
    from popxl.replica_grouping import ReplicaGrouping

__all__ = ["RemoteBuffer", "remote_buffer", "remote_variable", "remote_replica_sharded_variable",
           "replica_sharded_buffer", "replica_sharded_variable"]


RetrievalMode = Optional[Literal["one_per_group", "all_replicas"]]


def _buffers_of(ir: "Ir") -> List["RemoteBuffer"]:
    """The remote buffers of ``ir`` in creation order (ids 1, 2, ...)."""
    if not hasattr(ir, "_remote_buffers"):
        ir._remote_buffers = []
    return ir._remote_buffers


def _shape(value: Iterable[int], what: str) -> Tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in value)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, not {value!r}.") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"{what} {shape} has a negative dimension.")
    return shape


def _check_entries(entries: Any) -> int:
    if not isinstance(entries, (int, np.integer)) or isinstance(entries, builtins.bool) or entries < 1:
        raise ValueError(f"Entries must be a non-zero, positive integer (RemoteBuffer slots), not {entries!r}.")
    return int(entries)


def _read_only(name: str) -> None:
    # The words of Python's own error for a property without a setter (as PopXL's tests expect them).
    raise AttributeError(f"can't set attribute '{name}'")


class RemoteBuffer:
    """``entries`` slots of ``tensor_shape`` / ``tensor_dtype`` in remote memory, per replica.

    Created in the Ir of the current graph (needs ``with ir.main_graph:`` or another graph).

    Args:
        tensor_shape: The shape of one slot.
        tensor_dtype: The dtype of one slot.
        entries: The number of slots.

    Raises:
        ValueError: If ``entries`` is below 1.
        RuntimeError: If no graph is entered.
    """

    def __init__(self, tensor_shape: Tuple[int, ...], tensor_dtype: dtypes.dtype, entries: int) -> None:
        ir = get_current_context().ir  # RuntimeError outside a graph context, as every factory
        ir._check_mutable()
        self._ir = ir
        self.set_remote_buffer_info(tensor_dtype, tensor_shape, entries)
        self._meta_shape: Tuple[int, ...] = ()
        self._shard_over: Optional[int] = None  # set by replica_sharded_buffer
        buffers = _buffers_of(ir)
        buffers.append(self)
        self._remote_buffer_id = len(buffers)

    # properties -----------------------------------------------------------------------------------
    @property
    def remote_buffer_id(self) -> int:
        """The buffer's number in its Ir (1, 2, ...)."""
        return self._remote_buffer_id

    @property
    def _current_ir(self) -> "Ir":
        """The Ir the buffer belongs to (PopXL's name for it)."""
        return self._ir

    @property
    def tensor_shape(self) -> Tuple[int, ...]:
        """The shape of one slot."""
        return self._tensor_shape

    @tensor_shape.setter
    def tensor_shape(self, value: Any) -> None:
        _read_only("tensor_shape")

    @property
    def tensor_dtype(self) -> dtypes.dtype:
        """The dtype of one slot."""
        return self._tensor_dtype

    @tensor_dtype.setter
    def tensor_dtype(self, value: Any) -> None:
        _read_only("tensor_dtype")

    @property
    def entries(self) -> int:
        """The number of slots."""
        return self._entries

    @entries.setter
    def entries(self, value: int) -> None:
        self._ir._check_mutable()
        self._entries = _check_entries(value)

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        """The full (unsharded) shape of the tensors whose shards the slots hold, or ``()``."""
        return self._meta_shape

    @meta_shape.setter
    def meta_shape(self, shape: Iterable[int]) -> None:
        self._ir._check_mutable()
        self._meta_shape = _shape(shape, "RemoteBuffer.meta_shape")

    @property
    def spec(self) -> TensorSpec:
        """What one slot holds (the spec of a tensor loaded from it)."""
        return TensorSpec(self._tensor_shape, self._tensor_dtype, self._meta_shape)

    def set_remote_buffer_info(self, tensor_dtype: dtypes.dtype, tensor_shape: Iterable[int], entries: int) -> None:
        """Set the slot dtype, slot shape and number of slots together.

        Args:
            tensor_dtype: The slot dtype.
            tensor_shape: The slot shape.
            entries: The number of slots.
        """
        self._ir._check_mutable()
        if not isinstance(tensor_dtype, dtypes.dtype):
            raise TypeError(f"RemoteBuffer: tensor_dtype must be a popxl dtype, not {tensor_dtype!r}.")
        self._tensor_shape = _shape(tensor_shape, "RemoteBuffer.tensor_shape")
        self._tensor_dtype = tensor_dtype
        self._entries = _check_entries(entries)

    def validate_tensor_matches_buffer(self, t: Union[Tensor, TensorSpec], num_shards: int = 1) -> None:
        """ValueError unless ``t`` fits a slot: same dtype and shape. With ``num_shards`` > 1, ``t``
        is a whole tensor to be sharded: its shape must be ``meta_shape`` (when set) and its
        shards (``ceil(nelms / num_shards)`` elements) must fit the 1-D slots.

        Args:
            t: A tensor or a spec.
            num_shards: The number of shards ``t`` is split into; compared with ``meta_shape`` when not 1.

        Raises:
            ValueError: If ``t`` does not fit a slot.
        """
        what = f"Tensor {t.id}" if isinstance(t, Tensor) else "The tensor"
        shape, dt = tuple(t.shape), t.dtype
        problems = []
        if dt is not self._tensor_dtype:
            problems.append(f"dtype {dt.name} != {self._tensor_dtype.name}")
        if num_shards == 1:
            if shape != self._tensor_shape:
                problems.append(f"shape {shape} != {self._tensor_shape}")
        else:
            if self._meta_shape and shape != self._meta_shape:
                problems.append(f"shape {shape} != meta_shape {self._meta_shape}")
            # Each of the num_shards replicas keeps one slot's worth of consecutive elements, so a
            # 1-D slot of at least ceil(nelms / num_shards) elements holds the value (PopXL programs
            # sometimes give the whole shape; the rest of the slots is then zero padding).
            shard = math.ceil(math.prod(shape) / num_shards)
            if len(self._tensor_shape) != 1 or self._tensor_shape[0] < shard:
                problems.append(f"its shards over {num_shards} replicas need 1-D slots of at least {shard} elements, "
                                f"not {self._tensor_shape}")
        if problems:
            raise ValueError(f"{what} does not match buffer. {self!r}: " + "; ".join(problems) + ".")

    def __hash__(self) -> int:
        return hash((self._ir.id, self._remote_buffer_id))

    def __eq__(self, other: Any) -> builtins.bool:
        return self is other

    def __repr__(self) -> str:
        meta = f", meta_shape={self._meta_shape}" if self._meta_shape else ""
        return (f"RemoteBuffer[id={self._remote_buffer_id} shape={self._tensor_shape} "
                f"dtype={self._tensor_dtype.name} entries={self._entries}{meta}]")


def remote_buffer(tensor_shape: Tuple[int, ...], tensor_dtype: dtypes.dtype, entries: int = 1) -> RemoteBuffer:
    """A new remote buffer of ``entries`` slots of ``tensor_shape`` / ``tensor_dtype`` per replica.

    Args:
        tensor_shape: The shape of one slot.
        tensor_dtype: The dtype of one slot.
        entries: The number of slots.

    Returns:
        The new `RemoteBuffer`.

    Raises:
        ValueError: If ``entries`` is below 1.
    """
    return RemoteBuffer(tensor_shape, tensor_dtype, entries)


# factories ----------------------------------------------------------------------------------------
def _check_buffer(remote_buffer: Any, offset: Any, what: str) -> int:
    if not isinstance(remote_buffer, RemoteBuffer):
        raise TypeError(f"{what}: remote_buffer must be a popxl.RemoteBuffer, not {type(remote_buffer).__name__}.")
    if remote_buffer._ir is not get_current_context().ir:
        raise ValueError(f"{what}: {remote_buffer!r} belongs to a different Ir.")
    if not isinstance(offset, (int, np.integer)) or isinstance(offset, builtins.bool) or offset < 0:
        raise ValueError(f"{what}: offset must be an int >= 0, not {offset!r}.")
    return int(offset)


def remote_variable(data: HostScalarTensor, remote_buffer: RemoteBuffer, offset: int = 0,
                    dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None, downcast: bool = True,
                    replica_grouping: Optional["ReplicaGrouping"] = None,
                    retrieval_mode: RetrievalMode = "one_per_group",
                    log2_scale: Optional[int] = None, nan_on_overflow: Optional[bool] = None) -> Variable:
    """A variable stored in slot ``offset`` of ``remote_buffer`` (read it with ``ops.remote_load``).
    Its shape (per replica, without the group axis) and dtype must match the buffer's slots.

    Args:
        data: The initial value (per replica group, with a leading group axis when there are several).
        remote_buffer: The buffer holding the variable.
        offset: The slot of the buffer.
        dtype: The variable's dtype; default inferred from ``data``.
        name: The variable's name.
        downcast: Turn 64-bit host data into 32-bit when ``dtype`` is not given.
        replica_grouping: How replicas share the value; default one value for all.
        retrieval_mode: "one_per_group" or "all_replicas".
        log2_scale: For float8 dtypes: the power-of-two scale applied when converting ``data``.
        nan_on_overflow: For float8 dtypes: turn values too large for the format into NaN.

    Returns:
        The new `Variable`.

    Raises:
        ValueError: If the data do not match the buffer's slots or the grouping, or ``offset`` is
            out of range.
    """
    what = "popxl.remote_variable"
    offset = _check_buffer(remote_buffer, offset, what)

    def check(spec: TensorSpec, rg: "ReplicaGrouping") -> TensorSpec:
        if rg.num_groups == 1 and spec.shape == (1, *remote_buffer.tensor_shape):
            # Per-group data written as (num_groups, *shape) for a grouping of one group, as PopXL
            # programs do: the leading axis is the group axis.
            spec = TensorSpec(remote_buffer.tensor_shape, spec.dtype)
        try:
            remote_buffer.validate_tensor_matches_buffer(spec)
        except ValueError as e:
            raise ValueError(f"{what} {name or ''!r}: {e}") from None
        return spec

    return _create_variable(data, dtype, name, downcast, replica_grouping, retrieval_mode, log2_scale,
                            nan_on_overflow, what=what, check=check, _remote_slot=(remote_buffer, offset, 1))


def _shard_count(remote_buffer: RemoteBuffer, rg: "ReplicaGrouping") -> int:
    return remote_buffer._shard_over if remote_buffer._shard_over is not None else rg.group_size


def _require_replication(what: str, name: Optional[str]) -> None:
    rf = get_current_context().ir.replication_factor
    if rf <= 1:
        raise ValueError(f"{what} {name or ''!r}: replicated tensor sharding needs replication "
                         f"(ir.replication_factor > 1), but it is {rf}.")


def remote_replica_sharded_variable(data: HostScalarTensor, remote_buffer: RemoteBuffer, offset: int = 0,
                                    dtype: Optional[dtypes.dtype] = None, name: Optional[str] = None,
                                    downcast: bool = True, replica_grouping: Optional["ReplicaGrouping"] = None,
                                    retrieval_mode: RetrievalMode = "one_per_group",
                                    log2_scale: Optional[int] = None,
                                    nan_on_overflow: Optional[bool] = None) -> Variable:
    """A variable stored sharded over the replicas of its group, one 1-D shard per replica in slot
    ``offset`` of ``remote_buffer`` (see the module docstring for the layout). The variable's shape
    and ``meta_shape`` are the whole value's; sets the buffer's ``meta_shape`` if unset.

    Args:
        data: The initial value (per replica group, with a leading group axis when there are several).
        remote_buffer: The buffer holding the variable.
        offset: The slot of the buffer.
        dtype: The variable's dtype; default inferred from ``data``.
        name: The variable's name.
        downcast: Turn 64-bit host data into 32-bit when ``dtype`` is not given.
        replica_grouping: How replicas share the value; default one value for all.
        retrieval_mode: "one_per_group" or "all_replicas".
        log2_scale: For float8 dtypes: the power-of-two scale applied when converting ``data``.
        nan_on_overflow: For float8 dtypes: turn values too large for the format into NaN.

    Returns:
        The new `Variable`.

    Raises:
        ValueError: If there is only one replica, or the buffer's ``meta_shape`` is set and differs.
    """
    what = "popxl.remote_replica_sharded_variable"
    offset = _check_buffer(remote_buffer, offset, what)
    _require_replication(what, name)
    rg = replica_grouping if replica_grouping is not None else get_current_context().ir.replica_grouping()
    shards = _shard_count(remote_buffer, rg)

    def check(spec: TensorSpec, rg: "ReplicaGrouping") -> TensorSpec:
        if remote_buffer.meta_shape and remote_buffer.meta_shape != spec.shape:
            raise ValueError(f"{what} {name or ''!r}: the data's shape {spec.shape} (per group) differs from the "
                             f"meta_shape {remote_buffer.meta_shape} of {remote_buffer!r}.")
        try:
            remote_buffer.validate_tensor_matches_buffer(spec, num_shards=shards)
        except ValueError as e:
            raise ValueError(f"{what} {name or ''!r}: {e}") from None
        return TensorSpec(spec.shape, spec.dtype, spec.shape)

    var = _create_variable(data, dtype, name, downcast, rg, retrieval_mode, log2_scale, nan_on_overflow,
                           what=what, check=check, _remote_slot=(remote_buffer, offset, shards))
    if not remote_buffer.meta_shape:
        remote_buffer._meta_shape = var.shape
    return var


def replica_sharded_buffer(shape: Tuple[int, ...], dtype: dtypes.dtype,
                           replica_grouping: Optional["ReplicaGrouping"] = None, shard_over: Optional[int] = None,
                           entries: int = 1) -> RemoteBuffer:
    """A remote buffer for tensors of ``shape`` sharded over ``shard_over`` replicas (default: the
    group size of ``replica_grouping``): slots of shape ``(ceil(nelms / shard_over),)`` and
    ``meta_shape = shape`` (without the leading group axis when there are several groups).

    Args:
        shape: The full shape of the tensors stored.
        dtype: Their dtype.
        replica_grouping: The grouping the tensors are sharded within; default all replicas.
        shard_over: The number of replicas a tensor is sharded over; default the group size.
        entries: The number of slots.

    Returns:
        The new `RemoteBuffer`.

    Raises:
        ValueError: If ``shard_over`` does not divide the group size.
    """
    ir = get_current_context().ir
    rg = replica_grouping if replica_grouping is not None else ir.replica_grouping()
    shape = _shape(shape, "replica_sharded_buffer: shape")
    if rg.num_groups > 1:
        if not shape or shape[0] != rg.num_groups:
            raise ValueError(f"replica_sharded_buffer: with {rg.num_groups} replica groups the shape needs a "
                             f"leading group axis of {rg.num_groups}; got {shape}.")
        shape = shape[1:]
    if shard_over is None:
        shard_over = rg.group_size
    if (not isinstance(shard_over, (int, np.integer)) or isinstance(shard_over, builtins.bool) or shard_over < 1
            or rg.group_size % shard_over):
        raise ValueError(f"replica_sharded_buffer: shard_over must be a positive divisor of the replica group "
                         f"size {rg.group_size}, not {shard_over!r}.")
    buffer = RemoteBuffer((math.ceil(math.prod(shape) / shard_over),), dtype, entries)
    buffer._meta_shape = shape
    buffer._shard_over = int(shard_over)
    return buffer


def replica_sharded_variable(data: HostScalarTensor, dtype: Optional[dtypes.dtype] = None,
                             name: Optional[str] = None, downcast: bool = True,
                             replica_grouping: Optional["ReplicaGrouping"] = None, shard_over: Optional[int] = None,
                             retrieval_mode: RetrievalMode = "one_per_group",
                             log2_scale: Optional[int] = None,
                             nan_on_overflow: Optional[bool] = None) -> Tuple[Variable, Tensor]:
    """A replica-sharded variable in a buffer of its own, plus its shard: ``(full_var, shard)``.

    ``shard`` is this replica's 1-D shard as an ordinary main-graph tensor for computing (and
    updating in place). It stays on the device between runs; the Session fills it from the
    remote slot on ``weights_from_host`` and writes it back on ``weights_to_host``, so host data
    goes in and out through ``full_var``.

    Args:
        data: The initial value (per replica group, with a leading group axis when there are several).
        dtype: The variable's dtype; default inferred from ``data``.
        name: The variable's name.
        downcast: Turn 64-bit host data into 32-bit when ``dtype`` is not given.
        replica_grouping: How replicas share the value; default one value for all.
        shard_over: The number of replicas the value is sharded over; default the group size.
        retrieval_mode: "one_per_group" or "all_replicas".
        log2_scale: For float8 dtypes: the power-of-two scale applied when converting ``data``.
        nan_on_overflow: For float8 dtypes: turn values too large for the format into NaN.

    Returns:
        ``(full_var, shard)``.

    Raises:
        ValueError: If ``shard_over`` does not divide the group size, or the data do not fit.
    """
    _require_replication("popxl.replica_sharded_variable", name)  # before making its buffer
    arr = _host_data(data, dtype, downcast, log2_scale, nan_on_overflow)
    dt = dtype if dtype is not None else dtypes.from_numpy(arr.dtype)
    buffer = replica_sharded_buffer(arr.shape, dt, replica_grouping, shard_over)
    var = remote_replica_sharded_variable(data, buffer, 0, dtype, name, downcast, replica_grouping,
                                          retrieval_mode, log2_scale, nan_on_overflow)
    shard = Tensor._create(var.graph, f"{var.name}_rts", buffer.spec, _remote_slot=var._remote_slot)
    return var, shard


# session support ----------------------------------------------------------------------------------
def _slot_of(v: Variable) -> Tuple[Any, int, int]:
    """(RemoteBuffer, offset, shards) of the slot of a remote (or replica-sharded) variable."""
    if v._remote_slot is None:
        raise ValueError(f"{v.id!r} is not a remote variable: it has no remote buffer slot.")
    return v._remote_slot


def _slot_members(v: Variable, replicas: int) -> Dict[int, Tuple[int, int]]:
    """For each replica (of all instances): (group index, chunk index) of the value ``v``'s slot holds there."""
    assignment = v.replica_grouping.assignment
    shards = _slot_of(v)[2]
    out: Dict[int, Tuple[int, int]] = {}
    seen: Dict[Any, int] = {}
    for r in range(replicas):
        g = assignment[r]
        j = seen.get(g, 0)
        seen[g] = j + 1
        out[r] = (g, j % shards)
    return out


def _chunk(value: np.ndarray, j: int, shards: int, size: int) -> np.ndarray:
    flat = np.zeros(size * shards, value.dtype)
    flat[:value.size] = value.reshape(-1)
    return flat[j * size:(j + 1) * size]


class RemoteMemory:
    """What a Session needs to sync remote variables: the executable's buffer regions (one
    device-state entry per remote buffer) and mirror entries (shard tensors of
    ``replica_sharded_variable``), plus the remote variables of the main graph.

    The engine runs this instance's replicas, global replicas ``[offset, offset + exe replicas)``
    of the Ir's ``replication_factor`` (all instances'): a group's chunks may lie on other
    instances, so reading gives a plan (``chunk_sources``) the Session fetches (popxl.distributed)."""

    def __init__(self, ir: "Ir", exe: Any, offset: int = 0) -> None:
        self.replicas = exe.replication_factor
        self.offset = offset
        self.global_replicas = ir.replication_factor
        self.buffers = {b.remote_buffer_id: b for b in _buffers_of(ir)}
        self.regions = {e["remote_buffer"]: i for i, e in enumerate(exe.variables) if "remote_buffer" in e}
        self.mirrors = [(i, *e["mirror_of"]) for i, e in enumerate(exe.variables) if "mirror_of" in e]
        self.variables = [v for v in ir.main_graph.variables if v._remote_slot is not None]

    def __contains__(self, v: Any) -> bool:
        return isinstance(v, Variable) and v._remote_slot is not None

    def write(self, engine: Any, variables: Iterable[Variable],
              device_value: Callable[[Variable, int], np.ndarray]) -> None:
        """Host values of remote ``variables`` -> their slots (and the mirrors of those slots), on this
        instance's replicas (``device_value(v, local replica)``)."""
        by_buffer: Dict[int, List[Variable]] = {}
        for v in variables:
            by_buffer.setdefault(_slot_of(v)[0].remote_buffer_id, []).append(v)
        for bid, vs in by_buffer.items():
            ri = self.regions[bid]
            members = [_slot_members(v, self.global_replicas) for v in vs]
            for r in range(self.replicas):
                region = engine.read_variable(ri, r)
                for v, m in zip(vs, members):
                    _, offset, shards = _slot_of(v)
                    value = device_value(v, r)
                    region[offset] = _chunk(value, m[self.offset + r][1], shards, region.shape[1]) if shards > 1 else value
                engine.write_variable(ri, r, region)
            written = {_slot_of(v)[1] for v in vs}
            for mi, mbid, offset in self.mirrors:
                if mbid == bid and offset in written:
                    for r in range(self.replicas):
                        engine.write_variable(mi, r, engine.read_variable(ri, r)[offset])

    def sync_mirrors(self, engine: Any) -> None:
        """Mirrors -> their slots, on this instance's replicas (before the slots are read)."""
        for mi, bid, offset in self.mirrors:
            ri = self.regions[bid]
            for r in range(self.replicas):
                region = engine.read_variable(ri, r)
                region[offset] = engine.read_variable(mi, r)
                engine.write_variable(ri, r, region)

    def chunk_sources(self, v: Variable) -> Dict[Tuple[int, int], List[int]]:
        """For each (group, chunk) of remote variable ``v``: the replicas whose slot holds it, in order."""
        out: Dict[Tuple[int, int], List[int]] = {}
        for r, key in _slot_members(v, self.global_replicas).items():
            out.setdefault(key, []).append(r)
        return out

    def slot(self, engine: Any, v: Variable, replica: int) -> np.ndarray:
        """The content of ``v``'s slot on this instance's replica ``replica``."""
        rb, offset, _ = _slot_of(v)
        return engine.read_variable(self.regions[rb.remote_buffer_id], replica)[offset]

    def assemble(self, v: Variable, chunks: Dict[Tuple[int, int], np.ndarray], out: np.ndarray) -> None:
        """Write ``v``'s value, from the content of its slots per (group, chunk), into host array ``out``."""
        shards, rg = _slot_of(v)[2], v.replica_grouping
        values = [np.concatenate([chunks[g, j].reshape(-1) for j in range(shards)])[:math.prod(v.shape)].reshape(v.shape)
                  for g in range(rg.num_groups)]
        value = np.stack(values) if rg.num_groups > 1 else values[0]
        out[...] = value.view(out.dtype) if out.dtype.names else value
