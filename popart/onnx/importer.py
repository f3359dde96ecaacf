"""The ONNX importer's driver: load a ModelProto, check it (unsupported ops, unknown input shapes),
then walk its nodes in order, turning each into popxl ops through the table in ``popart.onnx.ops``.
The top of ``popart.onnx``'s tree: it imports the table and its families (which import the
framework, ``table``, and never this module: a control op's entry imports its subgraphs through
``Node.imp.subgraph``).

Values flow through an environment that maps ONNX tensor names to either a NumPy array (a value
known at import: Constant outputs, shapes, anything computed only from those) or a popxl Tensor.
A node whose inputs are all known is folded with ONNX's reference implementation instead of
being lowered, so shape arithmetic (Shape -> Gather -> Concat -> Reshape ...) never reaches the
device. Floating-point initializers are weights: they become popxl variables, made on first use.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx

import popxl
import popxl.ops
from popxl import dtypes
from popxl.context import get_current_context

from popart.errors import OnnxImportError
from popart.onnx.functions import expand_functions
from popart.onnx.ops import OPS, Node
from popart.onnx.protos import device_array, device_dtype, op_key
from popart.onnx.table import Entry, Value
from popart.rounding import StochasticRounder
from popart.onnx.validate import (MIN_OPSET, check_element_type, check_graph, check_tensor_size, check_text,
                                  model_opset, newest_opset, tensor_array, unsupported_dtype_message)

logger = logging.getLogger("popart.ces")

__all__ = ["load_model", "InputSpec", "GraphImporter", "device_array", "device_dtype", "op_key", "MIN_OPSET",
           "newest_opset", "GRAPHCORE_DOMAIN", "SubgraphImporter"]

ModelLike = Union[str, bytes, os.PathLike, onnx.ModelProto]

GRAPHCORE_DOMAIN = "ai.graphcore"


def _reason(e: Exception) -> str:
    """An exception's message for an import error: as it is for the errors that say what was wrong
    (ValueError, TypeError, NotImplementedError), else with its type (a KeyError's text is a key)."""
    text = str(e)
    if type(e) in (ValueError, TypeError, NotImplementedError) and text:
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def load_model(model: ModelLike) -> onnx.ModelProto:
    """A ModelProto from a ModelProto, its serialised bytes, or the path of a file holding it."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as e:
            raise OnnxImportError(f"could not parse the ONNX ModelProto given as bytes: {e}") from None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise OnnxImportError(f"ONNX model file {path!r} does not exist (pass a path, the serialised "
                                  f"ModelProto as bytes, or an onnx.ModelProto).")
        try:
            return onnx.load(path)
        except Exception as e:
            raise OnnxImportError(f"could not read the ONNX model {path!r}: {e}") from None
    raise OnnxImportError(f"expected an ONNX model (path, serialised bytes or onnx.ModelProto), "
                          f"not {type(model).__name__}.")


class InputSpec:
    """A model input the host feeds: its name, shape and NumPy dtype (as the ONNX model declares it)."""

    def __init__(self, name: str, shape: Tuple[int, ...], dtype: np.dtype) -> None:
        self.name, self.shape, self.dtype = name, tuple(shape), np.dtype(dtype)

    @property
    def device_dtype(self) -> np.dtype:
        return device_dtype(self.dtype)

    def __repr__(self) -> str:
        return f"InputSpec({self.name!r}, {self.shape}, {self.dtype})"


def _declared_shape(vi: onnx.ValueInfoProto) -> Optional[Tuple[int, ...]]:
    """The fixed shape of a value info, or None if its rank or any dimension is unknown."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


class GraphImporter:
    """Checks an ONNX model and, inside a popxl graph context, lowers it node by node.

    ``input_shapes`` gives (shape, numpy dtype) for inputs whose shapes the model leaves open; it
    overrides the model's declaration where both exist.
    """

    def __init__(self, model: onnx.ModelProto,
                 input_shapes: Optional[Mapping[str, Tuple[Sequence[int], Any]]] = None) -> None:
        opset = self._default_opset(model)
        # Checked before function expansion, which may run onnx's shape inference on the model
        # (whose C++ aborts the process on some malformed nodes), and again once expanded.
        check_graph(model.graph, [opset] * len(model.graph.node))
        self._setup(model, opset, OPS)
        if self.model is not model:
            check_graph(self.graph, self._node_opsets)
        self.initializers: Dict[str, np.ndarray] = {t.name: tensor_array(t, f"initializer {t.name!r}")
                                                    for t in self.graph.initializer}
        self._check_supported()
        self.inputs = self._resolve_inputs(dict(input_shapes or {}))

    def _setup(self, model: onnx.ModelProto, opset: int, table: Mapping[str, Entry]) -> None:
        """What every importer (of a model or of a subgraph) starts with: the model with its functions
        expanded, and an empty walk state."""
        self.opset = opset
        self._ops = table
        # ops without an entry but defined as functions of other ops are replaced by their bodies
        self.model, self._node_opsets = expand_functions(model, table, opset)
        self.graph = self.model.graph
        self._values: Dict[str, Value] = {}
        self._weights: Dict[str, popxl.Tensor] = {}
        self._consts: Dict[str, popxl.Tensor] = {}
        self._materialize_weight: Optional[Callable[[str, np.ndarray], popxl.Tensor]] = None
        self._order: List[str] = []  # every tensor name, inputs first, in the order they appear
        # Stochastic rounding (SessionOptions.enableStochasticRounding): float32 -> float16 rounder.
        self.rounder: Optional[Callable[[popxl.Tensor], popxl.Tensor]] = None
        self._promoted: Dict[str, popxl.Tensor] = {}
        # Training: BatchNormalization uses batch statistics and records the new running
        # statistics here, (weight name, new value), for the session to write back.
        self.training = False
        # A source of fresh random seeds in the current graph (``split()``), for dropout when training.
        self.random: Optional[StochasticRounder] = None
        self.stat_updates: List[Tuple[str, popxl.Tensor]] = []
        self.popxl_graph: Optional[popxl.Graph] = None  # the popxl graph the nodes are lowered into
        self._lowering: List[str] = []  # the nodes being lowered, innermost last (subgraph walks nest)

    # checks -------------------------------------------------------------------------------------------
    @staticmethod
    def _default_opset(model: onnx.ModelProto) -> int:
        """The model's ai.onnx opset, once its operator sets and node domains are checked
        (``validate.model_opset``), and its IR version is one the installed onnx package reads."""
        check_text(model)
        if model.ir_version > onnx.IR_VERSION:
            raise OnnxImportError(f"the ONNX model has IR version {model.ir_version}, newer than the installed onnx "
                                  f"package ({onnx.__version__}) reads (up to {onnx.IR_VERSION}).")
        return model_opset(model)

    def _check_supported(self) -> None:
        """One error for every node the table cannot lower, grouped by op type."""
        bad: Dict[str, List[str]] = {}
        for i, node in enumerate(self.graph.node):
            key = op_key(node)
            if key not in self._ops:
                bad.setdefault(key, []).append(node.name or f"<node {i}>")
        if bad:
            lines = [f"  {op}: {', '.join(names)}" for op, names in sorted(bad.items())]
            raise OnnxImportError(
                f"the ONNX model has {sum(map(len, bad.values()))} node(s) of {len(bad)} unsupported op type(s):\n"
                + "\n".join(lines) + f"\nSupported op types: {', '.join(sorted(self._ops))}.")

    def _resolve_inputs(self, given: Dict[str, Tuple[Sequence[int], Any]]) -> List[InputSpec]:
        specs: List[InputSpec] = []
        unknown: List[Tuple[str, onnx.ValueInfoProto]] = []
        for vi in self.graph.input:
            if vi.name in self.initializers:
                continue  # older exporters also list initializers as inputs: they are weights
            if vi.name in given:
                shape, dt = given[vi.name]
                specs.append(InputSpec(vi.name, tuple(int(d) for d in shape), np.dtype(dt)))
                continue
            kind = vi.type.WhichOneof("value")
            if kind not in (None, "tensor_type"):
                raise OnnxImportError(f"model input {vi.name!r} is declared as a {kind.replace('_type', '')} value; "
                                      f"popart feeds tensors only.")
            declared = _declared_shape(vi)
            if declared is None:
                unknown.append((vi.name, vi))
                continue
            specs.append(InputSpec(vi.name, declared, check_element_type(vi.type.tensor_type.elem_type,
                                                                      f"model input {vi.name!r}")))
        if unknown:
            desc = ", ".join(f"{n!r} (declared {onnx.helper.printable_type(vi.type) or 'without a type'})"
                             for n, vi in unknown)
            raise OnnxImportError(
                f"the shape of model input(s) {desc} is not fully known. Give it with inputShapeInfo: "
                f"info = popart.InputShapeInfo(); info.add({unknown[0][0]!r}, popart.TensorInfo('FLOAT', [...])).")
        for spec in specs:
            check_tensor_size(f"model input {spec.name!r}", spec.shape, spec.device_dtype)
        return specs

    def node_opset(self, index: int) -> int:
        """The ai.onnx opset node ``index`` was written for: the model's, or that of the function
        body it came from."""
        return self._node_opsets[index]

    # values -------------------------------------------------------------------------------------------
    def names(self) -> List[str]:
        """Every tensor name the model defines (inputs, initializers, node outputs)."""
        return list(self._order)

    def has_value(self, name: str) -> bool:
        return name in self._values or name in self.initializers

    def is_foldable(self, name: str) -> bool:
        """Known at import and allowed to be computed with: import-time values and integer/bool
        initializers (shape data). Float initializers are weights and stay on the device."""
        if name in self._values:
            return isinstance(self._values[name], np.ndarray)
        init = self.initializers.get(name)
        return init is not None and init.dtype.kind in "iub"

    def static(self, name: str) -> Optional[np.ndarray]:
        """The import-time value of ``name`` (any initializer counts), or None if it has none."""
        v = self._values.get(name)
        if isinstance(v, np.ndarray):
            return v
        if v is None and name in self.initializers:
            return self.initializers[name]
        return None

    def tensor(self, name: str) -> popxl.Tensor:
        """``name`` as a popxl Tensor in the current graph (constants and weights made on first use)."""
        if name in self._promoted:
            return self._promoted[name]
        v = self._values.get(name)
        if isinstance(v, popxl.Tensor):
            return v
        if v is None and name in self.initializers:
            if name not in self._weights:
                if self._materialize_weight is None:
                    raise OnnxImportError(f"GraphImporter.tensor: {name!r} is a weight, made on the device by "
                                          f"lower(); it has no tensor before lower() is called.")
                self._weights[name] = self._materialize_weight(name, self.initializers[name])
            return self._weights[name]
        if v is None:
            raise OnnxImportError(f"tensor {name!r} is used before any node produces it (the graph must be "
                                  f"topologically sorted).")
        if name not in self._consts:
            self._consts[name] = popxl.constant(_device_value(name, v), name=_safe(name))
        return self._consts[name]

    @property
    def weights(self) -> Dict[str, popxl.Tensor]:
        """The initializers that became device tensors, by name."""
        return dict(self._weights)

    def _set(self, name: str, value: Value) -> None:
        if name not in self._values and name not in self.initializers:
            self._order.append(name)
        self._values[name] = value

    # the walk -----------------------------------------------------------------------------------------
    def lower(self, inputs: Mapping[str, popxl.Tensor],
              materialize_weight: Callable[[str, np.ndarray], popxl.Tensor]) -> None:
        """Lower every node into the current popxl graph. ``inputs`` holds a tensor per model input;
        ``materialize_weight(name, value)`` makes the device tensor of a weight on first use."""
        self._materialize_weight = materialize_weight
        self.popxl_graph = popxl.gcg()
        for spec in self.inputs:
            self._set(spec.name, inputs[spec.name])
        self._order.extend(n for n in self.initializers)
        context = get_current_context()
        hook = context.register_op_created_hook(self._check_op_outputs)
        try:
            self._walk()
        finally:
            context.remove_op_created_hook(hook)

    def _check_op_outputs(self, op: Any) -> None:
        """Every tensor an entry makes (a node's outputs and the intermediates it composes them
        from, in any graph) must fit in memory: checked as the op is traced, before the program
        that would allocate it exists."""
        for t in op.outputs:
            check_tensor_size(f"{self._lowering[-1] if self._lowering else 'the model'}: tensor {t.id!r} (of popxl "
                              f"op {op.type})", t.shape, t.dtype.as_numpy())

    def subgraph(self, graph: onnx.GraphProto, opset: int, capture: bool = False) -> "SubgraphImporter":
        """An importer of ``graph`` (an If branch, a Loop or Scan body) in this importer's scope: the
        control ops' entries (``popart.onnx.control``) import their subgraphs through it."""
        return SubgraphImporter(self, graph, opset, capture)

    def known(self, name: str) -> Optional[np.ndarray]:
        """``name``'s import-time value if it may be computed with (see ``is_foldable``), else None."""
        return self.static(name) if self.is_foldable(name) else None

    def value(self, name: str) -> Value:
        """``name``'s value: a NumPy array if it is known at import (see ``is_foldable``), else a Tensor."""
        known = self.known(name)
        return known if known is not None else self.tensor(name)

    def _walk(self) -> None:
        """Lower (or fold) the nodes of ``self.graph`` in order, recording their outputs."""
        for i, node in enumerate(self.graph.node):
            present = [x for x in node.input if x]
            for x in present:
                if not self.has_value(x):
                    raise OnnxImportError(f"node {node.name or i!r} ({node.op_type}) reads tensor {x!r}, which no "
                                          f"earlier node, input or initializer defines.")
            n = Node(self, node, i)
            outs: Optional[Sequence[Optional[Value]]] = \
                self._fold(node, n) if all(self.is_foldable(x) for x in present) and n.entry.foldable else None
            if outs is None:
                self._lowering.append(n.describe())
                try:
                    outs = self._lower_rounded(n, self.rounder) if self.rounder is not None else list(n.entry(n))
                except OnnxImportError:
                    raise
                except MemoryError as e:  # a request for more memory than there is (never allocated)
                    raise OnnxImportError(f"{n.describe()}: the values it needs at import do not fit in memory "
                                          f"({e}).") from None
                except Exception as e:  # whatever a node holds, the error names it
                    raise OnnxImportError(f"{n.describe()}: {_reason(e)}") from e
                finally:
                    self._lowering.pop()
            wanted = [o for o in node.output]
            for k, name in enumerate(wanted):
                if not name:
                    continue
                out = outs[k] if k < len(outs) else None
                if out is None:
                    raise OnnxImportError(f"{n.describe()}: output {k} ({name!r}) is not supported.")
                self._set(name, out)

    def _lower_rounded(self, n: Node, rounder: Callable[[popxl.Tensor], popxl.Tensor]) -> List[Optional[Value]]:
        """Lower a node so that its float16 results are rounded stochastically: float16 inputs are
        computed with in float32 and the float32 results rounded to float16 by ``rounder``.
        Nodes that only move data produce exact values and are lowered as they are."""
        node = n.proto
        if node.op_type in _EXACT_OPS or node.op_type in _CONTROL_OPS:  # control ops: their bodies' nodes round
            return list(n.entry(n))
        if node.op_type == "Cast":
            outs = list(n.entry(n))
            x = self.tensor(node.input[0])
            if outs[0] is not None and isinstance(outs[0], popxl.Tensor) and outs[0].dtype == dtypes.float16 \
                    and x.dtype == dtypes.float32:
                return [rounder(x)]
            return outs
        halves: Dict[str, popxl.Tensor] = {}
        for x in dict.fromkeys(i for i in node.input if i):
            v = self.known(x)
            if v is not None:  # an import-time value: widened exactly, as a constant
                if v.dtype == np.float16:
                    halves[x] = popxl.constant(v.astype(np.float32), name=_safe(x))
                continue
            t = self.tensor(x)
            if t.dtype == dtypes.float16:
                halves[x] = popxl.ops.cast(t, dtypes.float32)
        if not halves:
            return list(n.entry(n))
        self._promoted = halves
        try:
            outs = list(n.entry(n))
        finally:
            self._promoted = {}
        return [rounder(o) if isinstance(o, popxl.Tensor) and o.dtype == dtypes.float32 else o for o in outs]

    def _fold(self, node: onnx.NodeProto, n: Node) -> Optional[List[Optional[np.ndarray]]]:
        """Compute a node whose inputs are all known: by its entry's own import-time evaluation where
        it has one (``ops.onnx_fold``), else with ONNX's reference implementation. None when the
        reference has no implementation of the op at the node's opset: the node is then lowered
        as any other, its inputs constants (what the device computes is the op's meaning here)."""
        with np.errstate(all="ignore"):  # inf and NaN are results like any other (1 / 0 is inf)
            return self._evaluate(node, n)

    def _evaluate(self, node: onnx.NodeProto, n: Node) -> Optional[List[Optional[np.ndarray]]]:
        if n.entry.fold is not None:
            try:
                outs = n.entry.fold(n, *[self.static(x) if x else None for x in node.input])
            except OnnxImportError:
                raise
            except Exception as e:
                raise OnnxImportError(f"{n.describe()}: could not evaluate at import: {_reason(e)}") from e
            return [None if v is None else np.asarray(v) for v in outs]
        # onnx.reference loads NumPy implementations of every ONNX op: only for a model that needs it
        from onnx.reference import ReferenceEvaluator  # noqa: PLC0415
        feeds = {x: self.static(x) for x in node.input if x}
        # Evaluated as a one-node graph: a bare NodeProto is always run by the latest opset's
        # implementation (ReferenceEvaluator ignores ``opsets`` for it), wrong for attribute forms
        # of older opsets (Unsqueeze-11's axes, say).
        opsets = {"": n.opset}
        if node.domain not in ("", "ai.onnx"):
            opsets[node.domain] = 1
        untyped = onnx.TypeProto()
        produced = [o for o in node.output if o]
        graph = onnx.helper.make_graph([node], "fold", [onnx.helper.make_value_info(x, untyped) for x in feeds],
                                       [onnx.helper.make_value_info(o, untyped) for o in produced])
        try:
            evaluator = ReferenceEvaluator(graph, opsets=opsets)
        except Exception as e:  # the reference lacks the op (or this opset's form of it)
            logger.debug("%s: computed on the device, ONNX's reference cannot evaluate it: %s", n.describe(), e)
            return None
        try:
            results = dict(zip(produced, evaluator.run(None, feeds)))
        except Exception as e:
            raise OnnxImportError(f"{n.describe()}: could not evaluate at import: {_reason(e)}") from None
        return [np.asarray(results[o]) if o and results.get(o) is not None else None for o in node.output]


# ONNX ops whose float results are copies of input values (exact in any precision).
_EXACT_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Gather", "Slice",
                        "Concat", "Split", "Expand", "Tile", "Pad", "GatherElements", "DepthToSpace",
                        "SpaceToDepth", "Shape", "Size", "Relu", "Neg", "Abs", "MaxPool", "ReduceMax",
                        "ReduceMin", "Max", "Min", "Where", "TopK", "ArgMax", "ArgMin"})


