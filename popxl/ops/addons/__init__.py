"""popxl-addons' thirteen C++ custom ops as popxl ops, each with its shape rule, kernels and
gradient as popxl-addons' C++ sources define them (read for facts; written anew here):

- ``collectives``: ``replicated_all_reduce_tp`` (``ReplicatedAllReduceTP``) and the strided
  all-reduce, all-gather and reduce-scatter, run as popxl's own collectives;
- ``losses``: the cross entropy of logits sharded over replicas (``cross_entropy_sharded``) or over
  tensors within a replica (``cross_entropy_sharded_wr``);
- ``nn``: ``rotary_pos_embed``, ``layer_norm_distributed``, ``grad_reduce_square_add``,
  ``linear_layout``, ``dense_sparse_matmul``;
- ``quantize``: ``group_quantize_decompress`` and ``fp8_mse_scale``.

popxl-addons reaches them through its binding modules (``popxl_addons.ops.<dir>.<name>_binding``),
which resolve to ``popart._internal.ir.addons_bindings`` (see ``popxl.custom_op_modules``). The
functions here are the same ops for popxl code of one's own.
"""
from popxl.ops.addons import collectives, losses, nn, quantize
from popxl.ops.addons.collectives import *  # noqa: F401,F403
from popxl.ops.addons.losses import *  # noqa: F401,F403
from popxl.ops.addons.nn import *  # noqa: F401,F403
from popxl.ops.addons.quantize import *  # noqa: F401,F403

__all__ = [*collectives.__all__, *losses.__all__, *nn.__all__, *quantize.__all__]
