"""The complete ONNX op table: importing this module imports every family of entries, each of
which registers its entries into ``popart.onnx.table.OPS`` (the framework: ``Node``, ``Entry``,
``onnx_op``). This is the one place that knows the families; none of them imports it.

Families: ``elementwise``, ``matmul``, ``nn`` (softmax, losses, convolution, pooling,
normalisation), ``reduce``, ``shape``, ``indexing``, ``random``, ``control`` (If, Loop, Scan),
``recurrent`` (LSTM / GRU / RNN), ``signal`` (DFT, STFT, windows, mel weights), ``sampling``
(GridSample, RoiAlign, MaxUnpool, Col2Im) and ``graphcore`` (PopART's own domain).
"""
from popart.onnx import (control, elementwise, graphcore, indexing, matmul, nn, random, recurrent,  # noqa: F401
                         reduce, sampling, shape, signal)
from popart.onnx.random import RANDOM_OPS
from popart.onnx.table import OPS, Entry, Node

__all__ = ["OPS", "Node", "Entry", "RANDOM_OPS"]
