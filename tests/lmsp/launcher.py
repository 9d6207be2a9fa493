"""Test-only server process: ``build_app`` + ``install_lmsp`` under uvicorn on loopback.

    python -m tests.lmsp.launcher --db /tmp/x/lmsp.db --workspace /tmp/x --max-running-tasks 2
    LMSP_PORT 41234                  # printed (flushed) once listening

The restart/crash tests kill it with SIGKILL and start it again on the same file.
"""

from __future__ import annotations

import argparse
import contextlib

import anyio
import uvicorn

from acp_server.app import build_app
from acp_server.lmsp import install_lmsp, open_lmsp
from acp_server.settings import Settings
from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory


async def serve(db: str, workspace: str, max_running: int) -> None:
    settings = Settings(workspace=workspace, port=0)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge, \
            open_lmsp(bridge, state_dir=workspace, store_url=f"sqlite:///{db}",
                      max_running_tasks=max_running) as service:
        app = build_app(settings, bridge)
        install_lmsp(app, service)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            while not server.started:
                await anyio.sleep(0.01)
            print("LMSP_PORT", server.servers[0].sockets[0].getsockname()[1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--max-running-tasks", type=int, default=4)
    args = parser.parse_args()
    anyio.run(serve, args.db, args.workspace, args.max_running_tasks)


if __name__ == "__main__":
    main()
