"""Op attributes are declared once, in each op's definition (OpDef.attributes): tracing checks them,
the executable carries the declarations of the ops it runs, and both engines check every op
instruction against them at load; the native kernels read attributes through accessors that refuse
a name or type the op does not declare, so a kernel and an op definition that drift apart fail at
load, naming the op and the attribute."""
import json

import attrs
import numpy as np
import pytest

import popxl
import popxl._native as native
import popxl.ops as ops
from popxl.compiler import lower
from popxl.compiler.executable import Executable
from popxl.engines import create_engine
from popxl.op import ATTRIBUTE_TYPES, REGISTRY, OpDef, register


def _clip_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        x = ops.host_load(popxl.h2d_stream((4,), popxl.float32, "x"))
        y = ops.clip(x, -1.0, 2.0)
        ops.host_store(popxl.d2h_stream((4,), popxl.float32, "y"), y)
    return ir


def _clip_instr(exe):
    (instr,) = [i for g in exe.graphs for i in g["program"] if i["kind"] == "op" and i["type"] == "clip"]
    return instr


def _run(exe, engine):
    e = create_engine(exe, engine)
    e.attach()
    try:
        x = np.array([-3.0, 0.5, 1.5, 9.0], np.float32)
        out = np.zeros((1, 1, 4), np.float32)
        e.run([x.reshape(1, 1, 4)], [out])
        return out.reshape(4)
    finally:
        e.detach()


def test_declarations_use_known_types_and_the_executable_carries_them():
    for name, opdef in REGISTRY.items():
        for attr, kind in (opdef.attributes or {}).items():
            assert kind.rstrip("?") in ATTRIBUTE_TYPES, (name, attr, kind)
    exe = lower(_clip_ir())
    assert exe.op_attrs == {"clip": {"min": "float", "max": "float"}}
    again = Executable.from_json(exe.to_json())
    assert again.op_attrs == exe.op_attrs
    for engine in ("reference", "native"):
        np.testing.assert_array_equal(_run(exe, engine), np.array([-1.0, 0.5, 1.5, 2.0], np.float32))


def test_an_unknown_attribute_type_is_refused_at_registration():
    with pytest.raises(ValueError, match="op 'made_up': attribute 'k' has unknown type 'integer'"):
        register(OpDef("made_up", lambda specs, k: [specs[0]], attributes={"k": "integer"}))
    assert "made_up" not in REGISTRY


def test_tracing_refuses_attributes_the_op_does_not_declare(monkeypatch):
    monkeypatch.setitem(REGISTRY, "clip", attrs.evolve(REGISTRY["clip"], attributes={"low": "float", "max": "float"}))
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros(4, np.float32))
        with pytest.raises(ValueError, match=r"ops\.clip: attribute 'min' is not declared by op 'clip' "
                                             r"\(declared: low, max\)"):
            ops.clip(x, 0.0, 1.0)
    monkeypatch.setitem(REGISTRY, "clip", attrs.evolve(REGISTRY["clip"], attributes={"min": "float", "max": "ints"}))
    with ir.main_graph:
        with pytest.raises(ValueError, match=r"ops\.clip: attribute 'max' of op 'clip' is declared ints, but its "
                                             r"value is 1\.0"):
            ops.clip(x, 0.0, 1.0)


def test_renaming_an_attribute_in_the_op_definition_is_caught_when_the_native_engine_loads(monkeypatch):
    # A Python-side rename of clip's `min` (its declaration and the attribute the op carries) that
    # the C++ kernel, still reading `min`, did not follow: the load fails naming op and attribute.
    ir = _clip_ir()
    (op,) = [o for o in ir.main_graph.schedule() if o.type == "clip"]
    op.attrs["low"] = op.attrs.pop("min")
    monkeypatch.setitem(REGISTRY, "clip", attrs.evolve(REGISTRY["clip"], attributes={"low": "float", "max": "float"}))
    exe = lower(ir)
    assert exe.op_attrs["clip"] == {"low": "float", "max": "float"}
    with pytest.raises(ValueError, match=rf"op '{op.name}' \(clip\): its native kernel reads attribute 'min', which "
                                         r"op 'clip' does not declare \(declared: low, max\)"):
        create_engine(exe, "native")


def test_a_kernel_reading_an_attribute_as_another_type_than_declared_fails_at_load():
    exe = lower(_clip_ir())
    exe.op_attrs["clip"]["min"] = "number"  # readable as a float: loads
    create_engine(exe, "native")
    exe.op_attrs["clip"]["min"] = "float?"
    create_engine(exe, "native")
    exe.op_attrs["clip"] = {"min": "str", "max": "float"}
    _clip_instr(exe)["attrs"]["min"] = "-1"
    with pytest.raises(ValueError, match=r"reads attribute 'min' as float, but op 'clip' declares it str"):
        create_engine(exe, "native")


def test_an_op_without_declarations_whose_kernel_reads_attributes_fails_at_load():
    exe = lower(_clip_ir())
    del exe.op_attrs["clip"]
    with pytest.raises(ValueError, match=r"\(clip\): its native kernel reads attribute 'min', but op 'clip' "
                                         r"declares no attributes"):
        create_engine(exe, "native")


@pytest.mark.parametrize("engine", ["reference", "native"])
def test_instructions_that_differ_from_the_declaration_are_refused_at_load(engine):
    exe = lower(_clip_ir())
    name = _clip_instr(exe)["name"]

    def load(edit):
        e = lower(_clip_ir())
        edit(_clip_instr(e)["attrs"])
        if engine == "reference":
            return create_engine(e, "reference")
        # the C++ loader's own check, without the Python one in front of it
        return native.Engine.load(attrs.asdict(e, recurse=False), lambda *a: None, [])

    with pytest.raises(ValueError, match=rf"op '{name}' \(clip\): attribute 'low' is not declared by op 'clip'"):
        load(lambda a: a.update(low=a.pop("min")))
    with pytest.raises(ValueError, match=rf"op '{name}' \(clip\): attribute 'max' of op 'clip' is missing"):
        load(lambda a: a.pop("max"))
    with pytest.raises(ValueError, match=rf"op '{name}' \(clip\): attribute 'min' .*declared.* float"):
        load(lambda a: a.update(min="zero"))


def test_from_json_checks_op_attributes():
    text = json.loads(lower(_clip_ir()).to_json())
    for g in text["graphs"]:
        for i in g["program"]:
            if i["kind"] == "op":
                i["attrs"]["extra"] = 1
    with pytest.raises(ValueError, match=r"attribute 'extra' is not declared by op 'clip'"):
        Executable.from_json(json.dumps(text))


def test_every_op_declares_its_attributes_but_control_and_placement_ops():
    # popxl's own ops (other tests register custom ops of their own in this process)
    undeclared = sorted(name for name, opdef in REGISTRY.items()
                        if opdef.attributes is None and getattr(opdef.infer, "__module__", "").startswith("popxl."))
    assert undeclared == ["call", "dense_sparse_matmul", "host_load", "host_store", "if", "io_tile_copy",
                          "ipu_copy", "repeat"]
