"""SessionOptions.enableStochasticRounding: float16 results are rounded up or down at random,
with the probability that makes the expectation exact."""
from __future__ import annotations

import numpy as np

import popart

N = 4096


def _add_session(stochastic: bool, value: float, bps: int = 2) -> popart.InferenceSession:
    b = popart.Builder()
    x = b.addInputTensor("FLOAT16", [N], "x")
    y = b.aiOnnx.add([x, b.aiOnnx.constant(np.float16(2.0 ** -12))])
    opts = popart.SessionOptions()
    opts.enableStochasticRounding = stochastic
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(bps, [y]), popart.DeviceManager().createCpuDevice(),
                                userOptions=opts)
    s.setRandomSeed(7)
    s.prepareDevice()
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.full((bps, N), value, np.float16)}, out))
    s._y = y
    return s, out[y]


def test_forward_results_round_stochastically_and_unbiased():
    ulp = 2.0 ** -10
    for value in (1.0, -1.0):
        _, nearest = _add_session(False, value)
        np.testing.assert_array_equal(nearest, np.float16(value + 2.0 ** -12))  # round to nearest: one value
        _, got = _add_session(True, value)
        exact = value + 2.0 ** -12
        near = np.float16(exact)
        lo = near if float(near) <= exact else np.nextafter(near, np.float16(-np.inf))
        hi = np.nextafter(lo, np.float16(np.inf))
        assert set(np.unique(got)) <= {lo, hi}
        p_hi = np.mean(got == hi)
        want = (exact - float(lo)) / (float(hi) - float(lo))
        assert abs(p_hi - want) < 0.03, (value, p_hi, want)
        assert abs(got.astype(np.float64).mean() - exact) < 0.05 * ulp
        assert not np.array_equal(got[0], got[1])  # every batch draws new random numbers


def test_stochastic_rounding_is_seeded():
    _, a = _add_session(True, 1.0)
    _, b = _add_session(True, 1.0)
    np.testing.assert_array_equal(a, b)


def _f16_training(stochastic: bool, steps: int = 64) -> np.ndarray:
    """w (float16, ones) -= 1 * x with x = 2**-13: a quarter of float16's spacing below 1."""
    b = popart.Builder()
    x = b.addInputTensor("FLOAT16", [256], "x")
    w = b.addInitializedInputTensor(np.ones(256, np.float16), "w")
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([x, w])], popart.ReductionType.Sum)
    opts = popart.SessionOptions()
    opts.enableStochasticRounding = stochastic
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(steps, [loss]), loss, popart.ConstSGD(1.0),
                               popart.DeviceManager().createCpuDevice(), userOptions=opts)
    s.setRandomSeed(1)
    s.prepareDevice()
    s.weightsFromHost()
    s.run(popart.PyStepIO({x: np.full((steps, 256), 2.0 ** -13, np.float16)}, s.initAnchorArrays()))
    s.weightsToHost()
    out = {w: np.zeros(256, np.float16)}
    s.readWeights(popart.PyWeightsIO(out))
    return out[w]


def test_float16_weight_updates_keep_small_steps_on_average():
    np.testing.assert_array_equal(_f16_training(False), 1.0)  # round to nearest loses every step
    got = _f16_training(True)
    assert abs(got.astype(np.float64).mean() - (1 - 64 * 2.0 ** -13)) < 0.002
    assert len(np.unique(got)) > 1


def test_stochastic_rounding_sets_deterministic_workers_unless_overridden():
    s, _ = _add_session(True, 1.0)
    assert s.engineOptions() == {"target.deterministicWorkers": "true"}
    assert "target.deterministicWorkers" in s.getSummaryReport()
    s.options.engineOptions = {"target.deterministicWorkers": "false"}
    assert s.engineOptions()["target.deterministicWorkers"] == "false"
    assert _add_session(False, 1.0)[0].engineOptions() == {}
