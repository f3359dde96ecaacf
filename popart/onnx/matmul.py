"""ONNX entries of the products: MatMul, Gemm and Einsum (contracted pairwise through popxl's
matmul)."""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Sequence, Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popart.onnx.table import Node, Value, _i32, _prod, _strides, onnx_op

__all__: List[str] = []


# matmul / gemm ----------------------------------------------------------------------------------------
@onnx_op("MatMul")
def _matmul(n: Node) -> List[Value]:
    return [ops.matmul(n.x(0), n.x(1))]


@onnx_op("Gemm")
def _gemm(n: Node) -> List[Value]:
    a, b = n.x(0), n.x(1)
    if n.attr("transA", 0):
        a = ops.transpose(a)
    if n.attr("transB", 0):
        b = ops.transpose(b)
    y = ops.matmul(a, b)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    if alpha != 1.0:
        y = ops.mul(y, n.scalar(alpha, y))
    if n.has(2) and beta != 0.0:
        c = n.x(2)
        if beta != 1.0:
            c = ops.mul(c, n.scalar(beta, c))
        y = ops.add(y, c)
    return [y]


# einsum -----------------------------------------------------------------------------------------------
# An einsum term is held as a list of labels: one letter per axis, and "...k" for the k-th of the
# axes the ellipsis stands for (numbered from the left of the widest ellipsis, so that narrower
# ellipses line up on the right, as broadcasting does).
Labels = List[str]


def _einsum_term(term: str, n: Node) -> Tuple[Labels, bool]:
    """The letters of one term, with "..." kept as one item; and whether it has an ellipsis."""
    out: Labels = []
    i = 0
    while i < len(term):
        if term.startswith("...", i):
            if "..." in out:
                raise n.fail(f"equation term {term!r} has more than one '...'")
            out.append("...")
            i += 3
        elif term[i].isascii() and term[i].isalpha():
            out.append(term[i])
            i += 1
        else:
            raise n.fail(f"equation term {term!r}: expected letters and at most one '...', got {term[i]!r}")
    return out, "..." in out


def _einsum_parse(equation: str, shapes: Sequence[Tuple[int, ...]], n: Node) -> Tuple[List[Labels], Labels]:
    """The labels of each operand's axes and of the output's, ellipses expanded."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise n.fail(f"equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = [_einsum_term(t, n) for t in lhs.split(",")]
    if len(terms) != len(shapes):
        raise n.fail(f"equation {equation!r} has {len(terms)} operand term(s) but the node has {len(shapes)} "
                     f"input(s)")
    widths = []
    for k, ((term, has_ellipsis), shape) in enumerate(zip(terms, shapes)):
        letters = len(term) - has_ellipsis
        if (len(shape) < letters) if has_ellipsis else (len(shape) != letters):
            raise n.fail(f"equation term {k} ({''.join(term)!r}) does not fit input {k} of shape {shape}")
        widths.append(len(shape) - letters)
    wide = max(widths, default=0)

    def expand(term: Labels, width: int) -> Labels:
        out: Labels = []
        for label in term:
            out.extend([f"...{j}" for j in range(wide - width, wide)] if label == "..." else [label])
        return out

    inputs = [expand(t, w) for (t, _), w in zip(terms, widths)]
    if not arrow:
        # Implicit output: the broadcast axes, then the letters used exactly once, in ASCII order.
        counts = Counter(label for t, _ in terms for label in t if label != "...")
        return inputs, expand(["..."], wide) + sorted(label for label, c in counts.items() if c == 1)
    out_term, out_has_ellipsis = _einsum_term(rhs, n)
    if wide and not out_has_ellipsis:
        raise n.fail(f"equation {equation!r}: the inputs' '...' stand for {wide} axes, so the output needs '...' too")
    output = expand(out_term, wide)
    if len(set(output)) != len(output):
        raise n.fail(f"equation {equation!r}: the output repeats an index")
    used = {label for t in inputs for label in t}
    missing = [label for label in output if label not in used]
    if missing:
        raise n.fail(f"equation {equation!r}: output indices {missing} appear in no input")
    return inputs, output


def _label_sizes(inputs: Sequence[Labels], shapes: Sequence[Tuple[int, ...]], n: Node) -> Dict[str, int]:
    """Each label's length; a length of 1 broadcasts against any other."""
    sizes: Dict[str, int] = {}
    for labels, shape in zip(inputs, shapes):
        for label, d in zip(labels, shape):
            have = sizes.get(label, 1)
            if d != have and 1 not in (d, have):
                raise n.fail(f"index {label!r} has lengths {have} and {d} in different places")
            sizes[label] = d if have == 1 else have
    return sizes


