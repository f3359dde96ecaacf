"""Function expansion at import (popart.onnx.functions): model-local functions, as exporters emit
them, and ONNX's standard function bodies for ops without an entry of their own."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import popart
from popart.onnx import OPS
from popart.onnx.functions import expand_functions
from popart_helpers import check_against_reference, make_model, run_session

rng = np.random.default_rng(7)
N = helper.make_node


def _with_functions(model: onnx.ModelProto, *functions: onnx.FunctionProto, domain: str = "local") -> onnx.ModelProto:
    model.functions.extend(functions)
    model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


def _scaled_tanh(body_opset: int = 17) -> onnx.FunctionProto:
    # y = tanh(x) * alpha, alpha an attribute reference with a default of 2.0
    alpha = helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT)
    alpha.name = "value_float"
    nodes = [N("Tanh", ["x"], ["t"]),
             onnx.helper.make_node("Constant", [], ["a"]),
             N("Mul", ["t", "a"], ["y"])]
    nodes[1].attribute.append(alpha)
    f = helper.make_function("local", "ScaledTanh", ["x"], ["y"], nodes,
                             [helper.make_opsetid("", body_opset)], attributes=[])
    f.attribute_proto.append(helper.make_attribute("alpha", 2.0))
    return f


def test_local_function_with_attribute_reference_and_default() -> None:
    x = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [N("ScaledTanh", ["x"], ["y"], domain="local", alpha=0.5), N("ScaledTanh", ["y"], ["z"], domain="local")]
    model = _with_functions(make_model(nodes, {"x": x}, ["y", "z"]), _scaled_tanh())
    y, z = run_session(model, {"x": x}, ["y", "z"])
    np.testing.assert_allclose(y, np.tanh(x) * 0.5, rtol=1e-6)
    np.testing.assert_allclose(z, np.tanh(np.tanh(x) * 0.5) * 2.0, rtol=1e-6)


def test_local_function_calling_a_standard_function_and_another_local_one() -> None:
    # outer(x) = ScaledTanh(Swish(x)): Swish has no entry; its standard body (opset 24) is used
    outer = helper.make_function("local", "Outer", ["x"], ["y"],
                                 [N("Swish", ["x"], ["s"], alpha=1.5), N("ScaledTanh", ["s"], ["y"], domain="local")],
                                 [helper.make_opsetid("", 24), helper.make_opsetid("local", 1)])
    x = rng.standard_normal((2, 5)).astype(np.float32)
    model = _with_functions(make_model([N("Outer", ["x"], ["y"], domain="local")], {"x": x}, ["y"], opset=24),
                            _scaled_tanh(), outer)
    assert "Swish" not in OPS
    want = np.tanh(x / (1 + np.exp(-1.5 * x))) * 2.0
    np.testing.assert_allclose(run_session(model, {"x": x}, ["y"])[0], want, rtol=1e-5, atol=1e-6)


def test_a_body_keeps_its_own_opset() -> None:
    # The model is at opset 18 (ReduceSum's axes an input); the function body at opset 11 (axes an
    # attribute). Read with the model's opset, the attribute would be ignored and all axes summed.
    f = helper.make_function("local", "RowSum", ["x"], ["y"], [N("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)],
                             [helper.make_opsetid("", 11)])
    x = rng.standard_normal((3, 4)).astype(np.float32)
    model = _with_functions(make_model([N("RowSum", ["x"], ["y"], domain="local")], {"x": x}, ["y"], opset=18), f)
    expanded, opsets = expand_functions(model, OPS, 18)
    assert [n.op_type for n in expanded.graph.node] == ["ReduceSum"] and opsets == [11]
    np.testing.assert_allclose(run_session(model, {"x": x}, ["y"])[0], x.sum(1), rtol=1e-5)


@pytest.mark.parametrize("node,inputs,opset", [
    (N("RMSNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-3),
     {"x": rng.standard_normal((2, 3, 8)).astype(np.float32), "s": rng.standard_normal(8).astype(np.float32)}, 23),
    (N("Swish", ["x"], ["y"], alpha=0.7), {"x": rng.standard_normal((3, 4)).astype(np.float32)}, 24),
    (N("Attention", ["q", "k", "v"], ["y"], is_causal=1),
     {k: rng.standard_normal((2, 4, 6, 8)).astype(np.float32) for k in "qkv"}, 23),
], ids=["RMSNormalization", "Swish", "Attention-causal"])
def test_standard_function_bodies_match_the_reference(node, inputs, opset) -> None:
    assert node.op_type not in OPS  # expanded, not an entry
    model = make_model([node], inputs, ["y"], opset=opset)
    check_against_reference(model, inputs, ["y"], rtol=1e-5, atol=1e-5)


def test_ops_without_a_definition_are_still_reported_unsupported() -> None:
    x = np.zeros((2, 2), np.float32)
    model = make_model([N("Unique", ["x"], ["y"], name="u")], {"x": x}, ["y"])
    with pytest.raises(popart.OnnxImportError, match="Unique: u"):
        run_session(model, {"x": x}, ["y"])


def test_expansion_leaves_a_model_without_functions_untouched() -> None:
    x = np.zeros((2, 2), np.float32)
    model = make_model([N("Relu", ["x"], ["y"])], {"x": x}, ["y"])
    out, opsets = expand_functions(model, OPS, 17)
    assert out is model and opsets == [17]


def test_expanded_values_do_not_clash_with_the_models_names() -> None:
    # Two calls of one function, and model values named like the body's ("t", "a"): each call's
    # values are its own.
    x = rng.standard_normal((3,)).astype(np.float32)
    nodes = [N("ScaledTanh", ["x"], ["t"], domain="local"), N("ScaledTanh", ["t"], ["a"], domain="local"),
             N("Add", ["t", "a"], ["y"])]
    model = _with_functions(make_model(nodes, {"x": x}, ["y"]), _scaled_tanh())
    t = np.tanh(x) * 2
    np.testing.assert_allclose(run_session(model, {"x": x}, ["y"])[0], t + np.tanh(t) * 2, rtol=1e-6)
