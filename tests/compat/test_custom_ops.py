"""PopART's custom-op surface (popart._internal.ir.custom_op) as PopXL custom ops' Python wrappers
use it, and where their binding modules come from (popxl.custom_op_modules): popxl-addons'
resolve to popxl-cpu's, a Python port beside a C++ source wins, the ops Graphcore's applications
ship are recognised by their files' fingerprint, an unknown PopART C++ op fails clearly,
cppimport's finder never gets in first."""
import importlib
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from popart._internal.ir import addons_bindings as bindings
from popart._internal.ir import application_bindings
from popart._internal.ir.op import _CLASSES
from popxl.context import get_current_context
from popxl.custom_op_modules import CustomOpModuleFinder
from popxl.errors import popart_exception
from popxl.op import REGISTRY

from engine_harness import compare_engines
from grad_harness import check_grad


def _rotate(t, sin, cos, rotary_dim, name="rope"):
    """What popxl-addons' rotary wrapper does, in our words: settings, createOpInGraph by ids,
    the hooks, then the popxl tensor of output 0."""
    ctx = get_current_context()
    g = ctx.graph
    settings = ctx._get_op_settings(name)
    op = bindings.RotaryPosEmbedOp.createOpInGraph(g._pb_graph, {0: t.id, 1: sin.id, 2: cos.id},
                                                   {0: g._create_tensor_id("rotated")}, rotary_dim, settings)
    ctx._op_created(op)
    return op, popxl.Tensor._from_pb_tensor(op.outTensor(0))


def _tables():
    angles = np.linspace(0, 1, 8).reshape(1, 4, 2)
    return np.sin(angles).astype(np.float32), np.cos(angles).astype(np.float32)


def test_settings_follow_the_context():
    ir = popxl.Ir()
    with ir.main_graph, popxl.name_scope("block"), popxl.ipu(1), popxl.io_tiles():
        settings = get_current_context()._get_op_settings("mine")
    assert isinstance(settings, _ir.Settings) and settings.name == "block/mine"
    assert settings.graph is ir.main_graph._pb_graph and settings.getIr() is ir._pb_ir
    assert settings.vgraphId.has_value() and settings.vgraphId.value() == 1
    assert settings.tileSet == _ir.TileSet.IO and settings.executionContext == _ir.ExecutionContext.Normal


def test_an_op_made_by_create_op_in_graph_is_an_ordinary_op():
    sin, cos = _tables()
    x = np.arange(64, dtype=np.float32).reshape(2, 4, 2, 4) / 10
    ir = popxl.Ir()
    seen = []
    with ir.main_graph, popxl.name_scope("layer"):
        t, s, c = (popxl.variable(a, name=n) for a, n in ((x, "x"), (sin, "sin"), (cos, "cos")))
        ctx = get_current_context()
        ctx.register_op_created_hook(lambda op: seen.append(("ctx", op.type)))
        ir.main_graph.register_op_created_hook(lambda op: seen.append(("graph", op.type)))
        op, y = _rotate(t, s, c, 4)
    assert isinstance(op, bindings.RotaryPosEmbedOp) and isinstance(op, _ir.Op)
    assert op.opType() == "RotaryPosEmbed" and op.name() == "layer/rope" and op.id >= 100
    assert op.outTensor(0).id == y.id == "layer/rotated" and op.inTensor(0) is t._pb_tensor
    assert op.inTensor(2).id == "layer/cos" and op.getGraph() is ir.main_graph._pb_graph
    # the hooks ran once, when the wrapper said so (PopXL runs them in ctx._op_created)
    assert seen == [("ctx", "rotary_pos_embed"), ("graph", "rotary_pos_embed")]
    # the same view whichever way one comes to it
    assert y.producer._pb_view is op and _ir.view_of(y.producer) is op and y._pb_tensor.getProducer() is op


def test_an_op_made_that_way_runs_and_differentiates():
    sin, cos = _tables()
    x = np.random.default_rng(1).standard_normal((1, 4, 2, 4)).astype(np.float32)

    def build(t):
        return _rotate(t, popxl.constant(sin), popxl.constant(cos), 4)[1]

    (y,) = compare_engines(build, [x], native_ops=["rotary_pos_embed"])
    want = x.copy()
    want[..., 0::2] = x[..., 0::2] * cos[:, :, None] - x[..., 1::2] * sin[:, :, None]
    want[..., 1::2] = x[..., 1::2] * cos[:, :, None] + x[..., 0::2] * sin[:, :, None]
    np.testing.assert_allclose(y, want, rtol=1e-6)
    check_grad(build, [x])


