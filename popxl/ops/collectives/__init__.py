"""popxl.ops.collectives: reductions and gathers across replicas and IPUs."""
from popxl.ops.collectives.collectives import *  # noqa: F401,F403
from popxl.ops.collectives.collectives import __all__  # noqa: F401
