"""Random ops keyed by an explicit seed tensor: random_uniform, random_normal, dropout, ..."""
from __future__ import annotations

__all__: list = []
