"""Control-flow ops (If, Loop, Scan) through the ONNX importer, against ONNX's reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart
from popart_helpers import check_against_reference, make_model, run_session

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def _graph(name, nodes, outputs, inputs=()):
    return helper.make_graph(nodes, name, list(inputs), [_vi(o) if isinstance(o, str) else o for o in outputs])


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# If ----------------------------------------------------------------------------------------------
def _if_model(cond_nodes, extra_inputs=None):
    """y = If(c): then: x * w (outer-scope reads); else: x - 1."""
    then_g = _graph("then", [helper.make_node("Mul", ["x", "w"], ["t"])], ["t"])
    else_g = _graph("else", [_const("one", np.float32(1)), helper.make_node("Sub", ["x", "one"], ["e"])], ["e"])
    nodes = list(cond_nodes) + [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    inputs = {"x": _rand(2, 3)}
    inputs.update(extra_inputs or {})
    return make_model(nodes, inputs, ["y"], initializers={"w": _rand(2, 3, seed=1)}), inputs


@pytest.mark.parametrize("value", [True, False])
def test_if_static_condition_imports_the_taken_branch(value):
    model, feeds = _if_model([_const("c", np.array(value))])
    check_against_reference(model, feeds, ["y"])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_device_condition(sign):
    cond_nodes = [helper.make_node("ReduceSum", ["s"], ["r"], keepdims=0),
                  _const("zero", np.float32(0)), helper.make_node("Greater", ["r", "zero"], ["c"])]
    model, feeds = _if_model(cond_nodes, {"s": np.full(4, sign, np.float32)})
    check_against_reference(model, feeds, ["y"])


@pytest.mark.parametrize("a, b", [(1.0, 1.0), (1.0, -1.0), (-1.0, 1.0), (-1.0, -1.0)])
def test_nested_if_with_device_conditions(a, b):
    # outer: if a > 0 then (if b > 0 then x + w else x * x) else Neg(w), the inner If reading x and w
    # two scopes out and the inner condition computed in the outer branch
    inner_then = _graph("inner_then", [helper.make_node("Add", ["x", "w"], ["it"])], ["it"])
    inner_else = _graph("inner_else", [helper.make_node("Mul", ["x", "x"], ["ie"])], ["ie"])
    outer_then = _graph("outer_then", [
        helper.make_node("Greater", ["b", "zero"], ["cb"]),
        helper.make_node("If", ["cb"], ["ot"], then_branch=inner_then, else_branch=inner_else)], ["ot"])
    outer_else = _graph("outer_else", [helper.make_node("Neg", ["w"], ["oe"])], ["oe"])
    nodes = [_const("zero", np.float32(0)), helper.make_node("Greater", ["a", "zero"], ["ca"]),
             helper.make_node("If", ["ca"], ["y"], then_branch=outer_then, else_branch=outer_else)]
    feeds = {"x": _rand(3), "a": np.float32(a), "b": np.float32(b)}
    model = make_model(nodes, feeds, ["y"], initializers={"w": _rand(3, seed=2)})
    check_against_reference(model, feeds, ["y"])


def test_if_branch_output_is_an_outer_value_and_several_outputs():
    then_g = _graph("then", [helper.make_node("Relu", ["x"], ["t"])], ["t", "x"])
    else_g = _graph("else", [helper.make_node("Abs", ["x"], ["e"])], ["x", "e"])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0), _const("zero", np.float32(0)),
             helper.make_node("Less", ["m", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y0", "y1"], then_branch=then_g, else_branch=else_g)]
    feeds = {"x": _rand(4)}
    check_against_reference(make_model(nodes, feeds, ["y0", "y1"]), feeds, ["y0", "y1"])


def test_if_device_condition_needs_matching_branch_outputs():
    then_g = _graph("then", [helper.make_node("Identity", ["x"], ["t"])], ["t"])
    else_g = _graph("else", [helper.make_node("Concat", ["x", "x"], ["e"], axis=0)], ["e"])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    feeds = {"x": _rand(2), "c": np.array(True)}
    with pytest.raises(popart.OnnxImportError, match="both branches are compiled.*output 0"):
        run_session(make_model(nodes, feeds, ["y"]), feeds, ["y"])


# Loop --------------------------------------------------------------------------------------------
def _loop_body(extra_nodes=(), cond_out="cond_in"):
    """Body (i, cond_in, acc) -> (cond_out, acc + x * float(i) + w, acc as a scan output): reads
    x and w from the outer scope and uses the iteration counter on the device side."""
    nodes = list(extra_nodes) + [
             helper.make_node("Identity", [cond_out], ["cond_out"]),
             helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Add", ["acc", "xi"], ["a1"]),
             helper.make_node("Add", ["a1", "w"], ["acc_out"]),
             helper.make_node("Identity", ["acc"], ["scan"])]
    return helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc", F, [3])],
                             [_vi("cond_out", B, []), _vi("acc_out", F, [3]), _vi("scan", F, [3])])


@pytest.mark.parametrize("trips", [0, 1, 5])
def test_loop_carried_values_scan_outputs_counter_and_outer_reads(trips):
    body = _loop_body()
    if trips == 0:  # no scan outputs without iterations: their shapes would be unknown
        body = helper.make_graph(body.node[:-1], "body", list(body.input), list(body.output)[:2])
    outs = ["y", "s"] if trips else ["y"]
    nodes = [_const("M", np.int64(trips)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], outs, body=body)]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1)}
    model = make_model(nodes, feeds, outs, initializers={"w": _rand(3, seed=2)})
    check_against_reference(model, feeds, outs)


def test_loop_without_condition_input():
    body = _loop_body()
    nodes = [_const("M", np.int64(4)), helper.make_node("Loop", ["M", "", "acc0"], ["y", "s"], body=body)]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1)}
    model = make_model(nodes, feeds, ["y", "s"], initializers={"w": _rand(3, seed=2)})
    got = run_session(model, feeds, ["y", "s"])
    w = numpy_helper.to_array(model.graph.initializer[0])
    acc, scans = feeds["acc0"], []
    for i in range(4):
        scans.append(acc)
        acc = acc + feeds["x"] * i + w
    np.testing.assert_allclose(got[0], acc, rtol=1e-5)
    np.testing.assert_allclose(got[1], np.stack(scans), rtol=1e-5)


def test_loop_condition_known_at_import_ends_it_early():
    # while i < 3 (computed from the counter, so known at import), at most 10 times
    body = _loop_body([_const("three", np.int64(3)), helper.make_node("Less", ["i", "three"], ["go"])], "go")
    nodes = [_const("M", np.int64(10)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y", "s"], body=body)]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1)}
    model = make_model(nodes, feeds, ["y", "s"], initializers={"w": _rand(3, seed=2)})
    check_against_reference(model, feeds, ["y", "s"])


def test_long_loop_becomes_a_repeat(monkeypatch):
    # 200 iterations without scan outputs: a repeat of the body (the counter is then a device value);
    # unrolling is capped below 200, so the loop cannot have been unrolled
    from popart.onnx import control
    monkeypatch.setattr(control, "MAX_UNROLL", 100)
    body = _loop_body()
    body = helper.make_graph(list(body.node[:-1]) + [_const("k", np.float32(0.5)),
                                                     helper.make_node("Mul", ["acc_out", "k"], ["half"])],
                             "body", list(body.input), [_vi("cond_out", B, []), _vi("half", F, [3])])
    nodes = [_const("M", np.int64(200)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y"], body=body)]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1)}
    model = make_model(nodes, feeds, ["y"], initializers={"w": _rand(3, seed=2)})
    check_against_reference(model, feeds, ["y"], rtol=1e-4, atol=1e-4)


def test_long_loop_needing_the_counter_at_import_is_unrolled():
    # the body slices with the iteration number (which must be known at import): no repeat, unrolled
    body = helper.make_graph([
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        _const("one", np.int64(1)), helper.make_node("Add", ["i", "one"], ["end"]),
        _const("ax", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", ["i", "ax"], ["start1"]), helper.make_node("Unsqueeze", ["end", "ax"], ["end1"]),
        helper.make_node("Slice", ["table", "start1", "end1"], ["row"]),
        helper.make_node("Add", ["acc", "row"], ["acc_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc", F, [1])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [1])])
    nodes = [_const("M", np.int64(70)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y"], body=body)]
    feeds = {"table": _rand(70), "acc0": _rand(1, seed=1)}
    check_against_reference(make_model(nodes, feeds, ["y"]), feeds, ["y"], rtol=1e-4, atol=1e-4)


def test_loop_with_if_on_the_counter():
    # the body's If condition depends on the iteration number only: each unrolled copy takes one branch
    then_g = _graph("then", [helper.make_node("Add", ["acc", "x"], ["t"])], ["t"])
    else_g = _graph("else", [helper.make_node("Sub", ["acc", "x"], ["e"])], ["e"])
    body = helper.make_graph([
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        _const("two", np.int64(2)), helper.make_node("Mod", ["i", "two"], ["r"]),
        _const("zero", np.int64(0)), helper.make_node("Equal", ["r", "zero"], ["even"]),
        helper.make_node("If", ["even"], ["acc_out"], then_branch=then_g, else_branch=else_g)],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc", F, [3])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [3])])
    nodes = [_const("M", np.int64(5)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y"], body=body)]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1)}
    check_against_reference(make_model(nodes, feeds, ["y"]), feeds, ["y"])


def test_loop_data_dependent_condition_is_an_error():
    body = _loop_body([helper.make_node("ReduceSum", ["acc"], ["tot"], keepdims=0), _const("lim", np.float32(10)),
                       helper.make_node("Less", ["tot", "lim"], ["go"])], "go")
    nodes = [_const("M", np.int64(10)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y", "s"], body=body)]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1)}
    model = make_model(nodes, feeds, ["y", "s"], initializers={"w": _rand(3, seed=2)})
    with pytest.raises(popart.OnnxImportError, match="data-dependent termination condition"):
        run_session(model, feeds, ["y", "s"])


def test_loop_device_trip_count_is_an_error():
    nodes = [_const("c", np.array(True)), helper.make_node("Loop", ["M", "c", "acc0"], ["y", "s"], body=_loop_body())]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1), "M": np.int64(3)}
    model = make_model(nodes, feeds, ["y", "s"], initializers={"w": _rand(3, seed=2)})
    with pytest.raises(popart.OnnxImportError, match="trip count M.*must be known at import"):
        run_session(model, feeds, ["y", "s"])


# Scan --------------------------------------------------------------------------------------------
def _scan_model(in_axes, in_dirs, out_axes, out_dirs):
    """State s (shape [2]) and two scanned inputs a, b: s' = s + a_t * b_t + w; scan outputs
    s' and a_t - b_t."""
    body = helper.make_graph([
        helper.make_node("Mul", ["at", "bt"], ["p"]), helper.make_node("Add", ["s", "p"], ["q"]),
        helper.make_node("Add", ["q", "w"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["s_copy"]),
        helper.make_node("Sub", ["at", "bt"], ["d"])],
        "scan_body", [_vi("s", F, [2]), _vi("at", F, [2]), _vi("bt", F, [2])],
        [_vi("s_out", F, [2]), _vi("s_copy", F, [2]), _vi("d", F, [2])])
    a = _rand(4, 2, seed=3) if in_axes[0] == 0 else _rand(2, 4, seed=3)
    b = _rand(4, 2, seed=4) if in_axes[1] == 0 else _rand(2, 4, seed=4)
    attrs = dict(num_scan_inputs=2, scan_input_axes=list(in_axes), scan_input_directions=list(in_dirs),
                 scan_output_axes=list(out_axes), scan_output_directions=list(out_dirs))
    nodes = [helper.make_node("Scan", ["s0", "a", "b"], ["s_final", "states", "diffs"], body=body, **attrs)]
    feeds = {"s0": _rand(2, seed=5), "a": a, "b": b}
    return make_model(nodes, feeds, ["s_final", "states", "diffs"], initializers={"w": _rand(2, seed=6)}), feeds


def _scan_oracle(model, feeds, in_axes, in_dirs, out_axes, out_dirs):
    """The Scan of ``_scan_model`` in NumPy (ONNX's reference evaluator scans forward only)."""
    w = numpy_helper.to_array(model.graph.initializer[0])
    a, b = (np.moveaxis(feeds[k], ax, 0) for k, ax in zip("ab", in_axes))
    a, b = (x[::-1] if d else x for x, d in zip((a, b), in_dirs))
    s, states, diffs = feeds["s0"], [], []
    for at, bt in zip(a, b):
        s = s + at * bt + w
        states.append(s)
        diffs.append(at - bt)
    outs = []
    for vals, ax, d in zip((states, diffs), out_axes, out_dirs):
        outs.append(np.stack(vals[::-1] if d else vals, ax))
    return [s] + outs


@pytest.mark.parametrize("in_axes, in_dirs, out_axes, out_dirs", [
    ((0, 0), (0, 0), (0, 0), (0, 0)),
    ((0, 0), (1, 0), (0, 0), (0, 1)),
    ((1, 0), (0, 1), (1, -1), (1, 0)),
    ((1, 1), (1, 1), (-2, 1), (0, 0)),
])
def test_scan_directions_and_axes(in_axes, in_dirs, out_axes, out_dirs):
    model, feeds = _scan_model(in_axes, in_dirs, out_axes, out_dirs)
    outputs = ["s_final", "states", "diffs"]
    if not any(in_dirs):
        check_against_reference(model, feeds, outputs)
    got = run_session(model, feeds, outputs)
    for name, g, want in zip(outputs, got, _scan_oracle(model, feeds, in_axes, in_dirs, out_axes, out_dirs)):
        assert g.shape == want.shape, name
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_scan_over_import_time_values_folds():
    # a scan over a constant with a constant state is computed at import: its results can be shapes
    body = helper.make_graph([helper.make_node("Add", ["s", "xt"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["c"])],
                             "scan_body", [_vi("s", I64, []), _vi("xt", I64, [])],
                             [_vi("s_out", I64, []), _vi("c", I64, [])])
    nodes = [_const("s0", np.int64(0)), _const("xs", np.array([1, 1, 1, 3], np.int64)),
             helper.make_node("Scan", ["s0", "xs"], ["total", "cum"], body=body, num_scan_inputs=1),
             helper.make_node("Reshape", ["x", "cum"], ["y"])]  # cum = [1, 2, 3, 6]
    feeds = {"x": _rand(36)}
    model = make_model(nodes, feeds, ["y", "total"])
    check_against_reference(model, feeds, ["y", "total"])


def test_scan_length_mismatch_is_an_error():
    body = helper.make_graph([helper.make_node("Add", ["at", "bt"], ["d"])], "scan_body",
                             [_vi("at", F, [2]), _vi("bt", F, [2])], [_vi("d", F, [2])])
    nodes = [helper.make_node("Scan", ["a", "b"], ["y"], body=body, num_scan_inputs=2)]
    feeds = {"a": _rand(3, 2), "b": _rand(4, 2)}
    with pytest.raises(popart.OnnxImportError, match="different lengths"):
        run_session(make_model(nodes, feeds, ["y"]), feeds, ["y"])


# Training through control flow ---------------------------------------------------------------------
def _train_one_step(model, feeds, weight="w", lr=0.1):
    """One SGD step of a TrainingSession on `model`'s scalar output "loss": the weight after it."""
    s = popart.TrainingSession(model.SerializeToString(), popart.DataFlow(1, {"loss": popart.AnchorReturnType("ALL")}),
                               "loss", popart.ConstSGD(lr), popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.weightsFromHost()
    s.run(popart.PyStepIO(dict(feeds), s.initAnchorArrays()))
    s.weightsToHost()
    out = {weight: np.zeros(s.getInfo(weight).shape(), np.float32)}
    s.readWeights(popart.PyWeightsIO(out))
    return out[weight]


def _numeric_grad(loss_of, w, eps=1e-6):
    """Central differences of loss_of(w) (float64)."""
    w = w.astype(np.float64)
    g = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        d = np.zeros_like(w)
        d[i] = eps
        g[i] = (loss_of(w + d) - loss_of(w - d)) / (2 * eps)
    return g


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_training_through_if_on_a_device_condition(sign):
    """loss = mean(y^2), y = If(sum(s) > 0): x * w, else: w * w. The gradient reaches w through the
    branch the condition takes on the device."""
    then_g = _graph("then", [helper.make_node("Mul", ["x", "w"], ["t"])], ["t"])
    else_g = _graph("else", [helper.make_node("Mul", ["w", "w"], ["e"])], ["e"])
    nodes = [helper.make_node("ReduceSum", ["s"], ["r"], keepdims=0), _const("zero", np.float32(0)),
             helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Mul", ["y", "y"], ["y2"]), helper.make_node("ReduceMean", ["y2"], ["loss"], keepdims=0)]
    feeds = {"x": _rand(2, 3), "s": np.full(4, sign, np.float32)}
    w = _rand(2, 3, seed=1)
    model = make_model(nodes, feeds, ["loss"], initializers={"w": w})
    x = feeds["x"].astype(np.float64)
    grad = _numeric_grad(lambda v: np.mean((x * v if sign > 0 else v * v) ** 2), w)
    np.testing.assert_allclose(_train_one_step(model, feeds), w - 0.1 * grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("trips, unroll_cap", [(3, None), (6, 4)])
def test_training_through_a_loop(monkeypatch, trips, unroll_cap):
    """loss = mean(acc^2) after `trips` iterations of acc = acc * w + x (w and x read from the outer
    scope): unrolled, or (over the unroll cap) a repeat of the body, differentiated through."""
    if unroll_cap:
        from popart.onnx import control
        monkeypatch.setattr(control, "UNROLL_LIMIT", unroll_cap)
        monkeypatch.setattr(control, "MAX_UNROLL", unroll_cap)  # so it cannot have been unrolled
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Mul", ["acc", "w"], ["aw"]),
                              helper.make_node("Add", ["aw", "x"], ["acc_out"])],
                             "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc", F, [3])],
                             [_vi("cond_out", B, []), _vi("acc_out", F, [3])])
    nodes = [_const("M", np.int64(trips)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y"], body=body),
             helper.make_node("Mul", ["y", "y"], ["y2"]), helper.make_node("ReduceMean", ["y2"], ["loss"], keepdims=0)]
    feeds = {"x": _rand(3), "acc0": _rand(3, seed=1)}
    w = (0.5 * _rand(3, seed=2)).astype(np.float32)
    model = make_model(nodes, feeds, ["loss"], initializers={"w": w})

    def loss_of(v):
        acc = feeds["acc0"].astype(np.float64)
        for _ in range(trips):
            acc = acc * v + feeds["x"]
        return np.mean(acc ** 2)
    np.testing.assert_allclose(_train_one_step(model, feeds), w - 0.1 * _numeric_grad(loss_of, w),
                               rtol=1e-4, atol=1e-5)


def test_stochastic_rounding_with_an_if_on_a_device_condition():
    """A branch lowered as a graph of its own has no seed of the parent graph's: its float16 results
    round to nearest, and the model imports and runs (it used to fail with a cross-graph error)."""
    then_g = _graph("then", [helper.make_node("Mul", ["x", "x"], ["t"])], ["t"])
    else_g = _graph("else", [helper.make_node("Add", ["x", "x"], ["e"])], ["e"])
    nodes = [helper.make_node("ReduceSum", ["s"], ["r"], keepdims=0), _const("zero", np.float16(0)),
             helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    x = np.linspace(-2, 2, 12).astype(np.float16).reshape(3, 4)
    for sign, want in ((1.0, x * x), (-1.0, x + x)):
        feeds = {"x": x, "s": np.full(2, sign, np.float16)}
        opts = popart.SessionOptions()
        opts.enableStochasticRounding = True
        s = popart.InferenceSession(make_model(nodes, feeds, ["y"]).SerializeToString(),
                                    popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
                                    popart.DeviceManager().createCpuDevice(), userOptions=opts)
        s.prepareDevice()
        s.weightsFromHost()
        anchors = s.initAnchorArrays()
        s.run(popart.PyStepIO(feeds, anchors))
        np.testing.assert_array_equal(anchors["y"], want)


def test_unseeded_random_op_in_an_unrolled_loop_draws_from_the_session_seed():
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("RandomUniformLike", ["acc"], ["u"]),
                              helper.make_node("Add", ["acc", "u"], ["acc_out"])],
                             "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc", F, [64])],
                             [_vi("cond_out", B, []), _vi("acc_out", F, [64])])
    nodes = [_const("M", np.int64(3)), _const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y"], body=body)]
    feeds = {"acc0": np.zeros(64, np.float32)}
    (y,) = run_session(make_model(nodes, feeds, ["y"]), feeds, ["y"])
    # the sum of three independent uniform [0, 1) draws: in [0, 3), mean 1.5, not three equal draws
    assert (y >= 0).all() and (y < 3).all() and abs(y.mean() - 1.5) < 0.3 and np.unique(y).size > 32


def _train_and_anchor(model, feeds, anchor):
    """One step of a TrainingSession (loss "loss", learning rate 0): the anchor's value."""
    s = popart.TrainingSession(model.SerializeToString(), popart.DataFlow(1, {anchor: popart.AnchorReturnType("ALL")}),
                               "loss", popart.ConstSGD(0.0), popart.DeviceManager().createCpuDevice())
    s.setRandomSeed(5)
    s.prepareDevice()
    s.weightsFromHost()
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO(dict(feeds), out))
    return out[anchor]


