"""The front layer's hot answers written whole on uvicorn's HTTP/1.1 (``http.whole``),
over real sockets: the same bytes uvicorn would send, keep-alive kept or ended as the
request asks, pipelined requests answered in order, and whatever is not ours to write
whole left to uvicorn."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from acp_server.http.whole import send_whole
from tests.harness import ServeProcess

TOKEN = "whole-answer-token"
REFUSED = (b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
           b"content-length: 2\r\n\r\n{}")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("whole"), "--http-server", "uvicorn",
                      "--token", TOKEN) as child:
        yield child


def answers(port: int, request: bytes, count: int) -> tuple[list[bytes], bool]:
    """``count`` answers read off one connection after ``request``, and whether the
    server then closed it (read within 1 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data, found = b"", []
        while len(found) < count:
            chunk = sock.recv(65536)
            assert chunk, (found, data)
            data += chunk
            while (end := data.find(b"\r\n\r\n")) >= 0:
                head = data[:end].lower()
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(data) < end + 4 + length:
                    break
                found.append(data[:end + 4 + length])
                data = data[end + 4 + length:]
        sock.settimeout(1)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    return found, closed


def fields(answer: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    line, *rest = head.split(b"\r\n")
    return line, dict(field.split(b": ", 1) for field in rest), body


def test_a_refusal_in_one_piece_with_uvicorns_head(daemon: ServeProcess) -> None:
    [answer], closed = answers(daemon.port, REFUSED, 1)
    line, head, body = fields(answer)
    assert line == b"HTTP/1.1 401 Unauthorized" and not closed
    assert list(head)[:2] == [b"date", b"server"] and head[b"server"] == b"uvicorn"
    assert head[b"content-length"] == str(len(body)).encode()
    assert b"connection" not in head and body.startswith(b"{")


def test_pipelined_requests_are_answered_in_order(daemon: ServeProcess) -> None:
    health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    found, closed = answers(daemon.port, REFUSED + health + REFUSED, 3)
    assert [fields(a)[0].split()[1] for a in found] == [b"401", b"200", b"401"]
    assert not closed


@pytest.mark.parametrize("request_head", [
    REFUSED.replace(b"Host: 127.0.0.1\r\n", b"Host: 127.0.0.1\r\nConnection: close\r\n"),
    REFUSED.replace(b"HTTP/1.1", b"HTTP/1.0")])
def test_a_connection_not_kept_is_said_and_closed(daemon: ServeProcess,
                                                  request_head: bytes) -> None:
    [answer], closed = answers(daemon.port, request_head, 1)
    assert fields(answer)[1].get(b"connection") == b"close" and closed


class _Cycle:
    """Not uvicorn's cycle: ``send_whole`` must leave it the two messages."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send(self, message: dict[str, object]) -> None:
        self.sent.append(message)


@pytest.mark.anyio
async def test_another_servers_send_gets_the_two_messages() -> None:
    cycle = _Cycle()
    start = {"type": "http.response.start", "status": 503, "headers": []}
    end = {"type": "http.response.body", "body": b"x"}
    await send_whole(cycle.send, start, end)
    assert cycle.sent == [start, end]
