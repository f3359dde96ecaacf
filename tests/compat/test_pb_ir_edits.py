"""popart._internal.ir, part 2: the edits PopART's Python makes (erasing ops, removing and adding
outputs, ordering constraints, cloning ops into another graph, new inputs of call and loop sites,
removing isolated tensors) change popxl's own graphs, and a Session runs the edited program with
the right numbers."""
import numpy as np
import pytest

import popart
import popart._internal.ir as _ir
import popxl
import popxl.ops as ops
from popxl.transforms import autodiff

X = np.array([[1.0, -2.0, 3.0], [0.5, 1.5, -1.0]], np.float32)
W = np.arange(6, dtype=np.float32).reshape(3, 2) / 6 - 0.25


def _run(ir, *streams):
    with popxl.Session(ir) as session:
        out = session.run()
    return [out[s] for s in streams]


def _store(t, name):
    s = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(s, t)
    return s


def _drop_unused_ops(pb_graph):
    """Erase, readers first, every op whose results nothing uses (what a PopART caller does
    after removing an output)."""
    for op in reversed(pb_graph.getOpSchedule()):
        if all(t.consumers.getTotal() == 0 and not t.isGraphOutput() for t in op.getOutputTensors()):
            op.disconnectAllInputs()
            op.disconnectAllOutputs()
            pb_graph.eraseOp(op.id)


def test_remove_output_and_erase_ops_of_a_gradient_graph_then_run():
    ir = popxl.Ir()
    with ir.main_graph:
        x, w = popxl.variable(X, name="x"), popxl.variable(W, name="w")
        fwd = ir.create_graph(lambda x, w: ops.relu(x @ w), x, w)
        site = ops.call_with_info(fwd, x, w)
        info = autodiff(fwd)
        grad = info.graph._pb_graph
        assert [c.fwd_tensor for c in info.expected_outputs] == list(fwd.inputs)  # (dx, dw)
        n_ops = len(grad.getOps())
        grad.removeOutput(0)  # keep only dw, as a caller wanting no input gradient does
        _drop_unused_ops(grad)
        assert grad.getOutputIds() == [info.graph.outputs[0].id] and len(info.graph.outputs) == 1
        assert len(grad.getOps()) < n_ops and "Gradient___x" not in " ".join(grad.getOutputIds())
        info.graph.check()
        dy = popxl.constant(np.ones((2, 2), np.float32))
        (dw,) = ops.call(info.graph, dy, inputs_dict=info.inputs_dict(site))
        s_dw = _store(dw, "dw")
    (got,) = _run(ir, s_dw)
    np.testing.assert_allclose(got, X.T @ (X @ W > 0).astype(np.float32), rtol=1e-6)


def test_remove_output_by_id_updates_call_sites_and_past_the_end_removes_the_last():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.array([1.0, 2.0], np.float32), name="v")
        g = ir.create_graph(lambda t: (t + 1.0, t * 2.0, t - 3.0), v)
        site = ops.call_with_info(g, v)
        s_first = _store(site.outputs[0], "first")
    pb = g._pb_graph
    a, b, c = (t.id for t in g.outputs)
    with pytest.raises(popart.popart_exception, match="still used"):
        pb.removeOutput(a)
    # popxl-addons removes outputs by their indices from before the first removal, in order:
    # PopART's binding takes an index past the end as the last output, which makes that work
    pb.removeOutput(1)
    pb.removeOutput(2)
    assert pb.getOutputIds() == [a] and len(site.outputs) == 1 and site.outputs[0] is site._op.outputs[0]
    with pytest.raises(popart.popart_exception, match="no output -1 to remove"):
        pb.removeOutput(-1)
    _drop_unused_ops(pb)
    assert [op.opType() for op in pb.getOps()] == ["Add"]
    (got,) = _run(ir, s_first)
    np.testing.assert_array_equal(got, [2.0, 3.0])


