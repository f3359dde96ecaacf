"""`popxl.Module`: a reusable piece of graph, traced by ``ir.create_graph(module, ...)``."""
from typing import Any

__all__ = ["Module"]


class Module:
    """A reusable piece of a model: subclass it and define ``build``.

    Calling the module calls ``build``; ``ir.create_graph(module, ...)`` traces ``build`` into a new
    graph named after the class. ``build`` usually stores its ``popxl.graph_input`` weights on
    ``self`` so callers can bind them: ``ops.call(g, x, inputs_dict={m.W: W})``.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.build(*args, **kwargs)

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """The module's computation; subclasses define it.

        Args:
            *args: The module's inputs.
            **kwargs: The module's keyword inputs.

        Returns:
            Whatever the subclass returns: None, a Tensor or tensors.

        Raises:
            NotImplementedError: If the subclass does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__} must define build().")
