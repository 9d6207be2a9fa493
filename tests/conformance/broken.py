"""Deliberately broken servers: our server with exactly one rule broken each.

    async with running_target(tmp_path, **BROKEN["no-retry-after"].target) as url:
        ...   # the runner must fail backpressure.refusal.retry-after and pass the rest

A break is either an ASGI middleware in front of the real app (it rewrites one kind
of answer) or a ``tamper`` of the real bridge (it keeps one slot taken).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bridge import Bridge
from bridge.session import PendingPrompt, Session
from bridge.ticket import PromptResult, PromptTicket

Asgi = Callable[..., Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
Edit = Callable[[str, int, Headers, bytes], tuple[int, Headers, bytes]]


def matches(scope: dict[str, Any], method: str, pattern: re.Pattern[str]) -> bool:
    """Whether an ASGI scope is an HTTP request ``method`` on a path ``pattern`` matches."""
    return scope["type"] == "http" and scope["method"] == method \
        and pattern.fullmatch(scope["path"]) is not None


def rewrite(method: str, path: str, *, edit: Edit | None = None,
            chunk: Callable[[bytes], bytes] | None = None) -> Callable[[Asgi], Asgi]:
    """A middleware for requests ``method`` + ``path`` (a regex): ``edit`` sees the whole
    buffered answer (path, status, headers, body); ``chunk`` rewrites each body chunk of a
    streamed one."""
    pattern = re.compile(path)

    def wrap(app: Asgi) -> Asgi:
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if not matches(scope, method, pattern):
                return await app(scope, receive, send)
            if chunk is not None:
                async def send_chunk(message: dict[str, Any]) -> None:
                    if message["type"] == "http.response.body":
                        message = {**message, "body": chunk(message.get("body", b""))}
                    await send(message)
                return await app(scope, receive, send_chunk)
            assert edit is not None
            start: dict[str, Any] = {}
            parts: list[bytes] = []

            async def capture(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    start.update(message)
                    return
                if message["type"] != "http.response.body":
                    return await send(message)
                parts.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                status, headers, body = edit(scope["path"], start["status"],
                                             list(start.get("headers", [])), b"".join(parts))
                headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})

            await app(scope, receive, capture)
        return asgi
    return wrap


def _json_edit(change: Callable[[str, int, dict[str, Any]], tuple[int, dict[str, Any]] | None]
               ) -> Edit:
    def edit(path: str, status: int, headers: Headers, body: bytes
             ) -> tuple[int, Headers, bytes]:
        try:
            value = json.loads(body)
        except ValueError:
            return status, headers, body
        changed = change(path, status, value)
        if changed is None:
            return status, headers, body
        return changed[0], headers, json.dumps(changed[1]).encode()
    return edit


def _no_retry_after(path: str, status: int, headers: Headers, body: bytes
                    ) -> tuple[int, Headers, bytes]:
    if status == 503:
        headers = [(k, v) for k, v in headers if k.lower() != b"retry-after"]
    return status, headers, body


def _prompt_id_in_refusal(path: str, status: int, body: dict[str, Any]
                          ) -> tuple[int, dict[str, Any]] | None:
    return (status, {**body, "promptId": "refused-but-numbered"}) if status == 503 else None


def _batch_as_400(app: Asgi) -> Asgi:
    """A JSON array on POST /acp answered 400 (the TS server's choice), not 501."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/acp":
            return await app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        if body.lstrip().startswith(b"["):
            reply = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"batch"}}'
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(reply)).encode())]})
            await send({"type": "http.response.body", "body": reply})
            return None
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        return await app(scope, replay, send)
    return asgi


def _unkinded(data: bytes) -> bytes:
    """ACP stream frames: the queue-full error loses its errorKind."""
    return data.replace(b'"errorKind":"prompt_queue_full"', b'"errorKind":"internal"')


def _moves_after_cancel() -> Edit:
    """GET /lmsp/v1/tasks/{id}: after answering ``cancelled`` once, says ``running``."""
    seen: set[str] = set()

    def change(path: str, status: int, task: dict[str, Any]
               ) -> tuple[int, dict[str, Any]] | None:
        if status != 200 or task.get("status") != "cancelled":
            return None
        if task["id"] not in seen:
            seen.add(task["id"])
            return None
        return status, {**task, "status": "running"}
    return _json_edit(change)


