"""The checks the ONNX importer runs before lowering a model (popart/onnx/validate.py): operator
sets and domains, single assignment, initializer data, declared outputs, element types. Each bad
model must fail with an OnnxImportError naming what is wrong; each model on the accepted side of a
rule must import and give the right result."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart
from popart.onnx.importer import MIN_OPSET, newest_opset
from popart_helpers import make_model, run_session

N = helper.make_node
X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5


def _import_error(model: onnx.ModelProto, outputs=("y",)) -> str:
    """The message of the OnnxImportError building a session for ``model`` raises."""
    with pytest.raises(popart.OnnxImportError) as e:
        popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, list(outputs)),
                                popart.DeviceManager().createCpuDevice())
    return str(e.value)


def _relu_model(opset: int = 17, **kwargs) -> onnx.ModelProto:
    return make_model([N("Relu", ["x"], ["y"], name="relu")], {"x": X}, ["y"], opset=opset, **kwargs)


def _relu_runs(model: onnx.ModelProto) -> None:
    (y,) = run_session(model, {"x": X}, ["y"])
    np.testing.assert_array_equal(y, np.maximum(X, 0))


# operator sets and domains ---------------------------------------------------------------------------
def test_opsets_up_to_the_installed_onnx_newest_are_accepted():
    newest = newest_opset()
    assert newest == onnx.defs.onnx_opset_version() and newest > 21
    for opset in (MIN_OPSET, 21, 22, newest):
        _relu_runs(_relu_model(opset))


def test_opsets_beyond_the_installed_onnx_are_refused():
    newest = newest_opset()
    for opset in (newest + 1, 99):
        msg = _import_error(_relu_model(opset))
        assert f"imports ai.onnx opset {opset}" in msg
        assert f"defines opsets up to {newest}" in msg and onnx.__version__ in msg
        assert f"Supported opsets are {MIN_OPSET} to {newest}" in msg
    msg = _import_error(_relu_model(MIN_OPSET - 1))
    assert f"opset {MIN_OPSET - 1}; supported opsets are {MIN_OPSET} to {newest}" in msg


def test_default_domain_imported_twice_with_different_versions():
    model = _relu_model(17)
    model.opset_import.append(helper.make_opsetid("ai.onnx", 13))
    assert "imports ai.onnx twice, as versions 17 and 13" in _import_error(model)
    model = _relu_model(17)  # the same version under both names is one import
    model.opset_import.append(helper.make_opsetid("ai.onnx", 17))
    _relu_runs(model)


def test_no_default_opset():
    model = _relu_model()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    assert "imports no version of the default (ai.onnx) operator set" in _import_error(model)


@pytest.mark.parametrize("domain, version, expected", [
    ("ai.graphcore", 2, "imports ai.graphcore version 2, but popart defines version 1 only"),
    ("ai.onnx.ml", 99, "imports ai.onnx.ml version 99, but the installed onnx package"),
    ("com.example", 0, "imports com.example version 0; versions start at 1"),
])
def test_unknown_domain_versions_are_refused(domain, version, expected):
    model = _relu_model()
    model.opset_import.append(helper.make_opsetid(domain, version))
    assert expected in _import_error(model)


def test_imported_custom_domains_without_nodes_are_accepted():
    model = _relu_model()
    model.opset_import.extend([helper.make_opsetid("com.example", 3), helper.make_opsetid("ai.graphcore", 1),
                               helper.make_opsetid("ai.onnx.ml", 3)])
    _relu_runs(model)


def test_node_in_a_domain_the_model_does_not_import():
    model = make_model([N("Relu", ["x"], ["y"], name="custom", domain="com.example")], {"x": X}, ["y"])
    msg = _import_error(model)
    assert "node 'custom' (Relu) is in domain 'com.example', which the ONNX model does not import" in msg
    # also inside a subgraph
    branch = helper.make_graph([N("Neg", ["x"], ["t"], name="inner", domain="com.other")], "then", [],
                               [helper.make_empty_tensor_value_info("t")])
    other = helper.make_graph([N("Relu", ["x"], ["e"])], "else", [], [helper.make_empty_tensor_value_info("e")])
    model = make_model([N("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
                        N("If", ["c"], ["y"], then_branch=branch, else_branch=other)], {"x": X}, ["y"])
    assert "node 'inner' (Neg) is in domain 'com.other'" in _import_error(model)


def test_op_newer_than_the_model_opset():
    model = make_model([N("Gelu", ["x"], ["y"], name="g")], {"x": X}, ["y"], opset=17)
    assert "node 'g' (Gelu): ai.onnx opset 17 has no Gelu (it was introduced in opset 20)" in _import_error(model)
    model = make_model([N("Gelu", ["x"], ["y"], name="g")], {"x": X}, ["y"], opset=20)
    (y,) = run_session(model, {"x": X}, ["y"])
    from scipy.special import erf
    np.testing.assert_allclose(y, 0.5 * X * (1 + erf(X / np.sqrt(2))), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("node, expected", [
    (N("Relu", ["x", "x"], ["y"], name="r"), "node 'r' (Relu): has 2 input(s); Relu (ai.onnx opset 17) takes 1."),
    (N("Split", ["x"], [], name="s", axis=1), "node 's' (Split): has 0 output(s); Split (ai.onnx opset 17) takes 1 or "
                                               "more."),
    (N("Clip", ["x", "", "", ""], ["y"], name="c"), "node 'c' (Clip): has 4 input(s); Clip (ai.onnx opset 17) takes "
                                                    "1 to 3."),
    (N("Softmax", ["x"], ["y"], name="s", axes=1), "node 's' (Softmax): Softmax (ai.onnx opset 17) has no attribute "
                                                   "'axes' (its attributes: axis)."),
    (N("Softmax", ["x"], ["y"], name="s", axis=1.5), "node 's' (Softmax): attribute 'axis' must be of type INT, not "
                                                     "FLOAT."),
    (N("Cast", ["x"], ["y"], name="c"), "node 'c' (Cast): required attribute(s) 'to' of Cast (ai.onnx opset 17) "
                                        "missing."),
    # found by the fuzz: the import-time Softmax read the absent input as None (AttributeError)
    (N("Softmax", [""], ["y"], name="s"), "node 's' (Softmax): input 0 ('input') is required, but its name is empty "
                                          "(an absent optional input)."),
])
def test_nodes_are_checked_against_their_op_definition(node, expected):
    assert _import_error(make_model([node], {"x": X}, ["y"])) == expected


def test_attribute_given_twice():
    node = N("Softmax", ["x"], ["y"], name="s", axis=1)
    node.attribute.append(helper.make_attribute("axis", 0))
    assert "node 's' (Softmax): attribute 'axis' is given twice" in _import_error(make_model([node], {"x": X}, ["y"]))


def test_subgraph_attribute_of_the_wrong_type():
    # Found by the fuzz: a Loop whose body attribute was not a graph reached the entry, which
    # failed with AttributeError.
    ok = [N("Identity", ["cond"], ["cond_out"]), N("Add", ["acc", "x"], ["acc_out"])]
    model = _loop_model(ok)
    body = model.graph.node[2].attribute[0]
    body.type = onnx.AttributeProto.INT
    assert "node 'loop' (Loop): attribute 'body' must be of type GRAPH, not INT" in _import_error(model)
    del model.graph.node[2].attribute[:]
    assert "node 'loop' (Loop): required attribute(s) 'body' of Loop (ai.onnx opset 17) missing" \
        in _import_error(model)


def test_local_function_opsets_are_checked():
    body = helper.make_function("com.example", "MyRelu", ["a"], ["b"], [N("Relu", ["a"], ["b"])],
                                [helper.make_opsetid("", 99)])
    model = make_model([N("MyRelu", ["x"], ["y"], domain="com.example")], {"x": X}, ["y"])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    model.functions.append(body)
    assert "local function com.example.MyRelu imports ai.onnx opset 99" in _import_error(model)
    del body.opset_import[:]
    body.opset_import.append(helper.make_opsetid("", 17))
    del model.functions[:]
    model.functions.append(body)
    _relu_runs(model)


def test_names_that_are_not_text():
    # Found by the fuzz: protobuf hands back a string field that is not valid UTF-8 as bytes, which
    # reached onnx.defs.get_schema (TypeError: incompatible function arguments).
    data = make_model([N("Relu", ["x"], ["y"], name="relu")], {"x": X}, ["y"]).SerializeToString()
    assert data.count(b"Relu") == 1
    with pytest.raises(popart.OnnxImportError, match=r"model.graph.node\[0\].op_type is not valid UTF-8 text: "
                                                     r"b'R\\xe9lu'"):
        popart.InferenceSession(data.replace(b"Relu", b"R\xe9lu"), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice())


def test_ir_version_newer_than_onnx_reads():
    model = _relu_model()
    model.ir_version = onnx.IR_VERSION + 1
    assert f"IR version {onnx.IR_VERSION + 1}, newer than the installed onnx package" in _import_error(model)


# sizes -------------------------------------------------------------------------------------------------
def test_inputs_larger_than_memory_are_refused_before_allocating():
    model = make_model([N("Relu", ["x"], ["y"])], {"x": X}, ["y"], input_shapes={"x": [2 ** 20, 2 ** 20, 4]})
    msg = _import_error(model)
    assert re.fullmatch(r"model input 'x' has shape \(1048576, 1048576, 4\) of float32: 16\.0 TiB, more than the "
                        r"[0-9.]+ [GMT]iB of memory this process can use\.", msg), msg
    # int64 inputs are held as int32 on the device: counted at 4 bytes an element
    model = make_model([N("Neg", ["x"], ["y"])], {"x": np.zeros(2, np.int64)}, ["y"], input_shapes={"x": [2 ** 42]})
    assert "model input 'x' has shape (4398046511104,) of int32: 16.0 TiB" in _import_error(model)


_OUT_OF_MEMORY_SCRIPT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np, popart
sys.path.insert(0, {tests!r})
from popart_helpers import make_model
from onnx import helper
model = make_model([helper.make_node("Tile", ["x", "reps"], ["y"], name="tile")], {{"x": np.zeros((2, 3), np.float32)}},
                   ["y"], {{"reps": np.array([1, 2 ** 36], np.int64)}})
try:
    popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["y"]), popart.DeviceManager().createCpuDevice())
except Exception as e:
    print(type(e).__name__, e)
"""


