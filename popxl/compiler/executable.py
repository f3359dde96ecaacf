"""The Executable: the contract between lowering and every engine.

It is plain data (no Python callables, no IR objects) and round-trips through JSON, so the C++
engine can load exactly what the reference engine runs. Layout:

- ``arena_bytes``: size of one replica's device memory. Every tensor lives at a fixed place in it.
- ``buffers``: list of ``{"offset", "shape", "strides", "dtype"}`` (bytes, bytes, dtype name);
  a buffer is a strided view into the arena. Several buffers may view the same bytes (aliases).
- ``constants``: ``{"buffer", "data"}``: raw C-order bytes written at load.
- ``variables``: ``{"name", "buffer"}``: device state kept between runs, written by
  weights_from_host and read by weights_to_host. After the variables come the remote buffers'
  regions (``"remote_buffer": id``, shape ``(entries, *tensor_shape)``) and tensors that mirror a
  remote slot (``"mirror_of": [buffer id, offset]``, the shards of replica-sharded variables).
- ``h2d`` / ``d2h``: streams ``{"name", "shape", "dtype"}``; indices are used by instructions.
- ``graphs``: list of ``{"id", "program"}``; graph 0 is the main program, run once per ``run``.
- ``static_graph``: index of the static program (id ``"<static>"``) in ``graphs``, or -1 when
  there is none. It computes values from the program's *static storage* alone, and engines run it
  (for every replica) before the main program whenever variables may have changed since it last
  ran: after attach and after any ``write_variable``; running it more often is also correct.
  Static storage is the storage of variables (not remote) and constants that no instruction of
  any program changes, and of the results of the static program's ops, which have permanent
  places that nothing else changes (a by-reference input that its graph does not write may be
  copied back, unchanged). So between two variable writes, static storage holds the same bytes.
- ``num_host_transfers``, ``replication_factor`` (the replicas the engine runs: this instance's, in a
  launch of several instances, whose replica groupings and collectives count every instance's).

Instructions (``program`` entries, declared in instructions.py), executed in order:

- ``{"kind": "op", "type", "inputs": [buf], "outputs": [buf], "attrs": {...}}``: run the kernel
  registered for ``type`` on the input views and write its results into the output views.
  Attrs are JSON values; a dtype is encoded as ``{"dtype": name}``.
  Collective ops (registry flag) run across all replicas at once. Ops with a remote buffer
  attribute get that buffer's region as an extra last input (the attribute becomes its id).
  ``"static_inputs": [input positions]`` (absent when empty) lists the inputs whose buffer lies
  entirely within static storage: a kernel may keep values derived from them (e.g. weights
  reordered into another layout) until variables are next written.
- ``{"kind": "copy", "src": buf, "dst": buf}``: copy the (possibly strided) view ``src`` into
  ``dst`` (same shape and dtype). Ops that copy a view of their input (reshape, transpose,
  slice, identity, ...) lower to this.
- ``{"kind": "call", "graph", "copy_in": [[src, dst]], "copy_out": [[src, dst]]}``: copy, run, copy.
- ``{"kind": "repeat", "graph", "count", "copy_in", "carry", "copy_out"}``: copy in once; run
  ``count`` times, after each iteration applying ``carry`` (output -> input pairs, all read before
  any is written); then copy out from the graph's inputs/outputs as listed. ``count == 0`` runs
  nothing: ``copy_out`` then names the carried inputs, which hold the initial values.
- ``{"kind": "if", "cond": buf, "then": {"graph", "copy_in", "copy_out"}, "else": {...}}``.
- ``{"kind": "host_load", "stream", "output": buf}`` / ``{"kind": "host_store", "stream", "input": buf}``:
  move the next slice of the stream's host buffer for this replica.
"""
from __future__ import annotations

import base64
import functools
import json
from typing import Any, Dict, List, Optional, Tuple

import attrs

from popxl import dtypes
from popxl.compiler.instructions import check_op_attrs, check_program

FORMAT = "popxl-executable"
VERSION = 3  # 2: the static program and static inputs; 3: the ops' attribute declarations (op_attrs)
# a version 1 executable is one with no static program or static inputs, a version 2 one has no
# op_attrs (its ops' attributes are not checked)
READABLE_VERSIONS = (1, 2, 3)
STATIC_GRAPH_ID = "<static>"


