"""`popxl.Session`: compiles an Ir, attaches to a device, runs it and syncs weights."""
from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, Tuple, TypeVar, Union

import numpy as np

from popxl import _pb, dtypes
from popxl.compiler import lower
from popxl.compiler.executable import Executable
from popxl.distributed import Launch
from popxl.engines import create_engine
from popxl.errors import popart_exception
from popxl.graph import orphaned
from popxl.host_transfers import HostTransfers
from popxl.ir import Ir
from popxl.logs import get_logger
from popxl.ops.call import check_site
from popxl.ops.matmul import refuse_mixed_dtypes
from popxl.progress import Progress, RunProgress
from popxl.remote_buffer import RemoteMemory
from popxl.streams import DeviceToHostStream, HostToDeviceStream
from popxl.tensor import Constant, HostScalarTensor, Tensor, Variable
from popxl.transforms.expand import refuse_unreplaced_identities
from popxl.transforms.pipeline import PIPELINE, PipelineRecord
from popxl.utils import check_int_range, downcast_np_dtypes, to_numpy
from popxl.visualize.dot import check_enabled, dot_checkpoint

__all__ = ["Session", "OpProfiler"]

logger = get_logger("popxl")

IPU_HW_ENV = "POPXL_IPU_HW"
_warned_ipu_hw = False

h2dStreamBufferMaps = Mapping[HostToDeviceStream, HostScalarTensor]
d2hStreamBufferMaps = Mapping[DeviceToHostStream, np.ndarray]


def _resolve_device(device_desc: str, ir: Ir) -> str:
    global _warned_ipu_hw
    if not isinstance(device_desc, str):
        raise TypeError(f"Session: device_desc must be 'ipu_hw', 'ipu_model' or 'cpu', not {device_desc!r}.")
    if device_desc == "ipu_hw":
        if os.environ.get(IPU_HW_ENV, "").lower() != "cpu":
            raise popart_exception(
                "Session(device_desc='ipu_hw'): no IPU hardware is available on this machine. Use "
                "device_desc='cpu' or 'ipu_model' to run on the CPU, or set the environment variable "
                f"{IPU_HW_ENV}=cpu to run programs that ask for 'ipu_hw' on the CPU engine unchanged.")
        if not _warned_ipu_hw:
            logger.warning("%s=cpu: running a program that asked for device 'ipu_hw' on the CPU engine.",
                           IPU_HW_ENV)
            _warned_ipu_hw = True
        return "ipu_model"
    if device_desc == "cpu":
        if ir.instance_replication_factor > 1:
            raise ValueError(
                f"Session: the 'cpu' device does not support replication (replication_factor="
                f"{ir.replication_factor}); use device_desc='ipu_model' for replicated programs.")
        return "cpu"
    if device_desc == "ipu_model":
        return "ipu_model"
    raise ValueError(f"Session: unknown device_desc {device_desc!r}; use 'ipu_hw', 'ipu_model' or 'cpu'.")


def _host_shape(nht: int, rf: int, shape) -> tuple:
    return tuple(d for d in (nht, rf) if d > 1) + tuple(shape)


def _physical_memory() -> Optional[int]:
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_no_erased_producers(ir: Ir) -> None:
    """Refuse a program that reads a tensor whose producer was erased (PopART's ``eraseOp``
    through ``popart._internal.ir`` leaves such tensors until their readers go too)."""
    for g in ir._all_graphs():
        for op in g.schedule():
            lost = [t.id for t in op.inputs if orphaned(t)]
            if lost:
                raise popart_exception(f"Session: {op.type} {op.name!r} in graph {g.id!r} reads {lost[0]!r}, whose "
                                       f"producer was erased; erase or rewire its readers first.")


def _check_sites(ir: Ir) -> None:
    """Refuse calls, repeats and conditionals that no longer fit their graphs: graphs edited after
    they were traced (through ``popart._internal.ir``: outputs and loop inputs added one at a time)
    must end up consistent, a loop's carried outputs matching their inputs."""
    for g in ir._all_graphs():
        for op in g.schedule():
            if op.type in ("call", "repeat", "if"):
                try:
                    check_site(op)
                except ValueError as e:
                    raise popart_exception(f"Session: {e}") from None


_Method = TypeVar("_Method", bound=Callable[..., Any])

# An entry of weights_to_host's read plan: (variable's position, its group | ("replica", r) | (group, chunk))
_ReadEntry = Tuple[int, Union[int, Tuple[str, int], Tuple[int, int]]]


