"""IR-to-IR transforms: autodiff and the exchange/sum rewrites."""
from popxl.transforms.autodiff import ExpectedConnection, ExpectedConnectionType, GradGraphInfo, autodiff

__all__ = ["autodiff", "GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType"]
