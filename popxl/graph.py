"""`popxl.Graph`: an ordered list of ops with inputs and outputs, entered with ``with g:``."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from popxl import _hooks, _pb
from popxl.context import OpCreatedHooks, get_current_context
from popxl.op import Op, create_op
from popxl.tensor import Constant, Tensor, Variable

if TYPE_CHECKING:  # pragma: no cover
    from popxl.ir import Ir
    from popxl.tensor import TensorSpec

__all__ = ["Graph"]


class Graph(OpCreatedHooks):
    """A graph of an Ir: inputs, ops, outputs. Made by ``Ir.create_graph`` or ``Ir.create_empty_graph``.

    ``with graph:`` makes it the current graph, so that ops created inside are added to it.
    ``t in graph`` tells whether a tensor belongs to it; equality and hashing are by id and Ir.
    Variables live only in the main graph.

    Raises:
        TypeError: If constructed directly.
    """

    _ir: "Ir"
    _id: str
    _name: str
    _ops: List["Op"]
    _tensors: Dict[str, "Tensor"]
    _inputs: List["Tensor"]
    _outputs: List["Tensor"]
    _by_ref_inputs: Set["Tensor"]
    _can_be_recursively_autodiffed: bool
    _marks: Set[str]

    def __init__(self) -> None:
        raise TypeError("popxl.Graph cannot be constructed directly: use ir.create_graph(fn, ...) "
                        "or ir.create_empty_graph(name).")

    @classmethod
    def _create(cls, ir: "Ir", graph_id: str, name: str) -> "Graph":
        g = object.__new__(cls)
        g._ir = ir
        g._id = graph_id
        g._name = name
        g._ops = []
        g._tensors = {}
        g._inputs = []
        g._outputs = []
        g._by_ref_inputs = set()
        # False: autodiff of a graph calling this one needs its gradient in called_graphs_grad_info
        g._can_be_recursively_autodiffed = True
        g._marks = set()  # what the transform pipeline does to it (popxl.transforms.pipeline.mark)
        g._init_hooks()
        return g

    @property
    def _tensor_prefix(self) -> str:
        return "" if self is self._ir.main_graph else self._id + "/"

    def _new_tensor_id(self, name: str) -> str:
        tid = self._tensor_prefix + name
        while tid in self._tensors:
            tid = f"{self._tensor_prefix}{name}__t{next(self._ir._tensor_counter)}"
        return tid

    # public properties ----------------------------------------------------------------------------
    @property
    def ir(self) -> "Ir":
        """The Ir the graph belongs to."""
        return self._ir

    @property
    def id(self) -> str:
        """The graph's unique id in its Ir (empty for the main graph)."""
        return self._id

    @property
    def name(self) -> str:
        """The graph's name (the scope its tensor ids start with)."""
        return self._name

    @property
    def main_graph(self) -> "Graph":
        """The main graph of the graph's Ir."""
        return self._ir.main_graph

    @property
    def inputs(self) -> Tuple["Tensor", ...]:
        """The graph's inputs, in call-site positional order."""
        return tuple(self._inputs)

    @property
    def inputs_by_name(self) -> Dict[str, "Tensor"]:
        """The graph's inputs keyed by ``Tensor.name``."""
        return {t.name: t for t in self._inputs}

    @property
    def outputs(self) -> Tuple["Tensor", ...]:
        """The graph's outputs, in order."""
        return tuple(self._outputs)

    @property
    def tensors(self) -> Tuple["Tensor", ...]:
        """Every tensor of the graph."""
        return tuple(self._tensors.values())

    @property
    def variables(self) -> Tuple["Variable", ...]:
        """The variables of the graph (only the main graph has any)."""
        return tuple(t for t in self._tensors.values() if isinstance(t, Variable))

    @property
    def constants(self) -> Tuple["Constant", ...]:
        """The constants of the graph."""
        return tuple(t for t in self._tensors.values() if isinstance(t, Constant))

    @property
    def ops(self) -> Tuple["Op", ...]:
        """The graph's ops, in creation order."""
        return tuple(self._ops)

    @property
    def called_graphs(self) -> Tuple["Graph", ...]:
        """The graphs that ops of this graph call directly."""
        seen: Dict[str, Graph] = {}
        for op in self._ops:
            for g in op_called_graphs(op):
                seen.setdefault(g.id, g)
        return tuple(seen.values())

    # PopART's internal IR as PopXL's own Python reaches it: `popart._internal.ir` is a view of
    # this Ir (one IR), so code written against PopXL's internals (popxl-addons) runs unchanged.
    @property
    def _pb_graph(self) -> Any:
        return _pb.view_of(self)

    @classmethod
    def _from_pb(cls, pb_graph: Any) -> "Graph":
        return _pb.popxl_object(pb_graph, cls)

    def is_input_by_ref(self, t: "Tensor") -> bool:
        """Whether an input of the graph passes by reference.

        Args:
            t: An input of the graph.

        Returns:
            True for by-reference inputs.
        """
        return t in self._by_ref_inputs

    def get_tensor(self, tensor_id: str) -> "Tensor":
        """A tensor of the graph by id.

        Args:
            tensor_id: The tensor's id (``Tensor.id``).

        Returns:
            The tensor.

        Raises:
            KeyError: If the graph has no tensor of that id.
        """
        try:
            return self._tensors[tensor_id]
        except KeyError:
            raise KeyError(f"No tensor with id {tensor_id!r} in graph {self._id!r}.") from None

    # editing ---------------------------------------------------------------------------------------
    # The one way transforms, the compiler and compatibility layers change a graph after tracing:
    # nothing outside this file (and the factories of tensor.py / op.py) edits its lists.

    def schedule(self) -> Tuple["Op", ...]:
        """The ops in the order they run: creation order, which is topological and honours every
        ``in_sequence`` mode (edits keep it so)."""
        return tuple(self._ops)

    def readers(self, t: "Tensor") -> List["Op"]:
        """The ops of this graph that read ``t``, in schedule order.

        Args:
            t: A tensor of the graph.

        Returns:
            The ops reading it.
        """
        return [op for op in self._ops if any(i is t for i in op.inputs)]

    def trace(self, build: Callable[[], Any], before: Optional["Op"] = None) -> Tuple[Any, List["Op"]]:
        """Run ``build()`` inside this graph and return (its result, the ops it traced). With
        ``before``, those ops are moved to run just before that op instead of at the end.

        Args:
            build: A function of no arguments that creates ops.
            before: The op the new ops are moved before; None leaves them at the end.

        Returns:
            ``(result of build(), new ops)``.
        """
        start = len(self._ops)
        with self:
            result = build()
        made = self._ops[start:]
        if before is not None:
            del self._ops[start:]
            at = self._ops.index(before)
            self._ops[at:at] = made
        return result, made

    def replace_ops(self, old: Sequence["Op"], build: Callable[[], Any]) -> List["Op"]:
        """Replace the ops ``old`` (in schedule order) with the ops ``build()`` traces, which return
        the replacement of each output of ``old[-1]`` (a Tensor, or a sequence of them). The new ops
        run where ``old[-1]`` ran (every input of the chain exists there) and the ops producing the
        replacements take over ``old[-1]``'s output tensors, so every reader is unchanged. The other
        ops of ``old`` must have no readers outside ``old``. Returns the new ops.

        Args:
            old: The ops replaced, in schedule order.
            build: A function of no arguments that creates the new ops and returns the replacements.

        Returns:
            The new ops.
        """
        made = self._splice(old, build)
        self.remove_ops(old, keep_outputs=old[-1].outputs)
        return made

    def replace_each(self, chains: Sequence[Tuple[Sequence["Op"], Callable[[], Any]]]) -> List[List["Op"]]:
        """``replace_ops`` for several disjoint chains, with the old ops removed in one pass at the
        end (a rewrite of many matches does not rescan the graph for each). Returns the new ops of
        each chain.

        Args:
            chains: ``(old ops in schedule order, build)`` pairs, as ``replace_ops`` takes them.

        Returns:
            The new ops of each chain.
        """
        made = [self._splice(old, build) for old, build in chains]
        self.remove_ops([op for old, _ in chains for op in old],
                        keep_outputs=[t for old, _ in chains for t in old[-1].outputs])
        return made

    def _splice(self, old: Sequence["Op"], build: Callable[[], Any]) -> List["Op"]:
        """The ops ``build()`` traces, run where ``old[-1]`` runs and making its output tensors
        (``replace_ops`` without removing ``old``)."""
        last = old[-1]
        results, made = self.trace(build, before=last)
        results = [results] if not isinstance(results, (list, tuple)) else list(results)
        if len(results) != len(last.outputs):
            raise ValueError(f"Graph.replace_ops: the builder returned {len(results)} tensors for the "
                             f"{len(last.outputs)} outputs of {last.type} {last.name!r}.")
        for new, kept in zip(results, last.outputs):
            producer = new.producer
            if producer is None or producer not in made:
                raise ValueError(f"Graph.replace_ops: the replacement of {kept.id!r} must be made by the builder.")
            self._tensors.pop(new.id, None)
            kept._producer = producer
            producer.outputs = tuple(kept if o is new else o for o in producer.outputs)
            for op in made:  # new ops reading a replacement read the kept tensor instead
                op.inputs = tuple(kept if i is new else i for i in op.inputs)
        return made

    def remove_ops(self, ops: Iterable["Op"], keep_outputs: Sequence["Tensor"] = ()) -> None:
        """Remove ``ops`` and their output tensors (except ``keep_outputs``, which another op has
        taken over). Refused if a remaining op reads one of those outputs or it is a graph output.

        Args:
            ops: The ops removed.
            keep_outputs: Outputs of those ops that stay in the graph.

        Raises:
            ValueError: If a remaining op or a graph output still uses a removed tensor.
        """
        gone = set(map(id, ops))
        keep = set(map(id, keep_outputs))
        dropped = [t for op in self._ops if id(op) in gone for t in op.outputs if id(t) not in keep]
        dropped_ids = set(map(id, dropped))
        remaining = [op for op in self._ops if id(op) not in gone]
        for op in remaining:
            if not dropped_ids.isdisjoint(map(id, op.inputs)):
                read = next(t for t in op.inputs if id(t) in dropped_ids)
                raise ValueError(f"Graph.remove_ops: {op.type} {op.name!r} still reads {read.id!r}.")
        outs = [t for t in self._outputs if id(t) in dropped_ids]
        if outs:
            raise ValueError(f"Graph.remove_ops: {outs[0].id!r} is an output of graph {self._id!r}.")
        self._ops[:] = remaining
        for t in dropped:
            self._tensors.pop(t.id, None)

    def replace_inputs(self, op: "Op", inputs: Sequence["Tensor"]) -> None:
        """Give ``op`` new input tensors (of the same specs), e.g. values moved out of a loop body.

        Args:
            op: An op of the graph.
            inputs: Its new inputs, one per current input, of the same specs.

        Raises:
            ValueError: If the inputs do not match or are not tensors of the graph.
        """
        if len(inputs) != len(op.inputs) or any(a.spec != b.spec for a, b in zip(inputs, op.inputs)):
            raise ValueError(f"Graph.replace_inputs: {op.type} {op.name!r} takes {[t.spec for t in op.inputs]}.")
        if any(t.graph is not self for t in inputs):
            raise ValueError(f"Graph.replace_inputs: the inputs of {op.name!r} must be tensors of {self._id!r}.")
        op.inputs = tuple(inputs)

    def add_op_input(self, op: "Op", t: "Tensor") -> None:
        """Append ``t`` to ``op``'s inputs (a call site binding a new input of its graph).

        Args:
            op: A call site of the graph.
            t: The tensor appended to its inputs.

        Raises:
            ValueError: If ``t`` is not a tensor of the graph.
        """
        if t.graph is not self:
            raise ValueError(f"Graph.add_op_input: {t.id!r} is not a tensor of graph {self._id!r}.")
        op.inputs = op.inputs + (t,)

    def add_op_output(self, op: "Op", spec: "TensorSpec", name: str, index: Optional[int] = None) -> "Tensor":
        """A new output tensor of ``op`` (a call site whose graph got a new output).

        Args:
            op: A call site of the graph.
            spec: The new output's spec.
            name: The new output's name.
            index: Its position among the op's outputs (later ones move up one); default last.

        Returns:
            The new output tensor.
        """
        at = len(op.outputs) if index is None else _position(index, len(op.outputs), "Graph.add_op_output")
        out = Tensor._create(self, name, spec, producer=op)
        op.outputs = op.outputs[:at] + (out,) + op.outputs[at:]
        return out

    def remove_op_outputs(self, op: "Op", positions: Iterable[int]) -> None:
        """Remove the outputs of ``op`` at ``positions`` (a call site whose graph lost outputs);
        they must have no readers.

        Args:
            op: A call site of the graph.
            positions: The indices of the outputs removed.

        Raises:
            ValueError: If a removed output is read or is a graph output.
        """
        positions = set(positions)
        for k in positions:
            t = op.outputs[k]
            if self.readers(t) or any(o is t for o in self._outputs):
                raise ValueError(f"Graph.remove_op_outputs: {t.id!r} is still used.")
            self._tensors.pop(t.id, None)
        op.outputs = tuple(t for k, t in enumerate(op.outputs) if k not in positions)

    def add_output(self, t: "Tensor", index: Optional[int] = None) -> None:
        """Make ``t`` an output of the graph, the last or at ``index`` (call sites are the caller's
        to update).

        Args:
            t: A tensor of the graph.
            index: Its position among the outputs (later ones move up one); default last.

        Raises:
            ValueError: If ``t`` is not a tensor of the graph, or ``index`` is out of range.
        """
        if t.graph is not self:
            raise ValueError(f"Graph.add_output: {t.id!r} is not a tensor of graph {self._id!r}.")
        at = len(self._outputs) if index is None else _position(index, len(self._outputs), "Graph.add_output")
        self._outputs.insert(at, t)

    def remove_output(self, index: int) -> "Tensor":
        """Remove output ``index`` (call sites are the caller's to update); returns the tensor.

        Args:
            index: The position of the output removed.

        Returns:
            The tensor that was the output.
        """
        return self._outputs.pop(index)

    def add_input(self, spec: "TensorSpec", name: str, by_ref: bool = False, index: Optional[int] = None) -> "Tensor":
        """A new input, the last or at ``index`` (call sites are the caller's to bind, and with
        ``index`` to renumber: ``popxl.ops.call.insert_graph_input`` does both).

        Args:
            spec: The new input's spec.
            name: The new input's name.
            by_ref: Make the input by-reference.
            index: Its position among the inputs (later ones move up one); default last.

        Returns:
            The new input tensor.

        Raises:
            ValueError: If ``index`` is out of range.
        """
        at = len(self._inputs) if index is None else _position(index, len(self._inputs), "Graph.add_input")
        t = Tensor._create(self, name, spec)
        self._inputs.insert(at, t)
        if by_ref:
            self._by_ref_inputs.add(t)
        return t

    def set_input_by_ref(self, t: "Tensor", by_ref: bool = True) -> None:
        """Make input ``t`` by-reference (in-place changes reach the caller's tensor) or by value.

        Args:
            t: An input of the graph.
            by_ref: By reference (True) or by value (False).

        Raises:
            ValueError: If ``t`` is not an input of the graph.
        """
        if not any(i is t for i in self._inputs):
            raise ValueError(f"Graph.set_input_by_ref: {t.id!r} is not an input of graph {self._id!r}.")
        (self._by_ref_inputs.add if by_ref else self._by_ref_inputs.discard)(t)

    def add_op_copy(self, op: "Op", inputs: Sequence["Tensor"], attrs: Optional[Dict[str, Any]] = None,
                    output_names: Optional[Sequence[Optional[str]]] = None) -> "Op":
        """Append an op with ``op``'s definition, name and placement (ipu, tile set) that reads
        ``inputs``, tensors of this graph; ``attrs`` (default: ``op``'s) and the shape rule give
        its outputs. How an op is copied into another graph (PopART's ``cloneIntoGraph``).

        Args:
            op: The op copied.
            inputs: The copy's inputs, tensors of this graph.
            attrs: The copy's attributes; default ``op``'s.
            output_names: Names of the copy's outputs.

        Returns:
            The new op.
        """
        new = create_op(op.type, inputs, dict(op.attrs if attrs is None else attrs), name=op.name,
                        output_names=output_names, graph=self, return_op=True)
        new.name, new.location, new.ipu, new.tile_set = op.name, op.location, op.ipu, op.tile_set
        return new

    def erase_op(self, op: "Op") -> None:
        """Remove ``op`` alone (PopART's ``eraseOp``). Its outputs that nothing reads are dropped;
        one that an op still reads, or that is a graph output, stays in the graph without a
        producer until those readers are erased too (a graph that still reads such a tensor
        cannot be compiled: ``check`` says which).

        Args:
            op: An op of the graph.
        """
        self._ops.remove(op)
        for t in op.outputs:
            if t._producer is op:
                t._producer = None
            if not self.readers(t) and not any(o is t for o in self._outputs):
                self._tensors.pop(t.id, None)

    def move_op(self, op: "Op", before: Optional["Op"]) -> None:
        """Move ``op`` to run just before ``before`` (to the end if None): an ordering constraint
        (PopART's topological constraints). Refused when an op it passes makes a tensor ``op``
        reads or reads one ``op`` makes, or when either writes storage the other uses.

        Args:
            op: The op moved.
            before: The op it is moved before; None moves it to the end.

        Raises:
            ValueError: If the move would break a data or storage dependency.
        """
        ops = self._ops
        at, to = ops.index(op), (len(ops) if before is None else ops.index(before))
        passed = ops[at + 1:to] if to > at else ops[to:at]
        for other in passed:
            if _ops_depend(op, other):
                raise ValueError(f"Graph.move_op: {op.type} {op.name!r} cannot run "
                                 f"{'after' if to > at else 'before'} {other.type} {other.name!r}: they "
                                 f"share a tensor that one of them makes or writes.")
        ops.remove(op)
        ops.insert(to - 1 if to > at else to, op)

    def replace_output(self, index: int, t: "Tensor") -> "Tensor":
        """Make ``t`` output ``index`` in place of the tensor there (same shape and dtype, so call
        sites are unchanged); returns the tensor replaced.

        Args:
            index: The position of the output replaced.
            t: The new output, of the same shape and dtype.

        Returns:
            The tensor replaced.

        Raises:
            ValueError: If ``t`` is not a tensor of the graph with the output's spec.
        """
        old = self._outputs[index]
        if t.graph is not self or t.spec != old.spec:
            raise ValueError(f"Graph.replace_output: {t.id!r} must be a tensor of graph {self._id!r} "
                             f"with the spec of output {index} ({old.spec}).")
        self._outputs[index] = t
        return old

    def remove_isolated(self, tensors: Iterable["Tensor"]) -> None:
        """Drop ``tensors``: each must be isolated (no producer, no reader in this graph, not an
        input or output of it). PopART's ``removeIsolatedTensors``.

        Args:
            tensors: The tensors dropped.

        Raises:
            ValueError: If a tensor is not isolated.
        """
        tensors = list(tensors)
        ends = {id(t) for t in (*self._inputs, *self._outputs)}
        for t in tensors:
            if t._producer is not None or id(t) in ends or self.readers(t):
                raise ValueError(f"Graph.remove_isolated: {t.id!r} is not isolated in graph {self._id!r}.")
        for t in tensors:
            self._tensors.pop(t.id, None)

    def _create_tensor_id(self, name: str = "t") -> str:
        """An id no tensor of this graph has, made from ``name`` (graph prefix and current name
        scope included), as PopXL's ``Graph._create_tensor_id``; nothing is created."""
        return self._new_tensor_id(get_current_context().scope_prefix + (name or "t"))

    def rename(self, t: "Tensor", name: str) -> None:
        """Give ``t`` a new id made from ``name`` (unique within the graph).

        Args:
            t: A tensor of the graph.
            name: The name its new id is made from.
        """
        del self._tensors[t._id]
        t._id = self._new_tensor_id(name)
        self._tensors[t._id] = t

    def check(self) -> None:
        """Raise if the graph breaks an invariant the compiler relies on: each op reads only inputs,
        constants, variables or outputs of earlier ops of this graph (not a tensor whose producer
        was erased); each tensor is registered once and produced by the op that lists it; outputs
        are tensors of the graph."""
        known = {id(t) for t in self._inputs}
        registered = {id(t) for t in self._tensors.values()}
        for op in self._ops:
            for t in op.inputs:
                if t.graph is not self or id(t) not in registered:
                    raise AssertionError(f"graph {self._id!r}: {op.name!r} reads {t.id!r}, not a tensor of the graph.")
                if id(t) not in known and t.producer is not None:
                    raise AssertionError(f"graph {self._id!r}: {op.name!r} reads {t.id!r} before it is made.")
                if id(t) not in known and orphaned(t):
                    raise AssertionError(f"graph {self._id!r}: {op.name!r} reads {t.id!r}, whose producer was "
                                         f"erased.")
            for t in op.outputs:
                if t.producer is not op or id(t) not in registered:
                    raise AssertionError(f"graph {self._id!r}: output {t.id!r} of {op.name!r} is not registered "
                                         f"to it.")
                known.add(id(t))
        for t in self._outputs:
            if id(t) not in registered:
                raise AssertionError(f"graph {self._id!r}: output {t.id!r} is not a tensor of the graph.")

    # hooks (OpCreatedHooks) ------------------------------------------------------------------------
    def _hooks_owner(self) -> str:
        return f" on graph {self._id!r}"

    # protocol -------------------------------------------------------------------------------------
    def __contains__(self, t: Any) -> bool:
        if not isinstance(t, Tensor):
            raise TypeError(f"`in` on a Graph needs a popxl.Tensor, not {type(t).__name__}.")
        return t.graph is self

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Graph):
            raise TypeError(f"Cannot compare a Graph with {type(other).__name__}.")
        return self is other

    def __hash__(self) -> int:
        return hash((self._ir.id, self._id))

    def __repr__(self) -> str:
        if self is self._ir.main_graph:  # its id is empty: say which graph it is
            return f"Graph[id='' (main graph) name={self._name}]"
        return f"Graph[id={self._id} name={self._name}]"

    def __str__(self) -> str:
        """A typed listing: one line per op, the bodies of called graphs nested (popxl.visualize)."""
        return _hooks.graph_listing(self)

    def _repr_svg_(self) -> Optional[str]:
        """Jupyter shows a graph as a picture (popxl.visualize.to_svg for options)."""
        return _hooks.repr_svg(self)

    def __enter__(self) -> "Graph":
        get_current_context().push_graph(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        get_current_context().pop_graph()


def _position(index: int, size: int, where: str) -> int:
    """``index`` as a place to insert into a list of ``size`` items (0 .. size)."""
    i = operator.index(index)
    if not 0 <= i <= size:
        raise ValueError(f"{where}: position {i} is out of range (0 to {size}).")
    return i


def orphaned(t: "Tensor") -> bool:
    """A tensor that no op makes and that is not a graph input, variable, constant or remote
    shard: what is left of an output whose producer was erased."""
    return (t.producer is None and not isinstance(t, (Variable, Constant)) and t._remote_slot is None
            and not any(i is t for i in t.graph._inputs))


def storage_root(t: "Tensor") -> "Tensor":
    """The tensor whose storage ``t`` is a view of (through view and in-place ops)."""
    while (p := t.producer) is not None:
        d = p.opdef
        if d.view is not None and not d.copy and t is p.outputs[0]:
            t = p.inputs[0]
        elif d.inplace is not None and t is p.outputs[0]:
            t = p.inputs[d.inplace]
        else:
            break
    return t


def written_roots(op: "Op") -> Set[int]:
    """ids of the storages ``op`` writes: its in-place input, the inputs a call writes back."""
    if op.opdef.inplace is not None:
        return {id(storage_root(op.inputs[op.opdef.inplace]))}
    if "modified" in op.attrs and "input_index" in op.attrs:
        index = op.attrs["input_index"]
        return {id(storage_root(op.inputs[index.index(i)])) for i in op.attrs["modified"] if i in index}
    return set()


def _ops_depend(a: "Op", b: "Op") -> bool:
    """Whether ``a`` and ``b`` must keep their order: one reads what the other makes, or one
    writes storage the other reads, writes or makes a view of."""
    if any(o is i for o in a.outputs for i in b.inputs) or any(o is i for o in b.outputs for i in a.inputs):
        return True
    used_a = {id(storage_root(t)) for t in (*a.inputs, *a.outputs)}
    used_b = {id(storage_root(t)) for t in (*b.inputs, *b.outputs)}
    return bool(written_roots(a) & used_b or written_roots(b) & used_a)


def op_called_graphs(op: "Op") -> List[Graph]:
    """The graphs an op calls (its attrs hold them under ``graph`` / ``then_graph`` / ``else_graph``)."""
    return [v for k, v in op.attrs.items() if isinstance(v, Graph)]
