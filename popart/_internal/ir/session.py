"""``Session``: PopART's session object behind a popxl.Session (``session._pb_session``)."""
from __future__ import annotations

from typing import Any, Dict

from popxl.errors import popart_exception

from popart._internal.ir._views import View
from popart.dataflow import PyWeightsIO

__all__ = ["Session"]


class Session(View):
    """The engine-side calls popxl-addons makes on a popxl.Session's PopART session."""

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._engine_loaded = False

    def __repr__(self) -> str:
        return f"<popart._internal.ir.Session of {self._popxl!r}>"

    def setEngineIsLoaded(self, loaded: bool) -> None:
        """Record whether PopART would consider its engine loaded on the device. On the CPU the
        engine is loaded when the session attaches, so the flag changes nothing; it is kept for
        ``getEngineIsLoaded``."""
        if not isinstance(loaded, bool):
            raise TypeError(f"Session.setEngineIsLoaded: expected a bool, not {loaded!r}.")
        self._engine_loaded = loaded

    def getEngineIsLoaded(self) -> bool:
        return self._engine_loaded

    def weightsFromHost(self) -> None:
        """Copy every variable's host value to the device (the session must be attached)."""
        self._popxl.weights_from_host()

    def weightsToHost(self) -> None:
        self._popxl.weights_to_host()

    def _variables(self, weights_io: Any, where: str) -> Dict[Any, Any]:
        if not isinstance(weights_io, PyWeightsIO):
            raise TypeError(f"Session.{where}: expected a popart.PyWeightsIO, not {type(weights_io).__name__}.")
        by_id = {v.id: v for v in self._popxl.ir.main_graph.variables}
        unknown = [k for k in weights_io.weights if k not in by_id]
        if unknown:
            raise popart_exception(f"Session.{where}: {unknown} are not variables of the session's Ir "
                                   f"(its variables: {sorted(by_id)}).")
        return {by_id[k]: a for k, a in weights_io.weights.items()}

    def writeWeights(self, weights_io: PyWeightsIO) -> None:
        """Set the host values of the variables named in ``weights_io``; the device gets them at
        the next ``weightsFromHost``."""
        self._popxl._write_variables_data(self._variables(weights_io, "writeWeights"), to_device=False)

    def readWeights(self, weights_io: PyWeightsIO) -> None:
        """Copy the host values of the variables named in ``weights_io`` into its arrays."""
        wanted = self._variables(weights_io, "readWeights")
        values = self._popxl.get_tensors_data(list(wanted))
        for var, out in wanted.items():
            out[...] = values[var]
