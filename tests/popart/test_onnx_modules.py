"""The ONNX importer's modules import without a cycle: the families of entries import the table's
framework (popart.onnx.table) and each other acyclically, and only popart.onnx.ops imports them all.
Checked on the source (module-level imports between popart.onnx modules form no cycle) and by
importing each module first and alone in a fresh interpreter."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import popart.onnx

PACKAGE = Path(popart.onnx.__file__).parent
MODULES = sorted(f"popart.onnx.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _module_level_imports(path: Path) -> Set[str]:
    """The popart.onnx modules ``path`` imports when it is imported (not inside functions)."""
    found: Set[str] = set()
    for node in ast.parse(path.read_text()).body:  # top-level statements only
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "popart.onnx":  # from popart.onnx import control, ...
                found |= {f"popart.onnx.{a.name}" for a in node.names}
            elif node.module.startswith("popart.onnx."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("popart.onnx.")}
    return found & set(MODULES)


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One cycle of ``graph`` as a path that ends where it starts, or [] if it has none."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(m: str) -> List[str]:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_no_import_cycle_between_onnx_modules():
    graph = {m: _module_level_imports(PACKAGE / f"{m.rsplit('.', 1)[1]}.py") for m in MODULES}
    assert _cycle(graph) == [], f"import cycle: {' -> '.join(_cycle(graph))}"
    # The registry is the only module that imports every family; only the importer, the top of the
    # tree, imports it (a family never does: a control op reaches its subgraphs through Node.imp).
    importers_of_ops = sorted(m for m, deps in graph.items() if "popart.onnx.ops" in deps)
    assert importers_of_ops == ["popart.onnx.importer"], importers_of_ops


def test_cycle_check_finds_a_cycle():
    # The check itself: the old layout (ops.py importing its families, which imported ops.py).
    graph = {"ops": {"control", "table"}, "control": {"ops"}, "table": set()}
    assert _cycle(graph) == ["control", "ops", "control"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_each_onnx_module_imports_alone():
    # One fresh interpreter per module, all started at once; each imports its module first, then
    # the complete table, which must hold the entries of every family.
    script = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
              "from popart.onnx.ops import OPS; "
              "missing = [t for t in ('Add', 'MatMul', 'Conv', 'ReduceSum', 'Reshape', 'GatherND', 'RandomNormal', "
              "'Loop', 'LSTM', 'DFT', 'GridSample') if t not in OPS]; "
              "assert not missing, missing")
    runs = {m: subprocess.Popen([sys.executable, "-c", script, m], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for m in MODULES}
    failed = {}
    for m, proc in runs.items():
        out, _ = proc.communicate(timeout=300)
        if proc.returncode:
            failed[m] = out[-2000:]
    assert not failed, failed
