"""The front layer's hot path for ``POST /session/{id}/prompt``: the same answers as
the route, byte for byte, and every other case handed to the route with its body
replayed (real HTTP, both backends)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from acp_server.http.front import (HOT_PATH_CHARS_KEPT, HOT_PATHS_KEPT, Door, FrontLayer,
                                   HotRoute)
from acp_server.http.policy import GuardPolicy
from bridge import BridgeOptions
from tests.rest.server import running_server, text_prompt

pytestmark = pytest.mark.anyio
CLIENT = "X-Qwen-Client-Id"   # the hot path leaves this header to the route


async def test_hot_and_routed_answers_are_the_same(tmp_path: Path) -> None:
    options = BridgeOptions(max_pending_prompts_per_session=1)
    async with running_server(tmp_path, options=options) as srv:
        created = await srv.create_session()
        sid, client = created["sessionId"], {CLIENT: created["clientId"]}
        held = await srv.prompt(sid, "/sleep 30s hold")
        assert held.status_code == 202
        assert set(held.json()) == {"promptId", "lastEventId", "eventEpoch"}
        hot = await srv.prompt(sid, "x")
        routed = await srv.client.post(f"/session/{sid}/prompt", json=text_prompt("x"),
                                       headers=client)
        assert hot.status_code == routed.status_code == 503
        assert hot.content == routed.content
        assert json.loads(hot.content)["code"] == "prompt_queue_full"
        strip = {"date", "server"}
        assert {k: v for k, v in hot.headers.items() if k not in strip} == \
            {k: v for k, v in routed.headers.items() if k not in strip}
        await srv.bridge.cancel_session(sid)


async def test_a_hot_answer_to_an_allowed_origin_gets_cors_and_the_next_does_not(
        tmp_path: Path) -> None:
    """The fast handler's 503 messages are built once and sent as they are: the CORS
    headers of one answer go into a new start message, never into the kept one."""
    origin = "http://app.example:3000"
    options = BridgeOptions(max_pending_prompts_per_session=1)
    async with running_server(tmp_path, options=options, allow_origins=(origin,)) as srv:
        created = await srv.create_session()
        sid, client = created["sessionId"], {CLIENT: created["clientId"]}
        assert (await srv.prompt(sid, "/sleep 30s hold")).status_code == 202
        path, body = f"/session/{sid}/prompt", text_prompt("x")
        plain = await srv.client.post(path, json=body)
        hot = await srv.client.post(path, json=body, headers={"Origin": origin})
        routed = await srv.client.post(path, json=body, headers={"Origin": origin, **client})
        again = await srv.client.post(path, json=body)
        assert plain.status_code == hot.status_code == routed.status_code == 503
        assert hot.headers["access-control-allow-origin"] == origin
        strip = {"date", "server"}
        assert {k: v for k, v in hot.headers.items() if k not in strip} == \
            {k: v for k, v in routed.headers.items() if k not in strip}
        assert "access-control-allow-origin" not in plain.headers
        assert [k for k, _ in again.headers.items()] == [k for k, _ in plain.headers.items()]
        assert again.content == plain.content == hot.content
        await srv.bridge.cancel_session(sid)


@pytest.mark.parametrize(("body", "status"), [
    (b"{not json", 400), (b"", 400), (b'{"prompt": []}', 400), (b"[1]", 400),
    (b'{"prompt": [{"type": "text", "text": "ok"}], "deadlineMs": -1}', 400),
])
async def test_declined_cases_get_the_routes_answer(tmp_path: Path, body: bytes,
                                                    status: int) -> None:
    async with running_server(tmp_path) as srv:
        created = await srv.create_session()
        sid, client = created["sessionId"], {CLIENT: created["clientId"]}
        headers = {"Content-Type": "application/json"}
        hot = await srv.client.post(f"/session/{sid}/prompt", content=body, headers=headers)
        routed = await srv.client.post(f"/session/{sid}/prompt", content=body,
                                       headers={**headers, **client})
        assert hot.status_code == routed.status_code == status, hot.text
        assert hot.content == routed.content


async def test_unknown_session_large_and_chunked_bodies(tmp_path: Path) -> None:
    async with running_server(tmp_path) as srv:
        missing = await srv.prompt("no-such-session", "hi")
        assert missing.status_code == 404 and missing.json()["code"]
        sid = (await srv.create_session())["sessionId"]
        big = await srv.prompt(sid, "y" * (2 << 20))   # past the hot path's body bound
        assert big.status_code == 202

        async def chunks():   # a chunked body in several messages
            for part in (b'{"prompt": [{"type": "text", ', b'"text": "in parts"}]}'):
                yield part

        chunked = await srv.client.post(f"/session/{sid}/prompt", content=chunks(),
                                        headers={"Content-Type": "application/json"})
        assert chunked.status_code == 202
        metrics = (await srv.client.get("/metrics")).text
        assert 'route="/session/{session_id}/prompt",status="202"' in metrics
        assert 'route="/session/{session_id}/prompt",status="404"' in metrics


DOOR_SETS = [
    ("/lmsp/", "/acp", "/metrics", "/openapi.json", ""),   # the app's doors
    ("/a", "/a/", "/b", ""),                              # the first of a segment wins
    ("", "/a"),                                           # nothing after a "" door
    ("/a", "/b"),                                         # no "" door: the last door
    ("/a/b", "/c", ""),                                   # two segments: the scan
]
PATHS = ["/", "", "/lmsp", "/lmsp/", "/lmsp/v1/tasks", "/lmspx", "/acp", "/acp/x", "/acpx",
         "/metrics", "/metrics/", "/openapi.json", "/openapi.jsonx", "/a", "/a/", "/a/b",
         "/a/b/c", "/ab", "/b", "/c/d", "//a", "/session/x/prompt", "/%2Facp"]


@pytest.mark.parametrize("prefixes", DOOR_SETS)
def test_door_lookup_is_the_first_matching_door(prefixes: tuple[str, ...]) -> None:
    """``door_of``'s lookup by the first segment chooses what the scan in order does."""
    from acp_server.http.front import Door, FrontLayer

    doors = [Door(prefix, f"door{i}", lambda refusal: (b"", b"")) for i, prefix in
             enumerate(prefixes)]
    front = FrontLayer(lambda *a: None, None, doors=doors)   # type: ignore[arg-type]
    for path in PATHS:
        scanned = next((door for door in doors if door.matches(path)), doors[-1])
        assert front.door_of(path) is scanned, (prefixes, path)