def test_create_op_in_graph_checks_its_arguments():
    sin, cos = _tables()
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((1, 4, 2, 4), np.float32), name="x")
        s, c = popxl.variable(sin), popxl.variable(cos)
        g, ctx = ir.main_graph, get_current_context()
        settings = ctx._get_op_settings("rope")
        create = bindings.RotaryPosEmbedOp.createOpInGraph
        with pytest.raises(TypeError, match="needs the op's settings"):
            create(g._pb_graph, {0: t.id, 1: s.id, 2: c.id}, {}, 4)
        with pytest.raises(TypeError, match=r"missing argument\(s\) rotaryDim"):
            create(g._pb_graph, {0: t.id, 1: s.id, 2: c.id}, {}, settings=settings)
        with pytest.raises(TypeError, match="unexpected argument 'rotary_dim'"):
            create(g._pb_graph, {0: t.id, 1: s.id, 2: c.id}, {}, rotary_dim=4, settings=settings)
        with pytest.raises(popart_exception, match="graph '' has no tensor 'nope'"):
            create(g._pb_graph, {0: "nope", 1: s.id, 2: c.id}, {}, 4, settings)
        with pytest.raises(popart_exception, match=r"inputs are connected at \[0, 2\]"):
            create(g._pb_graph, {0: t.id, 2: c.id}, {}, 4, settings)
        with pytest.raises(ValueError, match="ops.rotary_pos_embed: .*rotary_dim must be an even number"):
            create(g._pb_graph, {0: t.id, 1: s.id, 2: c.id}, {}, 5, settings)
        with pytest.raises(popart_exception, match="output index 1 is out of range"):
            create(g._pb_graph, {0: t.id, 1: s.id, 2: c.id}, {1: "y"}, 4, settings)
        assert not g.ops  # nothing was left behind by the failed calls
        sub = ir.create_empty_graph("sub")
        with pytest.raises(popart_exception, match="the settings belong to graph ''"):
            create(sub._pb_graph, {}, {}, 4, settings)


def test_every_addons_binding_creates_its_op():
    """Each class of the thirteen binding modules, called with the arguments popxl-addons passes."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        g, ctx = ir.main_graph, get_current_context()
        f32 = popxl.variable(np.ones((2, 4), np.float32))
        labels = popxl.variable(np.zeros(2, np.int32))
        group = ir.replica_grouping()._pb_replica_grouping
        assert group.getGroupSize() == 2 and group.getStride() == 1 and group.getNumReplicas() == 2

        def make(cls, inputs, *args, **kwargs):
            settings = ctx._get_op_settings(cls.__name__)
            op = cls.createOpInGraph(g._pb_graph, {i: t.id for i, t in enumerate(inputs)}, {}, *args,
                                     settings=settings, **kwargs)
            assert type(op) is cls and op.opType() == cls.op_type
            return popxl.Tensor._from_pb_tensor(op.outTensor(0)).shape

        assert make(bindings.ReplicatedAllReduceTPOp, [f32], _ir.CollectiveOperator.Add, group, False, True) == (2, 4)
        assert make(bindings.ReplicatedAllReduceStridedOp, [f32], "mean", 1, 2, False, False) == (2, 4)
        assert make(bindings.ReplicatedAllGatherStridedOp, [f32], 1, 2) == (16,)
        assert make(bindings.ReplicatedReduceScatterStridedOp, [f32], "add", 1, 2, True) == (4,)
        assert make(bindings.CrossEntropyShardedOp, [f32, labels], group=group, availableMemoryProportion=0.4) == (2,)
        assert make(bindings.CrossEntropyShardedWROp, [f32, f32, labels, labels], [0, 1]) == (2,)
        assert make(bindings.LayerNormDistributedOp, [f32, popxl.variable(np.ones(4, np.float32)),
                                                      popxl.variable(np.zeros(4, np.float32))], 1e-5, group) == (2, 4)
        assert make(bindings.GradReduceSquareAddOp, [f32, popxl.constant(1.0)]) == ()
        packed = popxl.variable(np.zeros((2, 3, 2), np.uint16))
        half = popxl.variable(np.ones((2, 3, 1), np.float16))
        assert make(bindings.GroupQuantizeDecompressOp, [packed, half, half]) == (2, 24)
        # parameterized ops: a params object, as keyword arguments of create_op_in_graph
        for cls, params, shape in (
                (bindings.Fp8FindBestScaleOp, bindings.Fp8ScalingBiasParams(85, 18, 2.0 ** -40), ()),
                (bindings.LinearLayoutOp, bindings.LinearLayoutParams(2), (2, 4)),
                (bindings.DenseSparseMatMulOp, bindings.DenseSparseMatMulParams([1.0], [2], [0, 1, 1, 1, 1], 3), (2, 3))):
            op = cls.create_op_in_graph(graph=g._pb_graph, inputs={0: f32.id}, outputs={0: g._create_tensor_id("p")},
                                        params=params, settings=ctx._get_op_settings("p"))
            assert popxl.Tensor._from_pb_tensor(op.outTensor(0)).shape == shape and op.params is params
            assert cls.default_opid().type == cls.op_type
            if cls is bindings.DenseSparseMatMulOp:  # PopART's IPU planning hint: taken and recorded only
                op.setAvailableMemoryProportion(0.25)
                assert op._available_memory_proportion == 0.25
    assert len(bindings.MODULES) == 13


# ---- where binding modules come from ---------------------------------------------------------------
_POPART_CPP = "// cppimport\n#include <popart/op.hpp>\nint x;\n"


@pytest.fixture
def import_area(tmp_path, monkeypatch):
    """A folder first on sys.path; modules imported from it are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.split(".")[0] in {"popxl_addons", "cppimport", "leaky_relu_op_impl", "unknown_op_impl", "plain_ext",
                                  "modelling"}:
            del sys.modules[name]
    importlib.invalidate_caches()


