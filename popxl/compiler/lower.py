"""Lower an Ir to an Executable.

1. Schedule: ops run in creation order. That order is topological (an op can only use tensors
   that already exist), honours every ``in_sequence`` mode, and makes in-place updates visible to
   exactly the reads traced after them.
2. Aliases: a view op's output (``reshape_``, ``transpose_``, ``slice_``, ...) is placed inside its
   input's storage; an in-place op's output *is* its input's storage. Each tensor therefore has a
   root storage and a strided view of it.
3. Memory plan: variables and constants get permanent places, and so does each remote buffer
   (a region of ``(entries, *tensor_shape)``, handed to remote ops as an extra last input); each
   graph gets its own region in which root storages are packed first-fit by liveness (a storage
   is live from the op that defines it to the last op that reads any view of it; graph inputs
   and outputs for the whole graph). Regions of different graphs never overlap, so a graph may
   call another freely. A graph with a single call site reads inputs from, and writes outputs
   into, its caller's storage where that is legal, so the call copies nothing.
4. Static values: main-graph ops that compute from unchanging storage alone (see
   ``_find_static``) leave the main program for the static program, which engines run only when
   variables may have changed; their results get permanent places. Every op instruction lists
   which of its inputs lie in such unchanging storage (``static_inputs``), so kernels may keep
   values derived from them (a reordered weight) for as long as the variables are unchanged.
5. Program tree: one instruction list per graph; see executable.py for the instruction set.

Lowering only plans: it creates and rewrites no ops, so what runs is what the IR shows. Rewrites
are transforms (``popxl.transforms``; the Session applies its transform pipeline first), and the facts
both sides need (call sites, storage roots, written sets, static ops) are in ``popxl.analysis``.
The one liberty taken is running a copying view op as a view (step 2 of ``_elide_copies``).
"""
from __future__ import annotations

import bisect
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from popxl import dtypes
from popxl.analysis import ProgramFacts
from popxl.compiler import instructions
from popxl.compiler.executable import STATIC_GRAPH_ID, Executable, encode_attr
from popxl.graph import Graph
from popxl.op import Op
from popxl.remote_buffer import RemoteBuffer, _buffers_of
from popxl.tensor import Constant, Tensor, Variable

ALIGN = 64

Desc = Tuple[int, Tuple[int, ...], Tuple[int, ...], str]  # offset, shape, byte strides, dtype name


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _contiguous_desc(offset: int, t: Tensor) -> Desc:
    return _packed_desc(offset, t.shape, t.dtype)


def _packed_desc(offset: int, shape: Tuple[int, ...], dtype: dtypes.dtype) -> Desc:
    item = dtypes.ml_dtype(dtype).itemsize
    strides, acc = [], item
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return offset, tuple(shape), tuple(reversed(strides)), dtype.name


def _nbytes(t: Tensor) -> int:
    return t.nelms * dtypes.ml_dtype(t.dtype).itemsize


def _view_desc(op: Op, src: Desc) -> Desc:
    """Apply the op's NumPy view function to a stand-in array to learn the output's place."""
    offset, shape, strides, dt_name = src
    np_dt = dtypes.ml_dtype(dtypes.dtype.from_name(dt_name))
    base = np.zeros(1, dtype=np_dt)
    # The stand-in has no data beyond one element: a view function must never copy (reshape's
    # raises instead), or it would read past it.
    fake = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides)

    def root(a):
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a

    view_of = op.opdef.view
    assert view_of is not None, f"{op.type} is not a view op"
    try:
        view = view_of(fake, **op.attrs)
        copied = root(view) is not root(fake)
    except ValueError:
        copied = True
    if copied:
        raise ValueError(f"{op.type} {op.name!r} (at {op.location}): this view cannot be expressed without a "
                         f"copy (input layout shape={shape} strides={strides}); use the copying op instead.")
    delta = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return offset + delta, tuple(view.shape), tuple(view.strides), dt_name