def _permute(x: popxl.Tensor, labels: Labels, order: Labels) -> popxl.Tensor:
    perm = tuple(labels.index(label) for label in order)
    return x if perm == tuple(range(len(perm))) else ops.transpose(x, perm)


def _einsum_diagonal(x: popxl.Tensor, labels: Labels, n: Node) -> Tuple[popxl.Tensor, Labels]:
    """Collapse the axes that share a label into one (the diagonal), by a gather from the
    flattened tensor: element [i, j, ...] of the result is at sum(stride[axis] * index[label[axis]])."""
    unique = list(dict.fromkeys(labels))
    if len(unique) == len(labels):
        return x, labels
    dims: Dict[str, int] = {}
    for label, d in zip(labels, x.shape):
        if dims.setdefault(label, d) != d:
            raise n.fail(f"repeated index {label!r} spans axes of different lengths {dims[label]} and {d}")
    strides = _strides(x.shape)
    grid = np.indices([dims[label] for label in unique], dtype=np.int64)
    flat = sum(int(strides[a]) * grid[unique.index(label)] for a, label in enumerate(labels))
    y = ops.gather(ops.reshape(x, (x.nelms,)), _i32(flat), 0)
    return y, unique


def _sum_labels(x: popxl.Tensor, labels: Labels, needed: set) -> Tuple[popxl.Tensor, Labels]:
    """Sum over the axes whose label is not needed any more."""
    axes = [a for a, label in enumerate(labels) if label not in needed]
    if not axes:
        return x, labels
    return ops.sum(x, axes, keepdims=False), [label for label in labels if label in needed]


def _contract(a: popxl.Tensor, la: Labels, b: popxl.Tensor, lb: Labels, keep: set,
              sizes: Dict[str, int]) -> Tuple[popxl.Tensor, Labels]:
    """One batched matmul: labels in both operands are batch axes if still needed, else summed;
    each side's other labels are its free axes."""
    shared = [label for label in la if label in lb]
    batch = [label for label in shared if label in keep]
    summed = [label for label in shared if label not in keep]
    free_a = [label for label in la if label not in lb]
    free_b = [label for label in lb if label not in la]

    def size(ls: Labels) -> int:
        return _prod([sizes[label] for label in ls])

    a = ops.reshape(_permute(a, la, batch + free_a + summed), (size(batch), size(free_a), size(summed)))
    b = ops.reshape(_permute(b, lb, batch + summed + free_b), (size(batch), size(summed), size(free_b)))
    y = ops.matmul(a, b)
    out = batch + free_a + free_b
    return ops.reshape(y, tuple(sizes[label] for label in out)), out


@onnx_op("Einsum")
def _einsum(n: Node) -> List[Value]:
    xs = [n.x(i) for i in range(n.n_inputs)]
    if not xs:
        raise n.fail("needs at least one input")
    equation = n.attr("equation")
    if equation is None:
        raise n.fail("the equation attribute is required")
    shapes = [tuple(x.shape) for x in xs]
    inputs, output = _einsum_parse(equation, shapes, n)
    sizes = _label_sizes(inputs, shapes, n)
    operands: List[Tuple[popxl.Tensor, Labels]] = []
    for x, labels in zip(xs, inputs):
        x, labels = _einsum_diagonal(x, labels, n)
        # A length-1 axis broadcast against a longer one elsewhere: drop it, leaving the label to
        # the operands that have it in full (its value is repeated along it, which is the same).
        drop = [label for label, d in zip(labels, x.shape) if d == 1 and sizes[label] != 1]
        if drop:
            labels = [label for label in labels if label not in drop]
            x = ops.reshape(x, tuple(sizes[label] for label in labels))
        operands.append((x, labels))
    # Indices that only one operand has and the output lacks are summed in that operand first.
    for k, (x, labels) in enumerate(operands):
        others = {label for j, (_, ls) in enumerate(operands) if j != k for label in ls}
        operands[k] = _sum_labels(x, labels, others | set(output))
    y, ly = operands[0]
    for k in range(1, len(operands)):
        b, lb = operands[k]
        later = {label for _, ls in operands[k + 1:] for label in ls}
        y, ly = _contract(y, ly, b, lb, later | set(output), sizes)
    y, ly = _sum_labels(y, ly, set(output))
    return [_permute(y, ly, output)]
