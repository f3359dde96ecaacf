"""Tracing context: which graph ops go into, and the placement/naming state around them.

PopXL keeps one global context. Entering a graph (``with g:``) pushes it; ops created while
a graph is current are appended to it at once (eager tracing).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Literal, Optional, TypeVar, Union, cast, overload

from popxl import _pb
from popxl.tensorlocation import ExecutionContext

if TYPE_CHECKING:  # pragma: no cover
    from popxl.graph import Graph
    from popxl.ir import Ir
    from popxl.op import Op

__all__ = [
    "Context", "get_current_context", "get_current_graph", "get_main_graph", "get_ir", "gcg", "gmg",
    "gir", "in_sequence", "name_scope", "ipu", "io_tiles", "op_debug_context",
    "debug_context_frame_offset",
]

_Fn = TypeVar("_Fn", bound=Callable[..., Any])  # a decorated function, its type kept


class OpCreatedHooks:
    """Callbacks called with every op created: the context's for ops anywhere, a graph's for its
    own. The class using it calls ``_init_hooks`` when it is made."""

    _hooks: Dict[int, Callable[["Op"], None]]
    _hook_ids: Iterator[int]

    def _init_hooks(self) -> None:
        self._hooks = {}
        self._hook_ids = itertools.count(1)

    def _hooks_owner(self) -> str:
        """Whose hooks these are, for error messages ("" or " on graph 'g'")."""
        return ""

    def register_op_created_hook(self, fn: Callable[["Op"], None]) -> int:
        """Call a function with every op created in this graph from now on.

        Args:
            fn: Called with each new op.

        Returns:
            A handle for `remove_op_created_hook`.
        """
        handle = next(self._hook_ids)
        self._hooks[handle] = fn
        return handle

    def remove_op_created_hook(self, handle: int) -> None:
        """Stop calling a hook registered with `register_op_created_hook`.

        Args:
            handle: The hook's handle.

        Raises:
            ValueError: If no hook has that handle.
        """
        if handle not in self._hooks:
            raise ValueError(f"No op-created hook with handle {handle}{self._hooks_owner()}.")
        del self._hooks[handle]

    def _op_created(self, op: "Op") -> None:
        for fn in list(self._hooks.values()):
            fn(op)


class Context(OpCreatedHooks):
    """The tracing state: graph stack, placement, name scopes, in-sequence mode, op hooks."""

    # popxl.op.Op, set by popxl.op (which imports this module) when it defines the class: the ops
    # ``_op_created`` takes, besides PopART's views of them.
    _op_class: type = type(None)

    def __init__(self) -> None:
        self._graphs: List["Graph"] = []
        self.ipu_id: int = 0
        self.io_tile_set: bool = False
        self.name_scopes: List[str] = []
        # Stack of in_sequence modes; the schedule is creation order, which honours any mode.
        self._in_sequence: List[Union[bool, str]] = []
        self._init_hooks()
        self.debug_frame_offset: int = 0
        self.execution_context: Any = None  # set by _execution_context (an ExecutionContext)

    # graphs -----------------------------------------------------------------------------------
    @property
    def graph(self) -> "Graph":
        """The current graph (the top of the graph stack).

        Raises:
            RuntimeError: If no graph is entered.
        """
        if not self._graphs:
            raise RuntimeError(
                "No graph is being traced. Enter one first, e.g. `with ir.main_graph:`.")
        return self._graphs[-1]

    @property
    def main_graph(self) -> "Graph":
        """The main graph of the current graph's Ir."""
        return self.graph.ir.main_graph

    @property
    def ir(self) -> "Ir":
        """The Ir of the current graph."""
        return self.graph.ir

    def push_graph(self, g: "Graph") -> None:
        """Make a graph the current graph (what ``with graph:`` does).

        Args:
            g: The graph entered.

        Raises:
            RuntimeError: If ``g`` belongs to another Ir than the graphs already entered.
        """
        if self._graphs and self._graphs[-1].ir is not g.ir:
            raise RuntimeError(
                f"Cannot enter {g!r} of {g.ir!r} while {self._graphs[-1]!r} of "
                f"{self._graphs[-1].ir!r} is being traced: graphs of different IRs cannot be mixed.")
        self._graphs.append(g)

    def pop_graph(self) -> "Graph":
        """Leave the current graph.

        Returns:
            The graph left.
        """
        return self._graphs.pop()

    def _op_created(self, op: "Op") -> None:
        """Run the hooks for a new op: the context's, then its graph's. ``op`` may be PopART's view
        of the op (custom ops' Python wrappers call this with what ``createOpInGraph`` returned)."""
        if not isinstance(op, self._op_class):
            op = _pb.popxl_object(op, self._op_class)
        super()._op_created(op)
        op.graph._op_created(op)

    def _get_op_settings(self, name: str) -> Any:
        """PopART's settings for an op made by ``createOpInGraph`` in the current graph: its name
        (under the current name scopes), IPU, tile set and execution context."""
        return _pb.op_settings(self, name)

    @property
    def in_sequence(self) -> Optional[Union[bool, str]]:
        """The innermost ``in_sequence`` mode, or None outside any."""
        return self._in_sequence[-1] if self._in_sequence else None

    @property
    def scope_prefix(self) -> str:
        """The current name scopes joined, each followed by ``/``."""
        return "".join(s + "/" for s in self.name_scopes)

    def _add_in_sequence_topocons(self, op: "Op") -> None:
        """PopXL orders an op after the previous one here when ``in_sequence`` is on. Our schedule
        is creation order, which already does so: nothing to add (kept for callers of PopXL's)."""


