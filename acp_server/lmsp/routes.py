"""The ``/lmsp/v1`` routes.

    app.state.lmsp = service
    app.router.routes.extend(lmsp_routes())

Contracts: every error is a problem object (``application/problem+json``), 405
included, and the network guard's 401 (``UNAUTHORIZED_PROBLEM``, which
``acp_server.app`` hands to the guard for ``/lmsp/`` paths) (each path takes every method and answers unknown ones itself). Task
creation answers 202 only after the commit; a replay adds ``Idempotent-Replayed:
true``. Event streams are SSE (§6.4) written by ``acp_server.sse``: ``retry: 3000``
once (a field of the first frame), ``id``/``event``/``data`` per event, a
``: keep-alive`` comment line after ``LmspConfig.keepalive_s`` of silence, closed right
after the terminal event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Send

from acp_server.lmsp.problems import LmspError, problem, problem_response
from acp_server.lmsp.requests import (
    decode_json,
    parse_cursor,
    parse_idempotency_key,
    parse_response_request,
    parse_task_envelope,
    read_body,
)
from acp_server.lmsp.service import LmspService
from acp_server.lmsp.store import TERMINAL, CommittedEvent
from acp_server.lmsp.responses import base_response
from acp_server.lmsp.wire import encode
from acp_server.sse import SseResponse, frame

PREFIX = "/lmsp/v1"
KEEPALIVE_COMMENT = b"keep-alive"
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
Endpoint = Callable[[Request, LmspService], Awaitable[Response]]


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _endpoint(methods: dict[str, Endpoint]) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        try:
            handler = methods.get(request.method)
            if handler is None:
                raise LmspError("method_not_allowed",
                                f"{request.method} is not allowed on {request.url.path}.")
            return await handler(request, request.app.state.lmsp)
        except LmspError as exc:
            return problem_response(exc, instance=request.url.path)

    return handle


# -- endpoints ---------------------------------------------------------------------------
async def capabilities(request: Request, service: LmspService) -> Response:
    return _json(200, encode(service.capabilities()))


async def create_task(request: Request, service: LmspService) -> Response:
    key = parse_idempotency_key(request.headers.get("idempotency-key"))
    body = decode_json(await read_body(request, limit=service.config.max_request_bytes))
    envelope = parse_task_envelope(body)
    record, replayed = await service.create_task(
        envelope.request, on_restart=envelope.on_restart, body=body, key=key,
        route="POST /lmsp/v1/tasks")
    headers = {"Location": f"{PREFIX}/tasks/{record.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return _json(202, encode(service.task_object(record)), headers)


async def get_task(request: Request, service: LmspService) -> Response:
    record = await service.get_task(request.path_params["task_id"])
    return _json(200, encode(service.task_object(record)))


async def cancel_task(request: Request, service: LmspService) -> Response:
    record = await service.cancel(request.path_params["task_id"])
    return _json(200, encode(service.task_object(record)))


async def task_events(request: Request, service: LmspService) -> Response:
    cursor = parse_cursor(request)
    stream = await service.open_events(request.path_params["task_id"],
                                       None if cursor is None else cursor[0],
                                       param=None if cursor is None else cursor[1])
    if stream is None:
        return Response(status_code=204)
    return EventStream(stream)


async def create_response(request: Request, service: LmspService) -> Response:
    key = parse_idempotency_key(request.headers.get("idempotency-key"))
    body = decode_json(await read_body(request, limit=service.config.max_request_bytes))
    parsed = parse_response_request(body)
    record, replayed = await service.create_task(parsed, on_restart="fail", body=body, key=key,
                                                 route="POST /lmsp/v1/responses")
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    if parsed.stream:
        stream = await service.open_events(record.id, None)
        assert stream is not None
        return EventStream(stream, cancel_on_close=(service, record.id),
                           headers=[(b"idempotent-replayed", b"true")] if replayed else None)
    record = await service.wait_terminal(record.id)
    if record.response is None:   # the server is stopping: the response as it stands
        status = "queued" if record.status == "queued" else "in_progress"
        return _json(200, encode(base_response(record, status)), headers)
    return _json(200, record.response, headers)


# -- SSE ---------------------------------------------------------------------------------
def _frame(event: CommittedEvent) -> bytes:
    return frame(event.data, event=event.type, event_id=event.seq)


class EventStream(SseResponse):
    """One write per batch of events (a commit's worth), not per event; the service's
    empty batch is the keep-alive tick. A client closing a streamed ``/responses``
    before its end cancels it (as OpenAI's do)."""

    def __init__(self, stream: AsyncIterator[list[CommittedEvent]], *,
                 cancel_on_close: tuple[LmspService, str] | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(keepalive_comment=KEEPALIVE_COMMENT, heartbeat_s=0, headers=headers,
                         after_disconnect=self._cancel if cancel_on_close else None)
        self.stream = stream
        self.cancel_on_close = cancel_on_close

    async def write_frames(self, send: Send) -> None:
        try:
            async for batch in self.stream:
                body = b"".join(map(_frame, batch)) if batch else self.keepalive_frame
                await send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()  # type: ignore[attr-defined]

    async def _cancel(self) -> None:
        assert self.cancel_on_close is not None
        service, task_id = self.cancel_on_close
        with anyio.CancelScope(shield=True):
            try:
                record = await service.get_task(task_id)
                if record.status not in TERMINAL:
                    await service.cancel(task_id)
            except LmspError:
                pass


def lmsp_routes() -> list[BaseRoute]:
    """The routes; they read the service from ``request.app.state.lmsp``."""
    table: list[tuple[str, dict[str, Endpoint]]] = [
        ("/capabilities", {"GET": capabilities}),
        ("/responses", {"POST": create_response}),
        ("/tasks", {"POST": create_task}),
        ("/tasks/{task_id}", {"GET": get_task}),
        ("/tasks/{task_id}/cancel", {"POST": cancel_task}),
        ("/tasks/{task_id}/events", {"GET": task_events}),
    ]
    return [Route(PREFIX + path, _endpoint(methods), methods=_ALL_METHODS)
            for path, methods in table]


# -- 401 as a problem object -------------------------------------------------------------
# The network guard's 401 under /lmsp/ (acp_server.app hands it to SecurityMiddleware).
UNAUTHORIZED_PROBLEM = encode(problem("unauthorized", "A valid bearer token is required."))


def install_lmsp(app: Any, service: LmspService) -> None:
    """The whole composition: the service on ``app.state`` and the routes."""
    app.state.lmsp = service
    app.router.routes.extend(lmsp_routes())


__all__ = ["UNAUTHORIZED_PROBLEM", "install_lmsp", "lmsp_routes"]
