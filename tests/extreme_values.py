"""Extreme values of every dtype, and integer division as popxl defines it computed on Python ints
(the oracle of tests/engines/test_integer_division.py and tests/popart/test_onnx_integer_division.py:
a divisor of 0 gives 0, results wrap into the dtype, so INT_MIN / -1 is INT_MIN).
tests/engines/extreme_cases.py builds its cases from these values."""
import numpy as np

SIGNED = [np.int8, np.int16, np.int32, np.int64]
UNSIGNED = [np.uint8, np.uint16, np.uint32, np.uint64]


def extremes(dtype) -> np.ndarray:
    """The values of ``dtype`` kernels get wrong: integer limits, -1 and 0; for floats also NaN,
    +-inf, the smallest denormals and normals, the largest finite values and epsilon."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        fi = np.finfo(dt)
        return np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.nan, np.inf, -np.inf, fi.smallest_subnormal,
                         -fi.smallest_subnormal, fi.tiny, fi.max, -fi.max, fi.eps], dt)
    if dt.kind == "b":
        return np.array([False, True])
    info = np.iinfo(dt)
    if dt.kind == "i":
        return np.array([info.min, info.min + 1, -7, -1, 0, 1, 7, info.max - 1, info.max], dt)
    return np.array([0, 1, 7, info.max // 2, info.max // 2 + 1, info.max - 1, info.max], dt)


def all_pairs(dtype):
    """Every extreme value against every other: two flat arrays."""
    v = extremes(dtype)
    return np.repeat(v, len(v)), np.tile(v, len(v))


def wrap(value: int, dtype) -> int:
    """A Python int wrapped into ``dtype`` (two's complement)."""
    info = np.iinfo(dtype)
    return (value - info.min) % (info.max - info.min + 1) + info.min


def floor_quotient(a: int, b: int) -> int:
    return 0 if b == 0 else a // b  # Python's // rounds toward -infinity


def trunc_quotient(a: int, b: int) -> int:
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def c_remainder(a: int, b: int) -> int:
    return 0 if b == 0 else a - b * trunc_quotient(a, b)


def python_remainder(a: int, b: int) -> int:
    return 0 if b == 0 else a % b  # the sign of the divisor


def oracle(fn, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.array([wrap(fn(int(x), int(y)), a.dtype) for x, y in zip(a, b)], a.dtype)
