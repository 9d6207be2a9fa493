"""The stdio side the fixture agents share (``fixture_agent``, ``hostile_agent``):
newline-delimited JSON-RPC 2.0 written whole under one lock (threads answer too), and
the messages read from stdin.

    send({"id": 1, "result": {}})                    # one line, flushed
    send_raw(b"not json\n")                          # bytes as given
    for method, rpc_id, params in requests(waiting):  # answers go to ``waiting``'s callbacks
        ...
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

_write_lock = threading.Lock()


def send_raw(data: bytes) -> None:
    with _write_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def send(message: dict[str, Any], prefix: bytes = b"") -> None:
    """``message`` as one JSON-RPC line (``prefix``: bytes written before it, on it)."""
    send_raw(prefix + json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")


def chunk(session_id: str, text: str) -> dict[str, Any]:
    return {"method": "session/update", "params": {"sessionId": session_id, "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}}


def requests(waiting: dict[Any, Callable[[dict[str, Any]], None]]
             ) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """Each request or notification read from stdin, as (method, id, params); an answer
    to one of ours goes to its callback in ``waiting`` (taken out), an unknown one is
    dropped; blank lines are skipped."""
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        message = json.loads(line)
        if "method" not in message:
            callback = waiting.pop(message.get("id"), None)
            if callback is not None:
                callback(message)
            continue
        yield message["method"], message.get("id"), message.get("params") or {}
