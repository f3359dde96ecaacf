"""PopART's internal IR (``popart._internal.ir``) as popxl's core reaches it.

Code written against PopXL's internals (popxl-addons) reaches PopART's IR through popxl objects:
``ir._pb_ir``, ``graph._pb_graph``, ``tensor._pb_tensor``, ``session._pb_session``,
``group._pb_replica_grouping``, PopART's methods on a popxl ``Op``, ``ctx._get_op_settings``. Here
those are views, the classes of ``popart._internal.ir``: the compatibility layer, at the top of the
layers (docs/architecture.md), which popxl never imports. It registers how its views are made
when it is imported (``register``); ``import popxl`` registers a loader that imports it the first
time one is asked for (``set_loader``), so to a program every view is there.

What the core needs of that layer besides lives here, and ``popart._internal.ir`` re-exports it:
the views' base class ``View``, ``view_of`` (the one view of a popxl object) and ``popxl_object``
(the popxl object a view shows), and PopART's plain records of gradient graphs (``GraphId``,
``ExpectedConnectionType``, ``ExpectedConnection``, ``BwdGraphInfo``) that
``popxl.GradGraphInfo`` converts from and to.
"""
from __future__ import annotations

import builtins
from enum import Enum
from typing import Any, Callable, Dict, Iterable, List, Optional, Type, TypeVar

__all__ = ["View", "view_of", "popxl_object", "replica_grouping_view", "op_settings", "register", "set_loader", "load",
           "GraphId", "ExpectedConnectionType", "ExpectedConnection", "BwdGraphInfo"]

T = TypeVar("T")

_PROVIDER = "popart._internal.ir"
# How the compatibility layer makes its views (``register``): "view" (of an Ir, Graph, Op, Tensor
# or Session), "replica_grouping" and "op_settings".
_FACTORIES: Dict[str, Callable[..., Any]] = {}
_loader: Optional[Callable[[], None]] = None


def register(**factories: Callable[..., Any]) -> None:
    """Called by ``popart._internal.ir`` when it is imported: how its views are made."""
    _FACTORIES.update(factories)


def set_loader(load: Callable[[], None]) -> None:
    """Called by ``import popxl``: ``load()`` imports the compatibility layer (which registers)."""
    global _loader
    _loader = load


def load() -> None:
    """Have the compatibility layer imported (through the loader ``import popxl`` set), if it is not yet."""
    if not _FACTORIES and _loader is not None:
        _loader()


def _factory(name: str) -> Callable[..., Any]:
    make = _FACTORIES.get(name)
    if make is None:
        load()
        make = _FACTORIES.get(name)
    if make is None:
        raise RuntimeError(f"PopART's views of popxl objects come from {_PROVIDER}, which has not registered "
                           f"them: import {_PROVIDER} (import popxl loads it when a view is first asked for).")
    return make


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
        view = _factory("view")(obj)
        obj.__dict__["_pb_view"] = view
    return view


def popxl_object(obj: Any, cls: Type[T]) -> T:
    """The popxl object of class ``cls`` that ``obj`` is or shows (a view of it)."""
    if isinstance(obj, View):
        obj = obj._popxl_for_unwrap()
    if not isinstance(obj, cls):
        raise TypeError(f"expected a popxl.{cls.__name__} or its popart._internal.ir view, not "
                        f"{type(obj).__name__} ({obj!r}).")
    return obj


def replica_grouping_view(group: Any) -> Any:
    """PopART's view of a popxl.ReplicaGrouping (what custom ops' bindings take); a new one each time."""
    return _factory("replica_grouping")(group)


def op_settings(context: Any, name: str) -> Any:
    """PopART's settings of an op ``createOpInGraph`` makes under the tracing ``context``."""
    return _factory("op_settings")(context, name)


# PopART's records of gradient graphs: plain data, tensor and graph ids ---------------------------------
class GraphId:
    """A graph's id: a string (the main graph's is empty). Equal to the str it holds."""

    def __init__(self, value: Any) -> None:
        if isinstance(value, GraphId):
            value = value._id
        if not isinstance(value, str):
            raise TypeError(f"GraphId: expected a str, not {type(value).__name__} ({value!r}).")
        self._id: builtins.str = value

    def str(self) -> builtins.str:  # PopART's name (a method named str: hence builtins.str here)
        return self._id

    def __str__(self) -> builtins.str:
        return self._id

    def __repr__(self) -> builtins.str:
        return f"GraphId({self._id!r})"

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, (GraphId, str)):
            return self._id == str(other)
        return NotImplemented

    def __lt__(self, other: "GraphId") -> bool:
        return self._id < GraphId(other)._id

    def __hash__(self) -> int:
        return hash(self._id)


class ExpectedConnectionType(Enum):
    """Whether a gradient-graph input or output is a forward tensor or the gradient of one."""
    Fwd = 0
    FwdGrad = 1


class ExpectedConnection:
    """One gradient-graph input or output: ``fwdId``, the id of a forward-graph tensor, and
    ``type``, whether the value is that tensor (Fwd) or its gradient (FwdGrad)."""

    def __init__(self, fwdId: Any, type: ExpectedConnectionType) -> None:
        if not isinstance(type, ExpectedConnectionType):
            raise TypeError(f"ExpectedConnection: type must be an ExpectedConnectionType, not {type!r}.")
        self.fwdId = _tensor_id(fwdId, "ExpectedConnection")
        self.type = type

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ExpectedConnection) and (self.fwdId, self.type) == (other.fwdId, other.type)

    def __hash__(self) -> int:
        return hash((self.fwdId, self.type))

    def __repr__(self) -> str:
        return f"ExpectedConnection({self.fwdId!r}, {self.type.name})"


class BwdGraphInfo:
    """A gradient graph's id and the forward tensors its inputs and outputs are connected to."""

    def __init__(self, bwdGraphId: Any, expectedInputs: Iterable[ExpectedConnection],
                 expectedOutputs: Iterable[ExpectedConnection]) -> None:
        self.bwdGraphId = GraphId(bwdGraphId)
        self.expectedInputs: List[ExpectedConnection] = _connections(expectedInputs, "expectedInputs")
        self.expectedOutputs: List[ExpectedConnection] = _connections(expectedOutputs, "expectedOutputs")

    def __repr__(self) -> str:
        return (f"BwdGraphInfo({self.bwdGraphId!r}, expectedInputs={self.expectedInputs}, "
                f"expectedOutputs={self.expectedOutputs})")


def _tensor_id(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: a tensor id must be a str, not {type(value).__name__} ({value!r}).")
    return value


def _connections(items: Iterable[ExpectedConnection], what: str) -> List[ExpectedConnection]:
    items = list(items)
    for c in items:
        if not isinstance(c, ExpectedConnection):
            raise TypeError(f"BwdGraphInfo: {what} must hold ExpectedConnection objects, not {c!r}.")
    return items