def test_import_that_runs_out_of_memory_names_the_node():
    # Found by the fuzz: a Tile repeating 2**36 times built its gather indices at import and raised
    # NumPy's MemoryError. Run under an address-space limit, so that no machine really tries.
    import os
    import subprocess
    import sys
    script = _OUT_OF_MEMORY_SCRIPT.format(tests=os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("OnnxImportError node 'tile' (Tile, opset 17): the values it needs at import do not "
                                 "fit in memory (Unable to allocate"), out.stdout


# single assignment -----------------------------------------------------------------------------------
def test_two_nodes_writing_one_tensor():
    model = make_model([N("Relu", ["x"], ["y"], name="first"), N("Neg", ["x"], ["y"], name="second")],
                       {"x": X}, ["y"])
    msg = _import_error(model)
    assert "tensor 'y' is written by node 'second' (Neg) but also by node 'first' (Relu)" in msg
    assert "single static assignment" in msg


def test_node_writing_an_input_or_initializer():
    model = make_model([N("Relu", ["x"], ["x"], name="r")], {"x": X}, ["x"])
    assert "tensor 'x' is written by node 'r' (Relu) but also by a graph input" in _import_error(model, ["x"])
    model = make_model([N("Relu", ["x"], ["w"], name="r")], {"x": X}, ["w"], {"w": X})
    assert "tensor 'w' is written by node 'r' (Relu) but also by an initializer" in _import_error(model, ["w"])


def test_one_node_writing_a_name_twice():
    model = make_model([N("Split", ["x"], ["y", "y"], name="s", axis=1, num_outputs=2)],
                       {"x": np.zeros((2, 4), np.float32)}, ["y"], opset=18)
    assert "tensor 'y' is written by node 's' (Split) but also by node 's' (Split)" in _import_error(model)


def test_duplicate_inputs_and_initializers():
    model = make_model([N("Relu", ["x"], ["y"])], {"x": X}, ["y"], {"w": X})
    model.graph.initializer.append(numpy_helper.from_array(X, "w"))
    assert "initializer 'w' is defined twice" in _import_error(model)
    model = _relu_model()
    model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]))
    assert "graph input 'x' is declared twice" in _import_error(model)