def test_remove_output_of_a_loop_body_keeps_the_carried_pairs():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32), name="v")
        body = ir.create_graph(lambda a, b: (a + b, b * 2.0), v, v)
        loop = ops.repeat_with_info(body, 3, v, v)
        s = _store(loop.outputs[0], "out")
    with pytest.raises(NotImplementedError, match="only a loop body's last output can go"):
        body._pb_graph.removeOutput(0)
    body._pb_graph.removeOutput(1)  # b is no longer carried: it stays 1 in every iteration
    (got,) = _run(ir, s)
    np.testing.assert_array_equal(got, [4.0, 4.0])


def test_erased_producer_leaves_readers_until_they_are_erased():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        a = x + 1.0
        b = a * 2.0
        s = _store(b, "b")
    main = ir.main_graph._pb_graph
    add, mul = a._pb_tensor.getProducer(), b._pb_tensor.getProducer()
    main.eraseOp(add.id)
    assert a.id in main and not a._pb_tensor.hasProducer() and main.getOps() == [mul, main.getOps()[1]]
    with pytest.raises(AssertionError, match="reads 'add', whose producer was erased"):
        ir.main_graph.check()
    with pytest.raises(popart.popart_exception, match="reads 'add', whose producer was erased"):
        popxl.Session(ir)
    with pytest.raises(popart.popart_exception, match=f"has no op with id {add.id}"):
        main.eraseOp(add.id)
    main.eraseOp(main.getOps()[1].id)  # the host store, then the product: nothing reads 'add' any more
    main.eraseOp(mul.id)
    ir.main_graph.check()
    assert main.getOps() == [] and b.id not in main
    assert a.id in main  # left over without producer or readers, as PopART leaves it, until:
    main.removeIsolatedTensors(retainVarTensors=True)
    assert a.id not in main and "x" in main


def test_topo_cons_order_ops_and_are_refused_against_dependencies():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        v = popxl.variable(np.zeros(2, np.float32), name="v")
        a = x + 1.0
        b = x * 3.0
        c = a + b
        snapshot = v + 0.0          # reads v before the update below
        ops.var_updates.accumulate_(v, x)
        s_c, s_snap = _store(c, "c"), _store(snapshot, "snap")
    main = ir.main_graph._pb_graph
    op_a, op_b, op_c = (t._pb_tensor.getProducer() for t in (a, b, c))
    cons = main.topoCons()
    assert cons is main.topoCons()
    cons.insert(op_b, op_a)
    assert main.getOpSchedule()[:2] == [op_b, op_a] and cons.contains(op_b, op_a)
    assert cons.getBefores(op_a) == [op_b] and cons.getAfters(op_b) == [op_a]
    with pytest.raises(popart.popart_exception, match="against an earlier constraint"):
        cons.insert(op_a, op_b)
    with pytest.raises(popart.popart_exception, match="cannot be made to run before"):
        cons.insert(op_c, op_a)  # c reads a
    update = main.getOpSchedule()[4]
    assert update.opType() == "AccumulateInplace"
    with pytest.raises(popart.popart_exception, match="share a tensor that one of them makes or writes"):
        cons.insert(update, snapshot._pb_tensor.getProducer())  # would read v after it is written
    with pytest.raises(popart.popart_exception, match="cannot run before itself"):
        cons.insert(op_a, op_a)
    cons.remove(op_b, op_a)
    assert not cons.contains(op_b, op_a) and cons.getBefores(op_a) == []
    got_c, got_snap = _run(ir, s_c, s_snap)
    np.testing.assert_array_equal(got_c, [5.0, 9.0])
    np.testing.assert_array_equal(got_snap, [0.0, 0.0])


