"""popxl-cpu: the PopXL programming model on ordinary CPUs.

Trace ops into an ``Ir`` inside ``with ir.main_graph:``, move data with host streams, and run
the program in a ``popxl.Session``.
"""
__version__ = "0.1.0"

# This package's __init__ is the one module above every layer (docs/architecture.md, .importlinter):
# it imports them all, so that after ``import popxl`` every hook of the core is set (popxl._hooks).

from popxl import dtypes, tensor
from popxl.context import (gcg, get_current_graph, get_ir, get_main_graph, gir, gmg, in_sequence, io_tiles, ipu,
                           name_scope)
from popxl.dtypes import (bool, complex64, complex128, double, dtype, float, float8_143, float8_152, float16,
                          float32, float64, half, int8, int16, int32, int64, uint8, uint16, uint32, uint64)
from popxl.graph import Graph
from popxl.ir import Ir
from popxl.module import Module
from popxl.random_seed import create_seeds
from popxl.remote_buffer import (RemoteBuffer, remote_buffer, remote_replica_sharded_variable, remote_variable,
                                 replica_sharded_buffer, replica_sharded_variable)
from popxl.replica_grouping import ReplicaGrouping
from popxl.streams import DeviceToHostStream, HostToDeviceStream, d2h_stream, h2d_stream
from popxl.tensor import Constant, Tensor, TensorByRef, TensorSpec, Variable, constant, graph_input, graph_output, variable
from popxl.tensorlocation import (ExecutionContext, ReplicatedTensorSharding, TensorLocation, TensorStorage,
                                  TileSet)
from popxl import ops, transforms  # noqa: E402  (ops register themselves on import)
from popxl import errors, fp8_utils, random_seed, testing, utils  # noqa: E402
from popxl.session import Session
from popxl import visualize  # noqa: E402  (listings, pictures, .dot files)
from popxl.onnx_export import export_onnx  # noqa: E402
from popxl import _pb, custom_op_modules as _custom_op_modules  # noqa: E402


def _load_compatibility_layer() -> None:
    """Import ``popart._internal.ir``, PopART's IR as a view of popxl's (the top layer, which registers
    its views with popxl's core, ``popxl._pb``, and its C++ custom ops' binding modules with
    ``popxl.custom_op_modules``): the first time a program reaches it, through a view
    (``graph._pb_graph`` ...) or a binding module. On first use only: importing popart adds a third
    to ``import popxl``'s time, and most programs never need it."""
    import popart._internal.ir  # noqa: F401, PLC0415  (on first use: see the docstring)


_pb.set_loader(_load_compatibility_layer)
# C++ custom ops' binding modules (popxl-addons') resolve to popxl-cpu's, ahead of cppimport
_custom_op_modules.install()

__all__ = [
    "get_current_graph", "get_main_graph", "get_ir", "gcg", "gmg", "gir", "in_sequence", "name_scope", "ipu",
    "io_tiles", "dtype", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "half",
    "float8_143", "float8_152", "float16", "float", "float32", "double", "float64", "complex64", "complex128",
    "Graph", "Ir", "Module", "create_seeds", "RemoteBuffer", "remote_buffer", "ReplicaGrouping",
    "HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream", "Tensor", "variable",
    "remote_variable", "remote_replica_sharded_variable", "replica_sharded_variable", "constant", "graph_input",
    "graph_output", "TensorByRef",
    "TensorSpec", "TensorStorage", "TensorLocation", "ReplicatedTensorSharding", "TileSet", "ExecutionContext",
    "Session", "Constant", "Variable", "replica_sharded_buffer", "export_onnx",
    # submodules a program reaches as popxl.<name> (named here so type checkers see them exported)
    "dtypes", "ops", "transforms", "tensor", "errors", "fp8_utils", "random_seed", "testing", "utils", "visualize",
]