def test_initializer_also_listed_as_input_is_accepted():
    # Older exporters list every initializer among the graph inputs too.
    model = make_model([N("Add", ["x", "w"], ["y"])], {"x": X}, ["y"], {"w": np.ones((2, 3), np.float32)})
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3]))
    (y,) = run_session(model, {"x": X}, ["y"])
    np.testing.assert_array_equal(y, X + 1)


def _loop_model(body_nodes, body_outputs=("cond_out", "acc_out")):
    """y = Loop(2 iterations) over a body carrying one float tensor, from ``body_nodes``."""
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2, 3])],
        [helper.make_empty_tensor_value_info(o) for o in body_outputs])
    nodes = [N("Constant", [], ["n"], value=numpy_helper.from_array(np.array(2, np.int64))),
             N("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True))),
             N("Loop", ["n", "t", "x"], ["y"], body=body, name="loop")]
    return make_model(nodes, {"x": X}, ["y"])


def test_single_assignment_inside_subgraphs():
    ok = [N("Identity", ["cond"], ["cond_out"]), N("Add", ["acc", "x"], ["acc_out"])]
    (y,) = run_session(_loop_model(ok), {"x": X}, ["y"])
    np.testing.assert_allclose(y, 3 * X)
    twice = [N("Identity", ["cond"], ["cond_out"]), N("Add", ["acc", "x"], ["acc_out"], name="a1"),
             N("Sub", ["acc", "x"], ["acc_out"], name="a2")]
    msg = _import_error(_loop_model(twice))
    assert msg.startswith("subgraph 'body' (attribute 'body' of node 'loop' (Loop)): ")
    assert "tensor 'acc_out' is written by node 'a2' (Sub) but also by node 'a1' (Add)" in msg
    # a body node may not write a name of the enclosing graph either (ONNX's scoping rule)
    shadow = [N("Identity", ["cond"], ["cond_out"]), N("Add", ["acc", "x"], ["t"], name="a"),
              N("Identity", ["t"], ["acc_out"])]
    msg = _import_error(_loop_model(shadow))
    assert "tensor 't' is written by node 'a' (Add) but also by node '<node 1>' (Constant) in an enclosing graph" \
        in msg


# initializer data ------------------------------------------------------------------------------------
def _add_w_model(w: TensorProto) -> onnx.ModelProto:
    model = make_model([N("Add", ["x", "w"], ["y"])], {"x": X}, ["y"])
    model.graph.initializer.append(w)
    return model


def test_initializer_dims_that_do_not_match_raw_data():
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.dims[:] = [4, 3]
    msg = _import_error(_add_w_model(w))
    assert msg == ("initializer 'w' has dims [4, 3] (12 float32 element(s), 48 bytes) but its raw_data holds "
                   "24 bytes.")
    w.dims[:] = [2, 3]
    w.raw_data = w.raw_data[:-1]
    assert "initializer 'w' has dims [2, 3] (6 float32 element(s), 24 bytes) but its raw_data holds 23 bytes" \
        in _import_error(_add_w_model(w))


def test_initializer_dims_that_do_not_match_typed_data():
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], [1.0] * 6)
    del w.float_data[-1]
    assert "initializer 'w' has dims [2, 3] (6 element(s)) but its float_data holds 5 value(s)" \
        in _import_error(_add_w_model(w))
    w = helper.make_tensor("w", TensorProto.FLOAT16, [2, 3], np.ones(6, np.float16))
    w.int32_data.append(0)
    assert "but its int32_data holds 7 value(s)" in _import_error(_add_w_model(w))
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], [1.0] * 6)
    del w.float_data[:]
    assert "initializer 'w' has dims [2, 3] (6 float32 element(s), 24 bytes) but its raw_data holds 0 bytes" \
        in _import_error(_add_w_model(w))


