"""Mutation fuzz of ONNX models (tests/popart/onnx_fuzz.py): every mutated model must give a result
or a Python exception with a message, never a crash, a hang or an internal error (KeyError,
IndexError, AttributeError ... : an input popart should have checked).

The default run takes 1000 cases; the slow one 10,000 more (``POPART_ONNX_FUZZ_CASES`` sets its
count). A failure names each case by its seed and mutations; ``python tests/popart/onnx_fuzz.py
--seed N`` runs it again in one process, with its traceback.
"""
from __future__ import annotations

import os
from typing import Dict

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import onnx_fuzz
import popart
from popart_helpers import make_model, run_session

DEFAULT_CASES = 1000
SLOW_CASES = int(os.environ.get("POPART_ONNX_FUZZ_CASES", "10000"))
SLOW_START = 1_000_000  # seeds of their own, not those of the default run


def _feeds(model: onnx.ModelProto) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        if dt.kind == "i":  # positive: integer division by zero is not what these check
            feeds[vi.name] = rng.integers(1, 6, shape).astype(dt)
        else:
            feeds[vi.name] = onnx_fuzz._random_feed(shape, dt, rng)
    return feeds


@pytest.mark.parametrize("base", sorted(onnx_fuzz.BASES))
def test_base_models_match_the_reference(base):
    # The fuzz starts from models popart gets right.
    model = onnx.load_from_string(onnx_fuzz.base_bytes(base))
    feeds = _feeds(model)
    outputs = [o.name for o in model.graph.output]
    got = run_session(model, feeds, outputs)
    want = ReferenceEvaluator(model).run(outputs, feeds)
    for name, g, w in zip(outputs, got, want):
        w = np.asarray(w)
        if name == "y_scan":  # ONNX's reference evaluator concatenates Loop's scan outputs; the spec
            w = w.reshape(g.shape)  # (and ONNX Runtime, and popart) stack them on a new first axis
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-5, atol=1e-5, err_msg=name)


def test_cases_are_reproducible_and_varied():
    a, b = onnx_fuzz.mutate(12345), onnx_fuzz.mutate(12345)
    assert a.data == b.data and a.describe() == b.describe()
    cases = [onnx_fuzz.mutate(s) for s in range(200)]
    assert {c.base for c in cases} == set(onnx_fuzz.BASES)
    kinds = {m.split(":")[0] for c in cases for m in c.mutations}
    assert kinds == set(onnx_fuzz.FIELD_MUTATIONS) | {"bytes"}
    assert len({c.data for c in cases}) > 190


def test_pool_reports_crashes_hangs_and_internal_errors():
    # The harness itself can fail: a worker killed by a signal, one that never answers and an
    # internal exception are each reported against their case, and the pool goes on.
    requests = [("selftest", 0, "segv", "segfault"), ("selftest", 1, "ok", "after the crash"),
                ("selftest", 2, "hang", "hang"), ("selftest", 3, "keyerror", "internal"),
                ("model", 4, onnx_fuzz.base_bytes("mlp"), "a valid model")]
    seen = {}
    with onnx_fuzz.WorkerPool(workers=2, timeout=5.0) as pool:
        pool.run(requests, lambda request, outcome: seen.__setitem__(request[3], onnx_fuzz.classify(outcome)))
    assert seen["segfault"][0] == "crash" and "killed by SIGSEGV" in seen["segfault"][1]
    assert seen["hang"][0] == "hang" and "no outcome within 5 s" in seen["hang"][1]
    assert seen["internal"][1].startswith("internal error KeyError")
    assert seen["after the crash"] == ("ok", None) and seen["a valid model"] == ("ok", None)


# What the fuzz found, as models of their own --------------------------------------------------------
@pytest.mark.parametrize("op, inputs, inits, message", [
    ("Squeeze", ["s", "axes"], {"axes": np.array([0], np.int64)}, "axes 0 is out of range for rank 0"),
    ("GatherElements", ["s", "i"], {"i": np.array(0, np.int64)}, "axis 0 is out of range for rank 0"),
])
def test_axes_of_a_scalar_are_refused(op, inputs, inits, message):
    # They indexed the scalar's empty shape (IndexError) instead of naming the axis.
    s = np.float32(1.5)
    model = make_model([onnx.helper.make_node(op, inputs, ["y"], name="n")], {"s": s}, ["y"], inits)
    with pytest.raises(popart.OnnxImportError, match=f"node 'n' \\({op}, opset 17\\): {message}"):
        run_session(model, {"s": s}, ["y"])


