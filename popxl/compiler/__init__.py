"""Lowering: Ir -> Executable (schedule, alias analysis, static memory plan, program tree)."""
from popxl.compiler.executable import Executable
from popxl.compiler.lower import lower

__all__ = ["Executable", "lower"]