def test_initializer_with_negative_or_huge_dims():
    w = numpy_helper.from_array(np.ones(6, np.float32), "w")
    w.dims[:] = [-2, -3]
    assert "initializer 'w' has dims [-2, -3]: dimensions must not be negative" in _import_error(_add_w_model(w))
    w.dims[:] = [2 ** 62, 2 ** 62]
    assert f"({2 ** 124} float32 element(s), {2 ** 126} bytes) but its raw_data holds 24 bytes" \
        in _import_error(_add_w_model(w))


def test_initializer_with_external_data_not_loaded(tmp_path):
    model = _add_w_model(numpy_helper.from_array(np.ones((2, 3), np.float32), "w"))
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    # From the file, the data is read from beside it ...
    (y,) = run_session(onnx.load(str(tmp_path / "m.onnx")), {"x": X}, ["y"])
    np.testing.assert_array_equal(y, X + 1)
    s = popart.InferenceSession(str(tmp_path / "m.onnx"), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice())
    assert s.getInputTensorIds() == ["x"]
    # ... but a model whose external data was never loaded says so.
    unloaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    msg = _import_error(unloaded)
    assert "initializer 'w' keeps its data in the external file 'weights.bin', which was not loaded" in msg


def test_initializer_segment():
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.segment.begin, w.segment.end = 0, 6
    assert "initializer 'w' is one segment of a tensor split across several TensorProtos" \
        in _import_error(_add_w_model(w))


