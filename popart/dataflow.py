"""How data moves between the host and a session: ``DataFlow`` and ``AnchorReturnType`` (what to
return, and how often), ``TensorInfo`` / ``InputShapeInfo`` (shapes the ONNX model leaves open), and
the step IO objects ``PyStepIO`` / ``PyStepIOCallback`` that carry the buffers of one ``run``."""
from __future__ import annotations

import builtins
from enum import Enum
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from popart.errors import popart_exception

__all__ = ["AnchorReturnTypeId", "AnchorReturnType", "DataFlow", "TensorInfo", "InputShapeInfo", "PyStepIO",
           "PyStepIOCallback", "PyWeightsIO", "DataType"]


class AnchorReturnTypeId(Enum):
    """How the per-batch values of an anchor are returned by one ``run``."""
    FINAL = 0
    EVERYN = 1
    ALL = 2
    SUM = 3
    # PopART's Python binding also spells them in CamelCase.
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3


class AnchorReturnType:
    """``AnchorReturnType("ALL" | "FINAL" | "SUM")`` or ``AnchorReturnType("EVERYN", N)``
    (case-insensitive). ``tileSet`` and ``exchangeStrategy`` are accepted for compatibility."""

    def __init__(self, artString: str, returnPeriod: Optional[int] = None, tileSet: object = None,
                 exchangeStrategy: object = None) -> None:
        key = str(artString).upper()
        if key not in ("ALL", "FINAL", "SUM", "EVERYN"):
            raise popart_exception(f"AnchorReturnType: unknown return type {artString!r}; use 'All', 'Final', "
                                   f"'Sum' or 'EveryN' (case-insensitive).")
        period = 0
        if key == "EVERYN":
            if returnPeriod is None:
                raise popart_exception("AnchorReturnType('EveryN') needs a return period N: "
                                       "AnchorReturnType('EveryN', N).")
            if isinstance(returnPeriod, bool) or not isinstance(returnPeriod, (int, np.integer)) or returnPeriod < 1:
                raise popart_exception(f"AnchorReturnType('EveryN', N): N must be a positive int, "
                                       f"not {returnPeriod!r}.")
            period = int(returnPeriod)
        elif returnPeriod is not None and not isinstance(returnPeriod, (int, np.integer)):
            # PopART's positional (artString, tileSet) form: the second argument is not a period.
            tileSet, returnPeriod = returnPeriod, None
        self._id = AnchorReturnTypeId[key]
        self._str = str(artString)
        self._rp = period
        self._tile_set = tileSet
        self._exchange_strategy = exchangeStrategy

    def id(self) -> AnchorReturnTypeId:
        return self._id

    def rp(self) -> int:
        """The return period N of an EVERYN anchor."""
        if self._id is not AnchorReturnTypeId.EVERYN:
            raise popart_exception(f"AnchorReturnType({self._str!r}) has no return period; only EveryN has one.")
        return self._rp

    # PopART's method ``str`` hides the builtin in this class's body: annotations here say builtins.str.
    def str(self) -> builtins.str:
        return self._str

    def tileSet(self) -> object:
        return self._tile_set

    def exchangeStrategy(self) -> object:
        return self._exchange_strategy

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnchorReturnType) and (self._id, self._rp) == (other._id, other._rp)

    def __hash__(self) -> int:
        return hash((self._id, self._rp))

    def __repr__(self) -> builtins.str:
        return f"AnchorReturnType({self._id.name}{', ' + str(self._rp) if self._rp else ''})"