@attrs.define
class Executable:
    arena_bytes: int
    buffers: List[Dict[str, Any]]
    constants: List[Dict[str, Any]]
    variables: List[Dict[str, Any]]
    h2d: List[Dict[str, Any]]
    d2h: List[Dict[str, Any]]
    graphs: List[Dict[str, Any]]
    num_host_transfers: int = 1
    replication_factor: int = 1
    static_graph: int = -1
    # op type -> its attributes' declaration (name -> type, popxl.op.ATTRIBUTE_TYPES), for each
    # op type the programs run that declares its attributes; both engines check every op
    # instruction's attributes against it at load
    op_attrs: Dict[str, Dict[str, str]] = attrs.Factory(dict)

    def to_json(self) -> str:
        d = attrs.asdict(self)
        d["constants"] = [{"buffer": c["buffer"], "data": base64.b64encode(c["data"]).decode()} for c in self.constants]
        return json.dumps({"format": FORMAT, "version": VERSION, **d})

    @classmethod
    def from_json(cls, text: str) -> "Executable":
        d = json.loads(text)
        if d.pop("format", None) != FORMAT or d.pop("version", None) not in READABLE_VERSIONS:
            raise ValueError("not a popxl executable of this version")
        d["constants"] = [{"buffer": c["buffer"], "data": base64.b64decode(c["data"])} for c in d["constants"]]
        d["buffers"] = [{**b, "shape": tuple(b["shape"]), "strides": tuple(b["strides"])} for b in d["buffers"]]
        for g in d["graphs"]:
            check_program(g["program"], f"graph {g['id']!r}")
        exe = cls(**d)
        check_op_attrs(exe.graphs, exe.op_attrs)
        return exe


def transfer_counts(exe: Executable) -> Tuple[List[Optional[int]], List[Optional[int]]]:
    """How many times each h2d and each d2h stream is transferred per replica in one run of the main
    program: a count, or None where it depends on which branch of an ``if`` runs (the branches
    transfer the stream a different number of times)."""
    Counts = Dict[Tuple[str, int], Optional[int]]  # ("host_load" | "host_store", stream) -> count

    def add(into: Counts, other: Counts, times: int = 1) -> None:
        for key, n in other.items():
            have = into.get(key, 0)
            into[key] = None if have is None or n is None else have + n * times

    @functools.lru_cache(maxsize=None)
    def counts(graph: int) -> Counts:
        out: Counts = {}
        for ins in exe.graphs[graph]["program"]:
            kind = ins["kind"]
            if kind in ("host_load", "host_store"):
                add(out, {(kind, ins["stream"]): 1})
            elif kind == "call":
                add(out, counts(ins["graph"]))
            elif kind == "repeat":
                add(out, counts(ins["graph"]), ins["count"])
            elif kind == "if":
                then, other = counts(ins["then"]["graph"]), counts(ins["else"]["graph"])
                add(out, {key: then.get(key, 0) if then.get(key, 0) == other.get(key, 0) else None
                          for key in {*then, *other}})
        return out

    main = counts(0)
    return ([main.get(("host_load", s), 0) for s in range(len(exe.h2d))],
            [main.get(("host_store", s), 0) for s in range(len(exe.d2h))])


def encode_attr(value: Any) -> Any:
    """IR attribute -> JSON value (dtypes become ``{"dtype": name}``)."""
    if isinstance(value, dtypes.dtype):
        return {"dtype": value.name}
    if isinstance(value, (list, tuple)):
        return [encode_attr(v) for v in value]
    if isinstance(value, dict):
        return {k: encode_attr(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item"):  # NumPy scalar
        return value.item()
    raise TypeError(f"attribute value {value!r} cannot be put in an executable")


def decode_attr(value: Any) -> Any:
    """JSON value -> kernel argument (the inverse of encode_attr; lists become tuples)."""
    if isinstance(value, dict):
        if set(value) == {"dtype"}:
            return dtypes.dtype.from_name(value["dtype"])
        return {k: decode_attr(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(decode_attr(v) for v in value)
    return value