# Ops whose nodes hold subgraphs (lowered by ``SubgraphImporter`` walks, node by node).
_CONTROL_OPS = frozenset({"If", "Loop", "Scan"})


class SubgraphImporter(GraphImporter):
    """Imports an ONNX subgraph (an If branch, a Loop or Scan body) inside the scope of ``parent``.

    The subgraph's nodes are walked as a model's are; a name the subgraph does not define is looked
    up in the enclosing scope. With ``capture=False`` the nodes are lowered into the parent's popxl
    graph (the subgraph is inlined: a taken branch, an unrolled iteration). With ``capture=True`` they
    are lowered into a separate popxl graph (current when ``run`` is called, ``popxl_graph``): outer
    values known at import become constants there, outer device tensors become inputs of that graph,
    recorded in ``captured`` (name -> (parent tensor, graph input)) in the order they were made.
    Initializers of the subgraph are values known at import.
    """

    def __init__(self, parent: GraphImporter, graph: onnx.GraphProto, opset: int, capture: bool = False) -> None:
        self.parent = parent
        body = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                      functions=list(parent.model.functions))
        self._setup(body, opset, parent._ops)
        self.initializers = {}
        self._check_supported_subgraph()
        self.inputs = []
        self._lowering = parent._lowering
        self._own_initializers = {t.name: tensor_array(t, f"initializer {t.name!r} of subgraph {graph.name!r}")
                                  for t in graph.initializer}
        self._materialize_weight = parent._materialize_weight
        # The parent's seed is a tensor of the parent graph: a subgraph lowered as a graph of its own
        # has none (its float16 results round to nearest; a random op in it needs a seed attribute).
        self.rounder, self.random = (None, None) if capture else (parent.rounder, parent.random)
        self.training = parent.training
        self.stat_updates = parent.stat_updates
        self.capture = capture
        self.popxl_graph = None if capture else parent.popxl_graph
        self.captured: Dict[str, Tuple[popxl.Tensor, popxl.Tensor]] = {}

    def _check_supported_subgraph(self) -> None:
        bad = sorted({op_key(n) for n in self.graph.node if op_key(n) not in self._ops})
        if bad:
            raise OnnxImportError(f"subgraph {self.graph.name!r} has node(s) of unsupported op type(s) "
                                  f"{', '.join(bad)}.")

    def run(self, bindings: Mapping[str, Value]) -> List[Value]:
        """Bind the subgraph's inputs (name -> value), walk its nodes in the current popxl graph and
        return the values of its outputs (NumPy arrays where known at import, else Tensors; with
        ``capture``, always Tensors of this graph). Each call is a fresh walk (one per unrolled iteration)."""
        self._values, self._consts, self._order = dict(self._own_initializers), {}, list(self._own_initializers)
        if self.capture:
            self.popxl_graph = popxl.gcg()
        for name, v in bindings.items():
            self._set(name, v if isinstance(v, popxl.Tensor) else np.asarray(v))
        self._walk()
        names = [o.name for o in self.graph.output]
        return [self.tensor(o) for o in names] if self.capture else [self.value(o) for o in names]

    def _local(self, name: str) -> bool:
        return name in self._values

    def has_value(self, name: str) -> bool:
        return self._local(name) or self.parent.has_value(name)

    def is_foldable(self, name: str) -> bool:
        if self._local(name):
            return isinstance(self._values[name], np.ndarray)
        return self.parent.is_foldable(name)

    def static(self, name: str) -> Optional[np.ndarray]:
        if self._local(name):
            v = self._values[name]
            return v if isinstance(v, np.ndarray) else None
        return self.parent.static(name)

    def tensor(self, name: str) -> popxl.Tensor:
        if name in self._promoted:
            return self._promoted[name]
        if self._local(name):
            return super().tensor(name)
        if not self.capture:
            return self.parent.tensor(name)
        if name in self.captured:
            return self.captured[name][1]
        if name in self._consts:
            return self._consts[name]
        known = self.parent.known(name)
        if known is not None:  # known at import: a constant of this graph
            self._consts[name] = popxl.constant(_device_value(name, known), name=_safe(name))
            return self._consts[name]
        if not self.parent.has_value(name):
            raise OnnxImportError(f"subgraph {self.graph.name!r} reads tensor {name!r}, which neither it nor "
                                  f"an enclosing scope defines.")
        assert self.parent.popxl_graph is not None, "a subgraph is captured while its parent is lowered"
        with self.parent.popxl_graph:
            outer = self.parent.tensor(name)
        inner = popxl.graph_input(outer.shape, outer.dtype, name=_safe(name))
        self.captured[name] = (outer, inner)
        return inner


def _device_value(name: str, value: np.ndarray) -> np.ndarray:
    """Import-time value ``name`` as the device holds it; an error naming it if its element type
    (a string, a bfloat16 ... computed at import) cannot be on the device."""
    problem = unsupported_dtype_message(value.dtype)
    if problem:
        raise OnnxImportError(f"tensor {name!r}, computed at import, is needed on the device but {problem}.")
    return device_array(value)


def _safe(name: str) -> str:
    """A popxl tensor name for an ONNX name (popxl scopes names with '/')."""
    return name.replace("/", "_") or "onnx"
