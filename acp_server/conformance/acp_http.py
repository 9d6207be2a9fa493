"""The ``acp-http`` suite: ACP JSON-RPC over Streamable HTTP and WebSocket at ``/acp``.

    await run_acp_http(ctx)     # records every ``acp-http.*`` check in ctx

Each scenario opens its own connection (``initialize``) and deletes it afterwards.
``session/new`` uses the target's ``workspaceCwd`` from ``/capabilities``. A WebSocket
upgrade refused 429, or a message on it that is a rate limit's JSON-RPC error, stops
the run (``context.RateLimited``), as a 429 over HTTP does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from httpx_ws import WebSocketDisconnect, WebSocketUpgradeError, aconnect_ws

from acp_server.conformance.backpressure import fill, limit_of
from acp_server.conformance.context import (ORIGIN_META, CheckFailed, Context, Skip, Stream,
                                            describe, is_rate_limit, rate_limit_of)

PATH = "/acp"
JSON = {"Content-Type": "application/json"}
WS_MAX_MESSAGE = 64 * 1024 * 1024
SETTLE_READS_S = 2.0   # the bound on reading what the runner's sockets already hold


def rpc(rpc_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if rpc_id is not None:
        message["id"] = rpc_id
    if params is not None:
        message["params"] = params
    return message


INITIALIZE = rpc(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {},
                                   "clientInfo": {"name": "acp-server-conformance",
                                                  "version": "1"}})


def cwd(ctx: Context) -> str:
    return str((ctx.capabilities or {}).get("workspaceCwd") or "/")


def new_params(ctx: Context) -> dict[str, Any]:
    """``session/new`` params: the target's workspace, labelled as the runner's."""
    return {"cwd": cwd(ctx), "mcpServers": [], "_meta": ORIGIN_META}


def text(value: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": value}]


async def post(ctx: Context, conn: str | None, message: Any, session: str | None = None,
               **headers: str) -> httpx.Response:
    sent = {**JSON, **headers}
    if conn is not None:
        sent["Acp-Connection-Id"] = conn
    if session is not None:
        sent["Acp-Session-Id"] = session
    return await ctx.request("POST", PATH, content=json.dumps(message), headers=sent)


async def initialize(ctx: Context) -> tuple[str, httpx.Response]:
    response = await post(ctx, None, INITIALIZE)
    conn = response.headers.get("acp-connection-id")
    if response.status_code != 200 or not conn:
        raise CheckFailed(f"initialize failed: {describe(response, headers=('acp-connection-id',))}")
    ctx.later(lambda: ctx.request("DELETE", PATH, headers={"Acp-Connection-Id": conn}))
    return conn, response


def open_stream(ctx: Context, conn: str, session: str | None = None,
                expect: int | None = 200) -> Any:
    headers = {"Acp-Connection-Id": conn}
    if session is not None:
        headers["Acp-Session-Id"] = session
    return ctx.stream("GET", PATH, headers=headers, expect=expect)


async def accepted(ctx: Context, conn: str, message: Any, session: str | None = None) -> None:
    response = await post(ctx, conn, message, session)
    if response.status_code != 202:
        raise CheckFailed(f"not accepted: {describe(response)}")


def close_later(ctx: Context, sid: str, conn: str | None = None) -> None:
    """Close a session the runner made when the scenario ends, however it ends:
    ``session/close`` on its connection (cleanups run newest first, so before the
    connection's DELETE), and ``DELETE /session/{id}`` where the target has REST (a
    deleted ``/acp`` connection only detaches its sessions)."""
    async def close() -> None:
        if conn is not None:
            with contextlib.suppress(httpx.HTTPError):
                await post(ctx, conn, rpc(f"close-{sid}", "session/close", {"sessionId": sid}))
        if ctx.capabilities is not None:
            await ctx.request("DELETE", f"/session/{sid}")
    ctx.later(close)


async def new_session(ctx: Context, conn: str, stream: Stream, rpc_id: Any) -> str:
    await accepted(ctx, conn, rpc(rpc_id, "session/new", new_params(ctx)))
    reply = await stream.wait_for(stream.rpc_reply(rpc_id))
    sid = (reply.data.get("result") or {}).get("sessionId")
    if not sid:
        raise CheckFailed(f"session/new answered {reply.data}")
    close_later(ctx, str(sid), conn)
    return str(sid)


def _is_update(session_id: str) -> Any:
    return lambda f: isinstance(f.data, dict) and f.data.get("method") == "session/update" \
        and (f.data.get("params") or {}).get("sessionId") == session_id


async def check_flow(ctx: Context) -> None:
    ids = ("acp-http.initialize", "acp-http.post.accepted", "acp-http.stream.connection",
           "acp-http.stream.session")
    async with ctx.checking(*ids):
        response = await post(ctx, None, INITIALIZE)
        conn = response.headers.get("acp-connection-id")
        body = response.json() if response.status_code == 200 else None
        ok = bool(conn) and isinstance(body, dict) and body.get("id") == 0 \
            and isinstance(body.get("result"), dict)
        ctx.expect(ids[0], ok, describe(response, headers=("acp-connection-id",)))
        if not conn:
            raise Skip("no connection")
        ctx.later(lambda: ctx.request("DELETE", PATH, headers={"Acp-Connection-Id": conn}))
        async with open_stream(ctx, conn) as connection:
            created = await post(ctx, conn, rpc(1, "session/new", new_params(ctx)))
            ctx.expect(ids[1], created.status_code == 202 and created.content == b"",
                       describe(created))
            await accepted(ctx, conn, rpc("conformance-2", "_conformance/unknown", {}))
            reply = await connection.wait_for(connection.rpc_reply(1))
            other = await connection.wait_for(connection.rpc_reply("conformance-2"))
            sid = (reply.data.get("result") or {}).get("sessionId")
            if sid:
                close_later(ctx, str(sid), conn)
            ctx.expect(ids[2], bool(sid) and ("result" in other.data or "error" in other.data),
                       f"reply to session/new (id 1): {reply.data}; to an unknown extension "
                       f"method (id 'conformance-2'): {other.data}")
            if not sid:
                raise Skip("no session")
            async with open_stream(ctx, conn, sid) as session:
                await accepted(ctx, conn, rpc(2, "session/prompt", {
                    "sessionId": sid, "prompt": text(ctx.options.quick_prompt)}), sid)
                answer = await session.wait_for(session.rpc_reply(2),
                                                timeout=ctx.options.settle_timeout_s)
                updates = [f for f in session.frames if _is_update(sid)(f)]
                ok = "stopReason" in (answer.data.get("result") or {}) and bool(updates)
                ctx.expect(ids[3], ok, f"session stream: {len(updates)} session/update, reply "
                                       f"to session/prompt (id 2): {answer.data}")


async def check_statuses(ctx: Context) -> None:
    conn = ""
    async with ctx.checking("acp-http.status.415", "acp-http.status.406", "acp-http.status.400",
                            "acp-http.status.404", "acp-http.status.409", "acp-http.status.501",
                            "acp-http.status.413"):
        conn, _ = await initialize(ctx)
    if not conn:
        return
    async with ctx.checking("acp-http.status.415"):
        response = await ctx.request("POST", PATH, content=json.dumps(rpc(1, "session/list", {})),
                                     headers={"Content-Type": "text/plain",
                                              "Acp-Connection-Id": conn})
        ctx.expect("acp-http.status.415", response.status_code == 415, describe(response))
    async with ctx.checking("acp-http.status.406"):
        response = await ctx.request("GET", PATH, headers={"Accept": "application/json",
                                                           "Acp-Connection-Id": conn})
        ctx.expect("acp-http.status.406", response.status_code == 406, describe(response))
    async with ctx.checking("acp-http.status.400"):
        response = await post(ctx, None, rpc(1, "session/list", {}))
        ctx.expect("acp-http.status.400", response.status_code == 400, describe(response))
    async with ctx.checking("acp-http.status.404"):
        response = await post(ctx, "00000000-0000-4000-8000-00000000dead",
                              rpc(1, "session/list", {}))
        ctx.expect("acp-http.status.404", response.status_code == 404, describe(response))
    async with ctx.checking("acp-http.status.501"):
        response = await post(ctx, conn, [rpc(1, "session/list", {}), rpc(2, "session/list", {})])
        ctx.expect("acp-http.status.501", response.status_code == 501, describe(response))
    async with ctx.checking("acp-http.status.409"):
        async with open_stream(ctx, conn):
            async with open_stream(ctx, conn, expect=None) as second:
                status = second.response.status_code
                ctx.expect("acp-http.status.409", status == 409,
                           f"a second GET /acp connection stream for {conn}: {status} "
                           f"{second.response.text[:200] if second.ended else ''}")
    async with ctx.checking("acp-http.status.413"):
        size = ctx.options.oversize_bytes
        payload = b'{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"pad":"' \
            + b"x" * size + b'"}}'
        response = await ctx.request("POST", PATH, content=payload,
                                     headers={**JSON, "Acp-Connection-Id": conn})
        ctx.expect("acp-http.status.413", response.status_code == 413,
                   f"sent POST /acp of {len(payload)} bytes; saw {response.status_code} "
                   f"{response.text[:200]}")


async def check_delete(ctx: Context) -> None:
    async with ctx.checking("acp-http.delete"):
        conn, _ = await initialize(ctx)
        deleted = await ctx.request("DELETE", PATH, headers={"Acp-Connection-Id": conn})
        after = await post(ctx, conn, rpc(1, "session/list", {}))
        ctx.expect("acp-http.delete", deleted.status_code == 202 and after.status_code == 404,
                   f"{describe(deleted)}; then {describe(after)}")


@contextlib.asynccontextmanager
async def websocket(ctx: Context) -> AsyncIterator[Any]:
    url = ctx.base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + PATH
    try:
        async with aconnect_ws(url, ctx.client, max_message_size_bytes=WS_MAX_MESSAGE,
                               keepalive_ping_interval_seconds=None) as ws:
            yield ws
    except WebSocketUpgradeError as exc:
        if is_rate_limit(exc.response):
            raise ctx.rate_limited(exc.response) from None
        raise


async def ws_message(ctx: Context, ws: Any) -> Any:
    """The next message on the WebSocket, decoded; a rate limit's error stops the run."""
    message = json.loads(await ws.receive_text())
    if rate_limit_of(message) is not None:
        raise ctx.rate_limited(where=f"a WebSocket message on {PATH}", body=message)
    return message


