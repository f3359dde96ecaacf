"""Extreme-value cases for every registered op, run on both engines by test_extreme_values.py.

Each `Case` is a small program: host inputs, and ``build(*loaded) -> output(s)`` applying the op.
The inputs hold the values kernels get wrong: the most negative and positive integers, -1 and 0
(divisors, shifts, indices), NaN, +-inf, denormals, the largest finite floats, indices out of range
and negative, and empty tensors (0-sized dims). Cases are rebuilt from their key in a worker
process (extreme_worker.py), so everything here is deterministic.

`CASES` maps "op-case" keys to cases; `EXCLUDED` names the registered ops without cases and why.
A case marked ``slow`` runs only under ``-m slow`` (the other dtypes of an op family)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

import popxl
import popxl.ops as ops
from popxl.op import create_op
from popxl.ops import collectives, var_updates
from extreme_values import all_pairs as pairs, extremes

FLOATS = [np.float32, np.float16, np.float64]
SIGNED = [np.int32, np.int8, np.int16, np.int64]
UNSIGNED = [np.uint32, np.uint8, np.uint16, np.uint64]
INTS = SIGNED + UNSIGNED
# the first of each list runs by default, the others behind the slow marker
DEFAULT_DTYPES = {np.float32, np.int32, np.uint32, np.bool_}


@dataclass
class Case:
    op: str
    name: str
    inputs: List[np.ndarray]
    build: Callable
    replication: int = 1
    slow: bool = False
    # the native engine may run `op` through its NumPy fallback (a dtype its kernel leaves out)
    fallback_ok: bool = False
    # float comparisons between engines: relative and absolute tolerances (None: by dtype)
    rtol: Optional[float] = None
    atol: Optional[float] = None
    # Deliberate differences (docs/guide/limitations.md) where the reference gives NaN: "zero", oneDNN's
    # relu / clip post-op of conv_fused turns a NaN into 0; "skipped", oneDNN's max pooling skips a
    # NaN in a window (the maximum of the rest)
    native_nan: Optional[str] = None

    @property
    def key(self) -> str:
        return f"{self.op}-{self.name}"


CASES: Dict[str, Case] = {}


def add(op: str, name: str, inputs: Sequence[np.ndarray], build: Callable, **kw) -> None:
    case = Case(op, name, [np.asarray(a) for a in inputs], build, **kw)
    if case.key in CASES:
        raise RuntimeError(f"case {case.key} is defined twice")
    CASES[case.key] = case


def dname(dtype) -> str:
    return np.dtype(dtype).name


def is_slow(*dtypes) -> bool:
    return any(d not in DEFAULT_DTYPES for d in dtypes)


# value sets -----------------------------------------------------------------------------------------
def index_extremes(dtype, dim: int) -> np.ndarray:
    """Indices for an axis of length ``dim``: in range, negative, out of range, the dtype's limits."""
    dt = np.dtype(dtype)
    ii = np.iinfo(dt)
    vals = [0, dim - 1, dim, dim + 1, ii.max] + ([-1, -dim, -dim - 1, ii.min] if dt.kind == "i" else [])
    return np.array(vals, dt)


def rng(seed: int = 0):
    return np.random.default_rng(seed)


