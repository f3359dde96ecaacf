"""The transform pipeline: every rewrite a Session applies to its Ir before compiling, in order,
with the condition each runs under. ``popxl.Session`` applies `PIPELINE`; popart's sessions build
a popxl Ir and hand it to ``popxl.Session``, so this is the one list for both.

``print(popxl.transforms.PIPELINE)`` lists the passes; after a Session is made,
``print(session.transforms_applied)`` shows what each did to that program (ops before and after,
by type) and which were skipped because their condition did not hold.

Some passes run only on graphs marked for them (`mark`): popart's ``InferenceSession`` marks its
step graph `INFERENCE`, so its convolutions are fused (batch norms folded into the weights: fewer
ops, a different rounding) and the computations on weights alone leave its ``batchesPerStep``
loop. A popxl program is rewritten only where the results stay as traced (``fuse_matmul`` and
friends fuse only values nothing else reads).
"""
from __future__ import annotations

import textwrap
import time
from collections import Counter
from itertools import chain
from operator import attrgetter
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from popxl.graph import Graph, op_called_graphs
from popxl.ops.call import bind_site_input
from popxl.tensor import Variable
from popxl.transforms.expand import expand_ops
from popxl.transforms.fragments import order_weight_fragments
from popxl.transforms.fuse_attention import fuse_attention
from popxl.transforms.fuse_conv import fuse_conv
from popxl.transforms.fuse_decomposed import fuse_decomposed
from popxl.transforms.fuse_matmul import fuse_matmul
from popxl.transforms.hoist import hoist_invariants

__all__ = ["PIPELINE", "Pipeline", "Pass", "PassRecord", "PipelineRecord", "INFERENCE", "mark", "is_marked"]

INFERENCE = "inference"
"""The mark of a graph that is only ever run for inference, as the body of a loop over batches
(popart's ``InferenceSession`` step graph): its convolutions are fused and the computations on
weights alone are hoisted out of the loop that repeats it."""


def mark(graph: Graph, name: str) -> Graph:
    """Mark ``graph`` for the pipeline's passes that run on graphs marked ``name`` (`INFERENCE`).

    Args:
        graph: A graph of an Ir not yet given to a Session.
        name: The mark.

    Returns:
        ``graph``.
    """
    graph.ir._check_mutable()
    graph._marks.add(name)
    return graph


def is_marked(graph: Graph, name: str) -> bool:
    """Whether ``graph`` carries the mark ``name`` (see `mark`).

    Args:
        graph: A graph.
        name: The mark.

    Returns:
        True if it carries it.
    """
    return name in graph._marks


def _hoist_loop_invariants(ir: Any, graphs: Optional[Sequence[Graph]]) -> None:
    """``hoist_invariants`` for each graph that one ``repeat`` runs: the body inputs it binds to
    variables (not loop-carried, each variable bound once) are the invariant values; the hoisted
    ops run just before the repeat, their results passed to the body by reference."""
    graphs = list(graphs or [])  # (the graphs marked: None only for a pass run on every program)
    sites: Dict[int, List[Tuple[Graph, Any]]] = {id(g): [] for g in graphs}
    for parent in ir._all_graphs():
        for op in parent.schedule():
            for called in op_called_graphs(op):
                if id(called) in sites:
                    sites[id(called)].append((parent, op))
    for body in graphs:
        if len(sites[id(body)]) != 1 or sites[id(body)][0][1].type != "repeat":
            continue
        parent, site = sites[id(body)][0]
        carried = len(body.outputs)  # output i feeds input i of the next iteration
        bindings = [(body.inputs[i], t) for i, t in zip(site.attrs["input_index"], site.inputs)]
        uses = Counter(id(t) for _, t in bindings)
        bound = {b: t for b, t in bindings
                 if isinstance(t, Variable) and body.inputs.index(b) >= carried and uses[id(t)] == 1}

        def bind(t: Any, name: str, body: Graph = body, site: Any = site) -> Any:
            new = body.add_input(t.spec, name, by_ref=True)
            bind_site_input(site, new, t)
            return new
        hoist_invariants(body, parent, bound, bind, before=site)


