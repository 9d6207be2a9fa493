"""Our whole server (REST, ``/acp``, LMSP) on a loopback port, optionally broken.

    async with running_target(tmp_path) as url:
        report = await run_conformance(url, options=FAST)
    async with running_target(tmp_path, wrap=StripRetryAfter) as url:   # one rule broken
        ...

Composition is what ``acp-server serve`` does (``build_app`` + ``install_lmsp``) on the
reference agent; uvicorn under asyncio, hypercorn under trio (``tests.rest.server``).
``wrap`` is an ASGI middleware class put in front of the app; ``tamper`` gets the
bridge before serving (to break the bridge itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from acp_server.acp_http import registry_for
from acp_server.app import build_app
from acp_server.conformance import Options
from acp_server.lmsp import install_lmsp, open_lmsp
from acp_server.settings import Settings
from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from tests.rest.server import serving

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
    settings = Settings(workspace=str(tmp_path), port=0, options=options, token=token)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=settings.workspace,
                      options=options) as bridge:
        if tamper is not None:
            tamper(bridge)
        async with open_lmsp(bridge, state_dir=str(tmp_path / "state"), token=token,
                             max_running_tasks=max_running_tasks) as service:
            app = build_app(settings, bridge)
            install_lmsp(app, service)
            registry = registry_for(app)

            async def stop() -> None:
                service.stop()
                registry.shutdown()
                await bridge.aclose()

            async with serving(wrap(app) if wrap else app, on_stop=stop) as url:
                yield url
