"""`popxl.Graph`: an ordered list of ops with inputs and outputs, entered with ``with g:``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from popxl.context import OpCreatedHooks, get_current_context

if TYPE_CHECKING:  # pragma: no cover
    from popxl.ir import Ir
    from popxl.op import Op
    from popxl.tensor import Constant, Tensor, Variable

__all__ = ["Graph"]


class Graph(OpCreatedHooks):
    """A graph of the IR. Made by ``Ir.create_graph`` / ``Ir.create_empty_graph``, never directly."""

    def __init__(self) -> None:
        raise TypeError("popxl.Graph cannot be constructed directly: use ir.create_graph(fn, ...) "
                        "or ir.create_empty_graph(name).")

    @classmethod
    def _create(cls, ir: "Ir", graph_id: str, name: str) -> "Graph":
        g = object.__new__(cls)
        g._ir = ir
        g._id = graph_id
        g._name = name
        g._ops: List["Op"] = []
        g._tensors: Dict[str, "Tensor"] = {}
        g._inputs: List["Tensor"] = []
        g._outputs: List["Tensor"] = []
        g._by_ref_inputs: Set["Tensor"] = set()
        g._init_hooks()
        return g

    @property
    def _tensor_prefix(self) -> str:
        return "" if self is self._ir.main_graph else self._id + "/"

    def _new_tensor_id(self, name: str) -> str:
        tid = self._tensor_prefix + name
        while tid in self._tensors:
            tid = f"{self._tensor_prefix}{name}__t{next(self._ir._tensor_counter)}"
        return tid

    # public properties ----------------------------------------------------------------------------
    @property
    def ir(self) -> "Ir":
        return self._ir

    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        return self._name

    @property
    def main_graph(self) -> "Graph":
        return self._ir.main_graph

    @property
    def inputs(self) -> Tuple["Tensor", ...]:
        return tuple(self._inputs)

    @property
    def inputs_by_name(self) -> Dict[str, "Tensor"]:
        return {t.name: t for t in self._inputs}

    @property
    def outputs(self) -> Tuple["Tensor", ...]:
        return tuple(self._outputs)

    @property
    def tensors(self) -> Tuple["Tensor", ...]:
        return tuple(self._tensors.values())

    @property
    def variables(self) -> Tuple["Variable", ...]:
        from popxl.tensor import Variable
        return tuple(t for t in self._tensors.values() if isinstance(t, Variable))

    @property
    def constants(self) -> Tuple["Constant", ...]:
        from popxl.tensor import Constant
        return tuple(t for t in self._tensors.values() if isinstance(t, Constant))

    @property
    def ops(self) -> Tuple["Op", ...]:
        return tuple(self._ops)

    @property
    def called_graphs(self) -> Tuple["Graph", ...]:
        seen: Dict[str, Graph] = {}
        for op in self._ops:
            for g in op_called_graphs(op):
                seen.setdefault(g.id, g)
        return tuple(seen.values())

    def is_input_by_ref(self, t: "Tensor") -> bool:
        return t in self._by_ref_inputs

    def get_tensor(self, tensor_id: str) -> "Tensor":
        try:
            return self._tensors[tensor_id]
        except KeyError:
            raise KeyError(f"No tensor with id {tensor_id!r} in graph {self._id!r}.") from None

    # hooks (OpCreatedHooks) ------------------------------------------------------------------------
    def _hooks_owner(self) -> str:
        return f" on graph {self._id!r}"

    # protocol -------------------------------------------------------------------------------------
    def __contains__(self, t: Any) -> bool:
        from popxl.tensor import Tensor
        if not isinstance(t, Tensor):
            raise TypeError(f"`in` on a Graph needs a popxl.Tensor, not {type(t).__name__}.")
        return t.graph is self

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Graph):
            raise TypeError(f"Cannot compare a Graph with {type(other).__name__}.")
        return self is other

    def __hash__(self) -> int:
        return hash((self._ir.id, self._id))

    def __repr__(self) -> str:
        if self is self._ir.main_graph:  # its id is empty: say which graph it is
            return f"Graph[id='' (main graph) name={self._name}]"
        return f"Graph[id={self._id} name={self._name}]"

    def __str__(self) -> str:
        """A typed listing: one line per op, the bodies of called graphs nested (popxl.visualize)."""
        from popxl.visualize.listing import graph_listing
        return graph_listing(self)

    def _repr_svg_(self) -> Optional[str]:
        """Jupyter shows a graph as a picture (popxl.visualize.to_svg for options)."""
        from popxl.visualize.render import repr_svg
        return repr_svg(self)

    def __enter__(self) -> "Graph":
        get_current_context().push_graph(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        get_current_context().pop_graph()


def op_called_graphs(op: "Op") -> List[Graph]:
    """The graphs an op calls (its attrs hold them under ``graph`` / ``then_graph`` / ``else_graph``)."""
    return [v for k, v in op.attrs.items() if isinstance(v, Graph)]
