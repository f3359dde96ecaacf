"""Ops: the op registry (one `OpDef` per op) and the IR node (`Op`) that tracing appends.

Every op is declared once, with:
- ``infer``: the shape/dtype rule ``(specs, **attrs) -> [TensorSpec, ...]``. It validates and
  raises ``ValueError``/``TypeError`` with a plain message; `create_op` adds the op name and the
  user's source line. It runs at trace time, so bad calls fail where they are written.
- ``reference``: the NumPy kernel ``(*arrays, **attrs) -> array | tuple`` used by the reference
  engine (the oracle). Collective kernels (``collective=True``) instead take
  ``(per_replica_inputs, replicas=[replica indices], **attrs)`` and return one result per replica.
- ``view``: for ops whose output is a *view* of input 0 (``reshape_``, ``transpose_``, ...):
  a NumPy view function. Lowering uses it to place the output inside the input's storage; no
  kernel runs. With ``copy=True`` the output is instead a new tensor holding a copy of that
  view (``reshape``, ``transpose``, ``slice``, ``identity``, ...): lowering emits a strided copy,
  so engines need no kernel for it.
- ``inplace``: index of the input whose storage the output overwrites (``add_``, ``relu_``,
  var updates): the kernel computes, the engine writes into that input.
- ``grad``: the gradient decision, used by ``popxl.transforms.autodiff``.
- ``control``: ops the engine runs as program structure (call, repeat, host I/O, ...), not kernels.
- ``attributes``: the op's attributes, declared once: name -> type (see ``ATTRIBUTE_TYPES``).
  `create_op` refuses an op whose attributes differ from its declaration, every executable carries
  the declarations of the ops it runs (``Executable.op_attrs``), and both engines check each op
  instruction against them at load; the native kernels read attributes only through accessors that
  refuse a name or type the op does not declare. None: not declared (the op's attributes are not
  checked; an op whose native kernel reads attributes must declare them). Every op declares its
  attributes but the control ops (call, repeat, if, host I/O: their attributes are graphs and
  streams, lowered into instructions of their own), ``ipu_copy`` / ``io_tile_copy``,
  ``dense_sparse_matmul`` and custom ops registered without a declaration.
- ``expand``: ops that run as other ops: ``expand(op)`` traces the ops computing ``op``'s outputs
  (returned in order), and every Session rewrites such ops so before compiling
  (``popxl.transforms.expand_ops``), as PopART's patterns do. popxl-addons' custom ops that span
  replicas run so, as local kernels and the collectives of ``popxl.ops.collectives``.

Kernels for the native engine are registered in C++ under the same names.
"""
from __future__ import annotations

import functools
import os
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Union, overload

import attrs

from popxl import _pb, dtypes
from popxl.context import Context, get_current_context
from popxl.tensor import Tensor
from popxl.tensorlocation import ExecutionContext

if TYPE_CHECKING:  # pragma: no cover
    from popxl.graph import Graph
    from popxl.tensor import TensorSpec

__all__ = ["OpDef", "Op", "REGISTRY", "register", "grad_rule", "create_op", "user_location", "ATTRIBUTE_TYPES",
           "check_attributes"]

# The types an op attribute may be declared with; a type ending in "?" also allows None, and the
# attribute's absence (transforms add some attributes, such as "layouts", to some ops only).
# Values are checked as traced (dtypes, RemoteBuffers, tuples) and as an executable holds them
# (popxl.compiler.executable.encode_attr: {"dtype": name}, remote buffer ids, lists).
ATTRIBUTE_TYPES = ("int", "float", "number", "bool", "str", "ints", "floats", "strs", "dtype", "remote_buffer")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or (hasattr(v, "dtype") and getattr(v, "ndim", 1) == 0
                                                             and v.dtype.kind in "iu")


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float) or (hasattr(v, "dtype") and getattr(v, "ndim", 1) == 0
                                                  and v.dtype.kind == "f")