# -- in process: the observer's status, the hot-route memo ------------------------------------
START = {"type": "http.response.start", "status": 503,
         "headers": [(b"content-type", b"application/json")]}
END = {"type": "http.response.body", "body": b"{}"}
PROMPT_ROUTE = SimpleNamespace(path="/session/{session_id}/prompt")


class Statuses:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def stream_opened(self, door: str, scope: dict) -> None:
        pass

    def done(self, door: str, scope: dict, status: int, seconds: float,
             events: int | None) -> None:
        self.seen.append(status)


def hot_front(observer: Statuses | None = None) -> FrontLayer:
    async def handler(scope: dict, body: bytes) -> tuple[dict, dict]:
        return START, END

    doors = [Door("", "rest", lambda refusal: (b"application/json", b"{}"))]
    return FrontLayer(lambda *a: None, GuardPolicy(), doors=doors,   # type: ignore[arg-type]
                      observer=observer, hot=[HotRoute("POST", PROMPT_ROUTE, handler)])


def prompt_scope(path: str = "/session/s1/prompt", client: str = "127.0.0.1") -> dict:
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "client": (client, 5555),
            "headers": [(b"host", b"127.0.0.1"), (b"content-length", b"2")]}


@pytest.mark.parametrize("client", ["127.0.0.1", "192.0.2.7"])   # hot 503; refused 403
async def test_an_answer_whose_send_fails_is_recorded_with_its_status(client: str) -> None:
    """The client left: the send raises, the observer still sees the status answered
    (the hot path's 503, the policy's 403), not 500."""
    observer = Statuses()
    front = hot_front(observer)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        raise OSError("client gone")

    with pytest.raises(OSError):
        await front(prompt_scope(client=client), receive, send)
    assert observer.seen == [503 if client == "127.0.0.1" else 403]
    assert front.in_flight == 0


def test_the_hot_route_memo_keeps_short_paths_and_is_cleared_when_full() -> None:
    front = hot_front()
    for i in range(HOT_PATHS_KEPT):
        front._hot_route("POST", f"/session/s{i}/prompt")
    assert len(front._hot_seen) == HOT_PATHS_KEPT
    plan, params = front._hot_route("POST", "/session/next/prompt")   # type: ignore[misc]
    assert len(front._hot_seen) == 1 and params == {"session_id": "next"}
    again = front._hot_route("POST", "/session/next/prompt")
    assert again is not None and again[0] is plan and again[1] == params
    assert again[1] is not params   # a new dict each time: the route may change it
    assert front._hot_route("GET", "/session/next/prompt") is None
    long = "/session/" + "x" * HOT_PATH_CHARS_KEPT + "/prompt"
    matched = front._hot_route("POST", long)   # matched, not kept
    assert matched is not None and matched[1] == {"session_id": "x" * HOT_PATH_CHARS_KEPT}
    assert long not in front._hot_seen


