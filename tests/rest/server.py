"""The REST tests' helpers on the in-process server (``tests.harness.local_server``).

    async with running_server(tmp_path, options=BridgeOptions(max_sessions=1)) as srv:
        response = await srv.client.post("/session", json={})
        events = await srv.events_until(sid, "turn_complete", last_event_id=0)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
from httpx_sse import aconnect_sse

from tests.harness.local import LocalServer, local_server

TEXT = "text"


def text_prompt(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


class RunningServer(LocalServer):

    async def create_session(self, **body: Any) -> dict[str, Any]:
        response = await self.client.post("/session", json=body)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def prompt(self, session_id: str, text: str, **headers: str) -> httpx.Response:
        return await self.client.post(f"/session/{session_id}/prompt", json=text_prompt(text),
                                      headers=headers)

    async def events_until(self, session_id: str, stop: str | Callable[[str, Any], bool], *,
                           last_event_id: int | None = None, epoch: str | None = None,
                           timeout: float = 30.0,
                           on_open: Callable[[], Any] | None = None,
                           headers: dict[str, str] | None = None) -> list[tuple[str, Any]]:
        """(event type, decoded data) of every frame up to and including ``stop``.
        ``timeout`` bounds a hang, generously: a loaded machine may not run this process,
        or commit the turn's journal, for seconds (it was 5 s)."""
        headers = dict(headers or {})
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        if epoch is not None:
            headers["X-Qwen-Event-Epoch"] = epoch
        matches = stop if callable(stop) else (lambda kind, _data: kind == stop)
        frames: list[tuple[str, Any]] = []
        with anyio.fail_after(timeout):
            async with aconnect_sse(self.client, "GET", f"/session/{session_id}/events",
                                    headers=headers) as source:
                assert source.response.status_code == 200, await source.response.aread()
                if on_open is not None:
                    await on_open()
                async with contextlib.aclosing(source.aiter_sse()) as stream:
                    async for sse in stream:
                        if not sse.data:  # the leading ``retry:`` block
                            continue
                        data = json.loads(sse.data)
                        frames.append((sse.event, data))
                        if matches(sse.event, data):
                            return frames
        return frames


def running_server(workspace: Any, **kwargs: Any
                   ) -> contextlib.AbstractAsyncContextManager[RunningServer]:
    """``tests.harness.local_server`` with the REST helpers (same keyword arguments)."""
    return local_server(workspace, kind=RunningServer, **kwargs)