def _conforms(kind: str, v: Any) -> bool:
    if kind in ("ints", "floats", "strs"):
        return isinstance(v, (list, tuple)) and all(_conforms(kind[:-1], x) for x in v)
    if kind == "int":
        return _is_int(v)
    if kind in ("float", "number"):  # a float attribute may be given as an int (clip(x, 0, 6))
        return _is_number(v)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    if kind == "dtype":
        return isinstance(v, dtypes.dtype) or (isinstance(v, dict) and set(v) == {"dtype"})
    if kind == "remote_buffer":
        return _is_int(v) or hasattr(v, "remote_buffer_id")
    raise ValueError(f"unknown attribute type {kind!r}; known: {ATTRIBUTE_TYPES}")


def check_attributes(optype: str, declared: Optional[Dict[str, str]], values: Dict[str, Any], where: str) -> None:
    """Raise ValueError naming ``where`` (the op) and the attribute if ``values`` do not match the
    declaration of op ``optype`` (``declared``; None: not declared, nothing to check): an attribute
    it does not declare, one it declares missing, or a value not of the declared type."""
    if declared is None:
        return
    for name in values:
        if name not in declared:
            raise ValueError(f"{where}: attribute {name!r} is not declared by op {optype!r} "
                             f"(declared: {', '.join(sorted(declared)) or 'none'}).")
    for name, kind in declared.items():
        optional = kind.endswith("?")
        if name not in values:
            if optional:
                continue
            raise ValueError(f"{where}: attribute {name!r} of op {optype!r} is missing.")
        v = values[name]
        if not (v is None and optional) and not _conforms(kind.rstrip("?"), v):
            raise ValueError(f"{where}: attribute {name!r} of op {optype!r} is declared {kind}, "
                             f"but its value is {v!r}.")


class Grad:
    """Gradient decisions that are not a rule (a rule is a callable, see transforms.autodiff)."""

    STOP = "stop"  # no gradient op: gradient does not flow through
    ZERO = "zero"  # differentiable with zero gradient (floor, ceil, sign)
    RAISE = "raise"  # differentiating through it is an error


@attrs.frozen
class OpDef:
    name: str
    infer: Callable[..., List["TensorSpec"]]
    reference: Optional[Callable[..., Any]] = None
    view: Optional[Callable[..., Any]] = None
    copy: bool = False
    inplace: Optional[int] = None
    grad: Any = None
    control: bool = False
    collective: bool = False
    side_effect: bool = False
    family: str = ""
    # Each output value is computed from the input values at its own (broadcast) position alone,
    # and every engine's kernel reads a position's inputs before writing it: lowering may then
    # place the output in the storage of an input of the same shape and dtype that dies here.
    elementwise: bool = False
    # For other ops: attrs -> the positions of inputs whose storage the first output may take
    # when they die at this op (every kernel reads such an input before writing the output over it).
    overwritable: Optional[Callable[..., Tuple[int, ...]]] = None
    expand: Optional[Callable[["Op"], Any]] = None
    # attrs -> whether PopART's OpToIdentity pattern turns the op into an identity (its
    # canBeReplacedByIdentity). popxl-addons' ops that say so cannot run otherwise: a Session
    # refuses them until Ir.applyPreAliasPatterns (with OpToIdentity enabled) has replaced them.
    identity_when: Optional[Callable[..., bool]] = None
    # name -> type (ATTRIBUTE_TYPES, "?": may be None or absent); None: not declared
    attributes: Optional[Dict[str, str]] = None

    @property
    def pure(self) -> bool:
        """Its outputs are a function of its inputs alone and it writes nothing else: not control
        flow, collective or side-effecting, not in place, not a view aliasing its input. Such an op
        may run earlier or less often (hoisting, lowering's static program) without changing results."""
        return (not (self.control or self.collective or self.side_effect) and self.inplace is None
                and (self.view is None or self.copy) and self.expand is None)


REGISTRY: Dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in REGISTRY:
        raise RuntimeError(f"op {opdef.name!r} is registered twice")
    for name, kind in (opdef.attributes or {}).items():
        if kind.rstrip("?") not in ATTRIBUTE_TYPES:
            raise ValueError(f"op {opdef.name!r}: attribute {name!r} has unknown type {kind!r}; known: {ATTRIBUTE_TYPES}")
    REGISTRY[opdef.name] = opdef
    return opdef


