"""The OpenAPI 3.1 document of every REST and LMSP route, built from one table.

    document()                                   # the dict served at GET /openapi.json
    python -m acp_server.ops.openapi openapi.json            # (re)write the checked-in copy
    python -m acp_server.ops.openapi --check openapi.json    # exit 1 when it is stale

Contracts:

* ``OPERATIONS`` is the only description of the routes: one ``Op`` per method and
  path, with its body type, query parameters, the request headers that matter, and
  every status it answers. Schemas come from msgspec types through
  ``msgspec.json.schema_components``: the wire types of ``acp_server.rest.wire`` and
  ``acp_server.lmsp.wire`` (every answer is one), plus the documentation types of
  ``acp_server.ops.openapi_types`` for the error bodies and the bodies as accepted. A test fails when a route mounted in the app is missing here.
* Errors are ``RestError`` bodies (``application/json``) on REST routes and problem
  objects (``application/problem+json``) under ``/lmsp/v1``; 401 and 403 (the network
  guard) are listed on every operation, 401 aside on the ``public`` ones (the web
  console's files). Event streams are ``text/event-stream`` whose schema is one event
  (``Events``: OpenAPI 3.1 reads it so), its ``data`` JSON described by
  ``contentSchema``.
* ``/acp`` (JSON-RPC) and its per-workspace alias ``/workspaces/{workspace}/acp`` are
  not in the document.
* The document does not depend on the settings, so the checked-in ``openapi.json``
  (``make schemas``) is exactly what the server answers.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from acp_server import __version__
from acp_server.lmsp import wire as lmsp_wire
from acp_server.ops.openapi_types import (
    AuditPage,
    CreateSessionRequest,
    PermissionVote,
    PromptQueueFull,
    PromptRequest,
    RateLimited,
    ResponseRequest,
    RestError,
    TaskEnvelope,
    TokenCreated,
    TokenList,
    TokensRevoked,
    WhoAmI,
)
from acp_server.rest import wire as rest_wire
from acp_server.http.session_cursor import MAX_CURSOR_CHARS
from acp_server.http.ended_cursor import MAX_CURSOR_CHARS as ENDED_CURSOR_CHARS
from bridge.wire import EventEnvelope

REF = "#/components/schemas/{name}"
PROBLEM_JSON = "application/problem+json"
JSON = "application/json"
SSE = "text/event-stream"


# -- the table ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Events:
    """An event stream's schema (OpenAPI 3.1: the schema of one event, as a client
    parses it): ``event`` one of the names, ``id`` decimal, ``retry`` on the first, and
    ``data`` one line of JSON of that variant's type (``contentSchema``). No names:
    any ``event``. ``name`` is its component."""

    name: str
    variants: tuple[tuple[tuple[str, ...], Any], ...]


LMSP_EVENTS = Events("ResponseStreamEvent", (
    (("response.created", "response.in_progress", "response.completed", "response.incomplete",
      "response.failed", "response.cancelled"), lmsp_wire.ResponseEvent),
    (("response.output_item.added", "response.output_item.done"), lmsp_wire.OutputItemEvent),
    (("response.content_part.added", "response.content_part.done"),
     lmsp_wire.ContentPartEvent),
    (("response.output_text.delta",), lmsp_wire.TextDeltaEvent),
    (("response.output_text.done",), lmsp_wire.TextDoneEvent),
    (("response.reasoning_text.delta",), lmsp_wire.ReasoningDeltaEvent),
    (("response.reasoning_text.done",), lmsp_wire.ReasoningDoneEvent),
))
SESSION_EVENTS = Events("SessionStreamEvent", (((), EventEnvelope),))


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    status: int
    description: str
    schema: Any = None               # a msgspec type, or None for no body
    content_type: str = JSON
    headers: tuple[str, ...] = ()    # names in RESPONSE_HEADERS
    # each (path parameter, JSON pointer into this body): an OpenAPI link to every
    # operation whose path has that parameter
    links: tuple[tuple[str, str], ...] = ()
    # other (content type, schema) pairs the same status may answer with
    alternatives: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Query:
    name: str
    description: str
    schema: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    method: str
    path: str
    summary: str
    answers: tuple[Answer, ...]
    errors: tuple[int, ...] = ()     # error statuses in the door's error shape
    body: Any = None                 # a msgspec type (application/json, optional)
    query: tuple[Query, ...] = ()
    headers: tuple[str, ...] = ()    # names in REQUEST_HEADERS
    # error statuses whose body has its own schema (instead of the door's error shape)
    error_schemas: tuple[tuple[int, Any], ...] = ()
    public: bool = False             # served without the token (no 401)


REQUEST_HEADERS: dict[str, tuple[str, dict[str, Any]]] = {
    "X-Qwen-Client-Id": ("The client id the server issued for this session (validated: "
                         "1-128 of A-Z a-z 0-9 . _ : -).", {"type": "string"}),
    "Last-Event-ID": ("Resume after this event id (a decimal integer).", {"type": "string"}),
    "X-Qwen-Event-Epoch": ("The event epoch the Last-Event-ID belongs to.", {"type": "string"}),
    "Idempotency-Key": ("1-255 visible ASCII characters, bare or as a quoted string; a "
                        "replay answers the same task.", {"type": "string"}),
}
RESPONSE_HEADERS: dict[str, tuple[str, dict[str, Any]]] = {
    "Retry-After": ("Seconds to wait before retrying.", {"type": "string"}),
    "X-Qwen-Event-Epoch": ("The epoch of the session's event ids.", {"type": "string"}),
    "X-Qwen-SSE-Stream-Id": ("A fresh id for this stream.", {"type": "string"}),
    "Location": ("The task's URL.", {"type": "string"}),
    "Idempotent-Replayed": ("`true` when the answer replays an earlier request.",
                            {"type": "string"}),
}
ERROR_TEXT = {
    400: "Invalid request", 401: "Unauthorized (a valid bearer token is required)",
    403: "Refused: the Origin policy, or a scope the credential lacks",
    404: "Not found (or another principal's)", 405: "Method not allowed",
    409: "Conflict", 410: "Gone (past the retention window)", 413: "Body too large",
    422: "Idempotency key reused with another body",
    429: "Rate limit exceeded (a stored token's tier), or too many subscribers",
    500: "Agent error", 501: "Not supported by the agent", 503: "Over capacity, retry later",
    504: "The agent did not answer in time",
}
RETRYABLE = (429, 503)
HTML = "text/html"
STATIC_TYPES = (("text/javascript", str), ("text/css", str), ("image/svg+xml", str))
LMSP_STREAM = ((SSE, LMSP_EVENTS),)
# schemas of path parameters other than plain strings (by name, across routes)
PAGE_SIZE = {"type": "integer", "minimum": 1, "maximum": 100}
SEQUENCE = {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}
PATH_PARAMS: dict[str, dict[str, Any]] = {
    "name": {"type": "string", "examples": ["app.js", "style.css", "index.html"]},
    "token_name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"},
}
SSE_ANSWER = Answer(200, "The event stream", SESSION_EVENTS, SSE,
                    ("X-Qwen-Event-Epoch", "X-Qwen-SSE-Stream-Id"))
CLIENT = ("X-Qwen-Client-Id",)
AGENT = (500, 504)   # routes that wait on the agent
W, L = rest_wire, lmsp_wire
SESSION_LINK = ("session_id", "/sessionId")

OPERATIONS: tuple[Op, ...] = (
    # -- REST + SSE (qwen serve 0.24.4) --
    Op("GET", "/health", "Liveness; `?deep=1` adds aggregates", (Answer(200, "Alive", W.Health),),
       query=(Query("deep", "`1` or `true` for aggregates", {"type": "string"}),)),
    Op("GET", "/capabilities", "What this daemon offers",
       (Answer(200, "Capabilities", W.RestCapabilities,
               links=(("workspace", "/workspaces/0/id"),)),)),
    Op("GET", "/daemon/status", "Limits in force and runtime activity",
       (Answer(200, "Status", W.DaemonStatus),), (400,),
       query=(Query("detail", "`summary` (default) or `full` (adds `full.sessions`)",
                    {"type": "string", "enum": ["summary", "full"]}),)),
    Op("GET", "/workspace/{workspace}/sessions",
       "The workspace's live sessions, newest first, a page at a time: `{workspace}` is "
       "the workspace id (another, or a relative path, is 400 `workspace_not_found`, as "
       "the peer's 400) or, as the peer, its absolute path URL-encoded (another folder's "
       "is the peer's 400 `workspace_mismatch` with `boundWorkspace` and "
       "`requestedWorkspace`)",
       (Answer(200, "A page of sessions", W.SessionPage),), (400,),
       query=(Query("size", "Page size (default 20; clamped to 1..100, as the peer)", PAGE_SIZE),
              Query("cursor", "The `nextCursor` of the previous page (opaque)",
                    {"type": "string", "pattern": "^[A-Za-z0-9_-]*$",
                     "maxLength": MAX_CURSOR_CHARS}))),
    Op("GET", "/workspace/{workspace}/ended-sessions",
       "The closed sessions the journal keeps (agent died, idle timeout), newest end "
       "first: `/load` brings one back",
       (Answer(200, "A page of ended sessions", W.EndedSessionPage),), (400, 404, 503),
       query=(Query("size", "Page size (default 20; clamped to 1..100)", PAGE_SIZE),
              Query("cursor", "The `nextCursor` of the previous page (opaque)",
                    {"type": "string", "pattern": "^[A-Za-z0-9_-]*$",
                     "maxLength": ENDED_CURSOR_CHARS}))),
    Op("GET", "/workspaces/{workspace}/sessions",
       "The same listing under the peer's per-workspace path: `{workspace}` is the "
       "workspace id or its absolute path (URL-encoded); another is 400 `workspace_mismatch`",
       (Answer(200, "A page of sessions", W.SessionPage),), (400,),
       query=(Query("size", "Page size (default 20; clamped to 1..100, as the peer)", PAGE_SIZE),
              Query("cursor", "The `nextCursor` of the previous page (opaque)",
                    {"type": "string", "pattern": "^[A-Za-z0-9_-]*$",
                     "maxLength": MAX_CURSOR_CHARS}))),
    Op("POST", "/session", "Create a session or attach to the workspace's default one",
       (Answer(200, "The session", W.SessionCreated, links=(SESSION_LINK,)),),
       (400, 413, 503, *AGENT),
       body=CreateSessionRequest, headers=CLIENT),
    Op("DELETE", "/session/{session_id}",
       "Close a session and remove its journal, or delete an ended one the journal keeps",
       (Answer(204, "Closed, or deleted"),), (400, 404, 503), headers=CLIENT),
    Op("POST", "/session/{session_id}/load", "Attach a live session or restore it (session/load)",
       (Answer(200, "The session", W.SessionRestored),), (400, 404, 413, 501, 503, *AGENT),
       body=W.RestoreBody, headers=CLIENT),
    Op("POST", "/session/{session_id}/resume",
       "Attach a live session or restore it (session/resume)",
       (Answer(200, "The session", W.SessionRestored),), (400, 404, 413, 501, 503, *AGENT),
       body=W.RestoreBody, headers=CLIENT),
    Op("POST", "/session/{session_id}/branch", "Fork a session (no prompt pending)",
       (Answer(201, "The new session", W.SessionBranched, links=(SESSION_LINK,)),),
       (400, 404, 409, 413, 501, 503, *AGENT),
       body=W.BranchBody, headers=CLIENT),
    Op("POST", "/session/{session_id}/cancel", "Cancel the running prompt",
       (Answer(204, "Cancelled (or nothing was running)"),), (400, 404), headers=CLIENT),
    Op("GET", "/session/{session_id}/status", "A session's status",
       (Answer(200, "Status", W.SessionStatus),), (404,)),
    Op("POST", "/session/{session_id}/heartbeat", "Mark the client as present",
       (Answer(200, "Last seen", W.Heartbeat),), (400, 404), headers=CLIENT),
    Op("POST", "/session/{session_id}/approval-mode",
       "Set the session's mode on its agent (session/set_mode): one the agent offers",
       (Answer(200, "The mode set, and the one before", W.ApprovalModeSet),),
       (400, 404, 409, 413, 503, 504), body=W.ApprovalModeBody, headers=CLIENT),
    Op("POST", "/session/{session_id}/model",
       "Set the session's model on its agent (session/set_model)",
       (Answer(200, "The agent's answer (an object)", dict),),
       (400, 404, 409, 413, 503, 504), body=W.ModelBody, headers=CLIENT),
    Op("POST", "/session/{session_id}/config-option",
       "Set one of the agent's config options (session/set_config_option)",
       (Answer(200, "The agent's options after the change", W.ConfigOptionSet),),
       (400, 404, 409, 413, 503, 504), body=W.ConfigOptionBody, headers=CLIENT),
    Op("POST", "/session/{session_id}/prompt", "Send a prompt (non-blocking)",
       (Answer(202, "Admitted (or, sent again under its `promptId`, still pending)",
               W.PromptAccepted, headers=("Idempotent-Replayed",)),
        Answer(200, "Sent again under its `promptId`: how the prompt ended",
               W.PromptTerminal, headers=("Idempotent-Replayed",))),
       (400, 404, 409, 413, 503),
       body=PromptRequest, headers=CLIENT, error_schemas=((503, PromptQueueFull),)),
    Op("GET", "/session/{session_id}/pending-prompts", "Queued and running prompts",
       (Answer(200, "The pending prompts", W.PendingPrompts),), (404,)),
    Op("DELETE", "/session/{session_id}/pending-prompts/{prompt_id}",
       "Drop a queued prompt or cancel the running one",
       (Answer(200, "removed: false when the session has no such pending prompt",
               W.PendingPromptRemoved),), (400, 404), headers=CLIENT),
    Op("GET", "/session/{session_id}/events", "The session's event stream, with replay",
       (SSE_ANSWER,), (400, 404, 429),
       query=(Query("maxQueued", "Subscriber queue bound",
                    {"type": "integer", "minimum": 16, "maximum": 2048}),),
       headers=("X-Qwen-Client-Id", "Last-Event-ID", "X-Qwen-Event-Epoch")),
    Op("POST", "/session/{session_id}/permission/{request_id}", "Vote on a permission request",
       (Answer(200, "Recorded", W.EmptyObject),), (400, 404, 413),
       body=PermissionVote, headers=CLIENT),
    Op("POST", "/permission/{request_id}", "Vote on a permission request (legacy route)",
       (Answer(200, "Recorded", W.EmptyObject),), (400, 404, 413),
       body=PermissionVote, headers=CLIENT),
    # -- the web console (static files, public) --
    Op("GET", "/", "The web console's page", (Answer(200, "index.html", str, HTML),),
       public=True),
    Op("GET", "/web/{name}", "A file of the web console (one flat folder, exact names)",
       (Answer(200, "The file", str, HTML, alternatives=STATIC_TYPES),), (404,),
       public=True),
    # -- principals --
    Op("GET", "/whoami", "The caller's principal: name, scopes, rate class",
       (Answer(200, "The principal", WhoAmI),)),
    Op("POST", "/tokens", "Create a stored token (the token is in this answer only)",
       (Answer(201, "The token", TokenCreated),), (400, 409, 413, 503),
       body=W.CreateTokenBody),
    Op("GET", "/tokens", "The stored tokens (never their secrets)",
       (Answer(200, "The tokens", TokenList),), (503,),
       query=(Query("all", "`true`: revoked ones too", {"type": "string"}),)),
    Op("DELETE", "/tokens/{token_name}", "Revoke a token: refused within a second on every "
       "instance, its open streams ended", (Answer(200, "Revoked", TokensRevoked),),
       (404, 503)),
    Op("GET", "/audit", "The audit log, oldest first, a page at a time",
       (Answer(200, "A page of records", AuditPage),), (400, 503),
       query=(Query("principal", "Only this principal's records", {"type": "string"}),
              Query("action", "Only this action (e.g. `session.created`)",
                    {"type": "string"}),
              Query("since", "From this time (ISO 8601 or epoch seconds)",
                    {"type": "string"}),
              Query("until", "Before this time (ISO 8601 or epoch seconds)",
                    {"type": "string"}),
              Query("after", "The `nextCursor` of the previous page",
                    {"type": "string", "pattern": "^[0-9]{1,18}$"}),
              Query("limit", "Page size (default 100)",
                    {"type": "integer", "minimum": 1, "maximum": 1000}))),
    # -- operability --
    Op("GET", "/metrics", "Prometheus text exposition (the /health auth rule)",
       (Answer(200, "The metrics", str, "text/plain"),)),
    Op("GET", "/openapi.json", "This document", (Answer(200, "OpenAPI 3.1", dict),)),
    # -- LMSP v1 --
    Op("GET", "/lmsp/v1/capabilities", "LMSP capabilities and limits",
       (Answer(200, "Capabilities", L.Capabilities),)),
    Op("POST", "/lmsp/v1/responses",
       "Create a response (waits; streams with `stream`; answers at once with `background`)",
       (Answer(200, "The response (`stream: true`: its event stream, text/event-stream)",
               L.ResponseObject, headers=("Idempotent-Replayed",), alternatives=LMSP_STREAM,
               links=(("response_id", "/id"),)),),
       (400, 404, 409, 413, 422, 503), body=ResponseRequest, headers=("Idempotency-Key",)),
    Op("GET", "/lmsp/v1/responses/{response_id}",
       "A stored response as it stands; `stream=true` streams its events, resumable",
       (Answer(200, "The response (`stream=true`: its event stream)", L.ResponseObject,
               alternatives=LMSP_STREAM),
        Answer(204, "`stream=true` after the last event of a finished response")),
       (400, 404, 410),
       query=(Query("stream", "`true` (or `1`): the event stream instead of the object",
                    {"type": "string", "enum": ["true", "false", "1", "0"]}),
              Query("starting_after", "With `stream=true`: events after this sequence "
                    "number", SEQUENCE)),
       headers=("Last-Event-ID",)),
    Op("DELETE", "/lmsp/v1/responses/{response_id}",
       "Delete a finished response (its task and events)",
       (Answer(200, "Deleted", L.DeletedResponse),), (404, 409)),
    Op("POST", "/lmsp/v1/responses/{response_id}/cancel",
       "Cancel a queued or running response (400 once it has ended otherwise)",
       (Answer(200, "The response", L.ResponseObject),), (400, 404)),
    Op("GET", "/lmsp/v1/responses/{response_id}/input_items",
       "The messages a response was asked with (OpenAI's input items), a page at a time",
       (Answer(200, "A page of input items", L.InputItemList),), (400, 404),
       query=(Query("limit", "Page size (default 20)", PAGE_SIZE),
              Query("order", "`desc` (default, newest first) or `asc`",
                    {"type": "string", "enum": ["asc", "desc"]}),
              Query("after", "The `last_id` of the previous page", {"type": "string"}))),
    Op("GET", "/lmsp/v1/tasks", "The caller's tasks, newest first, a page at a time",
       (Answer(200, "A page of tasks", L.TaskList),), (400,),
       query=(Query("limit", "Page size (default 20)", PAGE_SIZE),
              Query("after", "The `last_id` of the previous page",
                    {"type": "string", "pattern": "^task_[0-9A-Z]{26}$"}),
              Query("status", "Only tasks in this status", {"type": "string", "enum": [
                  "queued", "loading", "running", "cancelling", "succeeded", "failed",
                  "cancelled"]}))),
    Op("POST", "/lmsp/v1/tasks", "Create an async task (202 once durable)",
       (Answer(202, "The task", L.TaskObject, headers=("Location", "Idempotent-Replayed"),
               links=(("task_id", "/id"), ("response_id", "/response_id"))),),
       (400, 404, 409, 413, 422, 503), body=TaskEnvelope, headers=("Idempotency-Key",)),
    Op("GET", "/lmsp/v1/tasks/{task_id}", "A task", (Answer(200, "The task", L.TaskObject),),
       (404,)),
    Op("POST", "/lmsp/v1/tasks/{task_id}/cancel", "Cancel a task",
       (Answer(200, "The task", L.TaskObject),), (404, 409)),
    Op("GET", "/lmsp/v1/tasks/{task_id}/events", "A task's events (SSE), resumable",
       (Answer(200, "The event stream", LMSP_EVENTS, SSE),
        Answer(204, "The task has ended and no event is left")),
       (400, 404, 410),
       query=(Query("starting_after", "Events after this sequence number", SEQUENCE),),
       headers=("Last-Event-ID",)),
)


# -- rendering ---------------------------------------------------------------------------
def _types() -> list[Any]:
    found: list[Any] = [RestError, RateLimited, lmsp_wire.Problem]
    for op in OPERATIONS:
        answers = [(a.schema, *(t for _, t in a.alternatives)) for a in op.answers]
        for t in (op.body, *(t for group in answers for t in group),
                  *(s for _, s in op.error_schemas)):
            for one in (v for _, v in t.variants) if isinstance(t, Events) else (t,):
                if isinstance(one, type) and issubclass(one, msgspec.Struct) \
                        and one not in found:
                    found.append(one)
    return found


def _schema_of(t: Any, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    if t is str:
        return {"type": "string"}
    if t is dict:
        return {"type": "object"}
    if isinstance(t, Events):
        return {"$ref": REF.format(name=t.name)}
    return refs[t]


def _stream_components(refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    streams = {t for op in OPERATIONS for a in op.answers
               for t in (a.schema, *(t for _, t in a.alternatives)) if isinstance(t, Events)}
    out = {}
    for stream in sorted(streams, key=lambda e: e.name):
        variants = [_event_schema(names, refs[data]) for names, data in stream.variants]
        out[stream.name] = variants[0] if len(variants) == 1 else {"oneOf": variants}
    return out


def _event_schema(names: tuple[str, ...], data: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"enum": list(names)} if names else {"type": "string"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "retry": {"type": "integer", "minimum": 0},
        "data": {"type": "string", "contentMediaType": JSON, "contentSchema": data}}}


def _header_objects(names: tuple[str, ...], table: dict[str, tuple[str, dict[str, Any]]]
                    ) -> dict[str, Any]:
    return {n: {"description": table[n][0], "schema": table[n][1]} for n in names}


def _operation(op: Op, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    lmsp = op.path.startswith("/lmsp/")
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True,
         "schema": PATH_PARAMS.get(name, {"type": "string"})}
        for name in re.findall(r"{(\w+)}", op.path)]
    params += [{"name": q.name, "in": "query", "required": False, "description": q.description,
                "schema": q.schema} for q in op.query]
    params += [{"name": h, "in": "header", "required": False,
                "description": REQUEST_HEADERS[h][0], "schema": REQUEST_HEADERS[h][1]}
               for h in op.headers]
    responses: dict[str, Any] = {}
    for answer in op.answers:
        entry: dict[str, Any] = {"description": answer.description}
        content = {content_type: {"schema": _schema_of(schema, refs)}
                   for content_type, schema in ((answer.content_type, answer.schema),
                                                *answer.alternatives)
                   if schema is not None}
        if content:
            entry["content"] = content
        if answer.headers:
            entry["headers"] = _header_objects(answer.headers, RESPONSE_HEADERS)
        if answer.links:
            entry["links"] = {k: v for link in answer.links for k, v in _links(*link).items()}
        responses[str(answer.status)] = entry
    for status in sorted({*op.errors, 403} | (set() if op.public else {401, 429})):
        schemas = dict(op.error_schemas)
        if 429 not in op.errors:   # only the rate limits' 429
            schemas.setdefault(429, RateLimited)
        content_type, schema = (PROBLEM_JSON, refs[lmsp_wire.Problem]) if lmsp and status != 403 \
            else (JSON, refs[schemas.get(status, RestError)])
        entry = {"description": ERROR_TEXT[status], "content": {content_type: {"schema": schema}}}
        if status in RETRYABLE:
            entry["headers"] = _header_objects(("Retry-After",), RESPONSE_HEADERS)
        responses[str(status)] = entry
    out: dict[str, Any] = {"summary": op.summary, "tags": [_door(op.path)],
                           "operationId": _operation_id(op), "responses": responses}
    if op.public:
        out["security"] = [{}]
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": op.path.startswith("/lmsp/"), "content": {
            JSON: {"schema": refs[op.body]}}}
    return out


def _links(param: str, pointer: str) -> dict[str, Any]:
    return {_operation_id(op): {"operationId": _operation_id(op),
                                "parameters": {param: f"$response.body#{pointer}"}}
            for op in OPERATIONS if "{" + param + "}" in op.path}


def _door(path: str) -> str:
    if path.startswith("/lmsp/"):
        return "lmsp"
    if path == "/" or path.startswith("/web/"):
        return "web"
    return "ops" if path in ("/metrics", "/openapi.json") else "rest"


def _operation_id(op: Op) -> str:
    words = re.sub(r"[{}]", "", op.path).replace("/lmsp/v1", "lmsp").strip("/")
    return op.method.lower() + "_" + (re.sub(r"[^A-Za-z0-9]+", "_", words) or "index")


def document() -> dict[str, Any]:
    types = _types()
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    refs = dict(zip(types, schemas))
    components.update(_stream_components(refs))
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": "acp-server", "version": __version__,
                 "description": "REST + SSE (compatible with qwen serve 0.24.4) and LMSP v1. "
                                "ACP JSON-RPC at /acp is not described here."},
        "tags": [{"name": "rest", "description": "REST + SSE"},
                 {"name": "lmsp", "description": "LMSP v1 tasks and responses"},
                 {"name": "ops", "description": "Metrics and this document"},
                 {"name": "web", "description": "The web console's static files (public)"}],
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"bearer": []}],
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


_BODY: bytes | None = None


async def openapi_endpoint(request: Request) -> Response:
    global _BODY
    if _BODY is None:
        _BODY = msgspec.json.encode(document())
    return Response(_BODY, 200, media_type=JSON)


def routes() -> list[BaseRoute]:
    return [Route("/openapi.json", openapi_endpoint, methods=["GET"])]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    path = args[0] if args else "openapi.json"
    text = render()
    if check:
        try:
            with open(path, encoding="utf-8") as fh:
                current = fh.read()
        except FileNotFoundError:
            current = ""
        if current != text:
            print(f"stale: {path} (run `make schemas`)", file=sys.stderr)
            return 1
        return 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