async def ws_reply(ctx: Context, ws: Any, rpc_id: Any, timeout: float | None = None
                   ) -> dict[str, Any]:
    with anyio.fail_after(timeout or ctx.options.timeout_s):
        while True:
            message = await ws_message(ctx, ws)
            if isinstance(message, dict) and message.get("id") == rpc_id \
                    and "method" not in message:
                return message  # type: ignore[no-any-return]


async def check_websocket(ctx: Context) -> None:
    check = "acp-http.websocket"
    async with ctx.checking(check):
        try:
            async with websocket(ctx) as ws:
                await ws.send_text(json.dumps(INITIALIZE))
                init = await ws_reply(ctx, ws, 0)
                if "result" not in init:
                    raise CheckFailed(f"initialize over WebSocket answered {init}")
                await ws.send_text(json.dumps(rpc(1, "session/new", new_params(ctx))))
                created = await ws_reply(ctx, ws, 1)
                sid = (created.get("result") or {}).get("sessionId")
                if not sid:
                    raise CheckFailed(f"session/new over WebSocket answered {created}")
                close_later(ctx, str(sid))
                await ws.send_text(json.dumps(rpc(2, "session/prompt", {
                    "sessionId": sid, "prompt": text(ctx.options.quick_prompt)})))
                answer = await ws_reply(ctx, ws, 2, ctx.options.settle_timeout_s)
                ctx.expect(check, "stopReason" in (answer.get("result") or {}),
                           f"session/prompt over WebSocket answered {answer}")
        except (WebSocketDisconnect, OSError) as exc:
            raise CheckFailed(f"WebSocket on {PATH}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:   # httpx_ws upgrade refusals
            if type(exc).__module__.startswith("httpx_ws"):
                raise CheckFailed(f"WebSocket upgrade on {PATH}: {exc!r}") from exc
            raise


async def check_load(ctx: Context) -> None:
    """Over HTTP the session stream is opened before ``session/load`` (as the TS client
    does); a server that refuses that stream is tried on the WebSocket profile, where
    everything shares one ordered channel."""
    check = "acp-http.load.history-first"
    marker = "conformance history probe"
    async with ctx.checking(check):
        conn, init = await initialize(ctx)
        if not (init.json().get("result") or {}).get("agentCapabilities", {}).get("loadSession"):
            raise Skip("the agent does not advertise loadSession")
        async with open_stream(ctx, conn) as connection:
            sid = await new_session(ctx, conn, connection, 1)
            async with open_stream(ctx, conn, sid) as session:
                await accepted(ctx, conn, rpc(2, "session/prompt", {
                    "sessionId": sid, "prompt": text(f"{ctx.options.quick_prompt} {marker}")}),
                    sid)
                await session.wait_for(session.rpc_reply(2), timeout=ctx.options.settle_timeout_s)
        load = rpc(3, "session/load", {"sessionId": sid, "cwd": cwd(ctx), "mcpServers": []})
        again, _ = await initialize(ctx)
        async with open_stream(ctx, again) as connection:
            async with open_stream(ctx, again, sid, expect=None) as session:
                if session.response.status_code == 200:
                    await accepted(ctx, again, load, sid)
                    reply = await connection.wait_for(connection.rpc_reply(3),
                                                      timeout=ctx.options.settle_timeout_s)
                    # ahead of the answer on its own stream: in order for certain
                    before = [f.data for f in connection.frames
                              if _is_update(sid)(f) and f.seq < reply.seq]
                    before += await _delivered_with(session, sid)
                    _judge_load(ctx, marker, reply.data, before, "over HTTP")
                    return
                refused = (f"GET /acp with Acp-Session-Id before session/load answered "
                           f"{session.response.status_code} {session.response.text[:160]}")
        async with websocket(ctx) as ws:
            await ws.send_text(json.dumps(INITIALIZE))
            await ws_reply(ctx, ws, 0)
            await ws.send_text(json.dumps(load))
            before = []
            with anyio.fail_after(ctx.options.settle_timeout_s):
                while True:
                    message = await ws_message(ctx, ws)
                    if isinstance(message, dict) and message.get("id") == 3 \
                            and "method" not in message:
                        break
                    if isinstance(message, dict) and message.get("method") == "session/update":
                        before.append(message)
            _judge_load(ctx, marker, message, before, f"over WebSocket ({refused})")


async def _delivered_with(session: Stream, sid: str) -> list[Any]:
    """The session stream's updates delivered to the runner by the time the answer (on
    the connection stream, another TCP connection) was read. Two streams' frames
    reach the runner in no order it can tell apart (a loaded machine wakes the
    connection's reader first: CI saw "before the answer: 0"), so what the session
    stream's socket already holds is read before judging: rounds of every task idle,
    then one turn of the loop (asyncio: a reader resumes reading only when it waits,
    so idle is not yet read), until a round brings no frame (within a bound)."""
    with anyio.move_on_after(SETTLE_READS_S):
        seen = -1
        while seen != len(session.frames):
            seen = len(session.frames)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0)
            await anyio.wait_all_tasks_blocked()
    return [f.data for f in session.frames if _is_update(sid)(f)]


