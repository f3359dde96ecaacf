"""Random seeds: popxl random ops take a ``uint32[2]`` seed tensor (high word, low word)."""
from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["create_seeds", "uint64_to_two_uint32", "two_uint32_to_uint64", "MAX_UINT64"]

_U32 = 2 ** 32
MAX_UINT64 = 2 ** 64 - 1  # the largest seed a uint32[2] seed tensor holds


def uint64_to_two_uint32(num: int) -> Tuple[int, int]:
    """Split a uint64 into (high, low) uint32 words.

    Args:
        num: An int in [0, 2 ** 64).

    Returns:
        ``(high, low)``.

    Raises:
        ValueError: If ``num`` is out of range.
    """
    num = int(num)
    if not 0 <= num <= MAX_UINT64:
        raise ValueError(f"{num} is not in the uint64 range [0, 2**64).")
    return num // _U32, num % _U32


def two_uint32_to_uint64(a: int, b: int) -> int:
    """Join (high ``a``, low ``b``) uint32 words into a uint64.

    Args:
        a: The high word.
        b: The low word.

    Returns:
        The uint64 value.
    """
    for w in (a, b):
        if not 0 <= int(w) < _U32:
            raise ValueError(f"{w} is not in the uint32 range [0, 2**32).")
    return int(a) * _U32 + int(b)


def create_seeds(seed: int, offset: int = 0, batches_per_step: int = 1, gradient_accumulation_factor: int = 1,
                 replicas: int = 1) -> np.ndarray:
    """``batches_per_step * gradient_accumulation_factor * replicas`` seeds drawn from
    ``np.random.default_rng(seed + offset)``, as uint32 (high, low) pairs shaped
    ``(bps, gaf, replicas, 2)`` with every size-1 dimension squeezed (default shape ``(2,)``).

    Args:
        seed: The generator's seed.
        offset: Added to ``seed``.
        batches_per_step: The first dimension.
        gradient_accumulation_factor: The second dimension.
        replicas: The third dimension.

    Returns:
        A uint32 array of seeds, as ``ops.random_*`` take them.
    """
    n = batches_per_step * gradient_accumulation_factor * replicas
    draws = np.random.default_rng(seed + offset).integers(0, MAX_UINT64, size=n, dtype=np.uint64, endpoint=True)
    pairs = np.stack([(draws >> np.uint64(32)).astype(np.uint32), (draws & np.uint64(_U32 - 1)).astype(np.uint32)], -1)
    shaped = pairs.reshape(batches_per_step, gradient_accumulation_factor, replicas, 2)
    return np.squeeze(shaped, axis=tuple(i for i, d in enumerate(shaped.shape) if d == 1))
