"""Property-based tests: random programs of 5-50 ops (5-25 at the large size), with subgraph
calls (one graph from two sites; a graph writing its caller's tensor by reference), loops,
conditionals on the device, in-place ops, views and in-place ops through views; their
gradients; the same programs in float16; and on two replicas with an all-reduce.

Each program is one list of steps, run three ways: traced into popxl and run on the native and
the reference engine (which must agree closely), and evaluated directly in float64 NumPy (the
oracle for both). The engines share the compiler (memory plan, aliasing, lowering), so only the
NumPy oracle catches a compiler bug; the engine comparison is the tighter check of the kernels.
Programs come in two sizes: tiny, and large enough that elementwise loops and GEMMs are split
over the threads, with odd edges (vector and tile tails).

The gradients of small programs (transforms.autodiff of the whole program, calls and loops and
in-place ops included) are checked against float64 central differences of the NumPy evaluation."""
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import popxl
import popxl.ops as ops
from engine_harness import run_program
from grad_harness import GradProgram

SMALL, LARGE = (3, 4), (163, 229)  # LARGE: > 32768 elements (threaded loops), 163 x 229 x 229 GEMMs in bands
EXAMPLES = int(os.environ.get("POPXL_FUZZ_EXAMPLES", 100))  # raise it to hunt for bugs


def _np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


_np_erf = np.vectorize(math.erf, otypes=[np.float64])

