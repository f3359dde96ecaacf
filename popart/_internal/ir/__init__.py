"""``popart._internal.ir``: PopART's internal IR as PopXL's Python reaches it, here a view of
popxl's own IR (there is one IR, not two).

``ir._pb_ir``, ``graph._pb_graph``, ``tensor._pb_tensor`` and ``session._pb_session`` return views
(``Ir``, ``Graph``, ``Tensor``, ``Session``) of the popxl objects; ops are viewed as ``Op`` (or
``op.CallOp``, ``op.LoopOp``, ...). Each popxl object has one view, made on first use, and
``popxl.Graph._from_pb`` / ``popxl.Tensor._from_pb_tensor`` give back the popxl object. Views
read the IR and change it only through popxl's graph edit API (popxl/graph.py) and the call-site
helpers of popxl/ops/call.py. A PopART call that popxl's IR cannot honour raises an error naming
the call and why; docs/guide/internals.md lists them.

This package is the top layer (docs/architecture.md): popxl never imports it. Importing it
registers its views with popxl's core (``popxl._pb``), and ``import popxl`` imports it the first
time a view is asked for.
"""
from popart._internal.ir import op, patterns, view
from popart._internal.ir.op import exchange as _exchange  # noqa: F401  (registers its view classes)
from popart._internal.ir._views import popxl_object, view_of
from popart._internal.ir.bwdgraphinfo import BwdGraphInfo, ExpectedConnection, ExpectedConnectionType
from popart._internal.ir.custom_op import (CollectiveOperator, CustomOp, OperatorIdentifier, OptionalVGraphId,
                                           ParameterizedOp, ReplicaGrouping, Settings)
from popart._internal.ir.graph import Graph, GraphId, TopoCons
from popart._internal.ir.ir import ExecutionContext, Ir, IrSessionOptions
from popart._internal.ir.op import Op
from popart._internal.ir.session import Session
from popart._internal.ir.tensor import Consumers, Tensor, TensorInfo
from popxl.tensorlocation import TileSet

from popart._internal.ir import _factory  # noqa: F401  (registers the views with popxl's core: popxl._pb)

__all__ = ["op", "patterns", "view", "view_of", "popxl_object", "BwdGraphInfo", "ExpectedConnection",
           "ExpectedConnectionType", "Graph", "GraphId", "TopoCons", "ExecutionContext", "Ir", "IrSessionOptions",
           "Op", "Session", "Tensor", "TensorInfo", "Consumers", "Settings", "CustomOp", "ParameterizedOp",
           "OperatorIdentifier", "OptionalVGraphId", "CollectiveOperator", "ReplicaGrouping", "TileSet"]
