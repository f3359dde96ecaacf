"""popxl-addons' binding modules, as popxl-cpu provides them: each C++ binding module that
popxl-addons compiles with cppimport (``popxl_addons.ops.<dir>.<name>_binding`` or ``..._impl``)
is made, when imported, from the classes below, which create the popxl ops of
``popxl.ops.addons`` (see ``popxl.custom_op_modules`` for the import finder).

Each class takes ``createOpInGraph`` (or ``create_op_in_graph``) arguments named and ordered as the
C++ binding's, and the params classes take the C++ constructors' arguments.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Type

from popxl.ops.addons import collectives as _collectives
from popxl.ops.addons.collectives import groups_of
from popxl.ops.addons.nn import CSRMatrix

from popart._internal.ir.custom_op import CustomOp, ParameterizedOp

__all__ = ["MODULES", "Fp8ScalingBiasParams", "LinearLayoutParams", "DenseSparseMatMulParams"]

_DOMAIN = "popxl.addons.ops"


class _MemoryProportionHint:
    """PopART's ``setAvailableMemoryProportion`` of an op: a planning hint for IPU memory; recorded only."""

    _available_memory_proportion: Optional[float] = None

    def setAvailableMemoryProportion(self, value: float) -> None:
        self._available_memory_proportion = value


# collectives ---------------------------------------------------------------------------------------
class ReplicatedAllReduceTPOp(CustomOp):
    popxl_type, op_type = "replicated_all_reduce_tp", "ReplicatedAllReduceTP"
    arguments = ("op", "group", "identicalInputs", "identicalGradInputs")

    @classmethod
    def attributes(cls, graph: Any, op: Any, group: Any, identicalInputs: bool,
                   identicalGradInputs: bool) -> Dict[str, Any]:
        return _collectives.all_reduce_tp_attrs(op, group, identicalInputs, identicalGradInputs, graph.ir)


class ReplicatedAllReduceStridedOp(CustomOp):
    popxl_type, op_type = "replicated_all_reduce_strided", "ReplicatedAllReduceStrided"
    arguments = ("op", "stride", "groupSize", "identicalInputs", "identicalGradInputs")

    @classmethod
    def attributes(cls, graph: Any, op: Any, stride: int, groupSize: int, identicalInputs: bool,
                   identicalGradInputs: bool) -> Dict[str, Any]:
        return _collectives.all_reduce_strided_attrs(op, stride, groupSize, identicalInputs, identicalGradInputs,
                                                     graph.ir)


class ReplicatedAllGatherStridedOp(CustomOp):
    popxl_type, op_type = "replicated_all_gather_strided", "ReplicatedAllGatherStrided"
    arguments = ("stride", "groupSize")

    @classmethod
    def attributes(cls, graph: Any, stride: int, groupSize: int) -> Dict[str, Any]:
        return _collectives.all_gather_strided_attrs(stride, groupSize, graph.ir)


class ReplicatedReduceScatterStridedOp(CustomOp):
    popxl_type, op_type = "replicated_reduce_scatter_strided", "ReplicatedReduceScatterStrided"
    arguments = ("op", "stride", "groupSize", "configureOutputForReplicatedTensorSharding")

    @classmethod
    def attributes(cls, graph: Any, op: Any, stride: int, groupSize: int,
                   configureOutputForReplicatedTensorSharding: bool) -> Dict[str, Any]:
        return _collectives.reduce_scatter_strided_attrs(op, stride, groupSize,
                                                         configureOutputForReplicatedTensorSharding, graph.ir)


# losses -----------------------------------------------------------------------------------------------
class CrossEntropyShardedOp(_MemoryProportionHint, CustomOp):
    popxl_type, op_type = "cross_entropy_sharded", "CrossEntropySharded"
    arguments = ("group", "availableMemoryProportion")

    @classmethod
    def attributes(cls, graph: Any, group: Any, availableMemoryProportion: float) -> Dict[str, Any]:
        return {"groups": groups_of(group, "cross_entropy_sharded", graph.ir),
                "available_memory_proportion": float(availableMemoryProportion)}


class CrossEntropyShardedWROp(CustomOp):
    """Named ``CrossEntropyShardedOp`` in its binding module, as in popxl-addons."""

    popxl_type, op_type = "cross_entropy_sharded_wr", "CrossEntropyShardedWR"
    arguments = ("ipus",)

    @classmethod
    def attributes(cls, graph: Any, ipus: Sequence[int]) -> Dict[str, Any]:
        return {"ipus": tuple(int(i) for i in ipus)}


# layers ----------------------------------------------------------------------------------------------
class RotaryPosEmbedOp(CustomOp):
    popxl_type, op_type = "rotary_pos_embed", "RotaryPosEmbed"
    arguments = ("rotaryDim",)

    @classmethod
    def attributes(cls, graph: Any, rotaryDim: int) -> Dict[str, Any]:
        return {"rotary_dim": rotaryDim, "pairing": "interleaved"}


