"""``/load`` answers are built whole in memory: their bytes in flight are bounded per
server (``acp_server.rest.budget``). A client that asks for a large history and does not
read it holds its answer; past the budget another ``/load`` is 503 ``server_busy``
(a small one still fits), and once the answer is read the budget is free again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.rest import budget as budget_module
from acp_server.rest.budget import BodyBudget
from tests.bridge.helpers import wait_until
from tests.rest.server import running_server, text_prompt

pytestmark = pytest.mark.anyio

BIG = 8 * 1024 * 1024   # a prompt's text: its echo and the reply make ~16 MiB of history


async def _filled(srv: Any, text: str) -> str:
    sid = (await srv.create_session(sessionScope="thread"))["sessionId"]
    accepted = await srv.client.post(f"/session/{sid}/prompt", json=text_prompt(text))
    assert accepted.status_code == 202, accepted.text
    await srv.events_until(sid, "turn_complete", last_event_id=0, timeout=60)
    return sid  # type: ignore[no-any-return]


async def test_load_answers_in_flight_are_bounded_in_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget_module, "LARGE_ANSWERS_BUDGET", 20 * 1024 * 1024, raising=False)
    made: list[BodyBudget] = []
    init = BodyBudget.__init__

    def recorded(self: BodyBudget, limit: int | None = None) -> None:
        init(self, limit)
        made.append(self)

    monkeypatch.setattr(BodyBudget, "__init__", recorded)
    async with running_server(tmp_path) as srv:
        [budget] = made
        big, small = await _filled(srv, "x" * BIG), await _filled(srv, "hello")
        port = int(srv.base_url.rsplit(":", 1)[1])
        stalled = await anyio.connect_tcp("127.0.0.1", port)
        await stalled.send(f"POST /session/{big}/load HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                           .encode())
        await wait_until(lambda: budget.used > 2 * BIG)   # its answer, unread, is held
        refused = await srv.client.post(f"/session/{big}/load", json={})
        assert refused.status_code == 503, refused.text
        assert refused.json() == {"error": "Too many large answers in flight; retry shortly",
                                  "code": "server_busy", "limit": 20 * 1024 * 1024}
        assert refused.headers["retry-after"] == "1"
        assert (await srv.client.post(f"/session/{small}/load", json={})).status_code == 200
        received = b""
        with anyio.fail_after(60):   # the stalled client reads its answer: the budget is free
            while b"\r\n\r\n" not in received:
                received += await stalled.receive(1 << 20)
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(body) < length:
                body += await stalled.receive(1 << 20)
        assert length > 2 * BIG
        await wait_until(lambda: budget.used == 0)
        await stalled.aclose()
        loaded = await srv.client.post(f"/session/{big}/load", json={})
        assert loaded.status_code == 200 and len(loaded.content) > 2 * BIG
        await wait_until(lambda: budget.used == 0)   # released once sent (not before)
        assert budget.refused == 1
