"""LSTM, GRU and RNN, built with onnx.helper, imported and run in an InferenceSession.

Against ONNX's reference evaluator where it implements the feature. It ignores sequence_lens, clip,
input_forget and LSTM/GRU activations, so those cases are checked against a NumPy oracle written
here from the ONNX operator spec.
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import pytest
import popart
from popart_helpers import check_against_reference, make_model, run_nodes, run_session
from test_onnx_ops import Case, N, f32, i64, pos  # noqa: F401  (pos, i64: shared harness)

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

T, B, I, H = 4, 3, 5, 6  # sequence length, batch, input size, hidden size
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def weights(op: str, d: int = 1, bias: bool = False, peep: bool = False) -> Dict[str, np.ndarray]:
    g = GATES[op]
    w = {"W": f32(d, g * H, I) * 0.5, "R": f32(d, g * H, H) * 0.5}
    if bias:
        w["B"] = f32(d, 2 * g * H) * 0.5
    if peep:
        w["P"] = f32(d, 3 * H) * 0.5
    return w


def rnn_case(id: str, op: str, outputs: Sequence[str], *, d: int = 1, bias: bool = False, peep: bool = False,
             init_h: bool = False, init_c: bool = False, layout: int = 0, opset: int = 17,
             **attrs) -> Case:
    """A one-node model: X is a graph input, the weights initializers, the initial states inputs."""
    w = weights(op, d, bias, peep)
    feeds = {"X": f32(B, T, I) if layout else f32(T, B, I)}
    state = (B, d, H) if layout else (d, B, H)
    if init_h:
        feeds["h0"] = f32(*state)
    if init_c:
        feeds["c0"] = f32(*state)
    names = ["X", "W", "R", "B" if bias else "", "", "h0" if init_h else "", "c0" if init_c else "",
             "P" if peep else ""]
    while names[-1] == "":
        names.pop()
    outs = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    outs = [o if o in outputs else "" for o in outs]
    while outs[-1] == "":
        outs.pop()
    if layout:
        attrs["layout"] = layout
    node = N(op, names, outs, hidden_size=H, **attrs)
    return Case(id, [node], feeds, list(outputs), w, opset=opset, tol=1e-4)


BI = {"direction": "bidirectional"}
REV = {"direction": "reverse"}
CASES = [
    *[c for op in ("RNN", "GRU", "LSTM") for c in (
        rnn_case(f"{op}-defaults", op, ["Y", "Y_h"]),
        rnn_case(f"{op}-opset11", op, ["Y", "Y_h"], opset=11),
        rnn_case(f"{op}-opset22", op, ["Y", "Y_h"], opset=22),
        rnn_case(f"{op}-bias-initial_h", op, ["Y", "Y_h"], bias=True, init_h=True),
        rnn_case(f"{op}-reverse", op, ["Y", "Y_h"], bias=True, init_h=True, **REV),
        rnn_case(f"{op}-bidirectional", op, ["Y", "Y_h"], d=2, bias=True, init_h=True, **BI),
        rnn_case(f"{op}-layout1", op, ["Y", "Y_h"], d=2, bias=True, init_h=True, layout=1, **BI),
        rnn_case(f"{op}-only-Y", op, ["Y"], bias=True),
        rnn_case(f"{op}-only-Y_h", op, ["Y_h"], **REV),
    )],
    rnn_case("LSTM-all-outputs", "LSTM", ["Y", "Y_h", "Y_c"], bias=True, init_h=True, init_c=True),
    rnn_case("LSTM-only-Y_c", "LSTM", ["Y_c"], bias=True, init_c=True),
    rnn_case("LSTM-peepholes", "LSTM", ["Y", "Y_h", "Y_c"], bias=True, init_h=True, init_c=True, peep=True),
    rnn_case("LSTM-peepholes-bidirectional-layout1", "LSTM", ["Y", "Y_h", "Y_c"], d=2, bias=True, init_h=True,
             init_c=True, peep=True, layout=1, **BI),
    rnn_case("GRU-linear_before_reset", "GRU", ["Y", "Y_h"], bias=True, init_h=True, linear_before_reset=1),
    rnn_case("GRU-linear_before_reset-nobias", "GRU", ["Y", "Y_h"], linear_before_reset=1),
    rnn_case("GRU-linear_before_reset-bidirectional", "GRU", ["Y", "Y_h"], d=2, bias=True,
             linear_before_reset=1, **BI),
    # The reference evaluator implements RNN's Tanh and Affine (with one alpha/beta per activation),
    # and runs both directions with the first one: different functions per direction are oracle cases.
    rnn_case("RNN-Affine-bidirectional", "RNN", ["Y", "Y_h"], d=2, bias=True, **BI,
             activations=["Affine", "Affine"], activation_alpha=[0.5, 0.5], activation_beta=[0.1, 0.1]),
    rnn_case("RNN-Affine-reverse", "RNN", ["Y", "Y_h"], bias=True, **REV,
             activations=["Affine"], activation_alpha=[0.7], activation_beta=[-0.2]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_matches_reference(case: Case) -> None:
    model = make_model(case.nodes, case.inputs, case.outputs, case.inits, case.opset)
    check_against_reference(model, case.inputs, case.outputs, rtol=case.tol, atol=case.tol)


# NumPy oracle, from the operator spec --------------------------------------------------------------------
def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


NP_ACT: Dict[str, Callable[[np.ndarray, float, float], np.ndarray]] = {
    "Relu": lambda x, a, b: np.maximum(x, 0), "Tanh": lambda x, a, b: np.tanh(x),
    "Sigmoid": lambda x, a, b: sigmoid(x), "Affine": lambda x, a, b: a * x + b,
    "LeakyRelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "ThresholdedRelu": lambda x, a, b: np.where(x >= a, x, 0),
    "ScaledTanh": lambda x, a, b: a * np.tanh(b * x),
    "HardSigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "Elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)),
    "Softsign": lambda x, a, b: x / (1 + np.abs(x)), "Softplus": lambda x, a, b: np.log1p(np.exp(x)),
}


def oracle(op: str, X: np.ndarray, W: np.ndarray, R: np.ndarray, Bias: Optional[np.ndarray] = None,
           lens: Optional[np.ndarray] = None, h0: Optional[np.ndarray] = None, c0: Optional[np.ndarray] = None,
           P: Optional[np.ndarray] = None, direction: str = "forward", layout: int = 0,
           acts: Optional[List[Callable[[np.ndarray], np.ndarray]]] = None, clip: Optional[float] = None,
           linear_before_reset: int = 0, input_forget: int = 0) -> List[np.ndarray]:
    """Y, Y_h (, Y_c) in float64, one batch entry and one time step at a time."""
    X, W, R = (np.asarray(a, np.float64) for a in (X, W, R))
    if layout:
        X = X.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    seq, batch, _ = X.shape
    D, gh, hidden = R.shape
    Bias = np.zeros((D, 2 * gh)) if Bias is None else Bias.astype(np.float64)
    lens = np.full(batch, seq) if lens is None else lens
    h0 = np.zeros((D, batch, hidden)) if h0 is None else h0.astype(np.float64)
    c0 = np.zeros((D, batch, hidden)) if c0 is None else c0.astype(np.float64)
    P = np.zeros((D, 3 * hidden)) if P is None else P.astype(np.float64)
    k = {"RNN": 1, "GRU": 2, "LSTM": 3}[op]
    acts = acts or {"RNN": [np.tanh], "GRU": [sigmoid, np.tanh], "LSTM": [sigmoid, np.tanh, np.tanh]}[op] * D

    def cl(v: np.ndarray) -> np.ndarray:
        return v if clip is None else np.clip(v, -clip, clip)

    Y = np.zeros((seq, D, batch, hidden))
    Yh, Yc = h0.copy(), c0.copy()
    for d in range(D):
        f = acts[d * k:(d + 1) * k]
        Wb, Rb = Bias[d, :gh], Bias[d, gh:]
        for b in range(batch):
            h, c = h0[d, b], c0[d, b]
            times = range(lens[b])
            for t in (reversed(times) if direction == "reverse" or d == 1 else times):
                xw = X[t, b] @ W[d].T + Wb
                hr = h @ R[d].T + Rb
                if op == "RNN":
                    h = f[0](cl(xw + hr))
                elif op == "GRU":
                    z = f[0](cl(xw[:hidden] + hr[:hidden]))
                    r = f[0](cl(xw[hidden:2 * hidden] + hr[hidden:2 * hidden]))
                    if linear_before_reset:
                        hh = f[1](cl(xw[2 * hidden:] + r * hr[2 * hidden:]))
                    else:
                        hh = f[1](cl(xw[2 * hidden:] + (r * h) @ R[d, 2 * hidden:].T + Rb[2 * hidden:]))
                    h = (1 - z) * hh + z * h
                else:
                    g = xw + hr
                    gi, go, gf, gc = (g[j * hidden:(j + 1) * hidden] for j in range(4))
                    pi, po, pf = P[d, :hidden], P[d, hidden:2 * hidden], P[d, 2 * hidden:]
                    i = f[0](cl(gi + pi * c))
                    fg = 1 - i if input_forget else f[0](cl(gf + pf * c))
                    c = fg * c + i * f[1](cl(gc))
                    o = f[0](cl(go + po * c))
                    h = o * f[2](c)
                Y[t, d, b] = h
            Yh[d, b], Yc[d, b] = h, c
    outs = [Y, Yh, Yc][:3 if op == "LSTM" else 2]
    if layout:
        outs = [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]
    return outs


def np_act(name: str, alpha: float = 0.0, beta: float = 0.0) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: NP_ACT[name](x, alpha, beta)


class OracleCase(NamedTuple):
    id: str
    op: str
    attrs: dict
    d: int = 1
    lens: Optional[np.ndarray] = None  # sequence_lens
    lens_on_device: bool = False  # sequence_lens as a graph input rather than an initializer
    layout: int = 0
    peep: bool = False
    acts: Optional[list] = None  # the oracle's activation functions, when the node names others
    tol: float = 1e-4


LENS = np.array([4, 1, 3], np.int32)
ORACLE_CASES = [
    *[c for op in ("RNN", "GRU", "LSTM") for c in (
        OracleCase(f"{op}-seq_lens-known", op, {}, lens=LENS),
        OracleCase(f"{op}-seq_lens-device", op, {}, lens=LENS, lens_on_device=True),
        OracleCase(f"{op}-seq_lens-reverse-known", op, REV, lens=LENS),
        OracleCase(f"{op}-seq_lens-reverse-device", op, REV, lens=LENS, lens_on_device=True),
        OracleCase(f"{op}-seq_lens-bidirectional-layout1", op, BI, d=2, lens=np.array([2, 4, 0], np.int32),
                   lens_on_device=True, layout=1),
        OracleCase(f"{op}-clip", op, {"clip": 0.3}, lens=LENS),
    )],
    OracleCase("LSTM-seq_lens-peepholes-bidirectional", "LSTM", BI, d=2, lens=LENS, peep=True),
    OracleCase("LSTM-input_forget", "LSTM", {"input_forget": 1}, peep=True),
    OracleCase("GRU-linear_before_reset-seq_lens-clip", "GRU", {"linear_before_reset": 1, "clip": 0.5},
               lens=LENS),
    OracleCase("LSTM-activations", "LSTM", {"activations": ["HardSigmoid", "Elu", "Softsign"],
                                            "activation_alpha": [0.3, 0.7], "activation_beta": [0.4]},
               acts=[np_act("HardSigmoid", 0.3, 0.4), np_act("Elu", 0.7), np_act("Softsign")]),
    OracleCase("LSTM-activations-bidirectional", "LSTM",
               {**BI, "activations": ["Sigmoid", "Tanh", "Tanh", "Affine", "ScaledTanh", "Softplus"],
                "activation_alpha": [0.5, 0.8], "activation_beta": [0.1, 1.5]}, d=2,
               acts=[np_act("Sigmoid"), np_act("Tanh"), np_act("Tanh"), np_act("Affine", 0.5, 0.1),
                     np_act("ScaledTanh", 0.8, 1.5), np_act("Softplus")]),
    OracleCase("GRU-activations-defaults", "GRU", {"activations": ["HardSigmoid", "LeakyRelu"]},
               acts=[np_act("HardSigmoid", 0.2, 0.5), np_act("LeakyRelu", 0.01)]),
    OracleCase("GRU-activations-lowercase", "GRU", {"activations": ["sigmoid", "thresholdedrelu"],
                                                    "activation_alpha": [0.2]},
               acts=[np_act("Sigmoid"), np_act("ThresholdedRelu", 0.2)]),
    OracleCase("RNN-Relu", "RNN", {"activations": ["Relu"]}, acts=[np_act("Relu")]),
    OracleCase("RNN-activation-one-per-function", "RNN",
               {**BI, "activations": ["Tanh", "LeakyRelu"], "activation_alpha": [9.0, 0.3]}, d=2,
               acts=[np_act("Tanh"), np_act("LeakyRelu", 0.3)]),
]


@pytest.mark.parametrize("case", ORACLE_CASES, ids=lambda c: c.id)
def test_op_matches_numpy_oracle(case: OracleCase) -> None:
    c = rnn_case(case.id, case.op, ["Y", "Y_h", "Y_c"] if case.op == "LSTM" else ["Y", "Y_h"], d=case.d,
                 bias=True, init_h=True, init_c=case.op == "LSTM", layout=case.layout, peep=case.peep,
                 **case.attrs)
    node, feeds, inits = c.nodes[0], dict(c.inputs), dict(c.inits)
    if case.lens is not None:
        node.input[4] = "lens"
        (feeds if case.lens_on_device else inits)["lens"] = case.lens
    model = make_model([node], feeds, c.outputs, inits, c.opset)
    got = run_session(model, feeds, c.outputs)
    want = oracle(case.op, feeds["X"], inits["W"], inits["R"], inits["B"], case.lens, feeds["h0"], feeds.get("c0"),
                  inits.get("P"), case.attrs.get("direction", "forward"), case.layout, case.acts,
                  case.attrs.get("clip"), case.attrs.get("linear_before_reset", 0), case.attrs.get("input_forget", 0))
    for name, g, w in zip(c.outputs, got, want):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=case.tol, atol=case.tol, err_msg=name)


def test_oracle_agrees_with_reference_evaluator() -> None:
    # The oracle's own check, on a case both implement.
    c = rnn_case("x", "LSTM", ["Y", "Y_h", "Y_c"], d=2, bias=True, init_h=True, init_c=True, peep=True, **BI)
    from popart_helpers import reference
    model = make_model(c.nodes, c.inputs, c.outputs, c.inits, c.opset)
    want = reference(model, c.inputs, c.outputs)
    got = oracle("LSTM", c.inputs["X"], c.inits["W"], c.inits["R"], c.inits["B"], None, c.inputs["h0"],
                 c.inputs["c0"], c.inits["P"], "bidirectional")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# errors -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs, inits, match", [
    ({"direction": "sideways"}, {}, "direction must be"),
    ({"activations": ["Tanh", "Swish"]}, {}, "unknown activation 'Swish'"),
    ({"activations": ["Tanh"]}, {}, "activations must list 2"),
    ({"hidden_size": H + 1}, {}, r"W \(input 1\) must have shape"),
    ({}, {"W": f32(1, 3 * H, I + 1)}, r"W \(input 1\) must have shape"),
    ({}, {"R": f32(1, 3 * H, H - 1)}, r"R \(input 2\) must have shape \[1, 18, 6\]"),
    ({}, {"B": f32(1, 3 * H)}, r"B \(input 3\) must have shape"),
    ({"direction": "bidirectional"}, {}, r"W \(input 1\) must have shape \[2,"),
    ({"activation_alpha": [0.1, 0.2, 0.3]}, {}, "activation_alpha has more values"),
    ({"clip": -1.0}, {}, "clip must be >= 0"),
])
def test_bad_gru_fails(attrs: dict, inits: Dict[str, np.ndarray], match: str) -> None:
    w = {**weights("GRU", bias=True), **inits}
    node = N("GRU", ["X", "W", "R", "B"], ["Y"], **{"hidden_size": H, **attrs})
    with pytest.raises(popart.OnnxImportError, match=match):
        run_nodes([node], {"X": f32(T, B, I)}, w)


def test_bad_sequence_lens_fails() -> None:
    node = N("RNN", ["X", "W", "R", "", "lens"], ["Y"], hidden_size=H)
    with pytest.raises(popart.OnnxImportError, match=r"sequence_lens must lie in \[0, 4\]"):
        run_nodes([node], {"X": f32(T, B, I)}, {**weights("RNN"), "lens": np.array([1, 5, 2], np.int32)})
    with pytest.raises(popart.OnnxImportError, match=r"sequence_lens \(input 4\) must have shape \[3\]"):
        run_nodes([node], {"X": f32(T, B, I)}, {**weights("RNN"), "lens": np.array([1, 2], np.int32)})


def test_bad_initial_state_and_rank_fail() -> None:
    node = N("LSTM", ["X", "W", "R", "", "", "h0"], ["Y"], hidden_size=H)
    with pytest.raises(popart.OnnxImportError, match=r"initial_h \(input 5\) must have shape \[1, 3, 6\]"):
        run_nodes([node], {"X": f32(T, B, I), "h0": f32(1, B + 1, H)}, weights("LSTM"))
    node = N("LSTM", ["X", "W", "R"], ["Y"], hidden_size=H)
    with pytest.raises(popart.OnnxImportError, match="X must have rank 3"):
        run_nodes([node], {"X": f32(T, B * I)}, weights("LSTM"))


def test_constant_inputs_are_not_folded_by_the_reference() -> None:
    # With every input a Constant the importer could fold the node with ONNX's reference evaluator,
    # which ignores clip and sequence_lens; the result must still follow the spec.
    from onnx import numpy_helper
    x, w = f32(T, B, I), weights("GRU", bias=True)
    consts = [N("Constant", [], [k], value=numpy_helper.from_array(v, k))
              for k, v in {"X": x, **w, "lens": LENS}.items()]
    node = N("GRU", ["X", "W", "R", "B", "lens"], ["Y", "Y_h"], hidden_size=H, clip=0.2)
    model = make_model(consts + [node], {"dummy": f32(1)}, ["Y", "Y_h"])
    got = run_session(model, {"dummy": f32(1)}, ["Y", "Y_h"])
    want = oracle("GRU", x, w["W"], w["R"], w["B"], LENS, clip=0.2)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-4)
