"""Remote memory ops: ``remote_load`` / ``remote_load_`` read a slot of a RemoteBuffer,
``remote_store`` writes one; ``remote_code_load`` (a no-op on the CPU) marks code loading.

The slot index (``offset``) is a tensor: a Python int becomes a uint32 constant. Loads and
stores have no data dependency on each other; they run in creation order, so order them with
``popxl.in_sequence()`` as PopXL requires.

Kernels: lowering appends the buffer's persistent region (``(entries, *tensor_shape)`` per
replica) as the last kernel input and replaces the ``remote_buffer`` attribute by the buffer id.
``remote_store`` writes the slot of that region in place: copying a whole region to change one
slot would make every store cost the size of the buffer.
"""
from __future__ import annotations

import builtins
from typing import Literal, Optional, Union

import numpy as np

from popxl import dtypes
from popxl.context import get_current_context
from popxl.graph import Graph
from popxl.op import Grad, OpDef, create_op, register
from popxl.remote_buffer import RemoteBuffer
from popxl.tensor import Tensor, TensorSpec, constant

__all__ = ["remote_load", "remote_load_", "remote_store"]


def _check_offset_spec(s: TensorSpec) -> None:
    if not s.dtype.is_int or int(np.prod(s.shape)) != 1:
        raise ValueError(f"the offset must be an integer tensor with one element, got {s.shape} {s.dtype.name}")


def _load_infer(specs, remote_buffer):
    (off,) = specs
    _check_offset_spec(off)
    return [remote_buffer.spec]


def _load_inplace_infer(specs, remote_buffer):
    t, off = specs
    _check_offset_spec(off)
    remote_buffer.validate_tensor_matches_buffer(t)
    return [t]


def _store_infer(specs, remote_buffer):
    t, off = specs
    _check_offset_spec(off)
    remote_buffer.validate_tensor_matches_buffer(t)
    return []


def _slot(region: np.ndarray, offset: np.ndarray, remote_buffer: int, what: str) -> int:
    k = int(np.asarray(offset).reshape(-1)[0])
    if not 0 <= k < region.shape[0]:
        raise IndexError(f"{what}: offset {k} is out of range for remote buffer {remote_buffer}, which has "
                         f"{region.shape[0]} entries (valid offsets 0..{region.shape[0] - 1}).")
    return k


def _load_kernel(offset, region, remote_buffer):
    return region[_slot(region, offset, remote_buffer, "remote_load")].copy()


def _load_inplace_kernel(t, offset, region, remote_buffer):
    return region[_slot(region, offset, remote_buffer, "remote_load_")].copy()


def _store_kernel(t, offset, region, remote_buffer):
    region[_slot(region, offset, remote_buffer, "remote_store")] = t
    return ()


register(OpDef("remote_load", _load_infer, _load_kernel, side_effect=True, grad=Grad.STOP, family="remote",
               attributes={"remote_buffer": "remote_buffer"}))
register(OpDef("remote_load_", _load_inplace_infer, _load_inplace_kernel, inplace=0, side_effect=True,
               grad=Grad.STOP, family="remote",
               attributes={"remote_buffer": "remote_buffer"}))
register(OpDef("remote_store", _store_infer, _store_kernel, side_effect=True, grad=Grad.STOP, family="remote",
               attributes={"remote_buffer": "remote_buffer"}))


def _offset_tensor(opname: str, remote_buffer: RemoteBuffer, offset: Union[int, Tensor]) -> Tensor:
    if not isinstance(remote_buffer, RemoteBuffer):
        raise TypeError(f"ops.{opname}: remote_buffer must be a popxl.RemoteBuffer, not "
                        f"{type(remote_buffer).__name__}.")
    if remote_buffer._ir is not get_current_context().ir:
        raise ValueError(f"ops.{opname}: {remote_buffer!r} belongs to a different Ir.")
    if isinstance(offset, Tensor):
        return offset
    if not isinstance(offset, (int, np.integer)) or isinstance(offset, builtins.bool):
        raise TypeError(f"ops.{opname}: offset must be an int or an integer Tensor, not {offset!r}.")
    if offset < 0:
        raise ValueError(f"ops.{opname}: offset must be >= 0, got {offset} (for {remote_buffer!r}).")
    # The upper bound is checked when the op runs: `entries` may still grow until the Session is made.
    return constant(np.uint32(offset), dtypes.uint32, name="offset")


def _check_tensor(opname: str, remote_buffer: RemoteBuffer, t: Tensor) -> None:
    """Name the tensor and the buffer in a mismatch (the shape rule only sees specs)."""
    if isinstance(t, Tensor):
        try:
            remote_buffer.validate_tensor_matches_buffer(t)
        except ValueError as e:
            raise ValueError(f"ops.{opname}: {e}") from None


