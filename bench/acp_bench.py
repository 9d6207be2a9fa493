"""``/acp`` benchmarks: JSON-RPC message cost in process, prompts/s end to end.

    python -m bench acp            # once wired into bench/__main__.py SECTIONS

* µs per message: envelope decode (``decode_message`` + params), decode and dispatch
  of a request through ``acp_server.acp_http.dispatch`` (reply encoded and buffered),
  a bus ``session/update`` event turned into its SSE frame, and, for the record, the
  same request through ``jsonrpcserver`` (when installed).
* prompts/s over ``/acp``: a server process (``acp-server serve`` through
  ``bench.server``, no prompt cap, reference agent in process) and a raw-socket
  HTTP/1.1 client in this one (cheaper than the server, so the figure is the
  server's): sequential turns (POST ``session/prompt``, wait for its
  ``{stopReason}`` frame on the session stream) and a pipelined batch.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio

ROUNDS = 5
BATCH = 5000
SEQUENTIAL = int(os.environ.get("BENCH_ACP_TURNS", "300"))
PIPELINED = int(os.environ.get("BENCH_ACP_PIPELINED", "500"))
REQUEST = b'{"jsonrpc":"2.0","id":7,"method":"authenticate","params":{"methodId":"none"}}'
UPDATE = {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                       "content": {"type": "text", "text": "hello world"}}}


def _best_us(run: Callable[[], None], batch: int = BATCH) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(batch):
            run()
        best = min(best, (time.perf_counter() - start) / batch)
    return best * 1e6


# -- in process -----------------------------------------------------------------------------
async def message_costs() -> dict[str, float | None]:
    import msgspec

    from acp_server.acp_http.connection import AcpConnection
    from acp_server.acp_http.dispatch import dispatch, request_params
    from acp_server.acp_http.frames import sse_bytes, update_frame
    from bridge import Bridge
    from bridge.agents.reference import ReferenceAgentFactory
    from bridge.events import Event
    from bridge.jsonrpc import decode_message

    def decode() -> None:
        request_params(decode_message(REQUEST))

    results: dict[str, float | None] = {"decode_us": _best_us(decode)}
    with tempfile.TemporaryDirectory() as workspace:
        async with Bridge(ReferenceAgentFactory(), workspace_cwd=workspace) as bridge:
            conn = AcpConnection("bench", bridge)
            best = float("inf")
            for _ in range(ROUNDS):
                start = time.perf_counter()
                for _ in range(BATCH):
                    msg = decode_message(REQUEST)
                    await dispatch(conn, msg, request_params(msg))
                    conn.pop()
                best = min(best, (time.perf_counter() - start) / BATCH)
            results["dispatch_us"] = best * 1e6
    raw = msgspec.Raw(msgspec.json.encode(UPDATE))
    # a fresh event each time: the frame is built once per event and then kept on it
    results["update_frame_us"] = _best_us(
        lambda: sse_bytes(update_frame(Event(42, "session_update", raw))))
    results["jsonrpcserver_us"] = _jsonrpcserver_us()
    return results


def _jsonrpcserver_us() -> float | None:
    try:
        from jsonrpcserver import Success, dispatch, method
    except ImportError:
        return None

    @method(name="authenticate")
    def authenticate(methodId: str) -> Any:  # noqa: N803 - the wire name
        return Success({})

    text = REQUEST.decode()
    return _best_us(lambda: dispatch(text), batch=BATCH // 5)


# -- end to end ---------------------------------------------------------------------------
# The client speaks HTTP/1.1 on raw sockets (one keep-alive connection for the POSTs, one
# per stream), so that it costs far less than the server and the figure is the server's.
async def _post(reader: Any, writer: Any, head: bytes, body: bytes) -> int:
    writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    answer = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in answer.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return int(answer[9:12])


async def _stream(port: int, headers: str, replies: dict[Any, Any], results: dict[Any, Any],
                  ready: Any) -> None:
    """Reads ``GET /acp`` (chunked SSE) and sets ``replies[id]`` for each reply frame."""
    import asyncio

    import msgspec

    decode = msgspec.json.decode
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                 f"{headers}\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    ready.set()
    pending = b""
    try:
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            if size == 0:
                return
            pending += (await reader.readexactly(size + 2))[:-2]
            *frames, pending = pending.split(b"\n\n")
            for frame in frames:
                for line in frame.split(b"\n"):
                    if line.startswith(b"data: "):
                        message = decode(line[6:])
                        rpc_id = message.get("id") if isinstance(message, dict) else None
                        if "method" not in message and rpc_id in replies:
                            results[rpc_id] = message
                            replies.pop(rpc_id).set()
    finally:
        writer.close()


async def end_to_end(port: int, workspace: str) -> dict[str, float]:
    import asyncio

    replies: dict[Any, asyncio.Event] = {}
    results: dict[Any, Any] = {}

    def body(rpc_id: int, method: str, params: dict[str, Any]) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method,
                           "params": params}).encode()

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    base = b"POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    init = body(0, "initialize", {"protocolVersion": 1})
    writer.write(base + b"Content-Length: %d\r\n\r\n" % len(init) + init)
    head = await reader.readuntil(b"\r\n\r\n")
    conn_id = length = None
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"acp-connection-id":
            conn_id = value.strip().decode()
        elif name.lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    assert conn_id is not None, head
    conn_head = base + f"Acp-Connection-Id: {conn_id}\r\n".encode()
    tasks = []
    ready = asyncio.Event()
    tasks.append(asyncio.create_task(_stream(port, f"Acp-Connection-Id: {conn_id}\r\n",
                                             replies, results, ready)))
    await ready.wait()

    async def call(rpc_id: int, method: str, params: dict[str, Any], head: bytes) -> Any:
        done = replies[rpc_id] = asyncio.Event()
        status = await _post(reader, writer, head, body(rpc_id, method, params))
        assert status == 202, status
        return done

    await (await call(1, "session/new", {"cwd": workspace, "mcpServers": []}, conn_head)).wait()
    sid = results[1]["result"]["sessionId"]
    ready = asyncio.Event()
    tasks.append(asyncio.create_task(_stream(
        port, f"Acp-Connection-Id: {conn_id}\r\nAcp-Session-Id: {sid}\r\n", replies, results,
        ready)))
    await ready.wait()
    session_head = conn_head + f"Acp-Session-Id: {sid}\r\n".encode()
    prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "/chunks 1 ping"}]}
    rpc_id = 10
    start = time.perf_counter()
    for _ in range(SEQUENTIAL):
        rpc_id += 1
        await (await call(rpc_id, "session/prompt", prompt, session_head)).wait()
    sequential = SEQUENTIAL / (time.perf_counter() - start)
    start = time.perf_counter()
    pending = []
    for _ in range(PIPELINED):
        rpc_id += 1
        pending.append(await call(rpc_id, "session/prompt", prompt, session_head))
    for done in pending:
        await done.wait()
    pipelined = PIPELINED / (time.perf_counter() - start)
    for task in tasks:
        task.cancel()
    await _post(reader, writer, f"DELETE /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Acp-Connection-Id: {conn_id}\r\n".encode(), b"")
    writer.close()
    return {"sequential_per_s": sequential, "pipelined_per_s": pipelined}


def main() -> list[str]:
    from bench.http_bench import served

    costs = anyio.run(message_costs)
    jrs = costs["jsonrpcserver_us"]
    lines = ["## /acp (ACP JSON-RPC over HTTP)", "",
             "| message path | µs per message |", "|---|---|",
             f"| envelope decode (msgspec, params as Raw) | {costs['decode_us']:.2f} |",
             f"| decode + dispatch (`authenticate`, reply buffered) | {costs['dispatch_us']:.2f} |",
             f"| bus `session/update` → SSE frame | {costs['update_frame_us']:.2f} |",
             f"| jsonrpcserver 5 `dispatch` (same request, for the record) | "
             f"{'n/a (not installed)' if jrs is None else f'{jrs:.2f}'} |", ""]
    with tempfile.TemporaryDirectory() as workspace:
        with served(workspace, "--max-pending-prompts-per-session", "0",
                    knobs=["--subscriber-max-queued", "2048"]) as port:
            import asyncio

            e2e = asyncio.run(end_to_end(port, os.path.realpath(workspace)))
    from bench.targets import record

    record("/acp pipelined prompts/s", e2e["pipelined_per_s"], 2000)
    record("/acp sequential prompts/s", e2e["sequential_per_s"], 1500)
    lines += ["| end to end over /acp (uvicorn, reference agent) | prompts/s |", "|---|---|",
              f"| sequential (POST → `{{stopReason}}` on the session stream) "
              f"| {e2e['sequential_per_s']:.0f} |",
              f"| pipelined ({PIPELINED} POSTs, then all replies) | {e2e['pipelined_per_s']:.0f} |"]
    return lines


if __name__ == "__main__":
    print("\n".join(main()))
