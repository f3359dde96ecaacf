"""popxl dtypes: singletons with NumPy (and optional torch) equivalents.

float8_143 / float8_152 are Graphcore's 8-bit float formats. As in PopXL, their NumPy
equivalent is a one-byte structured dtype (the raw codes); for arithmetic the engines use the
matching ml_dtypes formats (``ml_dtype``): float8_e4m3fnuz (1-4-3, max 240) and
float8_e5m2fnuz (1-5-2, max 57344).
"""
from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Dict, Optional

import ml_dtypes
import numpy as np

__all__ = ["dtype", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float8_143", "float8_152", "float16", "half", "float32", "float", "float64", "double",
           "complex64", "complex128", "ml_dtype", "from_numpy", "np_dtype_float8_143", "np_dtype_float8_152"]


class dtype:
    """A popxl data type. Singletons: compare with ``is`` or ``==``.

    Not instantiable: use the module's singletons (``popxl.float32`` ...).

    Raises:
        TypeError: If constructed directly.
    """

    name: str
    is_complex: builtins.bool
    is_int: builtins.bool
    is_floating_point: builtins.bool
    is_signed: builtins.bool
    itemsize: int
    _numpy: np.dtype  # host data
    _compute: np.dtype  # what engines compute with
    _torch_name: Optional[str]

    def __init__(self) -> None:
        raise TypeError("popxl.dtypes.dtype cannot be instantiated; use the singletons, e.g. popxl.float32.")

    @classmethod
    def _new(cls, name: str, numpy_dtype: np.dtype, compute_dtype: np.dtype, kind: str, signed: builtins.bool,
             torch_name: Any) -> "dtype":
        d = object.__new__(cls)
        d.name = name
        d.is_int = kind == "int"
        d.is_floating_point = kind == "float"
        d.is_complex = kind == "complex"
        d.is_signed = signed
        d._numpy = numpy_dtype
        d._compute = compute_dtype
        d._torch_name = torch_name
        d.itemsize = compute_dtype.itemsize
        return d

    @classmethod
    def from_name(cls, name: str) -> "dtype":
        """The dtype called ``name`` (e.g. ``"float32"``).

        Args:
            name: The dtype's name.

        Returns:
            The dtype.

        Raises:
            ValueError: If no dtype has that name.
        """
        try:
            return _BY_NAME[name]
        except (KeyError, TypeError):
            raise ValueError(f"No popxl dtype named {name!r}.") from None

    @classmethod
    def as_dtype(cls, type_value: Any) -> "dtype":
        """Convert a dtype, a name, a Python type, a NumPy/torch dtype or an object with ``.dtype``.

        Args:
            type_value: The value converted.

        Returns:
            The dtype.

        Raises:
            ValueError: If the value has no popxl dtype.
        """
        if isinstance(type_value, dtype):
            return type_value
        if isinstance(type_value, str) and type_value in _BY_NAME:
            return _BY_NAME[type_value]
        if type_value is builtins.bool:
            return _BY_NAME["bool"]
        if type_value is builtins.int:
            return _BY_NAME["int64"]
        if type_value is builtins.float:
            return _BY_NAME["float32"]
        mod = type(type_value).__module__
        if mod.startswith("torch"):
            for d in _BY_NAME.values():
                if d._torch_name is not None and str(type_value) == f"torch.{d._torch_name}":
                    return d
        if hasattr(type_value, "dtype") and not isinstance(type_value, (type, np.dtype)):
            return cls.as_dtype(type_value.dtype)
        try:
            return from_numpy(np.dtype(type_value))
        except (TypeError, ValueError):
            raise ValueError(f"Cannot convert {type_value!r} to a popxl dtype.") from None

    def as_numpy(self) -> np.dtype:
        """The NumPy dtype of host data of this type."""
        return self._numpy

    def as_torch(self) -> Any:
        """The torch dtype (TypeError if torch has none; ModuleNotFoundError without torch)."""
        import torch  # noqa: PLC0415  (optional, seconds to import; ModuleNotFoundError without it)
        if self._torch_name is None:
            raise TypeError(f"popxl.dtypes.{self.name} has no torch equivalent.")
        return getattr(torch, self._torch_name)

    def __repr__(self) -> str:
        return f"popxl.dtypes.{self.name}"

    def __reduce__(self):  # pickle as the singleton
        return (dtype.from_name, (self.name,))


def _fp8(name: str) -> np.dtype:
    return np.dtype([(name, "u1")])