def remote_load(remote_buffer: RemoteBuffer, offset: Union[int, Tensor], name: Optional[str] = None) -> Tensor:
    """Load one slot of a remote buffer into a new tensor.

    Loads and stores have no data dependency on each other: order them with ``popxl.in_sequence``.

    Args:
        remote_buffer: The buffer read.
        offset: The slot: an int (made a uint32 constant) or a scalar integer tensor.
        name: The name of the result (``<name>_remote_loaded``); default
            ``id_<buffer id>_offset_<offset name>``.

    Returns:
        A new tensor of the buffer's shape, dtype and meta shape.

    Raises:
        TypeError: If ``remote_buffer`` is not a RemoteBuffer or ``offset`` is neither an int nor a
            Tensor.
        ValueError: If ``offset`` is negative or not a one-element integer tensor, or a tensor is not in
            the current graph.
        IndexError: When the program runs, if ``offset`` is not a slot of the buffer.
    """
    off = _offset_tensor("remote_load", remote_buffer, offset)
    name = name or f"id_{remote_buffer.remote_buffer_id}_offset_{off.name}"
    return create_op("remote_load", [off], {"remote_buffer": remote_buffer},
                     output_names=[f"{name}_remote_loaded"])[0]


def remote_load_(remote_buffer: RemoteBuffer, offset: Union[int, Tensor], t: Tensor) -> Tensor:
    """Load one slot of a remote buffer into an existing tensor, in place.

    Args:
        remote_buffer: The buffer read.
        offset: The slot: an int (made a uint32 constant) or a scalar integer tensor.
        t: The tensor overwritten, of the buffer's shape and dtype.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``remote_buffer`` is not a RemoteBuffer or ``t`` is not a Tensor.
        ValueError: If ``t`` does not match the buffer, ``offset`` is negative, or a tensor is not in
            the current graph.
        IndexError: When the program runs, if ``offset`` is not a slot of the buffer.
    """
    off = _offset_tensor("remote_load_", remote_buffer, offset)
    _check_tensor("remote_load_", remote_buffer, t)
    return create_op("remote_load_", [t, off], {"remote_buffer": remote_buffer})[0]


def remote_store(remote_buffer: RemoteBuffer, offset: Union[int, Tensor], t: Tensor) -> None:
    """Store a tensor into one slot of a remote buffer.

    Args:
        remote_buffer: The buffer written.
        offset: The slot: an int (made a uint32 constant) or a scalar integer tensor.
        t: The tensor stored, of the buffer's shape and dtype.

    Raises:
        TypeError: If ``remote_buffer`` is not a RemoteBuffer or ``t`` is not a Tensor.
        ValueError: If ``t`` does not match the buffer, ``offset`` is negative, or a tensor is not in
            the current graph.
        IndexError: When the program runs, if ``offset`` is not a slot of the buffer.
    """
    off = _offset_tensor("remote_store", remote_buffer, offset)
    _check_tensor("remote_store", remote_buffer, t)
    create_op("remote_store", [t, off], {"remote_buffer": remote_buffer})


# remote_code_load ---------------------------------------------------------------------------------
def _code_load_infer(specs, graph_id, destination):
    return []


def _code_load_kernel(graph_id, destination):
    return ()  # all code is always resident on the CPU


register(OpDef("remote_code_load", _code_load_infer, _code_load_kernel, side_effect=True, grad=Grad.STOP,
               family="remote",
               attributes={"graph_id": "str", "destination": "str"}))


def remote_code_load(graph: Graph, destination: Literal["executable", "compute_buffer", "io_buffer"]) -> None:
    """Load a graph's code from remote memory before it is called (numerically a no-op here).

    Args:
        graph: The graph whose code is loaded (not the current graph).
        destination: Where the code goes; only "executable" is supported, as in PopXL.

    Raises:
        TypeError: If ``graph`` is not a Graph.
        ValueError: If ``graph`` is the current graph.
        NotImplementedError: If ``destination`` is not "executable".
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"ops.remote_code_load: graph must be a popxl.Graph, not {type(graph).__name__}.")
    if destination not in ("executable", "compute_buffer", "io_buffer"):
        raise ValueError(f"ops.remote_code_load: destination must be 'executable', 'compute_buffer' or "
                         f"'io_buffer', not {destination!r}.")
    if destination != "executable":
        raise NotImplementedError(f"ops.remote_code_load: destination {destination!r} is not supported; "
                                  f"only 'executable' is.")
    if graph is get_current_context().graph:
        raise ValueError(f"The remote_code_load op cannot load the code of {graph.id!r} from inside that graph "
                         f"(it is the current graph); load it from the graph that calls it.")
    # The graph is kept by id, not as a Graph attribute: a code load does not call the graph.
    create_op("remote_code_load", [], {"graph_id": graph.id, "destination": destination})
