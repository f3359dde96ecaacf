"""Einsum, NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, built with onnx.helper, imported and
run in an InferenceSession, against ONNX's reference evaluator; and the import errors they raise."""
from __future__ import annotations

import numpy as np
import pytest

from popart.errors import OnnxImportError
from popart_helpers import check_against_reference, make_model, run_nodes, run_session
from test_onnx_ops import Case, N, f32, pos

rng = np.random.default_rng(99)


def labels(c: int, *shape: int) -> np.ndarray:
    return rng.integers(0, c, shape).astype(np.int64)


def with_ignored(t: np.ndarray, ii: int) -> np.ndarray:
    """``t`` with every third element set to ignore_index ``ii``."""
    t = t.copy()
    t.reshape(-1)[::3] = ii
    return t


def einsum(eq: str, *xs: np.ndarray, opset: int = 17, tol: float = 1e-5, id: str = "") -> Case:
    names = [f"x{k}" for k in range(len(xs))]
    return Case(f"Einsum-{id or eq}", [N("Einsum", names, ["y"], equation=eq)], dict(zip(names, xs)), ["y"],
                opset=opset, tol=tol)


def loss(op: str, id: str, x: np.ndarray, t: np.ndarray, w: np.ndarray = None, log_prob: bool = False,
         opset: int = 13, **attrs) -> Case:
    ins = {"x": x, "t": t} if w is None else {"x": x, "t": t, "w": w}
    outs = ["y", "lp"] if log_prob else ["y"]
    return Case(f"{op}-{id}", [N(op, list(ins), outs, **attrs)], ins, outs, opset=opset, tol=1e-5)


