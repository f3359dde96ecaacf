"""The native engine against the reference engine (the oracle), op by op: dtypes, odd shapes
(rank 0, size-0 and size-1 dims), broadcasting, in-place variants and strided views."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.op import create_op
from popxl.ops import elementwise
from engine_harness import compare_engines

RNG = np.random.default_rng(0)
SHAPES = [(), (0, 3), (1,), (3, 1, 5), (17, 33)]
TOL = {np.float32: dict(rtol=2e-6, atol=1e-6), np.float16: dict(rtol=2e-3, atol=1e-3)}


def rand(shape, dtype=np.float32, low=-3.0, high=3.0):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    return RNG.uniform(low, high, size=shape).astype(dtype)


UNARY = ["abs", "cos", "sin", "tanh", "exp", "log", "log2", "sqrt", "negate", "relu", "gelu", "geluerf", "swish",
         "sigmoid", "floor", "ceil", "sign"]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_unary(name, shape, dtype):
    x = rand(shape, dtype)
    if name in ("log", "log2", "sqrt"):
        x = np.abs(x) + dtype(0.1)
    if x.size:
        x.flat[0] = np.nan  # NaN handling must agree too
    native = [] if name in ("sigmoid", "log2") else [name]
    compare_engines(lambda t: getattr(elementwise, name)(t), [x], native_ops=native, **TOL[dtype])


@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite"])
def test_predicates(name):
    x = np.array([0.0, np.nan, np.inf, -np.inf, 1.5, -2.0], np.float32)
    compare_engines(lambda t: getattr(ops, name)(t), [x], native_ops=[name])


@pytest.mark.parametrize("name", ["relu_", "exp_", "gelu_", "swish_"])
def test_unary_in_place_through_a_view(name):
    x = rand((4, 6))
    def build(t):
        v = ops.transpose_(t)          # a strided view: the kernel writes through it
        getattr(ops, name)(v)
        return t + 0.0
    compare_engines(build, [x], native_ops=[name], **TOL[np.float32])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("shape", [(300, 257), (3, 120, 130)], ids=str)
def test_elementwise_of_transposed_views(shape, dtype):
    """Big transposed operands (walked in tiles), with a broadcast and a dense one; float32 unary
    ops on them staged through the vector forms. Values: exactly the reference's for the add,
    within the unary tolerance for exp / tanh; the last row and column of tiles are partial."""
    x, d = rand(shape, dtype, 1, 3), rand(shape[:-2] + shape[:-3:-1], dtype, 1, 3)
    row = rand(shape[-2:-1], dtype, 1, 3)  # broadcast along the transposed view's rows
    perm = tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2)

    def build(a, b, c):
        v = ops.transpose(a, perm)
        out = [v + b + c]
        if dtype != np.int32:
            out += [ops.exp(v), ops.tanh(v)]
        return out
    compare_engines(build, [x, d, row], native_ops=["add"] + (["exp", "tanh"] if dtype != np.int32 else []),
                    **({} if dtype == np.int32 else TOL[dtype]))


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int8, np.uint16])
def test_transposed_views_of_every_width(dtype):
    """Transposed operands of 8-, 2- and 1-byte values (copied into dense tiles value by value), a
    transposed bool condition of where, and casts from transposed views: bit-identical."""
    x, d = rand((150, 270), dtype, 1, 3), rand((270, 150), dtype, 1, 3)
    c = rand((150, 270), np.bool_)

    def build(a, b, cond):
        v = ops.transpose(a)
        return [v + b, ops.where(ops.transpose(cond), v, b), ops.cast(v, popxl.float32)]
    compare_engines(build, [x, d, c], native_ops=["add", "where", "cast"])


BROADCAST = [((3, 1, 5), (4, 5)), ((), (2, 3)), ((0, 3), (1, 3)), ((2, 3), (2, 3)), ((1,), (7, 1))]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("shapes", BROADCAST, ids=str)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "fmod", "pow", "maximum"])
def test_binary(name, shapes, dtype):
    a, b = rand(shapes[0], dtype), rand(shapes[1], dtype, 1, 4)
    if name == "pow" and dtype != np.int32:
        a = np.abs(a)
    if name in ("div", "fmod") and np.dtype(dtype).kind == "i":
        a = rand(shapes[0], dtype, -20, 20)
        b = b * np.where(rand(shapes[1], np.bool_), 1, -1).astype(dtype)  # negative divisors too
    exact = np.dtype(dtype).kind == "i"
    tol = {} if exact else TOL[dtype]
    compare_engines(lambda x, y: getattr(ops, name)(x, y), [a, b], native_ops=[name], **tol)


@pytest.mark.parametrize("name", ["equal", "greater", "logical_and", "logical_or"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_compare_and_logic(name, dtype):
    a, b = rand((3, 4), dtype, -2, 2), rand((1, 4), dtype, -2, 2)
    if dtype == np.float32:
        a, b = np.round(a), np.round(b)  # equal values occur
    compare_engines(lambda x, y: getattr(ops, name)(x, y), [a, b], native_ops=[name])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint32, np.int64])
@pytest.mark.parametrize("shapes", BROADCAST[:3], ids=str)
@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"])
def test_bitwise(name, shapes, dtype):
    info = np.iinfo(dtype)
    a, b = rand(shapes[0], dtype, info.min, info.max), rand(shapes[1], dtype, info.min, info.max)
    inputs = [a] if name == "bitwise_not" else [a, b]
    want = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
            "bitwise_not": np.invert}[name](*inputs)
    got = compare_engines(lambda *xs: create_op(name, list(xs))[0], inputs, native_ops=[name])
    np.testing.assert_array_equal(got[0], want)


def _shift_oracle(x: int, k: int, left: bool, bits: int, signed: bool) -> int:
    """ONNX BitShift on Python ints: the result wraps to ``bits``; out-of-range shifts leave the sign fill."""
    if k < 0 or k >= bits:
        return -1 if (not left and x < 0) else 0
    r = (x << k) % (1 << bits) if left else x >> k  # Python's >> on negative ints sign-extends
    return r - (1 << bits) if signed and r >= 1 << (bits - 1) else r


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
@pytest.mark.parametrize("direction", ["left", "right"])
def test_bitshift_by_every_amount(direction, dtype):
    # every shift from (for signed types) -3 to past the width, of large, small and negative values
    info, bits = np.iinfo(dtype), 8 * np.dtype(dtype).itemsize
    amounts = np.arange(-3 if info.min < 0 else 0, bits + 3)
    values = [info.max - 5, 1, 3] + ([-1, info.min + 7] if info.min < 0 else [])
    x = np.repeat(np.array(values, dtype), len(amounts))
    s = np.tile(amounts, len(values)).astype(dtype)
    got = compare_engines(lambda a, b: create_op(f"bitshift_{direction}", [a, b])[0], [x, s],
                          native_ops=[f"bitshift_{direction}"])
    want = [_shift_oracle(int(v), int(k), direction == "left", bits, info.min < 0) for v, k in zip(x, s)]
    np.testing.assert_array_equal(got[0], np.array(want, dtype))


def test_bit_operations_refuse_other_dtypes():
    with popxl.Ir().main_graph:
        f, b = popxl.constant(np.ones(2, np.float32)), popxl.constant(np.ones(2, np.bool_))
        with pytest.raises(TypeError, match="needs an integer dtype, got float32"):
            create_op("bitwise_and", [f, f])
        with pytest.raises(TypeError, match="needs an integer dtype, got bool"):
            create_op("bitshift_left", [b, b])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_relu_grad(dtype):
    """g * (x > 0), bit for bit: zero, negative and NaN x give g * 0 (NaN for an infinite or NaN
    g, -0.0 for a negative g); x broadcasts."""
    g, x = rand((4, 6), dtype), rand((1, 6), dtype)
    x[0, :3] = 0
    if dtype != np.int32:
        g[1, :] = [np.inf, -np.inf, np.nan, -1.5, 2.0, np.inf]
        x[0, 3:] = [np.nan, -1.0, 1.0]
    compare_engines(lambda a, b: create_op("relu_grad", [a, b])[0], [g, x], native_ops=["relu_grad"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", ["tanh_grad", "sigmoid_grad"])
def test_gradients_from_the_output(name, dtype):
    """g * slope(y) from a forward output y (tanh's in (-1, 1), sigmoid's in (0, 1)), computed in
    float32 and rounded once: bit for bit on both engines, strided g included."""
    g, y = rand((5, 8), dtype), rand((8, 5), dtype, -1, 1)
    if name == "sigmoid_grad":
        y = np.abs(y)
    y[0, 0], g[1, 1] = np.nan, np.inf
    compare_engines(lambda a, b: create_op(name, [ops.transpose(a), b])[0], [g, y], native_ops=[name])


def test_add_in_place_with_broadcast():
    compare_engines(lambda x, y: ops.add_(x, y) * 1.0, [rand((3, 4)), rand((4,))], native_ops=["add_"])


REDUCTIONS = ["sum", "mean", "prod", "max", "min", "l1", "l2", "logsum", "logsumexp", "sumsquare"]


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, True), ((0, 2), False), (-1, False), (1, True)])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions(name, axis, keepdims):
    x = rand((3, 4, 5), np.float32, 0.5, 1.5)
    compare_engines(lambda t: getattr(ops, name)(t, axis, keepdims), [x], native_ops=[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [0, (0, 2), -1, 1])
@pytest.mark.parametrize("name,dtype", [("sum", np.float32), ("max", np.float32), ("logsumexp", np.float32),
                                        ("sum", np.int32), ("max", np.int32)])
def test_big_reductions_split_over_threads(name, dtype, axis):
    """Big enough to be cut into slabs along a kept axis, one per thread."""
    x = rand((40, 33, 30), dtype, -3 if dtype == np.int32 else 0.5, 3 if dtype == np.int32 else 1.5)
    compare_engines(lambda t: getattr(ops, name)(t, axis), [x], native_ops=[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "l2", "logsumexp"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_whole_tensor_reductions_in_chunks(name, dtype):
    """One result from ~100k values: fixed chunks folded on both threads, merged in chunk order."""
    if dtype == np.int32 and name not in ("sum", "max", "min"):
        pytest.skip("integer reductions are sum, prod, max and min")
    low, high = (-50, 50) if dtype == np.int32 else (0.5, 1.5)
    x = rand((333, 301), dtype, low, high)
    if dtype == np.float16 and name == "sum":
        x = (x / 1000).astype(dtype)  # a float16 sum of 1e5 values near 1 would overflow
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-3, atol=1e-3)
    compare_engines(lambda t: getattr(ops, name)(t), [x], native_ops=[name], **tol)


@pytest.mark.parametrize("axis", [None, -1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", ["max", "min"])
def test_extremes_with_nan_and_infinities(name, dtype, axis):
    """max / min in float lanes: NaN wins wherever it is (a row's tail too), infinities are values."""
    x = rand((300, 203), dtype, -2, 2)
    x[:, 100] = np.inf
    x[200, :] = -np.inf
    x[5, 7] = x[17, 202] = np.nan
    compare_engines(lambda t: getattr(ops, name)(t, axis), [x], native_ops=[name])


@pytest.mark.parametrize("shape,axis", [((1027, 300), 0), ((9, 130, 257), (0, 1)), ((8, 128, 256), 0),
                                        ((5, 3), (0, 1)), ((2, 1, 7), (0, 1)), ((6, 1, 5), (0, 1)), ((1, 9), 0)])
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_sums_over_leading_axes(name, shape, axis):
    """Bias gradients: float32 sums of leading axes (rows added in float blocks of 8, blocks in
    double), against NumPy's float64 sum as well as the reference."""
    x = rand(shape, np.float32, -2.0, 2.0)
    # a mean is the sum over `count` values divided by count: its errors are count times smaller
    count = x.size // np.sum(x, axis=axis).size
    scale = 1.0 / count if name == "mean" else 1.0
    # the reference sums in float32 (pairwise): ~1e-4 off for 1000-value sums of magnitude ~40
    got = compare_engines(lambda t: getattr(ops, name)(t, axis), [x], native_ops=[name], rtol=1e-5,
                          atol=2e-4 * scale)[0]
    want = getattr(np, name)(x.astype(np.float64), axis=axis)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-5 * scale)  # 10x closer than the float32 reference


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_integer_reductions_are_exact(name):
    x = rand((6, 7), np.int32, -3, 3)
    compare_engines(lambda t: getattr(ops, name)(t, 1), [x], native_ops=[name])


