"""A whole answer in one write: the front layer's hot answers on uvicorn's HTTP/1.1.

    await send_whole(send, start, end)   # the two ASGI messages of a complete answer

Why: uvicorn's ``send`` validates every header with two regular expressions and writes
the head and the body apart (two ``send`` system calls on uvloop, which writes at
once); the front layer's hot answers (a refusal's pre-encoded bytes, a prompt's 202)
are built by us with a ``content-length``, so they can be written whole.

Contracts: when ``send`` is uvicorn's own (``RequestResponseCycle.send``: HTTP/1.1 on
uvicorn) and the answer is one a fast write can give exactly as uvicorn would (nothing
sent yet, a ``content-length`` equal to the body, no ``more_body``, not ``HEAD``,
uvicorn's access log off), the status line, uvicorn's default headers (``date``,
``server``), the answer's headers (plus ``connection: close`` when the connection will
not be kept) and the body go in one ``transport.write``, and the cycle ends as uvicorn
ends it (waiting on the write buffer first, closing a connection not kept alive, then
the next pipelined request). Anything else, HTTP/2 and granian included, is sent as the
two messages, unchanged. ``body_in_hand(receive)``: uvicorn's HTTP/1.1 cycle has the
whole body already (no body clock needed: ``acp_server.http.body_clock``).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

_default_list: Any = None      # uvicorn's default headers (a new list every second)
_default_bytes = b""           # ... and their encoding


async def send_whole(send: Any, start: dict[str, Any], end: dict[str, Any]) -> None:
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle or cycle.response_started \
            or cycle.access_log or end.get("more_body", False) \
            or cycle.scope["method"] == "HEAD":
        await send(start)
        await send(end)
        return
    body = end.get("body", b"")
    head = [STATUS_LINE[start["status"]], _defaults(cycle.default_headers)]
    length = close = False
    for name, value in start["headers"]:
        if name == b"content-length":
            length = value == b"%d" % len(body)
        elif name == b"connection":
            close = b"close" in value.lower()
        head += (name, b": ", value, b"\r\n")
    if not length:   # not one of ours: uvicorn checks and sends it
        await send(start)
        await send(end)
        return
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    if close:
        cycle.keep_alive = False
    elif not cycle.keep_alive:
        head.append(b"connection: close\r\n")
    head += (b"\r\n", body)
    cycle.transport.write(b"".join(head))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def body_in_hand(receive: Any) -> bool:
    """uvicorn (httptools) has the request's whole body already (its parser saw the
    message's end before the app was called: wrk's and most clients' small POSTs):
    reading it cannot stall, so the front layer starts no body clock for it (each read
    then is uvicorn's own, immediate: its message event is set with the last byte)."""
    cycle = getattr(receive, "__self__", None)
    return type(cycle) is RequestResponseCycle and not cycle.more_body \
        and not cycle.disconnected


def _defaults(headers: list[tuple[bytes, bytes]]) -> bytes:
    global _default_list, _default_bytes
    if headers is not _default_list:
        _default_bytes = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        _default_list = headers
    return _default_bytes


__all__ = ["body_in_hand", "send_whole"]
