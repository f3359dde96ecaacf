"""poprun: launch a PopXL program as several instances (processes), on one host or many.

    poprun --num-instances 2 --num-replicas 4 python prog.py [args]

starts ``prog.py`` twice through MPI's launcher (``mpiexec`` of the mpich wheel, Hydra), each
instance with the environment popdist reads (``POPDIST_NUM_TOTAL_REPLICAS=4``,
``POPDIST_NUM_LOCAL_REPLICAS=2``, ``POPDIST_REPLICA_INDEX_OFFSET=0`` / ``2``, ...), so that
``Ir(replication="popdist")`` runs replicas 0-1 in the first process and 2-3 in the second and the
collectives span both. Instance i is MPI rank i.

On several hosts (``--host a,b``) the instances are spread in blocks (instances 0..k-1 on the first
host, and so on): Hydra starts them over ssh, so the hosts need passwordless ssh, the same Python
environment at the same path, and the program's files. poprun's supervisor (popdist/supervisor.py)
listens on this host: the instances connect to it to say when one fails, so the others stop with an
error naming it; poprun prints which instance failed first and why, and ends the launch if an instance
is still running a few seconds after another failed.

Options of Graphcore's PopRun accepted here: ``--num-instances``, ``--num-replicas``,
``--ipus-per-replica``, ``--host`` / ``--hosts`` / ``-H``, ``--mpi-global-args``,
``--mpi-local-args``, ``--print-topology``, ``-v``; the IPU-partition options (``--vipu-*``,
``--reset-partition``, ...) are accepted and ignored (there are no IPUs). Ours: ``--timeout``
(seconds a collective waits for another instance, default 600) and ``--supervisor-host``.
Unless ``OMP_NUM_THREADS`` is set, each instance gets this host's cores divided by the instances
per host.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence
from popdist.supervisor import Supervisor

__all__ = ["main", "build_command", "find_mpiexec"]

_IGNORED_FLAGS = ["--reset-partition", "--update-partition", "--remove-partition", "--numa-aware"]
_IGNORED_VALUES = ["--vipu-server-host", "--vipu-server-port", "--vipu-partition", "--vipu-cluster",
                   "--vipu-server-timeout", "--ipus-per-replica-group"]


# How each instance is started: `sh -c 'trap "" USR1; "$@"; exit $?' poprun-instance prog args...`
# runs the program as the shell's child (not exec'd, as a last command would be) and exits with its
# status, 128 + N when signal N ended it. Under -disable-auto-cleanup Hydra sends SIGUSR1 to the
# instances still running whenever one exits (a notice for fault-tolerant MPI), whose default action
# would kill them: it is ignored (a program may still install a handler). Hydra kills the shell's
# process group at the end of a launch, the program with it.
_INSTANCE_SHELL = ["sh", "-c", 'trap "" USR1; "$@"; exit $?', "poprun-instance"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="poprun", description="Launch a PopXL program as several instances (processes) through MPI.",
        epilog="Example: poprun --num-instances 2 --num-replicas 4 python prog.py")
    p.add_argument("--num-instances", type=int, default=1, metavar="N", help="processes to start (default 1)")
    p.add_argument("--num-replicas", type=int, default=None, metavar="R",
                   help="replicas over all instances, a multiple of --num-instances (default: one per instance)")
    p.add_argument("--ipus-per-replica", type=int, default=1, metavar="K",
                   help="IPUs each replica spans (POPDIST_NUM_IPUS_PER_REPLICA; default 1)")
    p.add_argument("--host", "--hosts", "-H", dest="hosts", default=None, metavar="HOST[,HOST...]",
                   help="hosts to run on (Hydra starts the instances there over ssh); default: this host only")
    p.add_argument("--mpi-global-args", default="", metavar="ARGS",
                   help="arguments for mpiexec itself, as one string (e.g. '-iface eth0')")
    p.add_argument("--mpi-local-args", default="", metavar="ARGS",
                   help="arguments for each instance's section of the mpiexec command, as one string")
    p.add_argument("--print-topology", default="no", choices=["yes", "no"],
                   help="print which host runs which instance and replicas (alone: yes; or =yes / =no)")
    p.add_argument("-v", "--verbose", action="store_true", help="print the mpiexec command")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="how long a collective waits for another instance before it fails (POPDIST_TIMEOUT; "
                        "default 600, 0: no limit)")
    p.add_argument("--supervisor-host", default=None, metavar="HOST",
                   help="the address instances reach this host's supervisor at (default: 127.0.0.1 on one host, "
                        "this host's name otherwise)")
    p.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                   help="how long an instance that failed waits for the others to report before it exits, and "
                        "how long after that poprun lets the launch run before ending it (default 5)")
    for flag in _IGNORED_FLAGS:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in _IGNORED_VALUES:
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """poprun's command line. ``--print-topology`` alone means ``=yes`` and never takes the next
    word as its value (that word may be the program: ``poprun --print-topology python prog.py``),
    as PopRun's implicit value."""
    parser = _parser()
    valued = {s for a in parser._actions if a.option_strings and a.nargs != 0 for s in a.option_strings}
    argv = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(argv) and argv[i] != "--":
        word = argv[i]
        if word == "--print-topology":
            argv[i] = "--print-topology=yes"
        elif word in valued:
            i += 1  # its value
        elif not word.startswith("-"):
            break  # the program: the rest is its own
        i += 1
    return parser.parse_args(argv)


