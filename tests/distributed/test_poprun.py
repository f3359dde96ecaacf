"""Several instances under poprun (MPI): the same program gives bit-identical results whichever
way its replicas are spread over processes (1 x 4, 2 x 2, 4 x 1), and a launch whose instance
fails, dies, hangs or runs another program ends with an error naming it, within a bounded time.

Each launch starts real processes (tests/distributed/programs.py) through the installed ``poprun``
console script and the mpich wheel's mpiexec; every one is bounded by a timeout, so a hang fails
the test instead of blocking CI.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import numpy as np
import pytest

PROGRAMS = Path(__file__).with_name("programs.py")
LAYOUTS = [(1, 4), (2, 2), (4, 1)]  # (instances, replicas per instance): 4 replicas in all


def poprun_script() -> str:
    """The console script the install put next to this Python."""
    found = shutil.which("poprun", path=str(Path(sys.executable).parent))
    assert found is not None, "the install did not provide the poprun console script"
    return found


def launch(instances: int, replicas: int, mode: str, outdir: Path, timeout: float = 240,
           extra: tuple = ()) -> subprocess.CompletedProcess:
    cmd = [poprun_script(), "--num-instances", str(instances), "--num-replicas", str(replicas), "--grace", "1",
           *extra, sys.executable, str(PROGRAMS), mode, str(outdir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "POPRUN_", "PMI_"))}
    env["OMP_NUM_THREADS"] = "1"  # 2 cores shared by up to 4 processes
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def gathered(outdir: Path, mode: str, instances: int, local: int) -> Dict[str, np.ndarray]:
    """The instances' saved results put together: host outputs with every replica's row in global
    order (axis 0, or axis 2 of ``loss``: (runs, steps, replicas)); variables as instance 0 read
    them, after checking that every instance read the same."""
    parts = [dict(np.load(outdir / f"{mode}_{i}.npz")) for i in range(instances)]
    assert [int(p.pop("offset")) for p in parts] == [i * local for i in range(instances)]
    out = {}
    for name in parts[0]:
        values = [p[name] for p in parts]
        if "var_" in name or name.startswith("param_"):
            for i, v in enumerate(values[1:], 1):
                np.testing.assert_array_equal(v, values[0], err_msg=f"{name}: instance {i} reads another value")
            out[name] = values[0]
            continue
        axis = 2 if name == "loss" else 0
        if local == 1:  # the replica axis is dropped from host buffers of one replica
            values = [np.expand_dims(v, axis) for v in values]
        out[name] = np.concatenate(values, axis=axis)
    return out


def run_layouts(mode: str, tmp_path: Path, layouts=LAYOUTS) -> Dict[tuple, Dict[str, np.ndarray]]:
    results = {}
    for instances, local in layouts:
        outdir = tmp_path / f"{instances}x{local}"
        outdir.mkdir()
        proc = launch(instances, instances * local, mode, outdir)
        assert proc.returncode == 0, f"{instances} x {local}: poprun exited {proc.returncode}\n{proc.stderr[-4000:]}"
        results[instances, local] = gathered(outdir, mode, instances, local)
    return results


def assert_bit_identical(results: Dict[tuple, Dict[str, np.ndarray]]) -> None:
    base_layout, base = next(iter(results.items()))
    for layout, got in results.items():
        assert sorted(got) == sorted(base)
        for name, value in base.items():
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, (layout, name)
            # bit for bit (NaNs in the same places count as equal)
            np.testing.assert_array_equal(got[name].view(np.uint8), value.view(np.uint8),
                                          err_msg=f"{name}: {layout[0]} x {layout[1]} differs from "
                                                  f"{base_layout[0]} x {base_layout[1]}")


@pytest.mark.slow
def test_every_collective_spans_instances_bit_identically(tmp_path):
    results = run_layouts("collectives", tmp_path)
    assert_bit_identical(results)
    one = results[1, 4]
    # and the single process agrees with NumPy over the four replicas' inputs
    from programs import replica_data
    xs = np.stack([replica_data((5, 3), r, 1) for r in range(4)])
    for engine in ("native", "reference"):
        np.testing.assert_allclose(one[f"{engine}/f32_add_all"], np.broadcast_to(xs.sum(0), (4, 5, 3)), rtol=1e-6)
        pairs = np.concatenate([np.broadcast_to(xs[:2].max(0), (2, 5, 3)), np.broadcast_to(xs[2:].max(0), (2, 5, 3))])
        np.testing.assert_array_equal(one[f"{engine}/f32_max_pairs"], pairs)
        big = np.stack([replica_data((3, 100003), r, 4) for r in range(4)])
        np.testing.assert_allclose(one[f"{engine}/big_mean_all"], np.broadcast_to(big.mean(0), big.shape), rtol=1e-5,
                                   atol=1e-6)
        strided = one[f"{engine}/addons_strided"]  # groups {0, 2} and {1, 3}
        np.testing.assert_allclose(strided[[0, 2]], np.broadcast_to(xs[0] + xs[2], (2, 5, 3)), rtol=1e-6)
        np.testing.assert_allclose(strided[[1, 3]], np.broadcast_to(xs[1] + xs[3], (2, 5, 3)), rtol=1e-6)
        gathered_new = one[f"{engine}/gather_new_stride2"]
        np.testing.assert_array_equal(gathered_new[1], xs[[1, 3]])
        np.testing.assert_array_equal(one[f"{engine}/var_every"], np.stack([xs[r][1] for r in range(4)]))
        np.testing.assert_array_equal(one[f"{engine}/var_own"], np.stack([xs[r][0] for r in range(4)]))
        # written with write_variables_data, then one more run adds x[0] again
        np.testing.assert_array_equal(one[f"{engine}/var_own_rewritten"],
                                      np.arange(12, dtype=np.float32).reshape(4, 3) + xs[:, 0])
        # the RTS variable: group g (replicas g, g + 2) adds x[0, 0] of each member to its own shard
        rts = np.full((2, 10), 0.5, np.float32)
        for g in range(2):
            rts[g, :5] += xs[g, 0, 0]
            rts[g, 5:] += xs[g + 2, 0, 0]
        np.testing.assert_array_equal(one[f"{engine}/var_rts_rewritten"], rts)


@pytest.mark.slow
def test_data_parallel_training_is_bit_identical_for_1x4_2x2_4x1(tmp_path):
    results = run_layouts("mlp", tmp_path)
    assert_bit_identical(results)
    loss = results[1, 4]["loss"]
    assert loss.shape == (2, 3, 4) and np.all(np.isfinite(loss))
    assert loss[1].mean() < loss[0].mean()  # it learns


def test_popart_training_session_under_poprun_matches_one_process(tmp_path):
    results = run_layouts("popart", tmp_path, layouts=[(1, 2), (2, 1)])
    assert_bit_identical(results)
    assert results[1, 2]["loss"].shape == (2, 2, 2)


# faults: each launch is 2 instances of a small program; instance 1 misbehaves ---------------------------
def fault_launch(mode: str, tmp_path: Path, extra: tuple = (), timeout: float = 120):
    start = time.monotonic()
    proc = launch(2, 2, mode, tmp_path, timeout=timeout, extra=extra)
    return proc, time.monotonic() - start


def test_an_instance_that_raises_stops_the_others_naming_it(tmp_path):
    proc, _ = fault_launch("raise", tmp_path)
    assert proc.returncode != 0
    assert "ValueError: instance 1 gives up" in proc.stderr
    assert "popdist.backend.InstanceError: popdist: instance 1 of 2 failed: raised ValueError: instance 1 gives up" \
        in proc.stderr
    assert "poprun: instance 1 (pid" in proc.stderr and "failed first" in proc.stderr
    assert "instance 0 done" not in proc.stdout


def test_an_instance_that_dies_stops_the_others_naming_it(tmp_path):
    proc, _ = fault_launch("die", tmp_path)
    assert proc.returncode != 0
    assert "instance 1 of 2 failed: its process ended without a word" in proc.stderr
    assert "instance 0 done" not in proc.stdout


def test_instances_running_different_programs_are_refused_at_attach(tmp_path):
    proc, _ = fault_launch("differ", tmp_path)
    assert proc.returncode != 0
    assert "the instances run different programs: the executable of instance(s) [1] differs" in proc.stderr


def test_instances_on_different_engines_are_refused_at_attach_naming_them(tmp_path):
    proc, seconds = fault_launch("other_engine", tmp_path)
    assert proc.returncode != 0
    assert "the instances run different engines: instance 0: native engine (build " in proc.stderr
    assert "instance 1: reference engine (build numpy)" in proc.stderr
    assert seconds < 60  # at once, not after the collectives' timeout


def test_an_instance_that_ends_early_stops_the_one_waiting_for_it(tmp_path):
    proc, _ = fault_launch("early_end", tmp_path)
    assert proc.returncode != 0
    assert "instance 1 ended its program while this instance (0) waits for it" in proc.stderr


def test_a_hanging_instance_ends_the_launch_after_the_collective_timeout(tmp_path):
    proc, seconds = fault_launch("hang", tmp_path, extra=("--timeout", "3"))
    assert proc.returncode != 0
    assert "no message from instance 1 for 3 s (the collective timeout" in proc.stderr
    assert seconds < 40  # instance 1 sleeps 60 s: poprun ended it


def test_ctrl_c_while_an_instance_waits_in_a_collective_ends_the_launch(tmp_path):
    """Ctrl-C (SIGINT to the launch's process group) while instance 0 waits for instance 1 in a
    collective: the native engine's wait ends with KeyboardInterrupt, and poprun ends the launch
    (instance 1 ignores SIGINT and sleeps on: only the interrupted wait can end it in time)."""
    cmd = [poprun_script(), "--num-instances", "2", "--num-replicas", "2", "--grace", "1", sys.executable,
           str(PROGRAMS), "interrupt", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "POPRUN_", "PMI_"))}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "waiting").exists():
            assert proc.poll() is None, f"the launch ended before the collective: {proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "instance 0 never reached the collective"
            time.sleep(0.1)
        time.sleep(1.0)  # instance 0 is in the collective's wait (instance 1 sleeps 60 s)
        pressed = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    assert time.monotonic() - pressed < 30  # not the 60 s of instance 1's sleep, nor the collective timeout
    assert "KeyboardInterrupt" in err, err[-3000:]
    assert "poprun: instance 0 (pid" in err and "was interrupted (KeyboardInterrupt) in Session.run" in err
    assert "instance 0 done" not in out


def test_popdist_outside_poprun_is_one_instance(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "POPRUN_", "PMI_"))}
    code = ("import popxl; ir = popxl.Ir(replication='popdist'); "
            "print(ir.replication_factor, ir.instance_replication_factor, ir._instances)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "(0,", "1)"]


# the launcher's command line (no processes) -------------------------------------------------------------
def poprun_command(*argv: str, env=None):
    from popdist import poprun
    args = poprun.parse_args(list(argv))
    return poprun.build_command(args, "/x/mpiexec", env or {})


def test_poprun_gives_each_instance_its_replicas_through_mpiexec(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cmd = poprun_command("--num-instances", "2", "--num-replicas", "4", "--ipus-per-replica", "2",
                         "--mpi-local-args", "-wdir /tmp", "python", "prog.py", "--lr", "0.1")
    text = " ".join(cmd)
    assert cmd[:2] == ["/x/mpiexec", "-disable-auto-cleanup"] and "-hosts" not in cmd
    assert "-genv POPDIST_NUM_TOTAL_REPLICAS 4 -genv POPDIST_NUM_LOCAL_REPLICAS 2" in text
    assert "-genv POPDIST_NUM_IPUS_PER_REPLICA 2" in text
    sections = text.split(" : ")
    assert len(sections) == 2
    # each instance under a shell that reports a signal's end as an exit status (Hydra would kill the others)
    program = "-wdir /tmp sh -c trap \"\" USR1; \"$@\"; exit $? poprun-instance python prog.py --lr 0.1"
    assert sections[0].endswith("-n 1 -env POPDIST_REPLICA_INDEX_OFFSET 0 -env POPDIST_LOCAL_INSTANCE_INDEX 0 " + program)
    assert sections[1] == "-n 1 -env POPDIST_REPLICA_INDEX_OFFSET 2 -env POPDIST_LOCAL_INSTANCE_INDEX 1 " + program
    threads = cmd[cmd.index("OMP_NUM_THREADS") + 1]
    assert threads == str(max(1, (os.cpu_count() or 1) // 2))  # the host's cores shared by its instances


def test_poprun_spreads_instances_over_hosts_in_blocks():
    cmd = poprun_command("--num-instances", "4", "--num-replicas", "8", "--host", "a,b",
                         "--mpi-global-args", "-iface eth0", "python", "p.py")
    assert cmd[2:7] == ["-hosts", "a,b", "-ppn", "2", "-iface"]
    offsets = [cmd[i + 1] for i, c in enumerate(cmd) if c == "POPDIST_REPLICA_INDEX_OFFSET"]
    local = [cmd[i + 1] for i, c in enumerate(cmd) if c == "POPDIST_LOCAL_INSTANCE_INDEX"]
    assert offsets == ["0", "2", "4", "6"] and local == ["0", "1", "0", "1"]
    from popdist import poprun
    topology = poprun._topology(poprun.parse_args(["--num-instances", "4", "--num-replicas", "8",
                                                             "-H", "a,b", "python", "p.py"]))
    assert "instance 3 (MPI rank 3) on b: replicas 6..7" in topology


@pytest.mark.parametrize("argv, topology, command", [
    (("--print-topology", "python", "prog.py"), "yes", ["python", "prog.py"]),
    (("--num-instances", "2", "--print-topology", "python", "p.py", "--print-topology"), "yes",
     ["python", "p.py", "--print-topology"]),  # the program's own flag stays the program's
    (("--print-topology=no", "python", "p.py"), "no", ["python", "p.py"]),
    (("--print-topology=yes", "--num-instances", "2", "python", "p.py"), "yes", ["python", "p.py"]),
    (("python", "p.py"), "no", ["python", "p.py"]),
])
def test_print_topology_alone_does_not_take_the_program_as_its_value(argv, topology, command):
    from popdist import poprun
    args = poprun.parse_args(list(argv))
    assert args.print_topology == topology and args.command == command


def test_print_topology_values_are_checked(capsys):
    from popdist import poprun
    with pytest.raises(SystemExit):
        poprun.parse_args(["--print-topology=maybe", "python", "p.py"])
    assert "invalid choice: 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (("--num-instances", "2", "--num-replicas", "3"), "--num-replicas=3 must be a positive multiple of --num-instances=2"),
    (("--num-instances", "0"), "--num-instances must be >= 1, not 0"),
    (("--num-instances", "3", "--host", "a,b"), "3 instances cannot be spread evenly over 2 hosts"),
])
def test_poprun_refuses_layouts_it_cannot_make(argv, message):
    with pytest.raises(SystemExit, match=message):
        poprun_command(*argv, "python", "p.py")


def test_poprun_without_a_program_says_what_is_missing(capsys):
    from popdist import poprun
    with pytest.raises(SystemExit):
        poprun.main(["--num-instances", "2"])
    assert "the program to run is missing" in capsys.readouterr().err