class DataFlow:
    """``DataFlow(batchesPerStep, {tensorId: AnchorReturnType})`` or
    ``DataFlow(batchesPerStep, [tensorIds], AnchorReturnType("All"))``: how many batches one
    ``run`` processes, and which tensors (any tensor of the model, not only its outputs) it returns."""

    def __init__(self, batchesPerStep: int = 0,
                 anchors: Union[Mapping[str, AnchorReturnType], Sequence[str], None] = None,
                 anchorReturnType: Optional[AnchorReturnType] = None) -> None:
        if isinstance(batchesPerStep, bool) or not isinstance(batchesPerStep, (int, np.integer)) or batchesPerStep < 0:
            raise popart_exception(f"DataFlow: batchesPerStep must be a non-negative int, not {batchesPerStep!r}.")
        if anchors is None:
            anchors = {}
        if isinstance(anchors, Mapping):
            if anchorReturnType is not None:
                raise popart_exception("DataFlow: give either a {tensorId: AnchorReturnType} dict or a list of "
                                       "tensor ids with one AnchorReturnType, not both.")
            amap = dict(anchors)
        else:
            art = anchorReturnType if anchorReturnType is not None else AnchorReturnType("All")
            amap = {tid: art for tid in anchors}
        for tid, art in amap.items():
            if not isinstance(tid, str):
                raise popart_exception(f"DataFlow: anchor ids must be tensor names (str), not {tid!r}.")
            if not isinstance(art, AnchorReturnType):
                raise popart_exception(f"DataFlow: anchor {tid!r} needs a popart.AnchorReturnType, not {art!r}.")
            if art.id() is AnchorReturnTypeId.EVERYN and batchesPerStep > 0:
                n = art.rp()
                if n > batchesPerStep or batchesPerStep % n:
                    raise popart_exception(
                        f"DataFlow: anchor {tid!r} has return period EveryN({n}), which must divide "
                        f"batchesPerStep={batchesPerStep}.")
        self._bps = int(batchesPerStep)
        self._anchors: Dict[str, AnchorReturnType] = amap

    def batchesPerStep(self) -> int:
        return self._bps

    def anchors(self) -> List[str]:
        return list(self._anchors)

    def nAnchors(self) -> int:
        return len(self._anchors)

    def art(self, anchorId: str) -> AnchorReturnType:
        if anchorId not in self._anchors:
            raise popart_exception(f"DataFlow: {anchorId!r} is not an anchor; anchors are {list(self._anchors)}.")
        return self._anchors[anchorId]

    def isAnchored(self, tensorId: str) -> bool:
        return tensorId in self._anchors

    def getAnchorReturnTypeMap(self) -> Dict[str, AnchorReturnType]:
        return dict(self._anchors)

    def __repr__(self) -> str:
        return f"DataFlow(batchesPerStep={self._bps}, anchors={self._anchors!r})"


# tensor descriptions ----------------------------------------------------------------------------------
DataType = str  # PopART names data types by strings: "FLOAT", "FLOAT16", "INT32", ...

_NP_OF_TYPE = {"FLOAT": np.float32, "FLOAT16": np.float16, "DOUBLE": np.float64, "INT8": np.int8,
               "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8, "UINT16": np.uint16,
               "UINT32": np.uint32, "UINT64": np.uint64, "BOOL": np.bool_}
_TYPE_OF_NP = {np.dtype(v): k for k, v in _NP_OF_TYPE.items()}


class TensorInfo:
    """A data type and shape: ``TensorInfo("FLOAT", [4, 3])`` or ``TensorInfo(np_array)``."""

    def __init__(self, dataType: Union[str, np.ndarray, np.dtype], shape: Optional[Iterable[int]] = None) -> None:
        if isinstance(dataType, np.ndarray) and shape is None:
            shape, dataType = dataType.shape, dataType.dtype
        if isinstance(dataType, (np.dtype, type)):
            dt = np.dtype(dataType)
            if dt not in _TYPE_OF_NP:
                raise popart_exception(f"TensorInfo: unsupported numpy dtype {dt}.")
            dataType = _TYPE_OF_NP[dt]
        key = str(dataType).upper()
        if key not in _NP_OF_TYPE:
            raise popart_exception(f"TensorInfo: unknown data type {dataType!r}; use one of {list(_NP_OF_TYPE)}.")
        if shape is None:
            raise popart_exception("TensorInfo: a shape is required.")
        self._type = key
        self._shape = [int(d) for d in shape]

    def shape(self) -> List[int]:
        return list(self._shape)

    def rank(self) -> int:
        return len(self._shape)

    def nelms(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    def data_type(self) -> str:
        return self._type

    def data_type_lcase(self) -> str:
        return self._type.lower()

    def numpy_dtype(self) -> np.dtype:
        return np.dtype(_NP_OF_TYPE[self._type])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorInfo) and (self._type, self._shape) == (other._type, other._shape)

    def __repr__(self) -> str:
        return f"TensorInfo({self._type}, {self._shape})"


