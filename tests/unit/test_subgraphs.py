"""create_graph binding rules, call/repeat/conditional and their site infos, by-ref inputs."""
from typing import List

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import TensorByRef


def _run(ir, *tensors):
    with ir.main_graph:
        streams = []
        for t in tensors:
            d = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(d, t)
            streams.append(d)
    with popxl.Session(ir) as s:
        out = s.run()
    return [out[d] for d in streams]


def test_implicit_capture_is_a_clear_error():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones(2, np.float32), name="weights")

        def uses_parent(x):
            return x * w

        with pytest.raises(ValueError) as e:
            ir.create_graph(uses_parent, w)
    msg = str(e.value)
    assert "'weights'" in msg and "inputs_dict" in msg and "argument" in msg and "test_subgraphs.py" in msg


def test_create_graph_binding_rules():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32))
        b = popxl.variable(np.ones((3,), np.int32))

        def fn(x, ys: List[popxl.Tensor], *args, scale=2.0, **kw):
            return [x * scale] + list(ys) + list(args) + [kw["k"]]

        g = ir.create_graph(fn, a, [b, b], a, k=b)
        assert [t.name for t in g.inputs] == ["x", "ys_0", "ys_1", "args_0", "k"]
        assert len(g.outputs) == 5
        with pytest.raises(ValueError, match="signature"):
            ir.create_graph(lambda x: x, a, a)
        with pytest.raises(TypeError, match="mixes"):
            ir.create_graph(lambda xs: xs[0], [a, 1])
        with pytest.raises(ValueError, match="must return"):
            ir.create_graph(lambda x: 3, a)
        with pytest.raises(TypeError, match="Module or a function"):
            ir.create_graph(3, a)
        spec_g = ir.create_graph(lambda x: x + 1, popxl.TensorSpec((4,), popxl.float16))
        assert spec_g.inputs[0].shape == (4,) and spec_g.inputs[0].dtype is popxl.float16


def test_call_binding_errors_and_site_info():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))

        def fn(a, b):
            c = popxl.graph_input((2,), popxl.float32, "c")
            return a + b + c, a - b

        g = ir.create_graph(fn, x, x)
        assert [t.name for t in g.inputs] == ["a", "b", "c"]
        with pytest.raises(ValueError, match="not connected"):
            ops.call(g, x, x)
        with pytest.raises(ValueError, match="positional"):
            ops.call(g, x, x, x, x)
        with pytest.raises(ValueError, match="given twice"):
            ops.call(g, x, x, x, inputs_dict={g.inputs[0]: x})
        with pytest.raises(ValueError, match="not an input"):
            ops.call(g, x, x, inputs_dict={x: x})
        with pytest.raises(ValueError, match=r"expects \(2,\) float32"):
            ops.call(g, x, x, popxl.constant(np.ones(3, np.float32)))
        info = ops.call_with_info(g, x, np.full(2, 2.0), inputs_dict={g.inputs[2]: x})  # host array -> constant
        assert info.called_graph is g
        assert info.parent_input(0) is x and info.parent_input(2) is x
        assert info.graph_to_parent(g.outputs[1]) is info.outputs[1]
        assert info.parent_to_graph(x) is g.inputs[0]
        assert info.parent_to_graph_input_index(1) == 1 and info.graph_to_parent_input_index(2) == 2
        with pytest.raises(ValueError):
            info.graph_to_parent(x)
    y0, y1 = _run(ir, *info.outputs)
    np.testing.assert_array_equal(y0, [4, 4])
    np.testing.assert_array_equal(y1, [-1, -1])


def test_by_ref_input_updates_parent_variable():
    def increment(v: TensorByRef, amount: popxl.Tensor):
        ops.add_(v, amount)

    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(3, np.float32), name="counter")
        amount = popxl.constant(np.array([1, 2, 3], np.float32))
        g = ir.create_graph(increment, v, amount)
        assert g.is_input_by_ref(g.inputs[0])
        ops.call(g, v, amount)
        ops.repeat(g, 3, v, amount)
        snapshot = v * 1.0

        def by_value(x, a):
            ops.add_(x, a)

        g2 = ir.create_graph(by_value, v, amount)
        ops.call(g2, v, amount)  # by value: the parent does not change
    (snap,) = _run(ir, snapshot)
    np.testing.assert_array_equal(snap, [4, 8, 12])


def test_set_parent_input_modified():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, np.float32))

        def fn(x):
            ops.add_(x, popxl.constant(np.ones(2, np.float32)))

        g = ir.create_graph(fn, v)
        info = ops.call_with_info(g, v)
        info.set_parent_input_modified(v)
        out = v + 0.0
    (o,) = _run(ir, out)
    np.testing.assert_array_equal(o, [1, 1])


def test_repeat_rules():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda a: (a * 2.0, a), x)
        with pytest.raises(ValueError, match="at least as many"):
            ops.repeat(g, 2, x)
        g1 = ir.create_graph(lambda a: a * 2.0, x)
        with pytest.raises(ValueError, match="repeat_count"):
            ops.repeat(g1, -1, x)
        (zero,) = ops.repeat(g1, 0, x)
        (four,) = ops.repeat(g1, 4, x)
        g_bad = ir.create_graph(lambda a: ops.cast(a, popxl.int32), x)
        with pytest.raises(ValueError, match="loop-carried"):
            ops.repeat(g_bad, 2, x)
    z, f = _run(ir, zero, four)
    np.testing.assert_array_equal(z, [1, 1])
    np.testing.assert_array_equal(f, [16, 16])