def _serialised(method: _Method) -> _Method:
    """One call at a time per Session: a run from another thread, or a detach, weight read or write
    during a run, waits until the run is over (the engine's memory is not shared between calls).
    The same call from the running thread itself (a custom op's kernel, a callback or a signal
    handler during the run) cannot wait for the run: it is refused."""
    name = method.__name__

    @functools.wraps(method)
    def locked(self: "Session", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._running:
                raise self._reentry_error(name)
            return method(self, *args, **kwargs)
    return locked  # type: ignore[return-value]



class OpProfiler:
    """Per-op timers of a Session's engine (``Session.op_profiler``), off until enabled. Each op
    instruction is timed as it runs, once per replica: by the native engine in C++ around each
    kernel, by the reference engine in Python. popart's ``getReport()`` is made from them.

    Args:
        session: The Session whose engine is timed.
    """

    def __init__(self, session: "Session") -> None:
        self._session = session

    @property
    def engine(self) -> str:
        """The name of the engine that measures: "native" or "reference" (``POPXL_ENGINE``)."""
        return self._session._engine.name

    @property
    def enabled(self) -> bool:
        """Whether the ops are timed; setting it (on or off) resets the times."""
        return bool(self._session._engine.profiling)

    @enabled.setter
    def enabled(self, on: bool) -> None:
        with self._session._lock:
            self._session._engine.profiling = bool(on)

    def op_times(self) -> Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray]]:
        """The ops that ran since the last reset: ``{(graph, instruction): (seconds per replica,
        calls per replica)}``, positions in ``Session.executable`` (its ``graphs[graph]["program"]``)."""
        with self._session._lock:
            return self._session._engine.op_profile()

    def reset(self) -> None:
        """Start the times again from zero."""
        with self._session._lock:
            self._session._engine.reset_profile()

    def __repr__(self) -> str:
        return f"OpProfiler[{self.engine} engine, {'enabled' if self.enabled else 'disabled'}]"


def _tensor_words(t: Any) -> str:
    """How an argument is named in errors that PopXL's own words begin ("Tensor x is not of type ...")."""
    return f"Tensor {t.id}" if isinstance(t, Tensor) else repr(t)

