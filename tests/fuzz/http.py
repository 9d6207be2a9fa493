"""Sending one fuzzed request; event streams are opened and closed at once.

A keep-alive connection the server closed after an answer whose request body it did
not read (hypercorn does so; uvicorn drains it) fails the *next* request before it is
sent: that one is retried once on a fresh connection. A request that gets no answer
twice fails the test.
"""

from __future__ import annotations

import httpx
from hypothesis import note


def send(http: httpx.Client, method: str, path: str, *, content: bytes | None = None,
         headers: dict[str, str] | None = None, params: dict[str, str] | None = None
         ) -> httpx.Response:
    # a short account of the request (a huge body's repr is no use in a failure report)
    note(f"{method} {path} params={params!r} headers={headers!r} "
         f"body[{len(content or b'')}]={(content or b'')[:300]!r}")
    try:
        return _send(http, method, path, content, headers, params)
    except httpx.RemoteProtocolError:
        return _send(http, method, path, content, headers, params)


def _send(http: httpx.Client, method: str, path: str, content: bytes | None,
          headers: dict[str, str] | None, params: dict[str, str] | None) -> httpx.Response:
    with http.stream(method, path, content=content, headers=headers, params=params) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response   # a stream opened: its status and headers are the answer
        response.read()
        return response
