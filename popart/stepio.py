"""Between a popart session's step IO and the popxl Session's host stream buffers (``HostIO``):
the buffer shapes PopART's rules give (``[batchesPerStep, accumulationFactor, replicationFactor,
*shape]``, factors of 1 dropped), the checks of ``PyStepIO`` / ``PyStepIOCallback``, and where
each anchor's values go.

Outputs are copied once, from the device into the user's arrays: an anchor whose host buffer holds
exactly its stream's slices (ALL; EVERYN every batch; any anchor when a run is one step) is
written by the engine straight into the user's ``PyStepIO`` array, viewed in popxl's layout, when
that array is C-contiguous, writable, of the anchor's dtype and shares no memory with the other
buffers of the run. Other anchors (EVERYN N > 1, SUM / FINAL over several steps, callbacks, a
buffer that does not qualify) go through the session's stream buffer and are copied from there.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

import popxl
from popxl import dtypes
from popxl.utils import check_int_range
from popart.dataflow import AnchorReturnTypeId, PyStepIO, PyStepIOCallback
from popart.errors import StepIOError, popart_exception
from popart.onnx.importer import InputSpec
from popart.program import Anchor, drop_ones

__all__ = ["HostIO"]


class HostIO:
    """The host side of a popart session's runs.

    Args:
        inputs: The model inputs the host feeds.
        streams: Their popxl streams, by input name.
        anchors: The anchors, by name.
        batches_per_step: ``DataFlow.batchesPerStep``.
        accumulation_factor: Micro batches per batch.
        replication_factor: This instance's replicas.
    """

    def __init__(self, inputs: List[InputSpec], streams: Dict[str, popxl.HostToDeviceStream],
                 anchors: Dict[str, Anchor], batches_per_step: int, accumulation_factor: int,
                 replication_factor: int) -> None:
        self.inputs, self.streams, self.anchors = inputs, streams, anchors
        self.bps, self.af, self.rf = batches_per_step, accumulation_factor, replication_factor
        self.steps = batches_per_step * accumulation_factor
        # Shapes and dtypes, worked out once (run's hot path reads them).
        self._lead = drop_ones(batches_per_step, accumulation_factor, replication_factor)
        self._input_ids = [s.name for s in inputs]
        self._in_layout = [(s, streams[s.name], self._lead + s.shape, self._stream_shape(s.shape), s.device_dtype,
                            dtypes.from_numpy(s.device_dtype).as_numpy()) for s in inputs]
        self._anchor_shapes = {name: self._anchor_shape(a) for name, a in anchors.items()}
        # Anchors whose host buffer is their stream's buffer reshaped: the engine can write the
        # user's array. The others keep one value in N, or the first of the identical stores.
        self._whole = {name for name, a in anchors.items()
                       if a.kind is AnchorReturnTypeId.ALL or (a.kind is AnchorReturnTypeId.EVERYN and a.every == 1)
                       or self.steps == 1}
        self._buffers: Dict[popxl.DeviceToHostStream, np.ndarray] = {}

    def connect(self, px: popxl.Session) -> None:
        """The program is compiled into ``px``: its stream buffers, for the anchors not written in place."""
        self._buffers = px.create_host_outputs()

    # shapes ---------------------------------------------------------------------------------------------
    def lead(self) -> Tuple[int, ...]:
        return self._lead

    def input(self, tensorId: str) -> InputSpec:
        for s in self.inputs:
            if s.name == tensorId:
                return s
        raise popart_exception(f"{tensorId!r} is not an input of the model; inputs are {self.input_ids()}.")

    def input_ids(self) -> List[str]:
        return list(self._input_ids)

    def anchor(self, tensorId: str) -> Anchor:
        if tensorId not in self.anchors:
            raise popart_exception(f"{tensorId!r} is not an anchor; anchors are {list(self.anchors)}.")
        return self.anchors[tensorId]

    def input_shape(self, tensorId: str) -> Tuple[int, ...]:
        return self.lead() + self.input(tensorId).shape

    def anchor_shape(self, tensorId: str) -> Tuple[int, ...]:
        shape = self._anchor_shapes.get(tensorId)
        return shape if shape is not None else self._anchor_shape(self.anchor(tensorId))

    def _anchor_shape(self, a: Anchor) -> Tuple[int, ...]:
        if a.kind is AnchorReturnTypeId.ALL:
            return self.lead() + a.shape
        if a.kind is AnchorReturnTypeId.EVERYN:
            return drop_ones(self.bps // a.every, self.af, self.rf) + a.shape
        return drop_ones(self.rf) + a.shape

    def init_anchor_arrays(self) -> Dict[str, np.ndarray]:
        return {name: np.zeros(self.anchor_shape(name), a.dtype) for name, a in self.anchors.items()}

    def explain(self, shape: Tuple[int, ...]) -> str:
        parts = [f"{n}={v}" for n, v in (("batchesPerStep", self.bps), ("accumulationFactor", self.af),
                                          ("replicationFactor", self.rf)) if v != 1]
        return " x ".join(parts + [f"tensor shape {shape}"])

    def _stream_shape(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """popxl's host layout of a stream: [steps, rf, *shape], size 1 dropped."""
        return drop_ones(self.steps, self.rf) + tuple(shape)

    # inputs ---------------------------------------------------------------------------------------------
    def inputs_from_arrays(self, stepio: PyStepIO) -> Dict[popxl.HostToDeviceStream, np.ndarray]:
        given = stepio.inputs
        expected = self._input_ids
        missing = [k for k in expected if k not in given]
        extra = [k for k in given if k not in expected] if len(given) != len(expected) or missing else []
        if missing or extra:
            parts = []
            if missing:
                parts.append("missing input(s) " + ", ".join(
                    f"{k!r} (expected shape {self.input_shape(k)})" for k in missing))
            if extra:
                parts.append(f"unknown input(s) {extra} (the model's inputs are {expected})")
            raise StepIOError("PyStepIO: " + "; ".join(parts) + ".")
        out = {}
        for s, stream, want, stream_shape, device, host in self._in_layout:
            arr = given[s.name]
            if type(arr) is not np.ndarray:
                arr = np.asarray(arr)
            if arr.shape != want:
                raise StepIOError(
                    f"PyStepIO: input {s.name!r} has shape {arr.shape}, expected {want} ({self.explain(s.shape)}).")
            # A user buffer [bps, af, rf, *shape] is popxl's [steps, rf, *shape]: a view when contiguous.
            if arr.dtype != device or host.names:
                arr = self._to_device_dtype(s, arr, host)
            out[stream] = np.ascontiguousarray(arr).reshape(stream_shape)
        return out

    @staticmethod
    def _to_device_dtype(s: InputSpec, arr: np.ndarray, host: np.dtype) -> np.ndarray:
        if arr.dtype not in (s.dtype, s.device_dtype):
            raise StepIOError(f"PyStepIO: input {s.name!r} has dtype {arr.dtype}, expected {s.dtype}.")
        try:
            check_int_range(arr, s.device_dtype, f"PyStepIO: input {s.name!r}")  # 64-bit data held in 32 bits
        except ValueError as e:
            raise StepIOError(str(e)) from None
        arr = arr.astype(s.device_dtype, copy=False)
        if host.names:  # popxl's float8 host form: the raw one-byte codes of the ml_dtypes values
            return np.ascontiguousarray(arr).view(np.uint8).view(host).reshape(arr.shape)
        return arr

    def inputs_from_callbacks(self, stepio: PyStepIOCallback) -> Dict[popxl.HostToDeviceStream, np.ndarray]:
        fetches = self.steps * self.rf
        bufs = {s.name: np.empty((fetches,) + s.shape, s.device_dtype) for s in self.inputs}
        for k in range(fetches):
            for s, _, _, _, _, host in self._in_layout:
                arr = np.asarray(stepio.input_callback(s.name, False))
                if arr.shape != s.shape:
                    raise StepIOError(f"PyStepIOCallback: input_callback({s.name!r}) returned shape {arr.shape}, "
                                      f"expected {s.shape} (one micro batch).")
                bufs[s.name][k] = self._to_device_dtype(s, arr, host)
                stepio.input_complete_callback(s.name)
        return {stream: bufs[s.name].reshape(stream_shape) for s, stream, _, stream_shape, _, _ in self._in_layout}

    # outputs --------------------------------------------------------------------------------------------
    def check_outputs(self, outputs: Mapping[str, np.ndarray]) -> None:
        missing = [k for k in self.anchors if k not in outputs]
        if missing:
            raise StepIOError("PyStepIO: no output buffer for anchor(s) " + ", ".join(
                f"{k!r} (expected shape {self.anchor_shape(k)})" for k in missing) + "; use initAnchorArrays().")
        for name, want in self._anchor_shapes.items():
            buf = outputs[name]
            if not isinstance(buf, np.ndarray) or buf.shape != want:
                got = buf.shape if isinstance(buf, np.ndarray) else type(buf).__name__
                raise StepIOError(f"PyStepIO: the output buffer of anchor {name!r} has shape {got}, expected {want}.")
            if buf.dtype != self.anchors[name].dtype:  # a cast into it would wrap or round silently
                raise StepIOError(f"PyStepIO: the output buffer of anchor {name!r} has dtype {buf.dtype}, expected "
                                  f"{self.anchors[name].dtype}; use initAnchorArrays().")

    def stream_outputs(self, given: Optional[Mapping[str, np.ndarray]],
                       inputs: Iterable[np.ndarray]) -> Dict[popxl.DeviceToHostStream, np.ndarray]:
        """The buffer the engine fills for each anchor's stream: the user's array of ``given``
        (checked PyStepIO outputs; None for callbacks) viewed in popxl's layout where it can be
        (see the module's docstring), else the session's stream buffer."""
        out: Dict[popxl.DeviceToHostStream, np.ndarray] = {}
        taken: List[np.ndarray] = list(inputs)
        for name, a in self.anchors.items():
            arr = given[name] if given is not None and name in self._whole else None
            if arr is not None and arr.dtype == a.dtype and arr.flags.c_contiguous and arr.flags.writeable:
                for t in taken:
                    if np.may_share_memory(arr, t):
                        break
                else:
                    out[a.stream] = arr.reshape(self._buffers[a.stream].shape)
                    taken.append(arr)
                    continue
            out[a.stream] = self._buffers[a.stream]
        return out

    def results(self, written: Mapping[popxl.DeviceToHostStream, np.ndarray],
                given: Optional[Mapping[str, np.ndarray]]) -> Tuple[Dict[str, np.ndarray], List[str]]:
        """After a run that filled ``written`` (from ``stream_outputs``): each anchor's value, shaped
        as ``anchor_shape`` says, and the names of the anchors still to be copied into ``given``
        (those that went through the session's stream buffers)."""
        values, to_copy = {}, []
        for name, a in self.anchors.items():
            buf = written[a.stream]
            if given is not None and buf is not self._buffers[a.stream]:
                values[name] = given[name]  # written in place
                continue
            values[name] = self._anchor_value(a, buf)
            to_copy.append(name)
        return values, to_copy

    def _anchor_value(self, a: Anchor, buf: np.ndarray) -> np.ndarray:
        """The anchor's host result, from popxl's per-transfer stream buffer."""
        buf = buf.reshape((self.steps, self.rf) + a.shape)
        if a.kind is AnchorReturnTypeId.ALL:
            value = buf
        elif a.kind is AnchorReturnTypeId.EVERYN:
            per_batch = buf.reshape((self.bps, self.af * self.rf) + a.shape)
            value = per_batch[a.every - 1::a.every]  # batches N, 2N, ... counting from 1
        else:
            value = buf[0]  # stored after the loop (num_host_transfers times, the same value)
        return value.reshape(self.anchor_shape(a.name))

    def _fetches(self, a: Anchor) -> int:
        if a.kind is AnchorReturnTypeId.ALL:
            return self.steps * self.rf
        if a.kind is AnchorReturnTypeId.EVERYN:
            return self.steps // a.every * self.rf
        return self.rf

    def outputs_to_callbacks(self, stepio: PyStepIOCallback, results: Dict[str, np.ndarray]) -> None:
        for name, a in self.anchors.items():
            values = results[name].reshape((self._fetches(a),) + a.shape)
            for v in values:
                buf = stepio.output_callback(name)
                if not isinstance(buf, np.ndarray) or buf.shape != a.shape or buf.dtype != a.dtype:
                    got = f"{buf.shape} {buf.dtype}" if isinstance(buf, np.ndarray) else type(buf).__name__
                    raise StepIOError(f"PyStepIOCallback: output_callback({name!r}) returned a buffer of {got}, "
                                      f"expected {a.shape} {a.dtype}.")
                buf[...] = v
                stepio.output_complete_callback(name)

    def __repr__(self) -> str:
        return f"HostIO(inputs={self.input_ids()}, anchors={list(self.anchors)})"
