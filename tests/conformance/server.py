"""Our whole server (REST, ``/acp``, LMSP) on a loopback port, optionally broken.

    async with running_target(tmp_path) as url:
        report = await run_conformance(url, options=FAST)
    async with running_target(tmp_path, wrap=StripRetryAfter) as url:   # one rule broken
        ...

The server is ``tests.harness.local_server`` (``open_server``, what ``acp-server serve``
runs) on the reference agent. ``wrap`` is an ASGI middleware class put in front of the
app; ``tamper`` gets the bridge before any request (to break the bridge itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from acp_server.conformance import Options
from bridge import Bridge, BridgeOptions
from tests.harness.local import local_server

# Holds end only when the runner cancels them (no check waits for one to end).
FAST = Options(hold_prompt="/sleep 30s conformance hold", timeout_s=5.0,
               settle_timeout_s=15.0, saturate_tasks=3, oversize_bytes=11 * 1024 * 1024)
LIMIT = 3


@contextlib.asynccontextmanager
async def running_target(tmp_path: Any, *, wrap: Callable[[Any], Any] | None = None,
                         tamper: Callable[[Bridge], None] | None = None,
                         limit: int = LIMIT, max_running_tasks: int = 2,
                         token: str | None = None) -> AsyncIterator[str]:
    options = BridgeOptions(max_pending_prompts_per_session=limit)
    async with local_server(tmp_path, options=options, token=token, wrap=wrap,
                            max_running_tasks=max_running_tasks) as srv:
        if tamper is not None:
            tamper(srv.bridge)
        yield srv.base_url
