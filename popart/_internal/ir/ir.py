"""``Ir``: PopART's view of a popxl.Ir (its graphs, session options and pattern settings), and
``ExecutionContext``."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, List

from popxl.errors import popart_exception
from popxl.graph import Graph as XlGraph
from popxl.logs import get_logger
from popxl.tensorlocation import ExecutionContext
from popxl.transforms.expand import replace_by_identities

from popart._internal.ir._views import View, popxl_object, view_of
from popart._internal.ir.graph import GraphId
from popart._internal.ir.inplace import apply_inplace_pattern
from popart.options import Patterns, SessionOptions, VirtualGraphMode


if TYPE_CHECKING:  # pragma: no cover
    from popart._internal.ir.graph import Graph

__all__ = ["Ir", "IrSessionOptions", "ExecutionContext"]

logger = get_logger("ir")  # PopART logs the IR on its "ir" logger


# What PopXL sets on the session options of every new Ir (PopART's own defaults differ).
_POPXL_DEFAULTS = {
    "useHostCopyOps": True, "aliasZeroCopy": True, "enableExplicitMainLoops": True,
    "explicitRecomputation": True, "enableInplaceAmbiguityChecking": True, "enableVariablesCaching": False,
    "decomposeGradSum": True,
}
CACHE_DIR_ENV = "POPXL_CACHE_DIR"


class IrSessionOptions(SessionOptions):
    """The session options of one popxl.Ir (``ir._pb_ir.getSessionOptions()``): every PopART
    option can be set and read back. ``replicatedGraphCount`` is the Ir's
    ``instance_replication_factor`` (setting it sets ``replication_factor``; in a launch of several
    instances the distributed options describe the launch); ``dotChecks`` and ``logDir`` choose which ``dot_checkpoint``
    files are written and where (``Ir.dot_checkpoint``). The others tune IPU compilation and have
    no effect here (docs/guide/internals.md lists them)."""

    def __init__(self, ir: Any) -> None:
        super().__init__()
        object.__setattr__(self, "_ir", ir)
        self._values.update(_POPXL_DEFAULTS, virtualGraphMode=VirtualGraphMode.Manual)
        index, count = ir._instances
        if count > 1:  # as PopXL sets them for Ir(replication="popdist") in a launch of several instances
            self._values.update(enableDistributedReplicatedGraphs=True, globalReplicationFactor=ir.replication_factor,
                                globalReplicaOffset=index * ir.instance_replication_factor)
        cache = os.environ.get(CACHE_DIR_ENV)
        if cache:  # as PopXL: the variable turns engine caching on (nothing is cached here)
            self._values.update(enableEngineCaching=True, cachePath=cache)

    def __getattr__(self, name: str) -> Any:
        ir = object.__getattribute__(self, "_ir")
        if name == "replicatedGraphCount":
            return ir.instance_replication_factor
        if name == "dotChecks":
            return ir._dot_checks
        if name == "logDir":
            return "" if ir._dot_save_dir is None else str(ir._dot_save_dir)
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "replicatedGraphCount":
            self._ir.replication_factor = value  # which checks the value (and that no Session owns the Ir)
        elif name == "dotChecks":
            if isinstance(value, str) or not all(isinstance(c, str) for c in value):
                raise TypeError(f"SessionOptions.dotChecks must be a set of check names, not {value!r}.")
            self._ir._dot_checks = set(value)
        elif name == "logDir":
            if not isinstance(value, (str, os.PathLike)):
                raise TypeError(f"SessionOptions.logDir must be a path, not {value!r}.")
            self._ir._dot_save_dir = Path(value) if str(value) else None
        else:
            super().__setattr__(name, value)

    def getGlobalReplicationFactor(self) -> int:
        if self.enableDistributedReplicatedGraphs:
            return self.globalReplicationFactor
        return self.getReplicationFactor()


class Ir(View):
    """PopART's ``Ir`` over a popxl.Ir: its graphs by id, session options and patterns."""

    def __init__(self, ir: Any) -> None:
        super().__init__(ir)
        self._options = IrSessionOptions(ir)
        self._patterns = Patterns()

    def __repr__(self) -> str:
        return f"<popart._internal.ir.Ir {self._popxl.id}>"

    def getId(self) -> int:
        return self._popxl.id

    # graphs ---------------------------------------------------------------------------------------
    def getMainGraph(self) -> "Graph":
        return view_of(self._popxl.main_graph)

    def getAllGraphs(self) -> List["Graph"]:
        """Every graph of the Ir, the main graph first, then the others as they were made."""
        return [view_of(g) for g in self._popxl._all_graphs()]

    def hasGraph(self, graph_id: Any) -> bool:
        gid = GraphId(graph_id)
        return any(g.id == gid for g in self._popxl._all_graphs())

    def getGraph(self, graph_id: Any) -> "Graph":
        gid = GraphId(graph_id)
        for g in self._popxl._all_graphs():
            if g.id == gid:
                return view_of(g)
        raise popart_exception(f"Ir.getGraph: {self._popxl!r} has no graph with id {gid.str()!r}.")

    # options --------------------------------------------------------------------------------------
    def getSessionOptions(self) -> IrSessionOptions:
        return self._options

    def setPatterns(self, patterns: Patterns) -> None:
        if not isinstance(patterns, Patterns):
            raise TypeError(f"Ir.setPatterns: expected a patterns.Patterns, not {type(patterns).__name__}.")
        self._patterns = patterns

    def getPatterns(self) -> Patterns:
        return self._patterns

    # patterns -------------------------------------------------------------------------------------
    # PopART's pre-alias patterns turn its gradient and compound ops into the ops it can lower, and
    # its inplace pattern makes ops write into their inputs. popxl's gradient rules already emit
    # the ops that run, and lowering places an elementwise result in the storage of an input that
    # dies there: of the pre-alias patterns only OpToIdentity has work here (popxl-addons' ops
    # that are identities but cannot run as they are, OpDef.identity_when), and the inplace
    # pattern only shows, in the views' classes, which ops PopART would make in-place.
    def applyPreAliasPatterns(self, graph: Any) -> None:
        g = self._own_graph(graph, "applyPreAliasPatterns")
        if self._patterns.isPatternEnabled("OpToIdentity"):
            replace_by_identities(g)

    def applyInplacePattern(self, graph: Any) -> None:
        """The ops PopART would make in-place get their in-place view classes
        (``popart._internal.ir.inplace``); popxl's ops are unchanged."""
        apply_inplace_pattern(self._own_graph(graph, "applyInplacePattern"))

    def _own_graph(self, graph: Any, where: str) -> Any:
        g = popxl_object(graph, XlGraph)
        if g.ir is not self._popxl:
            raise popart_exception(f"Ir.{where}: graph {g.id!r} belongs to {g.ir!r}, not to {self._popxl!r}.")
        return g

    def logIr(self) -> None:
        """Log the program's listing (popxl's typed listing of every graph) at info level."""
        logger.info("%s", self._popxl)