def test_clone_ops_into_a_new_graph_and_run_it_in_a_loop():
    """What popxl-addons' repeat_graph does: copy every op of the main graph into a loop body
    (tensors from outside become by-reference inputs), then erase the originals."""
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        v = popxl.variable(np.array([1.0, 2.0], np.float32), name="v")
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")
        first = main._pb_graph.getOps()
        doubled = v * 2.0
        ops.var_updates.accumulate_(acc, doubled)
    assert first == []
    body = ir.create_empty_graph("body")
    schedule = main._pb_graph.getOpSchedule()
    old_to_new, remaps = {}, {}
    with body:
        for op in schedule:
            clone = op.cloneIntoGraph(body._pb_graph)
            assert isinstance(clone, type(op)) and clone.id != op.id and clone.opType() == op.opType()
            assert "clone of" in repr(clone) and clone.getGraph() is body._pb_graph
            for idx, t in op.getInputIndexMap().items():
                if t not in old_to_new:
                    outer = popxl.Tensor._from_pb_tensor(t)
                    old_to_new[t] = popxl.graph_input(outer.shape, outer.dtype, outer.name, by_ref=True)._pb_tensor
                clone.connectInTensor(idx, old_to_new[t].id)
            for idx, t in op.getOutputIndexMap().items():
                clone.createAndConnectOutTensor(idx, body._create_tensor_id(popxl.Tensor._from_pb_tensor(t).name))
                old_to_new[t] = clone.outTensor(idx)  # places the clone in the body
            clone.setup()
            remaps[op] = [clone]
    cons = main._pb_graph.topoCons()
    cons.insert(schedule[0], schedule[1])
    with main, popxl.in_sequence("pass"):
        inputs = {popxl.Tensor._from_pb_tensor(new): popxl.Tensor._from_pb_tensor(old)
                  for old, new in old_to_new.items() if new.isGraphInput()}
        loop = ops.repeat_with_info(body, 3, inputs_dict=inputs)
    _ir.TopoCons.transferToSubgraph(loop._op, remaps, True)
    assert body._pb_graph.topoCons().contains(remaps[schedule[0]][0], remaps[schedule[1]][0])
    for op in schedule:
        op.disconnectAllInputs()
        op.disconnectAllOutputs()
        main._pb_graph.eraseOp(op.id)
    assert [op.type for op in main.schedule()] == ["repeat"] and [op.type for op in body.schedule()] == \
        ["mul", "accumulate_"]
    assert cons.getBefores(loop._op) == [] and body.outputs == ()
    with popxl.Session(ir) as session:
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(acc), [6.0, 12.0])


def test_cloned_ops_are_checked_when_placed():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 2), np.float32), name="x")
        y = x @ x
        with popxl.ipu(1):
            moved = ops.ipu_copy(y, 0, 1)
    other = ir.create_empty_graph("other")
    with other:
        a = popxl.graph_input((2, 2), popxl.float32, "a")
        short = popxl.graph_input((3,), popxl.float32, "short")
    matmul = y._pb_tensor.getProducer()
    gap = matmul.cloneIntoGraph(other)
    gap.connectInTensor(1, a.id)
    with pytest.raises(popart.popart_exception, match=r"inputs are connected at \[1\]"):
        gap.setup()
    bad = matmul.cloneIntoGraph(other._pb_graph)
    bad.connectInTensor(0, a.id)
    with pytest.raises(popart.popart_exception, match="already connected"):
        bad.connectInTensor(0, a.id)
    bad.connectInTensor(1, short.id)
    with pytest.raises(popart.popart_exception, match="does not fit its new inputs"):
        bad.outTensor(0)
    with pytest.raises(popart.popart_exception, match="has no tensor 'nope'"):
        matmul.cloneIntoGraph(other).connectInTensor(0, "nope")
    extra = matmul.cloneIntoGraph(other)
    extra.connectInTensor(0, a.id)
    extra.connectInTensor(1, a.id)
    extra.createAndConnectOutTensor(3, other._create_tensor_id("p"))
    with pytest.raises(popart.popart_exception, match=r"outputs \[3\] were connected"):
        extra.setup()
    good = matmul.cloneIntoGraph(other)
    good.connectInTensor(0, a.id)
    good.connectInTensor(1, a.id)
    wanted = other._create_tensor_id("product")
    good.createAndConnectOutTensor(0, wanted)
    good.setup()
    assert good.outId(0) == wanted and good == other.schedule()[-1] and good.getVirtualGraphId() == 0
    copy = moved._pb_tensor.getProducer().cloneIntoGraph(other)
    copy.connectInTensor(0, wanted, 1)
    copy.setup()
    assert copy.getSourceIpu() == 1 and copy.getDestIpu() == 0 and copy.getVirtualGraphId() == 0
    with pytest.raises(NotImplementedError, match="only call and loop ops can be connected"):
        good.connectInTensor(2, a.id)
    with pytest.raises(popart.popart_exception, match="no output 1"):
        good.createAndConnectOutTensor(1, "x")
    good.createAndConnectOutTensor(0, other._create_tensor_id("renamed"))
    assert good.outId(0) == other.id + "/renamed"


