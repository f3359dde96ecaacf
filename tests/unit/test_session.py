"""Session semantics (seed 003) and bad input at trace time and at run time."""
import logging

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _stream_ir(nht=1, replication=1):
    ir = popxl.Ir(replication=replication)
    ir.num_host_transfers = nht
    with ir.main_graph:
        x_s = popxl.h2d_stream((2, 2), popxl.float32, "x")
        y_s = popxl.d2h_stream((2, 2), popxl.float32, "y")
        v = popxl.variable(np.zeros((2, 2), np.float32), name="v")

        def step(v_: popxl.TensorByRef):
            x = ops.host_load(x_s)
            ops.add_(v_, x)
            ops.host_store(y_s, v_ * 1.0)

        g = ir.create_graph(step, v)
        ops.repeat(g, nht, v)
    return ir, x_s, y_s, v


def test_session_owns_the_ir():
    ir, x_s, _, v = _stream_ir()
    s = popxl.Session(ir)
    assert s.ir is ir
    with ir.main_graph:
        with pytest.raises(RuntimeError, match="owned by a popxl.Session"):
            popxl.constant(1.0)
        with pytest.raises(RuntimeError, match="owned by a popxl.Session"):
            ops.add(v, v)
    with pytest.raises(RuntimeError, match="replication_factor"):
        ir.replication_factor = 2
    with pytest.raises(RuntimeError, match="another Session"):
        popxl.Session(ir)


