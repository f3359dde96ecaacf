"""What popxl's core calls in the layers above it, filled in by those layers when they are imported.

The core (tensors, graphs, ops, the Ir) is the bottom layer (docs/architecture.md, .importlinter):
it imports no layer above it. Where it offers something that a layer above implements, it calls
a hook here, which that layer sets when it is imported; ``import popxl`` imports every layer, so
to a program every hook is set:

- ``ops`` and ``getitem``: ``popxl.ops``, for Tensor's operators and methods (``t + 1``, ``t @ w``,
  ``t[i]``, ``t.T``, ``t.reshape(...)`` ...);
- ``graph_listing``, ``ir_listing``, ``repr_svg`` and ``dot_checkpoint``: ``popxl.visualize``, for
  ``str(graph)``, ``str(ir)``, Jupyter's pictures and ``Ir.dot_checkpoint``;
- ``popdist_launch``: ``popxl.distributed``, for ``Ir(replication="popdist")``.

PopART's views of popxl objects (``_pb_graph`` ...) are registered the same way, in ``popxl._pb``.
"""
from __future__ import annotations

from typing import Any, Callable, NoReturn, Optional, Tuple

__all__ = ["ops", "getitem", "graph_listing", "ir_listing", "repr_svg", "dot_checkpoint", "popdist_launch"]


class _Unset:
    """A hook its layer has not set: using it says which module sets it."""

    def __init__(self, what: str, provider: str) -> None:
        self._what, self._provider = what, provider

    def _error(self) -> RuntimeError:
        return RuntimeError(f"{self._what} come from {self._provider}, which is not imported yet: import it "
                            f"(import popxl imports it).")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise self._error()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._error()

    def __repr__(self) -> str:
        return f"<unset hook: {self._what} ({self._provider})>"


# popxl.ops: the module itself (Tensor's methods call its ops by name), and ``t[key]``.
ops: Any = _Unset("Tensor's operators and methods (they trace ops)", "popxl.ops")
getitem: Callable[[Any, Any], Any] = _Unset("Tensor indexing (t[key])", "popxl.ops")

# popxl.visualize
graph_listing: Callable[[Any], str] = _Unset("Graph listings (str(graph))", "popxl.visualize")
ir_listing: Callable[[Any], str] = _Unset("Ir listings (str(ir))", "popxl.visualize")
repr_svg: Callable[[Any], Optional[str]] = _Unset("Pictures of graphs (_repr_svg_)", "popxl.visualize")
dot_checkpoint: Callable[[Any, str, Any], Any] = _Unset("DOT checkpoints (Ir.dot_checkpoint)", "popxl.visualize")

# popxl.distributed: (this instance's replicas, its index, the instance count) of the launch
popdist_launch: Callable[[], Tuple[int, int, int]] = _Unset("Launches of several instances (Ir(replication='popdist'))",
                                                            "popxl.distributed")
