"""Host streams: the only way data moves between the host and a running program."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple, Type

from popxl import dtypes
from popxl.context import get_current_context
from popxl.tensor import TensorSpec

__all__ = ["Stream", "HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream"]


class Stream:
    """A host stream: what the two kinds share. Made by `h2d_stream` / `d2h_stream`, never directly.

    Equality and hashing are by the stream's tensor.

    Raises:
        NotImplementedError: If constructed directly.
    """

    _ir: Any
    _spec: TensorSpec
    _id: str
    _hash: int

    def __init__(self) -> None:
        raise NotImplementedError(
            "Streams cannot be constructed directly: use popxl.h2d_stream(...) or popxl.d2h_stream(...).")

    @classmethod
    def _create(cls, ir: Any, name: str, spec: TensorSpec) -> "Stream":
        s = object.__new__(cls)
        s._ir = ir
        s._spec = spec
        base, n = name, 0
        while name in ir._stream_ids:
            n += 1
            name = f"{base}__t{n}"
        ir._stream_ids.add(name)
        s._id = name
        s._hash = hash((id(ir), name))  # streams key the dicts of every Session.run
        return s

    @property
    def dtype(self) -> dtypes.dtype:
        """The dtype of one transfer."""
        return self._spec.dtype

    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape of one transfer on one replica."""
        return self._spec.shape

    @property
    def spec(self) -> TensorSpec:
        """The `TensorSpec` of one transfer."""
        return self._spec

    @property
    def tensor_id(self) -> str:
        """The id of the stream's tensor (its unique name)."""
        return self._id

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Stream) and other._ir is self._ir and other._id == self._id

    def __repr__(self) -> str:
        return f"{type(self).__name__}[{self._id} {self.dtype!r} {self.shape}]"


class HostToDeviceStream(Stream):
    """Carries host data to the device; read with ``ops.host_load``."""


class DeviceToHostStream(Stream):
    """Carries device data to the host; written with ``ops.host_store``."""


def _make(cls: Type[Stream], shape: Iterable[int], dtype: dtypes.dtype, name: str) -> Any:
    g = get_current_context().graph
    g.ir._check_mutable()
    if not isinstance(dtype, dtypes.dtype):
        raise TypeError(f"{cls.__name__} {name!r}: dtype must be a popxl dtype, not {dtype!r}.")
    try:
        spec = TensorSpec(shape, dtype)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{cls.__name__} {name!r}: {e}") from None
    return cls._create(g.ir, name, spec)


def h2d_stream(shape: Iterable[int], dtype: dtypes.dtype, name: Optional[str] = None) -> HostToDeviceStream:
    """Create a host-to-device stream of per-transfer, per-replica ``shape``.

    Each executed ``ops.host_load`` of it reads the next slice of the host buffer given to
    ``Session.run``.

    Args:
        shape: The shape of one transfer on one replica.
        dtype: The element type.
        name: The stream's name; default "h2d_stream".

    Returns:
        The new `HostToDeviceStream`.

    Raises:
        RuntimeError: If no graph is entered.
        ValueError: If ``shape`` is not a shape.
    """
    return _make(HostToDeviceStream, shape, dtype, name or "h2d_stream")


def d2h_stream(shape: Iterable[int], dtype: dtypes.dtype, name: Optional[str] = None) -> DeviceToHostStream:
    """Create a device-to-host stream of per-transfer, per-replica ``shape``.

    Each executed ``ops.host_store`` to it fills the next slice of the host buffer ``Session.run``
    returns.

    Args:
        shape: The shape of one transfer on one replica.
        dtype: The element type.
        name: The stream's name; default "d2h_stream".

    Returns:
        The new `DeviceToHostStream`.

    Raises:
        RuntimeError: If no graph is entered.
        ValueError: If ``shape`` is not a shape.
    """
    return _make(DeviceToHostStream, shape, dtype, name or "d2h_stream")