class _Lowering:
    def __init__(self, ir) -> None:
        self.ir = ir
        self.buffers: List[Dict] = []
        self.buffer_ids: Dict[Desc, int] = {}
        self.desc: Dict[Tensor, Desc] = {}
        self.h2d: Dict[object, int] = {}
        self.d2h: Dict[object, int] = {}
        self.regions: Dict[RemoteBuffer, Desc] = {}
        self.arena = 0
        self.facts = ProgramFacts(ir)
        self.graphs = self.facts.graphs
        self.graph_index = {g: i for i, g in enumerate(self.graphs)}
        self._elide_copies()
        self.static_roots: Set[Tensor] = set()
        self.static_ops: List[Op] = []
        self._static_extents: List[Tuple[int, int]] = []  # sorted, disjoint [start, end) byte ranges

    def buf(self, t: Tensor) -> int:
        if t not in self.desc and t._remote_slot is not None:
            raise ValueError(f"remote variable {t.id!r} lives in remote memory ({t._remote_slot[0]!r}, slot "
                             f"{t._remote_slot[1]}) and cannot be used by ops directly; load it with "
                             f"ops.remote_load.")
        return self.buf_of_desc(self.desc[t])

    def buf_of_desc(self, d: Desc) -> int:
        if d not in self.buffer_ids:
            self.buffer_ids[d] = len(self.buffers)
            self.buffers.append({"offset": d[0], "shape": d[1], "strides": d[2], "dtype": d[3]})
        return self.buffer_ids[d]

    # memory ---------------------------------------------------------------------------------------
    def place_permanent(self) -> None:
        for g in self.graphs:
            for t in g.tensors:
                if isinstance(t, Variable) and t._remote_slot is not None:
                    rb, offset, _ = t._remote_slot  # it lives in its buffer's region, not on chip
                    if offset >= rb.entries:
                        raise ValueError(f"remote variable {t.id!r} is in slot {offset} of {rb!r}, which has "
                                         f"only {rb.entries} entries.")
                    continue
                # Non-variable tensors with a remote slot are replica-sharded variables' shards:
                # on-chip state kept between runs, like variables.
                if isinstance(t, (Variable, Constant)) or t._remote_slot is not None:
                    self.desc[t] = _contiguous_desc(self.arena, t)
                    self.arena += _align(_nbytes(t))
        for rb in _buffers_of(self.ir):
            shape = (rb.entries, *rb.tensor_shape)
            self.regions[rb] = _packed_desc(self.arena, shape, rb.tensor_dtype)
            self.arena += _align(int(np.prod(shape, dtype=np.int64)) * dtypes.ml_dtype(rb.tensor_dtype).itemsize)
        # Results of static ops outlive every run (the static program does not run each time).
        for op in self.static_ops:
            for t in op.outputs:
                self.desc[t] = _contiguous_desc(self.arena, t)
                self.arena += _align(_nbytes(t))
        self._static_extents = sorted((self.desc[r][0], self.desc[r][0] + _nbytes(r)) for r in self.static_roots)

    def _elide_copies(self) -> None:
        """Copying views (``reshape``, ``transpose``, ``slice``, ``identity`` ...) whose input storage
        and result are never written become views of the input: the two then hold the same values
        for as long as either is used, so the copy changes nothing but the time it takes (on an IPU
        such ops are views too). Kernels read strided operands; a matmul reads a transposed one
        without a copy. Kept copies: ``broadcast_to`` (zero strides would reach kernels, oneDNN's,
        that expect none), copies whose result is a graph output (a repeat carries outputs into
        inputs, which a view of an input would then read mid-assignment), and copies whose view
        cannot be expressed on the input's layout or would leave a later view op unable to be
        (layouts follow from the views between a tensor and its root; roots are contiguous)."""
        blocked: Set[Op] = set()  # copies kept because a view op downstream needs a layout they lack
        while True:
            self.elided: Set[Op] = set()
            failed: Optional[Op] = None
            for g in self.graphs:
                failed = self._elide_in(g, blocked)
                if failed is not None:
                    break
            if failed is None:
                break
            blocked.add(failed)
        # Elision merges only storages nothing writes, so the written sets found above still hold.
        self.facts.set_views(self.elided)

    def _elide_in(self, g: Graph, blocked: Set[Op]) -> Optional[Op]:
        """Elide the eligible copies of ``g`` (not in ``blocked``); returns an elided copy that a
        later view op cannot be expressed on (to keep it and try again), else None."""
        written, root, outputs = self.facts.written(g), self.facts.roots[g], set(g.outputs)
        layout: Dict[Tensor, Desc] = {}  # place relative to the root's storage, at offset 0
        source: Dict[Tensor, Op] = {}    # the nearest elided copy a tensor's layout comes from

        def place(t: Tensor) -> Desc:
            return layout[t] if t in layout else _contiguous_desc(0, t)
        for op in g.schedule():
            d = op.opdef
            if not op.outputs or not op.inputs:  # nothing to alias
                continue
            src, out = op.inputs[d.inplace if d.inplace is not None else 0], op.outputs[0]
            if d.inplace is not None:
                layout[out] = place(src)
            if d.view is None or (d.copy and (op in blocked or op.type == "broadcast_to" or root[src] in written
                                              or out in written or out in outputs)):
                continue
            try:
                layout[out] = _view_desc(op, place(src))
            except ValueError:
                if not d.copy and src in source:
                    return source[src]
                continue  # a copy that stays one (or a view op, which fails as before)
            if d.copy:
                self.elided.add(op)
                source[out] = op
            elif src in source:
                source[out] = source[src]
        return None

    def _input_aliases(self, g: Graph) -> Dict[Tensor, Desc]:
        """Inputs of ``g`` that can use their caller's storage instead of a copy.

        Legal when ``g`` has exactly one call/repeat site (so there is one caller tensor), the
        input is not loop-carried (carries overwrite it), the caller tensor is contiguous and bound
        only once, and the input is by-reference or never written inside ``g`` (a by-value input
        written in place would change the caller's tensor)."""
        sites = self.facts.sites[g]
        if len(sites) != 1 or sites[0].type not in ("call", "repeat"):
            return {}
        site = sites[0]
        carried = len(g.outputs) if site.type == "repeat" else 0
        written = self.facts.written(g)
        inputs = g.inputs
        aliases = {}
        for parent, i in zip(site.inputs, site.attrs["input_index"]):
            t = inputs[i]
            d = self.desc.get(parent)
            if (i < carried or d is None or sum(p is parent for p in site.inputs) > 1
                    or (t in written and not g.is_input_by_ref(t)) or d != _contiguous_desc(d[0], parent)):
                continue
            aliases[t] = d
        return aliases

    def _static_inputs(self, buffers: Sequence[int]) -> List[int]:
        """Positions of the buffers lying entirely within static storage."""
        positions = []
        for k, b in enumerate(buffers):
            desc = self.buffers[b]
            if 0 in desc["shape"]:
                continue
            lo = hi = desc["offset"]
            for n, stride in zip(desc["shape"], desc["strides"]):
                lo, hi = lo + min(0, (n - 1) * stride), hi + max(0, (n - 1) * stride)
            hi += dtypes.ml_dtype(dtypes.dtype.from_name(desc["dtype"])).itemsize
            i = bisect.bisect_right(self._static_extents, (lo, float("inf"))) - 1
            if i >= 0 and self._static_extents[i][0] <= lo and hi <= self._static_extents[i][1]:
                positions.append(k)
        return positions

    def _output_aliases(self, g: Graph, root: Dict[Tensor, Tensor]) -> Dict[Tensor, Desc]:
        """Outputs of ``g`` that can be computed straight into their caller's storage instead of
        being copied there after the call.

        Legal when ``g`` has exactly one site and it is a ``call`` (a repeat carries outputs into
        inputs), the output owns its storage (not an input, a variable or a view) and is output
        once. The caller's output storage is live from the call on, so the caller's planner kept
        it apart from everything live during the call; other graphs have their own regions."""
        sites = self.facts.sites[g]
        if len(sites) != 1 or sites[0].type != "call":
            return {}
        inputs = set(g.inputs)
        outputs = g.outputs
        aliases = {}
        for t, parent in zip(outputs, sites[0].outputs):
            d = self.desc.get(parent)
            if (d is None or root[t] is not t or t in inputs or isinstance(t, (Variable, Constant))
                    or t._remote_slot is not None or sum(o is t for o in outputs) > 1
                    or d != _contiguous_desc(d[0], parent)):
                continue
            aliases[t] = d
        return aliases

    def place_graph(self, g: Graph) -> None:
        ops = g.schedule()
        root = self.facts.roots[g]
        aliases = self._input_aliases(g)
        out_aliases = self._output_aliases(g, root)
        self.desc.update(aliases)
        self.desc.update(out_aliases)
        end = len(ops)
        live: Dict[Tensor, List[int]] = {}
        for t in g.inputs:
            if t not in aliases:
                live[t] = [-1, end]
        for pos, op in enumerate(ops):
            for out in op.outputs:
                r = root[out]
                if r is out and r not in self.static_roots:  # static: permanent
                    live.setdefault(r, [pos, pos])
            for t in op.inputs:
                r = root[t]
                if r in live:
                    live[r][1] = max(live[r][1], pos)
            for out in op.outputs:  # an in-place write is a use of the storage too
                r = root[out]
                if r in live:
                    live[r][1] = max(live[r][1], pos)
        for t in g.outputs:
            if root[t] in live:
                live[root[t]][1] = end
        for t in out_aliases:
            del live[t]
        reused = self._reuse_dying_inputs(ops, root, live)
        # first-fit packing of root storages within this graph's region
        placed: List[Tuple[int, int, int, int]] = []  # offset, size, start, end
        region = 0
        for r, (start, stop) in sorted(live.items(), key=lambda kv: (kv[1][0], -_nbytes(kv[0]))):
            size = _align(_nbytes(r))
            offset = 0
            for o, s, a, b in sorted((p for p in placed if not (p[3] < start or p[2] > stop))):
                if offset + size <= o:
                    break
                offset = max(offset, o + s)
            placed.append((offset, size, start, stop))
            region = max(region, offset + size)
            self.desc[r] = _contiguous_desc(self.arena + offset, r)
        self.arena += region
        for out, owner in reused.items():  # same shape and dtype: the same place
            self.desc[out] = self.desc[owner]
        for op in ops:  # views: derived from their input's place
            if self.facts.is_view(op):
                self.desc[op.outputs[0]] = _view_desc(op, self.desc[op.inputs[0]])
            elif op.opdef.inplace is not None and op.outputs:
                self.desc[op.outputs[0]] = self.desc[op.inputs[op.opdef.inplace]]

    def _reuse_dying_inputs(self, ops: Sequence[Op], root: Dict[Tensor, Tensor],
                            live: Dict[Tensor, List[int]]) -> Dict[Tensor, Tensor]:
        """In place where it is safe: the result of an elementwise op (``OpDef.elementwise``), or of
        another op over the inputs it declares (``OpDef.overwritable``: a convolution's residual),
        takes the storage of such an input of its shape and dtype whose storage is used for the
        last time by this op, so the op writes memory it has just read instead of fresh memory (a
        bias add over a 4 MB activation: ~25% faster) and the arena is smaller. The input must be
        a whole planned storage and no other input of the op may read that storage. Edits ``live`` (the result's
        interval joins its new owner's) and returns {result: the storage owner it shares}."""
        owner: Dict[Tensor, Tensor] = {}  # storage root -> the planned storage it now lives in

        def storage(t: Tensor) -> Tensor:
            r = root[t]
            while r in owner:
                r = owner[r]
            return r
        for pos, op in enumerate(ops):
            d = op.opdef
            candidates = (range(len(op.inputs)) if d.elementwise
                          else d.overwritable(**op.attrs) if d.overwritable is not None else ())
            if not candidates or not op.outputs or op.outputs[0] not in live:
                continue
            out = op.outputs[0]
            if root[out] is not out or live[out][0] != pos:
                continue
            for t in (op.inputs[i] for i in candidates):
                s = storage(t)
                if (root[t] is t and t.shape == out.shape and t.dtype == out.dtype and s in live
                        and live[s][0] >= 0 and live[s][1] == pos
                        and all(storage(u) is not s for u in op.inputs if u is not t)):
                    owner[out] = s
                    live[s][1] = live.pop(out)[1]
                    break
        return owner

    # programs -------------------------------------------------------------------------------------
    def stream_index(self, table: Dict, stream) -> int:
        if stream not in table:
            table[stream] = len(table)
        return table[stream]

    def copies(self, pairs) -> List[List[int]]:
        """Buffer pairs to copy; a pair whose two sides are one storage (an aliased input) needs none."""
        return [[x, y] for x, y in ((self.buf(a), self.buf(b)) for a, b in pairs) if x != y]

    def program(self, ops: Sequence[Op]) -> List[Dict]:
        prog = []
        for op in ops:
            a = op.attrs
            if op.opdef.view is not None:
                if op.opdef.copy and op not in self.elided:  # a copy of a view of the input: no kernel needed
                    x, y = op.inputs[0], op.outputs[0]
                    try:
                        src, dst = _view_desc(op, self.desc[x]), self.desc[y]
                    except ValueError:  # a reshape of a strided view: copy x, in C order, into y's bytes
                        src, dst = self.desc[x], _packed_desc(self.desc[y][0], x.shape, x.dtype)
                    prog.append(instructions.copy(self.buf_of_desc(src), self.buf_of_desc(dst)))
                continue
            if op.type == "host_load":
                prog.append(instructions.host_load(self.stream_index(self.h2d, a["stream"]), self.buf(op.outputs[0])))
            elif op.type == "host_store":
                prog.append(instructions.host_store(self.stream_index(self.d2h, a["stream"]), self.buf(op.inputs[0])))
            elif op.type in ("call", "repeat"):
                sub = a["graph"]
                sub_inputs, sub_outputs = sub.inputs, sub.outputs
                gin = [sub_inputs[i] for i in a["input_index"]]
                modified = [(sub_inputs[i], op.inputs[a["input_index"].index(i)]) for i in a["modified"]]
                copy_in = self.copies(zip(op.inputs, gin))
                if op.type == "call":
                    prog.append(instructions.call(self.graph_index[sub], copy_in,
                                                  self.copies(list(zip(sub_outputs, op.outputs)) + modified)))
                else:
                    n = len(sub_outputs)
                    prog.append(instructions.repeat(self.graph_index[sub], a["repeat_count"], copy_in,
                                                    self.copies(zip(sub_outputs, sub_inputs[:n])),
                                                    self.copies(list(zip(sub_inputs[:n], op.outputs)) + modified)))
            elif op.type == "if":
                n_then = len(a["then_index"])
                then, else_ = (instructions.branch(self.graph_index[sub],
                                                   self.copies(zip(parents, [sub.inputs[i] for i in index])),
                                                   self.copies(zip(sub.outputs, op.outputs)))
                               for sub, index, parents in ((a["then_graph"], a["then_index"], op.inputs[1:1 + n_then]),
                                                           (a["else_graph"], a["else_index"], op.inputs[1 + n_then:])))
                prog.append(instructions.if_(self.buf(op.inputs[0]), then, else_))
            elif op.opdef.control:
                raise NotImplementedError(f"lowering of control op {op.type!r} is not implemented")
            else:
                regions = [self.buf_of_desc(self.regions[v]) for v in a.values() if isinstance(v, RemoteBuffer)]
                inputs = [self.buf(t) for t in op.inputs] + regions
                attrs = {k: encode_attr(v.remote_buffer_id if isinstance(v, RemoteBuffer) else v) for k, v in a.items()}
                prog.append(instructions.op(op.type, op.name, inputs, [self.buf(t) for t in op.outputs], attrs,
                                            self._static_inputs(inputs)))
        return prog

    def run(self, progress: Optional[Callable[[str], None]] = None) -> Executable:
        step = progress or (lambda label: None)
        self.static_roots, self.static_ops = self.facts.static()
        self.place_permanent()
        for g in self.graphs:
            self.place_graph(g)
            step(f"memory plan: {g.id}")
        graphs = []
        static = {id(op) for op in self.static_ops}
        for g in self.graphs:
            graphs.append({"id": g.id, "program": self.program([op for op in g.schedule() if id(op) not in static])})
            step(f"program: {g.id}")
        static_graph = -1
        if self.static_ops:
            static_graph = len(graphs)
            graphs.append({"id": STATIC_GRAPH_ID, "program": self.program(self.static_ops)})
        constants, variables = [], []
        for g in self.graphs:
            for t in g.tensors:
                if isinstance(t, Constant):
                    data = np.ascontiguousarray(t._host_data_value).view(np.uint8).tobytes()
                    constants.append({"name": t.id, "buffer": self.buf(t), "data": data})
                elif isinstance(t, Variable) and t._remote_slot is None:
                    variables.append({"name": t.id, "buffer": self.buf(t)})
        # Device state after the variables (the Session indexes those first): remote buffer
        # regions, then shard tensors that mirror a remote slot.
        for rb, d in self.regions.items():
            variables.append({"name": f"<remote buffer {rb.remote_buffer_id}>", "buffer": self.buf_of_desc(d),
                              "remote_buffer": rb.remote_buffer_id})
        for t in self.ir.main_graph.tensors:
            if t._remote_slot is not None and not isinstance(t, Variable):
                variables.append({"name": t.id, "buffer": self.buf(t),
                                  "mirror_of": [t._remote_slot[0].remote_buffer_id, t._remote_slot[1]]})

        def streams(table):
            return [{"name": s.tensor_id, "shape": list(s.shape), "dtype": s.dtype.name}
                    for s, _ in sorted(table.items(), key=lambda kv: kv[1])]

        return Executable(arena_bytes=_align(self.arena), buffers=self.buffers, constants=constants,
                          variables=variables, h2d=streams(self.h2d), d2h=streams(self.d2h), graphs=graphs,
                          num_host_transfers=self.ir.num_host_transfers,
                          replication_factor=self.ir.instance_replication_factor, static_graph=static_graph,
                          op_attrs=instructions.op_attributes(graphs))


def lower(ir, progress: Optional[Callable[[str], None]] = None) -> Executable:
    """Compile ``ir`` into an Executable (deterministic for a given IR). ``progress(label)`` is
    called after each step of the work: two per graph (its memory plan, its program)."""
    return _Lowering(ir).run(progress)


def stream_order(exe: Executable) -> Tuple[List[str], List[str]]:
    """Names of the h2d and d2h streams in executable order."""
    return [s["name"] for s in exe.h2d], [s["name"] for s in exe.d2h]
