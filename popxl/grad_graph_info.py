"""How a gradient graph connects to its forward graph: `GradGraphInfo` (what
`popxl.transforms.autodiff` returns), its `ExpectedConnection` records and their
`ExpectedConnectionType`. Records of the core, below both the transform that makes them and the
gradient rules of popxl.ops that read them (a call's gradient calls the called graph's gradient
graph); ``popxl.transforms`` (and ``popxl.transforms.autodiff``) export them, as in PopXL.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, Dict, Sequence, Tuple

from popxl import _pb
from popxl.graph import Graph
from popxl.ir import Ir
from popxl.tensor import Tensor

__all__ = ["GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType"]


class ExpectedConnectionType(Enum):
    """Whether a gradient graph's input or output is a forward tensor (``Fwd``) or a gradient of one (``FwdGrad``)."""
    Fwd = "Fwd"
    FwdGrad = "FwdGrad"

    @classmethod
    def _from_pb(cls, type_: Any) -> "ExpectedConnectionType":
        """From `popart._internal.ir.ExpectedConnectionType`."""
        return cls(type_.name)

    def _to_pb(self) -> Any:
        return _pb.ExpectedConnectionType[self.name]


class ExpectedConnection:
    """One input or output of a gradient graph: a forward tensor, or the gradient of one.

    Not constructible: read them from `GradGraphInfo`.

    Raises:
        TypeError: If constructed directly.
    """

    _fwd_tensor: Tensor
    _connection_type: ExpectedConnectionType

    def __init__(self) -> None:
        raise TypeError("ExpectedConnection is made by autodiff, not constructed directly.")

    @classmethod
    def _create(cls, fwd_tensor: Tensor, connection_type: ExpectedConnectionType) -> "ExpectedConnection":
        c = object.__new__(cls)
        c._fwd_tensor, c._connection_type = fwd_tensor, connection_type
        return c

    @classmethod
    def _from_pb(cls, fwd_graph: Any, pb_ec: Any) -> "ExpectedConnection":
        """From a `popart._internal.ir.ExpectedConnection` (a forward tensor id and a type) of the
        forward graph ``fwd_graph`` (a popxl.Graph or its ``_pb_graph``)."""
        graph = _pb.popxl_object(fwd_graph, Graph)
        if not isinstance(pb_ec, _pb.ExpectedConnection):
            raise TypeError(f"ExpectedConnection._from_pb: expected a popart._internal.ir.ExpectedConnection, "
                            f"not {type(pb_ec).__name__}.")
        c = cls._create(graph.get_tensor(pb_ec.fwdId), ExpectedConnectionType._from_pb(pb_ec.type))
        c._pb = pb_ec
        return c

    @property
    def _pb_ec(self) -> Any:
        """This connection as a `popart._internal.ir.ExpectedConnection`."""
        if getattr(self, "_pb", None) is None:
            self._pb = _pb.ExpectedConnection(self._fwd_tensor.id, self._connection_type._to_pb())
        return self._pb

    @property
    def fwd_tensor(self) -> Tensor:
        """The forward-graph tensor this connection is (or is the gradient of)."""
        return self._fwd_tensor

    @property
    def connection_type(self) -> ExpectedConnectionType:
        """``Fwd`` (the forward value itself) or ``FwdGrad`` (its gradient)."""
        return self._connection_type

    def __repr__(self) -> str:
        return f"({self._connection_type.name}, {self._fwd_tensor})"


