"""PopART's custom-op surface, as a PopXL custom op's Python wrapper uses it: ``Settings`` (what
``ctx._get_op_settings(name)`` returns), op classes with ``createOpInGraph`` (or, for PopART's
parameterized ops, ``create_op_in_graph``), ``OperatorIdentifier``, ``CollectiveOperator`` and
the PopART view of a replica grouping (``group._pb_replica_grouping``).

A custom op here is a popxl op: ``CustomOp`` subclasses name the registered popxl op they make
(``popxl_type``) and turn PopART's creation arguments into its attributes (``attributes``).
``createOpInGraph(graph, inputs, outputs, *arguments, settings)`` checks and creates the op at
once in ``graph`` (its op-created hooks run when the wrapper calls ``ctx._op_created(op)``, as in
PopXL) and returns its PopART view: ``outTensor(i)``, ``inTensor(i)``, ``id``, ``opType()`` and
everything else of ``popart._internal.ir.Op``. From then on it is an ordinary op: autodiff applies
its gradient rule and both engines run it.

To give a PopXL custom op of one's own a CPU implementation, register a popxl op for it
(``popxl.op.register(OpDef(...))``) and write its binding module in Python with a ``CustomOp``
subclass (docs/guide/custom_ops.md ports the user guide's leaky ReLU).
"""
from __future__ import annotations

import enum
import operator
from types import MappingProxyType
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

from popxl.errors import popart_exception
from popxl.graph import Graph as XlGraph
from popxl.op import create_op
from popxl.tensorlocation import ExecutionContext, TileSet

from popart._internal.ir._views import View, popxl_object, view_of
from popart._internal.ir.op import Op, _set_id, register_view_class


__all__ = ["Settings", "OperatorIdentifier", "OptionalVGraphId", "CollectiveOperator", "ReplicaGrouping",
           "CustomOp", "ParameterizedOp"]


class OperatorIdentifier:
    """PopART's op identifier: domain, type, version and input / output counts (informative here)."""

    def __init__(self, domain: str, type: str, version: int = 1, numInputs: Any = (1, 1), numOutputs: int = 1) -> None:
        self.domain, self.type, self.version = str(domain), str(type), int(version)
        self.numInputs, self.numOutputs = numInputs, numOutputs

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, OperatorIdentifier) and (self.domain, self.type, self.version) == \
            (other.domain, other.type, other.version)

    def __hash__(self) -> int:
        return hash((self.domain, self.type, self.version))

    def __repr__(self) -> str:
        return f"OperatorIdentifier({self.domain!r}, {self.type!r}, {self.version})"


class OptionalVGraphId:
    """PopART's optional virtual graph (IPU) id of an op's settings."""

    def __init__(self, value: Optional[int] = None) -> None:
        self._value = None if value is None else operator.index(value)

    def has_value(self) -> bool:
        return self._value is not None

    def value(self) -> int:
        if self._value is None:
            raise popart_exception("OptionalVGraphId: no value is set.")
        return self._value

    def __repr__(self) -> str:
        return f"OptionalVGraphId({self._value})"


class CollectiveOperator(enum.Enum):
    """PopART's reduction of a collective (what PopXL's ``to_collective_op`` returns there)."""

    Add = "add"
    Mean = "mean"
    Mul = "mul"
    Min = "min"
    Max = "max"
    LogicalAnd = "and"
    LogicalOr = "or"
    SquareAdd = "square_add"
    Local = "local"


class ReplicaGrouping(View):
    """PopART's view of a popxl.ReplicaGrouping (``group._pb_replica_grouping``)."""

    __hash__ = None  # type: ignore[assignment]  # as the grouping it shows

    def getNumReplicas(self) -> int:
        return len(self._popxl.assignment)

    def getStride(self) -> int:
        return self._popxl.stride

    def getGroupSize(self) -> int:
        return self._popxl.group_size

    def getNumGroups(self) -> int:
        return self._popxl.num_groups

    def __repr__(self) -> str:
        return f"<popart._internal.ir.ReplicaGrouping of {self._popxl!r}>"


