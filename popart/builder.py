"""``popart.Builder``: build (or extend) an ONNX model op by op.

The Builder holds a real ``onnx.ModelProto``; ``getModelProto()`` serialises it, and the
importer (the same one ``InferenceSession`` and ``TrainingSession`` use) runs it.

- ``builder.aiOnnx.<op>(inputs, *attrs, **attrs)``: one method per ONNX op the importer supports,
  generated from the importer's op table and ONNX's operator schemas (so there is exactly one
  place that says which ops exist). Method names are the op types in lower case (``matmul``,
  ``batchnormalization``). Attributes are keywords; positional attributes follow PopART's order:
  ``num_outputs`` first for ops with optional or variadic outputs, then required attributes,
  then optional ones, each alphabetically. An op with more than one possible output returns a
  list of tensor ids, others one id.
- ``builder.aiGraphcore``: the losses ``nllloss``, ``l1loss`` and ``identityloss``.
- Tensor ids are unique strings; ``with builder.nameScope("enc"):`` prefixes them with ``enc/``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from popart.dataflow import TensorInfo
from popart.errors import popart_exception
from popart.losses import GRAPHCORE_DOMAIN, ReductionType, loss_node, reduction_of
from popart.onnx import supported_ops
from popart.onnx.importer import ModelLike, load_model

__all__ = ["Builder", "AiOnnx", "AiGraphcore"]

DEFAULT_OPSET = 11  # PopART's default ai.onnx opset
_GRAPHCORE_OPSET = 1
Ids = Union[str, List[str]]


def _onnx_type(name: Union[str, np.dtype, type]) -> int:
    """An ONNX element type from a PopART type name ("FLOAT", "INT32", ...) or a NumPy dtype."""
    if isinstance(name, str):
        key = name.upper()
        if key == "FLOAT32":
            key = "FLOAT"
        if key not in onnx.TensorProto.DataType.keys():
            raise popart_exception(f"unknown data type {name!r}; use one of {onnx.TensorProto.DataType.keys()[1:]}.")
        return onnx.TensorProto.DataType.Value(key)
    return helper.np_dtype_to_tensor_dtype(np.dtype(name))


class _OpMethod:
    """``builder.aiOnnx.<op>``: adds one node of ``op_type`` (see the module docstring)."""

    def __init__(self, builder: "Builder", op_type: str) -> None:
        self._builder = builder
        self.op_type = op_type
        try:
            schema = onnx.defs.get_schema(op_type, builder._opset)
        except onnx.defs.SchemaError:
            # The op is newer than the model's opset: the method exists and says so when called.
            since = min(sc.since_version for sc in onnx.defs.get_all_schemas_with_history()
                        if sc.name == op_type and sc.domain == "")
            self._unavailable = (f"aiOnnx.{op_type.lower()}: {op_type} needs ai.onnx opset {since} or later; this "
                                 f"model uses opset {builder._opset} (Builder(opsets={{'ai.onnx': {since}}})).")
            return
        self._unavailable = ""
        self._multi = schema.max_output > 1
        self._variable_outputs = schema.max_output != schema.min_output
        attrs = schema.attributes
        required = sorted(k for k, a in attrs.items() if a.required)
        optional = sorted((k for k, a in attrs.items() if not a.required), key=lambda k: (k == "auto_pad", k))
        self._positional = (["num_outputs"] if self._variable_outputs else []) + required + optional
        self._min_outputs = schema.min_output
        self._split_outputs = op_type == "Split"
        self.__doc__ = f"Add an ONNX {op_type} node (opset {builder._opset}); attributes: {self._positional}."

    def __call__(self, args: Sequence[str] = (), *positional: Any, debugContext: str = "", debugPrefix: str = "",
                 **attrs: Any) -> Ids:
        if self._unavailable:
            raise popart_exception(self._unavailable)
        if isinstance(args, str):
            args = [args]
        if len(positional) > len(self._positional):
            raise popart_exception(f"aiOnnx.{self.op_type.lower()}: too many positional arguments; attributes are "
                                   f"{self._positional} (give them as keywords).")
        for name, value in zip(self._positional, positional):
            if name in attrs:
                raise popart_exception(f"aiOnnx.{self.op_type.lower()}: {name!r} given twice.")
            attrs[name] = value
        num_outputs = attrs.pop("num_outputs", None)
        if num_outputs is None:
            num_outputs = self._min_outputs
            if self._split_outputs and attrs.get("split") is not None:
                num_outputs = len(attrs["split"])
        if self.op_type == "Cast" and isinstance(attrs.get("to"), str):
            attrs["to"] = _onnx_type(attrs["to"])
        attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.items() if v is not None}
        outs = self._builder._add_node(self.op_type, list(args), int(num_outputs), attrs,
                                       debugContext or debugPrefix)
        return outs if self._multi else outs[0]


class AiOnnx:
    """The ``ai.onnx`` ops of a Builder: one method per op type the importer can lower."""

    def __init__(self, builder: "Builder") -> None:
        self._builder = builder
        self._names = {t.lower(): t for t in supported_ops() if "." not in t}

    def __getattr__(self, name: str) -> _OpMethod:
        names = self.__dict__.get("_names", {})
        if name not in names:
            raise AttributeError(f"Builder.aiOnnx has no op {name!r}; the importer supports: "
                                 f"{', '.join(sorted(names))}.")
        method = _OpMethod(self._builder, names[name])
        setattr(self, name, method)  # cached: the schema is read once
        return method

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self._names))

    def constant(self, value: Any, debugContext: str = "") -> str:
        """A Constant node holding ``value`` (a NumPy array or scalar)."""
        arr = np.asarray(value)
        tensor = numpy_helper.from_array(arr, "value")
        return self._builder._add_node("Constant", [], 1, {"value": tensor}, debugContext)[0]


class AiGraphcore:
    """PopART's own ops: the losses a TrainingSession minimises (each returns the loss tensor id)."""

    def __init__(self, builder: "Builder") -> None:
        self._builder = builder

    def nllloss(self, args: Sequence[str], reduction: Union[ReductionType, int, str] = ReductionType.Mean,
                ignoreIndex: Optional[int] = None, inputIsLogProbability: bool = False,
                debugContext: str = "") -> str:
        """Negative log likelihood of labels ``args[1]`` (int, shape [N]) under probabilities
        ``args[0]`` ([N, C]); scalar unless ``reduction`` is NoReduction."""
        probs, labels = self._two(args, "nllloss")
        shape = [] if reduction_of(reduction) is not ReductionType.NoReduction else self._builder._shape_or_none(labels)
        return self._builder._add_loss("Nll", [probs, labels], reduction, debugContext or "Nll", shape,
                                       self._builder._dtype_or_float(probs), ignoreIndex=ignoreIndex,
                                       inputIsLogProbability=int(bool(inputIsLogProbability)))

    def l1loss(self, args: Sequence[str], lambda_: float = 1.0,
               reduction: Union[ReductionType, int, str] = ReductionType.Mean, debugContext: str = "",
               **kwargs: Any) -> str:
        """``lambda * |args[0]|``, reduced (``lambda`` may also be given as ``lmbda=``)."""
        lmbda = float(kwargs.pop("lmbda", lambda_))
        if kwargs:
            raise popart_exception(f"aiGraphcore.l1loss: unknown arguments {sorted(kwargs)}.")
        (x,) = self._one(args, "l1loss")
        return self._builder._add_loss("L1", [x], reduction, debugContext or "L1", self._reduced_shape(x, reduction),
                                       self._builder._dtype_or_float(x), **{"lambda": lmbda})

    def identityloss(self, args: Sequence[str], reduction: Union[ReductionType, int, str] = ReductionType.Mean,
                     debugContext: str = "") -> str:
        """``args[0]`` itself as the loss, reduced."""
        (x,) = self._one(args, "identityloss")
        return self._builder._add_loss("IdentityLoss", [x], reduction, debugContext or "IdentityLoss",
                                       self._reduced_shape(x, reduction), self._builder._dtype_or_float(x))

    def _reduced_shape(self, x: str, reduction: Union[ReductionType, int, str]) -> Optional[List[int]]:
        return [] if reduction_of(reduction) is not ReductionType.NoReduction else self._builder._shape_or_none(x)

    @staticmethod
    def _one(args: Sequence[str], what: str) -> List[str]:
        args = [args] if isinstance(args, str) else list(args)
        if len(args) != 1:
            raise popart_exception(f"aiGraphcore.{what} takes one input tensor, got {args}.")
        return args

    @staticmethod
    def _two(args: Sequence[str], what: str) -> List[str]:
        args = list(args)
        if len(args) != 2:
            raise popart_exception(f"aiGraphcore.{what} takes [probabilities, labels], got {args}.")
        return args