def _dropout_if(cond_nodes):
    """y = If(c): Dropout(x * w, ratio 0.25), else: x; loss = sum(y). x = 3 and w = 1 everywhere."""
    then_g = _graph("then", [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Dropout", ["m", "r"], ["t"])],
                    ["t"])
    else_g = _graph("else", [helper.make_node("Identity", ["x"], ["e"])], ["e"])
    nodes = list(cond_nodes) + [_const("r", np.float32(0.25)),
                                helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
                                helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    feeds = {"x": np.full(2000, 3.0, np.float32)}
    return make_model(nodes, feeds, ["loss"], initializers={"w": np.ones(2000, np.float32)}), feeds


def test_dropout_in_a_branch_imported_inline_drops_when_training():
    # The session made a random seed only for a Dropout at the top level of the graph; one in a
    # branch found none ("'NoneType' object has no attribute 'split'").
    y = _train_and_anchor(*_dropout_if([_const("c", np.array(True))]), "y")
    assert set(np.unique(y)) == {0.0, 4.0}  # kept values scaled by 1 / (1 - 0.25)
    assert abs(np.mean(y == 0) - 0.25) < 0.04


def test_dropout_in_an_unrolled_loop_draws_a_mask_per_iteration():
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Dropout", ["x", "r"], ["d"]),
                              helper.make_node("Add", ["acc", "d"], ["acc_out"]),
                              helper.make_node("Identity", ["d"], ["scan"])],
                             "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc", F, [2000])],
                             [_vi("cond_out", B, []), _vi("acc_out", F, [2000]), _vi("scan", F, [2000])])
    nodes = [_const("M", np.int64(3)), _const("c", np.array(True)), _const("r", np.float32(0.5)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["y", "s"], body=body),
             helper.make_node("Mul", ["y", "w"], ["yw"]), helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0)]
    feeds = {"x": np.full(2000, 3.0, np.float32), "acc0": np.zeros(2000, np.float32)}
    model = make_model(nodes, feeds, ["loss"], initializers={"w": np.ones(2000, np.float32)})
    masks = _train_and_anchor(model, feeds, "s")
    assert masks.shape == (3, 2000) and set(np.unique(masks)) == {0.0, 6.0}
    assert all(abs(np.mean(m == 0) - 0.5) < 0.05 for m in masks)
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def test_dropout_in_a_branch_on_a_device_condition_is_refused_when_training():
    # the branch is a graph of its own, without the session's seed: a clear error, not an AttributeError
    cond = [helper.make_node("ReduceSum", ["x"], ["sx"], keepdims=0), _const("zero", np.float32(0)),
            helper.make_node("Greater", ["sx", "zero"], ["c"])]
    with pytest.raises(popart.OnnxImportError, match=r"\(Dropout, opset 17\): dropout when training is not supported "
                                                     r"in a body lowered as a graph of its own \(a branch of an If"):
        _train_and_anchor(*_dropout_if(cond), "y")
