"""What the committed text says about the repository holds: the files the README, the guide and
the benchmarks' README name exist, the pages link to pages that exist, and no committed text file
carries a path of the machine it was made on (a picture's tooltips once did)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "examples" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]
# `popxl/ops/call.py`, `tests/engines/` ...: a path of this repository, written as code
REPO_PATH = re.compile(r"`((?:popxl|popart|popdist|tests|tutorials|examples|benchmarks|native|docs)/[\w./-]*)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|root|Users)/")


def _committed_text_files():
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for name in names.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file():
            data = path.read_bytes()
            if b"\0" not in data[:8192]:
                yield name, data.decode("utf-8", "replace")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_named_files_and_links_exist(page: Path):
    text = page.read_text()
    missing = [p for p in REPO_PATH.findall(text) if not (ROOT / p.rstrip("/")).exists()]
    assert not missing, f"{page.relative_to(ROOT)} names files that are not in the repository: {missing}"
    links = [t for t in LINK.findall(text) if "://" not in t]
    broken = [t for t in links if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def test_no_committed_text_file_carries_a_machine_path():
    found = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for name, text in _committed_text_files() for m in MACHINE_PATH.finditer(text)]
    assert not found, "absolute paths of a machine in committed files:\n" + "\n".join(found[:20])


def test_the_machine_path_pattern_finds_them():
    root = "/"  # joined here, so that this file does not hold what the test above looks for
    assert MACHINE_PATH.search(f"<title>at {root}work/wt/x/tutorials/a.py:3</title>")
    assert MACHINE_PATH.search(f"see {root}home/me/prog.py") and MACHINE_PATH.search(f"({root}tmp/abc)")
    assert not MACHINE_PATH.search(f"docs{root}guide{root}work{root}x") and not MACHINE_PATH.search(f"https:{root}/x.org/home/")
