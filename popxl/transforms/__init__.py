"""IR-to-IR transforms: autodiff, exchange merging and sum decomposition."""
from popxl.transforms.autodiff import ExpectedConnection, ExpectedConnectionType, GradGraphInfo, autodiff
from popxl.transforms.decompose_sum import decompose_sum
from popxl.transforms.exchange import io_tile_exchange, merge_exchange

__all__ = ["autodiff", "GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType", "merge_exchange",
           "io_tile_exchange", "decompose_sum"]
