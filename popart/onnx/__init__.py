"""ONNX front end: ``load_model`` and ``GraphImporter`` (driver) plus the op table ``OPS``."""
from popart.onnx.importer import GraphImporter, InputSpec, load_model
from popart.onnx.ops import OPS

__all__ = ["GraphImporter", "InputSpec", "load_model", "OPS"]


def supported_ops() -> list:
    """The ONNX op types the importer can lower, sorted."""
    return sorted(OPS)