class InputShapeInfo:
    """Types and shapes of model inputs that the ONNX model leaves unspecified."""

    def __init__(self) -> None:
        self._infos: Dict[str, TensorInfo] = {}

    def add(self, tensorId: str, info: TensorInfo) -> None:
        if not isinstance(info, TensorInfo):
            raise popart_exception(f"InputShapeInfo.add({tensorId!r}): expected a popart.TensorInfo, not {info!r}.")
        self._infos[tensorId] = info

    def get(self, tensorId: str) -> TensorInfo:
        if tensorId not in self._infos:
            raise popart_exception(f"InputShapeInfo: no info for {tensorId!r}.")
        return self._infos[tensorId]

    def has(self, tensorId: str) -> bool:
        return tensorId in self._infos

    def getAllTensorInfo(self) -> Dict[str, TensorInfo]:
        return dict(self._infos)


# step IO ----------------------------------------------------------------------------------------------
class PyStepIO:
    """The buffers of one ``Session.run``: ``inputs`` maps every input tensor id to an array of the
    shape ``Session.getInputShape(id)`` reports ([batchesPerStep, accumulationFactor, replication,
    *tensor shape] with size-1 dims dropped); ``outputs`` maps anchor ids to arrays to fill (see
    ``Session.initAnchorArrays``)."""

    def __init__(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        if not isinstance(inputs, Mapping) or not isinstance(outputs, Mapping):
            raise popart_exception("PyStepIO(inputs, outputs): both arguments must be dicts of tensor id -> array.")
        self.inputs = dict(inputs)
        self.outputs = dict(outputs)
        self._runtime_asserts = True

    def enableRuntimeAsserts(self, enabled: bool) -> None:
        """Shape and dtype checks of the buffers (on by default)."""
        self._runtime_asserts = bool(enabled)


InputCallback = Callable[[str, bool], np.ndarray]
OutputCallback = Callable[[str], np.ndarray]
CompleteCallback = Callable[[str], None]


class PyStepIOCallback:
    """Step IO by callbacks. For each transfer of an input tensor the session calls
    ``input_callback(id, prefetch)``, which returns one micro-batch (the tensor's own shape), then
    ``input_complete_callback(id)``. For each transfer of an anchor it calls ``output_callback(id)``,
    which returns the array to fill (the anchor's own shape), then ``output_complete_callback(id)``
    once the array holds the value. Transfers go in batch order, replicas innermost. The engine
    runs the whole step at once, so every input callback of a step happens before its output callbacks."""

    def __init__(self, input_callback: InputCallback, input_complete_callback: CompleteCallback,
                 output_callback: OutputCallback, output_complete_callback: CompleteCallback) -> None:
        for what, fn in (("input_callback", input_callback), ("input_complete_callback", input_complete_callback),
                         ("output_callback", output_callback),
                         ("output_complete_callback", output_complete_callback)):
            if not callable(fn):
                raise popart_exception(f"PyStepIOCallback: {what} must be callable, not {fn!r}.")
        self.input_callback = input_callback
        self.input_complete_callback = input_complete_callback
        self.output_callback = output_callback
        self.output_complete_callback = output_complete_callback


class PyWeightsIO:
    """Host arrays for weights, by tensor id: ``Session.readWeights`` fills them from the host
    copies of the weights, ``Session.writeWeights`` copies them into the host copies."""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        if not isinstance(weights, Mapping):
            raise popart_exception("PyWeightsIO(weights): expected a dict of tensor id -> array.")
        self.weights = dict(weights)
