"""``acp-server tasks`` end to end against the daemon with LMSP."""

from __future__ import annotations

import io
import json
import os
import re
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from acp_server.client.tasks_cli import build_parser, run_tasks, tasks_command
from tests.client.harness import Daemon, DropEvents, lmsp_daemon

pytestmark = pytest.mark.anyio


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


async def run(argv: list[str], out: io.StringIO | None = None) -> tuple[int, str, str]:
    out = out if out is not None else io.StringIO()
    err = io.StringIO()
    code = await tasks_command(build_parser().parse_args(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def test_create_get_watch_cancel(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv:
        code, out, _ = await run(["create", "/chunks 5 hello", "--url", srv.url])
        task = json.loads(out)
        assert code == 0 and task["status"] == "queued" and task["id"].startswith("task_")
        code, out, _ = await run(["watch", task["id"], "--url", srv.url])
        lines = out.splitlines()
        assert code == 0 and lines[-1].startswith(f"{task['id']}  succeeded  ")
        assert lines[-1].endswith(" tokens")
        code, out, _ = await run(["get", task["id"], "--url", srv.url])
        assert code == 0 and json.loads(out)["status"] == "succeeded"
        code, _, err = await run(["cancel", task["id"], "--url", srv.url])
        assert code == 1 and "task_not_cancelable" in err
        code, _, err = await run(["get", "task_nope", "--url", srv.url])
        assert code == 1 and "task_not_found" in err


async def test_watch_live_line_and_cancelled_task(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv:
        _, out, _ = await run(["create", "/sleep 600ms /chunks 20 " + "z " * 40, "--url", srv.url])
        task_id = json.loads(out)["id"]
        tty = Tty()
        code, out, _ = await run(["watch", task_id, "--url", srv.url], out=tty)
        assert code == 0
        assert "\x1b[" in out   # drawn in place by rich, with cursor movements
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
        frames = [f for f in re.split(r"[\r\n]", plain) if f.strip()]
        assert len(frames) > 3  # redrawn while it ran
        assert any("  running  " in f for f in frames)
        assert frames[-1].startswith(f"{task_id}  succeeded") and plain.endswith("\n")

        _, out, _ = await run(["create", "/sleep 5s slow", "--url", srv.url])
        slow = json.loads(out)["id"]

        async def cancel_soon() -> None:
            async with httpx.AsyncClient(base_url=srv.url) as http:
                while (await http.get(f"/lmsp/v1/tasks/{slow}")).json()["status"] != "running":
                    await anyio.sleep(0.01)   # a condition: the task runs, then it is cancelled
            assert (await run(["cancel", slow, "--url", srv.url]))[0] == 0

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_soon)
            code, out, _ = await run(["watch", slow, "--url", srv.url])
        assert code == 1 and "  cancelled  " in out.splitlines()[-1]


async def test_watch_resumes_after_a_drop(tmp_path: Path) -> None:
    drop = DropEvents(after=3, times=1)
    async with lmsp_daemon(tmp_path, wrap=drop.wrap) as srv:
        code, out, _ = await run(["create", "/sleep 200ms /chunks 12 a b c d e f", "--watch",
                                  "--url", srv.url])
    assert code == 0 and drop.dropped == 1
    assert "  succeeded  " in out.splitlines()[-1]


async def test_module_entry_point(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv:
        env = {**os.environ, "ACP_SERVER_URL": srv.url}
        env.pop("ACP_SERVER_TOKEN", None)
        result = await anyio.run_process([sys.executable, "-m", "acp_server.client.tasks_cli", "create",
                                          "hi", "--watch"], env=env, check=False)
        assert result.returncode == 0, result.stderr
        assert b"succeeded" in result.stdout
    assert run_tasks(["bogus"]) == 2


async def test_unreachable(server: Daemon) -> None:
    code, _, err = await run(["get", "task_x", "--url", server.url + "/nowhere"])
    assert code == 1 and err
