"""The programs of examples/ run and check their own results (each compares with NumPy or asserts
that training worked), from a directory they leave as they found it; and so does the graph
exploration tutorial, which once left mlp.svg and mlp.onnx in the current directory."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def run(args, cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "POPRUN_", "PMI_"))}
    env.update(POPXL_PROGRESS="0", OMP_NUM_THREADS="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_example_is_listed_and_tested():
    listed = (ROOT / "examples" / "README.md").read_text()
    assert [p.name for p in EXAMPLES] == ["popart_inference_onnx.py", "popart_training.py", "poprun_data_parallel.py"]
    for p in EXAMPLES:
        assert f"examples/{p.name}" in listed


def test_popart_inference_from_an_onnx_file(tmp_path):
    out = run([sys.executable, str(ROOT / "examples" / "popart_inference_onnx.py")], tmp_path)
    assert "equal to NumPy's" in out and not list(tmp_path.iterdir())


def test_popart_inference_of_a_given_model(tmp_path):
    """``--model``: any model file, its inputs made up from its declared types and shapes."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import popart_inference_onnx as example
    finally:
        sys.path.pop(0)
    path = tmp_path / "given.onnx"
    example.write_mlp(str(path), seed=3)
    out = run([sys.executable, str(ROOT / "examples" / "popart_inference_onnx.py"), "--model", str(path)], tmp_path)
    assert out.startswith("probs: float32 [4, 3], mean 0.3333")  # softmax rows sum to 1 over 3 classes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given.onnx"]
    # the made-up inputs follow the declared types and shapes
    inputs = example.random_inputs(str(path))
    assert {k: (v.dtype, v.shape) for k, v in inputs.items()} == {"x": (np.float32, (4, 8))}
    assert [o.name for o in onnx.load(str(path)).graph.output] == ["probs"]


def test_popart_training(tmp_path):
    out = run([sys.executable, str(ROOT / "examples" / "popart_training.py")], tmp_path)
    losses = [float(v) for v in out.splitlines()[0].split(":")[1].split()]
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0]
    assert float(out.splitlines()[1].split()[-1].rstrip("%")) > 80


@pytest.mark.parametrize("instances,replicas", [(None, None), (2, 2), (2, 4)])
def test_poprun_data_parallel(tmp_path, instances, replicas):
    program = [sys.executable, str(ROOT / "examples" / "poprun_data_parallel.py")]
    if instances is None:
        out = run(program, tmp_path)
    else:
        poprun = shutil.which("poprun", path=str(Path(sys.executable).parent))
        assert poprun, "the install did not provide the poprun console script"
        out = run([poprun, "--num-instances", str(instances), "--num-replicas", str(replicas), *program], tmp_path)
    n, r = instances or 1, replicas or 1
    assert out.count("weights equal NumPy's") == 1  # printed by instance 0 alone; every instance checked
    assert f"{n} instance(s), {r} replica(s): loss 1.386 -> " in out
    assert not list(tmp_path.iterdir())


def test_exploring_graphs_writes_into_a_temp_dir_or_out(tmp_path):
    script = str(ROOT / "tutorials" / "exploring_graphs.py")
    out = run([sys.executable, script], tmp_path)
    assert not list(tmp_path.iterdir()), "the tutorial wrote into the current directory"
    written = Path(out.strip().splitlines()[-1].split(" in ", 1)[1])
    try:
        assert sorted(p.name for p in written.iterdir()) == ["mlp.onnx", "mlp.svg"]
        onnx.checker.check_model(onnx.load(str(written / "mlp.onnx")))
    finally:
        shutil.rmtree(written)
    run([sys.executable, script, "--out", "pictures"], tmp_path)
    assert sorted(p.name for p in (tmp_path / "pictures").iterdir()) == ["mlp.onnx", "mlp.svg"]


def test_the_main_job_without_scikit_learn_says_which_extra_to_install(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tutorials"))
    import digits_mlp
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"scikit-learn, which is not installed: pip install -e '\.\[tutorials\]'"):
        digits_mlp.load_digits_split()