class LayerNormDistributedOp(CustomOp):
    popxl_type, op_type = "layer_norm_distributed", "LayerNormDistributed"
    arguments = ("epsilon", "group")

    @classmethod
    def attributes(cls, graph: Any, epsilon: float, group: Any) -> Dict[str, Any]:
        return {"epsilon": float(epsilon), "groups": groups_of(group, "layer_norm_distributed", graph.ir)}


class GradReduceSquareAddOp(CustomOp):
    popxl_type, op_type = "grad_reduce_square_add", "GradReduceSquareAdd"


class LinearLayoutParams:
    def __init__(self, bs: int) -> None:
        self.bs = bs


class LinearLayoutOp(ParameterizedOp):
    popxl_type, op_type, domain = "linear_layout", "LinearLayout", _DOMAIN

    @classmethod
    def attributes(cls, graph: Any, params: LinearLayoutParams) -> Dict[str, Any]:
        return {"bs": params.bs}


class DenseSparseMatMulParams:
    def __init__(self, nz: Sequence[float], cols: Sequence[int], rows: Sequence[int], output_cols: int) -> None:
        self.nz, self.cols, self.rows, self.output_cols = nz, cols, rows, output_cols


class DenseSparseMatMulOp(_MemoryProportionHint, ParameterizedOp):
    popxl_type, op_type, domain = "dense_sparse_matmul", "SparseMatmul", _DOMAIN

    @classmethod
    def attributes(cls, graph: Any, params: DenseSparseMatMulParams) -> Dict[str, Any]:
        return {"rhs": CSRMatrix(params.nz, params.cols, params.rows, params.output_cols)}


# quantisation ------------------------------------------------------------------------------------
class GroupQuantizeDecompressOp(CustomOp):
    popxl_type, op_type = "group_quantize_decompress", "GroupQuantizeDecompress"


class Fp8ScalingBiasParams:
    def __init__(self, min_fp32_exp_index: int, format_span: int, quantisation_error: float) -> None:
        self.min_fp32_exp_index, self.format_span = min_fp32_exp_index, format_span
        self.quantisation_error = quantisation_error


class Fp8FindBestScaleOp(ParameterizedOp):
    popxl_type, op_type, domain = "fp8_mse_scale", "Fp8Scale", _DOMAIN

    @classmethod
    def attributes(cls, graph: Any, params: Fp8ScalingBiasParams) -> Dict[str, Any]:
        return {"min_fp32_exp_index": params.min_fp32_exp_index, "format_span": params.format_span,
                "quantisation_error": float(params.quantisation_error)}


# the modules, by name under popxl_addons.ops ---------------------------------------------------------
MODULES: Dict[str, Dict[str, Type[Any]]] = {
    "replicated_all_reduce_TP.replicated_all_reduce_TP_binding": {"ReplicatedAllReduceTPOp": ReplicatedAllReduceTPOp},
    "replicated_strided_collectives.replicated_all_reduce_strided_binding":
        {"ReplicatedAllReduceStridedOp": ReplicatedAllReduceStridedOp},
    "replicated_strided_collectives.replicated_all_gather_strided_binding":
        {"ReplicatedAllGatherStridedOp": ReplicatedAllGatherStridedOp},
    "replicated_strided_collectives.replicated_reduce_scatter_strided_binding":
        {"ReplicatedReduceScatterStridedOp": ReplicatedReduceScatterStridedOp},
    "cross_entropy_sharded_loss.crossentropysharded_binding": {"CrossEntropyShardedOp": CrossEntropyShardedOp},
    "cross_entropy_sharded_wr_loss.crossentropysharded_wr_binding": {"CrossEntropyShardedOp": CrossEntropyShardedWROp},
    "rotary_pos_embed.rotary_pos_embed_binding": {"RotaryPosEmbedOp": RotaryPosEmbedOp},
    "layer_norm_distributed.layer_norm_distributed_binding": {"LayerNormDistributedOp": LayerNormDistributedOp},
    "grad_reduce_square_add.grad_reduce_square_add_binding": {"GradReduceSquareAddOp": GradReduceSquareAddOp},
    "group_quantize_decompress.group_quantize_decompress_binding":
        {"GroupQuantizeDecompressOp": GroupQuantizeDecompressOp},
    "fp8_mse_scale.fp8_mse_scale_impl": {"Fp8FindBestScaleOp": Fp8FindBestScaleOp,
                                         "Fp8ScalingBiasParams": Fp8ScalingBiasParams},
    "linear_layout.linear_layout_impl": {"LinearLayoutOp": LinearLayoutOp, "LinearLayoutParams": LinearLayoutParams},
    "static_sparse_ops.dense_sparse_matmul_impl": {"DenseSparseMatMulOp": DenseSparseMatMulOp,
                                                   "DenseSparseMatMulParams": DenseSparseMatMulParams},
}

