"""Optimisers: ``ConstSGD``, ``SGD`` and ``Adam``, with PopART's hyper-parameter conventions.

Each hyper-parameter is an ``OptimizerValue(value, isConst)``. A constant one is baked into the
program; a non-constant one lives in a device-side scalar variable, so
``session.updateOptimizerFromHost(new_optimizer)`` only writes new values (no recompilation).
Changing a constant value, or the kind of optimiser, raises.

Update rules (g is the gradient after accumulation/replication reduction, divided by the loss
scaling; w the weight):

- SGD without momentum: ``w -= lr * (g + wd * w)``.
- SGD with momentum (velocity v, kept per weight): ``v = mm * v + (1 - dm) * (g + wd * w)``;
  ``w -= lr * v``; with ``nesterov``: ``w -= lr * (g + wd * w + mm * v)``.
- Adam (m, v per weight; step counter t): ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g^2``,
  ``w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)`` with bias-corrected m_hat, v_hat
  (``AdamNoBias``: without the correction). With ``WeightDecayMode.L2Regularization`` the
  decay is added to g instead.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

import popxl
import popxl.ops as ops
from popart.errors import popart_exception

__all__ = ["OptimizerValue", "Optimizer", "ConstSGD", "SGD", "Adam", "AdamMode", "WeightDecayMode"]


class OptimizerValue:
    """A hyper-parameter: its value and whether it is constant (compiled in)."""

    def __init__(self, value: float = 0.0, isConst: bool = True) -> None:
        self._value = float(value)
        self._const = bool(isConst)

    def val(self) -> float:
        return self._value

    def isConst(self) -> bool:
        return self._const

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OptimizerValue) and (self._value, self._const) == (other._value, other._const)

    def __repr__(self) -> str:
        return f"OptimizerValue({self._value}, isConst={self._const})"


ValueLike = Union[OptimizerValue, Tuple[float, bool], float, int]


def _value(v: ValueLike, const_default: bool, what: str) -> OptimizerValue:
    if isinstance(v, OptimizerValue):
        return v
    if isinstance(v, tuple) and len(v) == 2:
        return OptimizerValue(float(v[0]), bool(v[1]))
    if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool):
        return OptimizerValue(float(v), const_default)
    raise popart_exception(f"{what}: expected a number, a (value, isConst) pair or popart.OptimizerValue, "
                           f"not {v!r}.")


class Optimizer:
    """The hyper-parameters of one optimiser; subclasses say which exist and trace the update."""

    # name -> (PopART key in the params dict, default value, constant by default)
    _PARAMS: Dict[str, Tuple[str, float, bool]] = {}

    def __init__(self, params: Mapping[str, ValueLike], what: str) -> None:
        keys = {key: name for name, (key, _, _) in self._PARAMS.items()}
        unknown = [k for k in params if k not in keys]
        if unknown:
            raise popart_exception(f"{what}: unknown hyper-parameter(s) {unknown}; known: {sorted(keys)}.")
        self._values: Dict[str, OptimizerValue] = {}
        for name, (key, default, const) in self._PARAMS.items():
            self._values[name] = _value(params[key], const, f"{what} {key}") if key in params else \
                OptimizerValue(default, const)
        self._specific: Dict[str, Dict[str, OptimizerValue]] = {}

    @classmethod
    def _specific_keys(cls) -> Dict[str, str]:
        """Per-weight key (``learningRate``) -> name, for the hyper-parameters a weight may override."""
        out = {}
        for name, (key, _, _) in cls._PARAMS.items():
            if key.startswith("default"):
                short = key[len("default"):]
                out[short[0].lower() + short[1:]] = name
        return out

    def insertSpecific(self, weightId: str, params: Mapping[str, ValueLike]) -> None:
        """Hyper-parameters for one weight, overriding the defaults:
        ``opt.insertSpecific("w", {"learningRate": (0.01, False), "weightDecay": (0.0, True)})``."""
        keys = self._specific_keys()
        unknown = [k for k in params if k not in keys]
        if unknown:
            raise popart_exception(f"insertSpecific({weightId!r}): unknown hyper-parameter(s) {unknown}; a weight "
                                   f"may set {sorted(keys)}.")
        self._specific[weightId] = {keys[k]: _value(v, self._PARAMS[keys[k]][2], f"insertSpecific {k}")
                                    for k, v in params.items()}

    def hasSpecific(self, weightId: str) -> bool:
        return weightId in self._specific

    def value(self, name: str, weight: Optional[str] = None) -> OptimizerValue:
        """The value of hyper-parameter ``name`` for ``weight`` (its specific one, else the default)."""
        own = self._specific.get(weight, {}) if weight is not None else {}
        return own.get(name, self._values[name])

    def hyper_keys(self) -> List[Tuple[str, Optional[str]]]:
        """Every (name, weight) with a value of its own: the defaults (weight None), then specifics."""
        return [(n, None) for n in self._values] + [(n, w) for w, d in self._specific.items() for n in d]

    def getLossScalingVal(self) -> float:
        return self._values["ls"].val()

    def lossScaling(self) -> OptimizerValue:
        return self._values["ls"]

    def learningRates(self) -> OptimizerValue:
        return self._values["lr"]

    def compatible(self, other: "Optimizer") -> None:
        """Raise unless ``other`` can replace this optimiser in a compiled program: same kind,
        same constant values (and the same structure of the update)."""
        if self._kind() is not other._kind():
            raise popart_exception(f"updateOptimizerFromHost: the session was compiled for {type(self).__name__}; "
                                   f"it cannot switch to {type(other).__name__}.")
        if set(self.hyper_keys()) != set(other.hyper_keys()):
            raise popart_exception("updateOptimizerFromHost: the new optimiser sets weight-specific values "
                                   "(insertSpecific) for other weights or hyper-parameters than the compiled one.")
        for name, weight in self.hyper_keys():
            v, w = self.value(name, weight), other.value(name, weight)
            if v.isConst() != w.isConst() or (v.isConst() and v.val() != w.val()):
                key = self._PARAMS[name][0] + (f" of weight {weight!r}" if weight is not None else "")
                raise popart_exception(
                    f"updateOptimizerFromHost: {key} is constant ({v.val()}) in the compiled program and cannot "
                    f"change to {w}; make it non-constant ((value, False)) when creating the session.")
        self._check_structure(other)

    def _check_structure(self, other: "Optimizer") -> None:
        pass

    def _kind(self) -> type:
        """The class that decides the program's structure (ConstSGD is an SGD)."""
        return type(self)

    # tracing ----------------------------------------------------------------------------------------
    def state(self, weight: np.ndarray, weightId: Optional[str] = None) -> List[Tuple[str, np.ndarray]]:
        """Per-weight state: (name suffix, initial value)."""
        return []

    def update(self, w: popxl.Tensor, g: popxl.Tensor, hyper: Callable[[str], Union[float, popxl.Tensor]],
               state: List[popxl.Tensor], weightId: Optional[str] = None) -> None:
        # each optimiser traces its own rule
        raise popart_exception(f"{type(self).__name__} has no update rule: use popart.SGD, ConstSGD or Adam.")

    def __repr__(self) -> str:
        vals = ", ".join(f"{self._PARAMS[n][0]}={v.val()}{'' if v.isConst() else ' (variable)'}"
                         for n, v in self._values.items())
        return f"{type(self).__name__}({vals})"


