"""``DaemonClient``: the REST + SSE client of an acp-server (or ``qwen serve``) daemon.

    async with DaemonClient("http://127.0.0.1:4170") as client:
        caps = await client.capabilities()
        client = DaemonClient(url, max_pending_prompts_per_session=
                              caps.limits.max_pending_prompts_per_session)   # None = no cap
        session = await client.create_or_attach_session()
        result = await client.prompt(session.session_id, "hello")         # PromptResult
        async for event in client.subscribe_events(session.session_id, last_event_id=0):
            ...

Contracts (``prompt``, mirroring the peer SDK):

* A caller already cancelled reserves nothing. Otherwise a local slot is reserved
  *before* the request; at the cap → ``DaemonPendingPromptLimitError`` and no request.
* The slot is released exactly once, on: a blocking 200, the matching
  ``turn_complete`` of a 202, ``turn_error`` (→ ``DaemonTurnError``), cancellation by
  the caller (which also cancels the prompt on the server), the end of the event stream
  (→ ``DaemonStreamEndedError`` / ``DaemonStreamError``), and any failure to send the
  request or to parse the answer.
* After a 202 the client subscribes from the envelope's ``lastEventId`` with its
  ``eventEpoch``, so no event of the turn is missed. A session gone before its
  stream was read (its agent died as the prompt ran: 404) is asked how the prompt
  ended, by sending it again under its id (a server with ``prompt_id_replay``).
* A 503 ``prompt_queue_full`` → ``DaemonPendingPromptLimitError`` with the server's
  values (also from ``prompt_nonblocking``, which reserves nothing). Other non-2xx →
  ``DaemonHttpError`` (a redirect among them: never followed); transport failures →
  ``DaemonConnectionError``.
* Every prompt is sent under an id (``prompt_id=``, else a new one), so it is sent
  again, and still runs once: on a fleet's 503 ``owner_lost`` / ``owner_unreachable``,
  and when a send got no answer (the connection refused: it never arrived; cut before
  the answer: a restart, a dropped network), at most ``MAX_PROMPT_SENDS`` sends. A
  send that may have arrived goes again only to a server that advertises
  ``prompt_id_replay`` (an older one would run it twice); a timed-out one never, nor
  one that failed in a way the next send would repeat (a certificate that does not
  verify, a name that does not resolve, https to a plain port): raised at once.

Contracts (every call): ``timeout`` (seconds, default 30, ``None``: none) bounds each
network operation (connect, each read and write) and the whole of a call that is not
an event stream, its answer included: a server that never answers, or trickles its
answer, fails the call with ``DaemonConnectionError`` "… timed out". An event stream
reads with at least ``MIN_STREAM_READ_TIMEOUT_S`` (its heartbeat is every 15 s), each
line within that (``acp_server.client.sse``). What is read is capped
(``acp_server.client.bounded``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import msgspec

from acp_server.bearer import bearer_token
from acp_server.client import wire
from acp_server.client.bounded import MAX_ANSWER_BYTES, MAX_EVENT_BYTES, read_answer
from acp_server.client.errors import (DaemonConnectionError, DaemonError, DaemonHttpError,
                                      DaemonSessionIdProtocolError, DaemonStreamEndedError,
                                      DaemonTurnError, decode_body, error_from_answer,
                                      lasting_failure)
from acp_server.client.inflate import request_headers
from acp_server.client.events import (StreamCursor, event_prompt_id, match_turn_event,
                                      subscribe_events)
from acp_server.client.reservations import (DEFAULT_MAX_PENDING_PROMPTS_PER_SESSION,
                                            PromptReservations, Reservation,
                                            normalize_pending_prompt_limit)
from acp_server.client.wire import (Capabilities, CreateSessionRequest, DaemonEvent,
                                    PromptAccepted, PromptRequest, PromptResult, RestoreRequest,
                                    SessionInfo, path_segment)

TOKEN_ENV = "ACP_SERVER_TOKEN"
CLIENT_ID_HEADER = "X-Qwen-Client-Id"
# How long a cancelled prompt() may spend telling the server to stop.
CANCEL_GRACE_S = 5.0
# A fleet instance's answers that a prompt sent under its id may be sent again on:
# the owner of the session could not be reached, or took it and went silent
# (``acp_server.fleet.routing``): sent again under the same id it runs once.
RESEND_CODES = frozenset({"owner_lost", "owner_unreachable"})
MAX_PROMPT_SENDS = 4
# A prompt whose send got no answer (the connection refused, or cut before the
# answer: a restart, a dropped network) is sent again after 0.5 s, then 1 s, 2 s, …
# (each wait capped by ``max_retry_wait_s``): one refused was never sent, one cut may
# have been admitted and goes again only to a server with ``prompt_id_replay``; one
# that would fail the same way again (``errors.lasting_failure``) is not sent again.
RECONNECT_WAIT_S = 0.5
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout)
_CUT = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
# Event streams idle up to the 15 s heartbeat; reads may wait at least this long.
MIN_STREAM_READ_TIMEOUT_S = 45.0

PromptInput = PromptRequest | str | Sequence[Mapping[str, Any]] | Mapping[str, Any]
EventCallback = Callable[[DaemonEvent], Awaitable[None] | None]
_CLIENT_CAP: Any = object()


def prompt_body(req: PromptInput, prompt_id: str | None = None) -> bytes:
    """Encode a prompt: text, a list of content blocks, a ``PromptRequest``, or a
    complete JSON body (a mapping with ``prompt``); ``prompt_id`` names it unless the
    request already does."""
    return named_prompt(req, prompt_id)[0]


def named_prompt(req: PromptInput, prompt_id: str | None) -> tuple[bytes, str | None]:
    """``prompt_body`` and the prompt id the body carries (the request's own, else
    ``prompt_id``)."""
    if isinstance(req, str):
        req = PromptRequest.text(req)
    if isinstance(req, PromptRequest):
        if req.prompt_id is None and prompt_id is not None:
            req = msgspec.structs.replace(req, prompt_id=prompt_id)
        return wire.ENCODER.encode(req), req.prompt_id
    body = dict(req) if isinstance(req, Mapping) else {
        "prompt": [dict(block) for block in req]}
    if body.get("promptId") is None and prompt_id is not None:
        body["promptId"] = prompt_id
    named = body.get("promptId")
    return wire.ENCODER.encode(body), named if isinstance(named, str) else None


def new_prompt_id() -> str:
    return str(uuid.uuid4())


def _json_body(req: msgspec.Struct | Mapping[str, Any] | None) -> bytes:
    if req is None:
        return b"{}"
    if isinstance(req, msgspec.Struct):
        return wire.ENCODER.encode(req)
    return wire.ENCODER.encode(dict(req))


def _session_path(session_id: str, *rest: str) -> str:
    return "/".join(["/session", path_segment(session_id), *map(path_segment, rest)])


def _resend(response: httpx.Response) -> bool:
    if response.status_code != 503:
        return False
    body = decode_body(response.content)
    return isinstance(body, dict) and body.get("code") in RESEND_CODES


def _cut_or_unsent(exc: DaemonConnectionError) -> str | None:
    """``"unsent"``: the request never reached the server (no connection was made);
    ``"cut"``: the connection failed before the answer, so it may have been taken; else
    ``None``: a timeout (the server may still be working on it) or a failure the next
    send would repeat (``errors.lasting_failure``: an untrusted certificate, a name
    that does not resolve, https to a plain port), not sent again."""
    cause = exc.__cause__
    if cause is None or lasting_failure(cause):
        return None
    if isinstance(cause, _UNSENT):
        return "unsent"
    return "cut" if isinstance(cause, _CUT) else None


def _retry_after_s(response: httpx.Response, default: float = 5.0) -> float:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdecimal() and len(value) < 6 else default


def _ended(content: bytes, session_id: str) -> PromptResult:
    """A 200 to a prompt: a legacy daemon's result, or how a prompt sent again under
    its id ended (``{promptId, terminal, stopReason?, errorCode?}``): ``failed`` →
    ``DaemonTurnError``."""
    body = wire.decode(wire.ANY, content)
    if not isinstance(body, dict) or "terminal" not in body:
        return wire.decode(wire.PROMPT_RESULT, content)
    prompt_id = body.get("promptId") if isinstance(body.get("promptId"), str) else None
    if body["terminal"] == "failed":
        code = body.get("errorCode") if isinstance(body.get("errorCode"), str) else None
        raise DaemonTurnError({"sessionId": session_id, "promptId": prompt_id,
                               "code": code or "turn_error",
                               "message": f"Prompt {prompt_id} failed" if prompt_id
                               else "Prompt failed"})
    stop = body.get("stopReason")
    return PromptResult(stop_reason=stop if isinstance(stop, str) else "end_turn",
                        prompt_id=prompt_id)


class _TurnWatch:
    """What ``prompt()`` has seen of its own turn (decides how to cancel it)."""

    __slots__ = ("prompt_id", "queued", "running")

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id
        self.queued = False
        self.running = False

    def see(self, event: DaemonEvent) -> None:
        if event.type == "pending_prompt_added":
            self.queued = True
        elif event.type != "pending_prompt_completed":
            self.queued, self.running = False, True


class DaemonClient:
    """See the module docstring. One instance owns one ``httpx.AsyncClient``; close it
    with ``aclose()`` or ``async with``."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float | None = 30.0,
                 max_pending_prompts_per_session: int | float | None =
                 DEFAULT_MAX_PENDING_PROMPTS_PER_SESSION,
                 transport: httpx.AsyncBaseTransport | None = None,
                 event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None,
                 max_answer_bytes: int = MAX_ANSWER_BYTES,
                 max_event_bytes: int = MAX_EVENT_BYTES,
                 max_retry_wait_s: float = 5.0) -> None:
        # first: a token no header can carry is UnsendableTokenError (it is not shown)
        self.token = bearer_token(token) or bearer_token(os.environ.get(TOKEN_ENV))
        self.base_url = base_url.rstrip("/")
        self.max_retry_wait_s = max_retry_wait_s   # between two sends of one prompt
        self._prompt_id_replay: bool | None = None   # the server's feature, once asked
        self.max_answer_bytes = max_answer_bytes
        self.max_event_bytes = max_event_bytes
        self.max_pending_prompts_per_session = normalize_pending_prompt_limit(
            max_pending_prompts_per_session)
        self.timeout = timeout
        headers = request_headers(self.token)
        self._stream_timeout = httpx.Timeout(
            timeout, read=None if timeout is None else max(timeout, MIN_STREAM_READ_TIMEOUT_S))
        self.reservations = PromptReservations()
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout,
                                       transport=transport, event_hooks=dict(event_hooks or {}),
                                       follow_redirects=False)

    # -- lifecycle ------------------------------------------------------------------------
    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> DaemonClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- plumbing --------------------------------------------------------------------------
    @staticmethod
    def _headers(client_id: str | None, json: bool = False) -> dict[str, str]:
        headers = {"Content-Type": "application/json"} if json else {}
        if client_id is not None:
            headers[CLIENT_ID_HEADER] = client_id
        return headers

    async def _send(self, method: str, path: str, *, body: bytes | None = None,
                    client_id: str | None = None, params: Mapping[str, str] | None = None
                    ) -> httpx.Response:
        try:
            return await read_answer(self._http, method, path, content=body, params=params,
                                     headers=self._headers(client_id, body is not None),
                                     max_bytes=self.max_answer_bytes, deadline=self.timeout)
        except httpx.TransportError as exc:
            raise DaemonConnectionError.from_transport(exc, str(self._http.base_url), method,
                                                       path) from exc

    async def _call(self, method: str, path: str, *, body: bytes | None = None,
                    client_id: str | None = None, ok: tuple[int, ...] = (200,),
                    session_id: str | None = None,
                    params: Mapping[str, str] | None = None) -> httpx.Response:
        response = await self._send(method, path, body=body, client_id=client_id, params=params)
        if response.status_code not in ok:
            raise error_from_answer(response.status_code, response.content, response.headers,
                                    session_id)
        return response

    # -- reservations ------------------------------------------------------------------------
    def pending_prompt_count(self, session_id: str) -> int:
        """Slots this client holds locally for ``session_id``."""
        return self.reservations.count(session_id)

    def reserve_prompt_slot(self, session_id: str, limit: int | None = _CLIENT_CAP) -> Reservation:
        """Reserve a local slot (``limit`` defaults to this client's cap; ``None`` = no
        cap); at the cap → ``DaemonPendingPromptLimitError``."""
        cap = self.max_pending_prompts_per_session if limit is _CLIENT_CAP else limit
        return self.reservations.reserve(session_id, cap)

    # -- daemon ------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        response = await self._call("GET", "/health")
        return wire.decode(wire.ANY, response.content)

    async def capabilities(self) -> Capabilities:
        response = await self._call("GET", "/capabilities")
        return wire.decode(wire.CAPABILITIES, response.content)

    # -- sessions ----------------------------------------------------------------------------
    async def create_or_attach_session(self, req: CreateSessionRequest | Mapping[str, Any] |
                                       None = None, client_id: str | None = None) -> SessionInfo:
        response = await self._call("POST", "/session", body=_json_body(req), client_id=client_id)
        info = wire.decode(wire.SESSION_INFO, response.content)
        requested = (req.session_id if isinstance(req, CreateSessionRequest)
                     else (req or {}).get("sessionId"))
        if isinstance(requested, str) and info.session_id.lower() != requested.lower():
            raise DaemonSessionIdProtocolError(requested, info.session_id)
        return info

    async def list_sessions(self, *, ended: bool = False, page_size: int = 100
                            ) -> AsyncGenerator[dict[str, Any], None]:
        """The sessions of the daemon's workspace, every page in turn (as the server
        writes them): the live ones, newest first; with ``ended``, the closed ones the
        server keeps (their agent died, the idle timeout closed them: ``GET
        /workspace/{id}/ended-sessions``, newest end first), which ``load_session``
        brings back (a server without that listing, ``qwen serve``, answers 404:
        ``DaemonHttpError``)."""
        caps = await self.capabilities()
        if not caps.workspaces or not isinstance(caps.workspaces[0].get("id"), str):
            raise DaemonError("the daemon's /capabilities names no workspace")
        path = "/workspace/" + path_segment(caps.workspaces[0]["id"]) + (
            "/ended-sessions" if ended else "/sessions")
        cursor: str | None = None
        while True:
            params = {"size": str(page_size), **({"cursor": cursor} if cursor else {})}
            page = wire.decode(wire.ANY, (await self._call("GET", path, params=params)).content)
            if not isinstance(page, dict) or not isinstance(page.get("sessions"), list):
                raise DaemonError(f"GET {path} answered no sessions list")
            for session in page["sessions"]:
                yield session
            cursor = page.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                return

    async def load_session(self, session_id: str, req: RestoreRequest | Mapping[str, Any] |
                           None = None, client_id: str | None = None) -> SessionInfo:
        response = await self._call("POST", _session_path(session_id, "load"),
                                    body=_json_body(req), client_id=client_id)
        return wire.decode(wire.SESSION_INFO, response.content)

    async def resume_session(self, session_id: str, req: RestoreRequest | Mapping[str, Any] |
                             None = None, client_id: str | None = None) -> SessionInfo:
        response = await self._call("POST", _session_path(session_id, "resume"),
                                    body=_json_body(req), client_id=client_id)
        return wire.decode(wire.SESSION_INFO, response.content)

    async def branch_session(self, session_id: str, name: str | None = None,
                             client_id: str | None = None) -> SessionInfo:
        body = wire.ENCODER.encode({"name": name} if name is not None else {})
        response = await self._call("POST", _session_path(session_id, "branch"), body=body,
                                    client_id=client_id, ok=(200, 201))
        return wire.decode(wire.SESSION_INFO, response.content)

    async def cancel(self, session_id: str, client_id: str | None = None) -> None:
        """Cancel the session's running prompt (queued prompts still run)."""
        await self._call("POST", _session_path(session_id, "cancel"), body=b"{}",
                         client_id=client_id, ok=(200, 202, 204))

    async def close_session(self, session_id: str, client_id: str | None = None) -> None:
        """Close the session; 204 and 404 (already gone) are both success."""
        await self._call("DELETE", _session_path(session_id), client_id=client_id,
                         ok=(200, 204, 404))

    async def session_status(self, session_id: str) -> dict[str, Any]:
        response = await self._call("GET", _session_path(session_id, "status"))
        return wire.decode(wire.ANY, response.content)

    async def respond_to_permission(self, request_id: str, response: Mapping[str, Any],
                                    client_id: str | None = None, *,
                                    session_id: str | None = None) -> bool:
        """Vote (``{"outcome": {"outcome": "selected", "optionId": …}}``). ``True`` when
        accepted, ``False`` when the request is unknown or already resolved (404)."""
        path = (_session_path(session_id, "permission", request_id) if session_id is not None
                else "/permission/" + path_segment(request_id))
        answer = await self._call("POST", path, body=wire.ENCODER.encode(dict(response)),
                                  client_id=client_id, ok=(200, 404), session_id=session_id)
        return answer.status_code == 200

    async def pending_prompts(self, session_id: str) -> list[dict[str, Any]]:
        response = await self._call("GET", _session_path(session_id, "pending-prompts"))
        return wire.decode(wire.PENDING_PROMPTS, response.content).pending_prompts

    async def remove_pending_prompt(self, session_id: str, prompt_id: str,
                                    client_id: str | None = None) -> bool:
        """Drop a queued prompt. ``False`` when the server no longer has it: 200
        ``{"removed": false}`` (this server and ``qwen serve``), or 404 (earlier
        versions of this server, which answered 204 when they dropped it)."""
        path = _session_path(session_id, "pending-prompts", prompt_id)
        response = await self._call("DELETE", path, client_id=client_id, ok=(200, 204, 404))
        if response.status_code == 200:
            return wire.decode(wire.PENDING_PROMPT_REMOVED, response.content).removed
        return response.status_code == 204

    # -- prompts -------------------------------------------------------------------------------
    async def prompt_nonblocking(self, session_id: str, req: PromptInput,
                                 client_id: str | None = None, *, prompt_id: str | None = None
                                 ) -> PromptAccepted | PromptResult:
        """Admission only: the 202 envelope (a legacy daemon's 200 → its result; a prompt
        sent again under an id that has ended → how it ended). No local reservation; a
        full server queue → ``DaemonPendingPromptLimitError``. Sent under ``prompt_id``
        (a new one when ``None``), and sent again on a fleet's ``RESEND_CODES``."""
        response = await self._send_prompt(session_id, req, prompt_id, client_id)
        if response.status_code == 202:
            return wire.decode(wire.PROMPT_ACCEPTED, response.content)
        if response.status_code == 200:
            return _ended(response.content, session_id)
        raise error_from_answer(response.status_code, response.content, response.headers,
                                session_id)

    async def prompt(self, session_id: str, req: PromptInput, client_id: str | None = None, *,
                     on_event: EventCallback | None = None,
                     prompt_id: str | None = None) -> PromptResult:
        """Send a prompt and wait for its turn to end (see the module contract).
        ``on_event`` sees each event of this prompt as it arrives (a coroutine function
        is awaited before the next event is read: it may answer a ``permission_request``
        with ``respond_to_permission``, which the turn waits for). The prompt is sent
        under ``prompt_id`` (a new one when ``None``; a request's own id wins), so a
        fleet instance's ``owner_lost`` / ``owner_unreachable`` is answered by sending
        it again (at most ``MAX_PROMPT_SENDS`` sends, ``Retry-After`` apart, capped
        by ``max_retry_wait_s``) when the server has the ``prompt_id_replay`` feature:
        it runs once."""
        return await self._prompt(session_id, req, client_id, self.max_pending_prompts_per_session,
                                  on_event, prompt_id)

    async def _prompt(self, session_id: str, req: PromptInput, client_id: str | None,
                      limit: int | None, on_event: EventCallback | None,
                      prompt_id: str | None = None) -> PromptResult:
        await anyio.lowlevel.checkpoint_if_cancelled()  # already cancelled: reserve nothing
        with self.reservations.reserve(session_id, limit):
            response = await self._send_prompt(session_id, req, prompt_id, client_id)
            if response.status_code == 202:
                accepted = wire.decode(wire.PROMPT_ACCEPTED, response.content)
                try:
                    return await self._await_turn(session_id, accepted, client_id, on_event)
                except DaemonHttpError as exc:   # gone before its events could be read
                    if exc.status != 404 or not await self._replays_prompt_ids():
                        raise
                    ended = await self._send_prompt(session_id, req, accepted.prompt_id,
                                                    client_id)
                    if ended.status_code == 202:   # live again (loaded): watched from here
                        return await self._await_turn(
                            session_id, wire.decode(wire.PROMPT_ACCEPTED, ended.content),
                            client_id, on_event)
                    if ended.status_code != 200:
                        raise
                    return _ended(ended.content, session_id)
            if response.status_code == 200:
                return _ended(response.content, session_id)
            raise error_from_answer(response.status_code, response.content, response.headers,
                                    session_id)

    async def _send_prompt(self, session_id: str, req: PromptInput, prompt_id: str | None,
                           client_id: str | None) -> httpx.Response:
        """``POST …/prompt`` under the prompt's id, at most ``MAX_PROMPT_SENDS`` times
        (the same body): again while a fleet instance answers one of ``RESEND_CODES``,
        and after a send that got no answer (``_cut_or_unsent``); the last answer, or
        the last send's ``DaemonConnectionError``."""
        body, named = named_prompt(req, prompt_id or new_prompt_id())
        path = _session_path(session_id, "prompt")
        failed: DaemonConnectionError | None = None   # the last send's, when it got no answer
        taken = False   # and it may have been admitted (cut, not refused)
        for sends in range(1, MAX_PROMPT_SENDS + 1):
            last = sends == MAX_PROMPT_SENDS
            if taken and failed is not None:
                replays = await self._replays_prompt_ids(unreachable=None)
                if replays is False:
                    raise failed
                if replays is None:   # still unreachable: not sent, waited for again
                    if last:
                        raise failed
                    await anyio.sleep(self._reconnect_wait_s(sends))
                    continue
            try:
                response = await self._send("POST", path, body=body, client_id=client_id)
            except DaemonConnectionError as exc:
                kind = _cut_or_unsent(exc)
                if named is None or last or kind is None:
                    raise
                failed, taken = exc, kind == "cut"
                await anyio.sleep(self._reconnect_wait_s(sends))
                continue
            taken = False
            if named is None or last or not _resend(response) \
                    or not await self._replays_prompt_ids():
                return response
            await anyio.sleep(min(_retry_after_s(response), self.max_retry_wait_s))
        assert failed is not None
        raise failed

    def _reconnect_wait_s(self, sends: int) -> float:
        return min(RECONNECT_WAIT_S * 2 ** (sends - 1), self.max_retry_wait_s)

    async def _replays_prompt_ids(self, unreachable: bool | None = False) -> bool | None:
        """The server says (``/capabilities``: ``prompt_id_replay``) that a prompt sent
        again under its id runs once: an older one would run it twice. Asked once (a
        failed ask is not remembered: ``False``, or ``unreachable`` when no answer came).
        With ``unreachable=None`` (a cut send waits for the server to answer), a failure
        the next ask would repeat (``errors.lasting_failure``: a certificate that does
        not verify, a name that does not resolve) is raised, as a send's is: it is no
        server out of reach for now."""
        if self._prompt_id_replay is None:
            try:
                features = (await self.capabilities()).features
            except DaemonConnectionError as exc:
                if unreachable is None and exc.__cause__ is not None \
                        and lasting_failure(exc.__cause__):
                    raise
                return unreachable
            except DaemonError:
                return False
            self._prompt_id_replay = "prompt_id_replay" in features
        return self._prompt_id_replay

    async def _await_turn(self, session_id: str, accepted: PromptAccepted, client_id: str | None,
                          on_event: EventCallback | None) -> PromptResult:
        watch = _TurnWatch(accepted.prompt_id)
        cursor = StreamCursor(accepted.last_event_id, accepted.event_epoch)
        try:
            async with contextlib.aclosing(self._events(session_id, cursor, client_id)) as events:
                async for event in events:
                    if event_prompt_id(event) == watch.prompt_id:
                        watch.see(event)
                        if on_event is not None:
                            seen = on_event(event)
                            if inspect.isawaitable(seen):   # a coroutine function's
                                await seen
                    result = match_turn_event(event, watch.prompt_id)
                    if result is not None:
                        return result
            raise DaemonStreamEndedError(
                f"Event stream of session {session_id!r} ended without the turn's completion")
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_GRACE_S):
                await self._cancel_turn(session_id, watch, client_id)
            raise

    async def _cancel_turn(self, session_id: str, watch: _TurnWatch, client_id: str | None) -> None:
        """Stop our own prompt: ``cancel`` once it runs (cancel hits only the running
        prompt); while it may still be queued, drop it from the queue first."""
        try:
            if not watch.running and await self.remove_pending_prompt(
                    session_id, watch.prompt_id, client_id):
                return
            await self.cancel(session_id, client_id)
        except DaemonError:
            pass  # best effort: the caller has gone either way

    # -- events ----------------------------------------------------------------------------------
    def _events(self, session_id: str, cursor: StreamCursor, client_id: str | None, *,
                max_queued: int | None = None, reconnect: bool = True,
                max_reconnects: int = 5) -> AsyncGenerator[DaemonEvent, None]:
        return subscribe_events(self._http, _session_path(session_id, "events"), cursor=cursor,
                                headers=self._headers(client_id), max_queued=max_queued,
                                timeout=self._stream_timeout, session_id=session_id,
                                reconnect=reconnect, max_reconnects=max_reconnects,
                                max_event_bytes=self.max_event_bytes)

    def subscribe_events(self, session_id: str, *, last_event_id: int | None = None,
                         epoch: str | None = None, max_queued: int | None = None,
                         client_id: str | None = None, cursor: StreamCursor | None = None,
                         reconnect: bool = True, max_reconnects: int = 5
                         ) -> AsyncGenerator[DaemonEvent, None]:
        """The session's events (async iterator; close it with ``contextlib.aclosing``).
        Without ``last_event_id`` only live events; with it, everything after it. Drops
        are resumed (see ``acp_server.client.events``); pass ``cursor`` to observe it."""
        if cursor is None:
            cursor = StreamCursor(last_event_id, epoch)
        return self._events(session_id, cursor, client_id, max_queued=max_queued,
                            reconnect=reconnect, max_reconnects=max_reconnects)


__all__ = ["DaemonClient", "PromptInput", "prompt_body"]
