"""``patterns.Patterns`` / ``patterns.PatternsLevel``: PopART's graph-rewrite selection (the same
classes as ``popart.Patterns``). popxl's compiler applies its own rewrites; see ``Ir.setPatterns``."""
from popart.options import Patterns, PatternsLevel

__all__ = ["Patterns", "PatternsLevel"]
