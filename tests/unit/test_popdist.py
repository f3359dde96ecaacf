"""popdist: the launcher's environment variables, read in one place, and what popxl makes of them;
mpi4py importing with the MPI library of PyPI's mpich wheel."""
import subprocess
import sys

import numpy as np
import pytest

import popdist
import popdist.popart
import popxl
import popxl.ops as ops

LAUNCH_VARS = ["POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET",
               "POPDIST_NUM_IPUS_PER_REPLICA", "POPDIST_LOCAL_INSTANCE_INDEX"]


@pytest.fixture
def launch(monkeypatch):
    """Set the launcher's variables (and clear the others) for one test."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)

    def set_vars(**values):
        for key, value in values.items():
            monkeypatch.setenv(f"POPDIST_{key.upper()}", str(value))
    return set_vars


def test_without_a_launcher_one_instance_runs_one_replica(launch):
    assert not popdist.isPopdistEnvSet()
    assert popdist.getInstanceIndex() == 0 and popdist.getNumInstances() == 1
    assert popdist.getNumTotalReplicas() == popdist.getNumLocalReplicas() == 1
    assert popdist.getReplicaIndexOffset() == 0 and popdist.getNumIpusPerReplica() == 1
    assert popdist.getLocalInstanceIndex() == 0 and popdist.getDeviceId() == 0
    assert popdist.checkNumIpusPerReplica(1) and not popdist.checkNumIpusPerReplica(2)
    assert popdist.execute_on_instances({0}, lambda a, b=0: a + b, 2, b=3) == 5


def test_a_launch_of_four_instances_seen_from_the_third(launch):
    # 16 replicas, 4 per instance, this instance's first replica is 8: instance 2 of 4
    launch(num_total_replicas=16, num_local_replicas=4, replica_index_offset=8, num_ipus_per_replica=2,
           local_instance_index=1)
    assert popdist.isPopdistEnvSet()
    assert (popdist.getInstanceIndex(), popdist.getNumInstances()) == (2, 4)
    assert (popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset()) == (16, 4, 8)
    assert popdist.getNumIpusPerReplica() == 2 and popdist.getLocalInstanceIndex() == 1
    assert popdist.checkNumIpusPerReplica(2)
    assert popdist.execute_on_instances([0, 1], lambda: "ran") is None
    assert popdist.execute_on_instances([2], lambda: "ran") == "ran"
    with pytest.raises(ValueError, match=r"instances \[4\] are not all in \[0, 4\)"):
        popdist.execute_on_instances([4], lambda: None)
    opts = popxl_session_options()
    popdist.popart.configureSessionOptions(opts)
    assert opts.enableReplicatedGraphs and opts.replicatedGraphCount == 4
    assert opts.enableDistributedReplicatedGraphs and opts.globalReplicationFactor == 16
    assert opts.globalReplicaOffset == 8
    # a launch of several instances needs MPI's launcher (poprun): a process started alone says so
    with pytest.raises(ValueError, match="instance 2 of 4, but MPI says rank 0 of 1: start the program with poprun"):
        popxl.Ir(replication="popdist")


def popxl_session_options():
    import popart
    return popart.SessionOptions()


def test_one_variable_alone_describes_a_single_instance_launch(launch):
    launch(num_local_replicas=2)
    env = popdist.launch_environment()
    assert env.is_set and env.num_total_replicas == 2 and env.num_instances == 1 and env.instance_index == 0


@pytest.mark.parametrize("values,message", [
    ({"num_total_replicas": "four"}, "POPDIST_NUM_TOTAL_REPLICAS='four' is not an integer"),
    ({"num_local_replicas": 0}, "POPDIST_NUM_LOCAL_REPLICAS=0 must be >= 1"),
    ({"num_total_replicas": 6, "num_local_replicas": 4}, "6 is not a multiple of POPDIST_NUM_LOCAL_REPLICAS=4"),
    ({"num_total_replicas": 8, "num_local_replicas": 4, "replica_index_offset": 2}, "must be a multiple of"),
    ({"num_total_replicas": 8, "num_local_replicas": 4, "replica_index_offset": 8}, "below POPDIST_NUM_TOTAL"),
])
def test_malformed_launch_variables_are_named(launch, values, message):
    launch(**values)
    with pytest.raises(ValueError, match=message):
        popdist.init()
    with pytest.raises(ValueError, match=message):
        popdist.getNumInstances()


def test_backend_state_and_device_id_argument(launch):
    popdist.init()
    assert popdist.isBackendInitialized()
    popdist.finalizeBackend()
    assert not popdist.isBackendInitialized()
    with pytest.raises(ValueError, match="ipusPerReplica"):
        popdist.getDeviceId(-1)


def test_ir_popdist_runs_the_instance_replicas(launch):
    """Ir(replication='popdist') takes its replicas from the launcher; a program runs on them."""
    launch(num_total_replicas=2, num_local_replicas=2)
    ir = popxl.Ir(replication="popdist")
    assert ir.replication_factor == ir.instance_replication_factor == 2
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32))
        y = ops.collectives.replicated_all_reduce(x * 3.0)
        out = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(out, y)
    with popxl.Session(ir, "ipu_model") as s:
        np.testing.assert_array_equal(s.run()[out], [[6.0, 12.0]] * 2)
    launch(num_total_replicas=1, num_local_replicas=1)
    assert popxl.Ir(replication="popdist").replication_factor == 1


def test_get_device_acquires_like_popart_hardware(launch, monkeypatch):
    import popart
    launch(num_total_replicas=2, num_local_replicas=2, num_ipus_per_replica=2)
    monkeypatch.delenv("POPXL_IPU_HW", raising=False)
    with pytest.raises(popart.popart_exception, match="no IPU hardware"):
        popdist.popart.getDevice()
    monkeypatch.setenv("POPXL_IPU_HW", "cpu")
    device = popdist.popart.getDevice(connectionType=popart.DeviceConnectionType.OnDemand)
    assert device.numIpus == 4 and device.connectionType == popart.DeviceConnectionType.OnDemand
    assert popdist.popart.getDevice(ipus_per_replica=1).numIpus == 2


def test_mpi4py_imports_with_the_mpich_wheel():
    """The install brings mpi4py and PyPI's mpich wheel; mpi4py loads that MPI library by itself.
    Run in a fresh interpreter: MPI starts once per process."""
    code = ("from mpi4py import MPI\n"
            "c = MPI.COMM_WORLD\n"
            "print(c.Get_rank(), c.Get_size(), c.allreduce(5), MPI.Get_library_version().split()[0])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "5", "MPICH"]
