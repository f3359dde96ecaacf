"""PopXL's module path for the convolution ops (``from popxl.ops.conv import conv, PadType``).

The ops live in ``popxl.ops.nn``; ``popxl.ops.conv`` stays the function, as in PopXL: the package
imports this module before it binds its op names.
"""
from popxl.ops.nn import PadType, conv, conv_transpose  # noqa: F401

__all__ = ["conv", "conv_transpose", "PadType"]
