"""Integer division and remainder on both engines, against Python's integer arithmetic.

The semantics (docs/guide/numerics.md, "Integer division"): ``ops.div`` floor-divides, ``ops.fmod`` is C's
remainder (the sign of the dividend); a divisor of 0 gives 0; the most negative value divided by -1
wraps to itself (two's complement) with remainder 0. Every pair of INT_MIN, INT_MIN + 1, -7, -1, 0,
1, 7, INT_MAX - 1, INT_MAX (unsigned: 0, 1, 7, the middle, UINT_MAX - 1, UINT_MAX) for every
integer dtype, so the native engine's SIGFPE cases (INT_MIN / -1, x / 0) are all there.
"""
import numpy as np
import pytest

import popxl.ops as ops
from engine_harness import run_program
from extreme_values import SIGNED, UNSIGNED, all_pairs, c_remainder, floor_quotient, oracle


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED, ids=lambda d: np.dtype(d).name)
def test_div_and_fmod_of_every_extreme_pair(dtype, engine):
    a, b = all_pairs(dtype)
    (q, r), _ = run_program(lambda x, y: [ops.div(x, y), ops.fmod(x, y)], [a, b], engine)
    np.testing.assert_array_equal(q, oracle(floor_quotient, a, b))
    np.testing.assert_array_equal(r, oracle(c_remainder, a, b))


@pytest.mark.parametrize("dtype", SIGNED, ids=lambda d: np.dtype(d).name)
def test_most_negative_over_minus_one_wraps(dtype):
    """The case that killed the process with SIGFPE: INT_MIN / -1 is INT_MIN, INT_MIN fmod -1 is 0,
    for one element and for a broadcast divisor."""
    info = np.iinfo(dtype)
    a = np.array([info.min] * 3, dtype)
    for b in (np.array([-1, -1, -1], dtype), np.array(-1, dtype)):
        for engine in ("native", "reference"):
            (q, r), _ = run_program(lambda x, y: [ops.div(x, y), ops.fmod(x, y)], [a, b], engine)
            np.testing.assert_array_equal(q, a)
            np.testing.assert_array_equal(r, np.zeros(3, dtype))


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_float_division_by_zero_is_ieee(engine):
    a = np.array([1.0, -1.0, 0.0, np.inf], np.float32)
    b = np.zeros(4, np.float32)
    (q, r), _ = run_program(lambda x, y: [ops.div(x, y), ops.fmod(x, y)], [a, b], engine)
    np.testing.assert_array_equal(q, np.array([np.inf, -np.inf, np.nan, np.inf], np.float32))
    assert np.isnan(r).all()
