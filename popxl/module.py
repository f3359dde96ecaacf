"""`popxl.Module`: a reusable piece of graph, traced by ``ir.create_graph(module, ...)``."""
from typing import Any

__all__ = ["Module"]


class Module:
    """Subclass and define ``build``. Calling the module calls ``build``; ``ir.create_graph(m, ...)``
    traces ``build`` into a new graph named after the class."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.build(*args, **kwargs)

    def build(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define build().")