def test_call_and_loop_sites_take_new_inputs():
    """What popxl-addons' route_tensor_into_graph does: a main-graph variable reaches graphs
    called from the main graph through new graph inputs bound at the call sites."""
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        v = popxl.variable(np.array([1.0, 2.0], np.float32), name="v")
        w = popxl.variable(np.array([10.0, 20.0], np.float32), name="w")
        sub = ir.create_empty_graph("sub")
        site = ops.call_with_info(sub)
        body = ir.create_graph(lambda c: c + 0.0, v)
        loop = ops.repeat_with_info(body, 3, v)
        s_loop = _store(loop.outputs[0], "loop")
    # call: a new input of `sub`, bound to v and written in place
    with sub:
        v_in = popxl.graph_input(v.shape, v.dtype, "v_in")
        ops.var_updates.accumulate_(v_in, popxl.constant(np.ones(2, np.float32)))
    call = _ir.view_of(site._op)
    k = call.subgraphInToOpInIndex(sub._pb_graph.getInputIndex(v_in.id))
    assert not call.hasInput(k)
    with main:
        scalar = popxl.constant(1.0, name="scalar")
    with pytest.raises(popart.popart_exception, match="does not match graph input"):
        call.connectInTensor(k, scalar.id)
    call.connectInTensor(k, v.id)
    assert call.hasInput(k) and call.inTensor(k)._popxl is v and call.modifies(k)[0].isEmpty()
    with pytest.raises(popart.popart_exception, match="already connected"):
        call.connectInTensor(k, v.id)
    call.addModified(k, [_ir.view.Region.getFull(v.shape)])
    assert not call.modifies(k)[0].isEmpty()
    # loop: a new loop-invariant input w, added after the loop-carried ones
    lp = _ir.view_of(loop._op)
    wanted = body._create_tensor_id("w_in")
    lp.addLoopInput(lp.getNumExplicitInputs(), w.id, wanted, False)
    w_in = body.get_tensor(wanted)
    assert body.inputs[-1] is w_in and lp.inTensor(lp.subgraphInToOpInIndex(1))._popxl is w
    with body:
        ops.var_updates.accumulate_(w_in, popxl.constant(np.ones(2, np.float32)))
    lp.addModified(lp.subgraphInToOpInIndex(1), [_ir.view.Region.getFull(w.shape)])
    lp.addModified(2, [_ir.view.Region.getEmpty(1)])  # empty: nothing to copy back
    assert lp.modifies(2)[0].isEmpty()
    with popxl.Session(ir) as session:
        out = session.run()
        # the call ran before the loop: v was 2, 3 when the loop copied it
        np.testing.assert_array_equal(out[s_loop], [2.0, 3.0])
        np.testing.assert_array_equal(session.get_tensor_data(v), [2.0, 3.0])
        np.testing.assert_array_equal(session.get_tensor_data(w), [13.0, 23.0])