_CONTEXT = Context()


def get_current_context() -> Context:
    """The global tracing state (graph stack, placement, name scopes, hooks).

    Returns:
        The `Context`.
    """
    return _CONTEXT


def get_current_graph() -> "Graph":
    """The graph ops are currently added to (``gcg`` is the same function).

    Returns:
        The innermost entered graph.

    Raises:
        RuntimeError: If no graph is entered.
    """
    return _CONTEXT.graph


def get_main_graph() -> "Graph":
    """The main graph of the Ir being traced (``gmg`` is the same function).

    Returns:
        The main graph.

    Raises:
        RuntimeError: If no graph is entered.
    """
    return _CONTEXT.main_graph


def get_ir() -> "Ir":
    """The Ir being traced (``gir`` is the same function).

    Returns:
        The Ir of the current graph.

    Raises:
        RuntimeError: If no graph is entered.
    """
    return _CONTEXT.ir


gcg = get_current_graph
gmg = get_main_graph
gir = get_ir


@contextlib.contextmanager
def in_sequence(mode: Union[bool, Literal["pass"]] = True) -> Iterator[None]:
    """Ops created inside run in creation order (True), in any order (False) or as outside ("pass").

    Our scheduler always runs ops in creation order, which satisfies all three modes; the mode
    is still validated and recorded so transforms can see it.

    Args:
        mode: True (creation order), False (any order) or "pass" (record nothing).

    Returns:
        A context manager.

    Raises:
        TypeError: If ``mode`` is not True, False or "pass".
    """
    if mode is None or not (isinstance(mode, bool) or mode == "pass"):
        raise TypeError(f"in_sequence mode must be True, False or 'pass', not {mode!r}.")
    _CONTEXT._in_sequence.append(mode)
    try:
        yield
    finally:
        _CONTEXT._in_sequence.pop()


@contextlib.contextmanager
def name_scope(name: str) -> Iterator[None]:
    """Prefix the names of ops and tensors created inside with ``name/`` (nests).

    Args:
        name: The scope's name.

    Returns:
        A context manager.
    """
    _CONTEXT.name_scopes.append(str(name))
    try:
        yield
    finally:
        _CONTEXT.name_scopes.pop()