@pytest.mark.parametrize("node, inputs, inits, message", [
    (onnx.helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="n"), {"i": np.zeros(2, np.int64)},
     {"d": np.int64(2 ** 40), "v": np.array([0, 1], np.float32)}, "depth 1099511627776 must be between 1 and 2147483647"),
    (onnx.helper.make_node("CumSum", ["s", "ax"], ["y"], name="n"), {"s": np.float32(1.0)}, {"ax": np.int64(0)},
     "axis 0 is out of range for rank 0"),
    (onnx.helper.make_node("CumSum", ["c", "ax"], ["y"], name="n"), {}, {"c": np.float32(1.0), "ax": np.int64(0)},
     "axis 0 is out of range for rank 0"),  # folded at import
    (onnx.helper.make_node("TopK", ["s", "k"], ["y", "i"], name="n"), {"s": np.float32(1.0)},
     {"k": np.array([1], np.int64)}, "axis -1 is out of range for rank 0"),
    (onnx.helper.make_node("Cast", ["c"], ["y"], name="n", to=99), {}, {"c": np.ones(2, np.float32)},
     "element type 99 \\(not an ONNX element type\\)"),
])
def test_a_hardening_probe_s_models_fail_naming_the_node(node, inputs, inits, message):
    # OverflowError, IndexError and KeyError texts escaped these before.
    model = make_model([node], inputs, ["y"], inits)
    with pytest.raises(popart.OnnxImportError, match=f"node 'n' \\({node.op_type}, opset 17\\): {message}"):
        run_session(model, inputs, ["y"])


def test_clip_bounds_must_be_scalars():
    # They were converted with float(): "only 0-dimensional arrays can be converted to Python scalars".
    x = np.zeros((2, 3), np.float32)
    model = make_model([onnx.helper.make_node("Clip", ["x", "lo"], ["y"], name="clip")], {"x": x}, ["y"],
                       {"lo": np.zeros(2, np.float32)})
    with pytest.raises(popart.OnnxImportError, match=r"node 'clip' \(Clip, opset 17\): input 1 \(min\) must hold a "
                                                     r"single value: min must be a floating-point scalar, got float32 "
                                                     r"of shape \(2,\)"):
        run_session(model, {"x": x}, ["y"])


X3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize("nodes, inits, opset, message", [
    # Concat of inputs of different ranks: IndexError reading the lower-rank input's axis
    ([onnx.helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0),
      onnx.helper.make_node("Concat", ["x", "r"], ["y"], name="n", axis=2)], {}, 17,
     r"node 'n' \(Concat, opset 17\): inputs must have one rank, got shapes \[\(2, 3, 4\), \(\)\]"),
    # Pad with axes and too few pads: IndexError
    ([onnx.helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], name="n")],
     {"pads": np.array([1, 1], np.int64), "axes": np.array([0, 2], np.int64)}, 18,
     r"node 'n' \(Pad, opset 18\): pads \[1, 1\] must have 4 entries for axes \[0, 2\]"),
    # Resize by an infinite scale: OverflowError converting it to a length
    ([onnx.helper.make_node("Resize", ["x", "", "scales"], ["y"], name="n")],
     {"scales": np.array([1, 1, np.inf], np.float32)}, 18,
     r"node 'n' \(Resize, opset 18\): scales \[1.0, 1.0, inf\] must be finite and positive"),
    # Resize by huge scales: tensors beyond memory or int64 reached popxl's lowering (OverflowError
    # there); every tensor an entry makes is now checked as it is traced.
    ([onnx.helper.make_node("Resize", ["x", "", "scales"], ["y"], name="n")],
     {"scales": np.array([1, 1, 1e15], np.float32)}, 18,
     r"node 'n' \(Resize, opset 18\): tensor '.*' \(of popxl op \w+\) has shape \(2, 3, \d{16}\) of float32: 85.2 PiB, "
     r"more than the .* of memory this process can use"),
    # ... and with no elements at all, a dimension beyond int64 all the same (popxl's shapes refuse it)
    ([onnx.helper.make_node("Resize", ["x", "", "scales"], ["y"], name="n")],
     {"scales": np.array([1, 1e-3, 3.4e38], np.float32)}, 18,
     r"node 'n' \(Resize, opset 18\): ops.interpolate: shape \(2, 0, 13599\d+\) has dimension 13599\d+; dimensions "
     r"must be from 0 to 9223372036854775807 \(int64\)"),
    # Resize by scales or sizes of the wrong length: the extra values were dropped, the missing axes kept
    ([onnx.helper.make_node("Resize", ["x", "", "scales"], ["y"], name="n")],
     {"scales": np.array([1, 2], np.float32)}, 18,
     r"node 'n' \(Resize, opset 18\): scales \[1.0, 2.0\] must have 3 entries, one for each axis of the rank-3 input"),
    ([onnx.helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="n")],
     {"sizes": np.array([2, 3, 8, 5], np.int64)}, 18,
     r"node 'n' \(Resize, opset 18\): sizes \[2, 3, 8, 5\] must have 3 entries, one for each axis of the rank-3 input"),
    ([onnx.helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="n", axes=[2])],
     {"sizes": np.array([2, 6], np.int64)}, 18,
     r"node 'n' \(Resize, opset 18\): sizes \[2, 6\] must have 1 entries, one for each axis of attribute axes \[2\]"),
    # a uint64 shape beyond int64: OverflowError in popxl's reshape
    ([onnx.helper.make_node("Reshape", ["x", "shape"], ["y"], name="n")],
     {"shape": np.array([2 ** 64 - 1], np.uint64)}, 17,
     r"node 'n' \(Reshape, opset 17\): input 1 \(shape\) holds \[18446744073709551615\], beyond 64-bit integers"),
    # Reshape copying (0) a dimension the input does not have: IndexError
    ([onnx.helper.make_node("Reshape", ["x", "shape"], ["y"], name="n")], {"shape": np.array([4, 3, 2, 0], np.int64)},
     17, r"node 'n' \(Reshape, opset 17\): shape \[4, 3, 2, 0\] copies \(0\) a dimension beyond the input's rank 3"),
    # Split into num_outputs=0: ZeroDivisionError; into 2**31 outputs: minutes listing them
    ([onnx.helper.make_node("Split", ["x"], ["y"], name="n", axis=1, num_outputs=0)], {}, 18,
     r"node 'n' \(Split\): attribute 'num_outputs' is 0, but the node has 1 output\(s\)"),
    ([onnx.helper.make_node("Split", ["x"], ["y"], name="n", axis=1, num_outputs=2 ** 31)], {}, 18,
     r"node 'n' \(Split\): attribute 'num_outputs' is 2147483648, but the node has 1 output\(s\)"),
])
def test_bad_values_are_named_at_import(nodes, inits, opset, message):
    model = make_model(nodes, {"x": X3}, ["y"], inits, opset=opset)
    with pytest.raises(popart.OnnxImportError, match=message):
        run_session(model, {"x": X3}, ["y"])


