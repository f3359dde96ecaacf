"""IR-to-IR transforms: autodiff, exchange merging, sum decomposition, convolution, matmul,
attention, layer norm and GELU fusion, loop invariant hoisting, the expansion of ops that run as
other ops, and where the weight fragments run; `PIPELINE`, the ones every Session applies, in order
(``print(PIPELINE)``)."""
from popxl.transforms.autodiff import ExpectedConnection, ExpectedConnectionType, GradGraphInfo, autodiff
from popxl.transforms.decompose_sum import decompose_sum
from popxl.transforms.expand import expand_ops
from popxl.transforms.exchange import io_tile_exchange, merge_exchange
from popxl.transforms.fragments import order_weight_fragments
from popxl.transforms.fuse_attention import fuse_attention
from popxl.transforms.fuse_conv import (fold_batch_norm, fuse_conv, fuse_conv_bias, fuse_conv_post_ops,
                                        global_pools_as_pools, keep_channels_last)
from popxl.transforms.fuse_decomposed import fuse_decomposed, fuse_gelu, fuse_layer_norm
from popxl.transforms.fuse_matmul import fuse_matmul, fuse_matmul_bias, fuse_weight_updates
from popxl.transforms.hoist import hoist_invariants
from popxl.transforms import pipeline
from popxl.transforms.pipeline import PIPELINE

__all__ = ["autodiff", "GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType", "merge_exchange",
           "io_tile_exchange", "decompose_sum", "fuse_conv", "fold_batch_norm", "fuse_conv_bias", "fuse_conv_post_ops",
           "global_pools_as_pools", "keep_channels_last", "hoist_invariants", "fuse_matmul", "fuse_matmul_bias",
           "fuse_weight_updates", "expand_ops", "order_weight_fragments", "fuse_attention", "fuse_decomposed",
           "fuse_layer_norm", "fuse_gelu", "PIPELINE", "pipeline"]
