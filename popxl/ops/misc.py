"""Miscellaneous ops: init (a fresh zero tensor), increment_mod(_) (a wrapping counter update) and
print_tensor (prints a tensor when the program runs)."""
from __future__ import annotations

import builtins
import sys
from typing import Iterable, Optional

import numpy as np

from popxl import dtypes
from popxl.op import Grad, OpDef, create_op, grad_rule, register
from popxl.ops.utils import spec
from popxl.tensor import Tensor, shape_tuple

__all__ = ["increment_mod", "increment_mod_", "init", "print_tensor"]


# init -----------------------------------------------------------------------------------------------
_INIT_TYPES = ("zero", "undef")


def _init_infer(specs, shape, dtype, init_type, meta_shape):
    if init_type not in _INIT_TYPES:
        raise ValueError(f"init_type must be one of {list(_INIT_TYPES)}, got {init_type!r}")
    if not isinstance(dtype, dtypes.dtype):
        raise TypeError(f"dtype must be a popxl dtype, not {dtype!r}")
    if any(d < 0 for d in shape):
        raise ValueError(f"shape {list(shape)} has a negative dimension")
    return [spec(shape, dtype, meta_shape)]


def _init_kernel(shape, dtype, init_type, meta_shape):
    # "undef" promises nothing about the contents; zeros are as good as anything and deterministic.
    return np.zeros(shape, dtypes.ml_dtype(dtype))


register(OpDef("init", _init_infer, _init_kernel, grad=Grad.STOP, family="misc",
               attributes={"shape": "ints", "dtype": "dtype", "init_type": "str", "meta_shape": "ints"}))


def init(shape: Iterable[int], dtype: dtypes.dtype, name: Optional[str] = None, init_type: str = "zero",
         meta_shape: Optional[Iterable[int]] = None) -> Tensor:
    """A new tensor of zeros (or of unspecified contents) made in the current graph.

    Args:
        shape: The tensor's shape.
        dtype: The tensor's dtype.
        name: The tensor's name; default "init".
        init_type: "zero" for zeros, or "undef" for unspecified contents (zeros here too).
        meta_shape: The unsharded shape when the tensor is a replica shard.

    Returns:
        A new tensor.

    Raises:
        ValueError: If ``init_type`` is neither "zero" nor "undef", or ``shape`` is not a shape.
        TypeError: If ``dtype`` is not a popxl dtype.
    """
    attrs = {"shape": shape_tuple(shape, "ops.init: shape"), "dtype": dtype, "init_type": init_type,
             "meta_shape": shape_tuple(meta_shape, "ops.init: meta_shape") if meta_shape is not None else ()}
    return create_op("init", [], attrs, output_names=[name] if name else None)[0]


# increment_mod --------------------------------------------------------------------------------------
def _increment_mod_infer(specs, increment, modulus):
    s = specs[0]
    if not (s.dtype.is_floating_point or s.dtype.is_int):
        raise TypeError(f"needs a numeric tensor, got {s.dtype.name}")
    if modulus == 0:
        raise ValueError("modulus must not be 0")
    return [spec(s.shape, s.dtype, s.meta_shape)]


def _increment_mod_kernel(x, increment, modulus):
    # Remainder as C computes it (sign of the dividend), like the device's elementwise Rem.
    if x.dtype.kind in "iu":
        wide = x.astype(np.int64) + int(increment)
        return np.fmod(wide, int(modulus)).astype(x.dtype)
    wide = x.astype(np.promote_types(x.dtype, np.float32))
    return np.fmod(wide + wide.dtype.type(increment), wide.dtype.type(modulus)).astype(x.dtype)


register(OpDef("increment_mod", _increment_mod_infer, _increment_mod_kernel, grad=Grad.STOP, family="misc",
               attributes={"increment": "number", "modulus": "number"}))
