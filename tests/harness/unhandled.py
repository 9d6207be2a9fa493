"""No exception escapes the app unnoticed: what a server would log as "Exception in ASGI
application" fails the test that caused it.

    async with serving(app) as url: ...        # raises at the end if the app raised
    async with serving(app, app_errors_expected=True) as url: ...   # a test that provokes it
    unhandled_lines(child.stderr_text())      # the same lines in an ``acp-server serve`` log

A server catches whatever an ASGI app raises and logs it (uvicorn: "Exception in ASGI
application", hypercorn: "Error in ASGI Framework", granian: "Application callable
raised an exception"), then answers 500 or drops the connection; the client sees a
failure the test may well have expected for another reason. So:

* in process, ``Escapes`` wraps the app: an exception out of an ``http`` or
  ``websocket`` call (not a cancellation, which is how a server stops its calls, nor
  hypercorn's own send race, ``_hypercorns_own``) is kept, and the ``serving`` block raises ``AssertionError`` with them at its end;
* for a child, ``ServeProcess`` looks for those log lines when its block ends without
  an error of its own, and for the lines of an error the asyncio loop only logs (a
  task nobody awaited, a callback that raised: ``tests.harness.loop_errors`` fails
  them in process).
"""

from __future__ import annotations

import traceback
from typing import Any

import anyio

SERVER_LINES = ("Exception in ASGI application", "Error in ASGI Framework",
                "Application callable raised an exception",
                # and what the asyncio loop only logs (``tests.harness.loop_errors``)
                "Task exception was never retrieved", "Future exception was never retrieved",
                "Exception in callback ")


def unhandled_lines(log: str) -> list[str]:
    """The lines of ``log`` in which a server reports an exception out of the app."""
    return [line for line in log.splitlines() if any(mark in line for mark in SERVER_LINES)]


def _hypercorns_own(exc: BaseException) -> bool:
    """hypercorn's race under trio (the test server only): its reader task sends the
    connection's EOF without the send lock while an answer's last write is under way,
    and that write raises ``trio.BusyResourceError`` out of the app's ``send``."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_hypercorns_own(inner) for inner in exc.exceptions)
    return type(exc).__name__ == "BusyResourceError" and type(exc).__module__ == "trio"


class Escapes:
    """An ASGI app that records what escapes ``app`` (then re-raises it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.raised: list[tuple[str, BaseException]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:
            if scope.get("type") in ("http", "websocket") and not _hypercorns_own(exc):
                self.raised.append((f"{scope.get('method', 'WS')} {scope.get('path')}", exc))
            raise

    def check(self) -> None:
        if self.raised:
            shown = "\n".join(f"{where}:\n" + "".join(traceback.format_exception(exc))
                              for where, exc in self.raised[:3])
            raise AssertionError(f"{len(self.raised)} exception(s) escaped the app "
                                 f"(the server's 'Exception in ASGI application'):\n{shown}")