def floats(shape, dtype=np.float32, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return rng(seed).uniform(low, high, shape).astype(dtype)


def with_specials(x: np.ndarray, largest: bool = True) -> np.ndarray:
    """``x`` with NaN, +-inf, a denormal and (``largest``) the largest values in its first elements.
    Sums of products (matmuls, convolutions) get no largest values: whether max + max - max
    overflows depends on the order of the additions, which engines may choose."""
    x = x.copy()
    fi = np.finfo(x.dtype)
    flat = x.reshape(-1)
    special = [np.nan, np.inf, -np.inf, fi.smallest_subnormal] + ([fi.max, -fi.max] if largest else []) + [0.0, -0.0]
    flat[:min(len(special), flat.size)] = special[:flat.size]
    return x


def op_fn(name: str) -> Callable:
    """The public function of an op, or a direct create_op for internal ones."""
    for mod in (ops, var_updates, collectives):
        if hasattr(mod, name):
            return getattr(mod, name)
    return lambda *ts, **attrs: create_op(name, list(ts), attrs)[0]


# elementwise unary ----------------------------------------------------------------------------------
UNARY_FLOAT = ["cos", "sin", "tanh", "exp", "exp_", "log", "log2", "sqrt", "gelu", "gelu_", "geluerf", "geluerf_",
               "swish", "swish_", "sigmoid", "floor", "ceil", "erf"]
UNARY_SIGNED = ["abs", "negate", "relu", "relu_", "sign"]
PREDICATES = ["isnan", "isinf", "isfinite"]

for _name in UNARY_FLOAT + UNARY_SIGNED + PREDICATES + ["logical_not"]:
    _dtypes = FLOATS + (SIGNED if _name in UNARY_SIGNED else []) + (INTS + [np.bool_] if _name == "logical_not" else [])
    for _dt in _dtypes:
        add(_name, dname(_dt), [extremes(_dt)], lambda t, _f=op_fn(_name): _f(t), slow=is_slow(_dt),
            fallback_ok=np.dtype(_dt).kind != "f")
    add(_name, "empty", [np.zeros((0, 3), np.float32)], lambda t, _f=op_fn(_name): _f(t))
for _dt in INTS:
    add("bitwise_not", dname(_dt), [extremes(_dt)], lambda t: create_op("bitwise_not", [t])[0], slow=is_slow(_dt))

# elementwise binary ---------------------------------------------------------------------------------
ARITHMETIC = ["add", "add_", "sub", "mul", "div", "fmod", "pow", "maximum"]
for _name in ARITHMETIC:
    for _dt in FLOATS + INTS:
        add(_name, dname(_dt), pairs(_dt), lambda a, b, _f=op_fn(_name): _f(a, b), slow=is_slow(_dt))
    add(_name, "empty", [np.zeros((0, 3), np.float32), np.ones((1, 3), np.float32)],
        lambda a, b, _f=op_fn(_name): _f(a, b))
for _name in ["equal", "greater", "logical_and", "logical_or"]:
    for _dt in FLOATS + INTS + [np.bool_]:
        add(_name, dname(_dt), pairs(_dt), lambda a, b, _f=op_fn(_name): _f(a, b), slow=is_slow(_dt))
for _name in ["bitwise_and", "bitwise_or", "bitwise_xor", "bitshift_left", "bitshift_right"]:
    for _dt in INTS:
        add(_name, dname(_dt), pairs(_dt), lambda a, b, _n=_name: create_op(_n, [a, b])[0], slow=is_slow(_dt))
for _dt in FLOATS + SIGNED:
    add("relu_grad", dname(_dt), pairs(_dt), lambda g, x: create_op("relu_grad", [g, x])[0], slow=is_slow(_dt))
for _name in ["tanh_grad", "sigmoid_grad", "geluerf_grad"]:
    for _dt in FLOATS:
        add(_name, dname(_dt), pairs(_dt), lambda g, x, _n=_name: create_op(_n, [g, x])[0], slow=is_slow(_dt))
for _dt in FLOATS:
    add("gelu_grad", dname(_dt), pairs(_dt),
        lambda g, x: create_op("gelu_grad", [g, x, ops.gelu(x)])[0], slow=is_slow(_dt))
    add("add_n", dname(_dt), [*pairs(_dt), pairs(_dt)[0][::-1].copy()],
        lambda a, b, c: create_op("add_n", [a, b, c])[0], slow=is_slow(_dt))
    add("maximum", f"three-{dname(_dt)}", [*pairs(_dt), pairs(_dt)[0][::-1].copy()],
        lambda a, b, c: ops.maximum(a, b, c), slow=is_slow(_dt), fallback_ok=True)  # native: two operands
for _dt in INTS:
    add("add_n", dname(_dt), [*pairs(_dt), pairs(_dt)[0][::-1].copy()],
        lambda a, b, c: create_op("add_n", [a, b, c])[0], slow=is_slow(_dt))

for _dt in FLOATS + INTS + [np.bool_]:
    _a, _b = pairs(_dt)
    add("where", dname(_dt), [np.arange(_a.size) % 3 == 0, _a, _b], lambda c, a, b: ops.where(c, a, b),
        slow=is_slow(_dt))

# casts: every dtype's extremes to every dtype (NaN, inf and out-of-range floats to integers)
CAST_DTYPES = FLOATS + INTS + [np.bool_]
for _src, _dst in itertools.product(CAST_DTYPES, CAST_DTYPES):
    add("cast", f"{dname(_src)}-to-{dname(_dst)}", [extremes(_src)],
        lambda t, _d=popxl.dtypes.from_numpy(np.dtype(_dst)): ops.cast(t, _d), slow=is_slow(_src, _dst))

for _dt in FLOATS + INTS:
    _lo, _hi = (-1.5, 2.5) if np.dtype(_dt).kind == "f" else (-7.0, 7.0)
    add("clip", dname(_dt), [extremes(_dt)], lambda t, _l=_lo, _h=_hi: ops.clip(t, _l, _h), slow=is_slow(_dt))
    add("clip", f"unbounded-{dname(_dt)}", [extremes(_dt)], lambda t: ops.clip(t), slow=is_slow(_dt))
for _dt in FLOATS:
    _a, _b = pairs(_dt)
    add("scaled_add", dname(_dt), [_a, _b], lambda a, b: ops.scaled_add(a, b, 0.5, -2.0), slow=is_slow(_dt))
    add("scaled_add", f"tensor-scales-{dname(_dt)}", [_a, _b, np.array(np.inf, _dt), np.array(np.nan, _dt)],
        lambda a, b, s, u: ops.scaled_add(a, b, s, u), slow=is_slow(_dt))
    add("scaled_add_", dname(_dt), [_a, _b], lambda a, b: ops.scaled_add_(a, b, 0.5, -2.0), slow=is_slow(_dt))


# views and copies: extreme values pass through untouched; empty tensors -------------------------------
def _view_cases(dtype, slow: bool) -> None:
    x = np.resize(extremes(dtype), (4, 6))
    empty = np.zeros((0, 3), dtype)
    sfx = dname(dtype)
    add("identity", sfx, [x], lambda t: ops.identity(t), slow=slow)
    add("detach", sfx, [x], lambda t: ops.detach(t), slow=slow)
    add("detach_", sfx, [x], lambda t: ops.identity(ops.detach_(t)), slow=slow)
    add("reshape", sfx, [x], lambda t: ops.reshape(t, (3, 8)), slow=slow)
    add("reshape_", sfx, [x], lambda t: ops.identity(ops.reshape_(t, (8, 3))), slow=slow)
    add("transpose", sfx, [x], lambda t: ops.transpose(t), slow=slow)
    add("transpose_", sfx, [x], lambda t: ops.identity(ops.transpose_(t)), slow=slow)
    add("slice", sfx, [x], lambda t: ops.slice(t, [-1, 5], [-5, -100], [-1, -1], [0, 1]), slow=slow)
    add("slice_", sfx, [x], lambda t: ops.identity(ops.slice_(t, [2], [2**31 - 1], axis=[1])), slow=slow)
    add("subsample", sfx, [x], lambda t: ops.subsample(t, [3, 5]), slow=slow)
    add("subsample_view", sfx, [x], lambda t: ops.identity(create_op("subsample_view", [t], {"strides": (2, 4)})[0]),
        slow=slow)
    add("broadcast_to", sfx, [x[:1]], lambda t: create_op("broadcast_to", [t], {"shape": (2, 4, 6)})[0],
        slow=slow)
    add("concat", sfx, [x, empty.reshape(0, 6), x], lambda a, b, c: ops.concat([a, b, c], axis=0), slow=slow)
    add("concat_", sfx, [x, x[:, :0]], lambda a, b: ops.concat_([a, b], axis=1), slow=slow)
    add("split", sfx, [x], lambda t: ops.split(t, [0, 6, 0], axis=1), slow=slow)
    add("ipu_copy", sfx, [x], lambda t: ops.ipu_copy(t, 0), slow=slow)
    add("io_tile_copy", sfx, [x], lambda t: ops.io_tile_copy(t), slow=slow)
    for name, fn in [("concat", lambda a: ops.concat([a, a], axis=0)), ("split", lambda a: ops.split(a, 3, axis=1)),
                     ("reshape", lambda a: ops.reshape(a, (3, 0))), ("transpose", lambda a: ops.transpose(a)),
                     ("slice", lambda a: ops.slice(a, [0], [2], axis=[1])),
                     ("subsample", lambda a: ops.subsample(a, [2, 2]))]:
        add(name, f"empty-{sfx}", [empty], fn, slow=slow)


for _dt in FLOATS + INTS + [np.bool_]:
    _view_cases(_dt, is_slow(_dt))


# gathers and scatters: indices out of range, negative, at the dtype's limits --------------------------
INDEX_DTYPES = [np.int32, np.uint32, np.int64, np.int8, np.uint64]


def _gather_cases(idx_dtype, slow: bool) -> None:
    sfx = dname(idx_dtype)
    data = np.resize(extremes(np.float32), (5, 4))
    idx = index_extremes(idx_dtype, 5)
    add("gather", sfx, [data, idx], lambda t, i: ops.gather(t, i), slow=slow)
    add("gather", f"axis1-{sfx}", [data, index_extremes(idx_dtype, 4).reshape(-1, 1)],
        lambda t, i: ops.gather(t, i, axis=1), slow=slow)
    add("tied_gather", sfx, [data, idx], lambda t, i: ops.tied_gather(t, i), slow=slow)
    add("groupedgather", sfx, [np.stack([data, -data]), np.stack([idx, idx[::-1].copy()])],
        lambda t, i: ops.groupedgather(t, i, axis=0, group_size=2), slow=slow)
    g = floats((len(idx), 4), seed=1)
    add("gather_grad", sfx, [g, idx], lambda g, i: create_op("gather_grad", [g, i], {"axis": 0, "size": 5})[0],
        slow=slow)
    add("groupedgather_grad", sfx, [np.stack([g, g]), np.stack([idx, idx])],
        lambda g, i: create_op("groupedgather_grad", [g, i], {"axis": 0, "size": 5, "group_size": 2})[0], slow=slow)
    eidx = np.resize(index_extremes(idx_dtype, 5), (3, 4))
    add("gather_elements", sfx, [data, eidx],
        lambda t, i: create_op("gather_elements", [t, i], {"axis": 0, "data_shape": ()})[0], slow=slow)
    add("scatter", sfx, [data, eidx, floats((3, 4), seed=2)], lambda t, i, v: ops.scatter(t, i, v), slow=slow)
    vals = np.resize(extremes(np.float32), (3, 4))
    for red in ("sum", "max", "min", "none"):
        add("scatter_reduce", f"{red}-{sfx}", [vals, eidx],
            lambda d, i, _r=red: ops.scatter_reduce(d, i, _r, axis_size=5), slow=slow)
        add("scatter_reduce", f"{red}-init-{sfx}", [vals, eidx, data],
            lambda d, i, init, _r=red: ops.scatter_reduce(d, i, _r, initial_values=init), slow=slow)
    add("sparse_accumulate_", sfx, [data, floats((len(idx), 4), seed=3), idx],
        lambda t, x, i: var_updates.sparse_accumulate_(t, x, i, axis=0, f=2.0), slow=slow)
    offsets = [v for v in index_extremes(idx_dtype, 5).tolist()]
    for k, off in enumerate(offsets):
        o = np.array([off], idx_dtype)
        add("dynamic_slice", f"{sfx}-{k}", [data, o], lambda t, o: ops.dynamic_slice(t, o, [0], [2], False),
            slow=slow or k > 3)
        add("dynamic_update", f"{sfx}-{k}", [data, o, floats((5, 0))],
            lambda t, o, u: ops.dynamic_update(t, o, u, [1], [0], False), slow=True)
        add("dynamic_update", f"rows-{sfx}-{k}", [data, o, -np.ones((2, 4), np.float32)],
            lambda t, o, u: ops.dynamic_update(t, o, u, [0], [2], False), slow=slow or k > 3)
        add("dynamic_update_", f"{sfx}-{k}", [data, o, -np.ones((2, 4), np.float32)],
            lambda t, o, u: ops.dynamic_update_(t, o, u, [0], [2], False), slow=slow or k > 3)
    add("onehot", sfx, [index_extremes(idx_dtype, 4)],
        lambda i: ops.onehot(i, popxl.constant(np.int32(4)), popxl.constant(np.array([0.0, 1.0], np.float32)), -1),
        slow=slow)


for _dt in INDEX_DTYPES:
    _gather_cases(_dt, _dt not in (np.int32, np.uint32))
for _dt in FLOATS:
    add("onehot", dname(_dt), [extremes(_dt)],
        lambda i: ops.onehot(i, popxl.constant(np.int32(4)), popxl.constant(np.array([-1, 1], np.int8)), 0),
        slow=is_slow(_dt))
# empty data or indices
add("gather", "empty-indices", [np.ones((5, 4), np.float32), np.zeros((0, 2), np.int32)],
    lambda t, i: ops.gather(t, i, axis=1))
add("gather", "from-empty", [np.ones((0, 4), np.float32), np.array([0, -1, 3], np.int32)],
    lambda t, i: ops.gather(t, i, axis=0))
add("gather_grad", "empty", [np.ones((0, 4), np.float32), np.zeros((0,), np.int32)],
    lambda g, i: create_op("gather_grad", [g, i], {"axis": 0, "size": 5})[0])
add("scatter", "empty", [np.ones((0, 4), np.float32), np.zeros((0, 4), np.int32), np.ones((0, 4), np.float32)],
    lambda t, i, v: ops.scatter(t, i, v))
add("scatter_reduce", "empty", [np.ones((0, 4), np.float32), np.zeros((0, 4), np.int32)],
    lambda d, i: ops.scatter_reduce(d, i, "sum", axis_size=3))
# integer data: sums that overflow, max/min at the limits
for _dt in [np.int32, np.int64, np.int8, np.uint32]:
    _v = np.resize(extremes(_dt), (4, 5))
    _i = np.array([[0, 1, 0, 1, 0]] * 4, np.int32)
    for _red in ("sum", "max", "min"):
        add("scatter_reduce", f"{_red}-data-{dname(_dt)}", [_v, _i],
            lambda d, i, _r=_red: ops.scatter_reduce(d, i, _r, axis=1, axis_size=2), slow=is_slow(_dt))
    add("sparse_accumulate_", f"data-{dname(_dt)}", [_v, _v[:2], np.array([1, 1], np.int32)],
        lambda t, x, i: var_updates.sparse_accumulate_(t, x, i), slow=is_slow(_dt))


# reductions ------------------------------------------------------------------------------------------
REDUCTIONS = ["sum", "mean", "prod", "max", "min", "median", "l1", "l2", "logsum", "logsumexp", "sumsquare"]
# the native integer reductions are sum, prod, max and min (and median)
NATIVE_INT_REDUCTIONS = ("sum", "prod", "max", "min", "median")
for _name in REDUCTIONS:
    for _dt in FLOATS + INTS:
        _x = np.resize(extremes(_dt), (len(extremes(_dt)), 3)).T.copy()  # each row holds every extreme value
        _gap = np.dtype(_dt).kind in "iu" and _name not in NATIVE_INT_REDUCTIONS
        add(_name, dname(_dt), [_x], lambda t, _f=op_fn(_name): _f(t, axis=1), slow=is_slow(_dt), fallback_ok=_gap)
        add(_name, f"pairs-{dname(_dt)}", [np.stack(pairs(_dt), axis=1)], lambda t, _f=op_fn(_name): _f(t, axis=1),
            slow=True, fallback_ok=_gap)
    add(_name, "empty-axis", [np.zeros((3, 0), np.float32)], lambda t, _f=op_fn(_name): _f(t, axis=1))
    add(_name, "empty-kept", [np.zeros((0, 3), np.float32)], lambda t, _f=op_fn(_name): _f(t, axis=1))
for _name in ["argmax", "argmin"]:
    for _dt in FLOATS + INTS:
        _x = np.resize(extremes(_dt), (len(extremes(_dt)), 3)).T.copy()
        add(_name, dname(_dt), [_x], lambda t, _f=op_fn(_name): _f(t, 1), slow=is_slow(_dt))
        add(_name, f"pairs-{dname(_dt)}", [np.stack(pairs(_dt), axis=1)], lambda t, _f=op_fn(_name): _f(t, 1),
            slow=True)
for _dt in FLOATS + INTS:
    _x = np.resize(extremes(_dt), (3, len(extremes(_dt))))
    add("cumsum", dname(_dt), [_x], lambda t: ops.cumsum(t, 1), slow=is_slow(_dt))
    add("topk", dname(_dt), [_x], lambda t: ops.topk(t, 5, 1, True, True), slow=is_slow(_dt))
    add("topk", f"smallest-{dname(_dt)}", [_x], lambda t: ops.topk(t, 5, 1, False, False), slow=is_slow(_dt))
    add("histogram", dname(_dt), [_x], lambda t: ops.histogram(t, [-1.0, 0.0, 1e30], True), slow=is_slow(_dt))
    add("histogram", f"signed-{dname(_dt)}", [_x], lambda t: ops.histogram(t, [-1e30, -1.0, 0.0, 7.0], False),
        slow=is_slow(_dt))
    add("lamb_square", dname(_dt), [_x], lambda t: ops.lamb_square(t), slow=is_slow(_dt))
add("cumsum", "empty", [np.zeros((0, 3), np.float32)], lambda t: ops.cumsum(t, 0))
add("cumsum", "flat-empty", [np.zeros((2, 0), np.int32)], lambda t: ops.cumsum(t, None))
add("topk", "k0", [np.zeros((3, 4), np.float32)], lambda t: ops.topk(t, 0, 1, True, True))
add("topk", "empty", [np.zeros((0, 4), np.float32)], lambda t: ops.topk(t, 2, 1, True, True))
add("histogram", "empty", [np.zeros((0, 4), np.float32)], lambda t: ops.histogram(t, [0.0], False))
add("lamb_square", "empty", [np.zeros((0, 4), np.float32)], lambda t: ops.lamb_square(t))


# matmul, softmax, convolutions, pools, norms, losses --------------------------------------------------
def _matrix(dtype, rows: int, cols: int, seed: int) -> np.ndarray:
    """A matrix of extreme values (one per row in the first column) and ordinary ones."""
    m = floats((rows, cols), np.float64, seed).astype(dtype) if np.dtype(dtype).kind == "f" else \
        rng(seed).integers(-3, 4, (rows, cols)).astype(dtype)
    v = extremes(dtype)
    m[:min(rows, len(v)), 0] = v[:rows]
    return m


# Sums of products are compared with an absolute tolerance too: terms of magnitude ~4 that cancel
# leave rounding errors far larger than the result's own ulp.
GEMM_ATOL = {np.float32: 2e-5, np.float16: 1e-2, np.float64: 1e-12}
# the native GEMM and convolution kernels take float32 and float16 (integer and float64 operands run
# on the NumPy fallback)
NATIVE_GEMM = (np.float32, np.float16)
for _dt in FLOATS + INTS:
    _a, _b = _matrix(_dt, 16, 5, 1), _matrix(_dt, 5, 7, 2).copy()
    add("matmul", dname(_dt), [_a, _b], lambda a, b: ops.matmul(a, b), slow=is_slow(_dt),
        fallback_ok=_dt not in NATIVE_GEMM, atol=GEMM_ATOL.get(_dt))
for _dt in FLOATS:
    _a, _b = _matrix(_dt, 16, 5, 1), _matrix(_dt, 5, 7, 2)
    add("matmul_bias", dname(_dt), [_a, _b, with_specials(floats((7,), _dt))],
        lambda a, b, c: create_op("matmul_bias", [a, b, c])[0], slow=is_slow(_dt), fallback_ok=_dt != np.float32,
        atol=GEMM_ATOL[_dt])
    add("matmul_bias_add", dname(_dt), [_a, _b, floats((7,), _dt, seed=3), with_specials(floats((16, 7), _dt))],
        lambda a, b, c, r: create_op("matmul_bias_add", [a, b, c, r])[0], slow=is_slow(_dt),
        fallback_ok=_dt != np.float32, atol=GEMM_ATOL[_dt])
    add("matmul_update_", dname(_dt), [_a, _b, with_specials(floats((16, 7), _dt))],
        lambda a, b, t: create_op("matmul_update_", [a, b, t], {"b": -0.5})[0], slow=is_slow(_dt),
        fallback_ok=_dt not in NATIVE_GEMM, atol=GEMM_ATOL[_dt])
add("matmul", "empty-k", [np.ones((3, 0), np.float32), np.ones((0, 4), np.float32)], lambda a, b: a @ b)
add("matmul", "empty-m", [np.ones((0, 5), np.float32), np.ones((5, 4), np.float32)], lambda a, b: a @ b)
add("matmul", "empty-k-int", [np.ones((3, 0), np.int32), np.ones((0, 4), np.int32)], lambda a, b: a @ b,
    fallback_ok=True)


def _fp8(t, scale, fmt=popxl.float8_143):
    return ops.pow2scale_cast_to_fp8(t, scale, fmt)


LOG2_SCALES = [0, -32, 31, 32, -33, 2**31 - 1, -2**31]
for _k, _s in enumerate(LOG2_SCALES):
    _x = with_specials(floats((4, 6), seed=5, low=-300, high=300))
    _slow = _k > 3
    for _fmt in ("float8_143", "float8_152"):
        add("pow2scale_cast_to_fp8", f"{_fmt}-scale{_s}", [_x, np.array(_s, np.int32)],
            lambda t, s, _f=getattr(popxl, _fmt): ops.pow2scale_cast_from_fp8(
                _fp8(t, s, _f), popxl.constant(np.int32(0)), popxl.float32), slow=_slow)
        add("pow2scale_cast_from_fp8", f"{_fmt}-scale{_s}", [_x, np.array(_s, np.int32)],
            lambda t, s, _f=getattr(popxl, _fmt): ops.pow2scale_cast_from_fp8(
                _fp8(t, popxl.constant(np.int32(0)), _f), s, popxl.float16), slow=_slow)
    add("matmul_pow2scaled", f"scale{_s}", [_x, _x.T.copy(), np.array(_s, np.int32)],
        lambda a, b, s: ops.matmul_pow2scaled(_fp8(a, popxl.constant(np.int32(-4))),
                                              _fp8(b, popxl.constant(np.int32(-4))), s), slow=_slow)
    _img, _w = with_specials(floats((1, 2, 5, 5), seed=6)), floats((3, 2, 3, 3), seed=7)
    add("conv_pow2scaled", f"scale{_s}", [_img, _w, np.array(_s, np.int32)],
        lambda x, w, s: ops.conv_pow2scaled(_fp8(x, popxl.constant(np.int32(0))), _fp8(w, popxl.constant(np.int32(0))),
                                            s), slow=_slow)
    add("conv_transpose_pow2scaled", f"scale{_s}", [_img, _w.transpose(1, 0, 2, 3).copy(), np.array(_s, np.int32)],
        lambda x, w, s: ops.conv_transpose_pow2scaled(_fp8(x, popxl.constant(np.int32(0))),
                                                      _fp8(w, popxl.constant(np.int32(0))), s), slow=_slow)

for _dt in FLOATS:
    _x = with_specials(floats((4, 9), _dt, seed=8))
    _rows = np.array([[np.inf, 1, 2], [-np.inf, -np.inf, -np.inf], [np.inf, np.inf, 0], [np.nan, 0, 1],
                      [np.finfo(_dt).max, np.finfo(_dt).max, 0], [-np.inf, 0, 0]], _dt)
    add("softmax", dname(_dt), [_x], lambda t: ops.softmax(t, 1), slow=is_slow(_dt))
    add("softmax", f"rows-{dname(_dt)}", [_rows], lambda t: ops.softmax(t, 1), slow=is_slow(_dt))
    add("softmax", f"columns-{dname(_dt)}", [_rows], lambda t: ops.softmax(t, 0), slow=is_slow(_dt))
    add("softmax_grad", dname(_dt), [_x, floats((4, 9), _dt, seed=9, low=0, high=1)],
        lambda g, y: create_op("softmax_grad", [g, y], {"axis": 1})[0], slow=is_slow(_dt))
# fused attention (fuse_attention): q, k, v (2, 5, 3) / (2, 4, 3), a mask with -inf and -1e4 entries
for _dt in FLOATS:
    _q, _k, _v = floats((2, 5, 3), _dt, seed=11), floats((2, 4, 3), _dt, seed=12), floats((2, 4, 3), _dt, seed=13)
    _mask = np.where(rng(14).random((5, 4)) < 0.3, -1e4, 0).astype(_dt)
    _mask[0, 1] = -np.inf
    _g = floats((2, 5, 3), _dt, seed=15)
    add("attention", dname(_dt), [_q, _k, _v, _mask],
        lambda q, k, v, m: create_op("attention", [q, k, v, m], {"scale": 0.5})[0], slow=is_slow(_dt),
        fallback_ok=_dt != np.float32, atol=GEMM_ATOL[_dt])
    add("attention_grad", dname(_dt), [_q, _k, _v, _mask, _g],
        lambda q, k, v, m, g: create_op("attention_grad", [q, k, v, m, create_op("attention", [q, k, v, m],
                                                                                 {"scale": 0.5})[0], g],
                                        {"scale": 0.5})[0], slow=is_slow(_dt), fallback_ok=_dt != np.float32,
        atol=GEMM_ATOL[_dt])
add("attention", "empty", [np.zeros((2, 0, 3), np.float32), np.zeros((2, 4, 3), np.float32),
                           np.zeros((2, 4, 3), np.float32)],
    lambda q, k, v: create_op("attention", [q, k, v], {"scale": 1.0})[0], fallback_ok=True)
add("softmax", "empty", [np.zeros((0, 3), np.float32)], lambda t: ops.softmax(t, 1))
add("softmax", "empty-axis", [np.zeros((3, 0), np.float32)], lambda t: ops.softmax(t, 1))

# Convolutions: extreme values in the activations (or output gradients), the weights finite. A NaN
# or infinite weight meets the zeros of padding (and of a transposed convolution's spread input):
# 0 * inf is NaN in a kernel that multiplies them and absent in one that skips them, so such
# results are each kernel's own, not a contract.
CONV = dict(strides=(1, 1), pads=(1, 0, 1, 0), dilations=(1, 1), groups=1)
for _dt in FLOATS:
    _img = with_specials(floats((2, 2, 5, 5), _dt, seed=10), largest=False)
    _w = floats((3, 2, 3, 3), _dt, seed=11)
    _bias = with_specials(floats((3,), _dt, seed=12), largest=False)
    _slow = is_slow(_dt)
    _conv = dict(slow=_slow, fallback_ok=_dt not in NATIVE_GEMM, atol=GEMM_ATOL[_dt])
    add("conv", dname(_dt), [_img, _w], lambda x, w: ops.conv(x, w, padding=(1, 0, 1, 0)), **_conv)
    add("conv_transpose", dname(_dt), [_img, _w.transpose(1, 0, 2, 3).copy()],
        lambda x, w: ops.conv_transpose(x, w, stride=(2, 1)), **_conv)
    add("conv_fused", dname(_dt), [_img, _w, _bias], lambda x, w, b: op_fn("conv_fused")(x, w, b, **CONV), **_conv)
    add("conv_fused", f"relu-residual-{dname(_dt)}",
        [_img, _w, _bias, with_specials(floats((2, 3, 5, 3), _dt, seed=13), largest=False)],
        lambda x, w, b, r: create_op("conv_fused", [x, w, b, r], {**CONV, "residual": True, "relu": True})[0],
        native_nan="zero", **_conv)
    add("conv_grad", dname(_dt), [_img, _w, floats((2, 3, 5, 3), _dt, seed=14)],
        lambda x, w, g: create_op("conv_grad", [x, w, g], CONV), **_conv)
    add("conv_grad", f"dy-{dname(_dt)}", [floats((2, 2, 5, 5), _dt, seed=15), _w,
                                          with_specials(floats((2, 3, 3, 3), _dt, seed=14), largest=False)],
        lambda x, w, g: create_op("conv_grad", [x, w, g], {**CONV, "pads": (0, 0, 0, 0)}), **_conv)
    for _pool in ("max_pool", "average_pool"):
        add(_pool, dname(_dt), [_img], lambda x, _p=_pool: op_fn(_p)(x, (2, 3), stride=(2, 1), padding=(1, 1, 0, 0)),
            slow=_slow, fallback_ok=_dt not in NATIVE_GEMM,
            native_nan="skipped" if _pool == "max_pool" else None)
        _attrs = dict(kernel=(2, 3), strides=(2, 1), pads=(1, 1, 0, 0), dilations=(1, 1), ceil_mode=False)
        if _pool == "max_pool":
            _attrs["storage_order"] = "row"
        add(_pool + "_grad", dname(_dt), [_img, with_specials(floats((2, 2, 3, 4), _dt, seed=15))],
            lambda x, g, _p=_pool, _a=_attrs: create_op(_p + "_grad", [x, g], _a)[0], slow=_slow,
            fallback_ok=_dt not in NATIVE_GEMM)
    _c = [with_specials(floats((2,), _dt, seed=s)) for s in (16, 17, 18)]
    add("batch_norm_inference", dname(_dt), [_img, *_c, np.array([0.0, -1.0], _dt)],
        lambda x, s, b, m, v: ops.batch_norm_inference(x, s, b, m, v, epsilon=0.0), slow=_slow)
    _flat = np.stack([np.full(10, np.finfo(_dt).max, _dt), np.zeros(10, _dt), np.full(10, 3.0, _dt),
                      with_specials(floats((10,), _dt, seed=19))]).reshape(4, 2, 5)
    _gw, _gb = np.array([1.0, np.inf], _dt), np.array([0.0, np.nan], _dt)
    add("group_norm", dname(_dt), [_flat, _gw, _gb], lambda x, w, b: ops.group_norm(x, w, b, 2, eps=0.0), slow=_slow)
    add("layer_norm", dname(_dt), [_flat, _gw, _gb], lambda x, w, b: ops.layer_norm(x, w, b, eps=0.0), slow=_slow)
    add("group_norm_grad", dname(_dt), [_flat, _gw, floats((4, 2, 5), _dt, seed=20)],
        lambda x, w, g: create_op("group_norm_grad", [x, w, g], {"num_groups": 1, "eps": 0.0}), slow=_slow)
# (oneDNN primitives need a batch: an empty one runs on the fallback)
add("conv", "empty-batch", [np.zeros((0, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)],
    lambda x, w: ops.conv(x, w), fallback_ok=True)
add("max_pool", "empty-batch", [np.zeros((0, 2, 5, 5), np.float32)], lambda x: ops.max_pool(x, (2, 2)),
    fallback_ok=True)
add("average_pool", "empty-batch", [np.zeros((0, 2, 5, 5), np.float32)], lambda x: ops.average_pool(x, (2, 2)),
    fallback_ok=True)
add("group_norm", "empty-batch", [np.zeros((0, 2, 5), np.float32), np.ones(2, np.float32), np.ones(2, np.float32)],
    lambda x, w, b: ops.group_norm(x, w, b, 2))

# losses: labels out of range (an error in both engines), negative, the ignored index
for _dt in FLOATS:
    _p = np.array([[0.0, 1.0, np.nan, 0.5], [np.inf, 0.0, np.finfo(_dt).smallest_subnormal, 1.0],
                   [0.25, 0.25, 0.25, 0.25]], _dt)
    for _reduction in ("mean", "sum", "none"):
        add("nll_loss", f"{_reduction}-{dname(_dt)}", [_p, np.array([1, 2, 0], np.int32)],
            lambda p, l, _r=_reduction: ops.nll_loss(p, l, reduction=_r), slow=is_slow(_dt) or _reduction != "mean")
        add("nll_loss_grad", f"{_reduction}-{dname(_dt)}", [_p, np.array([1, 2, 0], np.int32), np.array(np.inf, _dt)],
            lambda p, l, g, _r=_reduction: create_op("nll_loss_grad", [p, l, g], {
                "ignore_index": None, "reduction": _r, "log_prob": False})[0],
            slow=is_slow(_dt) or _reduction != "mean")
        add("nll_loss_with_softmax_grad", f"{_reduction}-{dname(_dt)}", [_p, np.array([3, 1, 0], np.int32)],
            lambda p, l, _r=_reduction: ops.nll_loss_with_softmax_grad(p, l, reduction=_r),
            slow=is_slow(_dt) or _reduction != "mean")
for _dt in [np.int32, np.int64, np.uint32, np.int8]:
    _p = np.full((len(index_extremes(_dt, 4)), 4), 0.25, np.float32)
    _labels = index_extremes(_dt, 4)
    for _k in range(len(_labels)):
        _one = _labels[_k:_k + 1]
        add("nll_loss", f"label{_k}-{dname(_dt)}", [_p[:1], _one], lambda p, l: ops.nll_loss(p, l),
            slow=is_slow(_dt) or _k > 4)
        add("nll_loss", f"ignored{_k}-{dname(_dt)}", [_p[:1], _one],
            lambda p, l, _i=int(_one[0]): ops.nll_loss(p, l, ignore_index=_i, reduction="none")
            if -2**63 <= _i < 2**63 else ops.nll_loss(p, l), slow=True)
        add("nll_loss_grad", f"label{_k}-{dname(_dt)}", [_p[:1], _one, np.array(1.0, np.float32)],
            lambda p, l, g: create_op("nll_loss_grad", [p, l, g], {
                "ignore_index": -1, "reduction": "sum", "log_prob": True})[0], slow=True)
        add("nll_loss_with_softmax_grad", f"label{_k}-{dname(_dt)}", [_p[:1], _one],
            lambda p, l: ops.nll_loss_with_softmax_grad(p, l, ignore_index=0), slow=is_slow(_dt) or _k > 4)
add("nll_loss", "empty", [np.zeros((0, 4), np.float32), np.zeros((0,), np.int32)], lambda p, l: ops.nll_loss(p, l))
add("nll_loss_with_softmax_grad", "empty", [np.zeros((0, 4), np.float32), np.zeros((0,), np.int32)],
    lambda p, l: ops.nll_loss_with_softmax_grad(p, l))

# roi_align: boxes with NaN, inf, huge and negative corners; batch indices out of range
_ROI_IMG = floats((2, 1, 6, 7), seed=21)
_BIG = float(np.finfo(np.float32).max)
ROIS = {"nan": [np.nan, 0, 2, 2], "inf": [0, 0, np.inf, 3], "minus-inf": [-np.inf, -np.inf, 1, 1],
        "huge": [-_BIG, -_BIG, _BIG, _BIG], "outside": [100, 100, 120, 130], "negative": [-30, -20, -10, -5],
        "inverted": [5, 4, 1, 0], "point": [3, 3, 3, 3], "denormal": [1e-45, 1e-45, 1e-45, 2.0]}
for _k, (_label, _roi) in enumerate(ROIS.items()):
    for _ratio in (0, 2):
        _r = np.array([_roi], np.float32)
        add("roi_align", f"{_label}-ratio{_ratio}", [_ROI_IMG, _r, np.array([1], np.int32)],
            lambda x, r, b, _s=_ratio: ops.roi_align(x, r, b, (2, 3), 0.5, _s), slow=_ratio == 2 and _k > 3)
        add("roi_align_grad", f"{_label}-ratio{_ratio}",
            [_ROI_IMG, _r, np.array([1], np.int32), floats((1, 1, 2, 3), seed=22)],
            lambda x, r, b, g, _s=_ratio: create_op("roi_align_grad", [x, r, b, g], {
                "output_size": (2, 3), "spatial_scale": 0.5, "sampling_ratio": _s})[0], slow=_ratio == 2 or _k > 3)
for _b in index_extremes(np.int32, 2).tolist():
    _bi = np.array([_b], np.int32)
    _r = np.array([[0, 0, 2, 2]], np.float32)
    add("roi_align", f"batch{_b}", [_ROI_IMG, _r, _bi], lambda x, r, b: ops.roi_align(x, r, b, (2, 2), 1.0, 1))
    add("roi_align_grad", f"batch{_b}", [_ROI_IMG, _r, _bi, floats((1, 1, 2, 2), seed=23)],
        lambda x, r, b, g: create_op("roi_align_grad", [x, r, b, g], {
            "output_size": (2, 2), "spatial_scale": 1.0, "sampling_ratio": 1})[0])
add("roi_align", "no-boxes", [_ROI_IMG, np.zeros((0, 4), np.float32), np.zeros((0,), np.int32)],
    lambda x, r, b: ops.roi_align(x, r, b, (2, 2), 1.0, 0))

# interpolate: NaN / inf values in every mode; empty tensors
for _dt in FLOATS:
    _x = with_specials(floats((1, 1, 3, 4), _dt, seed=24))
    for _mode in ("nearest", "linear", "cubic"):
        add("interpolate", f"{_mode}-{dname(_dt)}", [_x],
            lambda t, _m=_mode: ops.interpolate(t, (1.0, 1.0, 2.5, 0.75), mode=_m), slow=is_slow(_dt))
        add("interpolate_grad", f"{_mode}-{dname(_dt)}", [_x, with_specials(floats((1, 1, 7, 3), _dt, seed=25))],
            lambda x, g, _m=_mode: create_op("interpolate_grad", [x, g], {
                "scale_factor": (1.0, 1.0, 2.5, 0.75), "mode": _m, "nearest_mode": "round_prefer_floor",
                "coordinate_transformation_mode": "half_pixel"})[0], slow=is_slow(_dt))
for _dt in INTS:
    add("interpolate", f"nearest-{dname(_dt)}", [np.resize(extremes(_dt), (1, 1, 3, 3))],
        lambda t: ops.interpolate(t, (1.0, 1.0, 2.0, 0.5), mode="nearest"), slow=is_slow(_dt))
add("interpolate", "empty", [np.zeros((0, 1, 3, 4), np.float32)],
    lambda t: ops.interpolate(t, (1.0, 1.0, 2.0, 2.0), mode="linear"))
add("interpolate", "to-empty", [np.ones((1, 1, 3, 4), np.float32)],
    lambda t: ops.interpolate(t, (1.0, 1.0, 0.25, 2.0), mode="cubic"))


# random ops: seeds at the limits, NaN and inf inputs -----------------------------------------------------
SEEDS = [[0, 0], [2**32 - 1, 2**32 - 1], [1, 2**31]]
for _k, _seed in enumerate(SEEDS):
    _s = np.array(_seed, np.uint32)
    add("random_uniform", f"seed{_k}", [_s], lambda s: ops.random_uniform(s, (3, 5), -1e38, 1e38))
    add("random_normal", f"seed{_k}", [_s], lambda s: ops.random_normal(s, (3, 5), 0.0, 1e38))
    add("dropout", f"seed{_k}", [with_specials(floats((3, 5), seed=26)), _s], lambda x, s: ops.dropout(x, s, 0.5))
    add("shaped_dropout", f"seed{_k}", [with_specials(floats((3, 5), seed=27)), _s],
        lambda x, s: ops.shaped_dropout(x, s, [3, 1], 0.999999))
    add("split_random_seed", f"seed{_k}", [_s], lambda s: list(ops.split_random_seed(s, 3)))
add("random_uniform", "infinite-bounds", [np.array([1, 2], np.uint32)],
    lambda s: ops.random_uniform(s, (2, 3), -np.inf, np.inf, popxl.float16))
add("dropout", "float16", [with_specials(floats((3, 5), np.float16, seed=28)), np.array([5, 6], np.uint32)],
    lambda x, s: ops.dropout(x, s, 0.0))
add("dropout", "empty", [np.zeros((0, 5), np.float32), np.array([5, 6], np.uint32)],
    lambda x, s: ops.dropout(x, s, 0.3))


# misc: init, increment_mod, print_tensor ----------------------------------------------------------------
add("init", "empty", [np.zeros(1, np.float32)],
    lambda t: [t, ops.init((0, 3), popxl.float32), ops.init((2,), popxl.int64)])
for _dt in FLOATS + INTS:
    _int = np.dtype(_dt).kind in "iu"
    for _inc, _mod in ([(1, 7), (-3, -7), (2**62, 2**63 - 1), (-1, 1)] if _int else
                       [(1.5, 7.0), (np.inf, 3.0), (1.0, np.inf), (np.nan, 1.0), (1.0, 1e-45)]):
        add("increment_mod", f"{dname(_dt)}-{_inc}-{_mod}", [extremes(_dt)],
            lambda t, _i=_inc, _m=_mod: ops.increment_mod(t, _i, _m), slow=is_slow(_dt) or _inc != 1)
        add("increment_mod_", f"{dname(_dt)}-{_inc}-{_mod}", [extremes(_dt)],
            lambda t, _i=_inc, _m=_mod: ops.increment_mod_(t, _i, _m), slow=True)
for _dt in FLOATS + INTS + [np.bool_]:
    add("print_tensor", dname(_dt), [np.resize(extremes(_dt), (3, 4))],
        lambda t: ops.print_tensor(t, "extreme", summarise_threshold=4, edge_items=1), slow=is_slow(_dt))
add("print_tensor", "empty", [np.zeros((0, 3), np.float32)], lambda t: ops.print_tensor(t))


# var updates: NaN / inf / extreme operands and scalars, integer accumulators ------------------------------
ACCUMULATORS = {
    "accumulate_": lambda t, x: var_updates.accumulate_(t, x, 0.5),
    "accumulate_square_": lambda t, x: var_updates.accumulate_square_(t, x, 2.0),
    "accumulate_mean_": lambda t, x: var_updates.accumulate_mean_(t, x, 3.0),
    "accumulate_moving_average_": lambda t, x: var_updates.accumulate_moving_average_(t, x, 0.9),
    "accumulate_moving_average_square_": lambda t, x: var_updates.accumulate_moving_average_square_(t, x, 0.9),
    "accumulator_scale_": lambda t, x: var_updates.accumulator_scale_(t, -2.0),
    "accumulator_zero_": lambda t, x: var_updates.accumulator_zero_(t),
    "copy_var_update_": lambda t, x: var_updates.copy_var_update_(t, x),
}
for _name, _fn in ACCUMULATORS.items():
    for _dt in FLOATS + INTS:
        _t, _x = pairs(_dt)
        add(_name, dname(_dt), [_t, _x], _fn, slow=is_slow(_dt))
    add(_name, "float16-from-float32", [pairs(np.float16)[0], pairs(np.float32)[1][:256]], _fn, slow=True)
    add(_name, "empty", [np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)], _fn)
for _dt in FLOATS:
    _m, _v = pairs(_dt)
    _w = np.roll(_m, 3)
    _step = np.array(0.0, np.float32)
    add("adam_updater", dname(_dt), [_m, np.abs(_v), _w, _step],
        lambda m, v, w, s: var_updates.adam_updater(m, v, w, s, 1e-2, 0.9, 0.999, 1e-8), slow=is_slow(_dt))
    add("lamb_updater", dname(_dt), [_m, _v, _w],
        lambda m, v, w: var_updates.lamb_updater(m, v, w, None, np.inf, None, None, 0.0), slow=is_slow(_dt))
    add("adamax_updater", dname(_dt), [_m, _v, _w, np.array(2**31 - 2, np.int32)],
        lambda m, v, w, s: var_updates.adamax_updater(m, v, w, s, 0.0, 1.0, 1e-45), slow=is_slow(_dt))
    for _k, (_r1, _r2) in enumerate([(np.nan, 1.0), (np.inf, np.inf), (0.0, 5.0), (4.0, 1e-45), (-1.0, 4.0)]):
        add("adam_var_update", f"{dname(_dt)}-{_k}", [_m, _v, np.array(_r1, np.float32), np.array(_r2, np.float32)],
            lambda t, x, r1, r2: var_updates.adam_var_update(t, x, r1, r2, 0.1, 10.0), slow=is_slow(_dt) or _k > 2)


# collectives: two replicas holding extreme values (integer sums that overflow) ------------------------------
def _two_replicas(dtype) -> np.ndarray:
    a, b = pairs(dtype)
    return np.stack([a, b])


for _dt in FLOATS + INTS:
    _x = _two_replicas(_dt)
    _slow = is_slow(_dt)
    for _op in ("add", "mean", "mul", "max", "min", "square_add"):
        add("replicated_all_reduce", f"{_op}-{dname(_dt)}", [_x],
            lambda t, _o=_op: collectives.replicated_all_reduce(t, _o), replication=2, slow=_slow or _op != "add")
    add("replicated_all_reduce_", dname(_dt), [_x], lambda t: collectives.replicated_all_reduce_(t, "add"),
        replication=2, slow=_slow)
    add("replicated_reduce_scatter", dname(_dt), [_x[:, :-1]],
        lambda t: collectives.replicated_reduce_scatter(t, "add"), replication=2, slow=_slow)
    add("replicated_all_gather", dname(_dt), [_x], lambda t: collectives.replicated_all_gather(t), replication=2,
        slow=_slow)
    add("replica_sharded_slice", dname(_dt), [_x[:, :-1]], lambda t: collectives.replica_sharded_slice(t),
        replication=2, slow=_slow)
    add("replicated_slice", dname(_dt), [_x], lambda t: collectives.replicated_slice(t), replication=2, slow=_slow)
    add("all_reduce", dname(_dt), list(pairs(_dt)), lambda a, b: collectives.all_reduce([a, b], [0, 1]), slow=_slow)
add("replicated_all_reduce", "empty", [np.zeros((2, 0, 3), np.float32)],
    lambda t: collectives.replicated_all_reduce(t), replication=2)


# remote buffers: offsets out of range, negative, at the dtype's limits -------------------------------------
def _remote(kind: str):
    def build(x, offset):
        buf = popxl.remote_buffer(x.shape, x.dtype, entries=3)
        if kind == "store":
            ops.remote_store(buf, offset, x)
            return ops.remote_load(buf, popxl.constant(np.uint32(0)))
        ops.remote_store(buf, popxl.constant(np.uint32(2)), x)
        if kind == "load":
            return ops.remote_load(buf, offset)
        return ops.remote_load_(buf, offset, ops.init(x.shape, x.dtype))
    return build


for _dt in [np.uint32, np.int32, np.int64, np.uint8]:
    for _k, _off in enumerate(index_extremes(_dt, 3).tolist()):
        for _kind, _op in (("load", "remote_load"), ("load_", "remote_load_"), ("store", "remote_store")):
            add(_op, f"{dname(_dt)}-{_k}", [with_specials(floats((2, 3), seed=29)), np.array(_off, _dt)],
                _remote(_kind), slow=is_slow(_dt) or _k > 5)


# popxl-addons' custom ops (popxl.ops.addons): NaN / inf / the largest floats, labels out of range ---------
from popxl.ops import addons  # noqa: E402


def _specials_rows(shape, seed: int, largest: bool = True) -> np.ndarray:
    """Random floats with NaN, +-inf, a denormal (and the largest values) in the first row."""
    x = floats(shape, seed=seed)
    x[0] = with_specials(x[0], largest)
    return x


_LABELS = np.array([0, 3, -1, 2**31 - 1, 5, -(2**31)], np.int32)  # in range, past the shard, negative, limits
_x2 = np.stack([_specials_rows((6, 4), 31), _specials_rows((6, 4), 32)])
add("replicated_all_reduce_tp", "float32", [_x2], lambda t: addons.replicated_all_reduce_tp(t), replication=2)
add("replicated_all_reduce_strided", "float32", [_x2],
    lambda t: addons.replicated_all_reduce_strided(t, "add", stride=1, group_size=2), replication=2)
add("replicated_all_gather_strided", "float32", [_x2], lambda t: addons.replicated_all_gather_strided(t),
    replication=2)
add("replicated_reduce_scatter_strided", "float32", [_x2],
    lambda t: addons.replicated_reduce_scatter_strided(t, "add"), replication=2)
add("cross_entropy_sharded", "float32", [_x2, np.stack([_LABELS, _LABELS - 4])],
    lambda t, i: addons.cross_entropy_sharded(t, i), replication=2)
add("cross_entropy_sharded_wr", "float32", [_x2[0], _x2[1], _LABELS, _LABELS - 4],
    lambda a, b, i, j: (lambda r: (r[0], *r[1]))(addons.cross_entropy_sharded_wr([a, b], [i, j])))
# the local pieces, with row maxima and denominators of every kind (0, NaN, inf, negative)
_row = np.array([0.0, np.nan, np.inf, -np.inf, 1e-45, -3.0], np.float32)
add("cross_entropy_sharded_denominator", "float32", [_x2[0], _row],
    lambda x, m: create_op("cross_entropy_sharded_denominator", [x, m])[0])
add("cross_entropy_sharded_nll", "float32", [_x2[0], _row, _row[::-1].copy(), _LABELS],
    lambda x, m, d, i: create_op("cross_entropy_sharded_nll", [x, m, d, i]))
add("cross_entropy_sharded_grad", "float32", [_row, _x2[0], _LABELS],
    lambda g, nls, i: create_op("cross_entropy_sharded_grad", [g, nls, i])[0])
add("layer_norm_distributed", "float32", [_x2, np.stack([_x2[0, 1], _x2[1, 1]]), np.stack([_x2[0, 2], _x2[1, 2]])],
    lambda t, w, b: addons.layer_norm_distributed(t, w, b, 1e-5), replication=2)
_rot = with_specials(floats((1, 3, 2, 6), seed=33))
_sin, _cos = with_specials(floats((1, 3, 2), seed=34)), with_specials(floats((1, 3, 2), seed=35))[:, ::-1].copy()
add("rotary_pos_embed", "float32", [_rot, _sin, _cos], lambda x, s, c: addons.rotary_pos_embed(x, s, c, 4))
add("rotary_pos_embed", "halves-float32", [_rot, _sin, _cos],
    lambda x, s, c: addons.rotary_pos_embed(x, s, c, 4, pairing="halves"))
add("rotary_pos_embed_grad", "float32", [_rot, _sin, _cos],
    lambda x, s, c: create_op("rotary_pos_embed_grad", [x, s, c], {"rotary_dim": 4, "pairing": "interleaved"})[0])
add("grad_reduce_square_add", "float32", [with_specials(floats((4, 5), seed=36)), np.array(np.inf, np.float32)],
    lambda t, scale: addons.grad_reduce_square_add(t, scale))
add("group_quantize_decompress", "float32",
    [np.array([0, 0xFFFF, 0x1234, 0x8000, 0x0F0F, 1], np.uint16).reshape(3, 1, 2),
     with_specials(floats((3, 1, 1), seed=37)), with_specials(floats((3, 1, 1), seed=38))[::-1].copy()],
    addons.group_quantize_decompress)
for _dt in (np.float32, np.float16):
    add("fp8_mse_scale", dname(_dt), [with_specials(floats((5, 6), _dt, seed=39))],
        lambda t: addons.fp8_mse_scale(t, 85, 18, 2.0 ** -40), slow=is_slow(_dt))
add("fp8_mse_scale", "empty", [np.zeros((0, 3), np.float32)], lambda t: addons.fp8_mse_scale(t, 78, 33, 2.0 ** -42))
add("linear_layout", "float32", [with_specials(floats((3, 4), seed=40))], lambda t: addons.linear_layout(t, 4))
_sparse = np.array([[np.inf, 0, 1.0], [0, 0, 0], [np.nan, -2.0, 0], [0, 3.4e38, 3.4e38]])
add("dense_sparse_matmul", "float32", [with_specials(floats((2, 4), seed=41), largest=False)],
    lambda t: addons.dense_sparse_matmul(t, _sparse[_sparse != 0], np.nonzero(_sparse)[1],
                                         np.concatenate([[0], np.cumsum((_sparse != 0).sum(1))]), 3))


# ops without cases ----------------------------------------------------------------------------------------
EXCLUDED = {
    "call": "program structure (a subgraph call), no kernel",
    "repeat": "program structure (a loop), no kernel",
    "if": "program structure (a conditional), no kernel",
    "host_load": "program structure (every case reads its inputs through it)",
    "host_store": "program structure (every case writes its outputs through it)",
    "remote_code_load": "a no-op on the CPU: no values",
}
