"""`popxl.Ir`: the whole program: a main graph, subgraphs, streams and settings."""
from __future__ import annotations

import inspect
import itertools
import typing
from pathlib import Path
from typing import Any, Callable, Dict, List, Literal, Optional, Set, Union

from popxl import _hooks, _pb
from popxl.graph import Graph
from popxl.module import Module
from popxl.replica_grouping import ReplicaGrouping
from popxl.tensor import Tensor, TensorByRef, TensorSpec, graph_input, graph_output

__all__ = ["Ir"]

_IR_IDS = itertools.count()


class Ir:
    """A PopXL program: a main graph, subgraphs, streams and settings.

    Trace ops into it inside ``with ir.main_graph:``, then run it with a `popxl.Session`.
    Equality and hashing are by id.

    Args:
        replication: The number of replicas (``replication_factor``), or "popdist" to take it
            from the launcher's environment (poprun): this instance's replicas
            (``instance_replication_factor``) among every instance's (``replication_factor``), with
            collectives spanning the instances.

    Raises:
        ValueError: If ``replication`` is not a positive int or "popdist", or if the launch
            environment is malformed or is not the MPI launch it describes.
    """

    # popxl.remote_buffer's list of the Ir's remote buffers, made when the first one is
    _remote_buffers: List[Any]

    def __init__(self, replication: Union[int, Literal["popdist"]] = 1) -> None:
        self._id = next(_IR_IDS)
        self._graphs: Dict[str, Graph] = {}
        self._subgraph_counter = itertools.count()
        self._tensor_counter = itertools.count(1)
        self._op_ids = itertools.count(100)  # Op.id, as PopART numbers its ops
        self._stream_ids: Set[str] = set()
        self._frozen_by: Optional[str] = None
        self._num_host_transfers = 1
        # .dot checkpoints: the checks asked for besides POPART_DOT_CHECKS, and where files go
        # (the dotChecks / logDir session options; popxl.visualize.dot_checkpoint)
        self._dot_checks: Set[str] = set()
        self._dot_save_dir: Optional[Path] = None
        self._main_graph = Graph._create(self, "", "main")
        self._replication_factor = 1  # this instance's replicas
        self._instance_index, self._num_instances = 0, 1
        if replication == "popdist":
            replication, self._instance_index, self._num_instances = _hooks.popdist_launch()
        self.replication_factor = replication

    # identity -------------------------------------------------------------------------------------
    @property
    def id(self) -> int:
        """The Ir's unique number."""
        return self._id

    @property
    def _pb_ir(self) -> Any:
        """This Ir as PopART's internal IR shows it (popart._internal.ir.Ir, a view)."""
        return _pb.view_of(self)

    def __repr__(self) -> str:
        return f"Ir[id={self._id}]"

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Ir):
            raise TypeError(f"Cannot compare an Ir with {type(other).__name__}.")
        return self._id == other._id

    def __hash__(self) -> int:
        return hash(("Ir", self._id))

    def __reduce_ex__(self, protocol: Any) -> Any:
        # The IR holds traced functions and kernels, which have no portable form (nor has PopXL's).
        raise TypeError(f"{self!r} (a popxl.Ir, or a graph or tensor of it) cannot be pickled or deep-copied: "
                        f"rebuild the program in the other process instead.")

    # ownership ------------------------------------------------------------------------------------
    def _check_mutable(self) -> None:
        if self._frozen_by is not None:
            raise RuntimeError(
                f"{self!r} is owned by a popxl.Session ({self._frozen_by}) and cannot be modified. "
                f"Build a new Ir for a different program.")

    # graphs ---------------------------------------------------------------------------------------
    @property
    def main_graph(self) -> Graph:
        """The main graph: the program ``Session.run`` runs."""
        return self._main_graph

    def _new_graph(self, base: str) -> Graph:
        self._check_mutable()
        gid = f"{base.replace('.<locals>', '')}_subgraph({next(self._subgraph_counter)})"
        g = Graph._create(self, gid, base.rpartition(".")[2] or gid)
        self._graphs[gid] = g
        return g

    def create_empty_graph(self, name: Optional[str] = None) -> Graph:
        """A new graph with no inputs or ops; fill it with ``with g:``.

        Args:
            name: The graph's name; default a generated one.

        Returns:
            The new graph.
        """
        return self._new_graph(name or "graph")

    def create_graph(self, fn: Union[Callable[..., Any], Module], *args: Any, **kwargs: Any) -> Graph:
        """Trace a function (or a Module's ``build``) into a new graph.

        Each tensor (or `TensorSpec`) argument becomes a graph input of its shape and dtype, named after
        the parameter; lists and tuples of tensors become one input each (``<param>_<i>``); other
        arguments pass through. The function's returned tensors become the graph's outputs. Parent
        tensors are never captured implicitly: using one inside raises ValueError.

        Args:
            fn: A `Module` or a callable with a ``__qualname__``.
            *args: Arguments of ``fn``.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            The new graph.

        Raises:
            TypeError: If ``fn`` is neither a Module nor a named callable, or a container mixes tensors
                and other values.
            ValueError: If the arguments do not bind to ``fn``'s signature, ``fn`` returns something other
                than None, a Tensor or tensors, or uses a tensor of another graph.
        """
        if isinstance(fn, Module):
            build, qualname = fn.build, type(fn).__qualname__
        elif callable(fn) and hasattr(fn, "__qualname__"):
            build, qualname = fn, fn.__qualname__
        else:
            raise TypeError(f"create_graph needs a popxl.Module or a function, not {type(fn).__name__}.")
        sig = inspect.signature(build)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ValueError(f"create_graph({qualname}): the arguments do not match the signature {sig}: {e}") from None
        bound.apply_defaults()
        by_ref = _by_ref_params(build, sig)
        g = self._new_graph(qualname)
        with g:
            call_args, call_kwargs = [], {}
            for pname, value in bound.arguments.items():
                kind = sig.parameters[pname].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    call_args.extend(_to_inputs(pname, tuple(value), by_ref.get(pname, False), container=True))
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    for k, v in value.items():
                        call_kwargs[k] = _to_input(k, v, by_ref.get(pname, False))
                elif kind is inspect.Parameter.KEYWORD_ONLY:
                    call_kwargs[pname] = _convert(pname, value, by_ref.get(pname, False))
                else:
                    call_args.append(_convert(pname, value, by_ref.get(pname, False)))
            result = build(*call_args, **call_kwargs)
            for t in _outputs_of(qualname, result):
                graph_output(t)
        return g

    # settings -------------------------------------------------------------------------------------
    @property
    def num_host_transfers(self) -> int:
        """How many slices each stream advances per ``Session.run`` (the host buffers' leading dimension
        when above 1)."""
        return self._num_host_transfers

    @num_host_transfers.setter
    def num_host_transfers(self, value: int) -> None:
        self._check_mutable()
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"num_host_transfers must be a positive int, not {value!r}.")
        self._num_host_transfers = value

    @property
    def replication_factor(self) -> int:
        """The replicas of all instances (setting it sets this instance's, ``instance_replication_factor``)."""
        return self._replication_factor * self._num_instances

    @replication_factor.setter
    def replication_factor(self, value: int) -> None:
        if self._frozen_by is not None:
            raise RuntimeError(
                f"replication_factor of {self!r} cannot change after a Session was created for it.")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"replication_factor must be a positive int, not {value!r}.")
        self._replication_factor = value

    @property
    def instance_replication_factor(self) -> int:
        """The number of replicas this instance runs."""
        return self._replication_factor

    @property
    def _instances(self) -> tuple:
        """(this instance's index, the instance count): (0, 1) unless ``Ir(replication="popdist")`` in a
        launch of several instances."""
        return self._instance_index, self._num_instances

    def replica_grouping(self, stride: int = 1, group_size: Optional[int] = None):
        """A grouping of the replicas: group i takes the first unassigned replica ``o`` and ``o + k * stride``.

        Args:
            stride: The distance between members of a group.
            group_size: The members per group; default ``replication_factor // stride``.

        Returns:
            The `ReplicaGrouping`.

        Raises:
            ValueError: If ``stride`` or ``group_size`` does not divide the replicas as required.
        """
        return ReplicaGrouping._from_params(self, stride=stride, group_size=group_size)

    def replica_grouping_from_assignments(self, assignment: List[int]):
        """A grouping of the replicas from each replica's group number.

        Args:
            assignment: The group of each replica: ids 0..k-1 in first-appearance order, equal group sizes.

        Returns:
            The `ReplicaGrouping`.

        Raises:
            ValueError: If the assignment is not valid for ``replication_factor`` replicas.
        """
        return ReplicaGrouping._from_assignments(self, assignment)

    # streams --------------------------------------------------------------------------------------
    def _all_graphs(self) -> List[Graph]:
        return [self._main_graph, *self._graphs.values()]

    def _streams_of(self, optype: str) -> Set[Any]:
        return {op.attrs["stream"] for g in self._all_graphs() for op in g.schedule() if op.type == optype}

    def get_all_d2h_streams(self) -> Set[Any]:
        """Every device-to-host stream that some ``host_store`` writes.

        Returns:
            A set of `DeviceToHostStream`.
        """
        return self._streams_of("host_store")

    def get_all_h2d_streams(self) -> Set[Any]:
        """Every host-to-device stream that some ``host_load`` reads.

        Returns:
            A set of `HostToDeviceStream`.
        """
        return self._streams_of("host_load")

    def dot_checkpoint(self, check: str, save_dir: Optional[Union[Path, str]] = None) -> None:
        """Write every graph as Graphviz DOT to ``<save_dir>/<check>_all.dot``, filtered by the
        ``POPART_DOT_CHECKS`` environment variable as in PopXL (popxl.visualize.dot_checkpoint).

        Args:
            check: The checkpoint's name.
            save_dir: The directory written to; default the current directory.
        """
        _hooks.dot_checkpoint(self, check, save_dir)

    # display --------------------------------------------------------------------------------------
    def __str__(self) -> str:
        """A typed listing of the whole program (popxl.visualize.ir_listing)."""
        return _hooks.ir_listing(self)

    def _repr_svg_(self) -> Optional[str]:
        """Jupyter shows an Ir as a picture of its graphs (popxl.visualize.to_svg for options)."""
        return _hooks.repr_svg(self)


