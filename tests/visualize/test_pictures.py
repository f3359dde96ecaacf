"""Pictures (Graphviz through pygraphviz's bundled libraries) and PopXL's .dot checkpoints."""
import re
import xml.etree.ElementTree as ET

import numpy as np
import pygraphviz
import pytest

import popxl
import popxl.ops as ops
from popxl.visualize import DrawOptions, to_dot, to_svg
from models import mlp

SVG = "{http://www.w3.org/2000/svg}"


def _texts(svg: str):
    return [t.text or "" for t in ET.fromstring(svg).iter(SVG + "text")]


def _clusters(svg: str):
    return [g for g in ET.fromstring(svg).iter(SVG + "g") if g.get("class") == "cluster"]


def test_mlp_with_gradients_picture_shows_ops_types_and_clusters():
    ir = mlp(layers=2, train=True)
    svg = ir._repr_svg_()
    assert svg is not None and svg.lstrip().startswith("<?xml")
    texts = _texts(svg)
    # every op type of every graph appears, and tensors carry their types
    for g in ir._all_graphs():
        for op in g.ops:
            assert op.type in texts, op.type
    assert "layer0/matmul:float32[4,8]" in texts
    assert "layer0/w:float32[8,8]" in texts and "variable" in texts and "constant" in texts
    assert "x:float32[4,8]" in texts and "host->device" in texts and "device->host" in texts
    # the main graph and one cluster per distinct layer / gradient structure (the 2 layers are alike)
    titles = [next(c.iter(SVG + "text")).text for c in _clusters(svg)]
    assert titles[0] == "main graph main_graph"
    assert "graph Linear_subgraph(0) and 1 like it (2 call sites)" in titles
    assert any(t.startswith("graph Linear_grad_subgraph(1) and 1 like it") for t in titles)
    assert len(titles) == 3


def test_twelve_layer_model_stays_small():
    ir = mlp(layers=12, train=True)
    dot = to_dot(ir)
    nodes = re.findall(r"^\s*(n\d+) \[", dot, flags=re.M)
    assert len(nodes) < 250
    assert dot.count("subgraph cluster_") == 3
    svg = to_svg(ir)
    assert len(_clusters(svg)) == 3
    width, height = (float(v) for v in re.search(r'viewBox="0\.00 0\.00 ([\d.]+) ([\d.]+)"', svg).groups())
    assert width < 4000 and height < 6000  # readable when scaled to a notebook's width


def test_graph_picture_without_ir_and_budget_collapses_called_graphs():
    ir = mlp(layers=3, train=False)
    small = to_dot(ir, DrawOptions(max_nodes=40, depth=0))
    assert small.count("subgraph cluster_") == 1
    assert "(3 ops, not drawn)" in small
    one = to_dot(ir.main_graph.called_graphs[0])
    assert one.count("subgraph cluster_") == 1 and "output 0" in one


def test_large_flat_graph_folds_name_scopes_then_pages():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((3, 3), np.float32), name="x")
        for i in range(40):
            with popxl.name_scope(f"block{i}"):
                x = ops.softmax(ops.gelu(x @ x) + x, axis=1)
    folded = to_dot(ir, DrawOptions(max_nodes=60))
    assert "block7/" in folded and "4 ops: " in folded
    assert len(re.findall(r"shape=\"box3d\"", folded)) == 40
    ir2 = popxl.Ir()
    with ir2.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        for _ in range(250):
            x = ops.relu(x)
    page1 = to_dot(ir2, DrawOptions(max_nodes=100))
    page3 = to_dot(ir2, DrawOptions(max_nodes=100, page=3))
    assert "page 1 of 3" in page1 and "next: DrawOptions(page=2)" in page1
    assert "page 3 of 3" in page3 and "from page 2" in page3 and "output" not in page1
    assert len(re.findall(r"<b>relu</b>", page1)) == 100 and len(re.findall(r"<b>relu</b>", page3)) == 50
    pygraphviz.AGraph(string=page3).layout(prog="dot")  # valid DOT


def test_draw_options_are_checked():
    with pytest.raises(ValueError, match="max_nodes"):
        DrawOptions(max_nodes=3)
    with pytest.raises(ValueError, match="page"):
        DrawOptions(page=0)
    with pytest.raises(TypeError, match="popxl.Graph or popxl.Ir"):
        to_dot("main")


def _model_with_checkpoints(tmp_path, save_dir=None):
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(3, np.float32), name="a")
        c = a + a
        ir.dot_checkpoint("Foo", save_dir)
        ops.gelu(c * a)
        ir.dot_checkpoint("Bar", save_dir)
    return ir


@pytest.mark.parametrize("env, written", [(None, {"Foo", "Bar"}), ("", set()), ("FOO", {"Foo"}),
                                          ("foo:BAR", {"Foo", "Bar"}), ("ALL", {"Foo", "Bar"}),
                                          ("FINAL", set())])
