"""The ASGI pieces every fake endpoint the adapter talks to over real HTTP shares
(``tests.harness.local.serving`` serves them on a loopback port).

    async def app(scope, receive, send):
        if await lifespan(scope, receive, send):
            return                                 # not a request: answered here
        body = await read_body(receive)            # the whole request body

Contracts: ``lifespan`` completes each lifespan event until the shutdown and answers
``True`` for any scope that is not ``http`` (nothing more to do with it), ``False``
for a request; ``read_body`` reads until the last ``http.request`` message.
"""

from __future__ import annotations

from typing import Any


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    if scope["type"] == "lifespan":
        while True:
            kind = (await receive())["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                break
    return scope["type"] != "http"


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
