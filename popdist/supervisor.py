"""The supervisor: how the instances of a poprun launch learn that one of them failed.

MPI alone cannot tell a process that a peer died: a message from a dead process simply never comes.
So poprun listens on a TCP socket, and every instance keeps a connection to it (address and a
one-off token in ``POPRUN_SUPERVISOR`` / ``POPRUN_TOKEN``). An instance says when it fails (an
uncaught exception, or a run that raised) and when it finishes; a connection that drops without
either is an instance that died (killed, crashed). The supervisor tells every other instance, whose
collectives then stop with ``popdist.InstanceError`` naming the instance instead of waiting forever,
and it holds a failed instance's exit (``release``) until the others have reacted, so that each
prints its own error before MPI's launcher tears the job down. At the end poprun prints which
instance failed first and why.

An instance first sends the token alone on a line; nothing it sends is parsed before the token
matched. Then messages are JSON objects, one per line:

- instance -> supervisor: ``{"hello": index, "pid", "host"}`` first, then ``{"failed": why}`` (this
  instance failed), ``{"stopped": why}`` (it stopped because of another's failure) or
  ``{"finished": why}`` (its program ended).
- supervisor -> instance: ``{"instance": index, "state": "failed" | "finished", "message": why}``
  and ``{"release": true}`` (to a failed instance: the others have reacted; exit now).

Connections are over the network when the launch spans hosts: the token keeps strangers out, lines
are bounded (``MAX_LINE``), and every message is checked against its form; a connection that breaks
any of these rules is dropped and logged, and the supervisor goes on serving the others.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

__all__ = ["ADDRESS_VAR", "TOKEN_VAR", "MAX_LINE", "Supervisor", "SupervisorClient", "InstanceRecord"]

ADDRESS_VAR = "POPRUN_SUPERVISOR"
TOKEN_VAR = "POPRUN_TOKEN"
MAX_LINE = 1 << 16  # bytes of one message line; longer texts are cut by the sender
_MAX_TEXT = 8192  # characters of a message's text ("why")
_STATES = ("failed", "stopped", "finished")


def _encode(message: dict) -> bytes:
    return (json.dumps(message) + "\n").encode()


def _text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + " [...]"


def _instance_message(message: Any, hello: bool) -> bool:
    """Whether ``message`` (parsed JSON from an authenticated instance) has one of the forms above."""
    if not isinstance(message, dict):
        return False
    if hello:
        return (set(message) == {"hello", "pid", "host"} and type(message["hello"]) is int
                and type(message["pid"]) is int and isinstance(message["host"], str))
    return len(message) == 1 and next(iter(message)) in _STATES and isinstance(next(iter(message.values())), str)


@dataclass
class InstanceRecord:
    """What the supervisor knows of one instance."""

    index: int
    pid: Optional[int] = None
    host: str = ""
    state: str = "starting"  # starting, running, failed, stopped, finished, died, ended (in the clean-up)
    message: str = ""
    when: float = 0.0

    def describe(self) -> str:
        where = f" (pid {self.pid} on {self.host})" if self.pid is not None else ""
        return f"instance {self.index}{where}"


@dataclass
class _Connection:
    sock: socket.socket
    peer: str = "?"
    buffer: bytes = b""
    authenticated: bool = False
    index: Optional[int] = None


class Supervisor:
    """The server side, run by poprun on a thread of its own (``start`` / ``stop``)."""

    def __init__(self, num_instances: int, bind_host: str = "127.0.0.1", grace: float = 5.0) -> None:
        self.token = secrets.token_hex(16)
        self.grace = grace
        self.records: List[InstanceRecord] = [InstanceRecord(i) for i in range(num_instances)]
        self.first_failure: Optional[InstanceRecord] = None  # the first to fail or die
        self.trouble_since: Optional[float] = None  # when an instance first failed, died or stopped
        self._server = socket.create_server((bind_host, 0))
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ)
        self._connections: Dict[socket.socket, _Connection] = {}
        self._by_index: Dict[int, _Connection] = {}
        self._waiting_release: Dict[int, float] = {}  # failed instance -> when its grace ends
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="poprun-supervisor", daemon=True)

    @property
    def port(self) -> int:
        return self._server.getsockname()[1]

    def environment(self, advertised_host: str) -> Dict[str, str]:
        """What each instance needs to reach the supervisor."""
        return {ADDRESS_VAR: f"{advertised_host}:{self.port}", TOKEN_VAR: self.token}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in list(self._connections.values()):
            conn.sock.close()
        self._server.close()

    # serving -------------------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                if key.fileobj is self._server:
                    try:
                        sock, address = self._server.accept()
                    except OSError:
                        continue
                    sock.setblocking(False)
                    self._connections[sock] = _Connection(sock, peer=f"{address[0]}:{address[1]}")
                    self._selector.register(sock, selectors.EVENT_READ)
                elif isinstance(key.fileobj, socket.socket):  # a client, registered above
                    conn = self._connections.get(key.fileobj)
                    if conn is None:
                        continue
                    try:
                        self._read(conn)
                    except Exception as e:  # whatever a peer sends, the others are still served
                        self._refuse(conn, f"{type(e).__name__}: {e}")
            self._release_due()

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            self._closed(conn)
            return
        conn.buffer += data
        while conn.sock in self._connections:
            end = conn.buffer.find(b"\n")
            limit = len(self.token) + 1 if not conn.authenticated else MAX_LINE
            if end < 0:
                if len(conn.buffer) >= limit:
                    self._refuse(conn, f"a line longer than {limit} bytes")
                return
            line, conn.buffer = conn.buffer[:end], conn.buffer[end + 1:]
            if not conn.authenticated:
                if not hmac.compare_digest(line, self.token.encode()):
                    self._refuse(conn, "a wrong token")
                    return
                conn.authenticated = True
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                self._refuse(conn, "a line that is not JSON")
                return
            if not _instance_message(message, hello=conn.index is None):
                self._refuse(conn, f"a message of an unknown form: {line[:200]!r}")
                return
            self._handle(conn, message)

    def _refuse(self, conn: _Connection, why: str) -> None:
        """Drop a connection that broke the protocol, saying so (a dropped instance counts as died)."""
        who = f"instance {conn.index}" if conn.index is not None else f"a connection from {conn.peer}"
        print(f"poprun: supervisor: dropped {who}: it sent {why}.", file=sys.stderr, flush=True)
        self._closed(conn)

    def _handle(self, conn: _Connection, message: dict) -> None:
        if conn.index is None:
            index = message["hello"]
            if not 0 <= index < len(self.records) or index in self._by_index:
                self._refuse(conn, f"hello {index}, which is not a free instance index")
                return
            conn.index = index
            self._by_index[index] = conn
            record = self.records[index]
            record.pid, record.host, record.state = message["pid"], _text(message["host"]), "running"
            # An instance that connects after another failed learns of it at once.
            for other in self.records:
                if other.state in ("failed", "died"):
                    self._send(conn, {"instance": other.index, "state": "failed", "message": self._why(other)})
            return
        (state, why), = message.items()
        self._set(self.records[conn.index], state, _text(why))

    def _closed(self, conn: _Connection) -> None:
        index = conn.index
        if index is not None:  # the record first: whoever sees the connection close sees it updated
            record = self.records[index]
            if record.state in ("running", "starting"):
                if self.trouble_since is not None:  # most likely ended by the launcher's clean-up
                    record.state = "ended"
                else:
                    self._set(record, "died", "its process ended without a word: killed by a signal, or crashed")
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        if self._connections.pop(conn.sock, None) is None:
            return  # dropped already
        self._selector.unregister(conn.sock)
        conn.sock.close()
        if conn.index is not None:
            self._by_index.pop(conn.index, None)
            self._waiting_release.pop(conn.index, None)

    def _set(self, record: InstanceRecord, state: str, message: str) -> None:
        record.state, record.message, record.when = state, message, time.monotonic()
        if state in ("failed", "died") and self.first_failure is None:
            self.first_failure = record
        if state in ("failed", "died", "stopped") and self.trouble_since is None:
            self.trouble_since = record.when
        if state in ("failed", "died"):
            notice = {"instance": record.index, "state": "failed", "message": self._why(record)}
            if state == "failed":
                self._waiting_release[record.index] = time.monotonic() + self.grace
        elif state == "finished":
            notice = {"instance": record.index, "state": "finished", "message": message}
        else:
            notice = None
        if notice is not None:
            for index, conn in list(self._by_index.items()):
                if index != record.index:
                    self._send(conn, notice)

    @staticmethod
    def _why(record: InstanceRecord) -> str:
        return f"{record.message} (pid {record.pid} on {record.host})" if record.pid is not None else record.message

    def _release_due(self) -> None:
        """Release failed instances once every other instance has reacted (or the grace is over)."""
        now = time.monotonic()
        settled = all(r.state not in ("running", "starting") or r.index in self._waiting_release
                      for r in self.records)
        for index, deadline in list(self._waiting_release.items()):
            if settled or now >= deadline:
                conn = self._by_index.get(index)
                if conn is not None:
                    self._send(conn, {"release": True})
                del self._waiting_release[index]

    def _send(self, conn: _Connection, message: dict) -> None:
        try:
            conn.sock.sendall(_encode(message))
        except OSError:
            pass  # its end shows up as a closed connection

    # the end -------------------------------------------------------------------------------------
    def summary(self) -> Optional[str]:
        """One paragraph on what went wrong, or None when no instance failed."""
        first = self.first_failure
        if first is None:  # no instance failed, but some stopped (a timeout, a divergence)
            stopped = [r for r in self.records if r.state == "stopped"]
            return "\n".join(f"poprun: {r.describe()} stopped: {r.message}" for r in stopped) or None
        verb = "failed" if first.state == "failed" else "died"
        others = [r for r in self.records if r is not first]
        stopped_ids = [r.index for r in others if r.state == "stopped"]
        tail = f" Instance(s) {stopped_ids} stopped because of it." if stopped_ids else ""
        return f"poprun: {first.describe()} {verb} first: {first.message}.{tail}"


class SupervisorClient:
    """An instance's connection to the supervisor. ``on_notice(index, state, message)`` runs on the
    client's reader thread for every notice about another instance."""

    def __init__(self, address: str, token: str, index: int,
                 on_notice: Callable[[int, str, str], None]) -> None:
        host, _, port = address.rpartition(":")
        self.index = index
        self._on_notice = on_notice
        self._released = threading.Event()
        self._sock = socket.create_connection((host, int(port)), timeout=30)
        self._sock.settimeout(None)
        self._send_lock = threading.Lock()
        with self._send_lock:
            self._sock.sendall(token.encode() + b"\n")
        self._send({"hello": index, "pid": os.getpid(), "host": socket.gethostname()})
        self._thread = threading.Thread(target=self._listen, name="popdist-supervisor", daemon=True)
        self._thread.start()

    def _send(self, message: dict) -> None:
        with self._send_lock:
            try:
                self._sock.sendall(_encode(message))
            except OSError:
                pass  # poprun is gone: nobody is left to tell

    def _listen(self) -> None:
        buffer = b""
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._released.set()  # nobody will release us: do not wait
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                    if message.get("release"):
                        self._released.set()
                    elif "instance" in message:
                        self._on_notice(int(message["instance"]), str(message["state"]), str(message["message"]))
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                    continue  # not from our supervisor: ignored

    def report(self, state: str, message: str) -> None:
        """Tell the supervisor this instance ``failed``, ``stopped`` or ``finished``."""
        self._send({state: _text(message)})

    def wait_release(self, timeout: float) -> bool:
        """After reporting a failure: wait (at most ``timeout`` s) until the others have reacted."""
        return self._released.wait(timeout)