_SHAPE_INFERENCE_SCRIPT = """
import sys
import numpy as np, popart
from onnx import helper
sys.path.insert(0, {tests!r})
from popart_helpers import make_model
x = np.zeros((2, 3, 4), np.float32)
nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], name="split", axis=2, num_outputs=2),
         helper.make_node("RMSNormalization", ["a", "scale"], ["y"], name="rms", axis=-1)]
model = make_model(nodes, {{"x": x}}, ["y"], {{"scale": np.ones(2, np.float32)}}, opset=23)
try:
    popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["y"]), popart.DeviceManager().createCpuDevice())
except Exception as e:
    print(type(e).__name__, e)
"""


def test_models_that_crash_onnx_shape_inference_are_refused_before_it_runs():
    # RMSNormalization's body is generated for its input types, which onnx's shape inference gives;
    # run on a Split with more outputs than num_outputs, onnx 1.23's C++ inference aborts the
    # process (onnx/onnx#8255). The model is checked before function expansion.
    import os
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _SHAPE_INFERENCE_SCRIPT.format(tests=os.path.dirname(__file__))],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit status {out.returncode}\n{out.stderr[-2000:]}"
    assert out.stdout.strip() == ("OnnxImportError node 'split' (Split): attribute 'num_outputs' is 2, but the node "
                                  "has 3 output(s).")


def test_string_attributes_that_are_not_text():
    # Node.attr decoded them: UnicodeDecodeError
    node = onnx.helper.make_node("Pad", ["x", "pads"], ["y"], name="n", mode="constant")
    node.attribute[0].s = b"\xff\xfe"
    model = make_model([node], {"x": X3}, ["y"], {"pads": np.zeros(6, np.int64)})
    with pytest.raises(popart.OnnxImportError, match=r"node 'n' \(Pad\) attribute 'mode' is not valid UTF-8 text: "
                                                     r"b'\\xff\\xfe'"):
        run_session(model, {"x": X3}, ["y"])


def _check(report: onnx_fuzz.Report) -> None:
    print(report.summary())
    assert report.counts["ok"] > report.cases // 10  # mutations that still run: the run stage is reached
    # whatever goes wrong while a model is imported is an OnnxImportError naming the node or model
    escaped = {k: n for k, n in report.counts.items() if k.startswith("import: ") and k != "import: OnnxImportError"}
    assert not escaped, f"exception types other than OnnxImportError escaped the import: {escaped}"
    if report.failures:
        lines = [f"{desc}\n    {what[:3000]}" for desc, what in report.failures]
        pytest.fail(f"{len(report.failures)} of {report.cases} mutated models crashed, hung or raised an internal "
                    f"error (rerun one with: python tests/popart/onnx_fuzz.py --seed N):\n" + "\n".join(lines))


def test_fuzz():
    _check(onnx_fuzz.fuzz(range(DEFAULT_CASES), workers=2))


@pytest.mark.slow
def test_fuzz_many():
    _check(onnx_fuzz.fuzz(range(SLOW_START, SLOW_START + SLOW_CASES), workers=2))
