"""popdist: what a distributed launch looks like from inside one process.

Graphcore's launcher (``poprun``) starts one process per *instance* and tells each, through
environment variables, how many replicas there are in all, how many this instance runs and where
its replicas start. PopDist's Python API reads them; PopXL (``Ir(replication="popdist")``),
popxl-addons and the tutorials ask it. This module reads the same variables:

============================  ==============================================  ==========
variable                      meaning                                         unset
============================  ==============================================  ==========
POPDIST_NUM_TOTAL_REPLICAS    replicas over all instances                     local count
POPDIST_NUM_LOCAL_REPLICAS    replicas of this instance                       total count
POPDIST_REPLICA_INDEX_OFFSET  global index of this instance's first replica   0
POPDIST_NUM_IPUS_PER_REPLICA  IPUs each replica spans                         1
POPDIST_LOCAL_INSTANCE_INDEX  this instance's place among those of its host   0
============================  ==============================================  ==========

Instances run the same number of replicas (poprun's uniform layout), so the instance index is
``offset // local`` and the instance count ``total // local``. Without these variables the process
is a launch of one instance with one replica. Every function reads the environment afresh through
``launch_environment()``, the one place that parses it.

With several instances, ``init()`` (or ``Ir(replication="popdist")``) starts the communication
backend (``popdist.backend``: MPI between the instances, poprun's supervisor for failures), and
every collective of a program spans the instances. ``poprun`` (``popdist.poprun``) launches them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from popdist.backend import InstanceError
from popdist import backend

__all__ = ["InstanceError", "LaunchEnvironment", "launch_environment", "isPopdistEnvSet", "getInstanceIndex", "getNumInstances",
           "getNumTotalReplicas", "getNumLocalReplicas", "getReplicaIndexOffset", "getNumIpusPerReplica",
           "getLocalInstanceIndex", "checkNumIpusPerReplica", "getDeviceId", "init", "isBackendInitialized",
           "finalizeBackend", "execute_on_instances"]

TOTAL = "POPDIST_NUM_TOTAL_REPLICAS"
LOCAL = "POPDIST_NUM_LOCAL_REPLICAS"
OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
LOCAL_INSTANCE = "POPDIST_LOCAL_INSTANCE_INDEX"


@dataclass(frozen=True)
class LaunchEnvironment:
    """The launch as the environment describes it (see the module docstring)."""

    is_set: bool
    num_total_replicas: int
    num_local_replicas: int
    replica_index_offset: int
    num_ipus_per_replica: int
    local_instance_index: int

    @property
    def num_instances(self) -> int:
        return self.num_total_replicas // self.num_local_replicas

    @property
    def instance_index(self) -> int:
        return self.replica_index_offset // self.num_local_replicas


def _read_int(env: Mapping[str, str], name: str, minimum: int) -> Optional[int]:
    text = env.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"popdist: environment variable {name}={text!r} is not an integer.") from None
    if value < minimum:
        raise ValueError(f"popdist: environment variable {name}={value} must be >= {minimum}.")
    return value


def launch_environment(env: Optional[Mapping[str, str]] = None) -> LaunchEnvironment:
    """Parse the launcher's variables from ``env`` (default: ``os.environ``). A ValueError names
    the variable when one is malformed or they contradict each other."""
    env = os.environ if env is None else env
    total = _read_int(env, TOTAL, 1)
    local = _read_int(env, LOCAL, 1)
    is_set = total is not None or local is not None
    total = total if total is not None else (local or 1)
    local = local if local is not None else total
    offset = _read_int(env, OFFSET, 0) or 0
    if total % local:
        raise ValueError(f"popdist: {TOTAL}={total} is not a multiple of {LOCAL}={local} (every instance runs "
                         f"the same number of replicas).")
    if offset % local or offset >= total:
        raise ValueError(f"popdist: {OFFSET}={offset} must be a multiple of {LOCAL}={local} below "
                         f"{TOTAL}={total}.")
    return LaunchEnvironment(is_set=is_set, num_total_replicas=total, num_local_replicas=local,
                             replica_index_offset=offset,
                             num_ipus_per_replica=_read_int(env, IPUS_PER_REPLICA, 1) or 1,
                             local_instance_index=_read_int(env, LOCAL_INSTANCE, 0) or 0)


def isPopdistEnvSet() -> bool:
    """True when a launcher described the replicas (POPDIST_NUM_TOTAL_REPLICAS or
    POPDIST_NUM_LOCAL_REPLICAS is set)."""
    return launch_environment().is_set


def getInstanceIndex() -> int:
    """This instance's index in ``[0, getNumInstances())``."""
    return launch_environment().instance_index


def getNumInstances() -> int:
    """How many instances the launch has."""
    return launch_environment().num_instances


def getNumTotalReplicas() -> int:
    """Replicas over all instances (1 without a launcher)."""
    return launch_environment().num_total_replicas


def getNumLocalReplicas() -> int:
    """Replicas this instance runs (1 without a launcher)."""
    return launch_environment().num_local_replicas


def getReplicaIndexOffset() -> int:
    """Global index of this instance's first replica."""
    return launch_environment().replica_index_offset


def getNumIpusPerReplica() -> int:
    """IPUs each replica spans (1 without a launcher)."""
    return launch_environment().num_ipus_per_replica


def getLocalInstanceIndex() -> int:
    """This instance's place among the instances of its host (0 without a launcher)."""
    return launch_environment().local_instance_index


def checkNumIpusPerReplica(expected: int) -> bool:
    """Whether replicas span ``expected`` IPUs: False if the launcher said otherwise; without a
    launcher, whether ``expected`` is 1, the only count a process on its own has."""
    return getNumIpusPerReplica() == expected


def getDeviceId(ipusPerReplica: int = 0) -> int:
    """The id of the device that holds this instance's replicas. There is one device here, the
    host CPU, so it is 0 (``popart.DeviceManager().acquireDeviceById(0)`` acquires it where
    ``POPXL_IPU_HW=cpu`` is set). ``ipusPerReplica`` (0: the launcher's count) must be >= 0."""
    if isinstance(ipusPerReplica, bool) or not isinstance(ipusPerReplica, int) or ipusPerReplica < 0:
        raise ValueError(f"popdist.getDeviceId: ipusPerReplica must be an int >= 0, not {ipusPerReplica!r}.")
    return 0


_backend_initialized = False


def init() -> None:
    """Start the communication backend between instances (MPI, and the link to poprun's
    supervisor); with one instance there is nobody to talk to."""
    global _backend_initialized
    launch = launch_environment()  # malformed variables are reported here, at the start
    if launch.num_instances > 1:
        backend.get(launch.instance_index, launch.num_instances)
    _backend_initialized = True


def isBackendInitialized() -> bool:
    return _backend_initialized


def finalizeBackend() -> None:
    """Mark the backend finished; MPI itself is finalised when the process exits."""
    global _backend_initialized
    _backend_initialized = False


def execute_on_instances(instances: Iterable[int], func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` on the instances listed in ``instances`` (its result there), None
    on the others."""
    chosen = {int(i) for i in instances}
    n = getNumInstances()
    if any(not 0 <= i < n for i in chosen):
        raise ValueError(f"popdist.execute_on_instances: instances {sorted(chosen)} are not all in [0, {n}).")
    return func(*args, **kwargs) if getInstanceIndex() in chosen else None