class Pass:
    """One pass of the pipeline: a named transform and the condition it runs under.

    Args:
        name: The transform's name (its function in ``popxl.transforms``).
        does: What it does, in a line.
        run: ``run(ir, graphs)`` applies it; ``graphs`` are the graphs marked ``mark`` (None for
            a pass that runs on every program).
        mark: Run only when some graph carries this mark (see `mark`); None: always.
        scope: The condition in words; default from ``mark``.
    """

    def __init__(self, name: str, does: str, run: Callable[[Any, Optional[List[Graph]]], Any],
                 mark: Optional[str] = None, scope: Optional[str] = None) -> None:
        self.name, self.does, self.mark = name, does, mark
        self._run = run
        self.scope = scope or ("every program" if mark is None else f"graphs marked {mark!r}")

    def targets(self, ir: Any) -> Optional[List[Graph]]:
        """The marked graphs this pass rewrites in ``ir``.

        Args:
            ir: The program.

        Returns:
            The graphs marked ``mark`` (empty: the pass is skipped), or None for a pass without a
            mark, which rewrites the whole program.
        """
        if self.mark is None:
            return None
        return [g for g in ir._all_graphs() if self.mark in g._marks]

    def apply(self, ir: Any, targets: Optional[List[Graph]] = None) -> None:
        """Apply the pass, in place.

        Args:
            ir: The program.
            targets: The marked graphs it rewrites (``targets(ir)``), for a pass with a mark.
        """
        self._run(ir, targets)

    def __repr__(self) -> str:
        return f"Pass({self.name!r}, {self.scope})"


_TYPE = attrgetter("opdef.name")


def _op_types(ir: Any) -> Counter:
    return Counter(map(_TYPE, chain.from_iterable(g._ops for g in ir._all_graphs())))


class PassRecord:
    """What one pass did to one program: whether it ran, the op count before and after, the
    change per op type (``{"matmul_bias": +3, "matmul": -3, "add": -3}``) and its time.

    Args:
        name: The pass.
        scope: Its condition, in words.
        ran: Whether it ran (its condition held).
        before: The program's ops by type before the pass.
        after: The same after it.
        seconds: How long it took.
    """

    def __init__(self, name: str, scope: str, ran: bool, before: Counter, after: Counter, seconds: float) -> None:
        self.name, self.scope, self.ran, self.seconds = name, scope, ran, seconds
        self.ops_before = sum(before.values())
        self.ops_after = sum(after.values())
        self.changes: Dict[str, int] = {t: after[t] - before[t] for t in sorted(set(before) | set(after))
                                        if after[t] != before[t]}

    @property
    def changed(self) -> bool:
        """Whether the pass changed the op types or counts (a pass that rewrites attributes alone,
        such as ``fuse_conv``'s channels-last layouts, or reorders ops, shows no change here)."""
        return bool(self.changes)

    def __str__(self) -> str:
        if not self.ran:
            return f"{self.name}: skipped (runs on {self.scope}; none here)"
        delta = ", ".join(f"{n:+d} {t}" for t, n in sorted(self.changes.items(), key=lambda tn: (tn[1] > 0, tn[0])))
        return (f"{self.name}: {self.ops_before} -> {self.ops_after} ops" + (f" ({delta})" if delta else "")
                + f", {self.seconds * 1e3:.1f} ms")

    def __repr__(self) -> str:
        return f"PassRecord({str(self)!r})"


class PipelineRecord(Sequence[PassRecord]):
    """What the pipeline did to one program: one `PassRecord` per pass, in order (also by name:
    ``record["fuse_matmul"]``); ``str()`` lists them.

    Args:
        records: The records, in pipeline order.
    """

    def __init__(self, records: List[PassRecord]) -> None:
        self._records = records

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            for r in self._records:
                if r.name == key:
                    return r
            raise KeyError(f"no pass {key!r} in the pipeline; its passes: {[r.name for r in self._records]}")
        return self._records[key]

    def __len__(self) -> int:
        return len(self._records)

    @property
    def ran(self) -> List[str]:
        """The names of the passes that ran (their condition held), in order."""
        return [r.name for r in self._records if r.ran]

    def __str__(self) -> str:
        if not self._records:
            return "no transforms applied"
        first, last = self._records[0].ops_before, self._records[-1].ops_after
        return "\n".join([f"transforms applied ({first} -> {last} ops):"] + [f"  {r}" for r in self._records])

    def __repr__(self) -> str:
        return f"PipelineRecord(ran={self.ran})"


