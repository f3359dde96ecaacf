"""A/B: two revisions of popxl-cpu benchmarked against each other, interleaved, in one run.

    python benchmarks/ab.py BASE [NEW] [--only mlp_small,compile] [--rounds 5] [--frameworks popxl,torch]
    python benchmarks/ab.py . --base-env POPXL_BLAS=openblas --only bert_train   # a setting, one build

BASE and NEW are git revisions of this repository (NEW defaults to the checkout this script is run
from, uncommitted changes included, with the interpreter running it; "." names that checkout as
BASE too, to compare environment settings given with --base-env / --new-env). Each other revision is built
once: a git worktree and a virtual environment with the project installed, kept in
``$POPXL_AB_CACHE`` (default ``~/.cache/popxl-ab``) under the commit's hash for later runs. Its
third-party packages (NumPy, the peers) are the running interpreter's: install ``.[bench]`` there.

The rounds alternate which side goes first; each round runs ``benchmarks/run.py`` of each side in a
process of its own. The table gives, per row, the median over the rounds of each side's value, how
much faster NEW is (NEW / BASE, inverted for rows where lower is better: > 1 means NEW is faster),
and for each peer framework measured (``--frameworks``) the ratio of ratios: (popxl/peer in NEW) /
(popxl/peer in BASE), which cancels most of what the machine's load does to both. The spread is
half the min-max range of a side's values over its rounds.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("POPXL_AB_CACHE", Path.home() / ".cache" / "popxl-ab"))

# (workload, case, framework label) -> value, and whether lower is better for the row
Values = Dict[Tuple[str, str, str], float]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def prepare(rev: str) -> Tuple[str, Path]:
    """(python, checkout) running revision ``rev``: built once, then reused from the cache."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree, env = CACHE / "worktrees" / sha[:12], CACHE / "venvs" / sha[:12]
    python = env / "bin" / "python"
    if not (tree / "pyproject.toml").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", str(tree), sha)
    if not (env / ".built").exists():
        print(f"[ab] building {rev} ({sha[:12]}) into {env}: once, a few minutes", file=sys.stderr, flush=True)
        venv.create(env, with_pip=True)
        # The project with its runtime dependencies, in the venv itself (the engine finds oneDNN,
        # OpenBLAS and MPI beside its own site-packages); then the peers (torch, jax, onnxruntime) come
        # from this interpreter's site-packages (a .pth line puts them after the venv's own), so both
        # sides measure against the same peer builds and nothing gigabytes-large is downloaded again.
        # Editable, as this checkout is installed: run.py puts the revision's tree first on sys.path,
        # and the editable install maps the native extension built for that tree.
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        peers = Path(site, "_popxl_ab_peers.pth")
        peers.unlink(missing_ok=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(tree)], check=True)
        ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
        peers.write_text("".join(f"{p}\n" for p in sorted(ours)))
        (env / ".built").write_text(sha)
    return str(python), tree


_CELL = re.compile(r"^([0-9][0-9,]*\.?[0-9]*(?:e[-+]?\d+)?)")


def parse_table(text: str) -> Tuple[Values, Dict[Tuple[str, str], bool]]:
    """The values of run.py's markdown table (``| workload | case | unit | popxl | PyTorch ... |``)."""
    values: Values = {}
    lower: Dict[Tuple[str, str], bool] = {}
    head: Optional[List[str]] = None
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:3] == ["workload", "case", "unit"]:
            head = cells
            continue
        if head is None or set(line) <= set("|-"):
            continue
        workload, case, unit = cells[:3]
        lower[(workload, case)] = unit in ("s", "ms", "µs", "us") or unit.startswith(("s/", "ms/", "µs/", "us/"))
        for label, cell in zip(head[3:], cells[3:]):
            m = _CELL.match(cell)
            if m and not label.startswith("popxl/"):
                values[(workload, case, label)] = float(m.group(1).replace(",", ""))
    return values, lower


