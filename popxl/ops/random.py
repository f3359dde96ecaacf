"""Random ops keyed by an explicit seed tensor: random_uniform, random_normal, dropout,
shaped_dropout and split_random_seed.

Every random op reads a ``uint32[2]`` seed tensor and is a pure function of (seed, attributes,
shape): the same seed always gives the same bits, whatever else the program does. This module
is the contract for native kernels, which must reproduce the numbers bit for bit.

Bit recipe
----------
Generator: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", the
Random123 constants). One call maps a 128-bit counter ``(c0, c1, c2, c3)`` and a 64-bit key
``(k0, k1)`` to four uint32 words. Each of the 10 rounds does (all arithmetic mod 2**32)::

    p0 = 0xD2511F53 * c0  (64-bit product),  p1 = 0xCD9E8D57 * c2
    (c0, c1, c2, c3) = (hi(p1) ^ c1 ^ k0, lo(p1), hi(p0) ^ c3 ^ k1, lo(p0))
    k0 += 0x9E3779B9; k1 += 0xBB67AE85       (the key bump between rounds)

Key = ``(seed[0], seed[1])``. An op draws from a *word stream* selected by a per-op-kind
``purpose`` constant: word ``w`` of the stream is output word ``w % 4`` of Philox with counter
``(j & 0xFFFFFFFF, j >> 32, purpose, 0)``, ``j = w // 4``. Elements are numbered in C order.
Purposes: uniform 0, normal 1, dropout 2, shaped_dropout 3, split_random_seed 4.

- ``random_uniform`` (element i uses word i): ``u = float32((w >> 8) * 2**-24)`` (exact, in
  [0, 1)); result ``lo + (hi - lo) * u`` evaluated in float32 with ``lo = float32(low)``,
  ``hi = float32(high)``, each operation rounded to float32 (no fused multiply-add), then
  rounded to the output dtype (float16 from that float32 value).
- ``random_normal`` (element i uses words 2i, 2i+1): ``u1 = ((w_2i >> 8) + 1) * 2**-24`` in
  (0, 1] (so log never sees 0), ``u2 = (w_2i+1 >> 8) * 2**-24``; in float64:
  ``z = sqrt(-2 * log(u1)) * cos(2 * pi * u2)``, result ``mean + std * z`` (float64), rounded
  once to the output dtype (round to nearest even).
- ``dropout`` (element i of t uses word i): keep iff ``(w >> 8) >= ceil(p * 2**24)`` (threshold
  computed in float64), i.e. ``u >= p``. Kept values are ``x * s`` with ``s = float32(1 / (1 - p))``
  (division in float64), the product in float32, rounded to t's dtype; dropped values are +0.
- ``shaped_dropout``: the same rule over the elements of a mask of ``shape`` (C order, purpose
  3), broadcast over t with NumPy rules; the scale is ``float32(1 / (1 - ratio))``.
- ``split_random_seed(seed, n)``: seed k (k = 0..n-1) is words 0 and 1 of Philox with counter
  ``(k, 0, 4, 0)`` and key ``(seed[0], seed[1])``.
"""
from __future__ import annotations

import math
import numbers
from typing import Iterable, Sequence, Tuple

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import broadcast_shapes, spec
from popxl.tensor import Tensor, TensorSpec

__all__ = ["random_uniform", "random_normal", "dropout", "shaped_dropout", "split_random_seed"]

# Philox4x32-10 -------------------------------------------------------------------------------------
_MUL0, _MUL1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_BUMP0, _BUMP1 = 0x9E3779B9, 0xBB67AE85
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
ROUNDS = 10

PURPOSE_UNIFORM, PURPOSE_NORMAL, PURPOSE_DROPOUT, PURPOSE_SHAPED_DROPOUT, PURPOSE_SPLIT = 0, 1, 2, 3, 4


