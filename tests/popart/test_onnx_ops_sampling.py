"""GridSample, RoiAlign, MaxUnpool and Col2Im, built with onnx.helper, imported and run in an
InferenceSession, against ONNX's reference evaluator."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import pytest

import popart
from popart_helpers import check_against_reference, make_model, reference, run_nodes, run_session
from test_onnx_ops import Case, N, f32, i64

rng = np.random.default_rng(4321)


# GridSample ----------------------------------------------------------------------------------------
def _grid(*shape: int) -> np.ndarray:
    """Normalised positions reaching beyond [-1, 1] (so every padding mode matters), with the
    extremes, the centre and an exact pixel-edge tie (nearest rounds it half to even) included."""
    g = (rng.random(shape) * 3.2 - 1.6).astype(np.float32)
    g.flat[:5] = [-1.0, 1.0, 0.0, 0.25, -0.75]
    return g


def _grid_case(mode: str, padding: str, align: int, x: np.ndarray, grid: np.ndarray, opset: int = 20,
               tag: str = "") -> Case:
    node = N("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    return Case(f"GridSample-{mode}-{padding}-ac{align}{tag}", [node], {"x": x, "g": grid}, ["y"], opset=opset,
                tol=1e-4)


X2, G2 = f32(2, 3, 4, 5), _grid(2, 3, 6, 2)
X3, G3 = f32(1, 2, 3, 4, 5), _grid(1, 2, 3, 4, 3)
X1, G1 = f32(2, 2, 5), _grid(2, 7, 1)
GRID_CASES = [
    *[_grid_case(m, p, a, X2, G2) for m in ("linear", "nearest", "cubic")
      for p in ("zeros", "border", "reflection") for a in (0, 1)],
    *[_grid_case(m, p, a, X3, G3, tag="-3d") for m in ("linear", "nearest") for p in ("zeros", "reflection")
      for a in (0, 1)],
    *[_grid_case(m, "border", 0, X1, G1, tag="-1d") for m in ("linear", "cubic")],
    _grid_case("linear", "zeros", 0, X2, G2, opset=22, tag="-opset22"),
]


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_gridsample_opset16_mode_names(mode: str) -> None:
    # Opset 16 names the modes bilinear/bicubic; ONNX's reference evaluator knows only the opset-20
    # names, so the oracle is the same model at opset 20 with the renamed mode.
    new = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    feeds = {"x": X2, "g": G2}
    for padding in ("zeros", "border", "reflection"):
        old = make_model([N("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding)], feeds, ["y"],
                         opset=16)
        oracle = make_model([N("GridSample", ["x", "g"], ["y"], mode=new, padding_mode=padding)], feeds, ["y"],
                            opset=20)
        np.testing.assert_allclose(run_session(old, feeds, ["y"])[0], reference(oracle, feeds, ["y"])[0],
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_gridsample_reflection_on_one_pixel_axis(mode: str) -> None:
    # One row with align_corners=1: reflection maps every y onto row 0. ONNX's reference evaluator
    # divides by zero there, so the oracle is its 1-D GridSample along the row.
    x, g = f32(1, 2, 1, 4), _grid(1, 3, 5, 2)
    feeds = {"x": x, "g": g}
    model = make_model([N("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode="reflection", align_corners=1)],
                       feeds, ["y"], opset=20)
    row = {"x": x.reshape(1, 2, 4), "g": g[..., :1].reshape(1, 15, 1)}
    oracle = make_model([N("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode="reflection", align_corners=1)],
                        row, ["y"], opset=20)
    want = reference(oracle, row, ["y"])[0].reshape(1, 2, 3, 5)
    np.testing.assert_allclose(run_session(model, feeds, ["y"])[0], want, rtol=1e-4, atol=1e-4)


def test_gridsample_nearest_rounds_half_to_even() -> None:
    # align_corners=1 on 5 pixels: normalised -0.75 / -0.25 / 0.25 / 0.75 are pixels 0.5, 1.5, 2.5,
    # 3.5 exactly, which round to 0, 2, 2, 4. NumPy oracle (the rule is the spec's).
    x = np.arange(5, dtype=np.float32).reshape(1, 1, 1, 5) * 10
    g = np.zeros((1, 1, 4, 2), np.float32)
    g[..., 0] = [-0.75, -0.25, 0.25, 0.75]
    model = make_model([N("GridSample", ["x", "g"], ["y"], mode="nearest", align_corners=1)], {"x": x, "g": g},
                       ["y"], opset=20)
    np.testing.assert_array_equal(run_session(model, {"x": x, "g": g}, ["y"])[0].reshape(-1), [0, 20, 20, 40])


# RoiAlign ------------------------------------------------------------------------------------------
XR = f32(2, 3, 10, 12)
# Boxes inside, touching the border, larger than the image, and smaller than a pixel.
ROIS = np.array([[0, 0, 9, 9], [0, 5, 4, 9], [5, 5, 11, 9], [-3, -2, 14, 13], [2.3, 1.1, 2.6, 1.5]], np.float32)
BATCH = i64(0, 1, 1, 0, 1)


def _roi_case(mode: str, ctm: Optional[str], ratio: int, opset: int = 16, static_rois: bool = False,
              scale: float = 1.0) -> Case:
    attrs = dict(mode=mode, output_height=3, output_width=4, sampling_ratio=ratio, spatial_scale=scale)
    if ctm is not None:
        attrs["coordinate_transformation_mode"] = ctm
    inputs: Dict[str, np.ndarray] = {"x": XR, "b": BATCH}
    inits = {"r": ROIS} if static_rois else None
    if not static_rois:
        inputs["r"] = ROIS
    tag = f"-{ctm or 'default'}-ratio{ratio}{'-static' if static_rois else ''}-scale{scale}-opset{opset}"
    return Case(f"RoiAlign-{mode}{tag}", [N("RoiAlign", ["x", "r", "b"], ["y"], **attrs)], inputs, ["y"], inits,
                opset=opset, tol=1e-4)


ROI_CASES = [
    *[_roi_case(m, c, 2) for m in ("avg", "max") for c in ("half_pixel", "output_half_pixel")],
    _roi_case("avg", "output_half_pixel", 0),  # popxl's roi_align: adaptive grid on the device
    _roi_case("avg", None, 3, opset=22),  # opset 16 on: half_pixel by default
    _roi_case("max", "half_pixel", 1, scale=0.5),
    # Adaptive grids of boxes known at import, one grid per box.
    *[_roi_case(m, c, 0, static_rois=True) for m in ("avg", "max") for c in ("half_pixel", "output_half_pixel")],
    # An empty box (half_pixel keeps it empty): no samples, so its bins are 0.
    *[Case(f"RoiAlign-{m}-empty-box", [N("RoiAlign", ["x", "r", "b"], ["y"], mode=m, output_height=2, output_width=2)],
           {"x": XR}, ["y"], {"r": np.array([[1, 1, 1, 4], [0, 0, 5, 5]], np.float32), "b": i64(1, 0)}, opset=16,
           tol=1e-4) for m in ("avg", "max")],
]


def test_roialign_before_opset16_does_not_shift() -> None:
    # RoiAlign-10 has no coordinate_transformation_mode and does not shift the boxes; ONNX's reference
    # evaluator applies the opset-16 default (half_pixel) at every opset, so the oracle is the
    # opset-16 model with output_half_pixel spelled out.
    feeds = {"x": XR, "r": ROIS, "b": BATCH}
    attrs = dict(output_height=2, output_width=3, sampling_ratio=2)
    for mode in ("avg", "max"):
        old = make_model([N("RoiAlign", ["x", "r", "b"], ["y"], mode=mode, **attrs)], feeds, ["y"], opset=11)
        unshifted = dict(attrs, mode=mode, coordinate_transformation_mode="output_half_pixel")
        oracle = make_model([N("RoiAlign", ["x", "r", "b"], ["y"], **unshifted)], feeds, ["y"], opset=16)
        np.testing.assert_allclose(run_session(old, feeds, ["y"])[0], reference(oracle, feeds, ["y"])[0],
                                   rtol=1e-4, atol=1e-4)


# MaxUnpool -----------------------------------------------------------------------------------------
def _unpool_case(id: str, shape: tuple, kernel: List[int], strides: List[int], pads: List[int],
                 output_shape: Optional[List[int]] = None) -> Case:
    # The values and indices come from MaxPool (run by ONNX's reference evaluator: popart's MaxPool
    # has no Indices output).
    x = f32(*shape)
    window = dict(kernel_shape=kernel, strides=strides, pads=pads)
    pooled, idx = reference(make_model([N("MaxPool", ["x"], ["p", "i"], **window)], {"x": x}, ["p", "i"]), {"x": x})
    inputs = ["p", "i"] + (["o"] if output_shape else [])
    inits = {"o": np.asarray(output_shape, np.int64)} if output_shape else None
    return Case(f"MaxUnpool-{id}", [N("MaxUnpool", inputs, ["y"], **window)], {"p": pooled, "i": idx}, ["y"], inits)


UNPOOL_CASES = [
    _unpool_case("2d", (2, 3, 4, 6), [2, 2], [2, 2], [0, 0, 0, 0]),
    _unpool_case("2d-overlap-pads", (1, 2, 7, 7), [3, 3], [2, 2], [1, 1, 1, 1]),
    _unpool_case("1d", (2, 2, 7), [2], [1], [0, 0]),
    _unpool_case("3d", (1, 2, 4, 4, 4), [2, 2, 2], [2, 2, 2], [0] * 6),
    _unpool_case("output-shape", (2, 3, 4, 6), [2, 2], [2, 2], [0, 0, 0, 0], output_shape=[2, 3, 5, 7]),
]


# Col2Im --------------------------------------------------------------------------------------------
def _col2im_case(id: str, image: List[int], block: List[int], **attrs: List[int]) -> Case:
    r = len(image)
    strides, pads = attrs.get("strides", [1] * r), attrs.get("pads", [0] * (2 * r))
    dil = attrs.get("dilations", [1] * r)
    blocks = np.prod([(image[i] + pads[i] + pads[i + r] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1
                      for i in range(r)])
    x = f32(2, 3 * int(np.prod(block)), int(blocks))
    return Case(f"Col2Im-{id}", [N("Col2Im", ["x", "im", "bl"], ["y"], **attrs)], {"x": x}, ["y"],
                {"im": np.asarray(image, np.int64), "bl": np.asarray(block, np.int64)}, opset=18)


COL2IM_CASES = [
    _col2im_case("2d", [5, 5], [2, 2]),
    _col2im_case("strides", [5, 5], [3, 3], strides=[2, 2]),
    _col2im_case("pads-dilations", [5, 5], [2, 3], pads=[0, 1, 1, 2], dilations=[2, 1]),
    _col2im_case("all", [6, 7], [2, 2], strides=[2, 3], pads=[1, 1, 1, 1], dilations=[2, 2]),
    _col2im_case("3d", [3, 4, 5], [1, 2, 3]),
    _col2im_case("1d", [9], [3], strides=[2]),
]

CASES = GRID_CASES + ROI_CASES + UNPOOL_CASES + COL2IM_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_reference(case: Case) -> None:
    model = make_model(case.nodes, case.inputs, case.outputs, case.inits, case.opset)
    check_against_reference(model, case.inputs, case.outputs, rtol=case.tol, atol=case.tol)


# errors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, opset", [("linear", 16), ("bilinear", 20), ("area", 20)])
def test_gridsample_rejects_mode_of_other_opset(mode: str, opset: int) -> None:
    with pytest.raises(popart.OnnxImportError, match="mode must be one of"):
        run_nodes([N("GridSample", ["x", "g"], ["y"], mode=mode)], {"x": X2, "g": G2}, opset=opset)


def test_gridsample_errors() -> None:
    with pytest.raises(popart.OnnxImportError, match="padding_mode"):
        run_nodes([N("GridSample", ["x", "g"], ["y"], padding_mode="wrap")], {"x": X2, "g": G2}, opset=20)
    with pytest.raises(popart.OnnxImportError, match=r"X must be \(N, C, H, W\)"):  # opset 16 is 4-D only
        run_nodes([N("GridSample", ["x", "g"], ["y"])], {"x": X3, "g": G3}, opset=16)
    with pytest.raises(popart.OnnxImportError, match="grid must have shape"):
        run_nodes([N("GridSample", ["x", "g"], ["y"])], {"x": X2, "g": G3}, opset=20)


def test_roialign_adaptive_grid_needs_static_rois() -> None:
    with pytest.raises(popart.OnnxImportError, match="needs rois known at import"):
        run_nodes([N("RoiAlign", ["x", "r", "b"], ["y"], mode="max", sampling_ratio=0)],
                  {"x": XR, "r": ROIS, "b": BATCH}, opset=20)
    with pytest.raises(popart.OnnxImportError, match="mode must be 'avg' or 'max'"):
        run_nodes([N("RoiAlign", ["x", "r", "b"], ["y"], mode="sum", sampling_ratio=2)],
                  {"x": XR, "r": ROIS, "b": BATCH}, opset=20)


def test_maxunpool_errors() -> None:
    c = UNPOOL_CASES[0]
    with pytest.raises(popart.OnnxImportError, match="output_shape"):
        run_nodes([N("MaxUnpool", ["p", "i", "o"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], c.inputs,
                  {"o": i64(2, 3, 3, 6)}, opset=20)
    with pytest.raises(popart.OnnxImportError, match="required attribute\\(s\\) 'kernel_shape' of MaxUnpool"):
        run_nodes([N("MaxUnpool", ["p", "i"], ["y"])], c.inputs, opset=20)


def test_col2im_errors() -> None:
    shapes = {"im": i64(5, 5), "bl": i64(2, 2)}
    with pytest.raises(popart.OnnxImportError, match="input must be"):  # 16 blocks of 2x2 fit, not 15
        run_nodes([N("Col2Im", ["x", "im", "bl"], ["y"])], {"x": f32(1, 4, 15)}, shapes, opset=18)
    with pytest.raises(popart.OnnxImportError, match="must be known at import"):
        run_nodes([N("Col2Im", ["x", "im", "bl"], ["y"])], {"x": f32(1, 4, 16), "im": i64(5, 5)},
                  {"bl": i64(2, 2)}, opset=18)