def _annotation_is_by_ref(ann: Any) -> bool:
    if ann is TensorByRef:
        return True
    if isinstance(ann, str):
        return "TensorByRef" in ann
    return any(_annotation_is_by_ref(a) for a in typing.get_args(ann))


def _by_ref_params(fn: Callable, sig: inspect.Signature) -> Dict[str, bool]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolved forward references: fall back to the raw annotations
        hints = {}
    return {name: _annotation_is_by_ref(hints.get(name, p.annotation)) for name, p in sig.parameters.items()}


def _is_tensorish(v: Any) -> bool:
    return isinstance(v, (Tensor, TensorSpec))


def _to_input(name: str, value: Any, by_ref: bool) -> Tensor:
    return graph_input(value.shape, value.dtype, name, by_ref=by_ref, meta_shape=value.meta_shape or None)


def _to_inputs(pname: str, values: tuple, by_ref: bool, container: bool = False) -> List[Any]:
    tensorish = [_is_tensorish(v) for v in values]
    if any(tensorish) and not all(tensorish):
        raise TypeError(f"create_graph: parameter {pname!r} mixes tensors and non-tensors; "
                        f"pass tensors and other values in separate parameters.")
    if not any(tensorish):
        return list(values)
    return [_to_input(f"{pname}_{i}", v, by_ref) for i, v in enumerate(values)]


def _convert(pname: str, value: Any, by_ref: bool) -> Any:
    if _is_tensorish(value):
        return _to_input(pname, value, by_ref)
    if isinstance(value, (list, tuple)) and value:
        items = _to_inputs(pname, tuple(value), by_ref)
        return type(value)(items) if isinstance(value, tuple) else items
    return value


def _outputs_of(qualname: str, result: Any) -> List[Tensor]:
    if result is None:
        return []
    if isinstance(result, Tensor):
        return [result]
    try:
        items = list(result)
    except TypeError:
        items = None
    if items is None or not all(isinstance(t, Tensor) for t in items):
        raise ValueError(f"create_graph({qualname}): the function must return None, a Tensor or an "
                         f"iterable of Tensors, not {result!r}.")
    return items
