"""Helpers for tests of popxl programs."""
from typing import List

from popxl import dtypes

__all__ = ["get_all_dtypes", "get_all_int_dtypes"]


def get_all_dtypes() -> List[dtypes.dtype]:
    """Every popxl dtype except bool.

    Returns:
        A list of dtypes.
    """
    return [d for d in dtypes._BY_NAME.values() if d is not dtypes.bool]


def get_all_int_dtypes(include_signed: bool = True, include_unsigned: bool = True) -> List[dtypes.dtype]:
    """The integer dtypes, optionally only the signed or the unsigned ones.

    Args:
        include_signed: Include int8 ... int64.
        include_unsigned: Include uint8 ... uint64.

    Returns:
        A list of dtypes.
    """
    return [d for d in dtypes._BY_NAME.values()
            if d.is_int and ((d.is_signed and include_signed) or (not d.is_signed and include_unsigned))]
