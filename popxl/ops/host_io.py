"""Host I/O: ``host_load`` reads the next slice of a host-to-device stream, ``host_store``
writes the next slice of a device-to-host stream. The engine runs them as program steps."""
from __future__ import annotations

from typing import Optional

from popxl.op import Grad, OpDef, create_op, register
from popxl.ops.utils import spec
from popxl.streams import DeviceToHostStream, HostToDeviceStream
from popxl.tensor import Tensor

__all__ = ["host_load", "host_store"]


def _host_load_infer(specs, stream):
    return [spec(stream.shape, stream.dtype)]


def _host_store_infer(specs, stream):
    (s,) = specs
    if s.shape != stream.shape or s.dtype is not stream.dtype:
        raise ValueError(f"tensor {s.shape} {s.dtype.name} does not match stream {stream.tensor_id!r} "
                         f"({stream.shape} {stream.dtype.name})")
    return []


register(OpDef("host_load", _host_load_infer, control=True, side_effect=True, grad=Grad.STOP, family="host_io"))
register(OpDef("host_store", _host_store_infer, control=True, side_effect=True, grad=Grad.STOP, family="host_io"))


def host_load(h2d_stream: HostToDeviceStream, name: Optional[str] = None) -> Tensor:
    """Read the next slice of a host-to-device stream into a new tensor.

    Each executed load consumes one slice of the stream's host buffer (see ``Session.run``).

    Args:
        h2d_stream: The stream read.
        name: The tensor's name (``<name>_hostload``); default the stream's name.

    Returns:
        A new tensor of the stream's shape and dtype.

    Raises:
        TypeError: If ``h2d_stream`` is not a HostToDeviceStream.
        ValueError: If the stream belongs to another Ir.
    """
    if not isinstance(h2d_stream, HostToDeviceStream):
        raise TypeError(f"ops.host_load needs a HostToDeviceStream, not {type(h2d_stream).__name__}.")
    name = name or h2d_stream.tensor_id
    return create_op("host_load", [], {"stream": h2d_stream}, name="host_load",
                     output_names=[f"{name}_hostload"])[0]


def host_store(d2h_stream: DeviceToHostStream, t: Tensor) -> None:
    """Send a tensor to the host as the next slice of a device-to-host stream.

    Args:
        d2h_stream: The stream written.
        t: The tensor sent, of the stream's shape and dtype.

    Raises:
        TypeError: If ``d2h_stream`` is not a DeviceToHostStream or ``t`` is not a Tensor.
        ValueError: If the shape or dtype of ``t`` differs from the stream's, or ``t`` is not in the
            current graph.
    """
    if not isinstance(d2h_stream, DeviceToHostStream):
        raise TypeError(f"ops.host_store needs a DeviceToHostStream, not {type(d2h_stream).__name__}.")
    create_op("host_store", [t], {"stream": d2h_stream})