def _scaled(x: popxl.Tensor, s: Union[float, popxl.Tensor]) -> popxl.Tensor:
    if isinstance(s, popxl.Tensor):
        return ops.mul(x, ops.cast(s, x.dtype) if s.dtype is not x.dtype else s)
    return ops.mul(x, popxl.constant(np.asarray(s, x.dtype.as_numpy())))


def _one_minus(s: Union[float, popxl.Tensor]) -> Union[float, popxl.Tensor]:
    if isinstance(s, popxl.Tensor):
        return ops.sub(popxl.constant(np.ones((), s.dtype.as_numpy())), s)
    return 1.0 - s


def _neg(s: Union[float, popxl.Tensor]) -> Union[float, popxl.Tensor]:
    return ops.negate(s) if isinstance(s, popxl.Tensor) else -s


def _is_zero(v: OptimizerValue) -> bool:
    return v.isConst() and v.val() == 0.0


def _decayed(g: popxl.Tensor, w: popxl.Tensor, wd: Union[float, popxl.Tensor], present: bool) -> popxl.Tensor:
    """g + wd * w (when weight decay is part of the program)."""
    return ops.add(g, _scaled(w, wd)) if present else g


class SGD(Optimizer):
    """Stochastic gradient descent. ``SGD(0.01)`` (a learning rate, non-constant) or
    ``SGD({"defaultLearningRate": (0.01, False), "defaultMomentum": (0.9, True), ...})`` with keys
    defaultLearningRate, defaultWeightDecay, defaultMomentum, defaultDampening,
    defaultVelocityScaling, lossScaling, nesterov."""

    _PARAMS = {"lr": ("defaultLearningRate", 0.1, False), "wd": ("defaultWeightDecay", 0.0, True),
               "mm": ("defaultMomentum", 0.0, True), "dm": ("defaultDampening", 0.0, True),
               "vs": ("defaultVelocityScaling", 1.0, True), "ls": ("lossScaling", 1.0, True)}

    def __init__(self, params: Union[Mapping[str, ValueLike], float, None] = None, nesterov: bool = False,
                 **kwargs: Any) -> None:
        if params is None:
            params = {}
        elif not isinstance(params, Mapping):
            params = {"defaultLearningRate": _value(params, False, "SGD learning rate")}
        params = dict(params)
        nesterov = bool(params.pop("nesterov", nesterov))
        super().__init__(params, type(self).__name__)
        self.nesterov = nesterov
        if kwargs:
            raise popart_exception(f"SGD: unknown arguments {sorted(kwargs)}.")

    def _kind(self) -> type:
        return SGD

    def _momentum(self, weightId: Optional[str]) -> bool:
        return not _is_zero(self.value("mm", weightId))

    def _check_structure(self, other: Optimizer) -> None:
        if getattr(other, "nesterov", False) != self.nesterov:
            raise popart_exception("updateOptimizerFromHost: nesterov cannot change after compilation.")

    def state(self, weight: np.ndarray, weightId: Optional[str] = None) -> List[Tuple[str, np.ndarray]]:
        # float32 state: float16 weights are updated in float32 (see TrainingSession._update).
        return [("velocity", np.zeros(weight.shape, np.float32))] if self._momentum(weightId) else []

    def update(self, w: popxl.Tensor, g: popxl.Tensor, hyper: Callable[[str], Union[float, popxl.Tensor]],
               state: List[popxl.Tensor], weightId: Optional[str] = None) -> None:
        wd_present = not _is_zero(self.value("wd", weightId))
        g = _decayed(g, w, hyper("wd"), wd_present)
        if not self._momentum(weightId):
            ops.scaled_add_(w, g, b=_neg(hyper("lr")))
            return
        (v,) = state
        vs = hyper("vs")
        vs_value = self.value("vs", weightId)
        unscaled = vs_value.isConst() and vs_value.val() == 1.0
        # The velocity is stored scaled by vs (numerical range); the update divides it out.
        ops.scaled_add_(v, g if unscaled else _scaled(g, vs), a=hyper("mm"), b=_one_minus(hyper("dm")))
        step = v if unscaled else ops.div(v, vs if isinstance(vs, popxl.Tensor) else
                                          popxl.constant(np.asarray(vs, v.dtype.as_numpy())))
        if self.nesterov:
            step = ops.add(g, _scaled(step, hyper("mm")))
        ops.scaled_add_(w, step, b=_neg(hyper("lr")))


