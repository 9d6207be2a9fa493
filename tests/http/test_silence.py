"""``acp_server.http.silence``: only this process's connections on the port that
received no byte are shut down; one that sent a byte, the listener, and connections on
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
        talking_client, talking = _pair(listener)
        elsewhere_client, elsewhere = _pair(other)
        talking_client.sendall(b"G")
        assert talking.recv(1) == b"G"
        assert silent_for_ms(silent) is not None and silent_for_ms(talking) is None
        assert sweep_once(port, timeout_ms=3_600_000) == 0   # not silent for long enough
        assert sweep_once(port, timeout_ms=0) == 1
        silent_client.settimeout(5)
        assert silent_client.recv(1) == b""                 # the peer sees the end
        talking_client.setblocking(False)
        with pytest.raises(BlockingIOError):                # still open, nothing to read
            talking_client.recv(1)
        assert silent_for_ms(elsewhere) is not None         # another port: untouched
        elsewhere_client.setblocking(False)
        with pytest.raises(BlockingIOError):
            elsewhere_client.recv(1)
        for sock in (silent_client, silent, talking_client, talking, elsewhere_client,
                     elsewhere):
            sock.close()
