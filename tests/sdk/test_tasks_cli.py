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
from tests.agents.held import HeldAgent
from tests.sdk.harness import Daemon, DropEvents, closed_port_url, lmsp_daemon

pytestmark = pytest.mark.anyio


async def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await tasks_command(build_parser().parse_args(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def test_create_get_watch_cancel(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv:
        code, out, _ = await run(["create", "/chunks 5 hello", "--url", srv.url])
        task = json.loads(out)
        assert code == 0 and task["status"] == "queued" and task["id"].startswith("task_")
        code, out, err = await run(["watch", task["id"], "--url", srv.url])
        assert code == 0 and out == "Echo: hello\n"   # the answer on stdout
        [final] = [line for line in err.splitlines() if "  succeeded  " in line]
        assert final.startswith(f"{task['id']}  succeeded  ") and final.endswith(" tokens")
        assert err.splitlines()[-1] == final
        code, out, _ = await run(["get", task["id"], "--url", srv.url])
        assert code == 0 and json.loads(out)["status"] == "succeeded"
        code, _, err = await run(["cancel", task["id"], "--url", srv.url])
        assert code == 1 and "task_not_cancelable" in err
        code, _, err = await run(["get", "task_nope", "--url", srv.url])
        assert code == 1 and "task_not_found" in err


async def test_a_failed_tasks_final_line_keeps_its_error_apart(tmp_path: Path) -> None:
    """The final status line of a failed task ends with its error, two spaces after
    the tokens (it read ``0 tokensagent_error: …``)."""
    async with lmsp_daemon(tmp_path) as srv:
        code, _, err = await run(["create", "/fail", "--watch", "--url", srv.url])
        assert code == 1
        final = err.splitlines()[-1]
        assert re.fullmatch(r"task_\S+  failed  \d+\.\ds  \d+ tokens  [a-z_]+: .+", final), final


async def test_watch_streams_the_text_and_the_status_only_moves_forward(tmp_path: Path) -> None:
    """Text deltas reach stdout as they arrive; status lines never go back (the
    replayed ``response.created`` of a running task is not "queued" again), and the
    final line is printed once."""
    writes: list[str] = []

    class Recording(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return super().write(text)

    # the turn waits in the agent until the watch printed 'running' (a 300 ms turn
    # could be over before a poll saw it running, or before the 'running' commit,
    # FLUSH_S after the prompt: the poll never ended)
    agent = HeldAgent()
    async with lmsp_daemon(tmp_path, agent_factory=agent) as srv:
        _, out, _ = await run(["create", "/chunks 6 one two three four five six",
                               "--url", srv.url])
        task_id = json.loads(out)["id"]
        async with httpx.AsyncClient(base_url=srv.url) as http:
            with anyio.fail_after(30):
                while (await http.get(f"/lmsp/v1/tasks/{task_id}")).json()["status"] != "running":
                    await anyio.sleep(0.01)   # a condition: watch starts on a running task
        err = io.StringIO()
        codes: list[int] = []

        async def watch() -> None:
            codes.append(await tasks_command(build_parser().parse_args(
                ["watch", task_id, "--url", srv.url]), out=Recording(), err=err))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(30):
                while "  running" not in err.getvalue():
                    await anyio.sleep(0.01)
            (await agent.arrived(1)).release()
        [code] = codes
    assert code == 0
    assert "".join(writes) == "Echo: one two three four five six\n" and len(writes) >= 6
    statuses = [line.split("  ")[1] for line in err.getvalue().splitlines()]
    assert statuses == ["running", "succeeded"]


async def test_a_cancelled_task_ends_the_watch_with_status_1(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv:
        _, out, _ = await run(["create", "/sleep 60s slow", "--url", srv.url])   # cancelled
        slow = json.loads(out)["id"]

        async def cancel_soon() -> None:
            async with httpx.AsyncClient(base_url=srv.url) as http:
                while (await http.get(f"/lmsp/v1/tasks/{slow}")).json()["status"] != "running":
                    await anyio.sleep(0.01)   # a condition: the task runs, then it is cancelled
            assert (await run(["cancel", slow, "--url", srv.url]))[0] == 0

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_soon)
            code, out, err = await run(["watch", slow, "--url", srv.url])
        assert code == 1 and out == "" and "  cancelled  " in err.splitlines()[-1]
        assert [line.split("  ")[1] for line in err.splitlines()].count("cancelled") == 1


async def test_list_prints_one_line_per_task_newest_first(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv:
        code, out, err = await run(["list", "--url", srv.url])
        assert (code, out, err) == (0, "", "no tasks\n")
        first = json.loads((await run(["create", "the first", "--url", srv.url]))[1])["id"]
        second = json.loads((await run(["create", "/sleep 5s the\nsecond", "--url", srv.url]))[1])
        code, out, _ = await run(["list", "--url", srv.url])
        lines = out.splitlines()
        assert code == 0 and [line.split()[0] for line in lines] == [second["id"], first]
        assert lines[0].endswith("/sleep 5s the second") and "reference" in lines[0]
        code, out, _ = await run(["list", "--url", srv.url, "--json", "--limit", "1"])
        page = json.loads(out)
        assert [t["id"] for t in page["data"]] == [second["id"]] and page["has_more"] is True
        assert page["data"][0]["input_text"] == "/sleep 5s the\nsecond"
        await run(["cancel", second["id"], "--url", srv.url])


async def test_watch_resumes_after_a_drop(tmp_path: Path) -> None:
    drop = DropEvents(after=3, times=1)
    async with lmsp_daemon(tmp_path, wrap=drop.wrap) as srv:
        code, out, _ = await run(["create", "/sleep 200ms /chunks 12 a b c d e f", "--watch",
                                  "--url", srv.url])
    assert code == 0 and drop.dropped == 1
    assert out == "Echo: a b c d e f\n"


async def test_module_entry_point(tmp_path: Path) -> None:
    async with lmsp_daemon(tmp_path) as srv:
        env = {**os.environ, "ACP_SERVER_URL": srv.url}
        env.pop("ACP_SERVER_TOKEN", None)
        result = await anyio.run_process([sys.executable, "-m", "acp_server.client.tasks_cli", "create",
                                          "hi", "--watch"], env=env, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout == b"Echo: hi\n" and b"  succeeded  " in result.stderr
    assert run_tasks(["bogus"]) == 2


async def test_unreachable(server: Daemon) -> None:
    code, _, err = await run(["get", "task_x", "--url", server.url + "/nowhere"])
    assert code == 1 and err
    code, _, err = await run(["list", "--url", closed_port_url()])
    assert code == 1 and re.fullmatch(
        r"acp-server tasks: cannot reach http://127\.0\.0\.1:\d+: connection refused\n", err)


async def test_a_watch_still_queued_after_a_while_says_why_it_may_be(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``create --watch`` sat on ``queued`` with no reason while the server ran as many
    tasks as it may: after ``QUEUED_HINT_S`` one line says what the server's limits may
    be doing (once), then the task runs as usual once there is room."""
    from acp_server.client import tasks_cli

    monkeypatch.setattr(tasks_cli, "QUEUED_HINT_S", 0.3)
    async with lmsp_daemon(tmp_path, max_running_tasks=1) as srv:
        _, out, _ = await run(["create", "/sleep 60s holds the one slot", "--url", srv.url])
        holder = json.loads(out)["id"]
        out, err = io.StringIO(), io.StringIO()
        args = build_parser().parse_args(["create", "after it", "--watch", "--url", srv.url])
        async with anyio.create_task_group() as tg:
            async def watched() -> None:
                assert await tasks_command(args, out=out, err=err) == 0
            tg.start_soon(watched)
            await wait_until_text(err, "still queued")
            async with httpx.AsyncClient(base_url=srv.url) as http:
                cancelled = await http.post(f"/lmsp/v1/tasks/{holder}/cancel")
                assert cancelled.status_code == 200, cancelled.text
    lines = err.getvalue().splitlines()
    assert lines[0].endswith("  queued")
    assert lines[1].endswith("  still queued after 0.3 s: the server may be running as many "
                             "tasks as it runs at once (--max-running-tasks) or be at its "
                             "session limit (--max-sessions); it starts once one of those ends")
    assert sum("still queued" in line for line in lines) == 1
    assert "  succeeded  " in lines[-1] and out.getvalue() == "Echo: after it\n"


async def test_a_watch_that_runs_at_once_gives_no_hint(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint's moment comes while the task runs: no hint. That moment is the test's
    (once the watch has shown ``running``, the turn held in the agent until the hint
    has looked): with a real 0.3 s, a loaded machine may not start the task that soon,
    and the hint was then right to be printed."""
    from acp_server.client import tasks_cli

    shown_running, looked = anyio.Event(), anyio.Event()
    hint = tasks_cli._hint_while_queued

    async def hint_once_running(shown: tasks_cli.Watch) -> None:
        await shown_running.wait()
        await hint(shown)   # QUEUED_HINT_S is 0 here: it looks at once
        looked.set()

    monkeypatch.setattr(tasks_cli, "QUEUED_HINT_S", 0)
    monkeypatch.setattr(tasks_cli, "_hint_while_queued", hint_once_running)
    agent = HeldAgent()
    async with lmsp_daemon(tmp_path, agent_factory=agent) as srv:
        out, err = io.StringIO(), io.StringIO()
        args = build_parser().parse_args(["create", "at once", "--watch", "--url", srv.url])
        codes: list[int] = []
        async with anyio.create_task_group() as tg:
            async def watched() -> None:
                codes.append(await tasks_command(args, out=out, err=err))
            tg.start_soon(watched)
            await wait_until_text(err, "  running")
            shown_running.set()
            with anyio.fail_after(30):   # a hang bound
                await looked.wait()
            (await agent.arrived(1)).release()
    assert codes == [0] and "still queued" not in err.getvalue(), err.getvalue()
    assert out.getvalue() == "Echo: at once\n"


async def wait_until_text(stream: io.StringIO, text: str) -> None:
    with anyio.fail_after(30):
        while text not in stream.getvalue():
            await anyio.sleep(0.02)
