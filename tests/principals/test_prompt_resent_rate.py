"""A REST prompt sent again under its ``promptId`` passes the rate limit (it admits
nothing new: its replay answers), over real loopback HTTP with a stored token; any
other prompt past the limit is still 429."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.client import CreateSessionRequest, DaemonClient
from tests.principals.helpers import bearer, mint
from tests.sdk.cutter import cutter
from tests.rest.server import RunningServer, running_server

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"


class Frozen:
    """A clock that does not move: rate-limit buckets never refill."""

    def __call__(self) -> float:
        return 100.0


def named(text: str, prompt_id: str, **extra: Any) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}], "promptId": prompt_id, **extra}


def serving(tmp_path: Path, **settings: Any) -> Any:
    return running_server(tmp_path, token=BOOT, headers=bearer(BOOT),
                          principals_clock=Frozen(), rate_limit_prompt=1, **settings)


async def _session(srv: RunningServer, headers: dict[str, str]) -> dict[str, Any]:
    created = await srv.client.post("/session", json={"sessionScope": "thread"},
                                    headers=headers)
    assert created.status_code == 200, created.text
    return created.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("via", ["fast", "route"])
async def test_a_prompt_sent_again_passes_the_rate_limit(tmp_path: Path, via: str) -> None:
    async with serving(tmp_path) as srv:
        ci = bearer(await mint(srv.server, "ci"))
        created = await _session(srv, ci)
        sid = created["sessionId"]
        # with X-Qwen-Client-Id the route answers, without it the front's fast handler
        headers = {**ci, "X-Qwen-Client-Id": created["clientId"]} if via == "route" else ci
        first = await srv.client.post(f"/session/{sid}/prompt", headers=headers,
                                      json=named("/sleep 60s held", "p1"))
        assert first.status_code == 202, first.text
        again = await srv.client.post(f"/session/{sid}/prompt", headers=headers,
                                      json=named("/sleep 60s held", "p1"))
        assert again.status_code == 202, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        # a new id, or none, is a new prompt: refused for the rate as before
        for body in (named("other", "p2"), {"prompt": [{"type": "text", "text": "x"}]}):
            refused = await srv.client.post(f"/session/{sid}/prompt", headers=headers,
                                            json=body)
            assert refused.status_code == 429, refused.text
            assert refused.json()["code"] == "rate_limit_exceeded"
        listed = (await srv.client.get(f"/session/{sid}/pending-prompts", headers=ci)).json()
        assert [p["promptId"] for p in listed["pendingPrompts"]] == ["p1"]
        await srv.client.post(f"/session/{sid}/cancel", headers=ci)


async def test_an_ended_prompt_sent_again_answers_its_end(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        ci = bearer(await mint(srv.server, "ci"))
        sid = (await _session(srv, ci))["sessionId"]
        first = await srv.client.post(f"/session/{sid}/prompt", headers=ci,
                                      json=named("/chunks 1 x", "p1"))
        assert first.status_code == 202, first.text
        await srv.events_until(sid, lambda kind, data: kind == "turn_complete"
                               and data.get("promptId") == "p1", last_event_id=0, headers=ci)
        again = await srv.client.post(f"/session/{sid}/prompt", headers=ci,
                                      json=named("/chunks 1 x", "p1"))
        assert again.status_code == 200, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert (again.json()["promptId"], again.json()["terminal"]) == ("p1", "completed")


async def test_what_is_not_a_replay_stays_refused(tmp_path: Path) -> None:
    """Another principal's session (no 404 leaks past the 429), a body over the cap,
    a malformed body: 429, the body left to nobody."""
    async with serving(tmp_path, max_body_bytes=4096) as srv:
        ci = bearer(await mint(srv.server, "ci"))
        other = bearer(await mint(srv.server, "other"))
        sid = (await _session(srv, ci))["sessionId"]
        assert (await srv.client.post(f"/session/{sid}/prompt", headers=ci,
                                      json=named("/sleep 60s held", "p1"))).status_code == 202
        assert (await srv.client.post(f"/session/{sid}/prompt", headers=other,
                                      json=named("x", "p0"))).status_code == 404
        refused = await srv.client.post(f"/session/{sid}/prompt", headers=other,
                                        json=named("/sleep 60s held", "p1"))
        assert refused.status_code == 429, refused.text
        big = named("y" * 8000, "p1")
        assert (await srv.client.post(f"/session/{sid}/prompt", headers=ci,
                                      json=big)).status_code == 429
        bad = await srv.client.post(f"/session/{sid}/prompt", headers=ci,
                                    content=b'{"promptId": "p1", "prompt": [')
        assert bad.status_code == 429
        # the replay still passes on the same connection
        again = await srv.client.post(f"/session/{sid}/prompt", headers=ci,
                                      json=named("/sleep 60s held", "p1"))
        assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
        await srv.client.post(f"/session/{sid}/cancel", headers=ci)


async def test_the_sdks_resend_after_a_cut_is_not_refused(tmp_path: Path) -> None:
    """The SDK sends its prompt again under its id after the answer was cut on the way
    (``tests.sdk.cutter``): with the token's one prompt a minute spent by the first
    send, the second was 429 (``DaemonRateLimitError``) of a prompt its agent ran."""
    async with serving(tmp_path) as srv, \
            cutter(int(srv.base_url.rsplit(":", 1)[1])) as proxy:
        token = await mint(srv.server, "ci")
        async with DaemonClient(proxy.url, token=token, max_retry_wait_s=0) as client:
            sid = (await client.create_or_attach_session(
                CreateSessionRequest(session_scope="thread"))).session_id
            proxy.cut_prompts = 1
            result = await client.prompt(sid, "/chunks 1 once")
            assert result.stop_reason == "end_turn"
            assert proxy.prompt_posts == 2   # the first was taken, its answer lost
            terminals = [t.terminal for t in srv.bridge.get_session(sid).prompt_terminals
                         if t.prompt_id == result.prompt_id]
            assert terminals == ["completed"]   # it ran once
