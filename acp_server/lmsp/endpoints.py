"""The ``/lmsp/v1`` endpoints and their route factory.

    app = Starlette(routes=routes(service))      # acp_server.lmsp.routes

Contracts: every error is a problem object (``application/problem+json``), 405 included
(each path takes every method and answers unknown ones itself), and the front layer's
refusals (401, 403, 421, 431, …, rendered by ``problems.render_refusal``). Every
endpoint gets the ``LmspService`` bound when the routes are built, never from
``app.state``. Task creation answers 202 only after the commit; a write the store
refuses for good (a constraint, a trigger: ``ENGINE_ERRORS``) is answered as an outage,
503 ``store_unavailable``, and logged with the database's first line. A replay adds
``Idempotent-Replayed: true``. Event streams are SSE (§6.4) written by
``acp_server.http.sse``: ``retry: 3000`` once (a field of the first frame),
``id``/``event``/``data`` per event, a ``: keep-alive`` comment line after
``LmspConfig.keepalive_s`` of silence, closed right after the terminal event. A
``background`` response is answered as soon as it is committed, and its stream outlives
its client (resumed with ``GET /responses/{id}?stream=true``); the client of a
foreground response (streamed or not) that drops cancels it, unless the request had an
``Idempotency-Key``: then the work goes on and the retry with the key gets it (its
stream from event 0, or the final object).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Send

from acp_server.lmsp.errors import handle_unexpected
from acp_server.lmsp.input_items import list_input_items
from acp_server.lmsp.listing import list_tasks
from acp_server.lmsp.models import refresh_models
from acp_server.lmsp.problems import LmspError, problem_response, shown, store_unavailable
from acp_server.lmsp.requests import (
    TaskEnvelope,
    decode_json,
    parse_cursor,
    parse_idempotency_key,
    parse_response_request,
    parse_task_envelope,
    read_body,
)
from acp_server.lmsp.service import LmspService
from acp_server.store.tasks import TERMINAL, CommittedEvent
from acp_server.lmsp.responses import base_response
from acp_server.lmsp.wire import DeletedResponse, encode
from acp_server.http.handlers import request_line
from acp_server.http.sse import SseResponse, frame
from acp_server.principals import caller_of
from acp_server.principals.model import INFO, MUTATING, PROMPTING, READING, Access
from acp_server.store.errors import ENGINE_ERRORS, StoreUnavailableError, first_line
from bridge.agent_calls import LISTING_WAIT_S

log = logging.getLogger("acp_server.lmsp")

PREFIX = "/lmsp/v1"
KEEPALIVE_COMMENT = b"keep-alive"
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
Endpoint = Callable[[Request, LmspService], Awaitable[Response]]


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _endpoint(methods: dict[str, Endpoint],
              service: LmspService) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        try:
            handler = methods.get(request.method)
            if handler is None:
                raise LmspError("method_not_allowed",
                                f"{request.method} is not allowed on {request.url.path}.")
            return await handler(request, service)
        except (LmspError, StoreUnavailableError, *ENGINE_ERRORS) as exc:
            return _problem(exc, request)

    return handle


def _problem(exc: Exception, request: Request) -> Response:
    """The problem answer of an ``LmspError``, a store outage or a write the store
    refused for good (logged)."""
    if isinstance(exc, LmspError):
        return problem_response(exc, instance=request.url.path)
    if isinstance(exc, StoreUnavailableError):
        return problem_response(store_unavailable(exc), instance=request.url.path)
    log.warning("lmsp: %s: the store refused the write: %s", request_line(request),
                first_line(exc, 200))
    return problem_response(store_unavailable(StoreUnavailableError("refused")),
                            instance=request.url.path)


# -- endpoints ---------------------------------------------------------------------------
async def capabilities(request: Request, service: LmspService) -> Response:
    await refresh_models(service.models, wait_s=LISTING_WAIT_S)   # models listed since
    return _json(200, encode(service.capabilities()))


async def create_task(request: Request, service: LmspService) -> Response:
    key = parse_idempotency_key(request.headers.get("idempotency-key"))
    body = decode_json(await read_body(request, limit=service.config.max_request_bytes))
    return await _created(service, parse_task_envelope(body), key, request.scope)


async def _created(service: LmspService, envelope: TaskEnvelope, key: str | None,
                   scope: Any) -> Response:
    record, replayed = await service.create_task(
        envelope.request, on_restart=envelope.on_restart, key=key, route="POST /lmsp/v1/tasks",
        caller=caller_of(scope))
    headers = {"Location": f"{PREFIX}/tasks/{record.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return _json(202, encode(service.task_object(record)), headers)


Answer = tuple[dict[str, Any], dict[str, Any]]   # (http.response.start, http.response.body)


class FastCreate:
    """``POST /lmsp/v1/tasks`` for the front layer's hot path (``acp_server.http.front``,
    which has read the body and checked the caller): the route's answers, bytes for
    bytes, without the framework's layers (its middleware, router and ``Request``), as
    two ASGI messages. ``None`` (nothing done: the route then runs on the same body)
    for a body over the limit or one the route refuses before creating anything (not
    JSON, not a task, a malformed ``Idempotency-Key``); from the create on (a refusal
    of the service, an outage, a bug: ``errors.handle_unexpected``'s 500), it answers
    as the route and the door's handlers would."""

    __slots__ = ("service",)

    def __init__(self, service: LmspService) -> None:
        self.service = service

    async def __call__(self, scope: Any, body: bytes) -> Answer | None:
        service = self.service
        if len(body) > service.config.max_request_bytes:
            return None   # the route's 413
        try:
            key = None
            for name, value in scope["headers"]:
                if name == b"idempotency-key":   # the first, as ``request.headers.get``
                    key = parse_idempotency_key(value.decode("latin-1"))
                    break
            envelope = parse_task_envelope(decode_json(body))
        except Exception:   # noqa: BLE001 - nothing done yet: the route says why
            return None
        try:
            response = await _created(service, envelope, key, scope)
        except (LmspError, StoreUnavailableError, *ENGINE_ERRORS) as exc:
            response = _problem(exc, Request(scope))
        except Exception as exc:   # noqa: BLE001 - a bug: the door's 500, logged
            response = await handle_unexpected(Request(scope), exc)
        return ({"type": "http.response.start", "status": response.status_code,
                 "headers": response.raw_headers},
                {"type": "http.response.body", "body": bytes(response.body)})


def fast_routes(service: LmspService) -> dict[str, tuple[Any, frozenset[bytes]]]:
    """The front layer's fast handlers of this door, by route path, with the headers
    they leave to the route (``acp_server.app``)."""
    return {PREFIX + "/tasks": (FastCreate(service), frozenset())}


async def get_task(request: Request, service: LmspService) -> Response:
    record = await service.get_task(request.path_params["task_id"], caller_of(request.scope))
    return _json(200, encode(service.task_object(record)))


async def cancel_task(request: Request, service: LmspService) -> Response:
    record = await service.cancel(request.path_params["task_id"], caller_of(request.scope))
    return _json(200, encode(service.task_object(record)))


async def task_events(request: Request, service: LmspService) -> Response:
    cursor = parse_cursor(request)
    stream = await service.open_events(request.path_params["task_id"],
                                       None if cursor is None else cursor[0],
                                       param=None if cursor is None else cursor[1],
                                       caller=caller_of(request.scope))
    if stream is None:
        return Response(status_code=204)
    return EventStream(stream)


async def create_response(request: Request, service: LmspService) -> Response:
    key = parse_idempotency_key(request.headers.get("idempotency-key"))
    body = decode_json(await read_body(request, limit=service.config.max_request_bytes))
    parsed = parse_response_request(body)
    record, replayed = await service.create_task(parsed, on_restart="fail", key=key,
                                                 route="POST /lmsp/v1/responses",
                                                 caller=caller_of(request.scope))
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    # A foreground response is cancelled when its client drops, unless it came with an
    # Idempotency-Key: its client means to retry, and the retry gets the outcome.
    cancel_on_drop = not parsed.background and key is None
    if parsed.stream:
        stream = await service.open_events(record.id, None)
        assert stream is not None
        return EventStream(stream, cancel_on_close=(service, record.id) if cancel_on_drop
                           else None,
                           headers=[(b"idempotent-replayed", b"true")] if replayed else None)
    if parsed.background:   # durable already: answer at once
        return _json(200, service.response_object(record), headers)
    try:
        record = await _wait_unless_gone(request, service, record.id, cancel=cancel_on_drop)
    except LmspError as exc:
        if exc.code != "task_not_found":
            raise
        # deleted as soon as it ended (another client's DELETE came first)
        raise LmspError("response_not_found", f"No response {record.response_id!r}: "
                        "deleted as it ended.", response_id=record.response_id) from None
    if record is None:   # the client went away (the response cancelled without a key)
        return Response(status_code=499)
    if record.response is None:   # the server is stopping: the response as it stands
        status = "queued" if record.status == "queued" else "in_progress"
        return _json(200, encode(base_response(record, status)), headers)
    return _json(200, record.response, headers)


async def get_response(request: Request, service: LmspService) -> Response:
    """The response object; ``stream=true`` streams its events (§6.4 cursor rules)."""
    response_id = request.path_params["response_id"]
    stream = request.query_params.get("stream", "false").strip().lower()
    if stream not in ("true", "false", "1", "0"):
        raise LmspError("invalid_request", "stream must be true or false.", param="stream",
                        errors=[])
    record = await service.get_response(response_id, caller=caller_of(request.scope))
    if stream in ("false", "0"):
        return _json(200, service.response_object(record))
    cursor = parse_cursor(request)
    try:
        events = await service.open_events(record.id, None if cursor is None else cursor[0],
                                           param=None if cursor is None else cursor[1])
    except LmspError as exc:
        if exc.code != "task_not_found":
            raise
        # deleted since it was read (a DELETE won the race): this route's 404
        raise LmspError("response_not_found", f"No response {shown(response_id)!r}.",
                        response_id=shown(response_id)) from None
    if events is None:
        return Response(status_code=204)
    return EventStream(events)


async def cancel_response(request: Request, service: LmspService) -> Response:
    record = await service.cancel_response(request.path_params["response_id"],
                                           caller_of(request.scope))
    return _json(200, service.response_object(record))


async def delete_response(request: Request, service: LmspService) -> Response:
    response_id = request.path_params["response_id"]
    await service.delete_response(response_id, caller_of(request.scope))
    return _json(200, encode(DeletedResponse(id=response_id)))


async def _wait_unless_gone(request: Request, service: LmspService, task_id: str, *,
                            cancel: bool) -> Any:
    """The terminal task, or ``None`` once the client disconnected (the task is then
    cancelled when ``cancel``, as a closed ``stream: true`` response is). What the wait
    raises (``task_not_found``: deleted as it ended) is raised as itself."""
    result: list[Any] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as tg:
        async def wait() -> None:
            try:
                result.append(await service.wait_terminal(task_id))
            except Exception as exc:   # raised below, unwrapped (not an exception group)
                failed.append(exc)
            tg.cancel_scope.cancel()

        tg.start_soon(wait)
        while (await request.receive())["type"] != "http.disconnect":
            pass   # the body was read: the next message is the disconnect
        tg.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if result:
        return result[0]
    if not cancel:
        return None
    with anyio.CancelScope(shield=True):
        try:
            if (await service.get_task(task_id)).status not in TERMINAL:
                await service.cancel(task_id)
        except (LmspError, StoreUnavailableError):
            pass   # nobody reads the answer; a task left running ends on its own
    return None


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
            except (LmspError, StoreUnavailableError):
                pass


def access(method: str, path: str) -> Access:
    """What an LMSP request needs of its principal (the front layer applies it):
    creating a task or a response is a prompt (scope ``prompt``); cancelling one or
    deleting a response a mutation (scope ``prompt``); reading needs ``read``;
    ``/capabilities`` any credential."""
    if method in ("GET", "HEAD"):
        return INFO if path == PREFIX + "/capabilities" else READING
    if method == "POST" and path in (PREFIX + "/tasks", PREFIX + "/responses"):
        return PROMPTING
    return MUTATING


def routes(service: LmspService) -> list[BaseRoute]:
    """Every ``/lmsp/v1`` route, over the service."""
    table: list[tuple[str, dict[str, Endpoint]]] = [
        ("/capabilities", {"GET": capabilities}),
        ("/responses", {"POST": create_response}),
        ("/tasks", {"POST": create_task, "GET": list_tasks}),
        ("/responses/{response_id}", {"GET": get_response, "DELETE": delete_response}),
        ("/responses/{response_id}/cancel", {"POST": cancel_response}),
        ("/responses/{response_id}/input_items", {"GET": list_input_items}),
        ("/tasks/{task_id}", {"GET": get_task}),
        ("/tasks/{task_id}/cancel", {"POST": cancel_task}),
        ("/tasks/{task_id}/events", {"GET": task_events}),
    ]
    return [Route(PREFIX + path, _endpoint(methods, service), methods=_ALL_METHODS)
            for path, methods in table]


__all__ = ["FastCreate", "access", "fast_routes", "routes"]
