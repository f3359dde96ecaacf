"""The Python kernels behind custom ops, and misuse of the creation surface: a kernel's outputs are
checked (count, shape, dtype) with a message naming the op, its inputs are handed over read-only
(a write into one cannot change a variable), and createOpInGraph given the wrong kind of output ids
raises TypeError leaving the graph as it was."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popart._internal.ir import addons_bindings as bindings
from popxl.context import get_current_context
from popxl.op import REGISTRY, OpDef, create_op, register
from popxl.ops.utils import spec

from engine_harness import engine

ENGINES = ["native", "reference"]


@pytest.fixture
def python_op():
    """Registers a two-output op whose kernel the test chooses; removed afterwards."""
    kernels = {}
    register(OpDef("test_kernel_checks", lambda specs: [spec(specs[0].shape, specs[0].dtype)] * 2,
                   lambda x: kernels["fn"](x), family="test"))
    yield kernels
    REGISTRY.pop("test_kernel_checks", None)


def _run(engine_name, kernel_fn, kernels):
    kernels["fn"] = kernel_fn
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
        a, b = create_op("test_kernel_checks", [w])
        streams = []
        for i, t in enumerate((a, b)):
            streams.append(popxl.d2h_stream(t.shape, t.dtype, f"out{i}"))
            ops.host_store(streams[-1], t)
    with engine(engine_name):
        s = popxl.Session(ir, "ipu_model")
    with s:
        out = s.run()
    return s, w, [out[st] for st in streams]


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("fn, message", [
    (lambda x: (x + 1,), r"NumPy kernel of 'test_kernel_checks' \(.*\) returned 1 value\(s\), expected 2"),
    (lambda x: (x + 1, x, x), r"returned 3 value\(s\), expected 2"),
    (lambda x: (x + 1, np.zeros(3, np.float32)), r"returned \(3,\) float32, expected \(2,\) float32"),
    (lambda x: (x + 1, x.astype(np.float64)), r"returned \(2,\) float64, expected \(2,\) float32"),
])
def test_kernel_outputs_are_checked_naming_the_op(engine_name, python_op, fn, message):
    with pytest.raises(RuntimeError, match=message):
        _run(engine_name, fn, python_op)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_a_kernel_cannot_write_into_its_input(engine_name, python_op):
    def writes(x):
        x[0] = 100.0  # the variable's device memory, if it were allowed
        return x + 1, x

    with pytest.raises(ValueError, match="read-only"):
        _run(engine_name, writes, python_op)
    s, w, (a, b) = _run(engine_name, lambda x: (x + 1, x.copy()), python_op)
    np.testing.assert_array_equal(a, [2.0, 3.0])
    np.testing.assert_array_equal(s.get_tensor_data(w), [1.0, 2.0])


@pytest.mark.parametrize("outputs, message", [
    ({0: 5}, "output 0 must be named by a tensor id"),
    ({"zero": "y"}, "outputs must map output indices"),
    ([("y",)], "outputs must map output indices"),
])
def test_create_op_in_graph_with_wrong_output_ids_leaves_the_graph_unchanged(outputs, message):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((1, 4, 2, 4), np.float32), name="x")
        s = popxl.variable(np.zeros((1, 4, 2), np.float32), name="s")
        ctx, g = get_current_context(), ir.main_graph
        before = [op.type for op in g.ops], sorted(t.id for t in g.tensors)
        with pytest.raises(TypeError, match=message):
            bindings.RotaryPosEmbedOp.createOpInGraph(g._pb_graph, {0: x.id, 1: s.id, 2: s.id}, outputs, 4,
                                                      ctx._get_op_settings("rope"))
        assert ([op.type for op in g.ops], sorted(t.id for t in g.tensors)) == before