class Session:
    """Compiles an Ir for a device and runs it; the Ir cannot be changed afterwards.

    Use it as a context manager: entering attaches to the device and copies the weights to it;
    leaving copies them back (if ``weights_to_host_on_exit``) and detaches. Running needs
    attachment.

    Args:
        ir: The program.
        device_desc: "cpu" (or "ipu_hw" / "ipu_model", which run on the CPU too).
        weights_to_host_on_exit: Copy the weights back to their host values when the context exits.

    Raises:
        ValueError: If ``device_desc`` is unknown or needs more devices than it has.
        RuntimeError: If the Ir has no ops, or cannot be compiled.
    """

    def __init__(self, ir: Ir, device_desc: Literal["ipu_hw", "ipu_model", "cpu"] = "cpu",
                 weights_to_host_on_exit: bool = True) -> None:
        if not isinstance(ir, Ir):
            raise TypeError(f"Session: expected a popxl.Ir, not {type(ir).__name__}.")
        if ir._frozen_by is not None:
            raise popart_exception(f"Session: {ir!r} already belongs to another Session ({ir._frozen_by}).")
        self._device = _resolve_device(device_desc, ir)
        if not any(g.schedule() for g in ir._all_graphs()):
            raise popart_exception(f"Session: {ir!r} has no ops; there is nothing to run.")
        _check_no_erased_producers(ir)
        _check_sites(ir)
        refuse_mixed_dtypes(ir)  # matmuls of two dtypes, which PopXL traces but cannot compile
        refuse_unreplaced_identities(ir)  # popxl-addons' ops that need PopART's OpToIdentity pattern first
        self.ir_ = ir
        self.weights_to_host_on_exit = weights_to_host_on_exit
        self._lock = threading.RLock()
        self._running = False  # a run is in progress (on the thread that holds the lock)
        progress = Progress("popxl: compiling", 2 * len(list(ir._all_graphs())) + 1)
        # The Ir shows what runs: ops that run as other ops expanded, exported layer norms, GELUs and
        # attention as single ops, x @ W + b as matmul_bias, SGD updates in their GEMMs (the passes,
        # in order, and their conditions: print(popxl.transforms.PIPELINE)).
        self._transforms_applied = PIPELINE.apply(ir)
        self._exe = lower(ir, progress.step)
        self._transfers = HostTransfers(self._exe)  # logs streams transferred other than num_host_transfers times
        self._check_memory()
        self._write_final_dot_checkpoint()
        ir._frozen_by = f"Session on {device_desc!r}"
        self._engine = create_engine(self._exe)
        # Several instances (popdist): this one's replicas among all, its link to the others at attach.
        self._launch = Launch(ir, self._exe, self._engine)
        self._engine_run = self._transfers.watch(self._launch.guard(self._engine.run), self._engine)
        self._run_progress = RunProgress()  # a bar for sessions whose runs take seconds
        self._op_profiler = OpProfiler(self)
        progress.step("engine loaded")
        progress.close()
        var_by_id = {t.id: t for t in ir.main_graph.variables}
        # On-chip variables come first in the executable's device state; remote buffer regions
        # and shard mirrors follow (handled by self._remote).
        self._variables: List[Variable] = [var_by_id[v["name"]] for v in self._exe.variables
                                           if "remote_buffer" not in v and "mirror_of" not in v]
        self._remote = RemoteMemory(ir, self._exe, self._launch.offset)
        # The host values of the weights are the variables' own host data (what the Ir was built
        # with), not a copy: weights_to_host writes into them, get_tensor_data returns views of
        # them, and a variable made from a np.memmap reads and writes its file in place.
        self._host: Dict[Variable, np.ndarray] = {v: v._host_data_value
                                                  for v in (*self._variables, *self._remote.variables)}
        if not all(host.flags.writeable for host in self._host.values()):
            self.weights_to_host_on_exit = False  # there is nowhere to write them back to
        # Variables read back with retrieval_mode="all_replicas": every replica's value, (replicas, *shape),
        # filled by weights_to_host (until then, each replica holds its group's host value).
        self._replica_values: Dict[Variable, np.ndarray] = {}
        self._host_stale = False
        self._enter_stack: List[bool] = []
        streams = {s.tensor_id: s for s in (*ir.get_all_h2d_streams(), *ir.get_all_d2h_streams())}
        self._h2d = [streams[s["name"]] for s in self._exe.h2d]
        self._d2h = [streams[s["name"]] for s in self._exe.d2h]
        # Per stream: (stream, host dtype, host shape), for run's fast path and create_host_outputs.
        in_layout = [self._layout(s) for s in self._h2d]
        out_layout = [self._layout(s) for s in self._d2h]
        out_plan = list(zip(self._d2h, self._transfers.output_makers(out_layout)))
        self._new_outputs = lambda: {s: make(*args) for s, (make, args) in out_plan}
        # run's fast path (the engine's, in C++) where nothing stands between the session and the
        # engine's run (one instance, every stream's transfer count known) and no stream is float8
        # (structured host dtypes take the checked path).
        exact_runner = getattr(self._engine, "exact_runner", None)
        self._exact_run = None
        if (exact_runner is not None and self._engine_run is self._engine.run
                and not any(d.names for _, d, _ in (*in_layout, *out_layout))):
            self._exact_run = exact_runner(in_layout, self._d2h, [m for _, m in out_plan])

    def _write_final_dot_checkpoint(self) -> None:
        """PopART's "FINAL" DOT checkpoint (the program as compiled), when POPART_DOT_CHECKS or the
        Ir's dotChecks option names it (or ALL); with neither, only once a checkpoint of the user's
        has turned them all on (see popxl.visualize.dot_checkpoint)."""
        if check_enabled(self.ir, "FINAL"):
            dot_checkpoint(self.ir, "FINAL")

    def _check_memory(self) -> None:
        """Refuse, before anything is allocated, a program whose device memory (one arena per replica)
        or one of whose host stream buffers is larger than this machine's memory."""
        limit = _physical_memory()
        if limit is None:
            return
        nht, rf = self.ir.num_host_transfers, self.ir.instance_replication_factor
        for stream in (*self._exe.h2d, *self._exe.d2h):
            nbytes = nht * rf * dtypes.dtype.from_name(stream["dtype"]).itemsize * int(np.prod(stream["shape"], dtype=object))
            if nbytes > limit:
                raise popart_exception(
                    f"Session: the host buffer of stream {stream['name']!r} (shape {tuple(stream['shape'])} x "
                    f"num_host_transfers={nht} x replicas={rf}) would take {nbytes} bytes, more than this machine's "
                    f"memory ({limit} bytes).")
        device = self._exe.arena_bytes * self._exe.replication_factor
        if device > limit:
            sizes = sorted(((t.nelms * t.dtype.itemsize, t) for g in self.ir._all_graphs() for t in g.tensors),
                           key=lambda st: st[0], reverse=True)[:3]
            largest = ", ".join(f"{t.id!r} {t.shape} {t.dtype.name} ({n} bytes)" for n, t in sizes)
            raise popart_exception(
                f"Session: the program needs {self._exe.arena_bytes} bytes of device memory per replica "
                f"({self._exe.replication_factor} replica(s)), more than this machine's memory ({limit} bytes). "
                f"Its largest tensors: {largest}.")

    def _layout(self, s) -> tuple:
        return s, np.dtype(s.dtype.as_numpy()), self._host_shape(s)

    # properties -----------------------------------------------------------------------------------
    @property
    def ir(self) -> Ir:
        """The Ir the session runs."""
        return self.ir_

    @property
    def executable(self) -> Executable:
        """The compiled program the engine runs (``popxl.compiler.Executable``: plain data, its
        memory plan and one instruction list per graph). Read-only: the engine has loaded it."""
        return self._exe

    @property
    def op_profiler(self) -> OpProfiler:
        """The engine's per-op timers (`OpProfiler`): ``op_profiler.enabled = True``, run, then
        ``op_profiler.op_times()``."""
        return self._op_profiler

    @property
    def transforms_applied(self) -> PipelineRecord:
        """What the transform pipeline (``popxl.transforms.PIPELINE``) did to the Ir before it was
        compiled: per pass, whether it ran and the ops before and after, by type. ``print`` it."""
        return self._transforms_applied

    @property
    def is_attached(self) -> bool:
        """Whether the session is attached to its device (inside ``with session:``)."""
        return self._engine.attached

    @property
    def _pb_session(self) -> Any:
        """This session as PopART's session object shows it (popart._internal.ir.Session, a view)."""
        return _pb.view_of(self)

    def _require_attached(self, what: str) -> None:
        if not self.is_attached:
            raise ValueError(f"Session.{what}: the session must be attached to a device first; use "
                             f"`with session:` around the call.")

    # context manager ------------------------------------------------------------------------------
    @_serialised
    def __enter__(self) -> "Session":
        attach_here = not self.is_attached
        if attach_here:
            try:
                self._engine.attach()
            except Exception as e:
                raise popart_exception(f"Session: could not attach to the {self._device!r} device: {e}") from e
            try:
                self._launch.join(self._engine, "Session")  # the other instances, if any (collective)
            except BaseException:
                self._engine.detach()
                raise
            self.weights_from_host()
        self._enter_stack.append(attach_here)
        return self

    @_serialised
    def __exit__(self, exc_type, exc_value, exc_tb) -> None:
        attached_here = self._enter_stack.pop()
        if attached_here and self.is_attached:
            try:
                if exc_type is None and self.weights_to_host_on_exit:
                    self.weights_to_host()
            finally:
                self._launch.leave(self._engine)
                self._engine.detach()

    # weights --------------------------------------------------------------------------------------
    def _device_value(self, v: Variable, replica: int) -> np.ndarray:
        """The host value for this instance's replica ``replica``."""
        host = self._host[v]
        rg = v.replica_grouping
        value = host[rg.assignment[self._launch.offset + replica]] if rg.num_groups > 1 else host
        return value.view(dtypes.ml_dtype(v.dtype)) if value.dtype.names else value

    def _write_device(self, variables: Iterable[Variable]) -> None:
        index = {v: i for i, v in enumerate(self._variables)}
        variables = list(variables)
        for v in variables:
            if v not in index:  # remote, or not used by any program: nothing on chip
                continue
            for r in range(self._engine.replicas):
                self._engine.write_variable(index[v], r, self._device_value(v, r))
        self._remote.write(self._engine, [v for v in variables if v in self._remote], self._device_value)

    @_serialised
    def weights_from_host(self) -> None:
        """Copy every variable's host value to the device."""
        self._require_attached("weights_from_host")
        self._write_device([*self._variables, *self._remote.variables])

    def _check_writable(self, what: str, variables: Iterable[Variable]) -> None:
        """Raise before anything is written when a host value is read-only, so an error never
        leaves the user's arrays half updated."""
        read_only = [v.id for v in variables if not self._host.get(v, v._host_data_value).flags.writeable]
        if read_only:
            raise popart_exception(f"Session.{what}: the host data of {read_only} is read-only (a np.memmap "
                                   f"opened with mode='r'?), so their values cannot be written to it.")

    @_serialised
    def weights_to_host(self) -> None:
        """Copy every variable's device value into its host data (flushing np.memmap files).

        A group's value is read on one of its replicas, this instance's if it has one; values held
        only by other instances' replicas come from them, and then every instance must be calling
        this at the same point of its program (popxl.distributed)."""
        self._require_attached("weights_to_host")
        self._check_writable("weights_to_host", self._host)
        self._remote.sync_mirrors(self._engine)
        index = {v: i for i, v in enumerate(self._variables)}
        every = [*self._variables, *self._remote.variables]
        # (entry, candidate replicas); entries (picklable: instances exchange them) are
        # (position in `every`, group | ("replica", r) | (group, chunk))
        plan: List[Tuple[_ReadEntry, List[int]]] = []
        for k, v in enumerate(every):
            rg = v.replica_grouping
            if v in self._remote:
                plan += [((k, key), sources) for key, sources in self._remote.chunk_sources(v).items()]
            elif self._reads_all_replicas(v):
                plan += [((k, ("replica", r)), [r]) for r in range(self.ir.replication_factor)]
            else:
                members = rg._members()
                plan += [((k, g), members[g]) for g in range(rg.num_groups)]

        def read(entry: _ReadEntry, replica: int) -> np.ndarray:
            v = every[entry[0]]
            if v in self._remote:
                return self._remote.slot(self._engine, v, replica)
            return self._engine.variable_view(index[v], replica)  # a view: copied into the host data at once

        values = self._launch.read(plan, read, "Session.weights_to_host")
        for k, v in enumerate(self._variables):
            host = self._host[v]
            if self._reads_all_replicas(v):
                out = self._replica_values.setdefault(v, np.empty((self.ir.replication_factor, *v.shape), host.dtype))
                for r in range(len(out)):
                    val = values[k, ("replica", r)]
                    out.view(val.dtype)[r] = val
                continue
            rg = v.replica_grouping
            for g in range(rg.num_groups):
                val = values[k, g]
                out = host.view(val.dtype) if host.dtype.names else host
                if rg.num_groups > 1:
                    out[g] = val
                else:
                    out[...] = val
        for k, v in enumerate(every):
            if v in self._remote:
                self._remote.assemble(v, {key: values[k, key] for key in self._remote.chunk_sources(v)}, self._host[v])
        for host in self._host.values():
            if isinstance(host, np.memmap):
                host.flush()
        self._host_stale = False

    @staticmethod
    def _reads_all_replicas(v: Variable) -> bool:
        """Whether reading ``v`` gives every replica's value (PopXL: ``all_replicas`` with groups of
        several replicas; remote variables give one value per group)."""
        return v.retrieval_mode == "all_replicas" and v.replica_grouping.group_size > 1 and v._remote_slot is None

    def _replica_values_of(self, v: Variable) -> np.ndarray:
        """Every replica's value of an ``all_replicas`` variable, (replication_factor, *shape): as read by
        weights_to_host, or (never read) each replica's group's host value."""
        if v not in self._replica_values:
            host = self._host.get(v, v._host_data_value)
            rg = v.replica_grouping
            per_group = host if rg.num_groups > 1 else host[None]
            self._replica_values[v] = per_group[np.asarray(rg.assignment)]
        return self._replica_values[v]

    def get_tensor_data(self, tensor: Union[Variable, Constant]) -> np.ndarray:
        """The host value of a variable (synced from the device first if stale) or a constant.

        Args:
            tensor: A variable or constant of the session's Ir.

        Returns:
            Its value, a view of the host copy, of shape ``shape_on_host``.

        Raises:
            TypeError: If ``tensor`` is neither a Variable nor a Constant.
        """
        return self.get_tensors_data([tensor])[tensor]

    @_serialised
    def get_tensors_data(self, tensors: Iterable[Union[Variable, Constant]]) -> Dict[Union[Variable, Constant], np.ndarray]:
        """``get_tensor_data`` for several tensors, syncing from the device at most once.

        Args:
            tensors: Variables or constants of the session's Ir.

        Returns:
            Each tensor's value, keyed by the tensor.

        Raises:
            TypeError: If an entry is neither a Variable nor a Constant.
        """
        tensors = list(tensors)
        for t in tensors:
            if not isinstance(t, (Variable, Constant)):
                raise TypeError(f"{_tensor_words(t)} is not of type Constant or Variable: Session.get_tensor_data "
                                f"reads only those (stream other tensors out with ops.host_store).")
            self._check_own(t, "get_tensor_data")
        if self.is_attached and self._host_stale and any(isinstance(t, Variable) for t in tensors):
            self.weights_to_host()
        out: Dict[Union[Variable, Constant], np.ndarray] = {}
        for t in tensors:
            if isinstance(t, Variable) and self._reads_all_replicas(t):
                out[t] = self._replica_values_of(t)
            elif isinstance(t, Variable):
                out[t] = self._host.get(t, t._host_data_value)
            else:
                out[t] = t._host_data_value
        return out

    def _check_own(self, t: Union[Variable, Constant], what: str) -> None:
        if t.ir is not self.ir:
            raise ValueError(f"Session.{what}: tensor {t.id!r} belongs to {t.ir!r}, not to this Session's "
                             f"{self.ir!r}; a Session reads and writes only the tensors of its own Ir.")

    def write_variable_data(self, tensor: Variable, data: np.ndarray) -> None:
        """Set a variable's host value and, if attached, its device value.

        Args:
            tensor: A variable of the session's Ir.
            data: Its new value, of its dtype and ``shape_on_host``.

        Raises:
            TypeError: If ``tensor`` is not a Variable, or the dtype differs.
            ValueError: If the shape differs.
        """
        self.write_variables_data({tensor: data})

    @_serialised
    def write_variables_data(self, tensors: Dict[Variable, np.ndarray]) -> None:
        """Set several variables' host values; if attached, send them to the device once.

        Args:
            tensors: New values keyed by variable.

        Raises:
            TypeError: If a key is not a Variable, or a dtype differs.
            ValueError: If a shape differs.
        """
        self._write_variables_data(tensors, to_device=True)

    @_serialised
    def _write_variables_data(self, tensors: Dict[Variable, np.ndarray], to_device: bool) -> None:
        """``write_variables_data``; with ``to_device=False`` only the host values change (PopART's
        ``writeWeights``: the device gets them at the next ``weights_from_host``)."""
        if not isinstance(tensors, Mapping):
            raise TypeError(f"Session.write_variables_data: expected a dict {{variable: data}}, not "
                            f"{type(tensors).__name__}.")
        checked = {}
        for t, data in tensors.items():
            if not isinstance(t, Variable):
                raise TypeError(f"{_tensor_words(t)} is not of type Variable: Session.write_variable_data writes "
                                f"only variables.")
            self._check_own(t, "write_variable_data")
            if t.retrieval_mode == "all_replicas" and t.replica_grouping.group_size > 1:
                raise NotImplementedError(
                    f"Session.write_variable_data: variable {t.id!r} has retrieval_mode 'all_replicas'; "
                    f"writing such variables is not supported (as in PopXL).")
            expected = t.dtype.as_numpy()
            if not isinstance(data, np.ndarray):
                if t.dtype in (dtypes.float8_143, dtypes.float8_152):
                    raise TypeError(f"Session.write_variable_data: {t.id!r} is float8; pass a NumPy array of "
                                    f"float8 codes (popxl.fp8_utils.host_pow2scale_cast_to_fp8).")
                data = np.asarray(data, dtype=expected)
            if data.dtype != expected:
                raise TypeError(f"Session.write_variable_data: {t.id!r} has dtype {t.dtype.name} "
                                f"(numpy {expected}), but the data has dtype {data.dtype}.")
            if data.shape != t.shape_on_host:
                raise ValueError(f"Session.write_variable_data: {t.id!r} expects shape {t.shape_on_host}, "
                                 f"got {data.shape}.")
            checked[t] = data
        self._check_writable("write_variable_data", checked)
        if self.is_attached and self._host_stale:
            self.weights_to_host()  # keep the host values of the other variables complete
        for t, data in checked.items():
            self._host.get(t, t._host_data_value)[...] = data
            self._replica_values.pop(t, None)
        if self.is_attached and to_device:
            self._write_device(checked)

    # streams --------------------------------------------------------------------------------------
    def expected_inputs(self) -> List[HostToDeviceStream]:
        """The host-to-device streams that ``run`` needs data for."""
        return list(self._h2d)

    def _host_shape(self, s) -> tuple:
        return self._full_input_shape(s.shape)

    def _full_input_shape(self, shape: Iterable[int]) -> tuple:
        """The host buffer shape for per-transfer, per-replica ``shape``: ``(num_host_transfers,)``
        if > 1, then ``(replicas,)`` if > 1, then ``shape`` (PopXL's name; popxl-addons calls it)."""
        return _host_shape(self.ir.num_host_transfers, self.ir.instance_replication_factor, shape)

    def create_host_outputs(self) -> Dict[DeviceToHostStream, np.ndarray]:
        """Empty host buffers for every device-to-host stream, shaped ``(d, r) + shape`` with the
        size-1 entries of (num_host_transfers, instance_replication_factor) dropped. A stream that a
        run may store fewer than num_host_transfers times gets zeros (its unwritten slices stay 0)."""
        return self._new_outputs()

    def _check_keys(self, given: Mapping, expected: List, what: str) -> None:
        for s in given:
            if isinstance(s, (HostToDeviceStream, DeviceToHostStream)) and s._ir is not self.ir:
                raise ValueError(f"Session.run: stream {s.tensor_id!r} in the {what} belongs to {s._ir!r}, not to "
                                 f"this Session's {self.ir!r}.")
        given_set = set(given)
        missing = [s.tensor_id for s in expected if s not in given_set]
        unexpected = [getattr(s, "tensor_id", repr(s)) for s in given
                      if isinstance(s, (HostToDeviceStream, DeviceToHostStream)) and s not in set(expected)]
        # keys that are not streams at all (a stream's name, a tensor): say what the key should be
        not_streams = [s for s in given if not isinstance(s, (HostToDeviceStream, DeviceToHostStream))]
        if missing or unexpected or not_streams:
            parts = []
            if missing:
                parts.append(f"missing {what} for streams {missing}")
            if unexpected:
                parts.append(f"unexpected {what} for {unexpected} (no host_{'load' if what == 'inputs' else 'store'} "
                             f"in the program reads/writes them)")
            by_name: Dict[str, Union[HostToDeviceStream, DeviceToHostStream]] = {}
            for s in expected:
                by_name.setdefault(s.tensor_id, s)
                by_name.setdefault(getattr(s, "name", s.tensor_id), s)
            for key in not_streams:
                factory = "popxl.h2d_stream" if what == "inputs" else "popxl.d2h_stream"
                hint = f"key {key!r} is a {type(key).__name__}, not a stream: {what} are keyed by the stream " \
                       f"objects that {factory} returns"
                match = by_name.get(key) if isinstance(key, str) else None
                if match is None and isinstance(key, Tensor):
                    match = by_name.get(key.id)
                if match is not None:
                    hint += f" (here the stream {match.tensor_id!r}: pass the stream itself, not its name)"
                parts.append(hint)
            raise ValueError("Session.run: " + "; ".join(parts) + ".")

    @staticmethod
    def _host_input(s: HostToDeviceStream, data: Any, downcast: bool) -> np.ndarray:
        """The host data of one input as an array; 64-bit data is downcast for 32-bit streams only.
        A wrong dtype is reported as the user gave it, not as its downcast."""
        arr = to_numpy(data, downcast=False, copy=False)
        want = s.dtype.as_numpy()
        if arr.dtype != want and downcast and downcast_np_dtypes.get(arr.dtype) == want:
            check_int_range(arr, want, f"Session.run: the input of stream {s.tensor_id!r}")
            return to_numpy(arr, copy=False)
        return arr

    def _device_view(self, s, arr: np.ndarray, is_input: bool) -> np.ndarray:
        """Check one host buffer; the C-contiguous array the engine reads or writes (a copy where the
        user's is strided, or read-only for an input)."""
        nht, rf = self.ir.num_host_transfers, self.ir.instance_replication_factor
        expected = self._host_shape(s)
        want_dtype = s.dtype.as_numpy()
        if arr.dtype != want_dtype:
            raise TypeError(f"Session.run: stream {s.tensor_id!r} carries {s.dtype.name}, but the host array has "
                            f"dtype {arr.dtype}. Convert it with .astype(np.{want_dtype}).")
        shape = arr.shape
        lead = [d for d in (nht, rf) if d > 1]
        data = tuple(shape[len(lead):])
        # A stream of one value per transfer takes it under any number of size-1 axes, as in PopXL
        # (popxl-addons' tests feed a () stream from (n, 1) arrays).
        single = all(d == 1 for d in s.shape) and all(d == 1 for d in data)
        ok = len(shape) >= len(lead) and (data == tuple(s.shape) or single)
        if ok and nht > 1:
            ok = shape[0] >= nht if is_input else shape[0] == nht
        if ok and rf > 1:
            ok = shape[len(lead) - 1] == rf
        if not ok:
            raise ValueError(f"Session.run: stream {s.tensor_id!r} needs a host {'input' if is_input else 'output'} "
                             f"of shape {expected} (num_host_transfers={nht}, replicas={rf}, stream shape "
                             f"{s.shape}), got {shape}.")
        if nht > 1 and is_input:
            arr = arr[:nht]
        if arr.dtype.names:
            arr = arr.view(dtypes.ml_dtype(s.dtype))
        # Engines read and write whole contiguous blocks; a strided user array goes through a copy
        # (outputs are copied back after the run, with the values of the slices no store wrote). The
        # native engine takes writable buffers only, so a read-only input (np.frombuffer, a
        # TensorProto's data) is copied too.
        if not arr.flags.c_contiguous or (is_input and not arr.flags.writeable):
            arr = np.array(arr, order="C")
        return arr  # engines take any C-contiguous shape of the right size

    def run_with_outputs(self, inputs: Optional[h2dStreamBufferMaps] = None,
                         outputs: Optional[d2hStreamBufferMaps] = None, downcast_inputs: bool = True) -> None:
        """Run the program once, reading ``inputs`` and filling the arrays of ``outputs`` in place.

        Args:
            inputs: One host array per host-to-device stream that ``host_load`` reads.
            outputs: One host array per device-to-host stream that ``host_store`` writes, filled in place.
            downcast_inputs: Turn 64-bit inputs into 32-bit.

        Raises:
            ValueError: If the session is not attached, a stream is missing or unexpected, or a shape
                does not match.
        """
        with self._lock:  # (not @_serialised: this is run's hot path)
            if self._running:
                raise self._reentry_error("run")
            self._running = True
            try:
                if self._run_exact(inputs, outputs) is None:
                    self._run_checked(inputs, outputs, downcast_inputs)
            finally:
                self._running = False

    @staticmethod
    def _reentry_error(what: str) -> Exception:
        shown = {"__enter__": "entering `with session:`", "__exit__": "leaving `with session:` (detach)"}
        return popart_exception(
            f"Session.{what}: called while a run of this session is in progress on the same thread (from a "
            f"custom op's kernel, a callback or a signal handler during Session.run?): "
            f"{shown.get(what, what)} must wait until the run is over, and cannot from inside it.")

    def _run_exact(self, inputs: Any, outputs: Any = None) -> Any:
        """run's fast path: the engine's C++ runner, on host data that already is exactly what the
        engine takes (dicts of C-contiguous NumPy arrays of the streams' dtypes and host shapes); the
        outputs (made when not given), or None, having run nothing, for anything else: the checked path
        converts it or says what is wrong. Taken once the first run has shown runs are short."""
        if self._exact_run is None or not self._run_progress.fast:
            return None
        try:
            done = self._exact_run(inputs, outputs)
        except BaseException:
            self._host_stale = True  # the run may have got part of the way
            raise
        if done is not None:
            self._host_stale = True
        return done

    def _run_checked(self, inputs, outputs, downcast_inputs: bool) -> None:
        self._require_attached("run")
        for given, what in ((inputs, "inputs"), (outputs, "outputs")):
            if given is not None and not isinstance(given, Mapping):
                raise TypeError(f"Session.run: {what} must be a dict from stream to host array "
                                f"({{stream: array}}), not {type(given).__name__}.")
        inputs = dict(inputs or {})
        outputs = dict(outputs or {})
        self._check_keys(inputs, self._h2d, "inputs")
        self._check_keys(outputs, self._d2h, "outputs")
        # 64-bit data is downcast for 32-bit streams only: a 64-bit stream keeps its data.
        in_views = [self._device_view(s, self._host_input(s, inputs[s], downcast_inputs), True) for s in self._h2d]
        out_bufs = []
        for s in self._d2h:
            arr = outputs[s]
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"Session.run: the output for stream {s.tensor_id!r} must be a NumPy array.")
            if not arr.flags.writeable:
                raise ValueError(f"Session.run: the output array for stream {s.tensor_id!r} is read-only; the run "
                                 f"writes into it (give a writable array, e.g. from create_host_outputs()).")
            out_bufs.append(self._device_view(s, arr, False))
        self._host_stale = True
        self._run_engine(in_views, out_bufs)
        for s, buf in zip(self._d2h, out_bufs):
            if not np.shares_memory(buf, outputs[s]):  # a non-contiguous array was reshaped by copy
                outputs[s][...] = buf.reshape(outputs[s].shape)

    def _run_engine(self, inputs: List[np.ndarray], outputs: List[np.ndarray]) -> None:
        if self._run_progress.fast:  # the first run was quick: no timing, no bar
            self._engine_run(inputs, outputs)
        else:
            self._run_progress.run(self._engine_run, inputs, outputs)

    def run(self, inputs: Optional[h2dStreamBufferMaps] = None,
            downcast_inputs: bool = True) -> Dict[DeviceToHostStream, np.ndarray]:
        """Run the program once and return the host outputs (see ``create_host_outputs``).

        Args:
            inputs: One host array per host-to-device stream that ``host_load`` reads.
            downcast_inputs: Turn 64-bit inputs into 32-bit.

        Returns:
            One array per device-to-host stream.

        Raises:
            ValueError: If the session is not attached, a stream is missing or unexpected, or a shape
                does not match.
        """
        with self._lock:
            if self._running:
                raise self._reentry_error("run")
            self._running = True
            try:
                outputs = self._run_exact(inputs)
                if outputs is None:
                    outputs = self._new_outputs()
                    self._run_checked(inputs, outputs, downcast_inputs)
            finally:
                self._running = False
        return outputs

    def __repr__(self) -> str:
        return f"Session[{self.ir_!r} on {self._device!r}, {'attached' if self.is_attached else 'detached'}]"