def test_swapping_loop_carried_values():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.constant(np.float32(1))
        b = popxl.constant(np.float32(2))
        g = ir.create_graph(lambda x, y: (y, x), a, b)
        x3, y3 = ops.repeat(g, 3, a, b)
    x, y = _run(ir, x3, y3)
    assert (x, y) == (2, 1)


def test_conditional():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32))
        then_g = ir.create_graph(lambda a: a * 10.0, x)
        else_g = ir.create_graph(lambda a: a - 10.0, x)
        (yes,) = ops.conditional(popxl.constant(True), then_g, else_g, [x], [x])
        info = ops.conditional_with_info(popxl.constant(False), then_g, else_g, [x], [x])
        assert info.called_graph == (then_g, else_g)
        assert info.outputs[0].name.startswith(f"{then_g.outputs[0].name}_or_{else_g.outputs[0].name}")
        bad = ir.create_graph(lambda a: ops.cast(a, popxl.int32), x)
        with pytest.raises(ValueError, match="branch output 0 differs"):
            ops.conditional(popxl.constant(True), then_g, bad, [x], [x])
        with pytest.raises(ValueError, match="scalar bool"):
            ops.conditional(x, then_g, else_g, [x], [x])

        def by_ref(a: TensorByRef):
            return a + 0.0

        with pytest.raises(NotImplementedError, match="by-reference"):
            ops.conditional(popxl.constant(True), ir.create_graph(by_ref, x), else_g, [x], [x])
    y, n = _run(ir, yes, info.outputs[0])
    np.testing.assert_array_equal(y, [10, 20])
    np.testing.assert_array_equal(n, [-9, -8])


def test_nested_subgraphs():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))

        def inner(a):
            return a + 1.0

        def outer(a):
            gi = popxl.gir().create_graph(inner, a)
            (b,) = ops.call(gi, a)
            (c,) = ops.repeat(gi, 3, b)
            return c

        g = ir.create_graph(outer, x)
        (y,) = ops.call(g, x)
        assert len(g.called_graphs) == 1
    (out,) = _run(ir, y)
    np.testing.assert_array_equal(out, [5, 5])


def test_empty_graph_and_graph_input_output():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
    g = ir.create_empty_graph("manual")
    with g:
        a = popxl.graph_input((2,), popxl.float32, "a")
        popxl.graph_output(a * 3.0)
        with pytest.raises(ValueError, match="not in the current graph"):
            popxl.graph_output(x)
    with ir.main_graph:
        (y,) = ops.call(g, x)
    (out,) = _run(ir, y)
    np.testing.assert_array_equal(out, [3, 3])


def _nested(depth: int):
    """A chain of ``depth - 1`` graphs, each calling the next, under the main graph (``depth``
    graphs in one another); the innermost computes a * a + 1."""
    ir = popxl.Ir()
    spec = popxl.TensorSpec((2,), popxl.float32)
    with ir.main_graph:
        g = ir.create_graph(lambda a: a * a + 1.0, spec)
        for _ in range(depth - 2):
            g = ir.create_graph(lambda a, inner=g: ops.call(inner, a)[0], spec)
    return ir, g


@pytest.mark.parametrize("engine_name", ["native", "reference"])
def test_deep_nesting_works_up_to_the_documented_depth_and_autodiffs(engine_name):
    from engine_harness import engine
    from popxl.ops.call import MAX_CALL_DEPTH
    ir, g = _nested(MAX_CALL_DEPTH)
    with ir.main_graph:
        x_s, y_s, d_s = (popxl.h2d_stream((2,), popxl.float32, "x"), popxl.d2h_stream((2,), popxl.float32, "y"),
                         popxl.d2h_stream((2,), popxl.float32, "dx"))
        info = ops.call_with_info(g, ops.host_load(x_s))
        grads = popxl.transforms.autodiff(g)
        (dx,) = ops.call(grads.graph, popxl.constant(np.ones(2, np.float32)), inputs_dict=grads.inputs_dict(info))
        ops.host_store(y_s, info.outputs[0])
        ops.host_store(d_s, dx)
    x = np.array([2.0, -3.0], np.float32)
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    with session as s:
        out = s.run({x_s: x})
    np.testing.assert_array_equal(out[y_s], x * x + 1)
    np.testing.assert_array_equal(out[d_s], 2 * x)


def test_nesting_deeper_than_the_limit_is_refused_naming_the_depth():
    from popxl.ops.call import MAX_CALL_DEPTH
    ir, g = _nested(MAX_CALL_DEPTH)
    with ir.main_graph:
        outer = ir.create_graph(lambda a: ops.call(g, a)[0], popxl.TensorSpec((2,), popxl.float32))
        with pytest.raises(ValueError, match=rf"ops.call \(at .*\): calling graph .* would nest {MAX_CALL_DEPTH + 1} "
                                             rf"graphs in one another .* popxl takes at most {MAX_CALL_DEPTH}"):
            ops.call(outer, popxl.constant(np.zeros(2, np.float32)))
