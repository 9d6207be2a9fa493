"""Agent fs requests on hostile targets: a clear -32602, never a raw exception, never a
blocked worker (the reference agent's ``/tool write`` over LMSP, allowed by policy)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from acp_server.lmsp import LmspConfig
from bridge import fs
from bridge.agents.base import INVALID_PARAMS, RequestError
from tests.lmsp.server import running_lmsp

pytestmark = pytest.mark.anyio


async def _reply(srv, text: str) -> str:  # type: ignore[no-untyped-def]
    response = await srv.client.post("/lmsp/v1/responses", json={"model": "reference",
                                                                  "input": text})
    assert response.status_code == 200, response.text
    return str(response.json()["output"][0]["content"][0]["text"])


async def test_hostile_write_targets(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink("loop", ws / "loop")
    os.mkfifo(ws / "fifo")
    (ws / "folder").mkdir()
    async with running_lmsp(ws, config=LmspConfig(permission_policy="allow")) as srv:
        for target, message in [("loop", ": Too many levels of symbolic links"),
                                (".", "Not a regular file: "),
                                ("folder", "Not a regular file: "),
                                ("fifo", "Cannot open "),   # no reader: refused at once
                                ("a\u0000b", "must not contain a NUL byte")]:
            reply = await _reply(srv, f"/tool write {target} hi")
            assert "failed: " in reply and message in reply, reply
            assert "Errno" not in reply and "Traceback" not in reply
        assert "Wrote" in await _reply(srv, "/tool write ok.txt hi")
    assert (ws / "ok.txt").read_text() == "hi\n"


def test_read_refuses_nul_and_non_regular(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    for path in ("a\u0000b", "fifo", "."):
        with pytest.raises(RequestError) as caught:
            fs.read_text_file(str(tmp_path), {"path": path})
        assert caught.value.code == INVALID_PARAMS
