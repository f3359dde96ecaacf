"""Ops moving data between the device and the host or remote memory (PopART's ``exchange`` ops)."""
from __future__ import annotations

from popart._internal.ir.op import Op

__all__ = ["ExchangeBaseOp", "HostLoadOp", "HostStoreOp", "RemoteLoadOp", "RemoteLoadInplaceOp", "RemoteStoreOp"]


class ExchangeBaseOp(Op):
    """An op moving data to or from the device."""


class HostLoadOp(ExchangeBaseOp):
    """``ops.host_load``: the next value of a host-to-device stream."""


class HostStoreOp(ExchangeBaseOp):
    """``ops.host_store``: a value sent to a device-to-host stream."""


class RemoteLoadOp(ExchangeBaseOp):
    """``ops.remote_load``: a value read from a remote buffer."""


class RemoteLoadInplaceOp(ExchangeBaseOp):
    """``ops.remote_load_``: a remote buffer entry read into an existing tensor."""


class RemoteStoreOp(ExchangeBaseOp):
    """``ops.remote_store``: a value written to a remote buffer."""
