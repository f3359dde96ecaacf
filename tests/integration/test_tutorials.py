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