def test_addons_binding_modules_resolve_to_ours(import_area):
    pkg = import_area / "popxl_addons" / "ops" / "rotary_pos_embed"
    pkg.mkdir(parents=True)
    for d in (import_area / "popxl_addons", import_area / "popxl_addons" / "ops", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "rotary_pos_embed_binding.cpp").write_text(_POPART_CPP)
    module = importlib.import_module("popxl_addons.ops.rotary_pos_embed.rotary_pos_embed_binding")
    assert module.RotaryPosEmbedOp is bindings.RotaryPosEmbedOp


def test_cppimport_never_gets_ahead(import_area, monkeypatch):
    """A stand-in for cppimport whose import hook, like the real one, goes to the head of
    sys.meta_path and would compile any C++ source it finds: ours is put back in front of it."""
    for name in [n for n in sys.modules if n == "cppimport" or n.startswith("cppimport.")]:
        monkeypatch.delitem(sys.modules, name)
    (import_area / "cppimport").mkdir()
    (import_area / "cppimport" / "__init__.py").write_text("")
    (import_area / "cppimport" / "import_hook.py").write_text(textwrap.dedent("""
        import sys
        class Hook:
            def find_spec(self, fullname, path, target=None):
                if fullname.endswith("_binding"):
                    raise RuntimeError("cppimport compiled " + fullname)
        hook = Hook()
        sys.meta_path.insert(0, hook)
    """))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the stand-in's hook goes with the test
    import cppimport.import_hook  # noqa: F401
    assert isinstance(sys.meta_path[0], CustomOpModuleFinder)
    assert type(sys.meta_path[1]).__name__ == "Hook"
    test_addons_binding_modules_resolve_to_ours(import_area)


def test_an_unknown_popart_cpp_op_fails_naming_it(import_area):
    (import_area / "unknown_op_impl.cpp").write_text(_POPART_CPP)
    with pytest.raises(ImportError, match=r"unknown_op_impl: .*unknown_op_impl.cpp is a PopART C\+\+ custom op, and "
                                          r"PopART C\+\+ custom ops cannot be built here"):
        import unknown_op_impl  # noqa: F401
    # C++ that is not a PopART op is left to the other finders (cppimport, if there is one)
    (import_area / "plain_ext.cpp").write_text("// cppimport\nint main() { return 0; }\n")
    with pytest.raises(ModuleNotFoundError) as info:
        import plain_ext  # noqa: F401
    assert "PopART" not in str(info.value)