register(OpDef("increment_mod_", _increment_mod_infer, _increment_mod_kernel, inplace=0, grad=Grad.STOP,
               family="misc",
               attributes={"increment": "number", "modulus": "number"}))


def _increment_mod(opname: str, t: Tensor, increment: float, modulus: float) -> Tensor:
    if t.dtype.is_int:
        bad = [v for v in (increment, modulus) if float(v) != int(v)]
        if bad:
            raise ValueError(f"ops.{opname}: increment and modulus must be whole numbers for the integer "
                             f"tensor {t.id!r} ({t.dtype.name}), got {bad}")
        increment, modulus = int(increment), int(modulus)
    else:
        increment, modulus = float(increment), float(modulus)
    return create_op(opname, [t], {"increment": increment, "modulus": modulus})[0]


def increment_mod(t: Tensor, increment: float, modulus: float) -> Tensor:
    """``(t + increment) % modulus`` elementwise (C remainder: the sign follows the dividend). Not differentiable.

    Args:
        t: A numeric tensor.
        increment: The value added.
        modulus: The divisor of the remainder.

    Returns:
        A new tensor of ``t``'s shape and dtype.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``modulus`` is 0, or ``t`` is not in the current graph.
    """
    return _increment_mod("increment_mod", t, increment, modulus)


def increment_mod_(t: Tensor, increment: float, modulus: float) -> Tensor:
    """`increment_mod` in place: ``t`` is overwritten with ``(t + increment) % modulus``.

    Args:
        t: A numeric tensor, overwritten.
        increment: The value added.
        modulus: The divisor of the remainder.

    Returns:
        An alias of ``t``.

    Raises:
        TypeError: If ``t`` is not a Tensor or not numeric.
        ValueError: If ``modulus`` is 0, or ``t`` is not in the current graph.
    """
    return _increment_mod("increment_mod_", t, increment, modulus)


# print_tensor ---------------------------------------------------------------------------------------
_FLOAT_FORMATS = {
    "auto": lambda digits: (lambda v: f"{v:.{digits}g}"),
    "fixed": lambda digits: (lambda v: f"{v:.{digits}f}"),
    "scientific": lambda digits: (lambda v: f"{v:.{digits}e}"),
    "none": lambda digits: (lambda v: repr(float(v))),
}
# Stand-ins used while NumPy lays the text out (each one character wide, like the user's choices).
_SEP, _OPEN, _CLOSE = "\x1d", "\x1e", "\x1f"


def format_tensor(x: np.ndarray, summarise_threshold: int = 1000, edge_items: int = 3, max_line_width: int = 75,
                  digits: int = 8, float_format: str = "auto", separator: str = " ", open_bracket: str = "[",
                  close_bracket: str = "]") -> str:
    """The text print_tensor shows for the values ``x``."""
    if x.dtype.kind == "f" or x.dtype.kind == "V":
        x = x.astype(np.float64)
    kind = x.dtype.kind
    # one literal per kind, so that each is checked against NumPy's formatter keys
    text = np.array2string(x, max_line_width=max_line_width, threshold=summarise_threshold, edgeitems=edge_items,
                           separator=_SEP, prefix="",
                           formatter={"float_kind": _FLOAT_FORMATS[float_format](digits)} if kind == "f" else
                           {"bool": lambda v: "true" if v else "false"} if kind == "b" else {"int_kind": str})
    text = text.replace("[", _OPEN).replace("]", _CLOSE)
    text = text.replace(_OPEN, open_bracket).replace(_CLOSE, close_bracket).replace(_SEP, separator)
    return "\n".join(line.rstrip() for line in text.split("\n"))


_FORMAT_KEYS = ("summarise_threshold", "edge_items", "max_line_width", "digits", "float_format", "separator",
                "open_bracket", "close_bracket")


