"""A forwarded request whose owner took it whole and gave no answer is told apart from
one that never reached the owner: ``owner_lost`` (it may have been carried out: a
client that sends it again may do it twice) against ``owner_unreachable`` (safe to
send again). The owners are real loopback sockets: one that reads the request to its
last byte and closes (an owner killed while it handled the request), one that reads
it and never answers (a paused owner, given up by its heartbeat), and a port where
nothing listens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from acp_server.fleet.forward import Forwarder, OwnerLostError, OwnerUnreachableError
from tests.harness import free_port
from tests.instances.test_forward_adopt import _pair
from tests.instances.test_leases import _session
from tests.store.test_session_restart import _prompt

pytestmark = pytest.mark.anyio
BODY = b'{"prompt": [{"type": "text", "text": "hello"}]}'


async def _read_request(stream: anyio.abc.ByteStream) -> bytes:
    """An HTTP/1.1 request, its head and its ``Content-Length`` body, whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += await stream.receive()
    return head + b"\r\n\r\n" + body


Owner = Callable[[anyio.abc.SocketStream, list[bytes]], Awaitable[None]]


async def _closes(stream: anyio.abc.SocketStream, taken: list[bytes]) -> None:
    taken.append(await _read_request(stream))
    await stream.aclose()   # no status line: as an owner killed mid-request


async def _silent(stream: anyio.abc.SocketStream, taken: list[bytes]) -> None:
    taken.append(await _read_request(stream))
    await anyio.sleep_forever()   # as a paused owner, whose kernel took the request


def _serve(owner: Owner, taken: list[bytes]) -> Callable[..., Awaitable[None]]:
    async def run(listener: anyio.abc.SocketListener, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await listener.serve(lambda stream: owner(stream, taken))
    return run


def _scope() -> dict[str, Any]:
    path = "/session/s/prompt"
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "client": ("127.0.0.1", 1),
            "headers": [(b"content-type", b"application/json")]}


async def _relay(url: str, taken: list[bytes] | None = None,
                 **limits: float) -> BaseException | None:
    """``Forwarder.relay`` of one prompt to ``url``: what it raised. The owner's
    heartbeat stops once it has ``taken`` the request (never given up before: a
    starved machine's watcher must not cut the write short)."""
    forwarder = Forwarder(instance="me", max_body_bytes=1 << 20, **limits)
    messages = [{"type": "http.request", "body": BODY}]
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Any) -> None:
        sent.append(message)

    async def alive() -> bool:
        return taken is None or not taken

    try:
        await forwarder.relay(url, _scope(), receive, send, alive=alive)
    except OwnerUnreachableError as exc:
        assert sent == []   # nothing relayed: the caller answers
        return exc
    finally:
        await forwarder.aclose()
    return None


@pytest.fixture
async def owner_at(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[bytes]]]:
    taken: list[bytes] = []
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener, \
            anyio.create_task_group() as tg:
        await tg.start(_serve(request.param, taken), listener)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        yield f"http://127.0.0.1:{port}", taken
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("owner_at", [_closes], indirect=True, ids=["closed"])
async def test_an_owner_that_took_the_request_and_closed_is_lost(
        owner_at: tuple[str, list[bytes]]) -> None:
    url, taken = owner_at
    raised = await _relay(url)
    assert isinstance(raised, OwnerLostError), raised
    assert len(taken) == 1 and taken[0].endswith(BODY)   # it had it all


@pytest.mark.parametrize("owner_at", [_silent], indirect=True, ids=["silent"])
async def test_an_owner_given_up_after_it_took_the_request_is_lost(
        owner_at: tuple[str, list[bytes]]) -> None:
    url, taken = owner_at
    raised = await _relay(url, taken, check_s=0.05)   # its heartbeat stopped: given up
    assert isinstance(raised, OwnerLostError), raised
    assert len(taken) == 1


async def test_an_owner_nothing_listens_for_is_unreachable_not_lost() -> None:
    raised = await _relay(f"http://127.0.0.1:{free_port()}")
    assert type(raised) is OwnerUnreachableError


@pytest.mark.parametrize("owner_at", [_closes], indirect=True, ids=["closed"])
async def test_the_rest_door_answers_owner_lost(tmp_path: Path,
                                                owner_at: tuple[str, list[bytes]]) -> None:
    """Through the fleet: the owner's lease is live, its URL a socket that takes the
    request and closes. The answer is a 503 ``owner_lost`` whose message says the
    request may have been carried out, not the ``owner_unreachable`` that invites
    sending it again."""
    url, taken = owner_at
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        a.server.leases.url = url   # type: ignore[union-attr]
        assert await a.bridge.journal.renew() == set()   # type: ignore[attr-defined]
        lost = await b.client.post(f"/session/{sid}/prompt", json=_prompt("x"))
        assert lost.status_code == 503, lost.text
        assert lost.json()["code"] == "owner_lost"
        assert "may have carried it out" in lost.json()["error"]
        assert lost.headers["retry-after"] == "5"
        assert len(taken) == 1 and b.server.fleet.stats.forward_failures == 1
