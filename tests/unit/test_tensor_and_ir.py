"""The tracing API: Ir, Graph, Tensor properties and operators, factories, contexts."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.tensor import Constant, Variable


def test_ir_identity_and_main_graph():
    a, b = popxl.Ir(), popxl.Ir()
    assert a != b and a == a and hash(a) != hash(b)
    assert repr(a) == f"Ir[id={a.id}]"
    with pytest.raises(TypeError):
        a == 3  # noqa: B015
    with a.main_graph as g:
        assert popxl.gcg() is g and popxl.gmg() is g and popxl.gir() is a
    with pytest.raises(RuntimeError, match="No graph"):
        popxl.gcg()


def test_graph_not_constructible_and_mixing_irs_fails():
    with pytest.raises(TypeError):
        popxl.Graph()
    a, b = popxl.Ir(), popxl.Ir()
    with a.main_graph:
        with pytest.raises(RuntimeError, match="different IRs"):
            with b.main_graph:
                pass


def test_tensor_properties():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((2, 3), np.float32), name="bob")
        c = popxl.constant(7, name="seven")
    assert isinstance(v, Variable) and isinstance(c, Constant)
    assert v.shape == (2, 3) and v.rank == 2 and v.nelms == 6 and v.dtype is popxl.float32
    assert v.spec == popxl.TensorSpec((2, 3), popxl.float32)
    assert v.name == "bob" and v.id == "bob" and v.ir is ir
    assert c.dtype is popxl.int32 and c.shape == ()  # Python int is downcast to int32
    assert repr(v) == "Variable[bob popxl.dtypes.float32 (2, 3)]"
    assert v.strides() == (12, 4) == np.zeros((2, 3), np.float32).strides
    assert len(v) == 2
    with pytest.raises(ValueError):
        len(c)
    with pytest.raises(RuntimeError):
        popxl.Tensor()
    with pytest.raises(TypeError):
        iter(v)
    assert v == v and v != c and len({v, c}) == 2


def test_variable_only_in_main_graph_and_dtype_conversion():
    ir = popxl.Ir()
    with ir.main_graph:
        v64 = popxl.variable(np.zeros(2, np.float64))
        assert v64.dtype is popxl.float32  # downcast
        keep = popxl.variable(np.zeros(2, np.float64), downcast=False)
        assert keep.dtype is popxl.float64
        h = popxl.variable([1, 2], popxl.float16)
        assert h.dtype is popxl.float16

        def fn(x):
            popxl.variable(1.0)
            return x

        with pytest.raises(ValueError, match="main graph"):
            ir.create_graph(fn, v64)


def test_tensor_spec_mapping():
    spec = popxl.TensorSpec((2,), popxl.int32)
    assert dict(**spec) == {"shape": (2,), "dtype": popxl.int32, "meta_shape": ()}
    assert spec.to_tuple() == ((2,), popxl.int32, ())
    assert hash(spec) == hash(popxl.TensorSpec((2,), popxl.int32))


def test_names_scopes_and_subgraph_ids():
    ir = popxl.Ir()
    with ir.main_graph:
        with popxl.name_scope("layer"):
            x = popxl.constant(1.0, name="x")
        assert x.id == "layer/x" and x.scope == "layer"
        x2 = popxl.constant(1.0, name="layer/x")
        assert x2.id.startswith("layer/x__t")

        def my_fn(a):
            return a + 1.0

        g = ir.create_graph(my_fn, x)
        assert g.id.startswith("test_names_scopes_and_subgraph_ids.my_fn_subgraph(")
        (inp,) = g.inputs
        assert inp.id == f"{g.id}/a" and inp.name == "a"
        assert g.outputs[0].graph is g


def test_operators_map_to_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 2), np.float32))
        exprs = {"add": a + 1, "add_r": 1 + a, "sub": a - 2, "sub_r": 2 - a, "mul": a * 3, "div": a / 4,
                 "mod": a % 2, "matmul": a @ a, "neg": -a, "pow": a ** 2, "rpow": 2 ** a,
                 "gt": a > 0.5, "lt": a < 0.5, "ge": a >= 1, "le": a <= 1}
        b = popxl.variable(np.ones(2, np.bool_))
        exprs.update({"and": b & b, "or": b | b, "not": ~b})
        d = {k: popxl.d2h_stream(t.shape, t.dtype, name=k) for k, t in exprs.items()}
        for k, t in exprs.items():
            ops.host_store(d[k], t)
        types = [op.type for op in ir.main_graph.ops if op.type != "host_store"]
        assert "matmul" in types and "negate" in types and "logical_not" in types
        c = a
        c += 1.0
        assert c is a and ir.main_graph.ops[-1].type == "add_"
    with popxl.Session(ir) as s:
        out = s.run()
    one = np.ones((2, 2), np.float32)
    want = {"add": one + 1, "add_r": 1 + one, "sub": one - 2, "sub_r": 2 - one, "mul": one * 3, "div": one / 4,
            "mod": np.fmod(one, 2), "matmul": one @ one, "neg": -one, "pow": one ** 2, "rpow": 2 ** one,
            "gt": one > 0.5, "lt": one < 0.5, "ge": one >= 1, "le": one <= 1, "and": [True, True],
            "or": [True, True], "not": [False, False]}
    for k, v in want.items():
        np.testing.assert_allclose(out[d[k]], v, err_msg=k)


def test_operator_scalars_take_the_tensor_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.variable(np.ones(2, np.float16))
        assert (h + 1).dtype is popxl.float16
        i = popxl.variable(np.ones(2, np.int32))
        assert (i * 2).dtype is popxl.int32
        with pytest.raises(ValueError, match="empty"):
            h + []


@pytest.mark.parametrize("key", [
    0, -1, 2, -3, slice(1, 3), slice(None, None, -1), slice(-3, None), slice(None, None, 2),
    slice(5, 0, -2), (Ellipsis, 1), (None, 1), (1, None, slice(0, 2)), (slice(0, 0),), (-1, -1),
    (Ellipsis, None), (slice(1, None), Ellipsis, 0),
])
def test_indexing_matches_numpy(key):
    data = np.arange(4 * 5, dtype=np.float32).reshape(4, 5)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(data)
        r = t[key]
        d = popxl.d2h_stream(r.shape, r.dtype)
        ops.host_store(d, r)
    expected = data[key]
    assert r.shape == expected.shape
    with popxl.Session(ir) as s:
        np.testing.assert_array_equal(s.run()[d], expected)


def test_indexing_with_tensors_and_errors():
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(data)
        idx = popxl.constant(np.array([3, 0, -1], np.int32))
        g = t[idx]
        mask = popxl.constant(data > 5)
        m = t[mask]
        dg, dm = popxl.d2h_stream(g.shape, g.dtype), popxl.d2h_stream(m.shape, m.dtype)
        ops.host_store(dg, g)
        ops.host_store(dm, m)
        with pytest.raises(TypeError, match="Cannot index"):
            t["a"]
        with pytest.raises(TypeError, match="Cannot index"):
            t[True]
        with pytest.raises(IndexError, match="out of bounds"):
            t[4]
        with pytest.raises(IndexError, match="too many"):
            t[0, 0, 0]
    with popxl.Session(ir) as s:
        out = s.run()
    np.testing.assert_array_equal(out[dg], data[[3, 0, -1]])
    np.testing.assert_array_equal(out[dm], np.where(data > 5, data, 0))


def test_views_alias_their_input():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((2, 3), np.float32), name="v")
        r = ops.reshape_(v, (3, 2))
        ops.add_(r, popxl.constant(np.arange(6, dtype=np.float32).reshape(3, 2)))
        tr = v.transpose_()
        ops.add_(ops.slice_(tr, start=0, stop=1, axis=0), popxl.constant(np.full((1, 2), 100.0, np.float32)))
        sl = ops.slice_(v, start=1, stop=2, axis=1)
        ops.add_(sl, popxl.constant(np.full((2, 1), 1000.0, np.float32)))
        d = popxl.d2h_stream((2, 3), popxl.float32)
        ops.host_store(d, v)
    with popxl.Session(ir) as s:
        out = s.run()[d]
    expected = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected.T[0] += 100
    expected[:, 1:2] += 1000
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(s.get_tensor_data(v), expected)


def test_in_place_write_is_seen_by_later_reads_only():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32))
        before = x * 1.0
        ops.relu_(ops.add_(x, popxl.constant(np.array([-5.0, 0.0, 5.0], np.float32))))
        after = x * 1.0
        d1, d2 = popxl.d2h_stream((3,), popxl.float32), popxl.d2h_stream((3,), popxl.float32)
        ops.host_store(d1, before)
        ops.host_store(d2, after)
    with popxl.Session(ir) as s:
        out = s.run()
    np.testing.assert_array_equal(out[d1], [1, 1, 1])
    np.testing.assert_array_equal(out[d2], [0, 1, 6])


def test_context_managers_validate():
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(TypeError):
            with popxl.in_sequence(None):
                pass
        with popxl.in_sequence(True), popxl.ipu(1), popxl.io_tiles():
            t = popxl.constant(1.0) + 1.0
        assert t.ipu == 1 and t.tile_set == "io"
        with popxl.in_sequence(False), popxl.in_sequence("pass"):
            pass


def test_op_created_hooks():
    ir = popxl.Ir()
    seen = []
    ctx = popxl.context.get_current_context()
    handle = ctx.register_op_created_hook(lambda op: seen.append(op.type))
    with ir.main_graph:
        h2 = ir.main_graph.register_op_created_hook(lambda op: seen.append("g:" + op.type))
        popxl.constant(1.0) + 2.0
        ir.main_graph.remove_op_created_hook(h2)
    ctx.remove_op_created_hook(handle)
    assert seen == ["add", "g:add"]


def test_graph_properties():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(1.0)
        c = popxl.constant(2.0)
        y = v + c
    g = ir.main_graph
    assert v in g.variables and c in g.constants and y in g.tensors and y in g
    with pytest.raises(TypeError):
        1 in g  # noqa: B015
    assert g.get_tensor(y.id) is y
    assert [op.type for op in g.ops] == ["add"]
    assert repr(g) == "Graph[id='' (main graph) name=main]"


def test_copy_to_ipu_and_io_tiles():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.arange(3, dtype=np.float32))
        on1 = v.copy_to_ipu(1, 0)
        assert on1.ipu == 1
        io = ops.io_tile_copy(on1)
        assert io.tile_set == "io" and ops.io_tile_copy(io).tile_set == "compute"
        d = popxl.d2h_stream((3,), popxl.float32)
        ops.host_store(d, io)
        with pytest.raises(ValueError, match="destination"):
            ops.ipu_copy(v, -1)
    with popxl.Session(ir) as s:
        np.testing.assert_array_equal(s.run()[d], [0, 1, 2])


def test_stream_sets_and_stream_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.h2d_stream((2,), popxl.float32, "a")
        unused = popxl.h2d_stream((2,), popxl.float32, "unused")
        out = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(out, ops.host_load(a))
        assert ir.get_all_h2d_streams() == {a} and ir.get_all_d2h_streams() == {out}
        assert a.shape == (2,) and a.dtype is popxl.float32 and a.tensor_id == "a" and unused.tensor_id == "unused"
        assert popxl.h2d_stream((1,), popxl.int32).tensor_id == "h2d_stream"
        with pytest.raises(TypeError, match="HostToDeviceStream"):
            ops.host_load(out)
        with pytest.raises(TypeError, match="popxl dtype"):
            popxl.h2d_stream((2,), "float32")
    with pytest.raises(NotImplementedError):
        popxl.HostToDeviceStream()
    with pytest.raises(RuntimeError, match="No graph"):
        popxl.d2h_stream((1,), popxl.float32)