def _judge_load(ctx: Context, marker: str, reply: dict[str, Any], before: list[Any],
                how: str) -> None:
    if "error" in reply:
        raise CheckFailed(f"session/load {how} answered {json.dumps(reply)[:300]}")
    echoed = [m for m in before if marker in json.dumps(m)]
    seen = (f"session/load {how} answered {json.dumps(reply)[:200]}; session/update before "
            f"the answer: {len(before)}, carrying the earlier prompt: {len(echoed)}")
    ctx.record("acp-http.load.history-first", "pass" if echoed else "fail", seen)


async def check_queue_full(ctx: Context) -> None:
    check = "acp-http.prompt-queue-full"
    async with ctx.checking(check):
        limit = limit_of(ctx)
        conn, _ = await initialize(ctx)
        async with open_stream(ctx, conn) as connection:
            sid = await new_session(ctx, conn, connection, 1)
            async with open_stream(ctx, conn, sid) as session:
                await fill(ctx, sid, limit)   # over REST: one ACP connection may hold one
                await accepted(ctx, conn, rpc(2, "session/prompt", {
                    "sessionId": sid, "prompt": text(ctx.hold_prompt or "")}), sid)
                reply = (await session.wait_for(session.rpc_reply(2))).data
                error = reply.get("error") or {}
                data = error.get("data") or {}
                ok = (error.get("code") == -32603 and data.get("errorKind") == "prompt_queue_full"
                      and data.get("sessionId") == sid and data.get("limit") == limit
                      and data.get("pendingCount") == limit)
                ctx.expect(check, ok, f"{limit} prompts pending (REST), then session/prompt "
                                      f"(id 2) on /acp answered {reply}")


