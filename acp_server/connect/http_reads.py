"""What the adapter reads over HTTP, each bounded: a server-sent event stream's data,
a POST's whole answer, a ``Retry-After``.

    async for data in sse_data(response, max_bytes):   # each event's data, bounded
        ...
    response = await post_capped(client, target, body, headers)   # read whole, bounded
    await anyio.sleep(retry_after(response))                      # 0.1-30 s

Contracts: ``sse_data`` skips comments and ``id:`` lines and fails the stream
(``httpx.DecodingError``) on a line or an event's data over ``max_bytes``;
``post_capped`` reads the answer decoded and never past ``target.max_bytes`` (the same
error); ``retry_after`` is the header's seconds clamped to 0.1-30, 1 when absent or
not a number.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from acp_server.connect.link import Target


async def sse_data(response: httpx.Response, max_bytes: int) -> AsyncIterator[bytes]:
    """The ``data`` of each SSE event (comments and ``id:`` lines skipped), every line
    and every event's data bounded by ``max_bytes`` (a longer one fails the stream)."""
    buffer = bytearray()
    data: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > max_bytes:
                    raise httpx.DecodingError(f"an SSE line over {max_bytes} bytes")
                break
            line = bytes(buffer[:end]).rstrip(b"\r")
            del buffer[:end + 1]
            if not line:
                if data:
                    yield b"\n".join(data)
                    data, size = [], 0
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
                size += len(data[-1]) + 1
                if size > max_bytes:
                    raise httpx.DecodingError(f"an SSE event over {max_bytes} bytes")


# a session's stream refused for now (the rate, an outage, a proxy without a server)
FOR_NOW = (429, 502, 503, 504)


def retry_after(response: httpx.Response) -> float:
    try:
        return min(30.0, max(0.1, float(response.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


async def post_capped(client: httpx.AsyncClient, target: Target, content: bytes,
                headers: dict[str, str]) -> httpx.Response:
    """A POST whose answer is read whole but never past ``target.max_bytes``
    (``httpx.DecodingError`` then)."""
    async with client.stream("POST", target.url, content=content, headers=headers) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():   # decoded: the cap is what is kept
            body += chunk
            if len(body) > target.max_bytes:
                raise httpx.DecodingError(f"an answer over {target.max_bytes} bytes")
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=bytes(body),
                          request=response.request, extensions=response.extensions)
