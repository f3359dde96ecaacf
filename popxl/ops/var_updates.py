"""popxl.ops.var_updates: in-place variable updates and optimiser building blocks."""
from __future__ import annotations

__all__: list = []