# name -> (popxl, NumPy float64). The first nine are the ones bodies of calls and repeats use.
UNARY = {
    "abs": (ops.abs, np.abs),
    "cos": (ops.cos, np.cos),
    "sin": (ops.sin, np.sin),
    "tanh": (ops.tanh, np.tanh),
    "relu": (ops.relu, lambda x: np.maximum(x, 0.0)),
    "gelu": (ops.gelu, lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    "geluerf": (ops.geluerf, lambda x: 0.5 * x * (1 + _np_erf(x / math.sqrt(2.0)).astype(x.dtype))),
    # x sigmoid(x) with sigmoid as (1 + tanh(x / 2)) / 2: exp(-x) would overflow for x < -709
    "swish": (ops.swish, lambda x: x * 0.5 * (1 + np.tanh(x / 2))),
    "negate": (ops.negate, np.negative),
    "exp_of_tanh": (lambda x: ops.exp(ops.tanh(x)), lambda x: np.exp(np.tanh(x))),
    "sqrt_of_abs": (lambda x: ops.sqrt(ops.abs(x)), lambda x: np.sqrt(np.abs(x))),
    "softmax": (lambda x: ops.softmax(x, axis=-1), _np_softmax),
    "sum_rows": (lambda x: ops.sum(x, axis=1, keepdims=True), lambda x: x.sum(axis=1, keepdims=True)),
    "max_cols": (lambda x: ops.max(x, axis=0, keepdims=True), lambda x: x.max(axis=0, keepdims=True)),
    "mean_all_keep": (lambda x: ops.mean(x, axis=[0, 1], keepdims=True), lambda x: x.mean(keepdims=True)),
}
BODY_UNARY = list(UNARY)[:9]

# offset: programs make a == b exactly (abs(x) against 0.5 x - 1.5 x for x < 0), where the engines'
# last-bit differences would flip the comparison; a tie with the offset is not built in
_OFFSET = 0.1234567
BINARY = {
    "add": (ops.add, np.add),
    "sub": (ops.sub, np.subtract),
    "mul": (ops.mul, np.multiply),
    "maximum": (ops.maximum, np.maximum),
    "div_safe": (lambda a, b: a / (ops.abs(b) + 1.0), lambda a, b: a / (np.abs(b) + 1.0)),
    "where_greater": (lambda a, b: ops.where(a > b + _OFFSET, a, b * 0.5),
                      lambda a, b: np.where(a > b + _OFFSET, a, b * 0.5)),
}
# Large programs leave out the comparison: among tens of thousands of values some lie within
# rounding of the threshold, where float32 and float64 (or two float32 engines) go different ways.
# float16 programs leave out branches on the device too: their rounding reaches the threshold.
CONTINUOUS_BINARY = [b for b in BINARY if b != "where_greater"]
INPLACE = ["add_", "relu_", "scaled_add_"]
VIEWS = ["transpose_reshape", "concat_slice", "through_transpose"]
INPLACE_VIEWS = ["transpose_", "slice_", "reshape_"]


def _steps(binary, unary=tuple(UNARY), in_place: bool = True, body_len: int = 4, branches: bool = True):
    """One step of a program, drawing from these ops; ``in_place``: with the in-place steps;
    ``branches``: with conditionals."""
    n = st.integers(0, 10 ** 6)
    body_unary = [u for u in BODY_UNARY if u in unary]
    return st.one_of(
        st.tuples(st.just("unary"), st.sampled_from(list(unary)), n),
        st.tuples(st.just("binary"), st.sampled_from(binary), n, n),
        *([st.tuples(st.just("inplace"), st.sampled_from(INPLACE), n, n),
           st.tuples(st.just("inplace_view"), st.sampled_from(INPLACE_VIEWS), n, n)] if in_place else []),
        st.tuples(st.just("matmul"), n),
        st.tuples(st.just("view"), st.sampled_from(VIEWS), n, n),
        st.tuples(st.just("call"), st.lists(st.tuples(st.sampled_from(body_unary), st.sampled_from(binary)),
                                            min_size=1, max_size=body_len), n),
        st.tuples(st.just("repeat"), st.lists(st.sampled_from(body_unary), min_size=1, max_size=3),
                  st.integers(0, 3), n),
        st.tuples(st.just("call_twice"), st.lists(st.tuples(st.sampled_from(body_unary), st.sampled_from(binary)),
                                                  min_size=1, max_size=body_len), n, n),
        *([st.tuples(st.just("cond"), st.sampled_from(body_unary), st.sampled_from(body_unary), n, n)]
          if branches else []),
        *([st.tuples(st.just("call_by_ref"), st.sampled_from(body_unary), n, n)] if in_place else []),
    )


programs = st.one_of(
    st.tuples(st.just(SMALL), st.lists(_steps(list(BINARY)), min_size=5, max_size=50)),
    st.tuples(st.just(LARGE), st.lists(_steps(CONTINUOUS_BINARY), min_size=5, max_size=25)),
)
float16_programs = st.tuples(st.sampled_from([SMALL, LARGE]),
                             st.lists(_steps(CONTINUOUS_BINARY, branches=False), min_size=5, max_size=25))


# ops whose result depends on the order of a sum (see `evaluate`'s ``reorder``)
_SUMS = ("softmax", "sum_rows", "mean_all_keep")


def evaluate(steps, inputs, weights, numpy: bool, reorder: bool = False):
    """Run ``steps`` on ``inputs``: traced as popxl ops in the current graph, or (``numpy``) in
    NumPy, in the inputs' dtype. ``reorder``: sum along rows and over matmul's K in reverse order
    (as another engine may), so that float32 results show how much summation order moves them.
    Returns the values the steps made."""
    k = 1 if numpy else 0
    vals = list(inputs)
    R, C = inputs[0].shape

    def unary(name, x):
        if reorder and name in _SUMS:  # the same values, summed last column first
            return UNARY[name][k](x[:, ::-1])[:, ::-1]
        return UNARY[name][k](x)

    def binary(name, a, b):
        return BINARY[name][k](a, b)

    def body(chain, x, c):
        for un, bi in chain:
            x = binary(bi, unary(un, x), c)
        return x

    def copy(x):
        return x.copy() if numpy else ops.identity(x)

    for s in steps:
        kind = s[0]
        full = [v for v in vals if v.shape == (R, C)]
        if kind == "unary":
            vals.append(unary(s[1], vals[s[2] % len(vals)]))
        elif kind == "binary":
            vals.append(binary(s[1], vals[s[2] % len(vals)], vals[s[3] % len(vals)]))
        elif kind == "inplace":  # in place on a copy: later reads of the copy see the change
            target, other = copy(full[s[2] % len(full)]), vals[s[3] % len(vals)]
            if numpy:
                if s[1] == "add_":
                    target += other
                elif s[1] == "relu_":
                    np.maximum(target, 0.0, out=target)
                else:
                    target[...] = 0.5 * target - 1.5 * other
            elif s[1] == "add_":
                ops.add_(target, other)
            elif s[1] == "relu_":
                ops.relu_(target)
            else:
                ops.scaled_add_(target, ops.identity(target) * 0.0 + other, a=0.5, b=-1.5)
            vals.append(target)
        elif kind == "matmul":
            x = full[s[1] % len(full)]
            if reorder:
                vals.append(x[:, ::-1] @ weights[::-1])
            else:
                vals.append(x @ (weights if numpy else popxl.constant(weights)))
        elif kind == "view":  # copying views and their compositions, back to (R, C)
            x, y = full[s[2] % len(full)], vals[s[3] % len(vals)]
            if s[1] == "transpose_reshape":
                vals.append(x.T.reshape(R, C) if numpy else ops.reshape(ops.transpose(x), (R, C)))
            elif s[1] == "concat_slice":
                y = full[s[3] % len(full)]
                vals.append(np.concatenate([x, y], 1)[:, C // 2:C // 2 + C] if numpy else
                            ops.slice(ops.concat([x, y], axis=1), start=C // 2, stop=C // 2 + C, axis=1))
            else:
                vals.append((x.T * 1.5 + y.T).T if numpy else
                            ops.transpose(ops.transpose(x) * 1.5 + ops.transpose(y)))
        elif kind == "inplace_view":  # in-place ops through an aliasing view change its base
            base, other = copy(full[s[2] % len(full)]), full[s[3] % len(full)]
            lo, hi = R // 3, R // 3 + max(1, R // 2)
            if s[1] == "transpose_":
                if numpy:
                    view = base.T
                    view += other.T
                else:
                    ops.add_(ops.transpose_(base), ops.transpose(other))
            elif s[1] == "slice_":
                if numpy:
                    view = base[lo:hi]
                    view += other[lo:hi]
                    np.maximum(view, 0.0, out=view)
                else:
                    view = ops.slice_(base, start=lo, stop=hi, axis=0)
                    ops.add_(view, ops.slice(other, start=lo, stop=hi, axis=0))
                    ops.relu_(view)
            elif numpy:
                view = base.reshape(C, R)
                view[...] = 0.5 * view - 1.5 * other.reshape(C, R)
            else:
                ops.scaled_add_(ops.reshape_(base, (C, R)), ops.reshape(other, (C, R)), a=0.5, b=-1.5)
            vals.append(base)
        elif kind == "call":
            x, c = vals[s[2] % len(vals)], vals[(s[2] // 7) % len(vals)]
            if numpy:
                vals.append(body(s[1], x, c))
            else:
                g = popxl.gcg().ir.create_graph(lambda a, b: body(s[1], a, b), x, c)
                vals.append(ops.call(g, x, c)[0])
        elif kind == "call_twice":  # one graph, two call sites with different arguments
            x, y, c = full[s[2] % len(full)], full[s[3] % len(full)], vals[s[2] % len(vals)]
            if numpy:
                vals += [body(s[1], x, c), body(s[1], y, c)]
            else:
                g = popxl.gcg().ir.create_graph(lambda a, b: body(s[1], a, b), x, c)
                vals += [ops.call(g, x, c)[0], ops.call(g, y, c)[0]]
        elif kind == "cond":  # a branch chosen on the device
            x, c = full[s[3] % len(full)], vals[s[4] % len(vals)]
            # the offset keeps exact zeros (x - x) away from the threshold
            if numpy:
                vals.append(unary(s[1] if x.sum() > _OFFSET else s[2], x) * 2.0 + c)
            else:
                ir = popxl.gcg().ir
                then_g, else_g = (ir.create_graph(lambda a, b, u=u: unary(u, a) * 2.0 + b, x, c) for u in s[1:3])
                flag = ops.sum(x) > _OFFSET
                vals.append(ops.conditional(flag, then_g, else_g, [x, c], [x, c])[0])
        elif kind == "call_by_ref":  # the called graph writes the caller's tensor in place
            target, c = copy(full[s[2] % len(full)]), vals[s[3] % len(vals)]
            if numpy:
                target += unary(s[1], c)
                vals += [target, target * 2.0]
            else:
                def write(a: popxl.TensorByRef, b: popxl.Tensor, u=s[1]) -> popxl.Tensor:
                    ops.add_(a, unary(u, b))
                    return a * 2.0
                g = popxl.gcg().ir.create_graph(write, target, c)
                vals += [target, ops.call(g, target, c)[0]]
        else:  # repeat: the body's output is the next iteration's input
            chain = [(u, "add") for u in s[1]]
            x = full[s[3] % len(full)]
            if numpy:
                for _ in range(s[2]):
                    x = np.tanh(body(chain, x, x))
                vals.append(x)
            else:
                g = popxl.gcg().ir.create_graph(lambda a: ops.tanh(body(chain, a, a)), x)
                vals.append(ops.repeat(g, s[2], x)[0])
    return vals[len(inputs):] or [vals[0]]


def build_program(shape, steps, seed: int, dtype=np.float32):
    """(build for run_program, inputs of ``dtype``, NumPy's results in float64 and in ``dtype``)."""
    rng = np.random.default_rng(seed)
    R, C = shape
    weights = (rng.standard_normal((C, C)) * (0.5 if C < 8 else 1 / math.sqrt(C))).astype(dtype)  # O(1) products
    inputs = [rng.standard_normal(s).astype(dtype) for s in [(R, C), (R, 1), (1, C)]]
    return (lambda *xs: evaluate(steps, xs, weights, numpy=False)), inputs, build_oracle(steps, inputs, weights)


def build_oracle(steps, inputs, weights):
    """NumPy's results for float32 (or float16) ``inputs`` and ``weights``: in float64, and in
    their own dtype summing in another order (see `_check`)."""
    exact = evaluate(steps, [x.astype(np.float64) for x in inputs], weights.astype(np.float64), numpy=True)
    rounded = evaluate(steps, [x.copy() for x in inputs], weights, numpy=True, reorder=True)
    return exact, rounded


def _check(got, want, oracle, steps, what: str, tol: float) -> None:
    """``got`` against ``want``, allowing each value what float32 rounding does to it: ``tol`` of
    its size and of the output's scale, plus float32 NumPy's distance from float64 NumPy (summing
    in another order, as engines do), ten times its own and twice the output's largest. That
    distance is large where the program is ill-conditioned (a difference that cancels, then
    square-rooted; softmax of large logits; tanh(4 tanh(4 x)) near 0), and one value's is a
    single draw of the rounding, hence the output's largest as a floor. Values float32 NumPy
    gets non-finite (overflow) are not compared."""
    exact, rounded = oracle
    assert len(got) == len(want) == len(exact)
    for i, (g, w, x, r) in enumerate(zip(got, want, exact, rounded)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        drift = np.abs(np.asarray(r, np.float64) - x)
        keep = np.isfinite(drift)
        scale = max(1.0, float(np.abs(w[keep]).max(initial=0.0)))
        bound = tol * (np.abs(w) + scale) + 10 * drift + 2 * float(drift[keep].max(initial=0.0))
        bad = keep & ~(np.abs(g - w) <= bound) & ~(np.isnan(g) & np.isnan(w))
        assert not bad.any(), (f"output {i} against {what}, program {steps}: at {np.argwhere(bad)[:5].tolist()} "
                               f"got {g[bad][:5]}, expected {w[bad][:5]} (float64 NumPy {x[bad][:5]}, "
                               f"float32 NumPy {np.asarray(r)[bad][:5]})")


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs, seed=st.integers(0, 2 ** 16))
# abs(x) against 0.5 x - 1.5 x: equal by construction at (1, 0), the tie where_greater's offset avoids
@example(program=(SMALL, [("call", [("cos", "mul")], 1), ("matmul", 0), ("inplace", "scaled_add_", 1, 118),
                          ("unary", "abs", 0), ("matmul", 0), ("call", [("abs", "where_greater")], 18795)]), seed=0)
# a view through which the base is changed, read again after it
@example(program=(LARGE, [("inplace_view", "transpose_", 0, 0), ("view", "concat_slice", 3, 0),
                          ("inplace_view", "slice_", 4, 3), ("matmul", 5), ("inplace_view", "reshape_", 6, 4)]), seed=1)
def test_random_programs_agree_with_numpy_on_both_engines(program, seed):
    shape, steps = program
    build, inputs, oracle = build_program(shape, steps, seed)
    want, _ = run_program(build, inputs, "reference")
    got, _ = run_program(build, inputs, "native")
    _check(got, want, oracle, steps, "the reference engine", tol=2e-5)
    _check(got, oracle[0], oracle, steps, "float64 NumPy", tol=1e-4)


# Gradient programs: the ops whose derivative is defined everywhere the programs go. Left out:
# sqrt_of_abs (infinite slope at 0); max_cols and maximum, which programs tie by construction (a
# broadcast row, a value against itself), where PopXL gives every tied input the whole gradient
# and a central difference sees one; where_greater (a jump); and in-place ops, which as in PopXL
# have no gradient of their own (the gradient stops there).
GRAD_UNARY = [u for u in UNARY if u not in ("sqrt_of_abs", "max_cols")]
GRAD_BINARY = [b for b in BINARY if b not in ("where_greater", "maximum")]


def _with_all_inputs(steps, xs, weights, numpy: bool):
    """The program's values and one more that reads every input, so every input has a gradient
    (autodiff refuses a gradient for an input no output depends on, as PopXL does)."""
    return evaluate(steps, xs, weights, numpy) + [xs[0] + xs[1] + xs[2]]


def _central_differences(steps, inputs, weights, seeds, h: float = 1e-6):
    """d/d(inputs) of sum(seed * output) over the outputs, in float64, one input value at a time."""
    def loss(xs):
        return sum(float(np.sum(y * d)) for y, d in zip(_with_all_inputs(steps, xs, weights, True), seeds))

    grads = []
    for i, x in enumerate(inputs):
        g = np.zeros(x.shape)
        for j in np.ndindex(x.shape):
            xs = [v.copy() for v in inputs]
            xs[i][j] += h
            up = loss(xs)
            xs[i][j] -= 2 * h
            g[j] = (up - loss(xs)) / (2 * h)
        grads.append(g)
    return grads


@settings(max_examples=max(10, EXAMPLES // 4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_steps(GRAD_BINARY, GRAD_UNARY, in_place=False, body_len=3), min_size=3, max_size=25),
       seed=st.integers(0, 2 ** 16))
def test_random_programs_differentiate_as_numpy(steps, seed):
    rng = np.random.default_rng(seed)
    R, C = SMALL
    weights = (rng.standard_normal((C, C)) * 0.5).astype(np.float32)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(R, C), (R, 1), (1, C)]]
    prog = GradProgram(lambda *xs: _with_all_inputs(steps, xs, weights, False), inputs, wrt=[0, 1, 2])
    try:
        seeds = [rng.standard_normal(s.shape).astype(np.float32) for s in prog.seed_streams]
        _, grads = prog.run(inputs, seeds)
    finally:
        prog.close()
    want = _central_differences(steps, [x.astype(np.float64) for x in inputs], weights.astype(np.float64),
                                [d.astype(np.float64) for d in seeds])
    for i, (g, w) in enumerate(zip(grads, want)):
        scale = max(1.0, float(np.abs(w).max()))
        bad = ~(np.abs(g - w) <= 1e-3 * (np.abs(w) + scale))
        assert not bad.any(), (f"gradient of input {i}, program {steps}: at {np.argwhere(bad)[:5].tolist()} "
                               f"autodiff {g[bad][:5]}, central differences {w[bad][:5]}")


@settings(max_examples=max(10, EXAMPLES // 4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_steps(list(BINARY)), min_size=5, max_size=30), seed=st.integers(0, 2 ** 16))
def test_random_programs_run_per_replica(steps, seed):
    """Two replicas, each with inputs of its own: each computes its own program (conditionals may
    take different branches on each), and an all-reduce at the end sums a value over both."""
    replicas = 2
    rng = np.random.default_rng(seed)
    R, C = SMALL
    weights = (rng.standard_normal((C, C)) * 0.5).astype(np.float32)
    inputs = [rng.standard_normal((replicas, *s)).astype(np.float32) for s in [(R, C), (R, 1), (1, C)]]

    def build(*xs):
        outs = evaluate(steps, xs, weights, numpy=False)
        return outs + [ops.collectives.replicated_all_reduce(outs[-1])]

    per_replica = [build_oracle(steps, [x[r] for x in inputs], weights) for r in range(replicas)]
    total = tuple([sum(o[k][-1] for o in per_replica)] for k in range(2))  # (exact, rounded) of the sum
    for engine in ("native", "reference"):
        got, _ = run_program(build, inputs, engine, replication=replicas)
        for r, (exact, rounded) in enumerate(per_replica):
            mine = [g[r] for g in got]
            _check(mine[:-1], exact, (exact, rounded), steps, f"float64 NumPy ({engine}, replica {r})", tol=1e-4)
            _check(mine[-1:], total[0], total, steps, f"the all-reduced sum ({engine}, replica {r})", tol=1e-4)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # float16 reaches inf soon
@settings(max_examples=max(10, EXAMPLES // 4), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=float16_programs, seed=st.integers(0, 2 ** 16))
def test_random_float16_programs_agree_with_numpy_on_both_engines(program, seed):
    """float16 programs: every op computes in float32 and rounds to float16 once (the native
    engine converts eight values at a time), so the engines agree to float16's precision."""
    shape, steps = program
    build, inputs, oracle = build_program(shape, steps, seed, np.float16)
    want, _ = run_program(build, inputs, "reference")
    got, _ = run_program(build, inputs, "native")
    _check(got, want, oracle, steps, "the reference engine", tol=2e-3)
    _check(got, oracle[0], oracle, steps, "float64 NumPy", tol=1e-2)
