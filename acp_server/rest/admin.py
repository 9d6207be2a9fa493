"""``/tokens`` and ``/audit``: the principals' administration over HTTP (``admin`` scope);
``/whoami``: the caller's own principal (any credential).

    $ curl -s -X POST localhost:4170/tokens -H "Authorization: Bearer $ADMIN" \\
        -d '{"name":"ci","scopes":["prompt","read"],"expires":"30d"}'
    {"token":"acps_9f2c4d1e0b7a6c35_Qm9v…","name":"ci","id":"9f2c4d1e0b7a6c35",…}   # 201
    $ curl -s localhost:4170/tokens -H "Authorization: Bearer $ADMIN"        # ?all=true
    {"tokens":[{"name":"ci","id":"9f2c…","scopes":["prompt","read"],"lastUsedAt":null,…}]}
    $ curl -s -X DELETE localhost:4170/tokens/ci -H "Authorization: Bearer $ADMIN"
    {"revoked":[{"name":"ci",…,"revokedAt":"2026-…Z","revokedBy":"bootstrap"}]}
    $ curl -s 'localhost:4170/audit?principal=ci&since=2026-12-01T00:00:00Z&limit=50' …
    {"records":[{"seq":17,"at":1796…,"principal":"ci","action":"session.created",…}],
     "nextCursor":"17"}
    $ curl -s localhost:4170/whoami -H "Authorization: Bearer $CI"
    {"name":"ci","kind":"token","scopes":["prompt","read"],"rateClass":"default",…}

Contracts: the front layer has checked the ``admin`` scope (``rest.access``). The
token is in the creation answer only, never again. A name with a live token is 409
``token_exists``; revoking a name without one is 404 ``token_not_found``; a bad
name, scope, rate class or expiry is 400 ``invalid_token_request``. ``/audit`` pages
oldest first: ``after`` is the ``nextCursor`` of the previous page (``null`` on the
last); ``limit`` 1..1000 (default 100); ``since`` / ``until`` are ISO 8601 times or
epoch seconds; ``principal`` and ``action`` filter exactly. A store that cannot
answer is 503 ``store_unavailable`` (the door's handler).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from acp_server.http.endpoints import route
from acp_server.principals import Gate, InvalidPrincipalError, caller_of
from acp_server.principals.admin import token_json
from acp_server.principals.audit import as_json
from acp_server.rest import wire
from acp_server.rest.config import RestConfig
from acp_server.rest.errors import RestError, bad_request, json_response
from acp_server.store.audit import AuditQuery
from acp_server.store.tokens import TokenNameTakenError

MAX_AUDIT_PAGE = 1000


async def create_token(request: Request, *, gate: Gate, config: RestConfig) -> Response:
    body = await wire.read_json(request, wire.CreateTokenBody, limit=config.max_body_bytes)
    try:
        issued = await gate.create_token(caller_of(request.scope), body.name,
                                         scopes=body.scopes, expires=body.expires,
                                         rate_class=body.rateClass)
    except InvalidPrincipalError as exc:
        raise bad_request(str(exc), "invalid_token_request") from None
    except TokenNameTakenError as exc:
        raise RestError(409, {"error": str(exc), "code": "token_exists",
                              "name": exc.name}) from None
    return json_response(201, {"token": issued.token, **token_json(issued.record)})


async def list_tokens(request: Request, *, gate: Gate) -> Response:
    every = request.query_params.get("all", "false").lower() in ("1", "true")
    records = await gate.list_tokens(include_revoked=every)
    return json_response(200, {"tokens": [token_json(r) for r in records]})


async def revoke_token(request: Request, *, gate: Gate) -> Response:
    name = request.path_params["token_name"]
    revoked = await gate.revoke_token(caller_of(request.scope), name)
    if not revoked:
        raise RestError(404, {"error": f"No live token named {name[:80]!r}.",
                              "code": "token_not_found", "name": name[:80]})
    return json_response(200, {"revoked": [token_json(r) for r in revoked]})


def parse_time(value: str | None, param: str) -> float | None:
    """ISO 8601 (``Z`` or an offset; naive is UTC) or epoch seconds."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise bad_request(f"`{param}` must be an ISO 8601 time or epoch seconds",
                          "invalid_audit_query") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def audit_query(params: Any) -> AuditQuery:
    raw_limit, raw_after = params.get("limit", "100"), params.get("after") or "0"
    if not (raw_limit.isascii() and raw_limit.isdigit()) or \
            not 1 <= int(raw_limit) <= MAX_AUDIT_PAGE:
        raise bad_request(f"`limit` must be an integer from 1 to {MAX_AUDIT_PAGE}",
                          "invalid_audit_query")
    if not (raw_after.isascii() and raw_after.isdigit()) or len(raw_after) > 18:
        raise bad_request("`after` must be the nextCursor of a previous page",
                          "invalid_audit_query")
    return AuditQuery(principal=params.get("principal") or None,
                      action=params.get("action") or None,
                      since=parse_time(params.get("since"), "since"),
                      until=parse_time(params.get("until"), "until"),
                      after=int(raw_after), limit=int(raw_limit))


async def read_audit(request: Request, *, gate: Gate) -> Response:
    query = audit_query(request.query_params)
    records = await gate.audit.read(dataclasses.replace(query, limit=query.limit + 1))
    page = records[:query.limit]
    more = len(records) > query.limit
    return json_response(200, {"records": as_json(page),
                               "nextCursor": str(page[-1].seq) if more and page else None})


async def whoami(request: Request, *, gate: Gate) -> Response:
    caller = caller_of(request.scope)
    principal = caller.principal
    return json_response(200, {"name": principal.name, "kind": principal.kind,
                               "scopes": sorted(principal.scopes),
                               "rateClass": principal.rate_class,
                               "sharedSessions": gate.share_sessions})


def routes(gate: Gate, config: RestConfig) -> list[BaseRoute]:
    return [
        route("/whoami", whoami, ["GET"], gate=gate),
        route("/tokens", create_token, ["POST"], gate=gate, config=config),
        route("/tokens", list_tokens, ["GET"], gate=gate),
        route("/tokens/{token_name}", revoke_token, ["DELETE"], gate=gate),
        route("/audit", read_audit, ["GET"], gate=gate),
    ]


__all__ = ["audit_query", "parse_time", "routes"]
