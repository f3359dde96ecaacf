"""Ops moving data between the device and the host or remote memory (PopART's ``exchange`` ops),
registered as the view classes of their popxl ops when this module is imported (as
``popart._internal.ir`` does)."""
from __future__ import annotations

from popart._internal.ir.op import Op, register_view_class

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


for _optype, _cls in (("host_load", HostLoadOp), ("host_store", HostStoreOp), ("remote_load", RemoteLoadOp),
                      ("remote_load_", RemoteLoadInplaceOp), ("remote_store", RemoteStoreOp)):
    register_view_class(_optype, _cls)