def test_loop_output_replaced_and_graph_outputs_added():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.array([1.0, 2.0], np.float32), name="v")
        inner = ir.create_graph(lambda t: t * 3.0, v)

        def body(c):
            (tripled,) = ops.call(inner, c)
            return c  # passes its state through: the step below makes it carry `tripled` instead

        body_graph = ir.create_graph(body, v)
        loop = ops.repeat_with_info(body_graph, 2, v)
        s = _store(loop.outputs[0], "out")
    lp = _ir.view_of(loop._op)
    call = [op for op in body_graph._pb_graph.getOps() if isinstance(op, _ir.op.CallOp)][0]
    tripled = call.outTensor(0)
    with pytest.raises(popart.popart_exception, match="no output 1 to overwrite"):
        lp.addLoopOutput(1, lp.outId(0), tripled.id, True)
    lp.addLoopOutput(0, ir.main_graph._create_tensor_id("looped"), tripled.id, True)
    assert body_graph.outputs[0] is tripled._popxl and lp.outId(0) == "looped"
    # a graph called with ops.call can get a new output; its call sites get one too
    with inner:
        extra = inner.inputs[0] + 100.0
    inner._pb_graph.markAsOutput(extra.id)
    assert len(call.getOutputTensors()) == 2 and call.outTensor(1).info.shape() == [2]
    call.createAndConnectOutTensor(1, body_graph._create_tensor_id("plus"))
    assert call.outId(1) == body_graph.id + "/plus"
    inner._pb_graph.markAsOutput(1, inner.outputs[0].id, True)  # overwrite: output 1 becomes t * 3
    assert inner.outputs[0] is inner.outputs[1]
    (got,) = _run(ir, s)
    np.testing.assert_array_equal(got, [9.0, 18.0])


def test_remove_isolated_tensors():
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        used = popxl.variable(np.ones(2, np.float32), name="used")
        lone_var = popxl.variable(np.ones(2, np.float32), name="lone_var")
        lone_const = popxl.constant(np.ones(2, np.float32), name="lone_const")
        s = _store(used + 1.0, "out")
        g = ir.create_graph(lambda t: t * 1.0, used)
        unused_input = g.inputs[0]
    pb = main._pb_graph
    pb.removeIsolatedTensors(retainVarTensors=True, retainConstTensors=True)
    assert "lone_var" in pb and "lone_const" in pb
    pb.removeIsolatedTensors(retainVarTensors=True)
    assert "lone_var" in pb and "lone_const" not in pb and "used" in pb
    pb.removeIsolatedTensors()
    assert "lone_var" not in pb and "used" in pb
    g._pb_graph.removeIsolatedTensors()
    assert unused_input.id in g._pb_graph  # graph inputs always stay
    (got,) = _run(ir, s)
    np.testing.assert_array_equal(got, [2.0, 2.0])


def test_graphs_marked_unsafe_to_autodiff_need_their_gradient_given():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        inner = ir.create_graph(lambda t: t * t, x)
        outer = ir.create_graph(lambda t: ops.call(inner, t)[0] + 1.0, x)
    pb = inner._pb_graph
    assert pb.canBeRecursivelyAutodiffed()
    pb.setCanBeRecursivelyAutodiffed(False)
    assert not pb.canBeRecursivelyAutodiffed()
    with pytest.raises(RuntimeError, match="marked as unsafe to autodiff"):
        autodiff(outer)
    autodiff(inner)  # the graph itself can still be differentiated
    info = autodiff(outer, called_graphs_grad_info={inner: autodiff(inner)})
    with ir.main_graph:
        site = ops.call_with_info(outer, x)
        (dx,) = ops.call(info.graph, popxl.constant(np.ones(2, np.float32)), inputs_dict=info.inputs_dict(site))
        s = _store(dx, "dx")
    (got,) = _run(ir, s)
    np.testing.assert_array_equal(got, [2.0, 4.0])
    with pytest.raises(TypeError, match="expected a bool"):
        pb.setCanBeRecursivelyAutodiffed("no")