def grad_rule(*opnames: str) -> Callable[[Callable], Callable]:
    """Decorator: make the function the gradient rule of the named ops (declared next to the op).

    A rule gets a ``popxl.transforms.autodiff.GradOpContext`` while the gradient graph is being
    traced and returns one gradient (or None) per forward input."""
    def attach(rule: Callable) -> Callable:
        for opname in opnames:
            current = REGISTRY[opname].grad
            if current is not None:
                raise RuntimeError(f"op {opname!r} already has a gradient decision ({current!r})")
            REGISTRY[opname] = attrs.evolve(REGISTRY[opname], grad=rule)
        return rule
    return attach


_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_DIRS = (_PKG_DIR, os.path.join(os.path.dirname(_PKG_DIR), "popart"))


@functools.lru_cache(maxsize=4096)
def _is_internal(filename: str) -> bool:
    """Whether code of ``filename`` is popxl's, popart's or a decorator helper's, not the user's
    (cached: every op asks for each frame of its stack)."""
    fn = os.path.abspath(filename)
    return fn.startswith(_SKIP_DIRS) or "contextlib" in fn or "functools" in fn


def user_location() -> str:
    """``file:line`` of the innermost frame outside popxl/popart: the user's line that made the op."""
    f: Optional[FrameType] = sys._getframe(1)
    skip = get_current_context().debug_frame_offset
    while f is not None:
        if not _is_internal(f.f_code.co_filename):
            if skip <= 0:
                return f"{f.f_code.co_filename}:{f.f_lineno}"
            skip -= 1
        f = f.f_back
    return "<unknown>"


class Op:
    """One op in a graph: its definition, input and output tensors, attributes and placement.
    ``id`` is unique in its Ir and counts from 100 (PopART's OpId, which its graph edits take)."""

    # set by popxl.transforms.merge_exchange on the transfers it merges (other ops have none)
    exchange_group: int

    def __init__(self, opdef: OpDef, graph: "Graph", inputs: Tuple["Tensor", ...],
                 attrs_: Dict[str, Any], name: str, location: str) -> None:
        ctx = get_current_context()
        self.id: int = next(graph.ir._op_ids)
        self.opdef = opdef
        self.graph = graph
        self.inputs: Tuple["Tensor", ...] = inputs
        self.outputs: Tuple["Tensor", ...] = ()
        self.attrs: Dict[str, Any] = attrs_
        self.name = name
        self.location = location
        self.ipu: int = ctx.ipu_id
        self.tile_set: Literal["compute", "io"] = "io" if ctx.io_tile_set else "compute"
        self.in_sequence = ctx.in_sequence
        # the program part it runs in (None: the normal program); fragments are main-graph only
        self.execution_context = _fragment_of(ctx.execution_context, graph, name, location)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.graph.ir.__reduce_ex__(protocol)  # the Ir's error: IR objects cannot be pickled

    @property
    def type(self) -> str:
        return self.opdef.name

    def __getattr__(self, name: str) -> Any:
        # PopXL hands out PopART's ops (a call site's ``_op``, op-created hooks), and code written
        # for it calls their methods (``getInputIndexMap``, ``outTensor`` ...): those come from
        # this op's view in popart._internal.ir.
        if name.startswith("_"):
            raise AttributeError(f"'Op' object has no attribute {name!r}")
        try:
            return getattr(_pb.view_of(self), name)
        except AttributeError:
            raise AttributeError(f"'Op' object has no attribute {name!r}") from None

    def __repr__(self) -> str:
        ins = ", ".join(t.id for t in self.inputs)
        outs = ", ".join(t.id for t in self.outputs)
        return f"Op[{self.type} {self.name!r} ({ins}) -> ({outs})]"


Context._op_class = Op  # the ops the tracing context's op-created hooks take (see Context._op_created)


def _fragment_of(context: Any, graph: "Graph", name: str, location: str) -> Any:
    """The weight fragment (an ExecutionContext) an op made under ``context`` belongs to, or None."""
    if context not in (ExecutionContext.WeightsFromHostFragment, ExecutionContext.WeightsToHostFragment):
        return None
    if graph is not graph.ir.main_graph:
        raise ValueError(f"op {name!r} (at {location}): the {context.name} holds main-graph ops only; "
                         f"graph {graph.id!r} is a subgraph.")
    return context


