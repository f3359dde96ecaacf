"""Miscellaneous ops: init, increment_mod, print_tensor."""
from __future__ import annotations

__all__: list = []