class Pipeline(Sequence[Pass]):
    """An ordered list of passes; ``apply(ir)`` runs each whose condition holds, in order.

    Args:
        passes: The passes, in the order they run.
    """

    def __init__(self, passes: Sequence[Pass]) -> None:
        self._passes = tuple(passes)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            for p in self._passes:
                if p.name == key:
                    return p
            raise KeyError(f"no pass {key!r} in the pipeline; its passes: {self.names()}")
        return self._passes[key]

    def __len__(self) -> int:
        return len(self._passes)

    def __iter__(self) -> Iterator[Pass]:
        return iter(self._passes)

    def names(self) -> List[str]:
        """The passes' names, in order."""
        return [p.name for p in self._passes]

    def apply(self, ir: Any) -> PipelineRecord:
        """Apply every pass whose condition holds to ``ir``, in order, in place.

        Args:
            ir: The program.

        Returns:
            What each pass did (`PipelineRecord`).
        """
        records = []
        before = _op_types(ir)
        for p in self._passes:
            targets = p.targets(ir)
            if targets is not None and not targets:
                records.append(PassRecord(p.name, p.scope, False, before, before, 0.0))
                continue
            start = time.perf_counter()
            p.apply(ir, targets)
            seconds = time.perf_counter() - start
            after = _op_types(ir)
            records.append(PassRecord(p.name, p.scope, True, before, after, seconds))
            before = after
        return PipelineRecord(records)

    def describe(self) -> str:
        """The passes, in order, with the condition each runs under and what it does."""
        width = max(len(p.name) for p in self._passes)
        lines = ["Transform pipeline (popxl.transforms.PIPELINE), applied in this order to the Ir of every",
                 "popxl.Session (popart's sessions included) before it is compiled:"]
        for k, p in enumerate(self._passes, 1):
            lines.append(f"  {k}. {p.name:<{width}}  on {p.scope}")
            lines += textwrap.wrap(p.does, 96, initial_indent=" " * 7, subsequent_indent=" " * 7)
        return "\n".join(lines)

    __str__ = describe

    def __repr__(self) -> str:
        return f"Pipeline({self.names()})"


PIPELINE = Pipeline([
    Pass("expand_ops", "ops declared with OpDef.expand (popxl-addons' replica-spanning custom ops) become "
         "the ops they run as", lambda ir, _: expand_ops(ir)),
    Pass("order_weight_fragments", "the main graph's weight-fragment ops run first (from host) and last "
         "(to host)", lambda ir, _: order_weight_fragments(ir)),
    Pass("fuse_conv", "batch norms folded into convolutions; bias, relu / clip, residual add and max pool "
         "fused into conv_fused; channels-last values between convolutions and pools",
         lambda ir, graphs: [fuse_conv(g) for g in graphs or []], mark=INFERENCE),
    Pass("hoist_invariants", "computations on weights alone (the folded batch norms) leave the loop and "
         "run before it (lowering makes them the static program)", _hoist_loop_invariants, mark=INFERENCE,
         scope=f"the repeat loops of graphs marked {INFERENCE!r}"),
    Pass("fuse_decomposed", "layer norms and erf GELUs written out as ops become layer_norm and geluerf",
         lambda ir, _: fuse_decomposed(ir)),
    Pass("fuse_attention", "softmax(q @ k^T * c + mask) @ v becomes one attention op",
         lambda ir, _: fuse_attention(ir)),
    Pass("fuse_matmul", "x @ W + b becomes matmul_bias (with a residual add: matmul_bias_add); SGD updates "
         "of matmul gradients are done by their GEMM (matmul_update_)", lambda ir, _: fuse_matmul(ir)),
])
"""The pipeline every ``popxl.Session`` applies (``print(PIPELINE)`` lists it)."""