def _describe(specs: Sequence["TensorSpec"]) -> str:
    return ", ".join(f"{tuple(s.shape)} {s.dtype.name}" for s in specs)


def check_tensor(graph: "Graph", t: Any, what: str, opname: str) -> "Tensor":
    """Check ``t`` is a Tensor of ``graph``; the error explains how subgraphs receive values."""

    if not isinstance(t, Tensor):
        raise TypeError(f"{opname}: {what} must be a popxl.Tensor, not {type(t).__name__} ({t!r}).")
    if t.graph is not graph:
        if t.ir is not graph.ir:
            raise ValueError(f"{opname}: tensor {t.id!r} belongs to a different Ir ({t.ir!r}).")
        raise ValueError(
            f"{opname}: tensor {t.id!r} belongs to graph {t.graph.id!r}, but this op is being added "
            f"to graph {graph.id!r}. A subgraph sees values of its parent only through its inputs: "
            f"pass the tensor as an argument of the traced function (ir.create_graph(fn, {t.name}, ...)), "
            f"or create `popxl.graph_input(...)` inside the function and bind it at the call site with "
            f"`ops.call(graph, ..., inputs_dict={{that_input: {t.name}}})`.")
    return t


# The result follows ``return_op``: the output tensors, or the Op.
@overload
def create_op(opname: str, inputs: Sequence["Tensor"], attrs_: Optional[Dict[str, Any]] = None,
              name: Optional[str] = None, output_names: Optional[Sequence[Optional[str]]] = None,
              graph: Optional["Graph"] = None, return_op: Literal[False] = False,
              notify: bool = True) -> Tuple["Tensor", ...]: ...


@overload
def create_op(opname: str, inputs: Sequence["Tensor"], attrs_: Optional[Dict[str, Any]] = None,
              name: Optional[str] = None, output_names: Optional[Sequence[Optional[str]]] = None,
              graph: Optional["Graph"] = None, *, return_op: Literal[True], notify: bool = True) -> "Op": ...


def create_op(opname: str, inputs: Sequence["Tensor"], attrs_: Optional[Dict[str, Any]] = None,
              name: Optional[str] = None, output_names: Optional[Sequence[Optional[str]]] = None,
              graph: Optional["Graph"] = None, return_op: bool = False,
              notify: bool = True) -> Union[Tuple["Tensor", ...], "Op"]:
    """Trace one op into the current graph: check inputs, infer outputs, append.
    Returns the output tensors (or the Op itself with ``return_op``). The op-created hooks run
    unless ``notify`` is False (PopART's ``createOpInGraph``: its caller runs them, through
    ``ctx._op_created(op)``)."""

    opdef = REGISTRY[opname]
    g = graph if graph is not None else get_current_context().graph
    g.ir._check_mutable()
    location = user_location()
    attrs_ = dict(attrs_ or {})
    try:
        check_attributes(opname, opdef.attributes, attrs_, f"ops.{opname}")
    except ValueError as e:
        raise ValueError(f"{e} (at {location})") from None
    try:
        ins = tuple(check_tensor(g, t, f"input {i}", opname) for i, t in enumerate(inputs))
    except (TypeError, ValueError) as e:
        raise type(e)(f"{e} (at {location})") from None
    try:
        specs = opdef.infer([t.spec for t in ins], **attrs_)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise type(e)(
            f"ops.{opname}: {e} [inputs: {_describe([t.spec for t in ins]) or 'none'}] (at {location})"
        ) from None
    scope = get_current_context().scope_prefix
    op = Op(opdef, g, ins, attrs_, scope + (name or opname), location)
    names = list(output_names or [])
    outs = []
    for i, spec in enumerate(specs):
        nm = (names[i] if i < len(names) else None) or name or opname
        outs.append(Tensor._create(g, nm, spec, producer=op))
    op.outputs = tuple(outs)
    g._ops.append(op)
    if notify:
        get_current_context()._op_created(op)
    return op if return_op else op.outputs
