"""Views: each popxl object (Ir, Graph, Op, Tensor, Session) has one PopART-style view, made on
first use and kept on the object, so wrapping twice gives the same view and unwrapping always
gives back the same popxl object."""
from __future__ import annotations

from typing import Any, Type, TypeVar

__all__ = ["View", "view_of", "popxl_object"]

T = TypeVar("T")


class View:
    """A PopART-style view of one popxl object (``_popxl``). Views compare equal to each other and
    to the popxl object they show, and hash like it, so they can be looked up in dicts keyed by
    either (op-created hooks hand out popxl ops; PopART's calls return views)."""

    _popxl: Any

    def __init__(self, obj: Any) -> None:
        self._popxl = obj

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, View):
            return self._popxl is other._popxl
        return self._popxl is other

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._popxl)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"{type(self).__name__} (a view of the popxl IR) cannot be pickled or copied.")

    def _popxl_for_unwrap(self) -> Any:
        """The popxl object shown (an op cloned into a graph but not yet connected makes it now)."""
        return self._popxl


def view_of(obj: Any) -> Any:
    """The view of a popxl Ir, Graph, Op, Tensor or Session (made once, then the same object)."""
    view = obj.__dict__.get("_pb_view")
    if view is None:
        view = _new_view(obj)
        obj.__dict__["_pb_view"] = view
    return view


def _new_view(obj: Any) -> View:
    from popxl.graph import Graph as XlGraph
    from popxl.ir import Ir as XlIr
    from popxl.op import Op as XlOp
    from popxl.session import Session as XlSession
    from popxl.tensor import Tensor as XlTensor

    if isinstance(obj, XlTensor):
        from popart._internal.ir.tensor import Tensor
        return Tensor(obj)
    if isinstance(obj, XlOp):
        from popart._internal.ir.op import view_class
        return view_class(obj.type)(obj)
    if isinstance(obj, XlGraph):
        from popart._internal.ir.graph import Graph
        return Graph(obj)
    if isinstance(obj, XlIr):
        from popart._internal.ir.ir import Ir
        return Ir(obj)
    if isinstance(obj, XlSession):
        from popart._internal.ir.session import Session
        return Session(obj)
    raise TypeError(f"popart._internal.ir has no view of {type(obj).__name__} objects.")


def popxl_object(obj: Any, cls: Type[T]) -> T:
    """The popxl object of class ``cls`` that ``obj`` is or shows (a view of it)."""
    if isinstance(obj, View):
        obj = obj._popxl_for_unwrap()
    if not isinstance(obj, cls):
        raise TypeError(f"expected a popxl.{cls.__name__} or its popart._internal.ir view, not "
                        f"{type(obj).__name__} ({obj!r}).")
    return obj
