"""The spectral ONNX ops (DFT, STFT, MelWeightMatrix), built with onnx.helper, imported and run in an
InferenceSession, against ONNX's reference evaluator (which computes with np.fft)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import popart
from popart_helpers import check_against_reference, make_model, run_nodes, run_session
from test_onnx_ops import Case, N, f32

TOL = 1e-4  # float32 matmuls over up to 16 samples


def dft17(x: np.ndarray, tag: str, inits=None, inputs=("x",), **attrs) -> Case:
    """A DFT case at opset 17 (axis an attribute)."""
    return Case(f"DFT17-{tag}", [N("DFT", list(inputs), ["y"], **attrs)], {"x": x}, ["y"], inits, 17, TOL)


def dft20(x: np.ndarray, tag: str, axis: int, length=None, opset: int = 20, **attrs) -> Case:
    """A DFT case at opset 20 or later (axis an input), with dft_length when given."""
    inits = {"axis": np.int64(axis), **({"len": np.int64(length)} if length is not None else {})}
    inputs = ["x", "len" if length is not None else "", "axis"]
    return Case(f"DFT{opset}-{tag}", [N("DFT", inputs, ["y"], **attrs)], {"x": x}, ["y"], inits, opset, TOL)


REAL = f32(2, 8, 3, 1)
COMPLEX = f32(2, 8, 3, 2)
ONESIDED = f32(2, 5, 3, 2)  # 5 bins: an IRFFT of 8 samples by default
SIGNAL = f32(2, 64, 1)

CASES = [
    # opset 17: axis an attribute (default 1) ---------------------------------------------------------
    dft17(REAL, "real-default-axis"),
    dft17(COMPLEX, "complex-axis2", axis=2),
    dft17(COMPLEX, "complex-negative-axis", axis=-2),
    dft17(f32(8, 2), "rank2-axis0", axis=0),
    dft17(COMPLEX, "inverse", inverse=1),
    dft17(REAL, "inverse-real", inverse=1),
    dft17(REAL, "onesided", onesided=1),
    dft17(f32(2, 7, 3, 1), "onesided-odd", onesided=1),
    dft17(COMPLEX, "onesided-complex", onesided=1),
    dft17(ONESIDED, "irfft", inverse=1, onesided=1),
    dft17(f32(3, 6, 2).astype(np.float16), "float16", axis=1)._replace(tol=5e-3),
    dft17(REAL, "pad", {"len": np.int64(11)}, ("x", "len")),
    dft17(COMPLEX, "truncate", {"len": np.int32(5)}, ("x", "len"), axis=1),
    dft17(ONESIDED, "irfft-odd-length", {"len": np.int64(9)}, ("x", "len"), inverse=1, onesided=1),
    dft17(ONESIDED, "irfft-truncate", {"len": np.int64(6)}, ("x", "len"), inverse=1, onesided=1),
    dft17(ONESIDED, "irfft-pad", {"len": np.int64(12)}, ("x", "len"), inverse=1, onesided=1),
    # opset 20: axis an input (default -2) ------------------------------------------------------------
    Case("DFT20-default-axis", [N("DFT", ["x"], ["y"])], {"x": COMPLEX}, ["y"], None, 20, TOL),
    dft20(REAL, "axis0", 0),
    dft20(COMPLEX, "axis1", 1),
    dft20(COMPLEX, "axis-3", -3),
    dft20(COMPLEX, "inverse-pad", 1, 10, inverse=1),
    dft20(REAL, "onesided-truncate", 1, 6, onesided=1),
    dft20(ONESIDED, "irfft", 1, None, inverse=1, onesided=1),
    dft20(REAL, "axis2", 2, opset=21),
    # STFT --------------------------------------------------------------------------------------------
    Case("STFT-frame_length", [N("STFT", ["s", "step", "", "len"], ["y"])], {"s": SIGNAL}, ["y"],
         {"step": np.int64(8), "len": np.int64(16)}, 17, TOL),
    Case("STFT-window", [N("STFT", ["s", "step", "w"], ["y"])], {"s": SIGNAL, "w": f32(16)}, ["y"],
         {"step": np.int64(8)}, 17, TOL),
    Case("STFT-window-and-length", [N("STFT", ["s", "step", "w", "len"], ["y"])], {"s": SIGNAL, "w": f32(12)},
         ["y"], {"step": np.int32(5), "len": np.int32(12)}, 17, TOL),
    Case("STFT-whole-signal", [N("STFT", ["s", "step"], ["y"])], {"s": f32(2, 16, 1)}, ["y"],
         {"step": np.int64(4)}, 17, TOL),
    Case("STFT-twosided", [N("STFT", ["s", "step", "", "len"], ["y"], onesided=0)], {"s": SIGNAL}, ["y"],
         {"step": np.int64(7), "len": np.int64(10)}, 17, TOL),
    Case("STFT-complex", [N("STFT", ["s", "step", "w"], ["y"], onesided=0)], {"s": f32(1, 40, 2), "w": f32(8)},
         ["y"], {"step": np.int64(3)}, 17, TOL),
    # MelWeightMatrix: float edges as initializers, so the node reaches its entry (a node whose
    # inputs are all import-time values is folded by the reference evaluator instead).
    Case("MelWeightMatrix", [N("MelWeightMatrix", ["bins", "len", "rate", "lo", "hi"], ["y"])], {}, ["y"],
         {"bins": np.int64(8), "len": np.int64(16), "rate": np.int64(8192), "lo": np.float32(0),
          "hi": np.float32(4096)}),
    Case("MelWeightMatrix-narrow-double", [N("MelWeightMatrix", ["bins", "len", "rate", "lo", "hi"], ["y"],
                                             output_datatype=TensorProto.DOUBLE)], {}, ["y"],
         {"bins": np.int32(10), "len": np.int32(512), "rate": np.int32(16000), "lo": np.float32(125),
          "hi": np.float32(3800)}),
    Case("MelWeightMatrix-into-MatMul", [N("MelWeightMatrix", ["bins", "len", "rate", "lo", "hi"], ["m"]),
                                         N("MatMul", ["x", "m"], ["y"])], {"x": f32(3, 33)}, ["y"],
         {"bins": np.int64(6), "len": np.int64(64), "rate": np.int64(1000), "lo": np.float32(20),
          "hi": np.float32(450)}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_matches_reference(case: Case) -> None:
    model = make_model(case.nodes, case.inputs, case.outputs, case.inits, case.opset)
    check_against_reference(model, case.inputs, case.outputs, rtol=case.tol, atol=case.tol)


def test_dft_matches_numpy_fft() -> None:
    # An independent oracle: np.fft directly, forward and inverse along the middle axis.
    x = f32(3, 12, 2)
    z = x[..., 0].astype(np.float64) + 1j * x[..., 1]
    for inverse, want in ((0, np.fft.fft(z, axis=1)), (1, np.fft.ifft(z, axis=1))):
        model = make_model([N("DFT", ["x"], ["y"], axis=1, inverse=inverse)], {"x": x}, ["y"])
        got = run_session(model, {"x": x}, ["y"])[0]
        np.testing.assert_allclose(got, np.stack([want.real, want.imag], -1), rtol=TOL, atol=TOL)


def test_mel_weight_matrix_triangles_peak_at_one() -> None:
    model = make_model([N("MelWeightMatrix", ["bins", "len", "rate", "lo", "hi"], ["y"])], {}, ["y"],
                       {"bins": np.int64(12), "len": np.int64(256), "rate": np.int64(22050),
                        "lo": np.float32(0), "hi": np.float32(8000)})
    w = run_session(model, {}, ["y"])[0]
    assert w.shape == (129, 12) and w.dtype == np.float32
    np.testing.assert_array_equal(w.max(0), 1.0)
    assert (w >= 0).all()


def _bad(nodes, inputs, inits, opset=20):
    return nodes, inputs, inits, opset


@pytest.mark.parametrize("nodes, inputs, inits, opset, message", [
    (*_bad([N("DFT", ["x", "", "axis"], ["y"])], {"x": f32(2, 4, 1), "axis": np.int64(1)}, None),
     "axis.*must be known at import"),
    (*_bad([N("DFT", ["x", "", "axis"], ["y"])], {"x": f32(2, 4, 1)}, {"axis": np.int64(2)}),
     "axis 2 is out of range for rank 3"),
    (*_bad([N("DFT", ["x"], ["y"], axis=-1)], {"x": f32(2, 4, 1)}, None, 17), "axis -1 is out of range"),
    (*_bad([N("DFT", ["x"], ["y"])], {"x": f32(2, 4, 3)}, None), "trailing dimension of 1 .real. or 2"),
    (*_bad([N("DFT", ["x", "len"], ["y"])], {"x": f32(2, 4, 1)}, {"len": np.int64(0)}), "dft_length must be >= 1"),
    (*_bad([N("DFT", ["x", "len"], ["y"])], {"x": f32(2, 4, 1)}, {"len": np.int64([4, 4])}),
     "dft_length must be an integer scalar"),
    (*_bad([N("STFT", ["s", "step"], ["y"])], {"s": f32(2, 16)}, {"step": np.int64(4)}, 17),
     r"signal must have shape \[batch, length, 1 or 2\]"),
    (*_bad([N("STFT", ["s", "step", "", "len"], ["y"])], {"s": f32(1, 16, 1)},
           {"step": np.int64(4), "len": np.int64(20)}, 17), "frame_length <= signal length 16"),
    (*_bad([N("STFT", ["s", "step", "w", "len"], ["y"])], {"s": f32(1, 16, 1), "w": f32(8)},
           {"step": np.int64(4), "len": np.int64(6)}, 17), "window length 8 differs from frame_length 6"),
    (*_bad([N("STFT", ["s", "step"], ["y"])], {"s": f32(1, 16, 1), "step": np.int64(4)}, None, 17),
     "frame_step.*must be known at import"),
    (*_bad([N("MelWeightMatrix", ["b", "l", "r", "lo", "hi"], ["y"])], {},
           {"b": np.int64(8), "l": np.int64(16), "r": np.int64(8000), "lo": np.float32(0), "hi": np.float32(7900)},
           17), "upper_edge_hertz 7900.0 is too high for sample_rate 8000"),
    (*_bad([N("MelWeightMatrix", ["b", "l", "r", "lo", "hi"], ["y"])], {},
           {"b": np.int64(8), "l": np.int64(16), "r": np.int64(8000), "lo": np.float32(300), "hi": np.float32(200)},
           17), "lower_edge_hertz < upper_edge_hertz"),
], ids=["dft-axis-on-device", "dft-axis-last", "dft17-axis-last", "dft-trailing-3", "dft-length-0",
        "dft-length-not-scalar", "stft-rank", "stft-frame-too-long", "stft-window-length", "stft-step-on-device",
        "mel-above-nyquist", "mel-edges-reversed"])
def test_bad_nodes_are_named_at_import(nodes, inputs, inits, opset, message) -> None:
    with pytest.raises(popart.OnnxImportError, match=message):
        run_nodes(nodes, inputs, inits, opset)