def find_mpiexec() -> str:
    """The mpich wheel's mpiexec (Hydra), else the first one on PATH."""
    try:
        dist = importlib.metadata.distribution("mpich")
        for f in dist.files or ():
            if str(f).endswith("bin/mpiexec.hydra") or str(f).endswith("bin/mpiexec"):
                # typeshed says SimplePath; an installed wheel's distribution gives a filesystem path
                path = Path(str(dist.locate_file(f))).resolve()
                if path.exists():
                    return str(path)
    except importlib.metadata.PackageNotFoundError:
        pass
    found = shutil.which("mpiexec")
    if found is None:
        raise SystemExit("poprun: no mpiexec found (the mpich wheel provides one: pip install mpich).")
    return found


class Layout(NamedTuple):
    """How a launch places its instances and replicas."""
    instances: int
    total: int  # replicas of the launch
    local: int  # replicas per instance
    hosts: List[str]
    per_host: int  # instances per host


def _layout(args: argparse.Namespace) -> Layout:
    n = args.num_instances
    total = n if args.num_replicas is None else args.num_replicas
    if n < 1:
        raise SystemExit(f"poprun: --num-instances must be >= 1, not {n}.")
    if total < 1 or total % n:
        raise SystemExit(f"poprun: --num-replicas={total} must be a positive multiple of --num-instances={n} "
                         f"(every instance runs the same number of replicas).")
    if args.ipus_per_replica < 1:
        raise SystemExit(f"poprun: --ipus-per-replica must be >= 1, not {args.ipus_per_replica}.")
    hosts = [h for h in (args.hosts or "").split(",") if h] or ["localhost"]
    if n % len(hosts):
        raise SystemExit(f"poprun: {n} instances cannot be spread evenly over {len(hosts)} hosts {hosts}.")
    return Layout(instances=n, total=total, local=total // n, hosts=hosts, per_host=n // len(hosts))


def build_command(args: argparse.Namespace, mpiexec: str, supervisor_env: Dict[str, str]) -> List[str]:
    """The mpiexec command: one section per instance, each with its own POPDIST_* variables."""
    lay = _layout(args)
    hosts, per_host = lay.hosts, lay.per_host
    # Hydra kills every instance as soon as one exits with an error; the others should rather learn
    # it from the supervisor and stop with an error naming it (poprun ends the launch if they do not:
    # _wait). -disable-auto-cleanup covers exit statuses, but not a process ended by a signal, so
    # each instance runs under a shell that turns its signal into a status (_INSTANCE_SHELL).
    cmd = [mpiexec, "-disable-auto-cleanup"]
    if hosts != ["localhost"]:
        cmd += ["-hosts", ",".join(hosts), "-ppn", str(per_host)]
    cmd += shlex.split(args.mpi_global_args)
    common = {"POPDIST_NUM_TOTAL_REPLICAS": lay.total, "POPDIST_NUM_LOCAL_REPLICAS": lay.local,
              "POPDIST_NUM_IPUS_PER_REPLICA": args.ipus_per_replica, **supervisor_env}
    if args.timeout is not None:
        common["POPDIST_TIMEOUT"] = args.timeout
    common["POPRUN_GRACE"] = args.grace
    if "OMP_NUM_THREADS" not in os.environ:
        common["OMP_NUM_THREADS"] = max(1, (os.cpu_count() or 1) // per_host)
    for name, value in common.items():
        cmd += ["-genv", name, str(value)]
    local_args = shlex.split(args.mpi_local_args)
    for i in range(lay.instances):
        if i:
            cmd.append(":")
        cmd += ["-n", "1", "-env", "POPDIST_REPLICA_INDEX_OFFSET", str(i * lay.local),
                "-env", "POPDIST_LOCAL_INSTANCE_INDEX", str(i % per_host), *local_args, *_INSTANCE_SHELL,
                *args.command]
    return cmd


def _topology(args: argparse.Namespace) -> str:
    lay = _layout(args)
    lines = [f"poprun: {lay.instances} instance(s) x {lay.local} replica(s) = {lay.total} replicas"]
    for i in range(lay.instances):
        first = i * lay.local
        lines.append(f"  instance {i} (MPI rank {i}) on {lay.hosts[i // lay.per_host]}: replicas "
                     f"{first}..{first + lay.local - 1}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        _parser().error("the program to run is missing (e.g. poprun --num-instances 2 python prog.py)")
    lay = _layout(args)
    one_host = lay.hosts == ["localhost"]
    supervisor = Supervisor(lay.instances, bind_host="127.0.0.1" if one_host else "0.0.0.0", grace=args.grace)
    advertised = args.supervisor_host or ("127.0.0.1" if one_host else socket.gethostname())
    cmd = build_command(args, find_mpiexec(), supervisor.environment(advertised))
    if args.print_topology == "yes":
        print(_topology(args), file=sys.stderr, flush=True)
    if args.verbose:
        print("poprun: " + shlex.join(cmd), file=sys.stderr, flush=True)
    supervisor.start()
    try:
        proc = subprocess.Popen(cmd)
    except OSError as e:
        supervisor.stop()
        raise SystemExit(f"poprun: could not start {cmd[0]}: {e}") from None
    try:
        status = _wait(proc, supervisor, args.grace)
    except KeyboardInterrupt:  # the instances got the Ctrl-C too (same process group)
        status = _wait(proc, supervisor, args.grace)
    supervisor.stop()
    summary = supervisor.summary()
    if summary and (status != 0 or supervisor.first_failure is not None):
        print(summary, file=sys.stderr, flush=True)
    if status == 0 and supervisor.first_failure is not None:
        status = 1
    return status


def _wait(proc: subprocess.Popen, supervisor: "Supervisor", grace: float) -> int:
    """mpiexec's exit status; ends the launch when instances still run well after one failed."""
    while True:
        try:
            return _status(proc.wait(timeout=0.2))
        except subprocess.TimeoutExpired:
            pass
        since = supervisor.trouble_since
        if since is not None and time.monotonic() - since > 2 * grace + 1:
            print(f"poprun: instances still running {2 * grace + 1:.0f} s after an instance failed or stopped; ending "
                  f"the launch.", file=sys.stderr, flush=True)
            proc.send_signal(signal.SIGTERM)
            try:
                return _status(proc.wait(timeout=5))
            except subprocess.TimeoutExpired:
                proc.kill()
                return _status(proc.wait())


def _status(code: int) -> int:
    return 128 - code if code < 0 else code  # a signal's number as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
