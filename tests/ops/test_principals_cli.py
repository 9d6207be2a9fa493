"""``acp-server audit`` (a real child process on a real SQLite store) prints each record
as one line by the log's one rule (``bridge.loggable``): what a client chose (a session
id as the target, an address, a detail) keeps its readable text and cannot forge a line
or drive the operator's terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from acp_server.ops.principals_cli import open_store
from acp_server.store import default_url, prepare_state_dir
from acp_server.store.audit import AuditRecord
from tests.harness.process import ROOT

pytestmark = pytest.mark.anyio


async def test_an_audit_line_escapes_what_could_forge_or_reorder_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    prepare_state_dir(str(state))
    async with open_store(default_url(str(state))) as store:
        await store.append_audit([AuditRecord(
            at=1_700_000_000.0, principal="ci", action="session.closed",
            target="café\u202e\n2026 forged", client="10.0.0.7\x1b[2J",
            detail='{"path":"/é\\u2066\\u001b"}')])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "acp_server", "audit", "--state-dir",
                          str(state)], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    line, = run.stdout.splitlines()
    assert "café\\u202e\\n2026 forged  10.0.0.7\\x1b[2J  " in line, line
    assert line.endswith('{"path":"/é\\u2066\\u001b"}'), line   # JSON's own escape, then ours


@pytest.mark.parametrize("args", [["token", "list"], ["audit"], ["audit", "--json"]],
                         ids=" ".join)
async def test_a_listing_on_the_store_whose_reader_goes_ends_quietly_with_141(
        tmp_path: Path, args: list[str]) -> None:
    """``acp-server token list --state-dir DIR | head -1`` (and ``audit``), its reader
    gone before the first line: status 141 and no traceback, as ``acp-server tasks``
    (``cli_run.printed``). The read end is closed before the child starts, so its first
    write meets the closed pipe, deterministically."""
    state = tmp_path / "state"
    prepare_state_dir(str(state))
    async with open_store(default_url(str(state))) as store:
        await store.append_audit([AuditRecord(at=1_700_000_000.0 + n, principal="ci",
                                              action="session.created", target=f"s-{n}",
                                              client="127.0.0.1", detail="{}")
                                  for n in range(50)])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("ci", "deploy"):   # a listing of more than one line
        made = subprocess.run([sys.executable, "-m", "acp_server", "token", "create", name,
                               "--state-dir", str(state)], capture_output=True, text=True,
                              env=env, timeout=60)
        assert made.returncode == 0, made.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)   # `| head -1` has had enough before the first line
    try:
        run = subprocess.run([sys.executable, "-m", "acp_server", *args, "--state-dir",
                              str(state)], stdout=write_end, stderr=subprocess.PIPE,
                             text=True, env=env, timeout=60)
    finally:
        os.close(write_end)
    assert (run.returncode, run.stderr) == (141, f"store: {default_url(str(state))}\n")
