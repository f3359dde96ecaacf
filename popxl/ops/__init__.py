"""popxl.ops: every op, grouped by family. Each op is declared once (see popxl/op.py); each family
module lists its public functions in its own ``__all__``. Importing it sets Tensor's operators and
methods (``t + 1``, ``t[i]``, ``t.T`` ...: popxl._hooks), which trace these ops."""
import sys as _sys

from popxl import _hooks
# submodules users reach as popxl.ops.<name> (and modules that register ops when imported)
from popxl.ops import utils  # noqa: F401
from popxl.ops import collectives  # noqa: F401
from popxl.ops import var_updates  # noqa: F401
from popxl.ops import call as _call, elementwise as _elementwise, host_io as _host_io
from popxl.ops import call_grad as _call_grad  # noqa: F401  (registers) the gradient rules of call, repeat and conditional
from popxl.ops import matmul as _matmul, normalisation as _normalisation, pooling as _pooling, fp8 as _fp8
from popxl.ops import indexing as _indexing, resize as _resize
from popxl.ops import roi_align as _roi_align
from popxl.ops import fused_attention as _fused_attention  # noqa: F401  internal ops that fuse_attention makes
from popxl.ops import misc as _misc, placement as _placement, random as _random, reduce as _reduce, shape as _shape
from popxl.ops import remote as _remote
# Family modules named as PopXL's per-op module paths (``from popxl.ops.conv import PadType``);
# imported before the op names below are bound, so that ``popxl.ops.conv`` ends up the function,
# as in PopXL.
from popxl.ops import conv as _conv, negative_log_likelihood as _nll
from popxl.ops import addons  # noqa: F401  popxl-addons' custom ops (registered here; not in popxl.ops' names)
from popxl.ops.call import *  # noqa: F401,F403
from popxl.ops.elementwise import *  # noqa: F401,F403
from popxl.ops.host_io import *  # noqa: F401,F403
from popxl.ops.misc import *  # noqa: F401,F403
from popxl.ops.matmul import *  # noqa: F401,F403
from popxl.ops.conv import *  # noqa: F401,F403
from popxl.ops.pooling import *  # noqa: F401,F403
from popxl.ops.normalisation import *  # noqa: F401,F403
from popxl.ops.negative_log_likelihood import *  # noqa: F401,F403
from popxl.ops.roi_align import *  # noqa: F401,F403
from popxl.ops.fp8 import *  # noqa: F401,F403
from popxl.ops.placement import *  # noqa: F401,F403
from popxl.ops.random import *  # noqa: F401,F403
from popxl.ops.reduce import *  # noqa: F401,F403
from popxl.ops.remote import *  # noqa: F401,F403
from popxl.ops.shape import *  # noqa: F401,F403
from popxl.ops.indexing import *  # noqa: F401,F403
from popxl.ops.resize import *  # noqa: F401,F403
# As in PopXL, these are public functions but missing from ``popxl.ops.__all__``.
from popxl.ops.elementwise import floor, log2  # noqa: F401
from popxl.ops.remote import remote_code_load  # noqa: F401

__all__ = [name for module in (_elementwise, _reduce, _shape, _indexing, _resize, _matmul, _conv, _pooling,
                               _normalisation, _nll, _roi_align, _fp8, _misc, _random, _host_io, _remote, _placement, _call)
           for name in module.__all__ if not name[0].isupper()]

# Tensor's operators and methods (popxl.tensor, a layer below) trace the ops of this package.
_hooks.ops = _sys.modules[__name__]
_hooks.getitem = _indexing.getitem