NLL = "NegativeLogLikelihoodLoss"
SCE = "SoftmaxCrossEntropyLoss"
CASES = [
    # einsum -----------------------------------------------------------------------------------------
    einsum("ij,jk->ik", f32(3, 4), f32(4, 5), id="matmul"),
    einsum("bij,bjk->bik", f32(2, 3, 4), f32(2, 4, 5), id="batched-matmul"),
    einsum("bij, bkj -> bki", f32(2, 3, 4), f32(2, 5, 4), id="batched-matmul-transposed-spaces"),
    einsum("ij->ji", f32(3, 4), id="transpose"),
    einsum("abc->cab", f32(2, 3, 4), id="permute-3d"),
    einsum("ii->", f32(4, 4), id="trace"),
    einsum("ii->i", f32(4, 4), id="diagonal"),
    einsum("...ii->...i", f32(2, 3, 5, 5), id="batch-diagonal"),
    einsum("iij,jk->ik", f32(3, 3, 4), f32(4, 2), id="diagonal-then-matmul"),
    einsum("ij->i", f32(3, 4), id="sum-rows"),
    einsum("ij->", f32(3, 4), id="sum-all"),
    einsum("ij,jk->k", f32(3, 4), f32(4, 5), id="summed-before-contraction"),
    einsum("i,i", f32(5), f32(5), id="implicit-inner-product"),
    einsum("ij,jk", f32(3, 4), f32(4, 2), id="implicit-matmul"),
    einsum("ba", f32(3, 4), id="implicit-transpose"),
    einsum("ii", f32(3, 3), id="implicit-trace"),
    einsum("i,j->ij", f32(3), f32(4), id="outer"),
    einsum("...ij,...jk->...ik", f32(2, 1, 3, 4), f32(5, 4, 2), id="ellipsis-broadcast"),
    einsum("...j,j", f32(2, 3, 4), f32(4), id="implicit-ellipsis"),
    einsum("i...->...", f32(3, 2, 2), id="ellipsis-sum-leading"),
    einsum("ij,ij->ij", f32(1, 3), f32(2, 3), id="broadcast-length-1"),
    einsum("ij,jk,kl->il", f32(2, 3), f32(3, 4), f32(4, 5), id="three-operand-chain"),
    einsum("bn,anm,bm->ba", f32(2, 3), f32(4, 3, 5), f32(2, 5), id="three-operand-bilinear"),
    einsum("i,j,k->ijk", f32(2), f32(3), f32(4), id="three-operand-outer"),
    einsum("->", np.float32(2.5), id="scalar"),
    einsum("ij,jk->ik", np.arange(12, dtype=np.int32).reshape(3, 4), np.arange(8, dtype=np.int32).reshape(4, 2),
           id="int32"),
    einsum("bij,bjk->bik", f32(2, 3, 4), f32(2, 4, 5), opset=12, id="opset12"),
    # negative log likelihood --------------------------------------------------------------------------
    *[loss(NLL, f"NC-{r}", f32(4, 5), labels(5, 4), reduction=r) for r in ("none", "sum", "mean")],
    *[loss(NLL, f"NC-weight-{r}", f32(4, 5), labels(5, 4), pos(5), reduction=r) for r in ("none", "sum", "mean")],
    loss(NLL, "default-reduction", f32(4, 5), labels(5, 4)),
    loss(NLL, "NCd1d2-weight-mean", f32(3, 5, 2, 4), labels(5, 3, 2, 4), pos(5), reduction="mean"),
    loss(NLL, "NCd1-none", f32(3, 5, 6), labels(5, 3, 6), reduction="none"),
    *[loss(NLL, f"ii-{r}", f32(6, 4), with_ignored(labels(4, 6), 2), reduction=r, ignore_index=2)
      for r in ("none", "sum", "mean")],
    *[loss(NLL, f"ii-weight-{r}", f32(3, 4, 5), with_ignored(labels(4, 3, 5), 1), pos(4), reduction=r,
           ignore_index=1) for r in ("none", "sum", "mean")],
    loss(NLL, "ii-negative-weight-mean", f32(3, 4, 5), with_ignored(labels(4, 3, 5), -1), pos(4), reduction="mean",
         ignore_index=-1),
    loss(NLL, "ii-out-of-range-mean", f32(6, 4), with_ignored(labels(4, 6), 10), reduction="mean", ignore_index=10),
    loss(NLL, "ii-unused", f32(6, 4), labels(4, 6), reduction="mean", ignore_index=3),
    loss(NLL, "int32-target", f32(4, 5), labels(5, 4).astype(np.int32), reduction="sum"),
    loss(NLL, "opset12", f32(4, 5), labels(5, 4), pos(5), opset=12),
    # softmax cross entropy ----------------------------------------------------------------------------
    *[loss(SCE, f"NC-{r}", f32(4, 5), labels(5, 4), reduction=r) for r in ("none", "sum", "mean")],
    *[loss(SCE, f"NC-weight-{r}-log_prob", f32(4, 5), labels(5, 4), pos(5), True, reduction=r)
      for r in ("none", "sum", "mean")],
    loss(SCE, "NCd1-mean-log_prob", f32(3, 5, 2), labels(5, 3, 2), log_prob=True),
    loss(SCE, "NCd1d2-weight-ii-mean", f32(3, 5, 2, 4), with_ignored(labels(5, 3, 2, 4), 0), pos(5), True,
         ignore_index=0),
    loss(SCE, "NCd1d2d3-none-negative-ii", f32(2, 3, 2, 2, 3), with_ignored(labels(3, 2, 2, 2, 3), -5),
         log_prob=True, reduction="none", ignore_index=-5),
    loss(SCE, "ii-sum", f32(6, 4), with_ignored(labels(4, 6), 3), reduction="sum", ignore_index=3),
    loss(SCE, "large-scores", f32(4, 5) * 8, labels(5, 4), log_prob=True, reduction="mean"),
    loss(SCE, "opset12", f32(4, 5), labels(5, 4), pos(5), True, opset=12),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_reference(case: Case) -> None:
    model = make_model(case.nodes, case.inputs, case.outputs, case.inits, case.opset)
    check_against_reference(model, case.inputs, case.outputs, rtol=case.tol, atol=case.tol)


def test_nll_mean_with_negative_ignore_index_divides_by_the_kept_count() -> None:
    # ONNX's reference evaluator divides by every element here (its other ignore_index cases, the
    # backend test data and the spec's "sum of the applied weights" count only the kept ones).
    x, t = f32(6, 4), with_ignored(labels(4, 6), -1)
    model = make_model([N(NLL, ["x", "t"], ["y"], reduction="mean", ignore_index=-1)], {"x": x, "t": t}, ["y"],
                       opset=13)
    kept = t != -1
    want = -x[np.arange(6), np.where(kept, t, 0)][kept].sum() / kept.sum()
    np.testing.assert_allclose(run_session(model, {"x": x, "t": t}, ["y"])[0], want, rtol=1e-5)


@pytest.mark.parametrize("eq, xs, match", [
    ("ij,jk", [f32(2, 3)], r"2 operand term\(s\) but the node has 1 input"),
    ("i1->i", [f32(2)], r"expected letters and at most one '...', got '1'"),
    ("...i...->i", [f32(2, 3)], r"more than one '...'"),
    ("ij->i->j", [f32(2, 3)], r"more than one '->'"),
    ("ijk->i", [f32(2, 3)], r"does not fit input 0 of shape \(2, 3\)"),
    ("ij->ik", [f32(2, 3)], r"output indices \['k'\] appear in no input"),
    ("ij->ii", [f32(2, 3)], r"the output repeats an index"),
    ("...i->i", [f32(2, 3)], r"the output needs '...' too"),
    ("ij,jk->ik", [f32(2, 3), f32(4, 5)], r"index 'j' has lengths 3 and 4"),
    ("ii->i", [f32(1, 3)], r"repeated index 'i' spans axes of different lengths 1 and 3"),
])
def test_einsum_errors(eq, xs, match) -> None:
    names = [f"x{k}" for k in range(len(xs))]
    with pytest.raises(OnnxImportError, match=match):
        run_nodes([N("Einsum", names, ["y"], equation=eq)], dict(zip(names, xs)), opset=13)


@pytest.mark.parametrize("op", [NLL, SCE])
@pytest.mark.parametrize("ins, attrs, match", [
    ({"x": f32(4, 5), "t": labels(5, 4)}, {"reduction": "avg"}, r"reduction must be one of .* got 'avg'"),
    ({"x": f32(4), "t": labels(4, 4)}, {}, r"must be \(N, C\) or \(N, C, d1, ...\), got shape \(4,\)"),
    ({"x": f32(4, 5, 2), "t": labels(5, 4)}, {}, r"target's shape \(4,\) must be \(4, 2\)"),
    ({"x": f32(4, 5), "t": labels(5, 4), "w": pos(4)}, {}, r"weight's shape \(4,\) must be \(5,\)"),
])
def test_loss_errors(op, ins, attrs, match) -> None:
    with pytest.raises(OnnxImportError, match=match):
        run_nodes([N(op, list(ins), ["y"], **attrs)], ins, opset=13)