def _print_infer(specs, title, print_self, print_gradient, **fmt):
    for key in ("separator", "open_bracket", "close_bracket"):
        if not isinstance(fmt[key], str) or len(fmt[key]) != 1:
            raise ValueError(f"{key} must be a single character, got {fmt[key]!r}")
    for key in ("summarise_threshold", "edge_items", "max_line_width", "digits"):
        if isinstance(fmt[key], builtins.bool) or not isinstance(fmt[key], int) or fmt[key] < 0:
            raise ValueError(f"{key} must be a non-negative int, got {fmt[key]!r}")
    s = specs[0]
    return [spec(s.shape, s.dtype, s.meta_shape)]


def _print_kernel(x, title, print_self, print_gradient, **fmt):
    if print_self:
        sys.stdout.flush()  # what Python printed before comes first
        sys.stderr.write(f"{title}: {format_tensor(x, **fmt)}\n")  # stderr, as PopXL prints
        sys.stderr.flush()
    return x.copy()


register(OpDef("print_tensor", _print_infer, _print_kernel, side_effect=True, family="misc",
               attributes={"title": "str", "print_self": "bool", "print_gradient": "bool", "summarise_threshold": "int", "edge_items": "int", "max_line_width": "int", "digits": "int", "float_format": "str", "separator": "str", "open_bracket": "str", "close_bracket": "str"}))


def print_tensor(t: Tensor, title: Optional[str] = None, print_self: bool = True, print_gradient: bool = False,
                 summarise_threshold: int = 1000, edge_items: int = 3, max_line_width: int = 75, digits: int = 8,
                 float_format: str = "auto", separator: str = " ", open_bracket: str = "[",
                 close_bracket: str = "]") -> Tensor:
    """Print a tensor each time the program runs, as ``<title>: <values>``, and pass it on.

    Tensors with more than ``summarise_threshold`` elements show ``edge_items`` values at each end of
    every axis.

    Args:
        t: The tensor printed.
        title: The label; default ``print_<tensor name>``.
        print_self: Print the value in the forward pass.
        print_gradient: Also print the gradient when the graph is differentiated.
        summarise_threshold: The element count above which the output is summarised.
        edge_items: How many values to show at each end of a summarised axis.
        max_line_width: The width lines wrap at.
        digits: Significant digits ("auto"), or digits after the point ("fixed", "scientific").
        float_format: "auto", "fixed", "scientific" or "none" (shortest exact form).
        separator: The one-character separator between values.
        open_bracket: The one-character opening bracket.
        close_bracket: The one-character closing bracket.

    Returns:
        A new tensor equal to ``t``.

    Raises:
        TypeError: If ``t`` is not a Tensor.
        ValueError: If ``separator`` or a bracket is not one character, or ``t`` is not in the current
            graph.
        KeyError: If ``float_format`` is unknown.
    """
    if float_format not in _FLOAT_FORMATS:
        raise KeyError(f"ops.print_tensor: float_format must be one of {list(_FLOAT_FORMATS)}, got {float_format!r}")
    values = locals()
    fmt = {key: values[key] for key in _FORMAT_KEYS}
    if title is None:
        title = f"print_{t.name}" if isinstance(t, Tensor) else ""
    title = str(title)
    return create_op("print_tensor", [t], {"title": title, "print_self": builtins.bool(print_self),
                                           "print_gradient": builtins.bool(print_gradient), **fmt})[0]


@grad_rule("print_tensor")
def _print_tensor_grad(ctx):
    """Identity; with ``print_gradient`` the gradient is printed too, titled as PopART does:
    ``<title>_gradient``, or ``Gradient___<input id>`` for an empty title."""
    g, a = ctx.grad(0), ctx.attrs
    if not a["print_gradient"]:
        return [g]
    fmt = {key: a[key] for key in _FORMAT_KEYS}
    title = a["title"] + "_gradient" if a["title"] else "Gradient___" + ctx.op.inputs[0].id
    return [create_op("print_tensor", [g], {**a, **fmt, "title": title, "print_gradient": False})[0]]