def test_sparse_initializer():
    model = _relu_model()
    values = numpy_helper.from_array(np.ones(2, np.float32), "s")
    indices = numpy_helper.from_array(np.array([0, 3], np.int64), "s_idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [6]))
    assert "sparse initializers ('s') are not supported" in _import_error(model)


def test_bad_tensors_inside_subgraphs_and_attributes():
    bad = numpy_helper.from_array(np.ones(3, np.float32), "k")
    bad.dims[:] = [4]
    ok = [N("Identity", ["cond"], ["cond_out"]), N("Add", ["acc", "k"], ["acc_out"])]
    model = _loop_model(ok)
    model.graph.node[2].attribute[0].g.initializer.append(bad)
    msg = _import_error(model)
    assert "subgraph 'body' (attribute 'body' of node 'loop' (Loop)): initializer 'k' has dims [4]" in msg
    model = make_model([N("Constant", [], ["c"], value=bad, name="const"), N("Add", ["x", "c"], ["y"])],
                       {"x": X}, ["y"])
    assert "node 'const' (Constant) attribute 'value' has dims [4] (4 float32 element(s), 16 bytes) but its " \
           "raw_data holds 12 bytes" in _import_error(model)


# declared outputs ------------------------------------------------------------------------------------
def test_declared_output_that_nothing_produces():
    model = make_model([N("Relu", ["x"], ["logit"])], {"x": X}, ["logits"])
    msg = _import_error(model, ["logits"])
    assert msg == ("graph output 'logits' is declared, but no node produces it and it is not a graph input or "
                   "initializer (similar names: 'logit').")
    model = make_model([N("Relu", ["x"], ["r"])], {"x": X}, ["y"])
    assert _import_error(model).endswith("is not a graph input or initializer.")
    model = make_model([N("Relu", ["x"], ["z"])], {"x": X}, [""])
    assert "a graph output has an empty name" in _import_error(model, ["z"])


def test_graph_outputs_that_are_inputs_or_initializers_are_accepted():
    model = make_model([N("Relu", ["x"], ["y"])], {"x": X}, ["y", "x", "w"], {"w": np.ones(2, np.float32)})
    y, x, w = run_session(model, {"x": X}, ["y", "x", "w"])
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(w, np.ones(2, np.float32))


def test_subgraph_output_nothing_produces():
    bad = [N("Identity", ["cond"], ["cond_out"]), N("Add", ["acc", "x"], ["acc_next"])]
    msg = _import_error(_loop_model(bad))
    assert "subgraph 'body' (attribute 'body' of node 'loop' (Loop)): graph output 'acc_out' is declared, but no " \
           "node produces it" in msg
    # A body may output a value of the enclosing scope directly.
    outer = [N("Identity", ["cond"], ["cond_out"])]
    (y,) = run_session(_loop_model(outer, ("cond_out", "x")), {"x": X}, ["y"])
    np.testing.assert_array_equal(y, X)


# element types ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("elem, name", [(TensorProto.STRING, "string"), (TensorProto.BFLOAT16, "bfloat16"),
                                        (TensorProto.INT4, "int4"), (TensorProto.FLOAT4E2M1, "float4e2m1"),
                                        (TensorProto.FLOAT8E4M3FN, "float8e4m3fn"),
                                        (TensorProto.COMPLEX64, "complex64"), (TensorProto.UNDEFINED, None)])
