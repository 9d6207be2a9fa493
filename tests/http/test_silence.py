"""``acp_server.http.silence``: only this process's connections on the port that said
less than the HTTP/2 preface (nothing, or part of it) and were never answered are shut
down; one that said more, one that was answered, the listener, and connections on
other ports are left alone."""

from __future__ import annotations

import socket

import pytest

from acp_server.http.silence import SilentConnections, silent_for_ms, sweep_once

pytestmark = pytest.mark.skipif(not SilentConnections.supported(), reason="Linux only")


def _pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return client, server


def test_only_silent_connections_on_the_port_are_shut_down() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_server(("127.0.0.1", 0)) as other:
        port = listener.getsockname()[1]
        silent_client, silent = _pair(listener)
        stalled_client, stalled = _pair(listener)
        talking_client, talking = _pair(listener)
        answered_client, answered = _pair(listener)
        elsewhere_client, elsewhere = _pair(other)
        stalled_client.sendall(b"PRI * HTTP")               # part of the HTTP/2 preface
        assert stalled.recv(64) == b"PRI * HTTP"
        talking_client.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n")   # more than the preface
        assert talking.recv(64) == b"GET / HTTP/1.1\r\nHost: a\r\n"
        answered_client.sendall(b"G")
        assert answered.recv(1) == b"G"
        answered.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        assert answered_client.recv(64)                     # received: its ACK counts
        assert silent_for_ms(silent) is not None and silent_for_ms(stalled) is not None
        assert silent_for_ms(talking) is None and silent_for_ms(answered) is None
        assert sweep_once(port, timeout_ms=3_600_000) == 0   # not silent for long enough
        assert sweep_once(port, timeout_ms=0) == 2
        for client in (silent_client, stalled_client):
            client.settimeout(5)
            assert client.recv(1) == b""                    # the peer sees the end
        for client in (talking_client, answered_client):
            client.setblocking(False)
            with pytest.raises(BlockingIOError):            # still open, nothing to read
                client.recv(1)
        assert silent_for_ms(elsewhere) is not None         # another port: untouched
        elsewhere_client.setblocking(False)
        with pytest.raises(BlockingIOError):
            elsewhere_client.recv(1)
        for sock in (silent_client, silent, stalled_client, stalled, talking_client, talking,
                     answered_client, answered, elsewhere_client, elsewhere):
            sock.close()


def test_the_sweep_needs_no_descriptor_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the descriptor limit (``os.listdir`` and ``os.dup`` refused with EMFILE) the
    silent connection is still shut down, through its own descriptor, which stays the
    server's (open); the others are left alone."""
    import errno
    import os

    import acp_server.http.silence as silence

    def refused(*args: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        silent_client, silent = _pair(listener)
        talking_client, talking = _pair(listener)
        talking_client.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n")
        assert talking.recv(64)
        monkeypatch.setattr(silence.os, "listdir", refused)
        monkeypatch.setattr(silence.os, "dup", refused)
        assert sweep_once(port, timeout_ms=0) == 1
        monkeypatch.undo()
        silent_client.settimeout(5)
        assert silent_client.recv(1) == b""                 # shut down
        os.fstat(silent.fileno())                           # not closed under the server
        os.fstat(listener.fileno())
        talking_client.setblocking(False)
        with pytest.raises(BlockingIOError):
            talking_client.recv(1)
        for sock in (silent_client, silent, talking_client, talking):
            sock.close()


def test_a_descriptor_reused_for_no_socket_leaves_no_duplicate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection closed between the sweep's look at its number (a socket) and the
    duplicate, its number reused for a pipe: the duplicate is no socket, and is closed
    (it was kept open for the process's life, one more at each such sweep)."""
    import os

    import acp_server.http.silence as silence

    read, write = os.pipe()
    try:
        monkeypatch.setattr(silence.os, "readlink", lambda path: "socket:[1]")
        before = sorted(os.listdir("/proc/self/fd"))
        assert silence._connection_on(read, 1) is None
        monkeypatch.undo()
        assert sorted(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(read)
        os.close(write)
