"""popxl-addons' layer ops: rotary position embeddings, the layer norm of a tensor whose hidden axis
is sharded over replicas, the scaled sum of squares of a gradient (for gradient norms), the
layout change ``linear_layout`` and the product of a dense matrix with a constant sparse one.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.addons.collectives import groups_of
from popxl.ops.collectives.collectives import _group_size
from popxl.ops.elementwise import cast, div, mul, sqrt
from popxl.ops.matmul import matmul
from popxl.ops.reduce import sum as reduce_sum, sumsquare
from popxl.ops.shape import concat
from popxl.ops.utils import spec
from popxl.tensor import Tensor, constant

__all__ = ["rotary_pos_embed", "layer_norm_distributed", "grad_reduce_square_add", "linear_layout",
           "dense_sparse_matmul", "CSRMatrix"]

_FAMILY = "addons"


def _float(s, what: str, name: str) -> None:
    if s.dtype not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"{what}: {name} must be float16 or float32, not {s.dtype.name}")


# rotary position embeddings --------------------------------------------------------------------------
_PAIRINGS = ("interleaved", "halves")


def _rotary_infer(specs, rotary_dim, pairing):
    x, sin, cos = specs
    what = "rotary_pos_embed"
    if pairing not in _PAIRINGS:
        raise ValueError(f"{what}: pairing must be one of {_PAIRINGS}, not {pairing!r}")
    if len(x.shape) != 4:
        raise ValueError(f"{what}: the input must have rank 4, (batch, seq, heads, head size), not shape {x.shape}")
    _float(x, what, "the input")
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2 \
            or rotary_dim > x.shape[3]:
        raise ValueError(f"{what}: rotary_dim must be an even number from 2 to the head size {x.shape[3]}, "
                         f"not {rotary_dim!r}")
    want = (x.shape[0], x.shape[1], rotary_dim // 2)
    for name, t in (("sin", sin), ("cos", cos)):
        if t.dtype != x.dtype:
            raise TypeError(f"{what}: {name} must be {x.dtype.name} like the input, not {t.dtype.name}")
        if len(t.shape) != 3 or any(d not in (1, w) for d, w in zip(t.shape, want)):
            raise ValueError(f"{what}: {name} must have shape (1 or batch, seq, rotary_dim / 2) = "
                             f"(1 or {want[0]}, {want[1]}, {want[2]}), not {t.shape}")
    return [spec(x.shape, x.dtype)]


def _rotate(x, sin, cos, rotary_dim, pairing, direction: int):
    """Each pair of the first ``rotary_dim`` values of the last axis, as the complex number re + j im,
    times exp(j * direction * angle); angles from sin/cos (batch, seq, pair), the same for every
    head. Pair i is (x[2i], x[2i+1]) "interleaved" (popxl-addons, GPT-J) or (x[i], x[i + rotary_dim/2])
    "halves" (GPT-NeoX, Llama). Computed in float32, rounded once."""
    w = np.float32 if x.dtype == np.float16 else x.dtype
    out = x.astype(w, copy=True)
    half = rotary_dim // 2
    if pairing == "interleaved":
        pairs = out[..., :rotary_dim].reshape(*x.shape[:3], half, 2)
        re, im = pairs[..., 0], pairs[..., 1]
    else:
        re, im = out[..., :half], out[..., half:rotary_dim]
    re0, im0 = re.copy(), im.copy()
    s = direction * sin.astype(w)[:, :, None, :]
    c = cos.astype(w)[:, :, None, :]
    re[...] = re0 * c - im0 * s  # views of ``out``
    im[...] = im0 * c + re0 * s
    return out.astype(x.dtype)


register(OpDef("rotary_pos_embed", _rotary_infer,
               lambda x, sin, cos, rotary_dim, pairing: _rotate(x, sin, cos, rotary_dim, pairing, 1), family=_FAMILY,
               attributes={"rotary_dim": "int", "pairing": "str"}))
register(OpDef("rotary_pos_embed_grad", _rotary_infer,
               lambda dy, sin, cos, rotary_dim, pairing: _rotate(dy, sin, cos, rotary_dim, pairing, -1),
               grad=Grad.RAISE, family=_FAMILY,
               attributes={"rotary_dim": "int", "pairing": "str"}))


@grad_rule("rotary_pos_embed")
def _rotary_grad(ctx):
    """The rotation is orthogonal: the gradient rotates back by the same angles."""
    dx = create_op("rotary_pos_embed_grad", [ctx.grad(0), ctx.input(1), ctx.input(2)], dict(ctx.attrs))[0]
    return [dx, None, None]


def rotary_pos_embed(t: Tensor, sin: Tensor, cos: Tensor, rotary_dim: Optional[int] = None,
                     pairing: str = "interleaved") -> Tensor:
    """popxl-addons' ``RotaryPosEmbed``: rotary position embeddings.

    The first ``rotary_dim`` values of each head are rotated pairwise, pair i by the angle whose
    sine and cosine the position gives for i; the rest pass unchanged. The gradient rotates back.

    Args:
        t: (batch, seq, heads, head size), float16 or float32.
        sin: (1 or batch, seq, rotary_dim / 2), ``t``'s dtype.
        cos: (1 or batch, seq, rotary_dim / 2), ``t``'s dtype.
        rotary_dim: An even number of values rotated per head; default the head size.
        pairing: "interleaved": pair i is (x[2i], x[2i+1]), as popxl-addons' op (GPT-J's form);
            "halves": pair i is (x[i], x[i + rotary_dim / 2]), as the op that Graphcore's Llama
            and Dolly applications ship (GPT-NeoX's and Llama's form).

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If the dtypes are not float16 / float32 or differ.
        ValueError: If the shapes do not match, ``rotary_dim`` is odd or too large, or ``pairing``
            is unknown.
    """
    rotary_dim = rotary_dim or (t.shape[-1] if t.shape else 0)
    return create_op("rotary_pos_embed", [t, sin, cos], {"rotary_dim": rotary_dim, "pairing": pairing})[0]


# layer norm over a hidden axis sharded across replicas ------------------------------------------------
def _ln_infer(specs, epsilon, groups):
    x, w, b = specs
    what = "layer_norm_distributed"
    if len(x.shape) != 2:
        raise ValueError(f"{what}: the input must have rank 2, (samples, hidden shard), not shape {x.shape}")
    _float(x, what, "the input")
    for name, t in (("the scale", w), ("the bias", b)):
        if tuple(t.shape) != (x.shape[1],) or t.dtype != x.dtype:
            raise ValueError(f"{what}: {name} must be ({x.shape[1]},) {x.dtype.name}, not {t.shape} {t.dtype.name}")
    n = (x.shape[0],)
    return [spec(x.shape, x.dtype), spec(n, x.dtype), spec(n, x.dtype)]


def _wide(t: Tensor) -> Tensor:
    return cast(t, dtypes.float32) if t.dtype == dtypes.float16 else t


def _narrow(t: Tensor, like: Tensor) -> Tensor:
    return cast(t, like.dtype) if t.dtype != like.dtype else t


def _group_sums(parts: Sequence[Tensor], groups: Tuple[int, ...]) -> Tuple[Tensor, ...]:
    """Per-sample sums over the whole (sharded) hidden axis of each (samples, shard) tensor: the
    local row sums, all-reduced over the group in one collective."""
    local = concat([reduce_sum(p, axis=1).reshape((1, p.shape[0])) for p in parts], axis=0)
    total = create_op("replicated_all_reduce", [local], {"op": "add", "groups": groups})[0]
    return tuple(total[i] for i in range(len(parts)))


def _ln_expand(op):
    x, w, b = op.inputs
    groups = op.attrs["groups"]
    xf = _wide(x)
    hidden = x.shape[1] * _group_size(groups)
    inv_hidden = constant(np.float32(1.0 / hidden), xf.dtype)
    s1, s2 = _group_sums([xf, xf * xf], groups)
    mean = s1 * inv_hidden
    var = s2 * inv_hidden - mean * mean
    inv_std = div(constant(np.float32(1), xf.dtype),
                      sqrt(var + constant(np.float32(op.attrs["epsilon"]), xf.dtype)))
    rows = (x.shape[0], 1)
    y = (xf - mean.reshape(rows)) * inv_std.reshape(rows) * _wide(w) + _wide(b)
    return [_narrow(y, x), _narrow(mean, x), _narrow(inv_std, x)]


register(OpDef("layer_norm_distributed", _ln_infer, expand=_ln_expand, family=_FAMILY,
               attributes={"epsilon": "float", "groups": "ints"}))


@grad_rule("layer_norm_distributed")
def _ln_grad(ctx):
    """The layer norm gradient with its two sums over the hidden axis taken over the whole group:
    dx = inv_std * (g - mean(g) - x_hat * mean(g * x_hat)), g = dy * scale; the scale's and bias's
    gradients are this shard's sums over the samples. (popxl-addons' C++ gradient leaves the scale
    out of g, which is right only while the scale is 1.)"""
    x, w = ctx.input(0), ctx.input(1)
    dy = _wide(ctx.grad_or_zeros(0))
    xf = _wide(x)
    rows = (x.shape[0], 1)
    mean, inv_std = _wide(ctx.output(1)).reshape(rows), _wide(ctx.output(2)).reshape(rows)
    x_hat = (xf - mean) * inv_std
    g = dy * _wide(w)
    hidden = x.shape[1] * _group_size(ctx.attrs["groups"])
    inv_hidden = constant(np.float32(1.0 / hidden), xf.dtype)
    sum_g, sum_gx = _group_sums([g, g * x_hat], ctx.attrs["groups"])
    dx = inv_std * (g - (sum_g * inv_hidden).reshape(rows) - x_hat * (sum_gx * inv_hidden).reshape(rows))
    dw = reduce_sum(dy * x_hat, axis=0)
    db = reduce_sum(dy, axis=0)
    return [_narrow(dx, x), _narrow(dw, w), _narrow(db, w)]


def layer_norm_distributed(t: Tensor, w: Tensor, b: Tensor, epsilon: float = 1e-5,
                           group=None) -> Tuple[Tensor, Tensor, Tensor]:
    """popxl-addons' ``LayerNormDistributed``: layer norm over a hidden axis split over replicas.

    The mean and variance are summed over the replicas of ``group``; the gradient is the true
    layer-norm gradient (scale included; see docs/guide/compatibility.md, deliberate differences).

    Args:
        t: (samples, hidden shard), float16 or float32.
        w: (hidden shard,) this shard's scale.
        b: (hidden shard,) this shard's bias.
        epsilon: Added to the variance.
        group: A ``popxl.ReplicaGrouping`` of the replicas sharing the hidden axis; default all.

    Returns:
        (normalised ``t``, per-sample mean (samples,), per-sample 1 / std (samples,)).

    Raises:
        TypeError: If ``t`` is not float16 / float32, or ``group`` is not a ReplicaGrouping.
        ValueError: If the shapes, or the dtypes of ``w`` and ``b`` against ``t``, do not match.
    """
    y, mean, inv_std = create_op("layer_norm_distributed", [t, w, b],
                                 {"epsilon": float(epsilon), "groups": groups_of(group, "layer_norm_distributed")})
    return y, mean, inv_std


# scaled sum of squares ------------------------------------------------------------------------------
def _square_add_infer(specs):
    t, scale = specs
    what = "grad_reduce_square_add"
    _float(t, what, "the input")
    _float(scale, what, "the scale")
    if math.prod(scale.shape) != 1:
        raise ValueError(f"{what}: the scale must hold one value, not shape {scale.shape}")
    return [spec((), dtypes.float32)]


def _square_add_expand(op):
    t, scale = op.inputs
    scale = _wide(scale)
    return mul(sumsquare(_wide(t)), scale.reshape(()) if scale.shape else scale)


register(OpDef("grad_reduce_square_add", _square_add_infer, expand=_square_add_expand, grad=Grad.STOP,
               family=_FAMILY,
               attributes={}))


def grad_reduce_square_add(t: Tensor, scale: Tensor) -> Tensor:
    """popxl-addons' ``GradReduceSquareAdd``: ``scale * sum(t ** 2)``, summed in float32.

    Args:
        t: The tensor, float16 or float32 (a loss-scaled gradient).
        scale: A scalar float tensor (``1 / loss_scaling ** 2`` for the gradient's norm).

    Returns:
        A new float32 scalar.

    Raises:
        TypeError: If ``t`` or ``scale`` is not a float tensor.
        ValueError: If ``scale`` is not a scalar.
    """
    return create_op("grad_reduce_square_add", [t, scale])[0]


# layout ------------------------------------------------------------------------------------------------
def _linear_layout_infer(specs, bs):
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        raise ValueError(f"linear_layout: the grain size bs must be an int > 0, not {bs!r}")
    return [spec(specs[0].shape, specs[0].dtype)]


register(OpDef("linear_layout", _linear_layout_infer, expand=lambda op: create_op("identity", [op.inputs[0]]),
               grad=Grad.STOP, family=_FAMILY,
               attributes={"bs": "int"}))


def linear_layout(t: Tensor, bs: int = 1) -> Tensor:
    """popxl-addons' ``LinearLayout``: a copy of ``t``.

    On an IPU it lays the copy out linearly over the tiles in grains of ``bs`` values; a CPU has
    no tiles.

    Args:
        t: The tensor copied.
        bs: The grain size, an int > 0.

    Returns:
        A new tensor equal to ``t``.

    Raises:
        ValueError: If ``bs`` is not an int > 0.
    """
    return create_op("linear_layout", [t], {"bs": bs})[0]


# dense x constant sparse -----------------------------------------------------------------------------
class CSRMatrix:
    """A constant sparse matrix in compressed sparse row form, as an op attribute.

    Equal and hashed by content; its repr is short. ``shape`` is (rows, columns).

    Args:
        nz: The nonzero values (stored as float32).
        cols: Their column indices.
        rows: Where each row starts in ``nz``: row r is ``nz[rows[r]:rows[r + 1]]``.
        n_cols: The number of columns.

    Raises:
        ValueError: If the arrays are not a CSR matrix of ``n_cols`` columns.
    """

    def __init__(self, nz: Any, cols: Any, rows: Any, n_cols: int) -> None:
        self.nz = np.array(nz, np.float32).reshape(-1)
        self.cols = np.array(cols, np.int64).reshape(-1)
        self.rows = np.array(rows, np.int64).reshape(-1)
        for a in (self.nz, self.cols, self.rows):
            a.flags.writeable = False
        if isinstance(n_cols, bool) or not isinstance(n_cols, (int, np.integer)) or n_cols <= 0:
            raise ValueError(f"the sparse matrix's number of columns must be an int > 0, not {n_cols!r}")
        if len(self.rows) < 2 or self.rows[0] != 0 or np.any(np.diff(self.rows) < 0) \
                or self.rows[-1] != len(self.nz) or len(self.cols) != len(self.nz):
            raise ValueError(f"not a CSR matrix: {len(self.nz)} values, {len(self.cols)} column indices and row "
                             f"starts {self._short(self.rows)} (they must start at 0, never decrease and end at "
                             f"the number of values)")
        if len(self.cols) and (self.cols.min() < 0 or self.cols.max() >= n_cols):
            raise ValueError(f"a column index of the sparse matrix is outside 0..{n_cols - 1}")
        self.shape = (len(self.rows) - 1, int(n_cols))

    @staticmethod
    def _short(a: np.ndarray) -> str:
        return str(a.tolist()) if len(a) <= 6 else f"[{a[0]}, {a[1]}, ..., {a[-1]}] ({len(a)})"

    def dense(self, dtype: Any) -> np.ndarray:
        """The matrix as a dense NumPy array.

        Args:
            dtype: The array's dtype.

        Returns:
            A new (rows, columns) array.
        """
        out = np.zeros(self.shape, np.float32)
        row_of = np.repeat(np.arange(self.shape[0]), np.diff(self.rows))
        out[row_of, self.cols] = self.nz
        return out.astype(dtype)

    def _key(self) -> tuple:
        return (self.shape, self.nz.tobytes(), self.cols.tobytes(), self.rows.tobytes())

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, CSRMatrix) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"CSRMatrix(shape={self.shape}, nnz={len(self.nz)})"


def _sparse_infer(specs, rhs):
    lhs = specs[0]
    what = "dense_sparse_matmul"
    _float(lhs, what, "the dense operand")
    if len(lhs.shape) not in (2, 3) or (len(lhs.shape) == 3 and lhs.shape[0] != 1):
        raise ValueError(f"{what}: the dense operand must be (m, k) or (1, m, k), not shape {lhs.shape}")
    if lhs.shape[-1] != rhs.shape[0]:
        raise ValueError(f"{what}: the dense operand has {lhs.shape[-1]} columns but the sparse matrix "
                         f"{rhs.shape[0]} rows")
    return [spec((*lhs.shape[:-1], rhs.shape[1]), lhs.dtype)]


def _sparse_expand(op):
    lhs = op.inputs[0]
    rhs = constant(op.attrs["rhs"].dense(lhs.dtype.as_numpy()), lhs.dtype, name="sparse_rhs")
    return matmul(lhs, rhs)


register(OpDef("dense_sparse_matmul", _sparse_infer, expand=_sparse_expand, grad=Grad.STOP, family=_FAMILY))


def dense_sparse_matmul(lhs: Tensor, nz: Any, cols: Any, rows: Any, output_cols: int) -> Tensor:
    """popxl-addons' ``SparseMatmul``: ``lhs`` times a constant sparse matrix given in CSR form.

    Args:
        lhs: (m, k) or (1, m, k), float16 or float32.
        nz: The sparse matrix's nonzero values.
        cols: Their column indices.
        rows: Where each of the k rows starts in ``nz`` (k + 1 values, from 0 to ``len(nz)``).
        output_cols: The sparse matrix's number of columns.

    Returns:
        A new tensor of ``lhs``'s leading shape and ``output_cols`` columns, computed in
        ``lhs``'s dtype.

    Raises:
        TypeError: If ``lhs`` is not float16 / float32.
        ValueError: If the arrays are not a CSR matrix, or its rows do not match ``lhs``.
    """
    try:
        rhs = CSRMatrix(nz, cols, rows, output_cols)
    except ValueError as e:
        raise ValueError(f"dense_sparse_matmul: {e}") from None
    return create_op("dense_sparse_matmul", [lhs], {"rhs": rhs})[0]
