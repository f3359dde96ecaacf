"""The README's and the user guide's code runs as written, so the documentation cannot rot.

Every fenced ``python`` block of ``README.md`` and ``docs/**/*.md`` (the guide; not the design notes
of ``docs/architecture.md``) runs as a program of its own, in a temporary directory; every command
of a ``bash`` block runs in a shell from the repository's root, with this environment's ``bin/``
first on the PATH (so ``python`` and ``poprun`` are this install's), and must leave no new file in
the repository. A block whose first line is a ``# not run: <why>`` comment is only shown (installs,
the test suite itself, long benchmarks). Other fences are not code: plain text (no language, or
``text``) and MyST directives (``{toctree}``, ``{include}``); any other language is refused, so a
block cannot escape the test by its spelling.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "architecture.md")]
FENCE = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.M | re.S)
NOT_RUN = "# not run:"
TIMEOUT = 300


class Block(NamedTuple):
    page: Path
    line: int
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> List[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        lang = m.group(2).strip()
        if lang in ("", "text") or lang.startswith("{"):
            continue
        assert lang in ("python", "bash"), (f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: "
                                            f"a ```{lang} block: use python or bash (run by this test) or text")
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, lang, textwrap.dedent(m.group(3))))
    return found


ALL = [b for page in PAGES for b in blocks(page)]
RUN = [b for b in ALL if not b.code.lstrip().startswith(NOT_RUN)]


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["POPXL_PROGRESS"] = "0"
    env.pop("POPXL_ENGINE", None)  # as a reader runs them: the default engine
    for k in [k for k in env if k.startswith(("POPDIST_", "POPRUN_", "PMI_"))]:
        del env[k]  # a launch of our own, not the one this test may run in
    env.setdefault("OMP_NUM_THREADS", "1")  # up to 4 processes on CI's 2 cores
    return env


def commands(code: str) -> List[str]:
    """The command lines of a bash block: comments and blank lines left out, `\\` continuations joined."""
    out, pending = [], ""
    for line in code.splitlines():
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _files() -> set:
    """The repository's files outside ignored build folders: a command must not add any."""
    skip = {".git", "build", ".pytest_cache", ".hypothesis", ".mypy_cache", "__pycache__"}
    found = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
        found.update(os.path.join(dirpath, f) for f in filenames if not f.endswith((".so", ".pyc")))
    return found


def test_the_pages_have_code_and_say_why_a_block_is_not_run():
    assert {b.page.name for b in RUN} >= {"README.md", "tour.md", "popart.md", "instances.md"}
    shown = [b for b in ALL if b not in RUN]
    for b in shown:
        reason = b.code.lstrip()[len(NOT_RUN):].splitlines()[0].strip()
        assert reason, f"{b.id}: '# not run:' needs a reason"
    assert len(shown) <= len(RUN) // 2, f"keep blocks that are not run rare: {[b.id for b in shown]}"


def test_the_readme_poprun_examples_name_a_file_of_the_repository():
    """The README's poprun lines run a program that exists (issue 39), and they are run below."""
    readme = [c for b in RUN if b.page.name == "README.md" and b.lang == "bash" for c in commands(b.code)]
    launches = [c for c in readme if c.startswith("poprun ")]
    assert launches, "the README shows no poprun command"
    for c in launches:
        program = c.split(" python ", 1)[1].split()[0]
        assert (ROOT / program).is_file(), f"{c!r} runs {program}, which is not in the repository"


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_code_block_runs(block: Block, tmp_path):
    env = _env()
    if block.lang == "python":
        program = tmp_path / "block.py"
        program.write_text(block.code)
        done = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
        assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return
    before = _files()
    for command in commands(block.code):
        done = subprocess.run(command, shell=True, executable="/bin/bash", cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT)
        assert done.returncode == 0, f"{block.id}: `{command}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    added = sorted(os.path.relpath(f, ROOT) for f in _files() - before)
    assert not added, f"{block.id} left files in the repository: {added}"