def philox4x32(counter: Sequence, key: Sequence[int], rounds: int = ROUNDS) -> np.ndarray:
    """Philox4x32 on a batch: ``counter`` is four uint32 arrays (or ints) of one shape, ``key``
    two uint32 ints. Returns a ``(4, *shape)`` uint32 array."""
    c0, c1, c2, c3 = np.broadcast_arrays(*[np.asarray(c, dtype=np.uint64) for c in counter])
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for _ in range(rounds):
        p0 = c0 * _MUL0  # < 2**64: both factors are below 2**32
        p1 = c2 * _MUL1
        c0, c1, c2, c3 = ((p1 >> _SHIFT32) ^ c1 ^ np.uint64(k0), p1 & _LOW32,
                          (p0 >> _SHIFT32) ^ c3 ^ np.uint64(k1), p0 & _LOW32)
        k0 = (k0 + _BUMP0) & 0xFFFFFFFF
        k1 = (k1 + _BUMP1) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3]).astype(np.uint32)


def random_words(seed: np.ndarray, n: int, purpose: int) -> np.ndarray:
    """Words 0..n-1 of the stream ``purpose`` keyed by ``seed`` (uint32[2]), as uint32[n]."""
    blocks = np.arange((n + 3) // 4, dtype=np.uint64)
    seed = np.asarray(seed).reshape(-1)
    out = philox4x32((blocks & _LOW32, blocks >> _SHIFT32, purpose, 0), (seed[0], seed[1]))
    return out.T.reshape(-1)[:n]


def _unit_float32(words: np.ndarray) -> np.ndarray:
    """The top 24 bits of each word as a float32 in [0, 1)."""
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def _uniform_kernel(seed, shape, low, high, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    u = _unit_float32(random_words(seed, n, PURPOSE_UNIFORM))
    lo, hi = np.float32(low), np.float32(high)
    r = lo + (hi - lo) * u
    return r.astype(dtypes.ml_dtype(dtype)).reshape(shape)


def _normal_kernel(seed, shape, mean, std, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    w = random_words(seed, 2 * n, PURPOSE_NORMAL).reshape(n, 2)
    u1 = ((w[:, 0] >> np.uint32(8)).astype(np.float64) + 1.0) * 2.0 ** -24
    u2 = (w[:, 1] >> np.uint32(8)).astype(np.float64) * 2.0 ** -24
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (float(mean) + float(std) * z).astype(dtypes.ml_dtype(dtype)).reshape(shape)


def _keep_mask(seed, n: int, p: float, purpose: int) -> np.ndarray:
    threshold = math.ceil(float(p) * 2.0 ** 24)
    return (random_words(seed, n, purpose) >> np.uint32(8)) >= np.uint32(threshold)


def _apply_mask(x: np.ndarray, keep: np.ndarray, p: float) -> np.ndarray:
    scale = np.float32(1.0 / (1.0 - float(p)))
    kept = x.astype(np.float32) * scale
    return np.where(keep, kept, np.float32(0.0)).astype(x.dtype)


def _dropout_kernel(x, seed, p):
    keep = _keep_mask(seed, x.size, p, PURPOSE_DROPOUT).reshape(x.shape)
    return _apply_mask(x, keep, p)


def _shaped_dropout_kernel(x, seed, shape, ratio):
    n = int(np.prod(shape, dtype=np.int64))
    keep = _keep_mask(seed, n, ratio, PURPOSE_SHAPED_DROPOUT).reshape(shape)
    return _apply_mask(x, np.broadcast_to(keep, x.shape), ratio)


def _split_kernel(seed, n):
    k = np.arange(n, dtype=np.uint64)
    s = np.asarray(seed).reshape(-1)
    out = philox4x32((k & _LOW32, k >> _SHIFT32, PURPOSE_SPLIT, 0), (s[0], s[1]))
    return tuple(np.array([out[0, i], out[1, i]], dtype=np.uint32) for i in range(n))


# shape rules -------------------------------------------------------------------------------------
def _check_seed(s: TensorSpec) -> None:
    if s.dtype is not dtypes.uint32 or tuple(s.shape) != (2,):
        raise ValueError(f"the seed must be a uint32 tensor of shape (2,), got {s.dtype.name} {tuple(s.shape)} "
                         f"(make seeds with popxl.create_seeds and ops.split_random_seed)")


def _check_shape(shape) -> Tuple[int, ...]:
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"shape must be a tuple of ints, got {shape!r}")
    if any(d <= 0 for d in shape):
        raise ValueError(f"shape entries must be positive, got {tuple(shape)}")
    return tuple(int(d) for d in shape)


def _check_probability(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{what} must be a number in [0, 1), got {value!r}")


def _check_float_dtype(dt, what: str) -> None:
    if dt not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"{what} must be float16 or float32, got {getattr(dt, 'name', dt)!r}")


def _draw_infer(specs, shape, dtype, **_):
    _check_seed(specs[0])
    _check_float_dtype(dtype, "dtype")
    return [spec(_check_shape(shape), dtype)]


def _dropout_infer(specs, p):
    x, seed = specs
    _check_float_dtype(x.dtype, "the input dtype")
    _check_seed(seed)
    _check_probability(p, "p")
    return [spec(x.shape, x.dtype, x.meta_shape)]


def _shaped_dropout_infer(specs, shape, ratio):
    x, seed = specs
    _check_float_dtype(x.dtype, "the input dtype")
    _check_seed(seed)
    _check_probability(ratio, "ratio")
    shape = _check_shape(shape)
    try:
        fits = broadcast_shapes(shape, x.shape) == tuple(x.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"the mask shape {shape} does not broadcast to the input shape {tuple(x.shape)}")
    return [spec(x.shape, x.dtype, x.meta_shape)]


def _split_infer(specs, n):
    _check_seed(specs[0])
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    return [spec((2,), dtypes.uint32) for _ in range(n)]


register(OpDef("random_uniform", _draw_infer, _uniform_kernel, grad=Grad.STOP, family="random",
               attributes={"shape": "ints", "low": "float", "high": "float", "dtype": "dtype"}))
register(OpDef("random_normal", _draw_infer, _normal_kernel, grad=Grad.STOP, family="random",
               attributes={"shape": "ints", "mean": "float", "std": "float", "dtype": "dtype"}))
register(OpDef("dropout", _dropout_infer, _dropout_kernel, family="random",
               attributes={"p": "float"}))
register(OpDef("shaped_dropout", _shaped_dropout_infer, _shaped_dropout_kernel, family="random",
               attributes={"shape": "ints", "ratio": "float"}))
register(OpDef("split_random_seed", _split_infer, _split_kernel, grad=Grad.STOP, family="random",
               attributes={"n": "int"}))


def _shape_attr(shape) -> object:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return [int(shape)]
    try:
        return list(shape)
    except TypeError:
        return shape  # the shape rule reports it


def _number_attr(value) -> object:
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else value


# public functions --------------------------------------------------------------------------------
def random_uniform(seed_tensor: Tensor, shape: Tuple[int, ...], low: float = 0.0, high: float = 1.0,
                   dtype: dtypes.dtype = dtypes.float32) -> Tensor:
    """Random values drawn uniformly from ``[low, high)``. Not differentiable.

    Args:
        seed_tensor: A uint32 tensor of shape (2,) that determines the values drawn.
        shape: The shape of the result.
        low: The lower bound.
        high: The upper bound (excluded).
        dtype: float16 or float32.

    Returns:
        A new tensor of ``shape`` and ``dtype``.

    Raises:
        TypeError: If ``seed_tensor`` is not a Tensor, or ``dtype`` is not float16 or float32.
        ValueError: If ``seed_tensor`` is not uint32 of shape (2,) or not in the current graph, or
            ``shape`` is not a tuple of positive ints.
    """
    return create_op("random_uniform", [seed_tensor],
                     {"shape": _shape_attr(shape), "low": float(low), "high": float(high), "dtype": dtype})[0]


def random_normal(seed_tensor: Tensor, shape: Tuple[int, ...], mean: float = 0.0, std: float = 1.0,
                  dtype: dtypes.dtype = dtypes.float32) -> Tensor:
    """Random values drawn from the normal distribution N(mean, std ** 2). Not differentiable.

    Args:
        seed_tensor: A uint32 tensor of shape (2,) that determines the values drawn.
        shape: The shape of the result.
        mean: The distribution's mean.
        std: The distribution's standard deviation.
        dtype: float16 or float32.

    Returns:
        A new tensor of ``shape`` and ``dtype``.

    Raises:
        TypeError: If ``seed_tensor`` is not a Tensor, or ``dtype`` is not float16 or float32.
        ValueError: If ``seed_tensor`` is not uint32 of shape (2,) or not in the current graph, or
            ``shape`` is not a tuple of positive ints.
    """
    return create_op("random_normal", [seed_tensor],
                     {"shape": _shape_attr(shape), "mean": float(mean), "std": float(std), "dtype": dtype})[0]


def dropout(t: Tensor, seed_tensor: Tensor, p: float) -> Tensor:
    """Zero each element with probability ``p`` and scale the others by ``1 / (1 - p)``.

    The mask depends only on the seed; the gradient uses the same mask.

    Args:
        t: A floating point tensor.
        seed_tensor: A uint32 tensor of shape (2,) that determines the mask.
        p: The probability of dropping an element, in [0, 1).

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If ``t`` or ``seed_tensor`` is not a Tensor.
        ValueError: If ``p`` is outside [0, 1), the seed is not uint32 of shape (2,), or a tensor is
            not in the current graph.
    """
    return create_op("dropout", [t, seed_tensor], {"p": _number_attr(p)})[0]


def shaped_dropout(t: Tensor, seed_tensor: Tensor, shape: Iterable[int], ratio: float) -> Tensor:
    """Dropout with one random mask of a given shape, broadcast over the tensor (e.g. to drop whole rows).

    Args:
        t: A floating point tensor.
        seed_tensor: A uint32 tensor of shape (2,) that determines the mask.
        shape: The mask's shape, which broadcasts to ``t``'s.
        ratio: The probability of dropping an entry, in [0, 1).

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If ``t`` or ``seed_tensor`` is not a Tensor.
        ValueError: If ``ratio`` is outside [0, 1), ``shape`` does not broadcast to ``t``'s, the seed
            is not uint32 of shape (2,), or a tensor is not in the current graph.
    """
    return create_op("shaped_dropout", [t, seed_tensor], {"shape": _shape_attr(shape), "ratio": _number_attr(ratio)})[0]


def split_random_seed(seed: Tensor, n: int = 2) -> Tuple[Tensor, ...]:
    """Derive new seeds from a seed, one for each random op: ``seed, s1 = ops.split_random_seed(seed)``.

    Args:
        seed: A uint32 tensor of shape (2,).
        n: How many seeds to derive.

    Returns:
        A tuple of ``n`` new uint32 tensors of shape (2,).

    Raises:
        TypeError: If ``seed`` is not a Tensor.
        ValueError: If ``seed`` is not uint32 of shape (2,), or is not in the current graph.
    """
    return tuple(create_op("split_random_seed", [seed], {"n": n}))


# gradients ------------------------------------------------------------------------------------------
# The mask depends only on the seed and the shape, so dropping the gradient with the same seed
# multiplies it by exactly the mask (and the 1/(1-p) scale) the forward pass used.
@grad_rule("dropout", "shaped_dropout")
def _dropout_grad(ctx):
    return [create_op(ctx.op.type, [ctx.grad(0), ctx.input(1)], ctx.attrs)[0], None]
