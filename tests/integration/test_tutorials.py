"""The tutorials run and learn (reduced size here; the full run is marked slow)."""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tutorials"))

import digits_softmax_regression as digits  # noqa: E402


def test_digits_softmax_regression_learns():
    result = digits.train(epochs=2, batch=32, steps_per_run=5)
    losses = np.array(result["losses"])
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    assert result["accuracy"] > 0.85


@pytest.mark.slow
def test_digits_tutorial_script_full_run():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tutorials", "digits_softmax_regression.py")],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    accuracy = float(out.strip().splitlines()[-1].split(":")[1].strip().rstrip("%")) / 100
    assert accuracy >= 0.95, out


import digits_mlp  # noqa: E402
import digits_mlp_adam  # noqa: E402


def _learns(result, max_ratio=0.5):
    losses = np.array(result["losses"])
    k = max(1, len(losses) // 10)
    assert np.mean(losses[-k:]) < max_ratio * np.mean(losses[:k]), (losses[:k], losses[-k:])


def test_digits_mlp_learns_with_autodiff():
    result = digits_mlp.train(epochs=2, steps_per_run=5)
    _learns(result)
    assert result["accuracy"] > 0.85


def test_digits_mlp_adam_module_learns():
    result = digits_mlp.train(epochs=2, steps_per_run=5, optimizer=digits_mlp_adam.Adam(1e-2, weight_decay=1e-4))
    _learns(result)
    assert result["accuracy"] > 0.85


def test_gradient_accumulation_matches_the_larger_batch():
    """4 micro-batches of 8 averaged = one batch of 32 over the same examples: same trajectory."""
    big = digits_mlp.train(epochs=1, batch=32, steps_per_run=5)
    acc = digits_mlp.train(epochs=1, batch=8, steps_per_run=5, accumulate=4)
    micro_means = np.array(acc["losses"]).reshape(-1, 4).mean(axis=1)
    np.testing.assert_allclose(micro_means, big["losses"], rtol=1e-4, atol=1e-5)
    assert abs(acc["accuracy"] - big["accuracy"]) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("script", ["digits_mlp.py", "digits_mlp_adam.py", "digits_mlp_accumulate.py"])
def test_mlp_tutorial_scripts_full_run(script):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tutorials", script)],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    accuracy = float(out.strip().splitlines()[-1].split(":")[1].strip().rstrip("%")) / 100
    assert accuracy >= 0.90, out


# The notebooks (current and running in a Jupyter kernel): tests/tutorials/test_notebooks.py
