"""``acp-server conformance URL``: the live table, the JSON and JUnit reports, exit 0/1/2.

The command runs in a worker thread (its own event loop) against a server served by
the test's loop.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import sys
import xml.etree.ElementTree as ET

import anyio
import pytest
from rich.console import Console

from acp_server.cli import build_parser, main
from acp_server.conformance import CHECKS
from acp_server.conformance.catalog import checks_of
from acp_server.conformance.cli import run_conformance_args
from tests.conformance.broken import BROKEN
from tests.conformance.conftest import KNOWN_FAILING
from tests.conformance.server import running_target
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio
FAST_FLAGS = ["--hold-prompt", "/sleep 30s hold", "--timeout", "5", "--settle-timeout", "15",
              "--saturate-tasks", "3"]


def _run(argv: list[str]) -> tuple[int, str]:
    parser, _ = build_parser()
    out = io.StringIO()
    status = run_conformance_args(parser.parse_args(argv),
                                  console=Console(file=out, width=220, force_terminal=False))
    return status, out.getvalue()


async def test_a_passing_run_writes_both_reports_and_exits_0(tmp_path):
    json_path, junit_path = tmp_path / "report.json", tmp_path / "report.xml"
    async with running_target(tmp_path) as url:
        status, output = await anyio.to_thread.run_sync(_run, [
            "conformance", url, "--suite", "lmsp", "--json", str(json_path),
            "--junit", str(junit_path), *FAST_FLAGS])
    assert status == 0, output
    report = json.loads(json_path.read_text())
    assert report["target"] == url and report["started_at"].endswith("Z")
    ids = [c.id for c in checks_of("lmsp")]
    assert [c["id"] for c in report["checks"]] == ids
    assert {c["outcome"] for c in report["checks"]} == {"pass"}
    assert all(set(c) >= {"id", "suite", "level", "outcome", "detail"} and c["suite"] == "lmsp"
               and c["level"] in ("MUST", "SHOULD") for c in report["checks"])
    suite = ET.fromstring(junit_path.read_bytes()).find("testsuite")
    assert suite is not None and suite.get("name") == "lmsp"
    assert suite.get("tests") == str(len(ids)) and suite.get("failures") == "0"
    assert [case.get("name") for case in suite.iter("testcase")] == ids
    lines = output.splitlines()                                   # one line per check
    assert sorted(line.split()[2] for line in lines[:-1]) == sorted(ids)
    assert all(re.fullmatch(r"PASS  (MUST  |SHOULD)  \S+", line) for line in lines[:-1])
    assert lines[-1] == f"PASS  {len(ids)} passed, 0 failed (0 MUST), 0 skipped — {url}"


async def test_a_failed_must_check_exits_1_and_is_a_junit_failure(tmp_path):
    broken = BROKEN["finished-cancel-200"]
    junit_path = tmp_path / "report.xml"
    async with running_target(tmp_path, **broken.target) as url:
        status, output = await anyio.to_thread.run_sync(_run, [
            "conformance", url, "--suite", "lmsp", "--junit", str(junit_path), *FAST_FLAGS])
    assert status == 1
    assert "(1 MUST)" in output
    [line] = [line for line in output.splitlines() if line.startswith("FAIL  MUST")]
    assert line.startswith(f"FAIL  MUST    {broken.fails}  sent POST ")
    failures = [case for case in ET.fromstring(junit_path.read_bytes()).iter("testcase")
                if case.find("failure") is not None]
    assert [case.get("name") for case in failures] == [broken.fails]
    failure = failures[0].find("failure")
    assert failure is not None and failure.get("type") == "MUST"
    assert "/cancel; saw 200" in (failure.text or "")   # what was sent and what was seen


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["conformance", "http://127.0.0.1:9", "--suite", "nonsense"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit) as exited:
        main(["conformance", "http://127.0.0.1:9", "--timeout", "0"])
    assert exited.value.code == 2


@pytest.mark.parametrize("url", ["127.0.0.1:4170", "ftp://127.0.0.1:4170", "http://",
                                 "http://[::1"])
def test_a_target_that_is_not_an_http_url_is_a_usage_error(url, capsys):
    """``conformance 127.0.0.1:4170`` said "cannot reach 127.0.0.1:4170: Request URL is
    missing an 'http://' or 'https://' protocol." after the run had started."""
    with pytest.raises(SystemExit) as exited:
        main(["conformance", url])
    assert exited.value.code == 2
    shown = capsys.readouterr()
    assert shown.out == ""
    assert shown.err.splitlines()[-1] == (
        f"acp-server conformance: error: argument url: not an http(s) URL: {url!r} "
        "(e.g. http://127.0.0.1:4170)")


def test_an_unreachable_target_says_why_and_exits_2(capsys):
    with socket.socket() as sock:          # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["conformance", f"http://127.0.0.1:{port}", "--timeout", "2"]) == 2
    shown = capsys.readouterr()
    assert shown.out == ""                 # no empty table
    assert shown.err == (f"acp-server conformance: cannot reach http://127.0.0.1:{port}: "
                         "connection refused\n")




@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_the_command_against_acp_server_serve_end_to_end(tmp_path):
    """Two real processes: ``acp-server serve`` and ``acp-server conformance`` on it."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ACP_SERVER_TOKEN"}
    async with ServeProcess(workspace, "--max-pending-prompts-per-session", "2",
                            "--max-running-tasks", "2", state_dir=tmp_path / "state") as server:
        report_path = tmp_path / "report.json"
        done = await anyio.run_process(
            [sys.executable, "-m", "acp_server", "conformance", server.base_url, "--json",
             str(report_path), *FAST_FLAGS], env=env, check=False)
    assert server.returncode == 0           # drained on SIGTERM
    report = json.loads(report_path.read_text())
    assert [c["id"] for c in report["checks"]] == list(CHECKS)
    failed = {c["id"] for c in report["checks"] if c["outcome"] != "pass"}
    assert failed <= set(KNOWN_FAILING), [c for c in report["checks"] if c["id"] in failed]
    assert done.returncode == (1 if failed else 0), done.stdout.decode()[-3000:]
    assert b"passed" in done.stdout