def _finished_cancel_ok(path: str, status: int, body: dict[str, Any]
                        ) -> tuple[int, dict[str, Any]] | None:
    if status == 409 and body.get("code") == "task_not_cancelable":
        return 200, {"id": body.get("task_id"), "object": "task",
                     "status": body.get("task_status")}
    return None


def _leak_slot(session: Session) -> None:
    """Take a slot that nothing releases: a pending prompt that is not on the FIFO."""
    prompt_id = f"leaked-{len(session.pending)}-{id(session)}"
    ticket = PromptTicket(prompt_id, session.session_id, 0, session.bus.epoch, lambda _r: None)
    session.pending[prompt_id] = PendingPrompt(prompt_id, [{"type": "text", "text": ""}], ticket,
                                               None, False, None)


def _leak_on_cancel(bridge: Bridge) -> None:
    """The prompt cancelled by POST /session/:id/cancel keeps its slot."""
    original = bridge.cancel_session

    async def cancel_session(session_id: str, **kwargs: Any) -> bool:
        cancelled = await original(session_id, **kwargs)
        _leak_slot(bridge.get_session(session_id))
        return cancelled
    bridge.cancel_session = cancel_session  # type: ignore[method-assign]


def _keep_completed_slots(bridge: Bridge) -> None:
    """A prompt that completes (end_turn) keeps its slot; cancelled or failed ones free it."""
    original = bridge.send_prompt

    def send_prompt(session_id: str, prompt: list[Any], **kwargs: Any) -> Any:
        ticket = original(session_id, prompt, **kwargs)
        session = bridge.get_session(session_id)
        if "_settle" not in vars(session):          # once per session
            settle = session._settle

            def settled(pending: Any, outcome: Any) -> None:
                settle(pending, outcome)
                if isinstance(outcome, PromptResult) and outcome.stop_reason == "end_turn":
                    _leak_slot(session)     # the release undone
            session._settle = settled  # type: ignore[method-assign]
        return ticket
    bridge.send_prompt = send_prompt  # type: ignore[method-assign]


def _branch_takes_a_slot(bridge: Bridge) -> None:
    original = bridge.branch_session

    async def branch_session(session_id: str, **how: Any) -> Any:   # owner= as the door passes it
        info = await original(session_id, **how)
        _leak_slot(bridge.get_session(session_id))
        return info
    bridge.branch_session = branch_session  # type: ignore[method-assign]


@dataclass(frozen=True)
class Broken:
    suite: str
    fails: str                     # the one check it must fail
    target: dict[str, Any] = field(default_factory=dict)   # running_target() arguments


PROMPT = r"/session/[^/]+/prompt"
BROKEN = {
    "no-retry-after": Broken("backpressure", "backpressure.refusal.retry-after",
                             {"wrap": rewrite("POST", PROMPT, edit=_no_retry_after)}),
    "prompt-id-in-refusal": Broken("backpressure", "backpressure.refusal.no-prompt-id", {
        "wrap": rewrite("POST", PROMPT, edit=_json_edit(_prompt_id_in_refusal))}),
    "slot-kept-after-completion": Broken("backpressure", "backpressure.release.completed",
                                         {"tamper": _keep_completed_slots}),
    "slot-kept-after-cancel": Broken("backpressure", "backpressure.release.cancelled",
                                     {"tamper": _leak_on_cancel}),
    "branch-takes-a-slot": Broken("backpressure", "backpressure.branch.no-slot",
                                  {"tamper": _branch_takes_a_slot}),
    "batch-400": Broken("acp-http", "acp-http.status.501", {"wrap": _batch_as_400}),
    "queue-full-without-kind": Broken("acp-http", "acp-http.prompt-queue-full",
                                      {"wrap": rewrite("GET", "/acp", chunk=_unkinded)}),
    "moves-after-cancelled": Broken("lmsp", "lmsp.state.terminal-final", {
        "wrap_factory": lambda: rewrite("GET", r"/lmsp/v1/tasks/[^/]+",
                                        edit=_moves_after_cancel())}),
    "finished-cancel-200": Broken("lmsp", "lmsp.cancel.finished", {
        "wrap": rewrite("POST", r"/lmsp/v1/tasks/[^/]+/cancel",
                        edit=_json_edit(_finished_cancel_ok))}),
}
