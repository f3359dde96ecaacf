"""dtypes, utils.to_numpy, fp8_utils, random_seed, ReplicaGrouping, testing helpers."""
import ast
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import popxl
from popxl import dtypes, fp8_utils, random_seed
from popxl.utils import table_to_string, to_numpy


def test_dtype_singletons_and_properties():
    with pytest.raises(TypeError):
        dtypes.dtype()
    assert popxl.half is popxl.float16 and popxl.float is popxl.float32 and popxl.double is popxl.float64
    assert repr(popxl.int8) == "popxl.dtypes.int8"
    assert popxl.uint32.is_int and not popxl.uint32.is_signed and popxl.int16.is_signed
    assert popxl.float8_143.is_floating_point and not popxl.bool.is_int and popxl.complex64.is_complex
    for d in popxl.testing.get_all_dtypes() + [popxl.bool]:
        assert dtypes.dtype.from_name(d.name) is d
        assert dtypes.dtype.as_dtype(d.as_numpy()) is d
        assert dtypes.from_numpy(d.as_numpy()) is d
    assert popxl.float8_143.as_numpy() == np.dtype([("float8_143", "u1")])
    assert dtypes.ml_dtype(popxl.float8_143) == np.dtype(ml_dtypes.float8_e4m3fnuz)
    assert dtypes.ml_dtype(popxl.float8_152) == np.dtype(ml_dtypes.float8_e5m2fnuz)
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fnuz).max) == 240
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fnuz).smallest_subnormal) == 2 ** -10
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e5m2fnuz).max) == 57344
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e5m2fnuz).smallest_subnormal) == 2 ** -17


def test_as_dtype_conversions_and_errors():
    as_dtype = dtypes.dtype.as_dtype
    assert as_dtype(bool) is popxl.bool and as_dtype(int) is popxl.int64 and as_dtype(float) is popxl.float32
    assert as_dtype("float16") is popxl.float16 and as_dtype(np.int8) is popxl.int8
    assert as_dtype(np.zeros(2, np.uint16)) is popxl.uint16 and as_dtype("i4") is popxl.int32
    with pytest.raises(ValueError):
        as_dtype("not a dtype")
    with pytest.raises(ValueError):
        dtypes.dtype.from_name("float128")
    with pytest.raises((TypeError, ModuleNotFoundError)):
        popxl.uint32.as_torch()
    assert [d.name for d in popxl.testing.get_all_int_dtypes(include_signed=False)] == \
        ["uint8", "uint16", "uint32", "uint64"]


def test_to_numpy_downcasts_and_keeps_memmaps(tmp_path):
    assert to_numpy(3).dtype == np.int32 and to_numpy(3.0).dtype == np.float32 and to_numpy(3).shape == ()
    assert to_numpy(np.zeros(2, np.uint64)).dtype == np.uint32
    assert to_numpy(np.zeros(2), downcast=False).dtype == np.float64
    assert to_numpy([1, 2], popxl.float16).dtype == np.float16
    a = np.zeros((3, 4))[:, ::2]
    assert to_numpy(a).flags.c_contiguous
    src = np.ones(3, np.float32)
    assert to_numpy(src) is not src and np.shares_memory(to_numpy(src, copy=False), src)
    mm = np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="w+", shape=(4,))
    assert to_numpy(mm) is mm
    mm64 = np.memmap(tmp_path / "m64.bin", dtype=np.float64, mode="w+", shape=(4,))
    # A memmap is used in place: each conversion it would need is refused, in PopXL's words.
    for dt in (None, popxl.float64):
        with pytest.raises(ValueError, match=f"memory-mapped NumPy array, the dtype {dt} is not supported, as it "
                                             "requires downcasting"):
            to_numpy(mm64, dt)
    assert to_numpy(mm64, downcast=False) is mm64  # kept in place when 64-bit data is asked for
    with pytest.raises(ValueError, match="memory-mapped NumPy array, the `dtype` parameter must be None"):
        to_numpy(mm, popxl.float16)
    fortran = np.memmap(tmp_path / "f.bin", dtype=np.float32, mode="w+", shape=(2, 3), order="F")
    with pytest.raises(ValueError, match="memory-mapped NumPy array, it must already be in C-ordered"):
        to_numpy(fortran)
    with pytest.raises(RuntimeError, match="float8"):
        to_numpy([1.0], popxl.float32, log2_scale=1)
    with pytest.raises(TypeError, match="float16/32/64"):
        to_numpy(np.ones(2, np.int32), popxl.float8_143)