def test_reduce_empty_axis_and_rank0():
    compare_engines(lambda t: ops.sum(t, 0), [rand((0, 3))], native_ops=["sum"])
    compare_engines(lambda t: ops.sum(t), [rand(())], native_ops=["sum"])


MATMULS = [((2, 3), (3, 4)), ((5,), (5,)), ((5,), (5, 2)), ((3, 5), (5,)), ((2, 1, 3, 4), (3, 4, 2)),
           ((4,), (2, 4, 3)), ((1, 7), (7, 1)), ((0, 3), (3, 2)), ((2, 0), (0, 3))]


@pytest.mark.parametrize("shapes", MATMULS, ids=str)
def test_matmul(shapes):
    compare_engines(lambda a, b: a @ b, [rand(shapes[0]), rand(shapes[1])], native_ops=["matmul"],
                    rtol=1e-5, atol=1e-5)


# Big enough for the float32 GEMM kernel to split the work over threads: bands of rows, bands of
# columns, whole matrices of a broadcast batch; operands transposed or sliced views; a big product
# with a thin side (oneDNN's). A view with a negative stride is beyond both sgemm and oneDNN: it runs
# on the fallback, still correct.
SPLIT_MATMULS = [
    (((256, 100), (100, 64)), lambda a, b: a @ b),
    (((40, 200), (200, 300)), lambda a, b: a @ b),
    (((100, 256), (64, 100)), lambda a, b: ops.matmul(ops.transpose_(a), ops.transpose_(b))),
    (((3, 1, 64, 50), (4, 50, 70)), lambda a, b: a @ b),
    (((1, 300, 60), (70, 80)), lambda a, b: a @ ops.slice_(b, 5, 65, axis=0)),
    (((300, 61), (60, 90)), lambda a, b: ops.slice_(a, 1, 61, axis=1) @ b),
    (((512, 8), (8, 600)), lambda a, b: a @ b),
    (((300, 60), (60, 90)), lambda a, b: ops.slice_(a, None, None, -1, axis=1) @ b),
]