def run_side(python: str, tree: Path, env: Dict[str, str],
             args: argparse.Namespace) -> Tuple[Values, Dict[Tuple[str, str], bool]]:
    cmd = [python, str(tree / "benchmarks" / "run.py"), "--only", args.only, "--frameworks", args.frameworks,
           "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env={**os.environ, **env})
    if out.returncode not in (0, 1):  # 1: a correctness gate, reported in the table's notes
        raise SystemExit(f"[ab] {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return parse_table(out.stdout)


def _median_spread(xs: List[float]) -> Tuple[float, float]:
    med = statistics.median(xs)
    return med, (max(xs) - min(xs)) / 2 / med if med else 0.0


def report(base: List[Values], new: List[Values], lower: Dict[Tuple[str, str], bool]) -> str:
    keys = sorted({k for side in (base, new) for run in side for k in run})
    rows = sorted({(w, c) for w, c, _ in keys})
    labels = sorted({f for _, _, f in keys}, key=lambda f: (not f.startswith("popxl"), f))
    peers = [f for f in labels if not f.startswith("popxl")]
    head = ["workload", "case", "BASE popxl", "NEW popxl", "NEW/BASE", *[f"ratio of ratios vs {p}" for p in peers]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, c in rows:
        pk = (w, c, "popxl")
        b = [run[pk] for run in base if pk in run]
        n = [run[pk] for run in new if pk in run]
        if not b or not n:  # a side that measured nothing (its run.py printed why in its table)
            lines.append("| " + " | ".join([w, c, "n/a" if not b else f"{statistics.median(b):.4g}",
                                            "n/a" if not n else f"{statistics.median(n):.4g}", "", *[""] * len(peers)])
                         + " |")
            continue
        (bm, bs), (nm, ns) = _median_spread(b), _median_spread(n)
        speed = bm / nm if lower.get((w, c)) else nm / bm
        cells = [w, c, f"{bm:.4g} ±{bs * 100:.0f}%", f"{nm:.4g} ±{ns * 100:.0f}%", f"{speed:.3f}x"]
        for p in peers:
            qk = (w, c, p)

            def ratios(side: List[Values]) -> List[float]:
                rs = [run[pk] / run[qk] for run in side if pk in run and qk in run and run[qk]]
                return [1 / r for r in rs] if lower.get((w, c)) else rs
            rb, rn = ratios(base), ratios(new)
            cells.append(f"{statistics.median(rn) / statistics.median(rb):.3f}x" if rb and rn else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the git revision to compare against ('.': this checkout as it is)")
    parser.add_argument("new", nargs="?", default=None, help="the other revision (default: this checkout as it is)")
    parser.add_argument("--only", default="mlp_small,mlp_big,gpt_block,overhead,compile",
                        help="run.py's --only (comma-separated workloads)")
    parser.add_argument("--frameworks", default="popxl", help="run.py's --frameworks (popxl and peers)")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each side, alternating (default 5)")
    parser.add_argument("--repeats", type=int, default=3, help="run.py's --repeats within each run")
    parser.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for BASE's runs (repeatable)")
    parser.add_argument("--new-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for NEW's runs (repeatable)")
    args = parser.parse_args(argv)

    def side(rev: Optional[str], env: List[str]) -> Tuple[str, Path, Dict[str, str]]:
        bad = [e for e in env if "=" not in e]
        if bad:
            parser.error(f"expected NAME=VALUE, got {bad[0]!r}")
        python, tree = prepare(rev) if rev not in (None, ".") else (sys.executable, REPO)
        return python, tree, dict(e.split("=", 1) for e in env)
    sides = {"BASE": side(args.base, args.base_env), "NEW": side(args.new, args.new_env)}
    results: Dict[str, List[Values]] = {"BASE": [], "NEW": []}
    lower: Dict[Tuple[str, str], bool] = {}
    for r in range(args.rounds):
        order = ["BASE", "NEW"] if r % 2 == 0 else ["NEW", "BASE"]
        for side in order:
            print(f"[ab] round {r + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
            values, low = run_side(*sides[side], args)
            results[side].append(values)
            lower.update(low)
    def name(rev: Optional[str], env: List[str]) -> str:
        return ("this checkout" if rev in (None, ".") else rev) + "".join(f" {e}" for e in env)
    print(f"A/B: BASE {name(args.base, args.base_env)}, NEW {name(args.new, args.new_env)}; {args.rounds} "
          f"interleaved rounds of "
          f"benchmarks/run.py --only {args.only} --frameworks {args.frameworks} --repeats {args.repeats}; "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n")
    print(report(results["BASE"], results["NEW"], lower))
    return 0


if __name__ == "__main__":
    sys.exit(main())
