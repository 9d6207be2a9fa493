"""``--token ""`` (or blanks) never turns auth off silently: the real command exits 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from acp_server.settings import TOKEN_ENV
from tests.harness.process import ROOT

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("token", "env_token"), [("", None), ("   ", None), ("", "secret"),
                                                  (None, "  ")])
async def test_blank_token_exits_2(tmp_path: Path, token: str | None,
                                   env_token: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["PYTHONPATH"] = str(ROOT)
    if env_token is not None:
        env[TOKEN_ENV] = env_token
    argv = [sys.executable, "-m", "acp_server", "serve", "--port", "0",
            "--workspace", str(tmp_path), "--state-dir", str(tmp_path / "state")]
    if token is not None:
        argv += ["--token", token]
    with anyio.fail_after(30):
        result = await anyio.run_process(argv, env=env, check=False)
    assert result.returncode == 2, result.stderr
    assert b"Invalid token" in result.stderr
    assert b"listening" not in result.stdout
