"""Op table entries for the recurrent ops: LSTM, GRU and RNN, unrolled over the (static) sequence
length. The three share one driver (``_recurrent``): it projects the input of every time step and
direction with one matmul, orders the steps of each direction, and runs a cell function per step;
the ops differ only in the cell (number of gates and of states) and in their default activations.
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

import popxl
import popxl.ops as ops
from popxl.ops.elementwise import sigmoid
from popart.onnx.elementwise import _activation, _less
from popart.onnx.table import Node, Value, _as_int32, _scalar, _stack, _unstack, onnx_op

Activation = Callable[[popxl.Tensor], popxl.Tensor]


# activations ------------------------------------------------------------------------------------------
class _ActivationSpec(NamedTuple):
    name: str  # the ONNX op of the same name, as _activation knows it
    alpha: Optional[float]  # default alpha; None: the function takes no alpha
    beta: Optional[float]  # default beta; None: the function takes no beta


# The activations the recurrent ops accept (matched case-insensitively, as onnxruntime does), with
# the defaults of the ONNX ops of the same names (Affine and ScaledTanh: of the retired ops).
_ACTIVATIONS: Dict[str, _ActivationSpec] = {s.name.lower(): s for s in (
    _ActivationSpec("Relu", None, None), _ActivationSpec("Tanh", None, None),
    _ActivationSpec("Sigmoid", None, None), _ActivationSpec("Affine", 1.0, 0.0),
    _ActivationSpec("LeakyRelu", 0.01, None), _ActivationSpec("ThresholdedRelu", 1.0, None),
    _ActivationSpec("ScaledTanh", 1.0, 1.0), _ActivationSpec("HardSigmoid", 0.2, 0.5),
    _ActivationSpec("Elu", 1.0, None), _ActivationSpec("Softsign", None, None),
    _ActivationSpec("Softplus", None, None))}


def _make_activation(name: str, alpha: Optional[float], beta: Optional[float]) -> Activation:
    if name == "Relu":
        return ops.relu
    if name == "Tanh":
        return ops.tanh
    if name == "Sigmoid":
        return sigmoid
    # the parameters the function takes: those its spec has a default for (_activations gives them)
    attrs = {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
    if name == "Affine":
        a, b = attrs["alpha"], attrs["beta"]
        return lambda x: ops.add(ops.mul(x, _scalar(a, x)), _scalar(b, x))
    if name == "ScaledTanh":
        a, b = attrs["alpha"], attrs["beta"]
        return lambda x: ops.mul(_scalar(a, x), ops.tanh(ops.mul(x, _scalar(b, x))))
    if name == "LeakyRelu":
        a = attrs["alpha"]
        return lambda x: ops.where(_less(x, _scalar(0.0, x)), ops.mul(x, _scalar(a, x)), x)
    return lambda x: _activation(name, x, attrs.get)


def _activations(n: Node, defaults: Sequence[str], directions: int) -> List[List[Activation]]:
    """The activation functions of each direction, from the activations/activation_alpha/beta attributes."""
    names = n.attr("activations")
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in names] if names is not None \
        else list(defaults) * directions
    if len(names) != len(defaults) * directions:
        raise n.fail(f"activations must list {len(defaults) * directions} functions ({len(defaults)} per direction), "
                     f"got {len(names)}: {names}")
    specs = []
    for name in names:
        spec = _ACTIVATIONS.get(name.lower())
        if spec is None:
            known = sorted(s.name for s in _ACTIVATIONS.values())
            raise n.fail(f"unknown activation {name!r}; expected one of {known}")
        specs.append(spec)

    def params(attr: str, default_of: Callable[[_ActivationSpec], Optional[float]]) -> List[Optional[float]]:
        given = [float(v) for v in (n.attr(attr) or [])]
        if len(given) == len(specs):
            # One value per activation (as ONNX's reference evaluator reads the list).
            return [g if default_of(s) is not None else None for g, s in zip(given, specs)]
        # Otherwise consumed in order by the activations that take the parameter (as onnxruntime reads it).
        out, it = [], iter(given)
        for s in specs:
            out.append(None if default_of(s) is None else next(it, default_of(s)))
        if next(it, None) is not None:
            raise n.fail(f"{attr} has more values ({len(given)}) than the activations {names} take")
        return out

    alphas = params("activation_alpha", lambda s: s.alpha)
    betas = params("activation_beta", lambda s: s.beta)
    fns = [_make_activation(s.name, a, b) for s, a, b in zip(specs, alphas, betas)]
    k = len(defaults)
    return [fns[d * k:(d + 1) * k] for d in range(directions)]


# cells ------------------------------------------------------------------------------------------------
class _Direction(NamedTuple):
    """What a cell needs of one direction: its recurrence weights (transposed) and per-op extras."""
    r_t: popxl.Tensor  # R^T, [hidden, gates * hidden]
    acts: List[Activation]
    clip: Optional[float]
    peep: Optional[List[popxl.Tensor]]  # LSTM: P split into [Pi, Po, Pf], each [hidden]
    r_bias_h: Optional[popxl.Tensor]  # GRU with linear_before_reset: Rbh, [hidden]
    r_split: Optional[Tuple[popxl.Tensor, popxl.Tensor]]  # GRU otherwise: (R_zr^T, R_h^T)
    input_forget: bool  # LSTM: the forget gate is coupled to the input gate


# A cell: (x projection of one step [batch, gates*hidden], previous states, direction) -> new states.
Cell = Callable[[popxl.Tensor, List[popxl.Tensor], _Direction], List[popxl.Tensor]]


def _clipped(x: popxl.Tensor, clip: Optional[float]) -> popxl.Tensor:
    # ONNX: the clip bounds the inputs of the activations.
    return x if clip is None else ops.clip(x, -clip, clip)


def _rnn_cell(xg: popxl.Tensor, states: List[popxl.Tensor], d: _Direction) -> List[popxl.Tensor]:
    h = states[0]
    return [d.acts[0](_clipped(ops.add(xg, ops.matmul(h, d.r_t)), d.clip))]


def _gru_cell(xg: popxl.Tensor, states: List[popxl.Tensor], d: _Direction) -> List[popxl.Tensor]:
    h = states[0]
    f, g = d.acts
    hidden = h.shape[-1]
    xz, xr, xh = ops.split(xg, 3, axis=1)
    if d.r_bias_h is not None:  # linear_before_reset: r scales (H R_h^T + Rb_h)
        hz, hr, hh = ops.split(ops.matmul(h, d.r_t), 3, axis=1)
        z = f(_clipped(ops.add(xz, hz), d.clip))
        r = f(_clipped(ops.add(xr, hr), d.clip))
        cand = g(_clipped(ops.add(xh, ops.mul(r, ops.add(hh, d.r_bias_h))), d.clip))
    else:  # r scales H before its product with R_h (whose bias is in the x projection)
        assert d.r_split is not None, "a GRU direction has Rb_h (linear_before_reset) or R split in two"
        r_zr_t, r_h_t = d.r_split
        hz, hr = ops.split(ops.matmul(h, r_zr_t), [hidden, hidden], axis=1)
        z = f(_clipped(ops.add(xz, hz), d.clip))
        r = f(_clipped(ops.add(xr, hr), d.clip))
        cand = g(_clipped(ops.add(xh, ops.matmul(ops.mul(r, h), r_h_t)), d.clip))
    # (1 - z) cand + z h, with one multiplication
    return [ops.add(cand, ops.mul(z, ops.sub(h, cand)))]


def _lstm_cell(xg: popxl.Tensor, states: List[popxl.Tensor], d: _Direction) -> List[popxl.Tensor]:
    h, c = states
    f, g, act_h = d.acts
    i, o, fg, cand = ops.split(ops.add(xg, ops.matmul(h, d.r_t)), 4, axis=1)
    if d.peep is not None:
        p_i, _, p_f = d.peep  # iof; P_o acts on the new cell state below
        i = ops.add(i, ops.mul(p_i, c))
        fg = ops.add(fg, ops.mul(p_f, c))
    i = f(_clipped(i, d.clip))
    if d.input_forget:
        fg = ops.sub(_scalar(1.0, i), i)  # the forget gate coupled to the input gate
    else:
        fg = f(_clipped(fg, d.clip))
    c_new = ops.add(ops.mul(fg, c), ops.mul(i, g(_clipped(cand, d.clip))))
    if d.peep is not None:
        o = ops.add(o, ops.mul(d.peep[1], c_new))
    o = f(_clipped(o, d.clip))
    return [ops.mul(o, act_h(c_new)), c_new]


class _Op(NamedTuple):
    gates: int
    states: int
    activations: Tuple[str, ...]
    cell: Cell


_KINDS: Dict[str, _Op] = {
    "RNN": _Op(1, 1, ("Tanh",), _rnn_cell),
    "GRU": _Op(3, 1, ("Sigmoid", "Tanh"), _gru_cell),
    "LSTM": _Op(4, 2, ("Sigmoid", "Tanh", "Tanh"), _lstm_cell),
}


# the shared driver ------------------------------------------------------------------------------------
def _expect_shape(n: Node, i: int, what: str, want: Tuple[int, ...]) -> None:
    got = tuple(n.shape(i))
    if got != want:
        raise n.fail(f"{what} (input {i}) must have shape {list(want)}, got {list(got)}")


# sequence_lens: known at import (int64 [batch]), computed on the device (int32 [batch]), or None
# when every entry is full length
Lengths = Union[np.ndarray, popxl.Tensor, None]


def _seq_lens(n: Node, seq: int, batch: int) -> Lengths:
    """sequence_lens, as ``Lengths`` says."""
    if not n.has(4):
        return None
    _expect_shape(n, 4, "sequence_lens", (batch,))
    given = n.imp.static(n.proto.input[4])
    if given is None:
        return _as_int32(n.x(4))
    known = np.asarray(given).astype(np.int64).reshape(batch)
    if (known < 0).any() or (known > seq).any():
        raise n.fail(f"sequence_lens must lie in [0, {seq}], got {known.tolist()}")
    return None if (known == seq).all() else known


def _reverse_index(seq: int, batch: int, lens: Union[np.ndarray, popxl.Tensor]) -> popxl.Tensor:
    """Row indices into [seq * batch] rows that reverse each batch entry within its own length:
    step k of entry b reads time lens[b] - 1 - k; steps past the length read themselves (unused)."""
    k = np.arange(seq).reshape(seq, 1)
    col = np.arange(batch).reshape(1, batch)
    if isinstance(lens, np.ndarray):
        t = np.where(k < lens.reshape(1, batch), lens.reshape(1, batch) - 1 - k, k)
        return popxl.constant((t * batch + col).astype(np.int32))
    row_lens = ops.reshape(lens, (1, batch))
    k_t = popxl.constant(np.broadcast_to(k, (seq, batch)).astype(np.int32))
    t_t = ops.where(ops.greater(row_lens, k_t), ops.sub(ops.sub(row_lens, _scalar(1, lens)), k_t), k_t)
    return ops.add(ops.mul(t_t, _scalar(batch, lens)), popxl.constant(col.astype(np.int32)))


def _step_masks(seq: int, batch: int, lens: Lengths) -> List[Optional[popxl.Tensor]]:
    """Per step, a [batch, 1] bool mask of the entries still within their length (None: all are)."""
    if lens is None:
        return [None] * seq
    if isinstance(lens, np.ndarray):
        return [None if (lens > k).all() else popxl.constant((lens > k).reshape(batch, 1)) for k in range(seq)]
    k = popxl.constant(np.arange(seq, dtype=np.int32).reshape(seq, 1, 1))
    return list(_unstack(ops.greater(ops.reshape(lens, (1, batch, 1)), k)))  # [seq, batch, 1] by step


def _recurrent(n: Node) -> List[Optional[Value]]:
    op = _KINDS[n.op_type]
    G = op.gates
    direction = n.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise n.fail(f"direction must be 'forward', 'reverse' or 'bidirectional', got {direction!r}")
    D = 2 if direction == "bidirectional" else 1
    layout = int(n.attr("layout", 0))
    if layout not in (0, 1):
        raise n.fail(f"layout must be 0 or 1, got {layout}")

    x = n.x(0)
    if len(n.shape(0)) != 3:
        raise n.fail(f"X must have rank 3, got shape {list(n.shape(0))}")
    if layout:  # batch-first: compute time-major
        x = ops.transpose(x, (1, 0, 2))
    seq, batch, inp = (int(s) for s in x.shape)
    r_shape = tuple(n.shape(2))
    if len(r_shape) != 3:
        raise n.fail(f"R must have rank 3, got shape {list(r_shape)}")
    hidden = int(n.attr("hidden_size", r_shape[-1]))
    _expect_shape(n, 1, "W", (D, G * hidden, inp))
    _expect_shape(n, 2, "R", (D, G * hidden, hidden))
    dtype = x.dtype.as_numpy()
    lbr = n.op_type == "GRU" and bool(n.attr("linear_before_reset", 0))
    clip = n.attr("clip")
    clip = None if clip is None else float(clip)
    if clip is not None and clip < 0:
        raise n.fail(f"clip must be >= 0, got {clip}")
    acts = _activations(n, op.activations, D)

    # The input projection of every step and direction, biases included: one matmul.
    w_t = ops.transpose(ops.reshape(n.x(1), (D * G * hidden, inp)), (1, 0))
    proj = ops.matmul(ops.reshape(x, (seq * batch, inp)), w_t)  # [seq * batch, D * G * hidden]
    r_bias_h: List[Optional[popxl.Tensor]] = [None] * D
    if n.has(3):
        _expect_shape(n, 3, "B", (D, 2 * G * hidden))
        wb, rb = ops.split(n.x(3), 2, axis=1)
        if lbr:  # Rb_h is added inside the reset-gate product, not here
            rb_zr, rb_h = ops.split(rb, [2 * hidden, hidden], axis=1)
            rb = ops.concat([rb_zr, popxl.constant(np.zeros((D, hidden), dtype))], axis=1)
            r_bias_h = list(_unstack(rb_h))
        proj = ops.add(proj, ops.reshape(ops.add(wb, rb), (1, D * G * hidden)))
    elif lbr:
        r_bias_h = [popxl.constant(np.zeros((hidden,), dtype))] * D
    proj = ops.reshape(proj, (seq * batch, D, G * hidden))
    projs = _unstack(proj, 1)

    lens = _seq_lens(n, seq, batch)
    masks = _step_masks(seq, batch, lens)
    rev_index = _reverse_index(seq, batch, lens) if lens is not None and direction != "forward" else None

    def per_direction(i: int, what: str, shape: Tuple[int, ...], state: bool = False) -> List[popxl.Tensor]:
        """Optional input ``i`` split by direction (zeros when absent); ``state``: an initial state,
        [D, batch, hidden] or, batch-first, [batch, D, hidden]."""
        if not n.has(i):
            return [popxl.constant(np.zeros(shape, dtype))] * D
        _expect_shape(n, i, what, ((batch, D) if layout else (D, batch)) + shape[1:] if state else (D,) + shape)
        t = n.x(i)
        if layout and state:
            t = ops.transpose(t, (1, 0, 2))
        return _unstack(t)

    states0 = [per_direction(5, "initial_h", (batch, hidden), state=True)]
    if op.states == 2:
        states0.append(per_direction(6, "initial_c", (batch, hidden), state=True))
    peeps = per_direction(7, "P", (3 * hidden,)) if n.op_type == "LSTM" and n.has(7) else None
    rs = _unstack(n.x(2))
    want_y = n.n_outputs > 0 and n.proto.output[0] != ""
    zero = popxl.constant(np.zeros((), dtype))

    ys, finals = [], []
    for d in range(D):
        reverse = direction == "reverse" or d == 1
        r_t = ops.transpose(rs[d], (1, 0))
        r_split = None
        if n.op_type == "GRU" and not lbr:
            r_zr_t, r_h_t = ops.split(r_t, [2 * hidden, hidden], axis=1)
            r_split = (r_zr_t, r_h_t)
        cfg = _Direction(r_t, acts[d], clip, ops.split(peeps[d], 3, axis=0) if peeps else None, r_bias_h[d],
                         r_split, bool(n.attr("input_forget", 0)))

        p = projs[d]
        if reverse and rev_index is not None:  # each entry runs back from its own last valid step
            p = ops.gather(p, rev_index, axis=0)  # [seq, batch, G * hidden]
        p = ops.reshape(p, (seq, batch, G * hidden))
        steps = _unstack(p)
        if reverse and rev_index is None:
            steps = steps[::-1]

        states = [s[d] for s in states0]
        outs: List[popxl.Tensor] = []
        for xg, mask in zip(steps, masks):
            new = op.cell(xg, states, cfg)
            if mask is not None:  # entries past their length keep their state and output zeros
                new = [ops.where(mask, s_new, s_old) for s_new, s_old in zip(new, states)]
                outs.append(ops.where(mask, new[0], zero) if want_y else new[0])
            else:
                outs.append(new[0])
            states = new
        finals.append(states)
        if want_y:
            if reverse and rev_index is None:
                outs = outs[::-1]
            y = _stack(outs)
            if reverse and rev_index is not None:  # the same index maps steps back to times
                y = ops.gather(ops.reshape(y, (seq * batch, hidden)), rev_index, axis=0)  # [seq, batch, hidden]
            ys.append(y)

    y_all = None
    if want_y:
        y_all = _stack(ys, 1)  # [seq, D, batch, hidden]
        if layout:
            y_all = ops.transpose(y_all, (2, 0, 1, 3))
    results: List[Optional[Value]] = [y_all]
    for s in range(op.states):  # Y_h, then Y_c
        last = _stack([f[s] for f in finals])
        results.append(ops.transpose(last, (1, 0, 2)) if layout else last)
    return results


# Never folded at import: ONNX's reference evaluator, which folding runs, ignores sequence_lens, clip,
# input_forget and most activations, so a node whose inputs are all constants is lowered like any other.
@onnx_op("LSTM", "GRU", "RNN", foldable=False)
def _recurrent_entry(n: Node) -> List[Optional[Value]]:
    return _recurrent(n)

