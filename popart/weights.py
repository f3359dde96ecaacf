"""The weights of a popart session on the host, by ONNX name (``HostWeights``): read and written
before the program is compiled and after, then through the popxl Session's public API
(``get_tensors_data``, ``write_variables_data``); and the session's calls that move them between
the host, the device and ONNX models."""
from __future__ import annotations

import os
from typing import Dict, Mapping, Optional

import numpy as np
import onnx
from onnx import numpy_helper

import popxl
from popart.dataflow import PyWeightsIO
from popart.errors import popart_exception
from popart.onnx.importer import ModelLike, device_array, device_dtype, load_model

__all__ = ["HostWeights"]


# Initializers beyond this many bytes go to an external data file (protobuf's limit is 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30


class HostWeights:
    """The host values of a session's variables. Until the program is compiled they are the values
    the variables were made from, with any writes made since (given to the popxl Session when it
    is made: ``connect``); from then on, the popxl Session's host values."""

    def __init__(self) -> None:
        self.variables: Dict[str, popxl.Variable] = {}  # the model's weights, by ONNX name
        self._initial: Dict[popxl.Variable, np.ndarray] = {}  # what they were made from (until compiled)
        self._pending: Dict[popxl.Variable, np.ndarray] = {}  # values written before compiling
        self._px: Optional[popxl.Session] = None

    def add(self, name: str, var: popxl.Variable, value: np.ndarray) -> None:
        """Weight ``name`` is ``var``, made from ``value`` (kept, not copied, for reads before
        compiling: usually the importer's own initializer array)."""
        self.variables[name] = var
        want = var.dtype.as_numpy()
        self._initial[var] = value if value.dtype == want else value.astype(want)

    def connect(self, px: popxl.Session) -> None:
        """The program is compiled into ``px`` (detached): the values written so far become its
        host values."""
        self._px = px
        if self._pending:
            px.write_variables_data(self._pending)
        self._pending, self._initial = {}, {}

    def values(self) -> Dict[str, np.ndarray]:
        """The host value of every weight, by name."""
        if self._px is None:
            return {n: self._pending.get(v, self._initial[v]) for n, v in self.variables.items()}
        data = self._px.get_tensors_data(self.variables.values())
        return {n: data[v] for n, v in self.variables.items()}

    def set(self, updates: Mapping[popxl.Variable, np.ndarray]) -> None:
        """New host values for variables (of the variable's dtype and shape); once compiled and
        attached, the device's too."""
        if self._px is None:
            for var, value in updates.items():
                host = np.empty(var.shape_on_host, var.dtype.as_numpy())
                host[...] = value  # a copy, as the variable's own host data was written
                self._pending[var] = host
        else:
            self._px.write_variables_data(dict(updates))

    # the session's calls ----------------------------------------------------------------------------------
    def check_io(self, weightsIo: PyWeightsIO, what: str) -> None:
        if not isinstance(weightsIo, PyWeightsIO):
            raise popart_exception(f"{what}: expected a popart.PyWeightsIO, not {weightsIo!r}.")
        unknown = [k for k in weightsIo.weights if k not in self.variables]
        if unknown:
            raise popart_exception(f"{what}: {unknown} are not weights of this session; its weights are "
                                   f"{list(self.variables)}.")
        for k, arr in weightsIo.weights.items():
            want = self.variables[k].shape
            if not isinstance(arr, np.ndarray) or arr.shape != want:
                got = arr.shape if isinstance(arr, np.ndarray) else type(arr).__name__
                raise popart_exception(f"{what}: the array for weight {k!r} has shape {got}, expected {want}.")

    def read(self, weightsIo: PyWeightsIO) -> None:
        """Fill the arrays of ``weightsIo`` with the host weights."""
        self.check_io(weightsIo, "readWeights")
        values = self.values()
        for k, arr in weightsIo.weights.items():
            arr[...] = values[k]

    def write(self, weightsIo: PyWeightsIO) -> None:
        """Set the host weights from ``weightsIo``."""
        self.check_io(weightsIo, "writeWeights")
        self.set({self.variables[k]: np.asarray(v, self.variables[k].dtype.as_numpy())
                  for k, v in weightsIo.weights.items()})

    def save_model(self, user_model: onnx.ModelProto, fn: str) -> None:
        """Write ``user_model``, with the host weights as its initializers, to the file ``fn``; a
        model of more than ``EXTERNAL_DATA_BYTES`` of initializers keeps them in ``<fn>.data`` beside
        it (ONNX's external data: one protobuf message cannot exceed 2 GB), which ``onnx.load(fn)``
        and popart read back."""
        values = self.values()
        model = onnx.ModelProto()
        model.CopyFrom(user_model)
        total = 0
        for init in model.graph.initializer:
            if init.name in values:
                original = numpy_helper.to_array(init)
                init.CopyFrom(numpy_helper.from_array(values[init.name].astype(original.dtype), init.name))
            total += init.ByteSize()
        if total > EXTERNAL_DATA_BYTES:
            onnx.save_model(model, fn, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=os.path.basename(fn) + ".data", size_threshold=0)
        else:
            onnx.save(model, fn)

    def reset_from(self, modelProtoOrFilename: ModelLike, folded: Mapping[str, np.ndarray], ignore_unknown: bool) -> None:
        """Take the host weights from the initializers of another model; ``folded`` are the
        initializers that are not weights (shape data folded at import)."""
        other = load_model(modelProtoOrFilename)
        updates = {}
        for init in other.graph.initializer:
            if init.name not in self.variables:
                if init.name in folded:
                    continue  # shape data folded at import, not a weight
                if ignore_unknown:
                    continue
                raise popart_exception(f"resetHostWeights: the model has weight {init.name!r}, which this session "
                                       f"does not have.")
            updates[self.variables[init.name]] = self._replacement(init)
        self.set(updates)  # only once every weight was checked: an error leaves the weights as they were

    def _replacement(self, init: onnx.TensorProto) -> np.ndarray:
        """The host value an initializer of another model gives its weight: of the weight's element
        type (as its device holds it) and shape, and representable there, or an error naming it."""
        var = self.variables[init.name]
        where = f"resetHostWeights: weight {init.name!r}"
        want = var.dtype.as_numpy()
        try:
            given = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
        except (KeyError, TypeError, ValueError):
            given = None
        if given is None or given.kind not in "biuf" or device_dtype(given) != want:
            kind = onnx.TensorProto.DataType.Name(init.data_type) if init.data_type in \
                onnx.TensorProto.DataType.values() else str(init.data_type)
            raise popart_exception(f"{where} has element type {kind}, but the session's weight holds {want} (the "
                                   f"model's type of that weight): no conversion is made.")
        try:
            raw = numpy_helper.to_array(init)
        except Exception as e:  # data of another size than its dims say, say
            raise popart_exception(f"{where}: its data cannot be read as a {list(init.dims)} tensor ({e}).") from None
        if raw.shape != var.shape:
            raise popart_exception(f"{where} has shape {raw.shape}, the session expects {var.shape}.")
        with np.errstate(over="ignore"):
            value = device_array(raw)
        if raw.dtype.kind == "f" and not np.array_equal(np.isfinite(raw), np.isfinite(value)):
            bad = raw[np.isfinite(raw) & ~np.isfinite(value)].reshape(-1)[0]
            raise popart_exception(f"{where} holds {bad}, beyond the range of {want} (it would become inf).")
        return value
