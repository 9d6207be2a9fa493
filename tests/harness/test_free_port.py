"""``free_port`` hands out ports the kernel does not hand out as source ports."""

from __future__ import annotations

import socket

from tests.harness.process import _ephemeral_low, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_can_be_listened_on():
    ports = {free_port() for _ in range(20)}
    assert all(15000 <= port < _ephemeral_low() for port in ports)
    assert len(ports) > 1                       # not one fixed port for every worker
    with socket.socket() as sock:
        port = ports.pop()
        sock.bind(("127.0.0.1", port))
        sock.listen()
