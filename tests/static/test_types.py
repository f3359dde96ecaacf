"""Type checkers see popxl's real signatures: mypy and pyright (configured in pyproject.toml, as a
user's program sees the package) accept the tutorials and tests/static/typed_program.py without a
single error, and report the errors of a program that misuses the API, so the check can fail."""
from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]

# line -> the error mypy must report there (a fragment of its message)
MISUSE = {
    "ops.gelu(3)": 'Argument 1 to "gelu" has incompatible type "int"; expected "Tensor"',
    'ops.softmax(x, axis="x")': 'Argument "axis" to "softmax" has incompatible type "str"; expected "int"',
    "ops.not_an_op(x)": 'Module has no attribute "not_an_op"',
    "ops.sum(x, axis=0.5)": 'Argument "axis" to "sum" has incompatible type "float"',
    "y: int = x + 1": 'expression has type "Tensor", variable has type "int"',
    "transforms.autodiff(g).no_such_attribute": '"GradGraphInfo" has no attribute "no_such_attribute"',
    "transforms.autodiff(g, return_all_grad_graphs=True).graph":
        '"dict[Graph, GradGraphInfo]" has no attribute "graph"',
    "ops.topk(x, 1, 0, True, True).shape": '"tuple[Tensor, Tensor]" has no attribute "shape"',
    "ops.collectives.replicated_all_reduce(x, group=2)": 'Argument "group" to "replicated_all_reduce" has '
                                                         'incompatible type "int"; expected "ReplicaGrouping | None"',
    "popxl.Session(ir, weights_to_host_on_exit=1.5)": 'incompatible type "float"; expected "bool"',
    "popxl.dtypes.float33": 'Module has no attribute "float33"',
    "popxl.float32.no_such_attribute": '"dtype" has no attribute "no_such_attribute"',
}


def _misuse_program() -> str:
    lines = "\n".join(f"    {line}" for line in MISUSE)
    return textwrap.dedent("""\
        import popxl
        import popxl.ops as ops
        from popxl import transforms

        ir = popxl.Ir()
        with ir.main_graph:
            x = popxl.variable([1.0, 2.0])
            g = ir.create_graph(lambda t: t, x)
        """) + lines + "\n"


def _errors_by_file(report: str) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {}
    for line in report.splitlines():
        m = re.match(r"^(.*?):(\d+): error: (.*)$", line)
        if m:
            found.setdefault(Path(m.group(1)).name, []).append(f"{m.group(2)}: {m.group(3)}")
    return found


@pytest.mark.slow  # one mypy run from a cold cache, about 20 s
def test_mypy_accepts_programs_and_finds_misuse(tmp_path):
    from mypy import api

    misuse = tmp_path / "misuse.py"
    misuse.write_text(_misuse_program())
    programs = _programs()
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--follow-imports", "silent",
                                      "--cache-dir",
                                      str(tmp_path / "cache"), "--no-error-summary", "--show-error-codes",
                                      *map(str, programs), str(misuse)])
    errors = _errors_by_file(stdout)
    assert not stderr, stderr
    # no false errors in correct programs
    assert set(errors) <= {"misuse.py"}, stdout
    # every misuse reported on its own line, and nothing else
    source = misuse.read_text().splitlines()
    reported = {int(e.split(":")[0]): e for e in errors.get("misuse.py", [])}
    for code, message in MISUSE.items():
        line = next(i for i, text in enumerate(source, 1) if text.strip() == code)
        assert line in reported, f"mypy missed {code!r}:\n{stdout}"
        assert message in reported.pop(line), stdout
    assert not reported, stdout
    assert status == 1


def _programs() -> List[Path]:
    return [ROOT / "tests" / "static" / "typed_program.py", *sorted((ROOT / "tutorials").glob("*.py"))]


@pytest.mark.slow  # pyright's node process, about 10 s
def test_pyright_accepts_programs_and_finds_misuse(tmp_path):
    misuse = tmp_path / "misuse.py"
    misuse.write_text(_misuse_program())
    run = subprocess.run([sys.executable, "-m", "pyright", "--outputjson", "-p", str(ROOT / "pyproject.toml"),
                          *map(str, _programs()), str(misuse)], capture_output=True, text=True, timeout=600)
    report = json.loads(run.stdout)
    errors: Dict[str, Dict[int, str]] = {}
    for d in report["generalDiagnostics"]:
        if d["severity"] == "error":
            errors.setdefault(Path(d["file"]).name, {})[d["range"]["start"]["line"] + 1] = d["message"]
    assert set(errors) <= {"misuse.py"}, errors  # no false errors in correct programs
    source = misuse.read_text().splitlines()
    reported = errors.get("misuse.py", {})
    for code in MISUSE:
        line = next(i for i, text in enumerate(source, 1) if text.strip() == code)
        assert line in reported, f"pyright missed {code!r}: {errors}"
        reported.pop(line)
    assert not reported, reported
    assert report["summary"]["filesAnalyzed"] == len(_programs()) + 1


def test_typed_program_runs():
    """The sample program is a real program, not only something that type-checks."""
    namespace = runpy.run_path(str(ROOT / "tests" / "static" / "typed_program.py"))
    weights, loss = namespace["train_step"]()
    assert weights.shape == (4, 3) and 0.0 < loss < 1.0


def test_package_is_marked_typed():
    import popxl
    assert (Path(popxl.__file__).parent / "py.typed").is_file()