def test_device_descs(monkeypatch, caplog):
    monkeypatch.delenv("POPXL_IPU_HW", raising=False)
    import popart
    with pytest.raises(popart.popart_exception) as e:  # PopART's error, as PopXL raises it
        popxl.Session(_stream_ir()[0], "ipu_hw")
    assert popxl.errors.popart_exception is popart.popart_exception and isinstance(e.value, RuntimeError)
    assert "'cpu'" in str(e.value) and "'ipu_model'" in str(e.value) and "POPXL_IPU_HW=cpu" in str(e.value)
    with pytest.raises(ValueError, match="unknown device_desc"):
        popxl.Session(_stream_ir()[0], "gpu")
    monkeypatch.setenv("POPXL_IPU_HW", "cpu")
    import popxl.session as sess_mod
    monkeypatch.setattr(sess_mod, "_warned_ipu_hw", False)
    # popxl logs through PopART's loggers ("popart.popxl"), which do not propagate to the root
    # logger: listen on popart's logger itself.
    from popxl.logs import ROOT
    caplog.handler.setLevel(logging.WARNING)
    ROOT.addHandler(caplog.handler)
    level = ROOT.level
    ROOT.setLevel(logging.WARNING)
    try:
        ir, x_s, y_s, _ = _stream_ir()
        s = popxl.Session(ir, "ipu_hw")
        popxl.Session(_stream_ir()[0], "ipu_hw")
    finally:
        ROOT.removeHandler(caplog.handler)
        ROOT.setLevel(level)
    assert [r.name for r in caplog.records if "ipu_hw" in r.message] == ["popart.popxl"]
    with s:
        out = s.run({x_s: np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(out[y_s], np.ones((2, 2)))


def test_empty_ir_is_an_error():
    with pytest.raises(RuntimeError, match="no ops"):
        popxl.Session(popxl.Ir())


def test_run_requires_attachment():
    ir, x_s, _, _ = _stream_ir()
    s = popxl.Session(ir)
    for call in (lambda: s.run({x_s: np.zeros((2, 2), np.float32)}), s.weights_to_host, s.weights_from_host,
                 lambda: s.run_with_outputs({}, {})):
        with pytest.raises(ValueError, match="attached"):
            call()


@pytest.mark.parametrize("nht,rf,shape", [(1, 1, (2, 2)), (3, 1, (3, 2, 2)), (1, 2, (2, 2, 2)),
                                          (3, 2, (3, 2, 2, 2))])
def test_stream_inputs_checked(nht, rf, shape):
    ir, x_s, y_s, v = _stream_ir(nht, rf)
    s = popxl.Session(ir, "ipu_model")
    good = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    with s:
        with pytest.raises(ValueError, match=r"missing inputs for streams \['x'\]"):
            s.run({})
        with pytest.raises(ValueError, match="unexpected inputs"):
            s.run({x_s: good, y_s: good})
        bad_shape = np.zeros(shape[:-1] + (3,), np.float32)
        with pytest.raises(ValueError) as e:
            s.run({x_s: bad_shape})
        assert "'x'" in str(e.value) and str(shape) in str(e.value)
        with pytest.raises(TypeError, match="'x' carries float32"):
            s.run({x_s: good.astype(np.int32)})
        with pytest.raises(TypeError, match="'x' carries float32"):
            s.run({x_s: good.astype(np.float64)}, downcast_inputs=False)
        # a failed run leaves the host weights as they were
        np.testing.assert_array_equal(s.get_tensor_data(v), np.zeros(shape[-2:] if rf == 1 else (2, 2)))
        out = s.run({x_s: good.astype(np.float64)})  # downcast to float32
        y = out[y_s]
        assert y.shape == shape
        g = good.reshape((nht, rf, 2, 2))
        expected = np.cumsum(g, axis=0)  # v accumulates the loads in order, per replica
        np.testing.assert_allclose(y.reshape(nht, rf, 2, 2), expected, rtol=1e-6)


def test_64_bit_streams_keep_64_bit_inputs_beside_converted_ones():
    """Downcasting applies to 32-bit streams only: an int64 stream takes int64 data whether the
    run goes through the checked-once fast path (all exact arrays) or converts another input (a
    Python float for a float32 stream)."""
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.h2d_stream((), popxl.float32, "a")
        b = popxl.h2d_stream((2,), popxl.int64, "b")
        y = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y, ops.host_load(a) + ops.cast(ops.host_load(b), popxl.float32))
    with popxl.Session(ir, "cpu") as s:
        for av in (np.array(1.5, np.float32), np.float32(1.5), 1.5, np.float64(1.5)):
            np.testing.assert_array_equal(s.run({a: av, b: np.array([1, 2], np.int64)})[y], [2.5, 3.5])
        with pytest.raises(TypeError, match="'b' carries int64"):
            s.run({a: 1.5, b: np.array([1, 2], np.int32)})


def test_extra_leading_rows_are_allowed_for_inputs():
    ir, x_s, y_s, _ = _stream_ir(2)
    with popxl.Session(ir) as s:
        out = s.run({x_s: np.ones((5, 2, 2), np.float32)})
    assert out[y_s].shape == (2, 2, 2)


def test_one_value_streams_take_size_one_axes():
    """A stream of one value per transfer takes host arrays with extra size-1 axes, as PopXL does
    ((n, 1) arrays for a () stream); other shapes are still refused."""
    ir = popxl.Ir()
    ir.num_host_transfers = 4
    with ir.main_graph:
        x_s = popxl.h2d_stream((), popxl.uint32, "x")
        y_s = popxl.d2h_stream((1,), popxl.uint32, "y")
        g = ir.create_graph(lambda: ops.host_store(y_s, (ops.host_load(x_s) * 3).reshape((1,))))
        ops.repeat(g, 4)
    xs = np.array([[1], [2], [3], [4]], np.uint32)
    with popxl.Session(ir) as s:
        np.testing.assert_array_equal(s.run({x_s: xs})[y_s], [[3], [6], [9], [12]])
        np.testing.assert_array_equal(s.run({x_s: xs.reshape(4, 1, 1)})[y_s], [[3], [6], [9], [12]])
        out = np.zeros(4, np.uint32)
        s.run_with_outputs({x_s: xs.reshape(4)}, {y_s: out})
        np.testing.assert_array_equal(out, [3, 6, 9, 12])
        with pytest.raises(ValueError, match="'x' needs a host input of shape"):
            s.run({x_s: np.ones((4, 2), np.uint32)})
        with pytest.raises(ValueError, match="'x' needs a host input of shape"):
            s.run({x_s: np.ones((3, 1), np.uint32)})


def test_run_with_outputs_checks_outputs():
    ir, x_s, y_s, _ = _stream_ir()
    with popxl.Session(ir) as s:
        x = np.ones((2, 2), np.float32)
        with pytest.raises(ValueError, match=r"missing outputs for streams \['y'\]"):
            s.run_with_outputs({x_s: x}, {})
        with pytest.raises(ValueError, match="'y' needs a host output of shape"):
            s.run_with_outputs({x_s: x}, {y_s: np.zeros((3, 2), np.float32)})
        out = np.zeros((2, 2), np.float32)
        s.run_with_outputs({x_s: x}, {y_s: out})
        np.testing.assert_array_equal(out, x)
        strided = np.zeros((2, 4), np.float32)[:, ::2]  # not contiguous: still filled
        s.run_with_outputs({x_s: x}, {y_s: strided})
        np.testing.assert_array_equal(strided, 2 * x)


def test_exit_with_exception_skips_weights_to_host():
    ir, x_s, _, v = _stream_ir()
    s = popxl.Session(ir)
    with pytest.raises(KeyError):
        with s:
            s.run({x_s: np.ones((2, 2), np.float32)})
            raise KeyError("boom")
    assert not s.is_attached
    np.testing.assert_array_equal(s.get_tensor_data(v), np.zeros((2, 2)))


def test_weights_to_host_on_exit_false():
    ir, x_s, _, v = _stream_ir()
    s = popxl.Session(ir, weights_to_host_on_exit=False)
    with s:
        s.run({x_s: np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(s.get_tensor_data(v), np.zeros((2, 2)))


def _memmap_ir(path, mode):
    data = np.memmap(path, dtype=np.float32, mode="w+", shape=(2, 2))
    data[...] = 1
    data.flush()
    del data
    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((2, 2), popxl.float32, "x")
        v = popxl.variable(np.memmap(path, dtype=np.float32, mode=mode, shape=(2, 2)), name="v")
        ops.add_(v, ops.host_load(x_s))
    return ir, x_s, v


def test_host_weights_are_the_variables_own_data():
    """No second host copy of the weights: the Session syncs into the data the variable was made
    with, and get_tensor_data returns views of it."""
    ir, x_s, _, v = _stream_ir()
    with popxl.Session(ir) as s:
        s.run({x_s: np.ones((2, 2), np.float32)})
        data = s.get_tensor_data(v)
        np.testing.assert_array_equal(data, np.ones((2, 2)))
        assert np.shares_memory(data, v._host_data_value)
        s.run({x_s: np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(data, np.full((2, 2), 2))  # the exit's weights_to_host is seen through it


def test_memmap_variable_is_synced_into_its_file(tmp_path):
    ir, x_s, v = _memmap_ir(tmp_path / "v.bin", "r+")
    with popxl.Session(ir) as s:
        s.run({x_s: np.full((2, 2), 2, np.float32)})
    on_disk = np.fromfile(tmp_path / "v.bin", np.float32).reshape(2, 2)
    np.testing.assert_array_equal(on_disk, np.full((2, 2), 3))


def test_read_only_memmap_variable(tmp_path):
    ir, x_s, v = _memmap_ir(tmp_path / "v.bin", "r")
    s = popxl.Session(ir)
    assert s.weights_to_host_on_exit is False  # nowhere to write them back to
    with s:
        s.run({x_s: np.full((2, 2), 2, np.float32)})
        with pytest.raises(RuntimeError, match="read-only"):
            s.weights_to_host()
        with pytest.raises(RuntimeError, match="read-only"):
            s.write_variable_data(v, np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(np.fromfile(tmp_path / "v.bin", np.float32), np.ones(4))


def test_read_only_memmap_with_a_non_constant_grouping_stays_read_only(tmp_path):
    """PopXL copies a memmap given with a non-constant grouping, but the copy of a read-only one
    still cannot take the weights back, as the memmap itself could not."""
    path = tmp_path / "v.bin"
    np.arange(4, dtype=np.float32).tofile(path)
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping_from_assignments([0, 1, 1, 0])
    with ir.main_graph:
        v = popxl.variable(np.memmap(path, dtype=np.float32, mode="r", shape=(2, 2)), replica_grouping=rg)
        ops.add_(v, popxl.constant(np.ones(2, np.float32)))
    s = popxl.Session(ir, "ipu_model")
    assert s.weights_to_host_on_exit is False
    with s:
        s.run()
        with pytest.raises(RuntimeError, match="read-only"):
            s.weights_to_host()
    np.testing.assert_array_equal(np.fromfile(path, np.float32), np.arange(4))


def test_get_tensor_data_type_errors():
    ir, _, _, v = _stream_ir()
    with ir.main_graph:
        doubled = v + v
        c = popxl.constant(np.ones((2, 2), np.float32), name="c")
    s = popxl.Session(ir)
    with pytest.raises(TypeError, match="is not of type Constant or Variable"):
        s.get_tensors_data([v, 3])
    # PopXL's words begin the messages about tensors of the wrong kind (its tests match them).
    with pytest.raises(TypeError) as e:
        s.get_tensor_data(doubled)
    assert str(e.value).startswith(f"Tensor {doubled.id} is not of type Constant or Variable")
    with pytest.raises(TypeError) as e:
        s.write_variable_data(c, np.zeros((2, 2), np.float32))
    assert str(e.value).startswith("Tensor c is not of type Variable")


def test_trace_time_errors_name_op_shapes_and_line():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32), name="a")
        b = popxl.variable(np.ones((4,), np.float32), name="b")
        i = popxl.variable(np.ones((2, 3), np.int32), name="i")
        with pytest.raises(ValueError) as e:
            ops.add(a, b)
        msg = str(e.value)
        assert "ops.add" in msg and "(2, 3)" in msg and "(4,)" in msg and "test_session.py:" in msg
        with pytest.raises(TypeError, match="same dtype"):
            ops.mul(a, i)
        with pytest.raises(ValueError, match="contracted dimensions"):
            ops.matmul(a, a)
        with pytest.raises(ValueError, match="axis 2 is out of range"):
            ops.sum(a, axis=2)
        with pytest.raises(ValueError, match="cannot reshape"):
            ops.reshape(a, (4, 2))
        with pytest.raises(TypeError, match="must be a popxl.Tensor"):
            ops.add(a, 1.0)
        with pytest.raises(TypeError, match="floating point"):
            ops.exp(i)
        with pytest.raises(ValueError, match="steps must be 1 or -1"):
            ops.slice(a, start=0, stop=2, step=2)
        with pytest.raises(ValueError, match="does not match stream"):
            ops.host_store(popxl.d2h_stream((3,), popxl.float32), a)


@pytest.mark.parametrize("engine_name", ["native", "reference"])
def test_read_only_input_arrays_are_accepted(engine_name):
    from engine_harness import engine
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((2,), popxl.float32, "x")
        out = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(out, ops.host_load(s) * 2.0)
    data = np.frombuffer(np.array([1.5, -2.0], np.float32).tobytes(), np.float32)
    assert not data.flags.writeable
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    with session:
        res = session.run({s: data})
    np.testing.assert_array_equal(res[out], [3.0, -4.0])


def test_compile_progress_bar_only_when_slow(capsys, monkeypatch):
    import popxl.progress
    monkeypatch.setenv("POPXL_PROGRESS", "1")  # capsys's stderr is no terminal: ask for the bar
    popxl.Session(_stream_ir()[0], "cpu")  # a quick compile: silent
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(popxl.progress, "DELAY_SECONDS", 0.0)  # as if every step came late
    popxl.Session(_stream_ir()[0], "cpu")
    err = capsys.readouterr().err
    # tqdm's bar: two steps per graph (main + step), then the engine; drawn at the start and at
    # the end (redraws are throttled, not one per step), then a newline
    frames = [f for f in err.rstrip("\n").split("\r") if f]
    assert 2 <= len(frames) <= 4, frames
    assert frames[0].startswith("popxl: compiling:") and "0/5" in frames[0]
    assert "100%" in frames[-1] and "5/5" in frames[-1]
    assert err.endswith("\n")


def test_assigning_a_device_attribute_changes_nothing():
    """PopXL's Session has no `device` property; its tests assign a PopART device to that name
    before attaching, which neither fails nor changes where the session runs."""
    import popart
    ir, x_s, y_s, v = _stream_ir()
    s = popxl.Session(ir)
    s.device = popart.DeviceManager().createCpuDevice()
    with s:
        np.testing.assert_array_equal(s.run({x_s: np.ones((2, 2), np.float32)})[y_s], np.ones((2, 2)))
    np.testing.assert_array_equal(s.get_tensor_data(v), np.ones((2, 2)))


def test_ipu_hw_by_keyword_with_replicas_runs_on_the_cpu(monkeypatch):
    """popxl-addons' run_module opens ``Session(ir=ir, device_desc="ipu_hw")``: with POPXL_IPU_HW=cpu
    such a program runs unchanged, replicated programs too."""
    monkeypatch.setenv("POPXL_IPU_HW", "cpu")
    ir, x_s, y_s, v = _stream_ir(nht=2, replication=2)
    x = np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2)
    with popxl.Session(ir=ir, device_desc="ipu_hw") as s:
        out = s.run({x_s: x})
    np.testing.assert_array_equal(out[y_s], np.cumsum(x, axis=0))  # v accumulates the two transfers
    np.testing.assert_array_equal(s.get_tensor_data(v), x.sum(0)[0])  # replica 0's value


_FAST_DTYPES = [popxl.float32, popxl.float16, popxl.float64, popxl.int8, popxl.uint8, popxl.int16, popxl.uint16,
                popxl.int32, popxl.uint32, popxl.int64, popxl.bool]


def _copy_ir(nht=2):
    """One stream in and one out per dtype, each output its input plus one (or negated, for bool)."""
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    streams = []
    with ir.main_graph:
        for dt in _FAST_DTYPES:
            streams.append((popxl.h2d_stream((3,), dt, f"in_{dt.name}"), popxl.d2h_stream((3,), dt, f"out_{dt.name}")))

        def body():
            for ins, outs in streams:
                x = ops.host_load(ins)
                ops.host_store(outs, ops.logical_not(x) if ins.dtype == popxl.bool else x + ops.cast(
                    popxl.constant(1), ins.dtype))
        ops.repeat(ir.create_graph(body), nht)
    return ir, streams


def _expected(x: np.ndarray) -> np.ndarray:
    return ~x if x.dtype == bool else x + x.dtype.type(1)


def test_exact_host_data_runs_in_the_engines_fast_path(monkeypatch):
    """Dicts of exact arrays (every stream dtype, in any key order) run in the native engine's C++
    fast path, with nothing of the session's checked path; the outputs it makes are fresh arrays
    per run."""
    ir, streams = _copy_ir()
    rng = np.random.default_rng(0)
    inputs = {s: (rng.integers(0, 2, (2, 3)) if s.dtype == popxl.bool else rng.integers(-9, 9, (2, 3))
                  if s.dtype.is_int and s.dtype.is_signed else rng.integers(0, 9, (2, 3))
                  if s.dtype.is_int else rng.normal(size=(2, 3))).astype(s.dtype.as_numpy()) for s, _ in streams}
    with popxl.Session(ir) as session:
        session.run(inputs)  # the first run is timed (the checked path)
        assert session._exact_run is not None

        def refuse(*args):
            raise AssertionError("the checked path ran")
        monkeypatch.setattr(session, "_run_checked", refuse)
        first = session.run(inputs)
        second = session.run(dict(reversed(inputs.items())))
        assert list(first) == [o for _, o in streams]  # the engine's order, as create_host_outputs
        outputs = session.create_host_outputs()
        session.run_with_outputs(inputs, outputs)
    for (i, o) in streams:
        for got in (first[o], second[o], outputs[o]):
            assert got.dtype == i.dtype.as_numpy() and got.shape == (2, 3)
            np.testing.assert_array_equal(got, _expected(inputs[i]))
        assert not np.shares_memory(first[o], second[o])


def test_inexact_host_data_takes_the_checked_path():
    """What the fast path does not take exactly (another byte order, a subclass, a Python list, a
    missing, extra or misnamed key, a key whose comparison raises) is converted or reported by the
    checked path, as before; nothing crashes and the session stays usable."""
    ir, streams = _copy_ir(nht=1)
    inputs = {s: np.arange(3).astype(s.dtype.as_numpy()) for s, _ in streams}
    f32_in, f32_out = streams[0]

    class Colliding:  # hashes as a stream, then fails to compare
        def __hash__(self):
            return hash(f32_in)

        def __eq__(self, other):
            raise RuntimeError("no comparing me")

    with popxl.Session(ir) as session:
        session.run(inputs)
        swapped = inputs[f32_in].astype(">f4")
        with pytest.raises(TypeError, match="'in_float32' carries float32, but the host array has dtype >f4"):
            session.run({**inputs, f32_in: swapped})
        np.testing.assert_array_equal(session.run({**inputs, f32_in: [0.0, 1.0, 2.0]})[f32_out], [1, 2, 3])
        mapped = inputs[f32_in].view(np.recarray)  # a subclass
        np.testing.assert_array_equal(session.run({**inputs, f32_in: mapped})[f32_out], [1, 2, 3])
        with pytest.raises(ValueError, match=r"missing inputs for streams \['in_float32'\]"):
            session.run({s: a for s, a in inputs.items() if s is not f32_in})
        with pytest.raises(ValueError, match="key 'in_float32' is a str"):
            session.run({**{s: a for s, a in inputs.items() if s is not f32_in}, "in_float32": inputs[f32_in]})
        with pytest.raises(ValueError, match="unexpected inputs"):
            session.run({**inputs, f32_out: inputs[f32_in]})
        colliding = {(Colliding() if s is f32_in else s): a for s, a in inputs.items()}
        for keyed in (colliding, dict(reversed(colliding.items()))):  # looked up in C++, then in Python
            with pytest.raises(RuntimeError, match="no comparing me"):
                session.run(keyed)
        wrong_out = session.create_host_outputs()
        wrong_out[f32_out] = np.zeros(3, np.float64)
        with pytest.raises(TypeError, match="'out_float32' carries float32"):
            session.run_with_outputs(inputs, wrong_out)
        np.testing.assert_array_equal(session.run(inputs)[f32_out], [1, 2, 3])


@pytest.mark.parametrize("engine_name", ["native", "reference"])
def test_run_fast_path_takes_user_arrays_as_given(engine_name):
    """Exact arrays go to the engine unreshaped, matched to their streams whatever the dict's order;
    anything else (a transposed, read-only or reshaped-in-place array) takes the checked path: converted,
    refused or copied back, never written past or misread."""
    from engine_harness import engine
    ir = popxl.Ir(replication=2)
    ir.num_host_transfers = 3
    with ir.main_graph:
        a_s = popxl.h2d_stream((2,), popxl.float32, "a")
        b_s = popxl.h2d_stream((2,), popxl.float32, "b")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")
        g = ir.create_graph(lambda: ops.host_store(y_s, ops.host_load(a_s) - ops.host_load(b_s)))
        ops.repeat(g, 3)
    with engine(engine_name):
        session = popxl.Session(ir, "ipu_model")
    a = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    b = np.full((3, 2, 2), 0.5, np.float32)
    with session:
        for inputs in ({a_s: a, b_s: b}, {b_s: b, a_s: a}):  # engine order, then reversed
            np.testing.assert_array_equal(session.run(inputs)[y_s], a - b)
            out = session.create_host_outputs()
            session.run_with_outputs(inputs, out)
            np.testing.assert_array_equal(out[y_s], a - b)
        # a non-contiguous output is written through a copy, its neighbours untouched
        wide = np.full((3, 2, 4), -7, np.float32)
        session.run_with_outputs({a_s: a, b_s: b}, {y_s: wide[..., ::2]})
        np.testing.assert_array_equal(wide[..., ::2], a - b)
        np.testing.assert_array_equal(wide[..., 1::2], -7)
        # a read-only output is refused, an array reshaped in place after a run is checked again
        frozen = session.create_host_outputs()[y_s]
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="output array for stream .y. is read-only"):
            session.run_with_outputs({a_s: a, b_s: b}, {y_s: frozen})
        reused = a.copy()
        session.run({a_s: reused, b_s: b})
        reused.shape = (2, 3, 2)
        with pytest.raises(ValueError, match="stream 'a' needs a host input of shape \\(3, 2, 2\\)"):
            session.run({a_s: reused, b_s: b})