class GradGraphInfo:
    """A gradient graph and how to connect it: which forward tensors (or their gradients) its
    inputs expect, and which forward tensors its outputs are the gradients of.

    Returned by `autodiff`; not constructible.

    Raises:
        TypeError: If constructed directly.
    """

    _graph: Graph
    _forward_graph: Graph
    _expected_inputs: Tuple[ExpectedConnection, ...]
    _expected_outputs: Tuple[ExpectedConnection, ...]

    def __init__(self) -> None:
        raise TypeError("GradGraphInfo is returned by popxl.transforms.autodiff, not constructed directly.")

    @classmethod
    def _create(cls, graph: Graph, forward_graph: Graph, expected_inputs: Sequence[ExpectedConnection],
                expected_outputs: Sequence[ExpectedConnection]) -> "GradGraphInfo":
        info = object.__new__(cls)
        info._graph, info._forward_graph = graph, forward_graph
        info._expected_inputs, info._expected_outputs = tuple(expected_inputs), tuple(expected_outputs)
        return info

    @classmethod
    def _from_pb(cls, ir: Any, fwd_graph: Any, pb_bwd_info: Any) -> "GradGraphInfo":
        """From a `popart._internal.ir.BwdGraphInfo` (gradient graph id and expected connections)
        of ``fwd_graph``; ``ir`` and ``fwd_graph`` are popxl objects or their ``_pb_`` views."""
        if not isinstance(pb_bwd_info, _pb.BwdGraphInfo):
            raise TypeError(f"GradGraphInfo._from_pb: expected a popart._internal.ir.BwdGraphInfo, "
                            f"not {type(pb_bwd_info).__name__}.")
        ir, fwd = _pb.popxl_object(ir, Ir), _pb.popxl_object(fwd_graph, Graph)
        if fwd.ir is not ir:
            raise ValueError(f"GradGraphInfo._from_pb: forward graph {fwd.id!r} is not a graph of {ir!r}.")
        bwd = Graph._from_pb(ir._pb_ir.getGraph(pb_bwd_info.bwdGraphId))
        return cls._create(bwd, fwd,
                           [ExpectedConnection._from_pb(fwd, c) for c in pb_bwd_info.expectedInputs],
                           [ExpectedConnection._from_pb(fwd, c) for c in pb_bwd_info.expectedOutputs])

    @property
    def graph(self) -> Graph:
        """The gradient graph."""
        return self._graph

    @property
    def forward_graph(self) -> Graph:
        """The graph it is the gradient of."""
        return self._forward_graph

    @property
    def expected_inputs(self) -> Tuple[ExpectedConnection, ...]:
        """What each gradient-graph input expects: the ``FwdGrad`` seeds first, then ``Fwd`` values."""
        return self._expected_inputs

    @property
    def expected_outputs(self) -> Tuple[ExpectedConnection, ...]:
        """What each gradient-graph output is: the gradient (``FwdGrad``) of a forward tensor."""
        return self._expected_outputs

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        """The forward tensors of `expected_inputs`."""
        return tuple(c.fwd_tensor for c in self._expected_inputs)

    @property
    def outputs(self) -> Tuple[Tensor, ...]:
        """The forward tensors whose gradients the gradient graph outputs."""
        return tuple(c.fwd_tensor for c in self._expected_outputs)

    def get_input_tensors(self) -> Tuple[Tensor, ...]:
        """The forward tensors of `expected_inputs` (PopXL's older name of `inputs`).

        Returns:
            A tuple of forward-graph tensors.
        """
        return self.inputs

    def get_output_tensors(self) -> Tuple[Tensor, ...]:
        """The forward tensors of `expected_outputs` (PopXL's older name of `outputs`).

        Returns:
            A tuple of forward-graph tensors.
        """
        return self.outputs

    def _check_site(self, info: Any, graph: Graph, what: str) -> None:
        called = getattr(info, "called_graph", None)
        if called is not graph:
            got = called.id if isinstance(called, Graph) else type(info).__name__
            raise TypeError(f"GradGraphInfo: {what} must be the CallSiteInfo of a call of {graph.id!r}, "
                            f"got a call of {got}.")

    def inputs_dict(self, fwd_call_info: Any) -> Dict[Tensor, Tensor]:
        """Gradient-graph input -> the tensor of ``fwd_call_info``'s parent graph holding that
        forward value (``Fwd`` connections only; the ``FwdGrad`` seeds are passed positionally).

        Args:
            fwd_call_info: The `CallSiteInfo` of a call of the forward graph.

        Returns:
            The ``inputs_dict`` to pass to ``ops.call`` of the gradient graph.

        Raises:
            TypeError: If the call is not of `forward_graph`.
        """
        self._check_site(fwd_call_info, self._forward_graph, "fwd_call_info")
        return {g_in: fwd_call_info.graph_to_parent(c.fwd_tensor)
                for g_in, c in zip(self._graph.inputs, self._expected_inputs)
                if c.connection_type is ExpectedConnectionType.Fwd}

    def fwd_graph_ins_to_grad_parent_outs(self, grad_call_info: Any) -> Dict[Tensor, Tensor]:
        """Forward-graph tensor -> its gradient at the parent of ``grad_call_info``.

        Args:
            grad_call_info: The `CallSiteInfo` of a call of the gradient graph.

        Returns:
            Forward-graph tensor -> its gradient in the calling graph.
        """
        self._check_site(grad_call_info, self._graph, "grad_call_info")
        return {c.fwd_tensor: grad_call_info.parent_output(i) for i, c in enumerate(self._expected_outputs)}

    def fwd_parent_ins_to_grad_parent_outs(self, fwd_call_info: Any, grad_call_info: Any) -> Dict[Tensor, Tensor]:
        """Parent tensor of the forward call -> its gradient at the parent of the gradient call.

        Args:
            fwd_call_info: The `CallSiteInfo` of a call of the forward graph.
            grad_call_info: The `CallSiteInfo` of a call of the gradient graph.

        Returns:
            Parent tensor of the forward call -> its gradient at the gradient call.
        """
        self._check_site(fwd_call_info, self._forward_graph, "fwd_call_info")
        return {fwd_call_info.graph_to_parent(f): g
                for f, g in self.fwd_graph_ins_to_grad_parent_outs(grad_call_info).items()}

    def __repr__(self) -> str:
        return (f"GradGraphInfo[graph={self._graph.id} forward_graph={self._forward_graph.id}\n"
                f"  expected_inputs={list(self._expected_inputs)}\n"
                f"  expected_outputs={list(self._expected_outputs)}]")