def test_dot_checkpoint_follows_popart_dot_checks(tmp_path, monkeypatch, env, written):
    if env is None:
        monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    else:
        monkeypatch.setenv("POPART_DOT_CHECKS", env)
    _model_with_checkpoints(tmp_path, tmp_path / "dots")
    files = {p.name for p in (tmp_path / "dots").glob("*.dot")} if (tmp_path / "dots").exists() else set()
    assert files == {f"{check}_all.dot" for check in written}


def test_dot_checkpoint_files_are_graphviz_and_snapshot_the_ir(tmp_path, monkeypatch):
    monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    monkeypatch.chdir(tmp_path)
    _model_with_checkpoints(tmp_path)  # no save_dir: the working directory
    foo, bar = (pygraphviz.AGraph(filename=str(tmp_path / f"{c}_all.dot")) for c in ("Foo", "Bar"))
    assert "<b>add</b>" in foo.to_string() and "<b>gelu</b>" not in foo.to_string()
    assert "<b>gelu</b>" in bar.to_string() and "<b>mul</b>" in bar.to_string()
    bar.layout(prog="dot")


def test_save_dir_is_kept_for_later_checkpoints(tmp_path, monkeypatch):
    monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    monkeypatch.chdir(tmp_path)
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(1.0) + 1.0
    ir.dot_checkpoint("first", tmp_path / "keep")
    ir.dot_checkpoint("second")
    assert {p.name for p in (tmp_path / "keep").iterdir()} == {"first_all.dot", "second_all.dot"}
    with pytest.raises(ValueError, match="check must be a non-empty str"):
        ir.dot_checkpoint("")


# Unset, the model's own checkpoints turn every check on (PopXL sets dotChecks to ALL), FINAL included.
@pytest.mark.parametrize("env, final", [(None, True), ("FOO", False), ("FINAL", True), ("foo:all", True)])
def test_session_writes_the_final_checkpoint_when_asked(tmp_path, monkeypatch, env, final):
    if env is None:
        monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    else:
        monkeypatch.setenv("POPART_DOT_CHECKS", env)
    monkeypatch.chdir(tmp_path)
    ir = _model_with_checkpoints(tmp_path, tmp_path / "dots")
    popxl.Session(ir)
    written = (tmp_path / "dots" / "FINAL_all.dot").exists()
    assert written == final
    if final:  # the program as compiled: every op of the model
        text = (tmp_path / "dots" / "FINAL_all.dot").read_text()
        assert "<b>gelu</b>" in text and "<b>mul</b>" in text


_double = lambda a: a * 2.0  # noqa: E731  (a module-level lambda: its graph is '<lambda>_subgraph(0)')


def test_names_of_any_text_are_quoted_and_cannot_add_attributes():
    """Graph names from lambdas ('<lambda>_subgraph(0)') and tensor / op names holding quotes,
    backslashes, newlines and DOT syntax stay text: the source parses, the names come back whole
    and no attribute comes from them."""
    ir = popxl.Ir()
    evil = '<x>, URL="http://example.com/evil", label="<b>'
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32), name=evil)
        w = popxl.variable(np.ones(2, np.float32), name="back\\slash\nnew line <tag> & \"q\"")
        g = ir.create_graph(_double, v)
        (y,) = ops.call(g, v)
        ops.add(y, w)
    assert "<lambda>" in [graph.name for graph in ir._all_graphs()]
    source = to_dot(ir)
    parsed = pygraphviz.AGraph(string=source)
    for node in parsed.iternodes():
        assert node.attr.get("URL") in (None, ""), node
    assert any("<lambda>" in (sub.graph_attr.get("label") or "") for sub in parsed.subgraphs())
    parsed.layout(prog="dot")
    texts = _texts(to_svg(ir))  # the rendered lines: the names as the user wrote them
    assert evil + ":float32[2]" in texts
    assert "back\\slash" in texts and 'new line <tag> & "q":float32[2]' in texts
    assert any(t.startswith("graph ") and t.endswith("<lambda>_subgraph(0)") for t in texts)


@pytest.mark.parametrize("check", ["../../x", "a/b", "..", "a\\b", "nul\0"])
def test_checkpoint_names_cannot_leave_the_save_dir(tmp_path, check):
    ir = mlp(layers=1, train=False)
    with pytest.raises(ValueError, match="dot_checkpoint: check .* names a file in the save directory"):
        ir.dot_checkpoint(check, tmp_path / "dots")
    assert not any(tmp_path.rglob("*.dot"))


def test_tooltips_name_the_line_relative_to_the_current_directory(monkeypatch, tmp_path):
    """An op's tooltip says where it was made: below the current directory as a relative path (a
    picture drawn in a checkout carries no absolute path of the machine), elsewhere as it is."""
    from pathlib import Path
    here = Path(__file__).resolve()
    ir = popxl.Ir()
    with ir.main_graph:
        ops.gelu(popxl.variable(np.ones(3, np.float32), name="x"))
    line = [op for op in ir.main_graph.ops if op.type == "gelu"][0].location.rpartition(":")[2]
    monkeypatch.chdir(here.parents[2])
    svg = to_svg(ir)
    assert f"at tests/visualize/test_pictures.py:{line}" in svg and str(here) not in svg
    monkeypatch.chdir(tmp_path)
    assert f"at {here}:{line}" in to_svg(ir)