def test_fp8_round_trip_and_overflow():
    x = np.array([0.0, 1.0, -2.5, 0.1, 100.0], np.float32)
    codes = fp8_utils.host_pow2scale_cast_to_fp8(x, popxl.float8_143, log2_scale=1)
    assert codes.dtype == popxl.float8_143.as_numpy()
    back = fp8_utils.host_pow2scale_cast_from_fp8(codes, popxl.float32, log2_scale=-1)
    np.testing.assert_allclose(back, x, rtol=0.07)
    over = fp8_utils.host_pow2scale_cast_to_fp8(np.array([1000.0]), popxl.float8_143)
    assert np.isnan(fp8_utils.host_pow2scale_cast_from_fp8(over))
    sat = fp8_utils.host_pow2scale_cast_to_fp8(np.array([1000.0, -1e6]), popxl.float8_143, nan_on_overflow=False)
    np.testing.assert_array_equal(fp8_utils.host_pow2scale_cast_from_fp8(sat), [240, -240])
    with pytest.raises(RuntimeError):
        fp8_utils.host_pow2scale_cast_to_fp8(x, popxl.float32)
    data = (np.random.default_rng(0).standard_normal(1000) * 1e-3).astype(np.float32)
    mse, scale = fp8_utils.host_fp8_mse_scale(data)
    assert 8 <= scale <= 20 and mse < np.mean(data.astype(np.float64) ** 2) * 1e-2
    assert fp8_utils.host_fp8_mse_scale_pb(data) == scale


def test_fp8_infinities_are_nan_even_when_saturating():
    src = np.array([np.inf, -np.inf, np.nan, 1e6], np.float32)
    codes = fp8_utils.host_pow2scale_cast_to_fp8(src, popxl.float8_152, nan_on_overflow=False)
    back = fp8_utils.host_pow2scale_cast_from_fp8(codes)
    assert np.isnan(back[:3]).all() and back[3] == 57344  # only the finite overflow saturates
    assert codes.view(np.uint8)[0] == 0x80  # the formats' one NaN code