# PopXL's host representation of float8 data: one uint8 field (the raw code) named after the format.
np_dtype_float8_143 = _fp8("float8_143")
np_dtype_float8_152 = _fp8("float8_152")


_BY_NAME: Dict[str, dtype] = {}


def _define(name: str, numpy_dtype: np.dtype, kind: str, signed: builtins.bool, torch_name: Optional[str],
            compute_dtype: Optional[np.dtype] = None) -> dtype:
    """The dtype called ``name``, entered in the table of dtypes by name (``compute_dtype``: what
    engines compute with, when it is not ``numpy_dtype``)."""
    d = dtype._new(name, numpy_dtype, numpy_dtype if compute_dtype is None else compute_dtype, kind, signed,
                   torch_name)
    _BY_NAME[name] = d
    return d


# Each one a plain module attribute, so type checkers see a ``dtype`` (tests/unit/test_dtypes.py
# checks every attribute's name is its dtype's). Arguments: name, host NumPy dtype, kind, signed,
# torch's name.
bool = _define("bool", np.dtype(np.bool_), "bool", False, "bool")  # noqa: A001  (PopXL's name)
int8 = _define("int8", np.dtype(np.int8), "int", True, "int8")
int16 = _define("int16", np.dtype(np.int16), "int", True, "int16")
int32 = _define("int32", np.dtype(np.int32), "int", True, "int32")
int64 = _define("int64", np.dtype(np.int64), "int", True, "int64")
uint8 = _define("uint8", np.dtype(np.uint8), "int", False, "uint8")
uint16 = _define("uint16", np.dtype(np.uint16), "int", False, None)
uint32 = _define("uint32", np.dtype(np.uint32), "int", False, None)
uint64 = _define("uint64", np.dtype(np.uint64), "int", False, None)
float8_143 = _define("float8_143", np_dtype_float8_143, "float", True, None, np.dtype(ml_dtypes.float8_e4m3fnuz))
float8_152 = _define("float8_152", np_dtype_float8_152, "float", True, None, np.dtype(ml_dtypes.float8_e5m2fnuz))
float16 = _define("float16", np.dtype(np.float16), "float", True, "float16")
float32 = _define("float32", np.dtype(np.float32), "float", True, "float32")
float64 = _define("float64", np.dtype(np.float64), "float", True, "float64")
complex64 = _define("complex64", np.dtype(np.complex64), "complex", True, "complex64")
complex128 = _define("complex128", np.dtype(np.complex128), "complex", True, "complex128")
# PopXL's aliases
half = float16
float = float32  # noqa: A001
double = float64
_BY_NUMPY = {d._numpy: d for d in _BY_NAME.values()}
_BY_NUMPY.update({d._compute: d for d in _BY_NAME.values()})

# PopXL's lookup tables, which client code (popxl-addons) reads: NumPy dtype -> dtype (the host
# dtypes only, float8 as its structured dtype), and torch dtype -> dtype (``_PT_TO_POPXL``, made on
# first use by ``__getattr__`` below: importing torch takes seconds, so popxl does not do it itself).
_NP_TO_POPXL: Dict[np.dtype, dtype] = {d._numpy: d for d in _BY_NAME.values()}


def _lazy_attribute(name: str) -> Any:
    if name == "_PT_TO_POPXL":
        try:
            import torch  # noqa: PLC0415  (optional, and seconds to import)
        except ImportError:
            table: Dict[Any, dtype] = {}
        else:
            table = {getattr(torch, d._torch_name): d for d in _BY_NAME.values() if d._torch_name is not None}
        globals()[name] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not TYPE_CHECKING:  # a module __getattr__ would make every unknown name Any to type checkers
    __getattr__ = _lazy_attribute


def from_numpy(np_dtype: Any) -> dtype:
    """The popxl dtype of a NumPy dtype (the float8 structured and ml_dtypes types included).

    Args:
        np_dtype: A NumPy dtype or anything ``np.dtype`` accepts.

    Returns:
        The popxl dtype.

    Raises:
        ValueError: If it has no popxl equivalent.
    """
    try:
        return _BY_NUMPY[np.dtype(np_dtype)]
    except KeyError:
        raise ValueError(f"NumPy dtype {np.dtype(np_dtype)} has no popxl equivalent.") from None


def ml_dtype(dt: dtype) -> np.dtype:
    """The NumPy dtype engines compute with (ml_dtypes formats for float8).

    Args:
        dt: A popxl dtype.

    Returns:
        The NumPy dtype.
    """
    return dt._compute
