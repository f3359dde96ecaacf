"""How the views are made, registered with popxl's core (``popxl._pb``) when this package is
imported: ``_pb_graph``, ``_pb_tensor``, ``_pb_ir``, ``_pb_session``, PopART's methods on a popxl
``Op``, ``_pb_replica_grouping`` and ``ctx._get_op_settings`` all come from here. The binding modules
of C++ custom ops are registered with popxl's import finder (``popxl.custom_op_modules``) too."""
from __future__ import annotations

from typing import Any

from popxl import _pb, custom_op_modules
from popxl.graph import Graph as XlGraph
from popxl.ir import Ir as XlIr
from popxl.op import Op as XlOp
from popxl.session import Session as XlSession
from popxl.tensor import Tensor as XlTensor

from popart._internal.ir import addons_bindings, application_bindings
from popart._internal.ir.custom_op import ReplicaGrouping, Settings
from popart._internal.ir.graph import Graph
from popart._internal.ir.ir import Ir
from popart._internal.ir.op import exchange as _exchange, view_class  # noqa: F401  (exchange: its view classes)
from popart._internal.ir.session import Session
from popart._internal.ir.tensor import Tensor


__all__ = ["new_view"]


def new_view(obj: Any) -> _pb.View:
    """The view of a popxl Ir, Graph, Op, Tensor or Session (``view_of`` keeps it on the object)."""
    if isinstance(obj, XlTensor):
        return Tensor(obj)
    if isinstance(obj, XlOp):
        return view_class(obj.type)(obj)
    if isinstance(obj, XlGraph):
        return Graph(obj)
    if isinstance(obj, XlIr):
        return Ir(obj)
    if isinstance(obj, XlSession):
        return Session(obj)
    raise TypeError(f"popart._internal.ir has no view of {type(obj).__name__} objects.")


_pb.register(view=new_view, replica_grouping=ReplicaGrouping, op_settings=Settings._from_context)
custom_op_modules.register(addons_bindings.MODULES, application_bindings)