class Settings:
    """An op's settings: its graph (``graph``), name (under the name scopes it was made in),
    IPU (``vgraphId``), tile set and execution context. ``ctx._get_op_settings(name)`` makes them."""

    def __init__(self, graph: Any, name: str = "") -> None:
        self.graph = view_of(popxl_object(graph, XlGraph))
        self.name = str(name)
        self.vgraphId = OptionalVGraphId()
        self.executionContext = ExecutionContext.Normal
        self.tileSet = TileSet.Compute
        self.debugInfoId = 0

    @classmethod
    def _from_context(cls, ctx: Any, name: str) -> "Settings":
        settings = cls(ctx.graph, "/".join((*ctx.name_scopes, name)))
        settings.vgraphId = OptionalVGraphId(ctx.ipu_id)
        settings.executionContext = ctx.execution_context or ExecutionContext.Normal
        settings.tileSet = TileSet.IO if ctx.io_tile_set else TileSet.Compute
        return settings

    def getIr(self) -> Any:
        return self.graph.getIr()

    def __repr__(self) -> str:
        return f"Settings(name={self.name!r}, graph={self.graph.id!r})"


class CustomOp(Op):
    """Base of PopART op classes whose ops are popxl ops. A subclass sets ``popxl_type`` (the
    registered popxl op it makes), ``op_type`` (PopART's type name, ``opType()``), ``arguments``
    (the names of ``createOpInGraph``'s arguments between ``outputs`` and ``settings``, as the
    C++ binding names them) and overrides ``attributes`` to turn them into the popxl op's
    attributes."""

    popxl_type: ClassVar[str] = ""
    op_type: ClassVar[str] = ""
    arguments: ClassVar[Tuple[str, ...]] = ()
    _arguments: Mapping[str, Any] = MappingProxyType({})  # createOpInGraph's, bound (none for other views)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("popxl_type"):  # a subclass that only changes attributes keeps its base's view
            register_view_class(cls.popxl_type, cls)

    @classmethod
    def attributes(cls, graph: Any, *args: Any, **arguments: Any) -> Dict[str, Any]:
        """The popxl op's attributes for PopART's creation ``arguments`` in popxl graph ``graph``.
        createOpInGraph passes them by the names in ``arguments``; a subclass takes them as its own
        parameters (``*args`` is there so that it may: nothing passes values by position)."""
        return dict(arguments)

    def opType(self) -> str:
        return self.op_type or super().opType()

    @classmethod
    def createOpInGraph(cls, graph: Any, inputs: Mapping[int, str], outputs: Mapping[int, str], *args: Any,
                        **kwargs: Any) -> "CustomOp":
        """Create the op in ``graph`` (PopART's graph view or a popxl.Graph) reading the tensors
        whose ids ``inputs`` maps by input index, naming its outputs as ``outputs`` maps them, with
        this class's ``arguments`` (positional or by name) and ``settings`` last."""
        where = f"{cls.__name__}.createOpInGraph"
        positional, named = list(args), dict(kwargs)
        settings = named.pop("settings", None)
        if settings is None and positional and isinstance(positional[-1], Settings):
            settings = positional.pop()
        if not isinstance(settings, Settings):
            raise TypeError(f"{where}: needs the op's settings (ctx._get_op_settings(name)) as its last argument.")
        named.pop("opid", None)
        if positional and isinstance(positional[0], OperatorIdentifier):
            positional.pop(0)
        bound = cls._bind_arguments(where, positional, named)
        g = popxl_object(graph, XlGraph)
        if settings.graph._popxl is not g:
            raise popart_exception(f"{where}: the settings belong to graph {settings.graph._popxl.id!r}, "
                                   f"not {g.id!r}.")
        ins = cls._resolve_inputs(where, g, inputs)
        out_ids = cls._output_ids(where, outputs)  # checked before anything is created
        try:
            attrs = cls.attributes(g, **bound)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        op = create_op(cls.popxl_type, ins, attrs, graph=g, return_op=True, notify=False)
        op.name = settings.name or op.name
        if settings.vgraphId.has_value():
            op.ipu = settings.vgraphId.value()
        op.tile_set = "io" if settings.tileSet == TileSet.IO else "compute"
        try:
            cls._name_new_outputs(where, op, out_ids)
        except BaseException:
            op.graph.remove_ops([op])  # the graph stays as it was
            raise
        view = cls(op)
        view._arguments = bound
        op.__dict__["_pb_view"] = view
        return view

    @classmethod
    def create_op_in_graph(cls, graph: Any, inputs: Mapping[int, str], outputs: Mapping[int, str], *args: Any,
                           **kwargs: Any) -> "CustomOp":
        """PopART's name of ``createOpInGraph`` for parameterized ops."""
        return cls.createOpInGraph(graph, inputs, outputs, *args, **kwargs)

    # the parts of createOpInGraph -------------------------------------------------------------------
    @classmethod
    def _bind_arguments(cls, where: str, args: List[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        names = cls.arguments
        if len(args) > len(names):
            raise TypeError(f"{where}: takes {len(names)} argument(s) before the settings "
                            f"({', '.join(names) or 'none'}), got {len(args)}.")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"{where}: unexpected argument {k!r} (it takes {', '.join(names) or 'none'}).")
            if k in bound:
                raise TypeError(f"{where}: argument {k!r} given twice.")
            bound[k] = v
        missing = [n for n in names if n not in bound]
        if missing:
            raise TypeError(f"{where}: missing argument(s) {', '.join(missing)}.")
        return bound

    @staticmethod
    def _resolve_inputs(where: str, graph: Any, inputs: Mapping[int, str]) -> List[Any]:
        try:
            items = sorted((operator.index(i), t) for i, t in dict(inputs).items())
        except TypeError:
            raise TypeError(f"{where}: inputs must map input indices (ints) to tensor ids.") from None
        if [i for i, _ in items] != list(range(len(items))):
            raise popart_exception(f"{where}: inputs are connected at {[i for i, _ in items]}; they must be at "
                                   f"0..{len(items) - 1} without gaps.")
        out = []
        for i, tid in items:
            tid = getattr(tid, "id", tid)
            try:
                out.append(graph.get_tensor(tid))
            except KeyError:
                raise popart_exception(f"{where}: input {i}: graph {graph.id!r} has no tensor {tid!r}.") from None
        return out

    @staticmethod
    def _output_ids(where: str, outputs: Any) -> List[Tuple[int, str]]:
        """``outputs`` as (index, tensor id) pairs, or a TypeError saying what they must be."""
        try:
            items = sorted((operator.index(i), t) for i, t in dict(outputs).items())
        except (TypeError, ValueError):
            raise TypeError(f"{where}: outputs must map output indices (ints) to tensor ids (str), "
                            f"not {outputs!r}.") from None
        for i, tid in items:
            if not isinstance(tid, str) or not tid:
                raise TypeError(f"{where}: output {i} must be named by a tensor id (a non-empty str), not {tid!r}.")
        return items

    @staticmethod
    def _name_new_outputs(where: str, op: Any, outputs: List[Tuple[int, str]]) -> None:
        for i, tid in outputs:
            if not 0 <= i < len(op.outputs):
                raise popart_exception(f"{where}: output index {i} is out of range; a {op.type} op has "
                                       f"{len(op.outputs)} output(s).")
            _set_id(op.graph, op.outputs[i], tid)


class ParameterizedOp(CustomOp):
    """PopART's parameterized custom ops (``makeParameterizedOpBindings``): created with one
    ``params`` object (an optional ``OperatorIdentifier`` before it), through ``create_op_in_graph``
    (or ``createOpInGraph``); ``default_opid()`` and ``params`` as in PopART."""

    arguments = ("params",)
    domain: ClassVar[str] = "custom.ops"

    @classmethod
    def default_opid(cls) -> OperatorIdentifier:
        return OperatorIdentifier(cls.domain, cls.op_type, 1)

    @property
    def params(self) -> Any:
        """The params object the op was created with (None for a view made otherwise)."""
        return self._arguments.get("params")
