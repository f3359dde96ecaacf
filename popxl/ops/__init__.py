"""popxl.ops: every op, grouped by family. Each op is declared once (see popxl/op.py); each family
module lists its public functions in its own ``__all__``."""
from popxl.ops import utils
from popxl.ops import collectives
from popxl.ops import var_updates
from popxl.ops import call as _call, elementwise as _elementwise, host_io as _host_io, nn as _nn
from popxl.ops import misc as _misc, placement as _placement, random as _random, reduce as _reduce, shape as _shape
from popxl.ops import remote as _remote
# PopXL's per-op module paths that client code imports from; imported before the op names below are
# bound, so that ``popxl.ops.conv`` ends up the function, as in PopXL.
from popxl.ops import conv as _conv_module, negative_log_likelihood as _nll_module  # noqa: F401
from popxl.ops.call import *  # noqa: F401,F403
from popxl.ops.elementwise import *  # noqa: F401,F403
from popxl.ops.host_io import *  # noqa: F401,F403
from popxl.ops.misc import *  # noqa: F401,F403
from popxl.ops.nn import *  # noqa: F401,F403
from popxl.ops.placement import *  # noqa: F401,F403
from popxl.ops.random import *  # noqa: F401,F403
from popxl.ops.reduce import *  # noqa: F401,F403
from popxl.ops.remote import *  # noqa: F401,F403
from popxl.ops.shape import *  # noqa: F401,F403
# As in PopXL, these are public functions but missing from ``popxl.ops.__all__``.
from popxl.ops.elementwise import floor, log2  # noqa: F401
from popxl.ops.remote import remote_code_load  # noqa: F401

__all__ = [name for module in (_elementwise, _reduce, _shape, _nn, _misc, _random, _host_io, _remote,
                               _placement, _call)
           for name in module.__all__ if not name[0].isupper()]