def test_the_hot_route_memo_is_bounded_in_bytes() -> None:
    """Long distinct paths (a refused request fills the memo too) are matched, not kept:
    the memo's bytes stay bounded whatever the paths' length."""
    front = hot_front()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(HOT_PATHS_KEPT):
            front._hot_route("POST", f"/session/{i:06d}{'a' * 60_000}/prompt")
        long_paths = tracemalloc.get_traced_memory()[0] - before
        for i in range(HOT_PATHS_KEPT):   # the longest kept: the bound in bytes
            front._hot_route("POST", f"/session/{i:06d}{'a' * 200}/prompt")
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert long_paths < 64 << 10 and len(front._hot_seen) == HOT_PATHS_KEPT
    assert kept < 2 << 20   # ~1 MiB for 1024 paths of 222 characters


def test_a_hot_route_needs_a_literal_first_segment_and_one_segment_doors() -> None:
    async def handler(scope: dict, body: bytes) -> None:
        return None

    render = lambda refusal: (b"", b"")   # noqa: E731
    hot = HotRoute("POST", SimpleNamespace(path="/{session_id}/prompt"), handler)
    with pytest.raises(ValueError, match="must start with a literal segment"):
        FrontLayer(lambda *a: None, GuardPolicy(),   # type: ignore[arg-type]
                   doors=[Door("", "rest", render)], hot=[hot])
    hot = HotRoute("POST", PROMPT_ROUTE, handler)
    with pytest.raises(ValueError, match="one segment"):
        FrontLayer(lambda *a: None, GuardPolicy(),   # type: ignore[arg-type]
                   doors=[Door("/session/x", "a", render), Door("", "rest", render)], hot=[hot])


async def test_a_stray_path_is_asked_of_stray_alias_and_only_a_stray_one() -> None:
    """``stray_alias`` is asked about a path that would be a 404 (an empty or a dot
    segment), never about another one nor on the hot path; its answer is the path the
    app sees, for HTTP and WebSocket alike; ``None`` leaves the 404."""
    asked: list[str] = []
    seen: list[str] = []

    def stray_alias(path: str) -> str | None:
        asked.append(path)
        return "/acp" if path == "/workspaces//srv/ws/acp" else None

    async def app(scope: dict, receive: object, send: object) -> None:
        seen.append(scope["path"])

    async def handler(scope: dict, body: bytes) -> tuple[dict, dict]:
        return START, END

    answers: list[dict] = []

    async def send(message: dict) -> None:
        answers.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    front = FrontLayer(app, GuardPolicy(),   # type: ignore[arg-type]
                       doors=[Door("", "rest", lambda refusal: (b"application/json", b"{}"))],
                       hot=[HotRoute("POST", PROMPT_ROUTE, handler)],
                       aliases={"/workspaces/w1/acp": "/acp"}, stray_alias=stray_alias)
    for path in ("/workspaces//srv/ws/acp", "/workspaces/w1/acp", "/capabilities/",
                 "/session/s1/prompt", "/workspaces//srv/other/acp"):
        await front(prompt_scope(path), receive, send)
    await front({**prompt_scope("/workspaces//srv/ws/acp"), "type": "websocket"}, receive, send)
    assert asked == ["/workspaces//srv/ws/acp", "/workspaces//srv/other/acp",
                     "/workspaces//srv/ws/acp"]
    assert seen == ["/acp", "/acp", "/capabilities", "/acp"]
    assert [m["status"] for m in answers if m["type"] == "http.response.start"] == [503, 404]


def test_hot_routes_of_one_method_and_length_are_each_matched() -> None:
    """``POST /session/{id}/prompt`` (REST) and ``POST /lmsp/v1/tasks`` (LMSP) both
    have three segments: each path finds its own route, and neither hides the other."""
    async def handler(scope: dict, body: bytes) -> tuple[dict, dict]:
        return START, END

    render = lambda refusal: (b"application/json", b"{}")   # noqa: E731
    tasks = SimpleNamespace(path="/lmsp/v1/tasks")
    doors = [Door("/lmsp/", "lmsp", render), Door("", "rest", render)]
    front = FrontLayer(lambda *a: None, GuardPolicy(), doors=doors,   # type: ignore[arg-type]
                       hot=[HotRoute("POST", PROMPT_ROUTE, handler),
                            HotRoute("POST", tasks, handler)])
    prompt = front._hot_route("POST", "/session/s1/prompt")
    assert prompt is not None and prompt[0].hot.route is PROMPT_ROUTE
    assert prompt[1] == {"session_id": "s1"} and prompt[0].door.name == "rest"
    task = front._hot_route("POST", "/lmsp/v1/tasks")
    assert task is not None and task[0].hot.route is tasks and task[1] == {}
    assert task[0].door.name == "lmsp"
    for path in ("/lmsp/v1/responses", "/session/s1/other", "/lmsp/v2/tasks"):
        assert front._hot_route("POST", path) is None