class Builder:
    """Builds an ONNX model. ``Builder()`` starts an empty one; ``Builder(path_or_proto)`` extends
    an existing model (file path, serialised bytes or ModelProto). ``opsets`` may set the
    ``ai.onnx`` opset of a new model: ``Builder(opsets={"ai.onnx": 13, "ai.graphcore": 1})``."""

    def __init__(self, modelProtoOrFilename: Optional[ModelLike] = None,
                 opsets: Optional[Dict[str, int]] = None) -> None:
        if modelProtoOrFilename is not None:
            self._model = onnx.ModelProto()
            self._model.CopyFrom(load_model(modelProtoOrFilename))
        else:
            version = int((opsets or {}).get("ai.onnx", DEFAULT_OPSET))
            graph = helper.make_graph([], "BuilderGraph", [], [])
            self._model = helper.make_model(graph, producer_name="popart-cpu",
                                            opset_imports=[helper.make_opsetid("", version)])
            self._model.ir_version = 8
        self._opset = next((o.version for o in self._model.opset_import if o.domain in ("", "ai.onnx")),
                           DEFAULT_OPSET)
        self._scopes: List[str] = []
        self._used = {n for n in self._all_names()}
        self._shapes: Dict[str, onnx.ValueInfoProto] = {}  # value infos of ai.graphcore outputs
        self._inferred: Optional[Dict[str, onnx.ValueInfoProto]] = None
        # Annotations of nodes (virtual graph, pipeline stage, ...), keyed by the node's first
        # output; the ones of enclosing context managers apply to every node created inside.
        self._annotations: Dict[str, Dict[str, Any]] = {}
        self._context: Dict[str, Any] = {}
        self.aiOnnx = AiOnnx(self)
        self.aiGraphcore = AiGraphcore(self)

    # PopART also names the ONNX ops by opset; all of them build nodes of this model's opset.
    @property
    def aiOnnxOpset11(self) -> AiOnnx:
        return self.aiOnnx

    # names ------------------------------------------------------------------------------------------
    def _all_names(self) -> Iterator[str]:
        g = self._model.graph
        yield from (v.name for v in g.input)
        yield from (t.name for t in g.initializer)
        for node in g.node:
            yield from node.output

    def _unique(self, base: str) -> str:
        name = "/".join(self._scopes + [base])
        if name not in self._used:
            self._used.add(name)
            return name
        k = 1
        while f"{name}/{k}" in self._used:
            k += 1
        self._used.add(f"{name}/{k}")
        return f"{name}/{k}"

    @contextlib.contextmanager
    def nameScope(self, name: str) -> Iterator[None]:
        """Tensor ids created inside get the prefix ``name/`` (scopes nest)."""
        self._scopes.append(str(name))
        try:
            yield
        finally:
            self._scopes.pop()

    def getNameScope(self, name: str = "") -> str:
        return "/".join(self._scopes + ([name] if name else []))

    def _check_ids(self, ids: Sequence[str], what: str) -> None:
        known = set(self._all_names())
        missing = [i for i in ids if i and i not in known]
        if missing:
            raise popart_exception(f"{what}: {missing} are not tensors of the model (its tensors include "
                                   f"{sorted(known)[:20]}).")

    # inputs and outputs -----------------------------------------------------------------------------
    def addInputTensor(self, tensorInfo: Union[TensorInfo, str], shape: Any = None, debugContext: str = "") -> str:
        """A model input: ``addInputTensor(popart.TensorInfo("FLOAT", [4, 3]))`` or
        ``addInputTensor("FLOAT", [4, 3])``. Returns its id."""
        if not isinstance(tensorInfo, TensorInfo):
            if isinstance(shape, str) or shape is None:
                raise popart_exception("addInputTensor: give a popart.TensorInfo, or a data type and a shape.")
            tensorInfo = TensorInfo(tensorInfo, shape)
        elif isinstance(shape, str):
            debugContext = shape
        name = self._unique(debugContext or "input")
        self._model.graph.input.append(helper.make_tensor_value_info(
            name, _onnx_type(tensorInfo.numpy_dtype()), tensorInfo.shape()))
        self._changed()
        return name

    def addUntypedInputTensor(self, debugContext: str = "") -> str:
        """A model input whose type and shape are given later (``inputShapeInfo``)."""
        name = self._unique(debugContext or "input")
        self._model.graph.input.append(helper.make_empty_tensor_value_info(name))
        self._changed()
        return name

    def addInitializedInputTensor(self, initVal: np.ndarray, debugContext: str = "") -> str:
        """A weight with initial value ``initVal``; returns its id."""
        arr = np.asarray(initVal)
        if arr.dtype == np.float64:
            raise popart_exception("addInitializedInputTensor: float64 weights are not supported; "
                                   "use float32 or float16.")
        name = self._unique(debugContext or "init_input")
        self._model.graph.initializer.append(numpy_helper.from_array(arr, name))
        self._changed()
        return name

    def addOutputTensor(self, tensorId: str) -> None:
        """Mark ``tensorId`` as a model output."""
        self._check_ids([tensorId], "addOutputTensor")
        if tensorId in self.getOutputTensorIds():
            return
        info = self._value_info(tensorId)
        self._model.graph.output.append(info if info is not None else helper.make_empty_tensor_value_info(tensorId))

    # nodes ------------------------------------------------------------------------------------------
    def _add_node(self, op_type: str, inputs: List[str], num_outputs: int, attrs: Dict[str, Any],
                  debug: str, domain: str = "") -> List[str]:
        self._check_ids(inputs, f"aiOnnx.{op_type.lower()}" if not domain else op_type)
        base = debug or op_type
        outputs = [self._unique(f"{base}:{k}") for k in range(max(num_outputs, 1))]
        node = helper.make_node(op_type, inputs, outputs, name=self._unique(base + "_node"),
                                domain=domain, **attrs)
        self._model.graph.node.append(node)
        self._annotations[outputs[0]] = dict(self._context)
        self._changed()
        return outputs

    def _add_loss(self, op_type: str, inputs: List[str], reduction: Any, debug: str, shape: Optional[List[int]],
                  elem_type: int, **attrs: Any) -> str:
        self._check_ids(inputs, f"aiGraphcore.{op_type}")
        if not any(o.domain == GRAPHCORE_DOMAIN for o in self._model.opset_import):
            self._model.opset_import.append(helper.make_opsetid(GRAPHCORE_DOMAIN, _GRAPHCORE_OPSET))
        out = self._unique(f"{debug}:0")
        self._model.graph.node.append(loss_node(op_type, inputs, out, reduction, name=self._unique(debug), **attrs))
        # ONNX shape inference does not know this domain: record the output's type here.
        self._shapes[out] = helper.make_tensor_value_info(out, elem_type, shape)
        self._changed()
        return out

    # annotations ------------------------------------------------------------------------------------
    # PopART uses these to place and schedule ops on IPUs; on the CPU there is one device and they
    # only travel with the Builder (kept out of the ONNX proto, so other runtimes accept it).
    @contextlib.contextmanager
    def _annotate(self, name: str, value: Any) -> Iterator[None]:
        saved = dict(self._context)
        self._context[name] = value
        try:
            yield
        finally:
            self._context = saved

    def virtualGraph(self, value: int) -> Any:
        """``with builder.virtualGraph(1):`` nodes created inside are on virtual graph (IPU) 1."""
        return self._annotate("__ipu_number", int(value))

    def pipelineStage(self, value: int) -> Any:
        return self._annotate("__pipeline_stage", int(value))

    def executionPhase(self, value: int) -> Any:
        return self._annotate("__execution_phase", int(value))

    def schedulePriority(self, value: float) -> Any:
        return self._annotate("__schedule_priority", float(value))

    def _node_of(self, nodeOutputNames: Union[str, Sequence[str]], what: str) -> str:
        first = nodeOutputNames if isinstance(nodeOutputNames, str) else list(nodeOutputNames)[0]
        for node in self._model.graph.node:
            if first in node.output:
                return node.output[0]
        raise popart_exception(f"{what}: {first!r} is not the output of a node of the model.")

    def addNodeAttribute(self, attributeName: str, attributeValue: Any,
                         nodeOutputNames: Union[str, Sequence[str]]) -> None:
        """Annotate the node producing ``nodeOutputNames``."""
        key = self._node_of(nodeOutputNames, "addNodeAttribute")
        self._annotations.setdefault(key, {})[attributeName] = attributeValue

    def nodeHasAttribute(self, attributeName: str, nodeOutputNames: Union[str, Sequence[str]]) -> bool:
        return attributeName in self._annotations.get(self._node_of(nodeOutputNames, "nodeHasAttribute"), {})

    def getNodeAttribute(self, attributeName: str, nodeOutputNames: Union[str, Sequence[str]]) -> Any:
        notes = self._annotations.get(self._node_of(nodeOutputNames, "getNodeAttribute"), {})
        if attributeName not in notes:
            raise popart_exception(f"getNodeAttribute: the node of {nodeOutputNames!r} has no attribute "
                                   f"{attributeName!r}.")
        return notes[attributeName]

    def getVirtualGraph(self, nodeOutputNames: Union[str, Sequence[str]]) -> int:
        return int(self.getNodeAttribute("__ipu_number", nodeOutputNames))

    def getPipelineStage(self) -> int:
        if "__pipeline_stage" not in self._context:
            raise popart_exception("getPipelineStage: not inside a pipelineStage context.")
        return int(self._context["__pipeline_stage"])

    def setAvailableMemoryProportion(self, nodeOutputNames: Union[str, Sequence[str]], value: float) -> None:
        self.addNodeAttribute("__available_memory_proportion", float(value), nodeOutputNames)

    def setPartialsType(self, nodeOutputName: str, partialsType: str) -> None:
        self.addNodeAttribute("__partials_type", str(partialsType), nodeOutputName)

    def recomputeOutputInBackwardPass(self, nodeOutputNames: Union[str, Sequence[str]], value: Any = True) -> None:
        self.addNodeAttribute("__recompute_output_in_backward_pass", value, nodeOutputNames)

    def setSerializeMatMul(self, nodeOutputNames: Union[str, Sequence[str]], mode: str, factor: int = 0,
                           keep_precision: bool = False) -> None:
        self.addNodeAttribute("__serialize_matmul", (mode, int(factor), bool(keep_precision)), nodeOutputNames)

    # shapes -----------------------------------------------------------------------------------------
    def _changed(self) -> None:
        self._inferred = None

    def _value_infos(self) -> Dict[str, onnx.ValueInfoProto]:
        if self._inferred is None:
            model = onnx.ModelProto()
            model.CopyFrom(self._model)
            model.graph.value_info.extend(self._shapes.values())
            try:
                model = shape_inference.infer_shapes(model, strict_mode=False)
            except Exception:  # an inconsistent graph: report what is declared
                pass
            g = model.graph
            infos = {v.name: v for v in (*g.value_info, *g.output, *g.input)}
            for t in g.initializer:
                infos[t.name] = helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
            self._inferred = infos
        return self._inferred

    def _value_info(self, tensorId: str) -> Optional[onnx.ValueInfoProto]:
        v = self._value_infos().get(tensorId)
        return v if v is not None and v.type.tensor_type.HasField("shape") else None

    def _shape_or_none(self, tensorId: str) -> Optional[List[int]]:
        v = self._value_info(tensorId)
        if v is None:
            return None
        dims = v.type.tensor_type.shape.dim
        return [int(d.dim_value) if d.HasField("dim_value") else -1 for d in dims]

    def _dtype_or_float(self, tensorId: str) -> int:
        v = self._value_infos().get(tensorId)
        return v.type.tensor_type.elem_type if v is not None and v.type.tensor_type.elem_type else \
            onnx.TensorProto.FLOAT

    def getTensorShape(self, tensorId: str) -> List[int]:
        """The shape of ``tensorId`` (by ONNX shape inference); -1 marks an unknown dimension."""
        self._check_ids([tensorId], "getTensorShape")
        shape = self._shape_or_none(tensorId)
        if shape is None:
            raise popart_exception(f"getTensorShape: the shape of {tensorId!r} cannot be inferred (an input "
                                   f"without a shape feeds it).")
        return shape

    def getTensorDtypeString(self, tensorId: str) -> str:
        self._check_ids([tensorId], "getTensorDtypeString")
        return onnx.TensorProto.DataType.Name(self._dtype_or_float(tensorId)).lower()

    def isInitializer(self, tensorId: str) -> bool:
        return any(t.name == tensorId for t in self._model.graph.initializer)

    # the model --------------------------------------------------------------------------------------
    def getInputTensorIds(self) -> List[str]:
        """Model inputs, weights excluded."""
        inits = {t.name for t in self._model.graph.initializer}
        return [v.name for v in self._model.graph.input if v.name not in inits]

    def getOutputTensorIds(self) -> List[str]:
        return [v.name for v in self._model.graph.output]

    def getTrainableTensorIds(self) -> List[str]:
        """The weights (floating-point initializers)."""
        return [t.name for t in self._model.graph.initializer
                if helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"]

    def getValueTensorIds(self) -> List[str]:
        return [o for node in self._model.graph.node for o in node.output]

    def getAllTensorIds(self) -> List[str]:
        return list(self._all_names())

    def setGraphName(self, name: str) -> None:
        self._model.graph.name = name

    def getModelProto(self) -> bytes:
        """The model, serialised (what the sessions and ``onnx.load_from_string`` take)."""
        model = onnx.ModelProto()
        model.CopyFrom(self._model)
        infos = self._value_infos()
        for out in model.graph.output:  # give outputs declared without a type the inferred one
            if not out.type.HasField("tensor_type") and out.name in infos:
                out.CopyFrom(infos[out.name])
        return model.SerializeToString()

    def saveModelProto(self, filename: str) -> None:
        with open(filename, "wb") as f:
            f.write(self.getModelProto())

    def __repr__(self) -> str:
        return (f"Builder({len(self._model.graph.node)} nodes, inputs={self.getInputTensorIds()}, "
                f"outputs={self.getOutputTensorIds()})")
