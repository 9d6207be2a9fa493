"""A token no HTTP header can carry (CR LF, a control character, non-ASCII): the SDK
refuses it at construction and the CLIs exit 2 with one line, never showing it.
Before, the first request failed with httpx's "Illegal header value b'Bearer …'"
(the token quoted) or an "unexpected error: UnicodeEncodeError"."""

from __future__ import annotations

import subprocess
import sys

import pytest

from acp_server.bearer import UnsendableTokenError
from acp_server.client import DaemonClient
from acp_server.client.tasks import TaskClient
from tests.sdk.harness import closed_port_url
from tests.terminal import cli_env

BAD = pytest.mark.parametrize("token", ["s3cret\r\nX-Injected: 1", "s3crét", "s3c\x01ret"])
SECRET = "s3c"   # every bad token starts so; it must never be shown


@BAD
@pytest.mark.parametrize("client", [DaemonClient, TaskClient])
@pytest.mark.parametrize("how", ["argument", "env"])
def test_the_sdk_refuses_it_at_construction(token: str, client: type, how: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACP_SERVER_TOKEN", token if how == "env" else "")
    with pytest.raises(UnsendableTokenError) as refused:
        client("http://127.0.0.1:9", **({"token": token} if how == "argument" else {}))
    assert isinstance(refused.value, ValueError)
    assert SECRET not in str(refused.value) and SECRET not in repr(refused.value)
    assert "position" in str(refused.value)


@pytest.mark.anyio
async def test_a_token_with_blanks_around_it_is_sent_without_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACP_SERVER_TOKEN", raising=False)
    async with DaemonClient("http://127.0.0.1:9", token=" s3cret\r\n") as client:
        assert client.token == "s3cret"
        assert client._http.headers["authorization"] == "Bearer s3cret"
    monkeypatch.setenv("ACP_SERVER_TOKEN", "\ts3cret ")
    async with TaskClient("http://127.0.0.1:9", token="  ") as tasks:
        assert tasks._http.headers["authorization"] == "Bearer s3cret"


@BAD
@pytest.mark.parametrize("command", [["prompt", "hello"], ["tasks", "list"]])
@pytest.mark.parametrize("how", ["--token", "env"])
def test_the_cli_says_it_in_one_line_and_exits_2(token: str, command: list[str],
                                                  how: str) -> None:
    env = cli_env()
    args = [*command, "--url", closed_port_url()]
    if how == "env":
        env["ACP_SERVER_TOKEN"] = token
    else:
        args += ["--token", token]
    done = subprocess.run([sys.executable, "-m", "acp_server", *args], capture_output=True,
                          text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and SECRET not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"acp-server {command[0]}: The token holds ")
    assert "cannot reach" not in done.stderr   # nothing was sent