# -- ACP v1.21 methods -------------------------------------------------------------------
async def _reply(ctx: Context, streams: tuple[Stream, ...], rpc_id: Any) -> dict[str, Any]:
    """The reply to ``rpc_id`` on whichever of ``streams`` carries it (servers differ on
    the stream of session-scoped replies)."""
    found: list[dict[str, Any]] = []
    with anyio.fail_after(ctx.options.settle_timeout_s):
        async with anyio.create_task_group() as tg:
            async def watch(stream: Stream) -> None:
                found.append((await stream.wait_for(stream.rpc_reply(rpc_id))).data)
                tg.cancel_scope.cancel()

            for stream in streams:
                tg.start_soon(watch, stream)
    return found[0]


async def check_v1_methods(ctx: Context) -> None:
    ids = ("acp-http.v1.logout", "acp-http.v1.unknown-method", "acp-http.v1.session-fork",
           "acp-http.v1.session-delete")
    async with ctx.checking(*ids):
        conn, init = await initialize(ctx)
        caps = (init.json().get("result") or {}).get("agentCapabilities") or {}
        session_caps = caps.get("sessionCapabilities") or {}
        async with open_stream(ctx, conn) as connection:
            await accepted(ctx, conn, rpc(1, "logout", {}))
            reply = await _reply(ctx, (connection,), 1)
            offered = (caps.get("auth") or {}).get("logout") is not None
            ctx.expect(ids[0], reply.get("result") == {} or (
                not offered and (reply.get("error") or {}).get("code") == -32601),
                f"logout answered {reply}")
            sid = await new_session(ctx, conn, connection, 2)
            async with open_stream(ctx, conn, sid) as session:
                both = (connection, session)
                await accepted(ctx, conn, rpc(3, "_conformance/unadvertised", {"sessionId": sid}))
                reply = await _reply(ctx, both, 3)
                ctx.expect(ids[1], (reply.get("error") or {}).get("code") == -32601,
                           f"an unadvertised extension request answered {reply}")
                if session_caps.get("fork") is None:
                    ctx.skipped(ids[2], "sessionCapabilities.fork is not advertised")
                else:
                    await accepted(ctx, conn, rpc(4, "session/fork", {
                        "sessionId": sid, "cwd": cwd(ctx), "mcpServers": []}), sid)
                    reply = await _reply(ctx, both, 4)
                    forked = (reply.get("result") or {}).get("sessionId")
                    if isinstance(forked, str):
                        close_later(ctx, forked, conn)
                    ctx.expect(ids[2], isinstance(forked, str) and forked != sid,
                               f"session/fork answered {reply}")
                if session_caps.get("delete") is None:
                    raise Skip("sessionCapabilities.delete is not advertised")
                await accepted(ctx, conn, rpc(5, "session/delete", {"sessionId": sid}), sid)
                deleted = await _reply(ctx, both, 5)
            await accepted(ctx, conn, rpc(6, "session/list", {}))
            listed = await _reply(ctx, (connection,), 6)
            left = [s.get("sessionId") for s in (listed.get("result") or {}).get("sessions", [])]
            ctx.expect(ids[3], deleted.get("result") == {} and sid not in left,
                       f"session/delete answered {deleted}; session/list then listed {left}")


async def check_cancel_request(ctx: Context) -> None:
    check = "acp-http.v1.cancel-request"
    async with ctx.checking(check):
        if ctx.hold_prompt is None:
            raise Skip("no prompt known to stay pending (--hold-prompt)")
        conn, _ = await initialize(ctx)
        async with open_stream(ctx, conn) as connection:
            sid = await new_session(ctx, conn, connection, 1)
            async with open_stream(ctx, conn, sid) as session:
                await accepted(ctx, conn, rpc("held", "session/prompt", {
                    "sessionId": sid, "prompt": text(ctx.hold_prompt)}), sid)
                await session.wait_for(_is_update(sid))       # the turn has started
                await accepted(ctx, conn, rpc(None, "$/cancel_request", {"requestId": "held"}),
                               sid)
                reply = await _reply(ctx, (connection, session), "held")
                ok = (reply.get("result") or {}).get("stopReason") == "cancelled" \
                    or (reply.get("error") or {}).get("code") == -32800
                ctx.expect(check, ok, f"the held session/prompt, cancelled by "
                                      f"$/cancel_request, answered {reply}")


SCENARIOS = (check_flow, check_statuses, check_delete, check_websocket, check_load,
             check_queue_full, check_v1_methods, check_cancel_request)