@contextlib.contextmanager
def ipu(ipu: int) -> Iterator[None]:
    """Place ops created inside on virtual IPU ``ipu``.

    Args:
        ipu: The virtual IPU number.

    Returns:
        A context manager.

    Raises:
        ValueError: If ``ipu`` is not a non-negative int.
    """
    if not isinstance(ipu, int) or ipu < 0:
        raise ValueError(f"ipu must be a non-negative int, not {ipu!r}.")
    prev, _CONTEXT.ipu_id = _CONTEXT.ipu_id, ipu
    try:
        yield
    finally:
        _CONTEXT.ipu_id = prev


@contextlib.contextmanager
def io_tiles() -> Iterator[None]:
    """Place ops created inside on the IO tiles.

    Returns:
        A context manager.
    """
    prev, _CONTEXT.io_tile_set = _CONTEXT.io_tile_set, True
    try:
        yield
    finally:
        _CONTEXT.io_tile_set = prev


@contextlib.contextmanager
def _execution_context(execution_context: "ExecutionContext") -> Iterator["ExecutionContext"]:
    """PopXL's (private) switch of the program part that ops created inside belong to. ``Normal``
    (the program ``Session.run`` runs) and ``Subgraph`` change nothing here. Main-graph ops made
    in ``WeightsFromHostFragment`` run at the start of every ``Session.run``, those made in
    ``WeightsToHostFragment`` at its end (PopART runs them when weights go to and come from the
    device; for state loaded into a tensor and stored back, as popxl-addons' ``seed_variable``
    does, the results are the same: see popxl.transforms.fragments). The optimizer fragment and
    the outer accumulation loop are not supported: NotImplementedError names the part at once,
    before any op is placed wrongly. ``execution_context`` is a ``popxl.ExecutionContext`` or an
    enum with the same member names (PopART's binding)."""
    name = getattr(execution_context, "name", None)
    if not isinstance(name, str) or name not in ExecutionContext.__members__:
        raise TypeError(f"_execution_context: expected a popxl.ExecutionContext, not {execution_context!r}.")
    mode = ExecutionContext[name]
    if mode in (ExecutionContext.AccumulateOuterFragment, ExecutionContext.OptimizerFromHostFragment):
        raise NotImplementedError(
            f"_execution_context({mode.name}): ops that run outside the main program (in the {mode.name}) "
            f"are not supported by popxl-cpu; create them in the main graph's normal program.")
    prev, _CONTEXT.execution_context = _CONTEXT.execution_context, mode
    try:
        yield execution_context
    finally:
        _CONTEXT.execution_context = prev


def debug_context_frame_offset(i: int) -> Callable[[_Fn], _Fn]:
    """Decorator: skip ``i`` more frames when attributing ops to the user's source line.

    Args:
        i: How many more stack frames to skip.

    Returns:
        A decorator that keeps the decorated function's signature.
    """

    def wrap(fn: _Fn) -> _Fn:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            _CONTEXT.debug_frame_offset += i
            try:
                return fn(*args, **kwargs)
            finally:
                _CONTEXT.debug_frame_offset -= i

        return cast(_Fn, inner)

    return wrap


# Bare (``@op_debug_context``) or named (``@op_debug_context("name")``): either way the decorated
# function keeps its own signature for type checkers.
@overload
def op_debug_context(name_or_fn: _Fn) -> _Fn: ...


@overload
def op_debug_context(name_or_fn: Optional[str] = None) -> Callable[[_Fn], _Fn]: ...


def op_debug_context(name_or_fn: Union[_Fn, str, None] = None) -> Union[_Fn, Callable[[_Fn], _Fn]]:
    """Decorator for op functions (bare or with a name). Source lines are found from the stack,
    so this only marks the function; kept for API compatibility with PopXL client code.

    Args:
        name_or_fn: The decorated function (bare use), or a name (``@op_debug_context("name")``).

    Returns:
        The function itself (bare use), or a decorator returning its function unchanged.
    """
    if callable(name_or_fn):
        return name_or_fn

    def wrap(fn: _Fn) -> _Fn:
        return fn

    return wrap
