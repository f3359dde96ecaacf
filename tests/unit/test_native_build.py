"""The install builds the C++ extension popxl._native from native/, implementing the executable
contract this popxl writes (its version and its instruction set)."""
import json

import pytest

import popxl
import popxl._native as native
import popxl.ops as ops
from popxl.compiler import instructions, lower
from popxl.compiler.executable import VERSION, Executable
from popxl.engines import create_engine


def test_native_module_builds_and_reports():
    assert native.abi_version() == VERSION
    info = native.build_info()
    assert set(info) >= {"compiler", "cplusplus", "openmp", "build_type"}
    assert info["cplusplus"] >= 201703


def test_native_loader_reads_exactly_the_declared_instruction_fields():
    declared = {kind: sorted(fields + tuple(f + "?" for f in instructions.OPTIONAL_FIELDS.get(kind, ())))
                for kind, fields in instructions.FIELDS.items()}
    declared["if.branch"] = sorted(instructions.BRANCH_FIELDS)
    assert {k: sorted(v) for k, v in native.instruction_fields().items()} == declared


def _program_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        x = ops.host_load(popxl.h2d_stream((2,), popxl.float32, "x"))
        body = ir.create_graph(lambda t: t * 2.0, x)
        (y,) = ops.repeat(body, 2, x)
        ops.host_store(popxl.d2h_stream((2,), popxl.float32, "y"), y)
    return ir


def test_every_lowered_instruction_has_its_declared_fields():
    exe = lower(_program_ir())
    for g in exe.graphs:
        instructions.check_program(g["program"], g["id"])
    bad = json.loads(exe.to_json())
    bad["graphs"][0]["program"][0]["extra"] = 1
    with pytest.raises(ValueError, match=r"graph ''\[0\]: a 'host_load' instruction has fields .*'extra'"):
        Executable.from_json(json.dumps(bad))
    bad["graphs"][0]["program"][0] = {"kind": "jump", "to": 3}
    with pytest.raises(ValueError, match="unknown instruction kind 'jump'"):
        Executable.from_json(json.dumps(bad))


def test_a_stale_native_extension_is_refused_with_a_clear_error(monkeypatch):
    from popxl.engines import native as native_engine
    monkeypatch.setattr(native_engine, "VERSION", VERSION + 1)
    with pytest.raises(RuntimeError, match=rf"implements executable version {VERSION}, but this popxl writes "
                                           rf"version {VERSION + 1}.*pip install -e \."):
        native_engine.NativeEngine(lower(_program_ir()))


def test_the_native_loader_refuses_a_malformed_instruction():
    exe = lower(_program_ir())
    del exe.graphs[0]["program"][0]["stream"]
    with pytest.raises(ValueError, match="a 'host_load' instruction has no field 'stream'"):
        create_engine(exe, "native")
