"""Work on behalf of a request that ends when its client goes away.

    info = await until_disconnect(request, lambda: bridge.create_session(agent="qwen"))

Contracts:

* ``work`` runs while the client stays; its result is returned, its exception raised
  as it is.
* When the client disconnects first (``http.disconnect``), ``work`` is cancelled, so
  whatever it held is released at once (a session slot, an agent request), and
  ``ClientDisconnected`` is raised: each door answers it as it answers a client gone
  in the middle of its body (nobody reads the answer).
* Call it once the request body has been read: it listens on ``receive`` for the
  disconnect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.requests import Request

from acp_server.http.body import ClientDisconnected

T = TypeVar("T")


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    finished: list[T] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            finished.append(await work())
        except Exception as exc:   # raised below, outside the task group (unwrapped)
            failed.append(exc)
        tg.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if not finished:
        raise ClientDisconnected("The client went away before the answer")
    return finished[0]


__all__ = ["until_disconnect"]
