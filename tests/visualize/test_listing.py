"""print(graph) / str(ir): the typed listing."""
import re

import numpy as np

import popxl
import popxl.ops as ops
from models import mlp


def test_main_graph_repr_names_it():
    ir = popxl.Ir()
    assert repr(ir.main_graph) == "Graph[id='' (main graph) name=main]"
    assert repr(ir) == f"Ir[id={ir.id}]"


def test_subgraph_listing_is_typed_one_line_per_op():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda a, b: ops.softmax(a @ b, axis=1),
                            popxl.TensorSpec((2, 3), popxl.float32), popxl.TensorSpec((3, 5), popxl.float32))
    lines = str(g).splitlines()
    assert lines[0] == f"graph {g.id}(a:float32[2,3], b:float32[3,5]) {{"
    assert lines[1] == "  matmul:float32[2,5] = matmul(a:float32[2,3], b:float32[3,5])"
    assert lines[2] == "  softmax:float32[2,5] = softmax[axis=1](matmul:float32[2,5])"
    assert lines[3] == "  return (softmax:float32[2,5])"
    assert lines[4] == "}"
    assert len(lines) == 5


def test_main_graph_lists_variables_constants_streams_and_nests_bodies():
    ir = mlp(layers=2, train=True)
    text = str(ir.main_graph)
    assert text.startswith("graph main_graph {")
    assert "variables: layer0/w:float32[8,8], layer0/b:float32[8], layer1/w:float32[8,8]" in text
    assert "constants: layer0/dy:float32[4,8]" in text
    assert "streams: x:float32[4,8] (host->device), y:float32[4,8] (device->host)" in text
    # every op of every graph is one line, bodies nested one level deeper than their call
    n_ops = sum(len(g.ops) for g in ir._all_graphs())
    op_lines = [line for line in text.splitlines() if re.search(r"\b[a-z_]+(\[.*\])?\(.*\)$", line)
                and not line.lstrip().startswith(("graph ", "return "))]
    assert len(op_lines) == n_ops
    call = next(i for i, line in enumerate(text.splitlines()) if "= call[graph=Linear_subgraph(0)]" in line)
    body = text.splitlines()[call + 1]
    assert body.startswith("    graph Linear_subgraph(0)(layer0/x:float32[4,8]")
    assert "gelu_grad:float32[4,8] = gelu_grad(" in text
    assert "scaled_add_[a=1, b=-0.1](layer0/w:float32[8,8], " in text
    assert "host_store[stream=y](" in text


def test_repeated_body_is_listed_once_and_referred_to():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        g = ir.create_graph(lambda t: t + 1.0, x)
        (y,) = ops.call(g, x)
        (z,) = ops.call(g, y)
        (r,) = ops.repeat(g, 4, z)
    text = str(ir)
    assert text.count(f"graph {g.id}(t:float32[3]) {{") == 1
    assert text.count(f"graph {g.id}: listed above") == 2
    assert f"repeat[graph={g.id}, repeat_count=4]" in text
    assert "constants: c:float32[] = 1.0" in text or "= 1.0" in text


def test_conditional_branches_nested_and_uncalled_graphs_listed():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")
        cond = popxl.constant(True, name="cond")
        then_g = ir.create_graph(lambda t: t * 2.0, x)
        else_g = ir.create_graph(lambda t: t - 2.0, x)
        ops.conditional(cond, then_g, else_g, then_inputs=[x], else_inputs=[x])
        lonely = ir.create_graph(lambda t: ops.relu(t), x)
    text = str(ir)
    assert text.splitlines()[0] == f"Ir[id={ir.id}]: replication_factor=1, num_host_transfers=1"
    assert f"then_graph={then_g.id}, else_graph={else_g.id}" in text
    assert f"    graph {then_g.id}(t:float32[2]) {{" in text and f"    graph {else_g.id}(t:float32[2]) {{" in text
    # a graph nobody calls comes after the main graph, at the top level
    assert f"\ngraph {lonely.id}(t:float32[2]) {{" in text


def test_long_attributes_are_cut():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((1,) * 30, np.float32), name="x")
        ops.reshape(x, (1,) * 30)
    line = next(line for line in str(ir.main_graph).splitlines() if "= reshape[" in line)
    shape_attr = re.search(r"shape=([^\]]*)\]", line).group(1)
    assert shape_attr.endswith("...") and len(shape_attr) <= 48
