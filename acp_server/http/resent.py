"""A request the rate limit refused that its door lets through all the same: a prompt
sent again under its id (it admits nothing new).

    door = Door("", "rest", rest_render, rest_access, resent=PromptSentAgain(bridge, config))
    receive = await let_through(door.resent, scope, receive, path, caller, denial)
    # None: the refusal stands; else the request goes on with ``receive``

Contracts:

* Asked only when the principals' policy refused the request for its rate
  (``rate_limit_exceeded``) and the door has a ``Resent`` that ``wants`` the request
  (its method and path): every other request, and every request the rate limit
  passes, costs nothing here.
* The body is read here, at most ``Resent.limit`` bytes (the door's body cap): a
  declared ``Content-Length`` over it is not read at all, and reading stops once the
  bytes received pass it; either way, and when the client goes away meanwhile, the
  refusal stands (a refused request's body is never read further).
* The ``Resent`` decides on the whole body (``True``: let it through). It goes on
  uncharged (the refused ``check`` took nothing) with a ``receive`` that gives the body
  read, unchanged, as one ``http.request`` message, then whatever the client sends
  (its disconnect): the route, or a hot route's fast handler, reads it as it would
  have read the client.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

from acp_server.principals import Caller, Denial

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Any]
RATE_LIMITED = "rate_limit_exceeded"


class Resent(Protocol):
    """A door's judge of requests sent again: ``limit`` is its body cap."""

    limit: int

    def wants(self, method: str, path: str) -> bool: ...

    def __call__(self, scope: Scope, path: str, caller: Caller, body: bytes) -> bool: ...


async def let_through(resent: Resent, scope: Scope, receive: Receive, path: str,
                      caller: Caller, denial: Denial) -> Receive | None:
    """The ``receive`` to go on with when ``resent`` lets the refused request through,
    else ``None`` (see the contracts)."""
    if denial.code != RATE_LIMITED or not resent.wants(scope["method"], path):
        return None
    limit = resent.limit
    for name, value in scope["headers"]:
        if name == b"content-length" and (not value.isdigit() or int(value) > limit):
            return None
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None   # gone: the refusal is sent to nobody
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    body = b"".join(chunks)
    if not resent(scope, path, caller, body):
        return None
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()   # type: ignore[no-any-return]

    return replayed


__all__ = ["RATE_LIMITED", "Resent", "let_through"]