@pytest.mark.usefixtures("each_blas")
@pytest.mark.parametrize("case", range(len(SPLIT_MATMULS)))
def test_large_float32_matmuls(case):
    shapes, build = SPLIT_MATMULS[case]
    native = ["matmul"] if case < len(SPLIT_MATMULS) - 1 else []
    compare_engines(build, [rand(shapes[0]), rand(shapes[1])], native_ops=native, rtol=1e-5, atol=1e-4)


@pytest.mark.usefixtures("each_blas")
@pytest.mark.parametrize("case", range(len(SPLIT_MATMULS)))
def test_large_float16_matmuls(case):
    """float16 operands are staged as packed float32 (so even the negative-stride view runs
    natively) and multiplied by sgemm; both engines sum in float32 and round once, so only the
    order of the float32 sums differs: within an ulp of float16, or 1e-4 where the sum cancels."""
    shapes, build = SPLIT_MATMULS[case]
    compare_engines(build, [rand(shapes[0], np.float16), rand(shapes[1], np.float16)], native_ops=["matmul"],
                    rtol=2.0**-10, atol=1e-4)


def test_matmul_of_transposed_views_and_float16():
    build = lambda a, b: ops.matmul(ops.transpose_(a), ops.transpose_(b))  # noqa: E731
    compare_engines(build, [rand((6, 4)), rand((5, 6))], native_ops=["matmul"], rtol=1e-5, atol=1e-5)
    compare_engines(lambda a, b: a @ b, [rand((8, 16), np.float16), rand((16, 4), np.float16)],
                    rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax(axis, dtype):
    compare_engines(lambda t: ops.softmax(t, axis), [rand((3, 4, 5), dtype)], **TOL[dtype])


@pytest.mark.parametrize("shape,axis", [((700, 300), 0), ((6, 50, 270), 1), ((2, 9, 5, 131), 1)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")  # the reference's inf - inf
def test_softmax_along_other_axes(shape, axis, dtype):
    """Columns a row at a time, eight a vector, in pieces on both threads (the last piece partial):
    a NaN column, a column with +inf, one with a -inf and one of huge values."""
    x = rand(shape, dtype, -3, 3)
    idx = [slice(None)] * len(shape)
    for col, value in [(1, np.nan), (9, np.inf), (20, -np.inf), (33, 6e4 if dtype == np.float16 else 1e30)]:
        where = list(idx)
        where[axis] = 2
        where[-1] = col
        x[tuple(where)] = value
    compare_engines(lambda t: ops.softmax(t, axis), [x], native_ops=["softmax"], **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int8, np.bool_])
def test_where_of_dense_tensors(dtype):
    """The branch-free select: every element from the right side, bits and all (NaN, -0.0)."""
    c, a, b = rand((300, 257), np.bool_), rand((300, 257), dtype, -5, 5), rand((300, 257), dtype, -5, 5)
    if np.dtype(dtype).kind == "f":
        a.flat[::7], b.flat[3::11] = np.nan, -0.0
    compare_engines(lambda c, a, b: ops.where(c, a, b), [c, a, b], native_ops=["where"])
    root_of = np.abs(a) if np.dtype(dtype).kind == "f" else np.abs(a.astype(np.float32))  # sqrt: vsqrtps
    compare_engines(lambda t: ops.sqrt(t), [root_of], native_ops=["sqrt"])


def test_where_reads_any_nonzero_condition_byte_as_true():
    """A bool array whose bytes are not all 0 / 1 (a view of other bytes): NumPy takes any nonzero
    byte as True, and so does the native select, dense and broadcast, never mixing the operands' bits."""
    c = np.array([0, 1, 2, 255, 128, 3, 0, 64] * 40, np.uint8).view(np.bool_).reshape(20, 16)
    a, b = rand((20, 16), np.float32, -5, 5), rand((20, 16), np.float32, -5, 5)
    (got,) = compare_engines(lambda c, a, b: ops.where(c, a, b), [c, a, b], native_ops=["where"])
    np.testing.assert_array_equal(got, np.where(c.view(np.uint8) != 0, a, b))
    compare_engines(lambda c, a, b: ops.where(c, a, b), [c[:, :1].copy(), a, b], native_ops=["where"])


def test_where_cast_clip_scaled_add():
    c, a, b = rand((3, 1), np.bool_), rand((1, 4)), rand((3, 4))
    compare_engines(lambda c, a, b: ops.where(c, a, b), [c, a, b], native_ops=["where"])
    for src, dst in [(np.float32, "int32"), (np.int32, "float16"), (np.float32, "bool"), (np.bool_, "float32"),
                     (np.float16, "float32"), (np.int32, "uint8")]:
        x = rand((5, 3), src, -5, 5)
        compare_engines(lambda t: ops.cast(t, getattr(__import__("popxl"), dst)), [x], native_ops=["cast"])
    compare_engines(lambda t: ops.clip(t, -1.0, 0.5), [rand((4, 4))], native_ops=["clip"])
    compare_engines(lambda x, y, s: ops.scaled_add(x, y, s, 0.25), [rand((3, 4)), rand((3, 4)), rand(())],
                    native_ops=["scaled_add"], rtol=1e-6, atol=1e-6)
    compare_engines(lambda x, y: ops.scaled_add_(x, y, 2.0, -1.0) + 0.0, [rand((3, 4)), rand((3, 4))],
                    native_ops=["scaled_add_"], rtol=1e-6, atol=1e-6)
