"""popdist.popart: the launch's replicas as PopART session options and a device. The one module of
popdist that imports popart (and so popxl): the rest of popdist imports neither."""
from __future__ import annotations

from typing import Any, Optional

import popart
import popdist

__all__ = ["configureSessionOptions", "getDevice"]


def configureSessionOptions(opts: Any) -> None:
    """Set ``opts`` (a ``popart.SessionOptions``) for this instance's part of the launch: local
    replication (``enableReplicatedGraphs`` / ``replicatedGraphCount``) and, with several instances,
    the global replication (``enableDistributedReplicatedGraphs``, ``globalReplicationFactor``,
    ``globalReplicaOffset``)."""
    launch = popdist.launch_environment()
    opts.enableReplicatedGraphs = launch.num_local_replicas > 1
    opts.replicatedGraphCount = launch.num_local_replicas
    opts.enableDistributedReplicatedGraphs = launch.num_instances > 1
    opts.globalReplicationFactor = launch.num_total_replicas
    opts.globalReplicaOffset = launch.replica_index_offset


def getDevice(ipus_per_replica: Optional[int] = None, connectionType: Any = None) -> Any:
    """The device for this instance's replicas (``ipus_per_replica`` defaults to the launcher's
    count): acquired as PopART acquires IPU hardware, so it needs ``POPXL_IPU_HW=cpu`` here, where
    the IPUs run on the CPU engine."""
    per_replica = popdist.getNumIpusPerReplica() if ipus_per_replica is None else int(ipus_per_replica)
    if connectionType is None:
        connectionType = popart.DeviceConnectionType.Always
    return popart.DeviceManager().acquireAvailableDevice(popdist.getNumLocalReplicas() * per_replica,
                                                         connectionType=connectionType)
