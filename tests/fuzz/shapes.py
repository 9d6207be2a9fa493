"""Each door's documented answer shape, asserted on every fuzzed answer.

    check_rest(response)    # < 500; an error is JSON {"error": str, "code"?: str}
    check_lmsp(response)    # < 500; an error is application/problem+json with code/status
    check_acp(response)     # < 500; an error is a JSON-RPC error or {"error": str}
"""

from __future__ import annotations

import json
from typing import Any

import httpx


def _json(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError as exc:
        raise AssertionError(f"not JSON: {response.status_code} {response.content[:200]!r}") \
            from exc


def _no_5xx(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.request.method, response.request.url,
                                        response.status_code, response.content[:500])


def check_rest(response: httpx.Response) -> None:
    _no_5xx(response)
    if response.status_code < 400 or response.request.method == "HEAD":
        return
    assert response.headers.get("content-type", "").startswith("application/json"), response
    body = _json(response)
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    assert "code" not in body or isinstance(body["code"], (str, int)), body


def check_lmsp(response: httpx.Response) -> None:
    _no_5xx(response)
    if response.status_code < 400 or response.request.method == "HEAD":
        return
    assert response.headers.get("content-type", "").startswith("application/problem+json"), \
        (response.status_code, response.headers, response.content[:300])
    body = _json(response)
    assert isinstance(body.get("code"), str) and body.get("status") == response.status_code, body
    assert body["type"].endswith(body["code"]) and isinstance(body.get("title"), str), body


BATCH_REFUSED = b'{"error":"Batch JSON-RPC requests are not supported"}'


def check_acp(response: httpx.Response) -> None:
    if response.status_code == 501:   # the peer's documented answer to a JSON array
        assert response.content == BATCH_REFUSED and response.request.method == "POST"
        assert json.loads(response.request.content).__class__ is list
        return
    _no_5xx(response)
    if response.status_code < 400 or response.request.method == "HEAD":
        return
    assert response.headers.get("content-type", "").startswith("application/json"), response
    body = _json(response)
    if "jsonrpc" in body:
        assert body["jsonrpc"] == "2.0" and isinstance(body["error"]["code"], int), body
        assert isinstance(body["error"]["message"], str), body
    else:
        assert isinstance(body.get("error"), str), body


def check_rpc_message(message: Any) -> None:
    """A message written on an /acp stream or WebSocket."""
    assert isinstance(message, dict) and message.get("jsonrpc") == "2.0", message
    if "error" in message:
        assert isinstance(message["error"]["code"], int), message