def test_inputs_of_types_popart_lacks(elem, name):
    model = _relu_model()
    model.graph.input[0].type.tensor_type.elem_type = elem
    msg = _import_error(model)
    if name is None:
        assert "model input 'x' has element type undefined: the element type is undefined (0)" in msg
    else:
        assert f"model input 'x' has element type {name}: {name} tensors are not supported" in msg
    assert "popart's element types: bool, float16, float32" in msg


def test_sequence_input():
    model = _relu_model()
    model.graph.input[0].type.CopyFrom(helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3])))
    assert "model input 'x' is declared as a sequence value; popart feeds tensors only" in _import_error(model)


@pytest.mark.parametrize("elem, name", [(TensorProto.STRING, "string"), (TensorProto.BFLOAT16, "bfloat16")])
def test_initializers_of_types_popart_lacks(elem, name):
    w = helper.make_tensor("w", elem, [1], [b"a"] if elem == TensorProto.STRING else [1.0])
    msg = _import_error(_add_w_model(w))
    assert f"initializer 'w' has element type {name}: {name} tensors are not supported" in msg


@pytest.mark.parametrize("to, name", [(TensorProto.STRING, "string"), (TensorProto.BFLOAT16, "bfloat16"),
                                      (TensorProto.INT4, "int4"), (TensorProto.FLOAT8E5M2, "float8e5m2"),
                                      (99, "99 (not an ONNX element type)")])
def test_cast_to_types_popart_lacks(to, name):
    model = make_model([N("Cast", ["x"], ["y"], to=to, name="cast")], {"x": X}, ["y"])
    msg = _import_error(model)
    assert msg.startswith("node 'cast' (Cast, opset 17): ")
    assert (f"{name} tensors are not supported" if to != 99 else f"element type {name}") in msg


def test_values_of_types_popart_lacks_computed_at_import():
    # Folded at import, a bfloat16 detour is fine: ONNX's reference implementation knows the type.
    c = numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "c_v")
    nodes = [N("Constant", [], ["c"], value=c), N("Cast", ["c"], ["b"], to=TensorProto.BFLOAT16),
             N("Cast", ["b"], ["f"], to=TensorProto.FLOAT), N("Add", ["x", "f"], ["y"])]
    x = np.ones(2, np.float32)
    (y,) = run_session(make_model(nodes, {"x": x}, ["y"]), {"x": x}, ["y"])
    np.testing.assert_array_equal(y, [2.5, -1.0])
    # Needed on the device, it is named.
    s = helper.make_tensor("s_v", TensorProto.STRING, [1], [b"text"])
    model = make_model([N("Constant", [], ["s"], value=s)], {"x": x}, ["s"])
    msg = _import_error(model, ["s"])
    assert re.search("tensor 's', computed at import, is needed on the device but string tensors are not "
                     "supported", msg), msg
