"""The install builds the C++ extension popxl._native from native/."""
import popxl._native as native


def test_native_module_builds_and_reports():
    assert native.abi_version() == 2
    info = native.build_info()
    assert set(info) >= {"compiler", "cplusplus", "openmp", "build_type"}
    assert info["cplusplus"] >= 201703
