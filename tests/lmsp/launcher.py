"""Test-only server process: ``build_app`` + ``install_lmsp`` under uvicorn on loopback.

    python -m tests.lmsp.launcher --db /tmp/x/lmsp.db --workspace /tmp/x --max-running-tasks 2
    python -m tests.lmsp.launcher --store postgresql://…/acp_test --workspace /tmp/a \\
        --lease-s 3 --renew-s 1 --poll-s 0.5          # one of several instances
    LMSP_PORT 41234                  # printed (flushed) once listening

The restart/crash tests kill it with SIGKILL and start it again on the same file; the
multi-instance tests run two of them on one PostgreSQL schema. They start it with
``spawn(*args)``, which answers once the child listens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import anyio
import uvicorn

from acp_server.app import build_app
from acp_server.lmsp import install_lmsp, open_lmsp
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.tasks import TaskStore
from acp_server.settings import Settings
from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory


ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> tuple[subprocess.Popen[str], str]:
    """This launcher as a child process with ``args``: the process and its base URL,
    once it listens (stdout is a pipe the caller closes)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.lmsp.launcher", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("LMSP_PORT "), line
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def make_store(args: argparse.Namespace) -> TaskStore | None:
    """A PostgreSQL store with the lease timings asked for; SQLite ``--db`` with the busy
    timeout asked for; ``None`` = the default (``store_for``)."""
    if args.store is None:
        if args.busy_timeout_s is None:
            return None
        return SqliteTaskStore(args.db, busy_timeout_s=args.busy_timeout_s)
    return PostgresTaskStore(args.store, lease_s=args.lease_s, renew_s=args.renew_s,
                             poll_s=args.poll_s)


async def serve(args: argparse.Namespace) -> None:
    settings = Settings(workspace=args.workspace, port=0)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=settings.workspace,
                      options=settings.options) as bridge, \
            open_lmsp(bridge, state_dir=args.workspace, store_url=f"sqlite:///{args.db}",
                      store=make_store(args), max_running_tasks=args.max_running_tasks) \
            as service:
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
    parser.add_argument("--db", help="SQLite file (when --store is not given)")
    parser.add_argument("--store", help="postgresql://… (several instances may share it)")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--max-running-tasks", type=int, default=4)
    parser.add_argument("--lease-s", type=float, default=30)
    parser.add_argument("--renew-s", type=float, default=10)
    parser.add_argument("--poll-s", type=float, default=1.0)
    parser.add_argument("--busy-timeout-s", type=float, help="SQLite's busy timeout")
    args = parser.parse_args()
    if (args.db is None) == (args.store is None):
        parser.error("give exactly one of --db and --store")
    anyio.run(serve, args)


if __name__ == "__main__":
    main()
