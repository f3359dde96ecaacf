"""popxl.ops.var_updates: in-place variable updates and optimiser building blocks.

Every ``*_`` op here modifies its first argument ``t`` in place and returns an alias of it.
Scalar arguments (``f``, ``step``, ``beta1``, ...) are Python numbers (stored as attributes)
or scalar tensors (extra inputs, in argument order; the attribute is then ``None``).
``t`` and ``X`` must have the same shape (no broadcasting); their dtypes may differ. Kernels
compute in float32 (float64 when an operand is float64 or an integer) and round once to the
dtype of ``t`` (of the first accumulator for the updaters). No op here has a gradient.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from popxl.op import Grad, OpDef, create_op, register, user_location
from popxl.ops.elementwise import add_
from popxl.ops.utils import convert, normalize_axes, spec
from popxl.tensor import Tensor, TensorSpec, constant

__all__ = ["accumulate_", "accumulate_square_", "accumulate_mean_", "accumulate_moving_average_",
           "accumulate_moving_average_square_", "accumulator_scale_", "accumulator_zero_", "sparse_accumulate_",
           "copy_var_update_", "adam_updater", "lamb_updater", "adamax_updater", "adam_var_update"]

Scalar = Union[float, Tensor]


# helpers -----------------------------------------------------------------------------------------
def _wide(*arrays: np.ndarray) -> np.dtype:
    """The compute dtype: float64 if any operand is float64 or an integer, else float32."""
    if any(a.dtype.kind in "iub" or a.dtype.itemsize >= 8 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


class _Scalars:
    """Reads scalar parameters in order: an attribute value, or (attribute None) the next tensor."""

    def __init__(self, tensors: Sequence[np.ndarray], wide: np.dtype) -> None:
        self._it = iter(tensors)
        self._wide = wide

    def __call__(self, attr: Optional[float]) -> np.ndarray:
        value = next(self._it).reshape(()) if attr is None else attr
        return np.asarray(value).astype(self._wide)


def _scalar_args(opname: str, **scalars: Any) -> Tuple[List[Tensor], Dict[str, Optional[float]]]:
    """Split scalar arguments into extra tensor inputs and float attributes (None = tensor)."""
    tensors: List[Tensor] = []
    attrs: Dict[str, Optional[float]] = {}
    for name, value in scalars.items():
        if isinstance(value, Tensor):
            tensors.append(value)
            attrs[name] = None
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            attrs[name] = float(value)
        else:
            raise TypeError(f"ops.var_updates.{opname}: {name} must be a float or a scalar Tensor, "
                            f"not {type(value).__name__} ({value!r})")
    return tensors, attrs


def _check_numeric(s: TensorSpec, what: str) -> None:
    if not (s.dtype.is_floating_point or s.dtype.is_int):
        raise TypeError(f"{what} must have a numeric dtype, got {s.dtype.name}")


def _check_scalars(specs: Sequence[TensorSpec], names: Sequence[str]) -> None:
    for s, nm in zip(specs, names):
        _check_numeric(s, nm)
        if tuple(s.shape) not in ((), (1,)):
            raise ValueError(f"{nm} must be a scalar tensor (shape () or (1,)), got shape {tuple(s.shape)}")


def _check_same_shape(a: TensorSpec, b: TensorSpec, an: str, bn: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{an} and {bn} must have the same shape (no broadcasting), "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")


def _tensor_scalar_names(attrs: Dict[str, Any], order: Sequence[str]) -> List[str]:
    return [n for n in order if n in attrs and attrs[n] is None]


# the accumulate family ---------------------------------------------------------------------------
# name: (takes X, scalar parameter or None, formula on wide arrays (t[, x][, s])); the moving
# averages' formulas take f and g = 1 - f
_ACCUMULATORS: Dict[str, Tuple[bool, Optional[str], Callable[..., np.ndarray]]] = {
    "accumulate_": (True, "f", lambda t, x, f: t + f * x),
    "accumulate_square_": (True, "f", lambda t, x, f: t + f * (x * x)),
    "accumulate_mean_": (True, "step", lambda t, x, s: t * s / (s + 1) + x / (s + 1)),
    "accumulate_moving_average_": (True, "f", lambda t, x, f, g: f * t + g * x),
    "accumulate_moving_average_square_": (True, "f", lambda t, x, f, g: f * t + g * (x * x)),
    "accumulator_scale_": (False, "f", lambda t, f: t * f),
    "accumulator_zero_": (False, None, lambda t: np.zeros_like(t)),
    "copy_var_update_": (True, None, lambda t, x: x),
}


def _accumulator_infer(takes_x: bool, param: Optional[str]) -> Callable:
    def infer(specs, **attrs):
        t = specs[0]
        _check_numeric(t, "t")
        if takes_x:
            _check_numeric(specs[1], "X")
            _check_same_shape(t, specs[1], "t", "X")
        _check_scalars(specs[1 + takes_x:], _tensor_scalar_names(attrs, [param] if param else []))
        return [spec(t.shape, t.dtype, t.meta_shape)]
    return infer


def _in_type_of(coefficient: np.ndarray, t: np.ndarray) -> np.ndarray:
    """A coefficient held in a float16 accumulator's type, as PopART's expressions hold their
    constants and factors (its float16 Adam moments depend on it: the bias correction divides by
    the same rounded 1 - beta1 that scaled the gradient into the moment)."""
    return coefficient.astype(t.dtype).astype(coefficient.dtype) if t.dtype == np.float16 else coefficient


def _accumulator_kernel(takes_x: bool, param: Optional[str], formula: Callable, moving: bool) -> Callable:
    def kernel(t, *ins, **attrs):
        operands = [t, ins[0]] if takes_x else [t]
        wide = _wide(*operands)
        args = [a.astype(wide) for a in operands]
        if param is not None:
            f = _Scalars(ins[len(operands) - 1:], wide)(attrs[param])
            args += [_in_type_of(f, t), _in_type_of(1 - f, t)] if moving else [f]
        return convert(formula(*args), t.dtype)
    return kernel


for _name, (_takes_x, _param, _formula) in _ACCUMULATORS.items():
    register(OpDef(_name, _accumulator_infer(_takes_x, _param),
                   _accumulator_kernel(_takes_x, _param, _formula, "moving_average" in _name),
                   inplace=0, grad=Grad.STOP, family="var_updates",
                   attributes={} if _param is None else {_param: "float?"}))


def _accumulate(opname: str, operands: List[Tensor], **scalar: Any) -> Tensor:
    """``opname`` on ``operands`` (t, and X when the op takes one) and its scalar arguments."""
    tensors, attrs = _scalar_args(opname, **scalar)
    return create_op(opname, operands + tensors, attrs)[0]


def accumulate_(t: Tensor, X: Tensor, f: Optional[Scalar] = None) -> Tensor:
    """``t += X``, or ``t += f * X`` when ``f`` is given.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor updated.
        X: The update, of ``t``'s shape (the dtypes may differ).
        f: The scale of ``X``: a number or a scalar tensor.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` or ``X`` is not a Tensor, or a scale is neither a number nor a Tensor.
        ValueError: If the shapes differ, a scale tensor is not a scalar, or a tensor is not in the
            current graph.
    """
    return _accumulate("accumulate_", [t, X], f=1.0 if f is None else f)


def accumulate_square_(t: Tensor, X: Tensor, f: Scalar = 1.0) -> Tensor:
    """``t += f * X ** 2``.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor updated.
        X: The update, of ``t``'s shape (the dtypes may differ).
        f: The scale: a number or a scalar tensor.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` or ``X`` is not a Tensor, or a scale is neither a number nor a Tensor.
        ValueError: If the shapes differ, a scale tensor is not a scalar, or a tensor is not in the
            current graph.
    """
    return _accumulate("accumulate_square_", [t, X], f=f)


def accumulate_mean_(t: Tensor, X: Tensor, step: Scalar) -> Tensor:
    """Running mean: ``t = t * step / (step + 1) + X / (step + 1)``.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor updated.
        X: The update, of ``t``'s shape (the dtypes may differ).
        step: How many values are already averaged into ``t``: a number or a scalar tensor.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` or ``X`` is not a Tensor, or a scale is neither a number nor a Tensor.
        ValueError: If the shapes differ, a scale tensor is not a scalar, or a tensor is not in the
            current graph.
    """
    return _accumulate("accumulate_mean_", [t, X], step=step)


def accumulate_moving_average_(t: Tensor, X: Tensor, f: Scalar) -> Tensor:
    """Exponential moving average: ``t = f * t + (1 - f) * X``.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor updated.
        X: The update, of ``t``'s shape (the dtypes may differ).
        f: The decay: a number or a scalar tensor.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` or ``X`` is not a Tensor, or a scale is neither a number nor a Tensor.
        ValueError: If the shapes differ, a scale tensor is not a scalar, or a tensor is not in the
            current graph.
    """
    return _accumulate("accumulate_moving_average_", [t, X], f=f)


def accumulate_moving_average_square_(t: Tensor, X: Tensor, f: Scalar) -> Tensor:
    """Exponential moving average of squares: ``t = f * t + (1 - f) * X ** 2``.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor updated.
        X: The update, of ``t``'s shape (the dtypes may differ).
        f: The decay: a number or a scalar tensor.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` or ``X`` is not a Tensor, or a scale is neither a number nor a Tensor.
        ValueError: If the shapes differ, a scale tensor is not a scalar, or a tensor is not in the
            current graph.
    """
    return _accumulate("accumulate_moving_average_square_", [t, X], f=f)


def accumulator_scale_(t: Tensor, f: Scalar) -> Tensor:
    """``t *= f``.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor scaled.
        f: The factor: a number or a scalar tensor.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` is not a Tensor, or a scale is neither a number nor a Tensor.
        ValueError: If a scale tensor is not a scalar, or a tensor is not in the
            current graph.
    """
    return _accumulate("accumulator_scale_", [t], f=f)


def accumulator_zero_(t: Tensor) -> Tensor:
    """``t = 0``, whatever its previous value.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor zeroed.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``t`` is not in the current graph.
    """
    return _accumulate("accumulator_zero_", [t])


def copy_var_update_(t: Tensor, X: Tensor) -> Tensor:
    """``t = X`` (converted to ``t``'s dtype).

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor updated.
        X: The update, of ``t``'s shape (the dtypes may differ).

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` or ``X`` is not a Tensor.
        ValueError: If the shapes differ, or a tensor is not in the current graph.
    """
    return _accumulate("copy_var_update_", [t, X])


# sparse accumulate -------------------------------------------------------------------------------
def _sparse_infer(specs, axis, f):
    t, x, idx = specs[:3]
    _check_numeric(t, "t")
    _check_numeric(x, "X")
    if not idx.dtype.is_int:
        raise TypeError(f"indices must have an integer dtype, got {idx.dtype.name}")
    if not 0 <= axis < max(len(t.shape), 1) or not t.shape:
        raise ValueError(f"axis {axis} is out of range for t of shape {tuple(t.shape)}")
    want = tuple(t.shape[:axis]) + tuple(idx.shape) + tuple(t.shape[axis + 1:])
    if tuple(x.shape) != want:
        raise ValueError(f"X must have shape t.shape[:axis] + indices.shape + t.shape[axis+1:] = {want}, "
                         f"got {tuple(x.shape)}")
    _check_scalars(specs[3:], _tensor_scalar_names({"f": f}, ["f"]))
    return [spec(t.shape, t.dtype, t.meta_shape)]


def _sparse_kernel(t, x, indices, *scale, axis, f):
    wide = _wide(t, x)
    acc = np.moveaxis(t.astype(wide), axis, 0)  # a view of the fresh copy
    k = indices.size
    rows = np.moveaxis(x.astype(wide).reshape(t.shape[:axis] + (k,) + t.shape[axis + 1:]), axis, 0)
    rows = rows * _Scalars(scale, wide)(f)
    idx = indices.reshape(-1).astype(np.int64)
    ok = (idx >= 0) & (idx < t.shape[axis])  # out-of-range rows are dropped
    np.add.at(acc, idx[ok], rows[ok])
    return convert(np.moveaxis(acc, 0, axis), t.dtype)


register(OpDef("sparse_accumulate_", _sparse_infer, _sparse_kernel, inplace=0, grad=Grad.STOP,
               family="var_updates",
               attributes={"axis": "int", "f": "float?"}))


def sparse_accumulate_(t: Tensor, X: Tensor, indices: Tensor, axis: int = 0, f: Optional[Scalar] = None,
                       W: Optional[Tensor] = None) -> Tensor:
    """Scatter-add: slice j of ``X`` (times ``f``) is added into slice ``indices[j]`` of ``t`` along ``axis``.

    Repeated indices add up; out-of-range ones are skipped. ``X`` has the shape ``ops.gather``
    would give: ``t.shape[:axis] + indices.shape + t.shape[axis + 1:]``.

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The tensor updated.
        X: The slices added.
        indices: Integer positions along ``axis``.
        axis: The axis indexed.
        f: The scale of ``X``: a number or a scalar tensor.
        W: A tile-layout hint only; it does not change the result.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If a tensor argument is not a Tensor, or ``indices`` is not integer.
        ValueError: If the shapes disagree, ``axis`` is out of range, or a tensor is not in the
            current graph.
    """
    if W is not None and not isinstance(W, Tensor):
        raise TypeError(f"ops.var_updates.sparse_accumulate_: W must be a Tensor or None, not {type(W).__name__}")
    try:
        ax = normalize_axes(len(t.shape), axis)[0] if isinstance(t, Tensor) and t.shape else axis
    except (TypeError, ValueError) as e:
        raise type(e)(f"ops.var_updates.sparse_accumulate_: {e} (at {user_location()})") from None
    tensors, attrs = _scalar_args("sparse_accumulate_", f=1.0 if f is None else f)
    return create_op("sparse_accumulate_", [t, X, indices] + tensors, {"axis": ax, **attrs})[0]


# Adam / LAMB / AdaMax updaters -------------------------------------------------------------------
_UPDATER_SCALARS = ("weight_decay", "beta1", "beta2", "epsilon")


def _updater_infer(specs, mode, has_weight, has_step, **scalars):
    m, v = specs[:2]
    for s, nm in ((m, "acc_first_order"), (v, "acc_second_order")):
        if not s.dtype.is_floating_point:
            raise TypeError(f"{nm} must have a floating point dtype, got {s.dtype.name}")
    _check_same_shape(m, v, "acc_first_order", "acc_second_order")
    rest = list(specs[2:])
    if has_weight:
        w = rest.pop(0)
        _check_numeric(w, "weight")
        _check_same_shape(m, w, "acc_first_order", "weight")
    names = (["time_step"] if has_step else []) + _tensor_scalar_names(scalars, _UPDATER_SCALARS)
    _check_scalars(rest, names)
    return [spec(m.shape, (w if has_weight else m).dtype, m.meta_shape)]


def _updater_kernel(m, v, *ins, mode, has_weight, has_step, weight_decay, beta1, beta2, epsilon):
    ins = list(ins)
    w = ins.pop(0) if has_weight else None
    step = ins.pop(0).reshape(()).astype(np.float64) if has_step else None
    wide = _wide(m, v, *([w] if w is not None else []))
    read = _Scalars(ins, np.dtype(np.float64))  # scalar coefficients in float64, then rounded to wide
    wd, b1, b2, eps = read(weight_decay), read(beta1), read(beta2), read(epsilon)
    wd, eps = wd.astype(wide), eps.astype(wide)
    mw, vw = m.astype(wide), v.astype(wide)
    if step is not None:  # bias correction with the (already incremented) step
        # divided by the correction held in the moment's type, the quotient in that type (PopART's
        # expression; for float16 moments it undoes the moving average's rounded 1 - beta1)
        mw = _in_type_of(mw / _in_type_of((1 - b1 ** step).astype(wide), m), m)
        if mode != "adamax":
            vw = _in_type_of(vw / _in_type_of((1 - b2 ** step).astype(wide), v), v)
    update = mw / (vw + eps) if mode == "adamax" else mw / (np.sqrt(vw) + eps)
    if w is not None:
        update = update + wd * w.astype(wide)
    return update.astype((m if w is None else w).dtype)


for _mode in ("adam", "lamb", "adamax"):
    register(OpDef(f"{_mode}_updater", _updater_infer, _updater_kernel, grad=Grad.STOP, family="var_updates",
                   attributes={"mode": "str", "has_weight": "bool", "has_step": "bool", "weight_decay": "float?",
                               "beta1": "float?", "beta2": "float?", "epsilon": "float?"}))


def _updater(mode: str, m: Tensor, v: Tensor, weight: Optional[Tensor], time_step: Optional[Tensor],
             weight_decay: Optional[Scalar], beta1: Optional[Scalar], beta2: Optional[Scalar],
             epsilon: Scalar) -> Tensor:
    opname = f"{mode}_updater"
    where = f"ops.var_updates.{opname}"
    # PopXL wires the weight in only for a weight decay that is a tensor or not 0; the update term
    # then has the weight's type, else the first moment's
    has_weight = weight_decay is not None and not (isinstance(weight_decay, numbers.Real) and weight_decay == 0.0)
    ins = [m, v]
    if has_weight:
        if weight is None:
            raise ValueError(f"{where}: weight_decay needs the weight tensor (weight=...)")
        ins.append(weight)
    if time_step is not None:
        betas = (("beta1", beta1),) if mode == "adamax" else (("beta1", beta1), ("beta2", beta2))
        missing = [n for n, b in betas if b is None]
        if missing:
            raise ValueError(f"{where}: time_step (bias correction) needs {' and '.join(missing)}")
        if not isinstance(time_step, Tensor):
            raise TypeError(f"{where}: time_step must be a scalar Tensor, not {type(time_step).__name__}")
    elif mode == "adamax":
        raise ValueError(f"{where}: time_step is required")
    tensors, attrs = _scalar_args(opname, weight_decay=0.0 if weight_decay is None else weight_decay,
                                  beta1=0.0 if beta1 is None else beta1, beta2=0.0 if beta2 is None else beta2,
                                  epsilon=epsilon)
    if time_step is not None:
        # The step is counted first: the update of step k (k = 1, 2, ...) uses b**k.
        ins.append(add_(time_step, constant(1, dtype=time_step.dtype)))
    return create_op(opname, ins + tensors, {"mode": mode, "has_weight": has_weight,
                                             "has_step": time_step is not None, **attrs})[0]


def adam_updater(acc_first_order: Tensor, acc_second_order: Tensor, weight: Optional[Tensor] = None,
                 time_step: Optional[Tensor] = None, weight_decay: Optional[Scalar] = None,
                 beta1: Optional[Scalar] = None, beta2: Optional[Scalar] = None,
                 epsilon: Scalar = 1e-07) -> Tensor:
    """The Adam update term ``m' / (sqrt(v') + epsilon)`` (plus ``weight_decay * weight``).

    With ``time_step`` the moments are bias corrected: ``m' = m / (1 - beta1 ** step)``,
    ``v' = v / (1 - beta2 ** step)``; otherwise ``m' = m`` and ``v' = v``.

    Args:
        acc_first_order: The first moment m.
        acc_second_order: The second moment v (for AdaMax: the weighted infinity norm u).
        weight: The weight, needed with ``weight_decay``.
        time_step: A scalar step counter, incremented by 1 in place first; enables bias correction.
        weight_decay: The decoupled weight decay factor.
        beta1: The first moment's decay rate.
        beta2: The second moment's decay rate.
        epsilon: Added to the denominator.

    Returns:
        A new tensor of the moments' shape.

    Raises:
        TypeError: If an argument is not a Tensor where one is needed.
        ValueError: If ``time_step`` is given without both betas, ``weight_decay`` without ``weight``,
            or a tensor is not in the current graph.
    """
    return _updater("adam", acc_first_order, acc_second_order, weight, time_step, weight_decay, beta1, beta2,
                    epsilon)


def lamb_updater(acc_first_order: Tensor, acc_second_order: Tensor, weight: Optional[Tensor] = None,
                 time_step: Optional[Tensor] = None, weight_decay: Optional[Scalar] = None,
                 beta1: Optional[Scalar] = None, beta2: Optional[Scalar] = None,
                 epsilon: Scalar = 1e-07) -> Tensor:
    """The LAMB update term: computed as `adam_updater` computes it (same arguments and rules).

    The layer-wise trust ratio is applied afterwards by `adam_var_update`.

    Args:
        acc_first_order: The first moment m.
        acc_second_order: The second moment v (for AdaMax: the weighted infinity norm u).
        weight: The weight, needed with ``weight_decay``.
        time_step: A scalar step counter, incremented by 1 in place first; enables bias correction.
        weight_decay: The decoupled weight decay factor.
        beta1: The first moment's decay rate.
        beta2: The second moment's decay rate.
        epsilon: Added to the denominator.

    Returns:
        A new tensor of the moments' shape.

    Raises:
        TypeError: If an argument is not a Tensor where one is needed.
        ValueError: If ``time_step`` is given without both betas, ``weight_decay`` without ``weight``,
            or a tensor is not in the current graph.
    """
    return _updater("lamb", acc_first_order, acc_second_order, weight, time_step, weight_decay, beta1, beta2,
                    epsilon)


def adamax_updater(acc_first_order: Tensor, acc_second_order: Tensor, weight: Optional[Tensor] = None,
                   time_step: Optional[Tensor] = None, weight_decay: Optional[Scalar] = None, beta1: Scalar = 0.9,
                   epsilon: Scalar = 1e-07) -> Tensor:
    """The AdaMax update term ``m' / (u + epsilon)`` (plus ``weight_decay * weight``).

    ``m' = m / (1 - beta1 ** step)``.

    Args:
        acc_first_order: The first moment m.
        acc_second_order: The second moment v (for AdaMax: the weighted infinity norm u).
        weight: The weight, needed with ``weight_decay``.
        time_step: A scalar step counter, required; incremented by 1 in place first.
        weight_decay: The decoupled weight decay factor.
        beta1: The first moment's decay rate.
        epsilon: Added to the denominator.

    Returns:
        A new tensor of the moments' shape.

    Raises:
        TypeError: If an argument is not a Tensor where one is needed.
        ValueError: If ``time_step`` is missing, ``weight_decay`` is given without ``weight``, or a
            tensor is not in the current graph.
    """
    return _updater("adamax", acc_first_order, acc_second_order, weight, time_step, weight_decay, beta1, None,
                    epsilon)


# Adam / LAMB weight update -----------------------------------------------------------------------
def _var_update_infer(specs, learning_rate, max_weight_norm):
    t, x, r1, r2 = specs[:4]
    _check_numeric(t, "t")
    _check_numeric(x, "x")
    _check_same_shape(t, x, "t", "x")
    _check_scalars([r1, r2], ["r1", "r2"])
    _check_scalars(specs[4:], _tensor_scalar_names({"learning_rate": learning_rate,
                                                    "max_weight_norm": max_weight_norm},
                                                   ["learning_rate", "max_weight_norm"]))
    return [spec(t.shape, t.dtype, t.meta_shape)]


def _var_update_kernel(t, x, r1, r2, *scalars, learning_rate, max_weight_norm):
    wide = _wide(t, x)
    read = _Scalars(scalars, wide)
    lr, mwn = read(learning_rate), read(max_weight_norm)
    n1, n2 = np.float64(r1.reshape(())), np.float64(r2.reshape(()))
    if n1 == 0 or n2 == 0 or mwn == 0:
        ratio = np.asarray(1.0, wide)
    else:
        ratio = (np.minimum(np.sqrt(n1), np.float64(mwn)) / np.sqrt(n2)).astype(wide)
    return convert(t.astype(wide) - lr * ratio * x.astype(wide), t.dtype)


register(OpDef("adam_var_update", _var_update_infer, _var_update_kernel, inplace=0, grad=Grad.STOP,
               family="var_updates",
               attributes={"learning_rate": "float?", "max_weight_norm": "float?"}))


def adam_var_update(t: Tensor, x: Tensor, r1: Tensor, r2: Tensor, learning_rate: Optional[Scalar] = None,
                    max_weight_norm: Optional[Scalar] = None) -> Tensor:
    """``t -= learning_rate * ratio * x``, with the LAMB trust ratio ``min(sqrt(r1), max_weight_norm) / sqrt(r2)``.

    The ratio is 1 when ``r1``, ``r2`` or ``max_weight_norm`` is 0. As in PopXL, an omitted
    ``learning_rate`` or ``max_weight_norm`` counts as 0: without a learning rate ``t`` does not
    change, and without a max weight norm the ratio is 1 (plain Adam).

    In place: ``t`` is overwritten. No gradient flows through it.

    Args:
        t: The weight updated.
        x: An updater term (see `adam_updater`).
        r1: The squared norm of the weight (e.g. from ``ops.lamb_square``).
        r2: The squared norm of ``x``.
        learning_rate: The step size: a number or a scalar tensor.
        max_weight_norm: The cap on the weight norm: a number or a scalar tensor.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If a tensor argument is not a Tensor.
        ValueError: If the shapes differ, a norm is not a scalar, or a tensor is not in the current
            graph.
    """
    tensors, attrs = _scalar_args("adam_var_update",
                                  learning_rate=0.0 if learning_rate is None else learning_rate,
                                  max_weight_norm=0.0 if max_weight_norm is None else max_weight_norm)
    return create_op("adam_var_update", [t, x, r1, r2] + tensors, attrs)[0]
