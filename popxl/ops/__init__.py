"""popxl.ops: every op, grouped by family. Each op is declared once (see popxl/op.py)."""
from popxl.ops import utils
from popxl.ops import collectives
from popxl.ops.elementwise import *  # noqa: F401,F403
from popxl.ops.elementwise import (abs, add, add_, cast, ceil, clamp, clip, cos, detach, detach_, div, equal, exp,
                                   exp_, floor, fmod, gelu, gelu_, geluerf, geluerf_, greater, identity, isfinite,
                                   isinf, isnan, log, log2, logical_and, logical_not, logical_or, maximum, mul,
                                   negate, pow, relu, relu_, rename, scaled_add, scaled_add_, sigmoid, sign, sin,
                                   sqrt, sub, swish, swish_, tanh, where)
from popxl.ops.reduce import l1, l2, logsum, logsumexp, max, mean, median, min, prod, sum, sumsquare
from popxl.ops.shape import (concat, flatten, flatten_, gather, reshape, reshape_, slice, slice_, squeeze,
                             subsample, transpose, transpose_)
from popxl.ops.nn import matmul, softmax
from popxl.ops.host_io import host_load, host_store
from popxl.ops.placement import io_tile_copy, ipu_copy
from popxl.ops.call import (CallSiteInfo, ConditionalSiteInfo, call, call_with_info, conditional,
                            conditional_with_info, repeat, repeat_with_info)

__all__ = [
    "abs", "add", "add_", "cast", "ceil", "clamp", "clip", "cos", "detach", "detach_", "div", "equal", "exp", "exp_",
    "fmod", "gelu", "gelu_", "geluerf", "geluerf_", "greater", "identity", "isfinite", "isinf", "isnan", "log",
    "logical_and", "logical_not", "logical_or", "maximum", "mul", "negate", "pow", "relu", "relu_", "rename",
    "scaled_add", "scaled_add_", "sign", "sin", "sqrt", "sub", "swish", "swish_", "tanh", "where",
    "l1", "l2", "logsum", "logsumexp", "max", "mean", "median", "min", "prod", "sum", "sumsquare",
    "concat", "flatten", "flatten_", "gather", "reshape", "reshape_", "slice", "slice_", "squeeze", "subsample",
    "transpose", "transpose_", "matmul", "softmax", "host_load", "host_store", "io_tile_copy", "ipu_copy",
    "call", "call_with_info", "conditional", "conditional_with_info", "repeat", "repeat_with_info",
]
