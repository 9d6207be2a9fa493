"""``DaemonClient`` sends a prompt again when its send got no answer: a connection
refused (a restart: it never arrived) or cut before the answer (a dropped network:
it may have been admitted, so only to a server with ``prompt_id_replay``). Against the
real daemon on loopback behind a real TCP proxy that refuses and cuts connections
(``tests.sdk.cutter``): the prompt runs once."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from acp_server.client import DaemonClient, DaemonConnectionError
from tests.sdk.cutter import cutter
from tests.sdk.harness import Daemon, daemon, wait_until, without_prompt_id_replay

pytestmark = pytest.mark.anyio


def _port(srv: Daemon) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def _turn_ends(srv: Daemon, sid: str, prompt_id: str) -> list[str]:
    return [t.terminal for t in srv.bridge.get_session(sid).prompt_terminals
            if t.prompt_id == prompt_id]


def _counting(path_end: str, seen: list[httpx.Request], then: dict[int, object]) -> object:
    """An httpx request hook: counts the requests whose path ends with ``path_end`` and
    awaits ``then[n]()`` before the n-th is sent."""
    async def hook(request: httpx.Request) -> None:
        if request.url.path.endswith(path_end):
            seen.append(request)
            step = then.get(len(seen))
            if step is not None:
                await step()   # type: ignore[operator]
    return hook


async def test_an_answer_cut_on_the_way_is_sent_again_and_runs_once(tmp_path: Path) -> None:
    async with daemon(tmp_path) as srv, cutter(_port(srv)) as proxy, \
            DaemonClient(proxy.url, max_retry_wait_s=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        proxy.cut_prompts = 1
        result = await client.prompt(sid, "/chunks 2 once")
        assert result.stop_reason == "end_turn"
        assert proxy.prompt_posts == 2   # the first was taken, its answer lost
        assert _turn_ends(srv, sid, result.prompt_id) == ["completed"]
        assert client.pending_prompt_count(sid) == 0


async def test_a_refused_connection_is_sent_again_once_the_server_is_back(
        tmp_path: Path) -> None:
    sends: list[httpx.Request] = []
    async with daemon(tmp_path) as srv, cutter(_port(srv)) as proxy:
        hook = _counting("/prompt", sends, {2: proxy.up})   # back before the second send
        async with DaemonClient(proxy.url, max_retry_wait_s=0,
                                event_hooks={"request": [hook]}) as client:
            sid = (await client.create_or_attach_session()).session_id
            await proxy.down()
            result = await client.prompt(sid, "/chunks 1 after the restart")
            assert len(sends) == 2 and proxy.prompt_posts == 1   # the first never arrived
            assert _turn_ends(srv, sid, result.prompt_id) == ["completed"]


async def test_a_cut_send_waits_for_the_server_to_say_it_replays(tmp_path: Path) -> None:
    """After the cut the server is unreachable: its features are asked again, and the
    prompt is sent again only once it answers."""
    asked: list[httpx.Request] = []
    async with daemon(tmp_path) as srv, cutter(_port(srv)) as proxy:
        hook = _counting("/capabilities", asked, {1: proxy.down, 2: proxy.up})
        async with DaemonClient(proxy.url, max_retry_wait_s=0,
                                event_hooks={"request": [hook]}) as client:
            sid = (await client.create_or_attach_session()).session_id
            proxy.cut_prompts = 1
            result = await client.prompt_nonblocking(sid, "/chunks 1 cut")
            assert len(asked) == 2 and proxy.prompt_posts == 2
            await wait_until(lambda: _turn_ends(srv, sid, result.prompt_id) == ["completed"])


async def test_every_send_refused_raises_the_connection_error(tmp_path: Path) -> None:
    async with daemon(tmp_path) as srv, cutter(_port(srv)) as proxy, \
            DaemonClient(proxy.url, max_retry_wait_s=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        await proxy.down()
        with pytest.raises(DaemonConnectionError, match="connection refused"):
            await client.prompt(sid, "/chunks 1 never")
        assert proxy.prompt_posts == 0 and client.pending_prompt_count(sid) == 0


async def test_a_server_without_the_feature_is_not_sent_a_cut_prompt_again(
        tmp_path: Path) -> None:
    """It may have taken it: sent again, it would run twice."""
    asked: list[str] = []
    async with daemon(tmp_path, wrap=lambda app: without_prompt_id_replay(app, asked)) as srv, \
            cutter(_port(srv)) as proxy, DaemonClient(proxy.url, max_retry_wait_s=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        proxy.cut_prompts = 1
        with pytest.raises(DaemonConnectionError):
            await client.prompt(sid, "/chunks 1 once")
        assert proxy.prompt_posts == 1 and asked == ["/capabilities"]
        assert client.pending_prompt_count(sid) == 0


def _hang_prompts(app: ASGIApp, release: anyio.Event) -> ASGIApp:
    """A prompt is taken, and its answer waits for ``release``."""
    async def hanging(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/prompt"):
            await app(scope, receive, send)
            return
        await release.wait()
        await app(scope, receive, send)
    return hanging


async def test_a_timed_out_send_is_not_sent_again(tmp_path: Path) -> None:
    """The server may still be working on it."""
    release = anyio.Event()
    async with daemon(tmp_path, wrap=lambda app: _hang_prompts(app, release)) as srv, \
            cutter(_port(srv)) as proxy, DaemonClient(proxy.url, timeout=0.3,
                                                       max_retry_wait_s=0) as client:
        sid = (await client.create_or_attach_session()).session_id
        with pytest.raises(DaemonConnectionError, match="timed out"):
            await client.prompt(sid, "/chunks 1 slow")
        assert proxy.prompt_posts == 1
        release.set()
