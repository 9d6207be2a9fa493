"""Sending one fuzzed request; event streams are opened and closed at once."""

from __future__ import annotations

import httpx


def send(http: httpx.Client, method: str, path: str, *, content: bytes | None = None,
         headers: dict[str, str] | None = None, params: dict[str, str] | None = None
         ) -> httpx.Response:
    with http.stream(method, path, content=content, headers=headers, params=params) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response   # a stream opened: its status and headers are the answer
        response.read()
        return response
