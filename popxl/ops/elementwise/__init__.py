"""Elementwise ops, one module per family: `unary` math, `activations` (with their gradient ops),
`arithmetic` with NumPy broadcasting, comparisons and `logic`, and `casts` and identities. Each op
is declared once, its gradient beside it; in-place variants (``name_``) share the rule and kernel of
their op and write into their first input.

``__all__`` is what popxl.ops exports from here; floor and log2 (public in popxl.ops, as in PopXL,
though outside its ``__all__``), sigmoid and erf (not PopXL ops) are reachable here too."""
from popxl.ops.elementwise.activations import gelu, gelu_, geluerf, geluerf_, relu, relu_, sigmoid, swish, swish_, tanh  # noqa: F401  (sigmoid: see above)
from popxl.ops.elementwise.arithmetic import add, add_, div, fmod, maximum, mul, pow, scaled_add, scaled_add_, sub
from popxl.ops.elementwise.casts import cast, detach, detach_, identity, rename
from popxl.ops.elementwise.logic import equal, greater, logical_and, logical_not, logical_or, where
from popxl.ops.elementwise.unary import (abs, ceil, clamp, clip, cos, erf, exp, exp_, floor, isfinite,  # noqa: F401
                                         isinf, isnan, log, log2, negate, sign, sin, sqrt)  # noqa: F401

__all__ = ["abs", "add", "add_", "cast", "ceil", "clamp", "clip", "cos", "detach", "detach_", "div", "equal", "exp",
           "exp_", "fmod", "gelu", "gelu_", "geluerf", "geluerf_", "greater", "identity", "isfinite", "isinf", "isnan",
           "log", "logical_and", "logical_not", "logical_or", "maximum", "mul", "negate", "pow", "relu", "relu_",
           "rename", "scaled_add", "scaled_add_", "sign", "sin", "sqrt", "sub", "swish", "swish_", "tanh", "where"]