class ConstSGD(SGD):
    """SGD whose learning rate, weight decay and loss scaling are all compiled in:
    ``ConstSGD(learning_rate, weight_decay=0.0, loss_scaling=1.0)``."""

    def __init__(self, learning_rate: float, weight_decay: float = 0.0, loss_scaling: float = 1.0) -> None:
        super().__init__({"defaultLearningRate": (learning_rate, True), "defaultWeightDecay": (weight_decay, True),
                          "lossScaling": (loss_scaling, True)})


class AdamMode(Enum):
    Adam = 0
    AdamNoBias = 1
    AdaMax = 2
    Lamb = 3
    LambNoBias = 4


class WeightDecayMode(Enum):
    Decay = 0
    L2Regularization = 1


class Adam(Optimizer):
    """Adam and its relatives: ``Adam({"defaultLearningRate": (1e-3, False), "defaultBeta1": ...,
    "defaultBeta2": ..., "defaultEps": ..., "defaultWeightDecay": ..., "lossScaling": ...,
    "maxWeightNorm": ...}, mode=AdamMode.Adam, weight_decay_mode=WeightDecayMode.Decay)``.

    Modes: ``Adam`` / ``AdamNoBias`` (with / without bias correction); ``AdaMax`` (the second
    moment is the decayed infinity norm ``u = max(b2*u, |g|)``, bias correction of the first
    moment only); ``Lamb`` / ``LambNoBias`` (the Adam term scaled per weight by the trust ratio
    ``min(||w||, maxWeightNorm) / ||term||``; ``maxWeightNorm`` defaults to float32's maximum, no clipping)."""

    _PARAMS = {"lr": ("defaultLearningRate", 0.01, False), "wd": ("defaultWeightDecay", 0.0, True),
               "b1": ("defaultBeta1", 0.9, True), "b2": ("defaultBeta2", 0.999, True),
               "eps": ("defaultEps", 1e-6, True), "ls": ("lossScaling", 1.0, True),
               "mwn": ("maxWeightNorm", float(np.finfo(np.float32).max), True)}
    _BIAS_CORRECTED = (AdamMode.Adam, AdamMode.AdaMax, AdamMode.Lamb)

    def __init__(self, params: Optional[Mapping[str, ValueLike]] = None, mode: AdamMode = AdamMode.Adam,
                 weight_decay_mode: WeightDecayMode = WeightDecayMode.Decay, **kwargs: Any) -> None:
        super().__init__(dict(params or {}), "Adam")
        if not isinstance(mode, AdamMode):
            raise popart_exception(f"Adam: mode must be a popart.AdamMode, not {mode!r}.")
        self.mode = mode
        self.weight_decay_mode = weight_decay_mode
        if kwargs:
            raise popart_exception(f"Adam: unknown arguments {sorted(kwargs)}.")

    def _check_structure(self, other: Optimizer) -> None:
        assert isinstance(other, Adam), "compatible() compares the kinds first"
        if (other.mode, other.weight_decay_mode) != (self.mode, self.weight_decay_mode):
            raise popart_exception("updateOptimizerFromHost: the Adam mode and weight decay mode cannot change.")

    def state(self, weight: np.ndarray, weightId: Optional[str] = None) -> List[Tuple[str, np.ndarray]]:
        # Each weight counts its own steps: the updater increments the counter it is given.
        step = [("step", np.zeros((), np.float32))] if self.mode in self._BIAS_CORRECTED else []
        return [("accl1", np.zeros(weight.shape, np.float32)), ("accl2", np.zeros(weight.shape, np.float32))] + step

    def update(self, w: popxl.Tensor, g: popxl.Tensor, hyper: Callable[[str], Union[float, popxl.Tensor]],
               state: List[popxl.Tensor], weightId: Optional[str] = None) -> None:
        m, v = state[:2]
        step = state[2] if len(state) > 2 else None
        wd_present = not _is_zero(self.value("wd", weightId))
        g32 = ops.cast(g, popxl.float32) if g.dtype is not popxl.float32 else g
        w32 = ops.cast(w, popxl.float32) if w.dtype is not popxl.float32 else w
        l2 = self.weight_decay_mode is WeightDecayMode.L2Regularization
        g32 = _decayed(g32, w32, hyper("wd"), wd_present and l2)
        ops.var_updates.accumulate_moving_average_(m, g32, hyper("b1"))
        decoupled = wd_present and not l2
        decay_weight, decay = (w32, hyper("wd")) if decoupled else (None, None)
        if self.mode is AdamMode.AdaMax:
            ops.var_updates.copy_var_update_(v, ops.maximum(_scaled(v, hyper("b2")), ops.abs(g32)))
            term = ops.var_updates.adamax_updater(m, v, weight=decay_weight, time_step=step, weight_decay=decay,
                                                  beta1=hyper("b1"), epsilon=hyper("eps"))
        else:
            ops.var_updates.accumulate_moving_average_square_(v, g32, hyper("b2"))
            lamb = self.mode in (AdamMode.Lamb, AdamMode.LambNoBias)
            updater = ops.var_updates.lamb_updater if lamb else ops.var_updates.adam_updater
            term = updater(m, v, weight=decay_weight, time_step=step, weight_decay=decay, beta1=hyper("b1"),
                           beta2=hyper("b2"), epsilon=hyper("eps"))
            if lamb:  # the trust ratio, from the squared norms of the weight and of the term
                ops.var_updates.adam_var_update(w, term, ops.lamb_square(w32),
                                                ops.lamb_square(term), learning_rate=hyper("lr"),
                                                max_weight_norm=hyper("mwn"))
                return
        ops.scaled_add_(w, ops.cast(term, w.dtype) if term.dtype is not w.dtype else term, b=_neg(hyper("lr")))