def _binade_model(x, dt):
    """host_fp8_mse_scale written out for data whose magnitudes all lie in one binade
    [2**(e-1), 2**e): that binade's bound m = 2**(e-1) sits at histogram position e + 126, and the
    candidate with bias b (index i = b + 31) covers float32 binades start .. start + span - 1 with
    start = max(0, lowest - 31 + 126) + i. Every candidate covering the data costs m**2 * q
    (q = 2**(-2 * (source mantissa bits - float8 mantissa bits))) plus the constant 2**-254 PopXL
    adds; the median bias among them wins."""
    mant = {"float8_143": 3, "float8_152": 2}[dt.name]
    lowest, highest = {"float8_143": (-10, 7), "float8_152": (-17, 15)}[dt.name]
    span = highest - lowest + 1
    e = int(np.frexp(np.float64(abs(x[0])))[1])
    k = e - 1 + 126  # the binade's position among the bounds 2**-126 ...
    first = lowest - 31 + 126
    covering = [i - 31 for i in range(63) if first + i <= k < first + i + span]
    q = 2.0 ** (-2.0 * ((23 if x.dtype == np.float32 else 10) - mant))
    return 2.0 ** -254 + (2.0 ** (e - 1)) ** 2 * q, -covering[len(covering) // 2]


@pytest.mark.parametrize("src_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("dt", [popxl.float8_143, popxl.float8_152])
@pytest.mark.parametrize("binade", [6, -5, 0])
def test_fp8_mse_scale_follows_popxls_binade_model(src_dtype, dt, binade):
    rng = np.random.default_rng(1)
    x = (rng.uniform(2.0 ** (binade - 1), 2.0 ** binade * 0.999, 200) * rng.choice([-1, 1], 200)).astype(src_dtype)
    error, scale = fp8_utils.host_fp8_mse_scale(x, dt)
    assert (error, scale) == _binade_model(x, dt)
    assert fp8_utils.host_fp8_mse_scale_pb(x, dt) == scale


def test_fp8_mse_scale_examples():
    # Data in [2**5, 2**6) is large for float8_143 (whose range is 2**-10 .. 2**7): the scale is
    # negative (-7, the middle of the 18 scales whose range holds it); data in [2**-6, 2**-5) is
    # small: the scale is positive.
    big = np.random.default_rng(2).uniform(2 ** 5, 2 ** 6, 500).astype(np.float32)
    assert fp8_utils.host_fp8_mse_scale(big, popxl.float8_143) == (2.0 ** -254 + 2.0 ** 10 * 2.0 ** -40, -7)
    assert fp8_utils.host_fp8_mse_scale(big, popxl.float8_152)[1] == -6
    small = np.random.default_rng(3).uniform(2 ** -6, 2 ** -5, 500).astype(np.float16)
    assert fp8_utils.host_fp8_mse_scale(small, popxl.float8_143)[1] == 4
    # Data spanning the format's whole range needs no scale.
    assert fp8_utils.host_fp8_mse_scale(np.array([0.00098, 240], np.float32), popxl.float8_143)[1] == 0
    assert fp8_utils.host_fp8_mse_scale(np.array([2 ** -17, 57344], np.float16), popxl.float8_152)[1] == 0
    # Two values 30 binades apart, more than float8_143's 18: the 18 biases whose range holds the
    # large one (and flushes the small one to zero) cost (2**-20)**2 / 2 + (2**10)**2 / 2 * 2**-40
    # each, far less than overflowing the large one; the middle of them is -12.
    mixed = np.array([2.0 ** -20, 2.0 ** 10], np.float32)
    assert fp8_utils.host_fp8_mse_scale(mixed, popxl.float8_143) == (2.0 ** -41 + 2.0 ** -21, -12)
    # No data: every scale costs nothing and the middle one (0) is taken.
    assert fp8_utils.host_fp8_mse_scale(np.zeros(0, np.float32)) == (0.0, 0)
    # Zeros count below the smallest binade, infinities above the largest; PopXL counts a NaN as
    # a value in [0.5, 1) (its frexp exponent is 0), so it weighs like 0.75.
    with_specials = np.array([np.nan, 1.0, np.inf, 0.0], np.float32)
    assert fp8_utils.host_fp8_mse_scale(with_specials)[1] == \
        fp8_utils.host_fp8_mse_scale(np.array([0.75, 1.0, np.inf, 0.0], np.float32))[1]
    with pytest.raises(RuntimeError, match="float16 or float32"):
        fp8_utils.host_fp8_mse_scale(np.ones(3))
    with pytest.raises(RuntimeError, match="host_fp8_mse_scale"):
        fp8_utils.host_fp8_mse_scale(np.ones(3, np.float32), popxl.float16)


def test_dtypes_are_plain_module_attributes():
    # Each dtype is bound by a plain assignment in popxl/dtypes.py (type checkers see a dtype, not
    # Any), under its own name; the aliases are PopXL's.
    tree = ast.parse(Path(dtypes.__file__).read_text())
    assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    assert len(dtypes._BY_NAME) == 16 and set(dtypes._BY_NAME) <= assigned
    for name, d in dtypes._BY_NAME.items():
        assert getattr(dtypes, name) is d and getattr(popxl, name) is d and d.name == name
        assert name in dtypes.__all__
    assert {"half", "float", "double"} <= assigned
    assert "globals().update" not in Path(dtypes.__file__).read_text()


def test_float8_host_dtypes_and_lookup_tables():
    # PopXL's host form of float8 data: a structured dtype with one uint8 field named after the format.
    assert dtypes.np_dtype_float8_143 == np.dtype([("float8_143", "u1")]) == popxl.float8_143.as_numpy()
    assert dtypes.np_dtype_float8_152.names == ("float8_152",) and dtypes.np_dtype_float8_152.itemsize == 1
    assert dtypes._NP_TO_POPXL[dtypes.np_dtype_float8_152] is popxl.float8_152
    assert dtypes._NP_TO_POPXL[np.dtype(np.int16)] is popxl.int16
    assert set(dtypes._NP_TO_POPXL.values()) == set(popxl.testing.get_all_dtypes()) | {popxl.bool}
    torch = pytest.importorskip("torch")
    assert dtypes._PT_TO_POPXL[torch.float16] is popxl.float16
    assert dtypes._PT_TO_POPXL[torch.bool] is popxl.bool and torch.uint32 not in dtypes._PT_TO_POPXL


def test_random_seed_helpers():
    assert random_seed.uint64_to_two_uint32(2 ** 32 + 5) == (1, 5)
    assert random_seed.two_uint32_to_uint64(1, 5) == 2 ** 32 + 5
    with pytest.raises(ValueError):
        random_seed.uint64_to_two_uint32(2 ** 64)
    assert random_seed.MAX_UINT64 == 2 ** 64 - 1
    hi, lo = random_seed.uint64_to_two_uint32(random_seed.MAX_UINT64)
    assert hi == lo == 2 ** 32 - 1 and random_seed.two_uint32_to_uint64(hi, lo) == random_seed.MAX_UINT64
    s = popxl.create_seeds(42)
    assert s.shape == (2,) and s.dtype == np.uint32
    np.testing.assert_array_equal(s, popxl.create_seeds(42))
    assert not np.array_equal(s, popxl.create_seeds(42, offset=1))
    assert popxl.create_seeds(1, batches_per_step=3, replicas=4).shape == (3, 4, 2)
    draw = np.random.default_rng(7).integers(0, 2 ** 64 - 1, size=1, dtype=np.uint64, endpoint=True)[0]
    assert tuple(popxl.create_seeds(7)) == random_seed.uint64_to_two_uint32(int(draw))


@pytest.mark.parametrize("stride,group_size,expected", [
    (1, 2, [0, 0, 1, 1, 2, 2, 3, 3]), (1, 4, [0, 0, 0, 0, 1, 1, 1, 1]), (2, 2, [0, 1, 0, 1, 2, 3, 2, 3]),
    (2, 4, [0, 1, 0, 1, 0, 1, 0, 1]), (4, 2, [0, 1, 2, 3, 0, 1, 2, 3]), (1, None, [0] * 8), (1, 1, list(range(8))),
])
def test_replica_grouping_assignments(stride, group_size, expected):
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping(stride, group_size)
    assert rg.assignment == expected
    assert rg.num_groups == max(expected) + 1 and rg.group_size == 8 // rg.num_groups
    assert rg == ir.replica_grouping_from_assignments(expected) and rg.is_const


def test_replica_grouping_errors_and_transpose():
    ir = popxl.Ir(replication=8)
    with pytest.raises(RuntimeError):
        popxl.ReplicaGrouping()
    for bad in [(0, None), (3, None), (16, None), (1, 3), (1, 0)]:
        with pytest.raises(ValueError):
            ir.replica_grouping(*bad)
    with pytest.raises(ValueError, match="equal sizes"):
        ir.replica_grouping_from_assignments([0, 0, 0, 1, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="first"):
        ir.replica_grouping_from_assignments([1, 1, 1, 1, 0, 0, 0, 0])
    irregular = ir.replica_grouping_from_assignments([0, 1, 1, 0, 2, 3, 3, 2])
    assert not irregular.is_const
    with pytest.raises(NotImplementedError):
        irregular.stride
    with pytest.raises(TypeError):
        hash(irregular)
    with pytest.raises(TypeError):
        irregular == 1  # noqa: B015
    assert ir.replica_grouping(1, 2).transpose().assignment == [0, 1, 0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize("assignment,const_assignment", [
    ([0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3]),       # pieces of 2 at stride 1
    ([0, 1, 1, 0, 0, 1, 1, 0], list(range(8))),                 # pieces of 1 and 2: each replica alone
    ([0, 1, 2, 3, 1, 2, 3, 0], list(range(8))),
    ([0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1], list(range(16))),  # pieces of 2 and 3
])
def test_non_constant_grouping_const_rg_and_maps(assignment, const_assignment):
    ir = popxl.Ir(replication=len(assignment))
    rg = ir.replica_grouping_from_assignments(assignment)
    assert not rg.is_const and rg.const_rg.is_const
    const = rg.const_rg.assignment
    assert const == const_assignment
    # to_device_map: the group of rg holding each const group; to_host_map: each group's first const group
    assert rg.to_device_map == [assignment[const.index(c)] for c in range(rg.const_rg.num_groups)]
    assert rg.to_host_map == [const[assignment.index(g)] for g in range(rg.num_groups)]
    for r, c in enumerate(const):  # every const group lies within one group of rg
        assert rg.to_device_map[c] == assignment[r]


def test_constant_grouping_is_its_own_const_rg():
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping(stride=2, group_size=2)
    assert rg.const_rg is rg and rg.to_device_map is None and rg.to_host_map is None
    transposed = rg.transpose()  # [0, 0, 1, 1, 0, 0, 1, 1]: PopXL's example of a non-constant transpose
    assert transposed.assignment == [0, 0, 1, 1, 0, 0, 1, 1] and not transposed.is_const
    assert transposed.transpose().assignment == rg.assignment and transposed.transpose().is_const


def test_table_to_string():
    text = table_to_string([["a", "bb"], ["ccc", "d"]])
    assert text.splitlines() == ["a   | bb", "--- | --", "ccc | d"]


def test_errors_module():
    from popxl.errors import UndefinedValue
    assert issubclass(UndefinedValue, ValueError)
    import popxl
    assert popxl.errors.UndefinedValue is UndefinedValue
