"""Exceptions popxl raises besides the built-in ones."""
from __future__ import annotations

__all__ = ["UndefinedValue"]


class UndefinedValue(ValueError):
    """A property whose value is not determined (PopXL raises it for a tensor's ``ipu`` or
    ``tile_set`` when placement cannot be told). Here placement is always known, so popxl itself
    does not raise it; it exists so client code that catches it keeps working."""
