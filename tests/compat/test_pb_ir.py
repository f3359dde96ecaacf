"""popart._internal.ir, part 1: the views read popxl's own IR as PopART's Python shows it (ids,
inputs and outputs by index, producers and consumers, op kinds and index maps), wrapping gives
the same objects back, and the Ir's session options, patterns and the session object behave as
PopART's do for PopXL programs and popxl-addons."""
import logging

import numpy as np
import pytest

import popart
import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from popxl.logs import ROOT
from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo, autodiff


def _linear_program():
    """main: w (3x2); lin(x, w) = relu(x @ w) + 1 in a subgraph called on x."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.arange(6, dtype=np.float32).reshape(3, 2) / 6, name="w")
        x = popxl.variable(np.array([[1.0, -2.0, 3.0]], np.float32), name="x")

        def lin(x, w):
            return ops.relu(x @ w) + 1.0

        graph = ir.create_graph(lin, x, w)
        site = ops.call_with_info(graph, x, w)
    return ir, graph, site, x, w


def test_wrapping_gives_the_same_views_and_the_same_popxl_objects():
    ir, graph, site, x, w = _linear_program()
    assert ir._pb_ir is ir._pb_ir and isinstance(ir._pb_ir, _ir.Ir)
    pb_graph = graph._pb_graph
    assert pb_graph is graph._pb_graph and isinstance(pb_graph, _ir.Graph)
    assert popxl.Graph._from_pb(pb_graph) is graph
    assert popxl.Graph._from_pb(ir._pb_ir.getGraph(graph.id)) is graph
    x_in = graph.inputs[0]
    assert popxl.Tensor._from_pb_tensor(pb_graph.getInputTensor(0)) is x_in
    assert pb_graph.getInputTensor(0) is x_in._pb_tensor
    out = graph.outputs[0]
    producer = out._pb_tensor.getProducer()
    assert producer is out._pb_tensor.getProducer() and producer is _ir.view_of(out.producer)
    # a view is equal to, and hashes like, the popxl op it shows (op-created hooks hand out those)
    assert producer == out.producer and {out.producer: "found"}[producer] == "found"
    assert producer != _ir.view_of(site._op)
    with pytest.raises(TypeError, match="expected a popxl.Tensor"):
        popxl.Tensor._from_pb_tensor(pb_graph)
    with pytest.raises(TypeError, match="expected a popxl.Graph"):
        popxl.Graph._from_pb(x._pb_tensor)


def test_graph_ids_inputs_and_outputs():
    ir, graph, site, x, w = _linear_program()
    pb, main = graph._pb_graph, ir.main_graph._pb_graph
    assert isinstance(pb.id, _ir.GraphId) and pb.id == graph.id and pb.id.str() == graph.id
    assert main.id == "" and str(main.id) == "" and main.id < pb.id
    assert {pb.id: 1}[_ir.GraphId(graph.id)] == 1 and pb.id != main.id
    ids = [t.id for t in graph.inputs]
    assert pb.getInputIds() == ids and pb.getInputId(1) == ids[1] and pb.getInputIndex(ids[1]) == 1
    assert pb.hasInputId(ids[0]) and not pb.hasInputId("w") and ids[0] in pb and "nope" not in pb
    assert pb.getOutputIds() == [graph.outputs[0].id] and pb.getOutputId(0) == graph.outputs[0].id
    assert pb.getOutputIndex(graph.outputs[0].id) == 0 and pb.hasOutputId(graph.outputs[0].id)
    assert pb.getOutputTensor(0)._popxl is graph.outputs[0] and pb.getTensor(ids[0])._popxl is graph.inputs[0]
    assert {t.id for t in pb.getTensors()} == {t.id for t in graph.tensors}
    assert pb.getIr() is ir._pb_ir and "relu" in pb.getGraphString()
    with pytest.raises(popart.popart_exception, match="has no tensor 'nope'"):
        pb.getTensor("nope")
    with pytest.raises(popart.popart_exception, match="is not an input of graph"):
        pb.getInputIndex(graph.outputs[0].id)
    with pytest.raises(popart.popart_exception, match="is not an output of graph"):
        pb.getOutputIndex(ids[0])
    with pytest.raises(popart.popart_exception, match="input index 5 is out of range"):
        pb.getInputId(5)
    pb_ir = ir._pb_ir
    assert pb_ir.getMainGraph() is main and pb_ir.getAllGraphs() == [main, pb]
    assert pb_ir.hasGraph(graph.id) and not pb_ir.hasGraph("nope") and pb_ir.getId() == ir.id
    with pytest.raises(popart.popart_exception, match="has no graph with id 'nope'"):
        pb_ir.getGraph("nope")
    assert main.getCalledGraphs() == [pb] and pb.getCalledGraphs() == []


def test_ops_and_tensors_as_popart_shows_them():
    ir, graph, site, x, w = _linear_program()
    pb = graph._pb_graph
    schedule = pb.getOpSchedule(False)
    assert [op.opType() for op in schedule] == ["MatMul", "Relu", "Add"]
    assert pb.getOps() == schedule and pb.getOpIds() == [op.id for op in graph.schedule()]
    # op ids count from 100 in each Ir, as PopART's do
    assert ir.main_graph._pb_graph.getOps()[0].id == 103 and schedule[0].id == 100
    matmul, relu, add = schedule
    assert pb.getOp(relu.id) is relu and relu.name() == "relu" and matmul.str() == "100 (MatMul)"
    x_in, w_in = graph.inputs
    assert matmul.inTensor(1)._popxl is w_in and matmul.inId(0) == x_in.id and matmul.outId(0) == relu.inId(0)
    assert matmul.hasInput(1) and not matmul.hasInput(2) and matmul.hasOutput(0) and not matmul.hasOutput(1)
    assert matmul.hasInputTensor(w_in._pb_tensor) and not relu.hasInputTensor(w_in)
    assert matmul.inIndex(w_in) == 1 and matmul.outIndex(relu.inTensor(0)) == 0
    assert [t._popxl for t in matmul.getInputTensors()] == [x_in, w_in] and matmul.inTensorCount() == 2
    assert {i: t._popxl for i, t in matmul.getInputIndexMap().items()} == {0: x_in, 1: w_in}
    assert add.getOutputIndexMap()[0]._popxl is graph.outputs[0] and add.outTensorCount() == 1
    assert matmul.getGraph() is pb and matmul.getIr() is ir._pb_ir and matmul.getVirtualGraphId() == 0
    with pytest.raises(popart.popart_exception, match="no input at index 4"):
        matmul.inTensor(4)
    with pytest.raises(popart.popart_exception, match="no output at index 1"):
        matmul.outTensor(1)
    with pytest.raises(popart.popart_exception, match="is not an input"):
        relu.inIndex(w_in)
    # tensors
    t = x_in._pb_tensor
    assert t.id == x_in.id and t.getGraph() is pb and t.isGraphInput() and t.getGraphInputIndex() == 0
    assert not t.hasProducer() and relu.inTensor(0).hasProducer() and relu.inTensor(0).getProducer() is matmul
    with pytest.raises(popart.popart_exception, match="has no producer"):
        t.getProducer()
    assert t.consumers.getOps() == [matmul] and t.consumers.getTotal() == 1
    out = graph.outputs[0]._pb_tensor
    assert out.isGraphOutput() and out.getGraphOutputIndex() == 0 and out.consumers.getTotal() == 0
    info = matmul.outTensor(0).info
    assert info.shape() == [1, 2] and info.rank() == 2 and info.nelms() == 2 and info.dim(1) == 2
    assert info.dataType() == "FLOAT" and info.data_type_lcase() == "float" and info.nbytes() == 8
    assert x._pb_tensor.tensorType() == "Variable" and t.tensorType() == "ActGrad"
    assert add.inTensor(1).tensorType() == "Const" and add.inTensor(1).info.shape() == []
    with ir.main_graph:
        sq = x * x
        half = ops.cast(x, popxl.float16)
    assert x._pb_tensor.consumers.getTotal() == 4  # the call, twice the product, the cast
    assert half._pb_tensor.info.dataType() == "FLOAT16" and sq._pb_tensor.info.dataType() == "FLOAT"


def test_op_kinds_and_subgraph_index_maps():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, np.float32), name="v")
        s_in = popxl.h2d_stream((2,), popxl.float32, "s_in")
        s_out = popxl.d2h_stream((2,), popxl.float32, "s_out")
        loaded = ops.host_load(s_in)
        z = ops.init((2,), popxl.float32)
        with popxl.ipu(1):
            moved = ops.ipu_copy(z, 0, 1)
        ops.host_store(s_out, moved)
        ops.var_updates.accumulate_(v, loaded)

        def body(carry, k):
            return carry + k

        g = ir.create_graph(body, v, v)
        loop = ops.repeat_with_info(g, 3, v, v)
        call = ops.call_with_info(g, v, inputs_dict={g.inputs[1]: loaded})
        flag = popxl.constant(True)
        cond = ops.conditional(flag, g, g, then_inputs=[v, v], else_inputs=[v, loaded])
    kinds = {op.type: type(_ir.view_of(op)) for op in ir.main_graph.schedule()}
    assert kinds["host_load"] is _ir.op.exchange.HostLoadOp and kinds["host_store"] is _ir.op.exchange.HostStoreOp
    assert kinds["init"] is _ir.op.InitOp and kinds["ipu_copy"] is _ir.op.IpuCopyOp
    assert kinds["accumulate_"] is _ir.op.AccumulateOp and kinds["repeat"] is _ir.op.LoopOp
    assert kinds["call"] is _ir.op.CallOp and kinds["if"] is _ir.op.IfOp
    assert issubclass(_ir.op.exchange.HostLoadOp, _ir.Op) and not isinstance(_ir.view_of(loop._op), _ir.op.CallOp)
    copy = moved._pb_tensor.getProducer()
    assert copy.getSourceIpu() == 1 and copy.getDestIpu() == 0 and copy.getVirtualGraphId() == 0
    assert copy.opType() == "IpuCopy" and loaded._pb_tensor.getProducer().opType() == "HostLoad"
    # a call's op input i is its graph's input i
    c = _ir.view_of(call._op)
    assert c.getCalledGraphs() == [g._pb_graph] and c.getCalledGraph() is g._pb_graph
    assert c.opInToSubgraphInIndex(1) == 1 and c.subgraphInToOpInIndex(0) == 0 and c.inTensor(1)._popxl is loaded
    assert c.opOutToSubgraphOutIndex(0) == 0 and c.subgraphOutToOpOutIndex(0) == 0
    with pytest.raises(popart.popart_exception, match="not one of its graph's inputs"):
        c.opInToSubgraphInIndex(2)
    # a loop's op input i + 2 is its graph's input i (0 and 1 are PopART's trip count and condition)
    lp = _ir.view_of(loop._op)
    assert lp.opType() == "Loop" and lp.getTripCountValue() == 3 and lp.getNumExplicitInputs() == 3
    assert lp.getNumImplicitInputs() == 1 and sorted(lp.getInputIndexMap()) == [2, 3]
    assert lp.subgraphInToOpInIndex(1) == 3 and lp.opInToSubgraphInIndex(2) == 0 and not lp.hasInput(0)
    assert lp.inTensor(2)._popxl is v and lp.outTensor(0)._popxl is loop.outputs[0]
    with pytest.raises(popart.popart_exception, match="its graph has no input 2"):
        lp.subgraphInToOpInIndex(2)
    iff = cond[0]._pb_tensor.getProducer()
    assert iff.getThenGraph() is g._pb_graph and iff.getCalledGraphs() == [g._pb_graph, g._pb_graph]
    # a popxl op answers PopART's calls itself (PopXL hands out PopART's ops: call sites' `_op`, hooks)
    assert loop._op.getInputIndexMap() == lp.getInputIndexMap() and loop._op.opType() == "Loop"
    with pytest.raises(AttributeError, match="'Op' object has no attribute 'noSuchCall'"):
        loop._op.noSuchCall()


def test_regions_and_which_ops_modify_a_tensor():
    full, empty = _ir.view.Region.getFull([2, 3]), _ir.view.Region.getEmpty(2)
    assert not full.isEmpty() and empty.isEmpty() and full.rank() == empty.rank() == 2
    assert full == _ir.view.Region.getFull((2, 3)) and full != empty and _ir.view.Region.getFull((0, 3)).isEmpty()
    assert "full" in str(full) and "empty" in str(empty)
    with pytest.raises(TypeError, match="getFull"):
        _ir.view.Region()
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((2, 3), np.float32), name="v")
        u = popxl.variable(np.zeros((2, 3), np.float32), name="u")
        read = v + 1.0
        flat = v.reshape_((6,))  # a view of v: writing it writes v
        write = ops.var_updates.accumulate_(flat, popxl.constant(np.ones(6, np.float32)))

        def bump(t: popxl.TensorByRef):
            ops.var_updates.accumulate_(t, popxl.constant(np.ones((2, 3), np.float32)))

        g = ir.create_graph(bump, u)
        site = ops.call_with_info(g, u)
    pb_v, pb_u = v._pb_tensor, u._pb_tensor
    read_op, write_op = _ir.view_of(read.producer), _ir.view_of(write.producer)
    assert pb_v.modifiedRegionsByOps([read_op]) == [empty]
    assert pb_v.modifiedRegionsByOps([read_op, write_op]) == [full]
    assert pb_u.modifiedRegionsByOps(ir.main_graph._pb_graph.getOps()) == [full]
    assert pb_u.modifiedRegionsByOps([read_op, write_op]) == [empty]
    assert write_op.modifies(0) == [_ir.view.Region.getFull((6,))] and read_op.modifies(0) == [empty]
    assert _ir.view_of(site._op).modifies(0) == [full]


def test_grad_graph_info_from_pb_round_trip_runs():
    ir, graph, site, x, w = _linear_program()
    info = autodiff(graph)
    ins = [c._pb_ec for c in info.expected_inputs]
    assert all(isinstance(c, _ir.ExpectedConnection) for c in ins)
    assert ins[0].type is _ir.ExpectedConnectionType.FwdGrad and ins[0].fwdId == graph.outputs[0].id
    outs = [_ir.ExpectedConnection(c.fwd_tensor.id, _ir.ExpectedConnectionType.FwdGrad) for c in info.expected_outputs]
    bwd = _ir.BwdGraphInfo(info.graph._pb_graph.id, ins, outs)
    again = GradGraphInfo._from_pb(ir._pb_ir, graph._pb_graph, bwd)
    assert again.graph is info.graph and again.forward_graph is graph
    assert again.inputs == info.inputs and again.outputs == info.outputs
    assert [c.connection_type for c in again.expected_inputs] == [c.connection_type for c in info.expected_inputs]
    assert again.expected_inputs[0]._pb_ec is ins[0]
    one = ExpectedConnection._from_pb(graph._pb_graph, _ir.ExpectedConnection(graph.inputs[1].id,
                                                                                _ir.ExpectedConnectionType.Fwd))
    assert one.fwd_tensor is graph.inputs[1] and one.connection_type is ExpectedConnectionType.Fwd
    assert ExpectedConnectionType._from_pb(_ir.ExpectedConnectionType.FwdGrad) is ExpectedConnectionType.FwdGrad
    assert ExpectedConnectionType.Fwd._to_pb() is _ir.ExpectedConnectionType.Fwd
    with pytest.raises(TypeError, match="BwdGraphInfo"):
        GradGraphInfo._from_pb(ir._pb_ir, graph._pb_graph, "not one")
    with pytest.raises(TypeError, match="tensor id must be a str"):
        _ir.ExpectedConnection(3, _ir.ExpectedConnectionType.Fwd)
    with pytest.raises(TypeError, match="ExpectedConnection objects"):
        _ir.BwdGraphInfo("g", [1], [])
    with pytest.raises(KeyError, match="No tensor with id 'nope'"):
        ExpectedConnection._from_pb(graph._pb_graph, _ir.ExpectedConnection("nope", _ir.ExpectedConnectionType.Fwd))
    # the rebuilt info connects and runs: dL/dx and dL/dw of sum(relu(x @ w) + 1) seeded with ones
    with ir.main_graph:
        dy = popxl.constant(np.ones((1, 2), np.float32))
        dx, dw = ops.call(again.graph, dy, inputs_dict=again.inputs_dict(site))
        s_dx, s_dw = popxl.d2h_stream(dx.shape, dx.dtype, "dx"), popxl.d2h_stream(dw.shape, dw.dtype, "dw")
        ops.host_store(s_dx, dx)
        ops.host_store(s_dw, dw)
    xv, wv = x._host_data_value.copy(), w._host_data_value.copy()
    with popxl.Session(ir) as session:
        got = session.run()
    mask = (xv @ wv > 0).astype(np.float32)
    np.testing.assert_allclose(got[s_dx], mask @ wv.T, rtol=1e-6)
    np.testing.assert_allclose(got[s_dw], xv.T @ mask, rtol=1e-6)


def test_session_options_of_an_ir(tmp_path, monkeypatch):
    monkeypatch.setenv("POPXL_CACHE_DIR", str(tmp_path / "cache"))
    ir = popxl.Ir()
    opts = ir._pb_ir.getSessionOptions()
    assert opts is ir._pb_ir.getSessionOptions() and isinstance(opts, popart.SessionOptions)
    # PopXL's own defaults, and engine caching from POPXL_CACHE_DIR (accepted; nothing is cached)
    assert opts.aliasZeroCopy and opts.enableExplicitMainLoops and opts.decomposeGradSum
    assert opts.virtualGraphMode is popart.VirtualGraphMode.Manual and not opts.enableVariablesCaching
    assert opts.enableEngineCaching and opts.cachePath == str(tmp_path / "cache")
    assert not popart.SessionOptions().aliasZeroCopy  # PopART's default differs
    for name, value in (("numIOTiles", 32), ("enableStochasticRounding", True), ("aliasZeroCopy", False),
                        ("throwIfLog2ScaleTensorNotInRange", False), ("partialsTypeMatMuls", "half")):
        setattr(opts, name, value)
        assert getattr(opts, name) == value
    with pytest.raises(AttributeError, match="has no option 'numIoTiles'. Did you mean 'numIOTiles'"):
        opts.numIoTiles = 3
    # the replica count is the Ir's replication factor
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 4
    assert ir.replication_factor == 4 and opts.getReplicationFactor() == 4 and opts.getGlobalReplicationFactor() == 4
    ir.replication_factor = 2
    assert opts.replicatedGraphCount == 2
    with pytest.raises(ValueError, match="replication_factor must be a positive int"):
        opts.replicatedGraphCount = 0
    opts.enableDistributedReplicatedGraphs, opts.globalReplicationFactor = True, 8
    assert opts.getGlobalReplicationFactor() == 8


@pytest.mark.parametrize("checks, env, written", [({"FOO"}, "", {"FOO"}), ({"ALL"}, "", {"FOO", "BAR", "FINAL"}),
                                                  (set(), "bar", {"BAR"}), (set(), None, {"FOO", "BAR", "FINAL"})])
def test_dot_checks_and_log_dir_options_choose_the_dot_files(tmp_path, monkeypatch, checks, env, written):
    if env is None:
        monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    else:
        monkeypatch.setenv("POPART_DOT_CHECKS", env)
    ir = popxl.Ir()
    opts = ir._pb_ir.getSessionOptions()
    opts.dotChecks = checks
    opts.logDir = str(tmp_path / "dots")
    assert opts.dotChecks == checks and opts.logDir == str(tmp_path / "dots")
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32)) + 1.0
        ir.dot_checkpoint("FOO")
        ops.host_store(popxl.d2h_stream((2,), popxl.float32, "a"), a)
        ir.dot_checkpoint("BAR")
    popxl.Session(ir)
    assert {p.name for p in (tmp_path / "dots").glob("*.dot")} == {f"{c}_all.dot" for c in written}
    if env is None:  # the first checkpoint turned every check on, as PopXL does
        assert opts.dotChecks == {"ALL"}
    with pytest.raises(TypeError, match="dotChecks must be a set"):
        opts.dotChecks = "FOO"


def test_patterns_leave_the_graphs_as_they_run(caplog):
    ir, graph, site, x, w = _linear_program()
    info = autodiff(graph)
    pb_ir = ir._pb_ir
    before = {g.id: [op.type for op in g.schedule()] for g in ir._all_graphs()}
    default = _ir.patterns.Patterns(_ir.patterns.PatternsLevel.Default)
    pb_ir.setPatterns(default)
    assert pb_ir.getPatterns() is default and default.isPatternEnabled("InPlace")
    assert not _ir.patterns.Patterns(_ir.patterns.PatternsLevel.NoPatterns).isPatternEnabled("InPlace")
    for g in pb_ir.getAllGraphs():
        pb_ir.applyPreAliasPatterns(g)
        pb_ir.applyInplacePattern(g)
    assert {g.id: [op.type for op in g.schedule()] for g in ir._all_graphs()} == before
    with pytest.raises(TypeError, match="expected a patterns.Patterns"):
        pb_ir.setPatterns(_ir.patterns.PatternsLevel.All)
    other = popxl.Ir()
    with pytest.raises(popart.popart_exception, match="belongs to"):
        pb_ir.applyPreAliasPatterns(other.main_graph._pb_graph)
    ROOT.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="popart.ir"):
            pb_ir.logIr()
    finally:
        ROOT.removeHandler(caplog.handler)
    assert [r.name for r in caplog.records] == ["popart.ir"] and info.graph.id in caplog.text
    assert [c.name for c in _ir.ExecutionContext][:4] == ["Normal", "AccumulateOuterFragment",
                                                          "WeightsFromHostFragment", "WeightsToHostFragment"]


def _kinds(graph):
    return [(type(op).__name__, op.opType()) for op in graph._pb_graph.getOps()]


def test_inplace_pattern_shows_which_multiplies_popart_makes_in_place():
    # The gradient of x * s: dx = g * s and ds = g * x, both graph outputs. g is read by both, so
    # neither may overwrite it (the other reader would have to run first, and it makes a graph
    # output); each overwrites its other operand, a graph input read by no one else.
    ir = popxl.Ir()
    with ir.main_graph:
        xs = popxl.h2d_stream((2, 2), popxl.float32, "x")
        s = popxl.variable(np.full((2, 2), 3.0, np.float32), name="s")
        fwd = ir.create_graph(lambda x, s: x * s, xs.spec, s)
        info = autodiff(fwd)
        site = ops.call_with_info(fwd, ops.host_load(xs), s)
        grads = ops.call(info.graph, popxl.constant(np.ones((2, 2), np.float32)), inputs_dict=info.inputs_dict(site))
        outs = [popxl.d2h_stream((2, 2), popxl.float32, f"d{i}") for i in range(2)]
        for o, gr in zip(outs, grads):
            ops.host_store(o, gr)
    pb_ir = ir._pb_ir
    assert _kinds(info.graph) == [("MulOp", "Mul")] * 2
    pb_ir.setPatterns(_ir.patterns.Patterns(_ir.patterns.PatternsLevel.Default))
    pb_ir.applyPreAliasPatterns(info.graph._pb_graph)
    pb_ir.applyInplacePattern(info.graph._pb_graph)
    assert _kinds(info.graph) == [("MulRhsInplaceOp", "MulRhsInplace")] * 2
    ops_ = info.graph._pb_graph.getOps()
    assert all(isinstance(op, _ir.op.MulRhsInplaceOp) and not isinstance(op, _ir.op.MulOp) for op in ops_)
    assert [op.type for op in info.graph.ops] == ["mul", "mul"]  # popxl's ops are unchanged, and so are the values
    pb_ir.applyInplacePattern(info.graph._pb_graph)  # a second time changes nothing
    assert _kinds(info.graph) == [("MulRhsInplaceOp", "MulRhsInplace")] * 2
    pb_ir.applyInplacePattern(fwd._pb_graph)  # x * s gives the graph's output: it may overwrite x
    assert _kinds(fwd) == [("MulLhsInplaceOp", "MulLhsInplace")]
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({xs: x})
    np.testing.assert_array_equal(out[outs[0]], np.full((2, 2), 3.0))
    np.testing.assert_array_equal(out[outs[1]], x)


def test_inplace_pattern_leaves_what_popart_cannot_overwrite():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones((2, 3), np.float32), name="v")
        x = ops.host_load(popxl.h2d_stream((2, 3), popxl.float32, "x"))
        y = x * v  # x is read again by an op that needs y; v is a variable: neither may be overwritten
        z = y + x
        sq = z * z  # both operands are one tensor
        row = ops.host_load(popxl.h2d_stream((3,), popxl.float32, "row"))
        b = sq * row  # the row has fewer elements than the product: only the left operand can be overwritten
        u = ops.host_load(popxl.h2d_stream((3,), popxl.float32, "u"))
        m = u * row  # u is written by another op (add_ below): only row, read by b too, can be overwritten
        ops.add_(u, row)

        def sub(a, c):
            return a * c, a  # a is a graph output: only c may be overwritten

        g = ir.create_graph(sub, x, x)
    pb_ir = ir._pb_ir
    pb_ir.applyInplacePattern(ir.main_graph._pb_graph)
    pb_ir.applyInplacePattern(g._pb_graph)
    kinds = [type(view).__name__ for view in (pb_ir.getMainGraph().getOp(t.producer.id) for t in (y, sq, b, m))]
    assert kinds == ["MulOp", "MulOp", "MulLhsInplaceOp", "MulRhsInplaceOp"]
    assert _kinds(g) == [("MulRhsInplaceOp", "MulRhsInplace")]


def test_session_object_writes_and_reads_weights():
    ir = popxl.Ir()
    ir.num_host_transfers = 2
    with ir.main_graph:
        v = popxl.variable(np.array([1.0, 2.0], np.float32), name="v")
        out = popxl.d2h_stream((2,), popxl.float32, "out")

        def body(t):
            ops.host_store(out, t * 1.0)

        g = ir.create_graph(body, v)
        ops.repeat(g, 2, inputs_dict={g.inputs[0]: v})
    session = popxl.Session(ir)
    pb = session._pb_session
    assert pb is session._pb_session and isinstance(pb, _ir.Session)
    assert session._full_input_shape((3,)) == (2, 3) and session._full_input_shape([]) == (2,)
    with session:
        pb.writeWeights(popart.PyWeightsIO({"v": np.array([5.0, 6.0], np.float32)}))
        # the host value changed; the device keeps the old one until weightsFromHost
        np.testing.assert_array_equal(session.run()[out], [[1.0, 2.0]] * 2)
        pb.weightsFromHost()
        np.testing.assert_array_equal(session.run()[out], [[5.0, 6.0]] * 2)
        back = {"v": np.zeros(2, np.float32)}
        pb.readWeights(popart.PyWeightsIO(back))
        np.testing.assert_array_equal(back["v"], [5.0, 6.0])
        with pytest.raises(popart.popart_exception, match=r"\['u'\] are not variables"):
            pb.writeWeights(popart.PyWeightsIO({"u": np.zeros(2, np.float32)}))
        with pytest.raises(TypeError, match="expected a popart.PyWeightsIO"):
            pb.writeWeights({"v": np.zeros(2, np.float32)})
        with pytest.raises(TypeError, match="has dtype float32"):
            pb.writeWeights(popart.PyWeightsIO({"v": np.zeros(2, np.float64)}))
        np.testing.assert_array_equal(session.get_tensor_data(v), [5.0, 6.0])  # the failed call changed nothing
    pb.setEngineIsLoaded(False)
    assert not pb.getEngineIsLoaded()
    with pytest.raises(TypeError, match="expected a bool"):
        pb.setEngineIsLoaded(1)
