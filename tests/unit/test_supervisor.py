"""poprun's supervisor on its TCP port, faced with peers that are not instances of the launch: it
reads nothing before the token, bounds every line, checks every message's form, drops and logs a
connection that breaks a rule, and keeps reporting failures between the real instances."""
from __future__ import annotations

import json
import socket
import time
from typing import List, Tuple

import pytest

from popdist.supervisor import MAX_LINE, Supervisor, SupervisorClient


@pytest.fixture
def supervisor():
    sup = Supervisor(2, grace=0.5)
    sup.start()
    yield sup
    sup.stop()


def _raw(sup: Supervisor) -> socket.socket:
    return socket.create_connection(("127.0.0.1", sup.port), timeout=5)


def _closed_by_peer(sock: socket.socket, within: float = 5.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _failure_still_reported(sup: Supervisor) -> None:
    """Two genuine instances: 1 fails, 0 hears of it at once, naming 1."""
    heard: List[Tuple[int, str, str]] = []
    address = sup.environment("127.0.0.1")
    a = SupervisorClient(address["POPRUN_SUPERVISOR"], sup.token, 0, lambda *n: heard.append(n))
    b = SupervisorClient(address["POPRUN_SUPERVISOR"], sup.token, 1, lambda *n: None)
    b.report("failed", "raised ValueError: boom")
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        time.sleep(0.01)
    assert heard and heard[0][0] == 1 and heard[0][1] == "failed" and "boom" in heard[0][2]
    assert sup.first_failure is not None and sup.first_failure.index == 1
    assert b.wait_release(5)


@pytest.mark.parametrize("poison", [b"[]\n", b"[" * 100000 + b"\n", b'{"hello": 0, "pid": 1, "host": "x"}\n',
                                    b"x" * 100, b"\xff\xfe\n", b"\n"])
def test_nothing_is_parsed_before_the_token(supervisor, capfd, poison):
    sock = _raw(supervisor)
    sock.sendall(poison)
    assert _closed_by_peer(sock)
    assert "poprun: supervisor: dropped a connection from 127.0.0.1:" in capfd.readouterr().err
    assert supervisor._thread.is_alive()
    assert all(r.state == "starting" for r in supervisor.records)
    _failure_still_reported(supervisor)


def test_a_sender_without_newlines_is_not_buffered_without_limit(supervisor, capfd):
    sock = _raw(supervisor)
    sock.sendall(supervisor.token.encode() + b"\n")
    try:
        for _ in range(MAX_LINE // 4096 + 2):
            sock.sendall(b"a" * 4096)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert _closed_by_peer(sock)
    assert f"a line longer than {MAX_LINE} bytes" in capfd.readouterr().err
    _failure_still_reported(supervisor)


@pytest.mark.parametrize("message", [b"[]", b"[" * 100000, b'{"hello": "0", "pid": 1, "host": "x"}',
                                     b'{"hello": 0, "pid": 1}', b'{"hello": 7, "pid": 1, "host": "x"}',
                                     b'{"failed": "before hello"}', b"not json"])
def test_after_the_token_every_message_is_checked(supervisor, capfd, message):
    sock = _raw(supervisor)
    sock.sendall(supervisor.token.encode() + b"\n" + message + b"\n")
    assert _closed_by_peer(sock)
    assert "poprun: supervisor: dropped" in capfd.readouterr().err
    assert supervisor._thread.is_alive()
    _failure_still_reported(supervisor)


def test_an_instance_that_sends_a_bad_message_counts_as_died(supervisor, capfd):
    sock = _raw(supervisor)
    sock.sendall(supervisor.token.encode() + b"\n" + json.dumps({"hello": 0, "pid": 5, "host": "h"}).encode() + b"\n")
    time.sleep(0.2)
    sock.sendall(b'{"failed": ["not", "text"]}\n')
    assert _closed_by_peer(sock)
    assert "dropped instance 0: it sent a message of an unknown form" in capfd.readouterr().err
    assert supervisor.records[0].state == "died" and supervisor.first_failure.index == 0


def test_long_failure_texts_are_cut_and_still_delivered(supervisor):
    heard: List[Tuple[int, str, str]] = []
    address = supervisor.environment("127.0.0.1")["POPRUN_SUPERVISOR"]
    SupervisorClient(address, supervisor.token, 0, lambda *n: heard.append(n))
    b = SupervisorClient(address, supervisor.token, 1, lambda *n: None)
    b.report("failed", "x" * (4 * MAX_LINE))
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        time.sleep(0.01)
    assert heard and heard[0][2].startswith("x" * 100) and "[...]" in heard[0][2] and len(heard[0][2]) < MAX_LINE
