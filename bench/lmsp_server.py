"""Benchmark server: the app with LMSP, on a loopback port, in its own process.

    python -m bench.lmsp_server --db /tmp/x.db --workspace /tmp --no-group-commit
    lmsp listening on 127.0.0.1:41234
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util

import anyio
import uvicorn

from acp_server.app import build_app
from acp_server.lmsp import LmspConfig, install_lmsp, open_lmsp
from acp_server.settings import Settings
from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory


async def serve(args: argparse.Namespace) -> None:
    settings = Settings(workspace=args.workspace, port=0)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge, \
            open_lmsp(bridge, state_dir=args.workspace, store_url=f"sqlite:///{args.db}",
                      max_running_tasks=args.max_running_tasks,
                      config=LmspConfig(max_queued_tasks=None),
                      group_commit=args.group_commit) as service:
        app = build_app(settings, bridge)
        install_lmsp(app, service)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                log_level="warning", access_log=False, backlog=4096)
        server = uvicorn.Server(config)
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            while not server.started:
                await anyio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            print(f"lmsp listening on 127.0.0.1:{port}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--max-running-tasks", type=int, default=0)
    parser.add_argument("--group-commit", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    # uvloop when installed, as ``acp-server serve`` runs
    uvloop = importlib.util.find_spec("uvloop") is not None
    anyio.run(serve, args, backend="asyncio", backend_options={"use_uvloop": uvloop})


if __name__ == "__main__":
    main()
