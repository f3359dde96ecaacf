"""How a gradient graph connects to its forward graph, in PopART's terms: plain records of tensor
ids (popxl's `GradGraphInfo._from_pb` turns them into popxl objects). They live in popxl's core
(``popxl._pb``), which converts from and to them."""
from popxl._pb import BwdGraphInfo, ExpectedConnection, ExpectedConnectionType

__all__ = ["ExpectedConnectionType", "ExpectedConnection", "BwdGraphInfo"]