def _application_folder(root, with_cpp: bool):
    """An application's op folder as Graphcore's Llama lays it out (modelling/rotary_pos_embed), with
    stand-in files: the package imports its binding module as the real wrapper does."""
    pkg = root / "modelling" / "rotary_pos_embed"
    pkg.mkdir(parents=True)
    (root / "modelling" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .rotary_pos_embed import *\n")
    (pkg / "rotary_pos_embed.py").write_text("from . import rotary_pos_embed_binding\n")
    if with_cpp:
        (pkg / "rotary_pos_embed_binding.cpp").write_text(_POPART_CPP)
        (pkg / "rotary_pos_embedx.cpp").write_text("// the op's Poplar code\n")
    return pkg


@pytest.mark.parametrize("with_cpp", [True, False], ids=["cpp", "python-only"])
def test_an_applications_op_is_recognised_by_its_files(import_area, monkeypatch, with_cpp):
    pkg = _application_folder(import_area, with_cpp)
    suffixes = application_bindings.CPP_SOURCES if with_cpp else application_bindings.PYTHON_SOURCES
    key = (application_bindings.fingerprint(str(pkg), suffixes), "rotary_pos_embed_binding")
    monkeypatch.setitem(application_bindings.MODULES, key,
                        {"RotaryPosEmbedOp": application_bindings.RotaryPosEmbedHalvesOp})
    module = importlib.import_module("modelling.rotary_pos_embed.rotary_pos_embed_binding")
    assert module.RotaryPosEmbedOp is application_bindings.RotaryPosEmbedHalvesOp
    # whitespace does not change what an op is
    for f in pkg.iterdir():
        if f.name.endswith(suffixes):
            f.write_text("\n  " + f.read_text().replace(" ", "\t") + "\n\n")
    assert application_bindings.fingerprint(str(pkg), suffixes) == key[0]


def test_an_applications_op_with_other_sources_is_not_served(import_area):
    _application_folder(import_area, with_cpp=True)
    with pytest.raises(ImportError, match=r"modelling\.rotary_pos_embed\.rotary_pos_embed_binding: .* is a PopART "
                                          r"C\+\+ custom op"):
        importlib.import_module("modelling.rotary_pos_embed.rotary_pos_embed_binding")


def test_the_applications_rotary_op_rotates_halves():
    """The Llama / Dolly op through its binding class: pairs (x[i], x[i + d/2]), and the class keeps
    popxl-addons' view class for the op type."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((1, 3, 2, 8), np.float32))
        s = popxl.variable(np.zeros((1, 3, 2), np.float32))
        ctx, g = get_current_context(), ir.main_graph
        op = application_bindings.RotaryPosEmbedHalvesOp.createOpInGraph(
            g._pb_graph, {0: x.id, 1: s.id, 2: s.id}, {0: g._create_tensor_id("rotated")}, 4,
            ctx._get_op_settings("rope"))
        ctx._op_created(op)
        (popxl_op,) = [o for o in g.ops if o.type == "rotary_pos_embed"]
        assert popxl_op.attrs == {"rotary_dim": 4, "pairing": "halves"}
    assert _CLASSES["rotary_pos_embed"] is bindings.RotaryPosEmbedOp


# ---- the guide's recipe: a PopXL custom op of one's own, ported (PopXL's user guide's leaky ReLU) ----
def _guide_port() -> str:
    """docs/guide/custom_ops.md ships the port as a code block (its first line names the file): the
    test runs exactly that block, so the guide stays true."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "custom_ops.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", page, flags=re.S):
        if block.startswith("# leaky_relu_op_impl.py"):
            return block
    raise AssertionError("docs/guide/custom_ops.md: the leaky_relu_op_impl.py block is missing")


LEAKY_RELU_PORT = _guide_port()


@pytest.fixture
def leaky_relu_port(import_area):
    (import_area / "leaky_relu_op_impl.cpp").write_text(_POPART_CPP)  # the C++ source stays beside it
    (import_area / "leaky_relu_op_impl.py").write_text(LEAKY_RELU_PORT)
    yield importlib.import_module("leaky_relu_op_impl")
    for name in ("leaky_relu", "leaky_relu_grad"):
        REGISTRY.pop(name, None)
    _CLASSES.pop("leaky_relu", None)


def leaky_relu(impl, x, alpha):
    """The user guide's wrapper, in our words: the same calls in the same order."""
    ctx = get_current_context()
    graph = ctx.graph
    settings = ctx._get_op_settings("leaky_relu")
    params = impl.LeakyReluParams(alpha=alpha)
    op = impl.LeakyRelu.create_op_in_graph(graph=graph._pb_graph, inputs={0: x.id},
                                           outputs={0: graph._create_tensor_id("leaky_relu_out")}, params=params,
                                           settings=settings)
    ctx._op_created(op)
    return popxl.Tensor._from_pb_tensor(op.outTensor(0))


def test_a_python_port_beside_the_cpp_source_is_the_module(leaky_relu_port):
    x = np.array([[-2.0, -0.5, 0.0, 1.5]], np.float32)
    (y,) = compare_engines(lambda t: leaky_relu(leaky_relu_port, t, 0.02), [x])
    np.testing.assert_allclose(y, np.where(x >= 0, x, 0.02 * x))
    check_grad(lambda t: leaky_relu(leaky_relu_port, t, 0.1), [np.array([-1.5, -0.3, 0.4, 2.0], np.float32)])
    ir = popxl.Ir()
    with ir.main_graph:
        y = leaky_relu(leaky_relu_port, popxl.variable(x), 0.02)
        assert y.producer._pb_view.opType() == "LeakyRelu"
        ops.host_store(popxl.d2h_stream(y.shape, y.dtype), y)
