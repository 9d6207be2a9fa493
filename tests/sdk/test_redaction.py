"""Credentials in the daemon's address never reach a message: ``--url
http://user:secret@host/`` (or ``$ACP_SERVER_URL``, or a ``?token=`` in it) is shown as
``http://***@host/`` in the SDK's errors, the CLIs' lines and the conformance runner's
(``errors.redact``, the one function that does it; the conformance runner's:
``tests/conformance/test_redaction.py``). Real processes and real loopback addresses
where the behaviour is the command's."""

from __future__ import annotations

import argparse
import io
import sys

import anyio
import pytest

from acp_server.client import DaemonClient, DaemonConnectionError, TaskClient
from acp_server.client.cli_run import run_command
from acp_server.client.errors import one_line, redact, redact_address
from tests.sdk.harness import closed_port_url
from tests.terminal import cli_env

pytestmark = pytest.mark.anyio

SECRETS = ("secret", "hunter2", "abc123")


def with_credentials(url: str) -> str:
    """``url`` with a user, a password and a token in its query."""
    return url.replace("http://", "http://user:secret@", 1) + "/?token=abc123&x=1"


def shown(url: str) -> str:
    return url.replace("http://", "http://***@", 1) + "/?token=***&x=1"


@pytest.mark.parametrize(("text", "said"), [
    ("http://user:secret@h:1/", "http://***@h:1/"),
    ("cannot reach https://secret@h/x: refused", "cannot reach https://***@h/x: refused"),
    ("http://u:p@ss@h/", "http://***@h/"),             # an @ in the password itself
    ("ws://h/acp?access_token=abc123#x", "ws://h/acp?access_token=***#x"),
    ("http://h/?a=1&api_key=abc123&b=2", "http://h/?a=1&api_key=***&b=2"),
    ("http://h/?Password=hunter2", "http://h/?Password=***"),
    ("http://h:1/path?limit=5", "http://h:1/path?limit=5"),  # nothing to hide: unchanged
    ("no address at all: user@example.org", "no address at all: user@example.org"),
])
def test_redact(text: str, said: str) -> None:
    assert redact(text) == said


@pytest.mark.parametrize(("value", "said"), [
    ("alice:s3cret@127.0.0.1:4170", "***@127.0.0.1:4170"),   # no scheme: still hidden
    ("u:p@ss@db/x?password=hunter2", "***@db/x?password=***"),
    ("mysql://u:hunter2@db/x", "mysql://***@db/x"),
    ("127.0.0.1:4170/path@x", "127.0.0.1:4170/path@x"),      # an @ past the host: kept
])
def test_redact_address(value: str, said: str) -> None:
    assert redact_address(value) == said


def test_an_address_refused_for_its_form_is_shown_without_its_password(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The CLIs' refusals of an address that is no URL (``--url``, conformance's
    argument, ``--store``) quote it without its credentials."""
    import argparse

    import httpx

    from acp_server.client.arguments import daemon_url
    from acp_server.conformance.cli import base_url
    from acp_server.settings import Settings, SettingsError

    for refuse in (lambda: daemon_url("alice:hunter2@127.0.0.1:4170"),
                   lambda: base_url("alice:hunter2@127.0.0.1:4170"),
                   lambda: Settings(workspace=".", store="mysql://u:hunter2@db/x")):
        with pytest.raises((httpx.InvalidURL, argparse.ArgumentTypeError,
                            SettingsError)) as refused:
            refuse()
        assert "hunter2" not in str(refused.value) and "***@" in str(refused.value)


def test_one_line_redacts_what_the_clis_print() -> None:
    assert one_line("failed at\nhttp://user:secret@h/") == "failed at http://***@h/"


async def test_the_sdk_errors_do_not_show_the_credentials() -> None:
    target = closed_port_url()
    async with DaemonClient(with_credentials(target)) as client, \
            TaskClient(with_credentials(target)) as tasks:
        with pytest.raises(DaemonConnectionError) as daemon:
            await client.health()
        with pytest.raises(DaemonConnectionError) as lmsp:
            await tasks.get("task_1")
    for caught in (daemon, lmsp):
        message = str(caught.value)
        assert message.startswith(f"cannot reach {target.replace('http://', 'http://***@')}")
        assert not any(secret in message for secret in SECRETS), message


def _clis() -> list[list[str]]:
    return [["prompt", "hi"], ["tasks", "list"], ["tasks", "get", "task_1"]]


@pytest.mark.parametrize("where", ["--url", "env"])
@pytest.mark.parametrize("args", _clis())
async def test_the_clis_do_not_show_the_credentials(args: list[str], where: str) -> None:
    target = closed_port_url()
    env = cli_env()
    if where == "env":
        env["ACP_SERVER_URL"] = with_credentials(target)
    else:
        args = [*args, "--url", with_credentials(target)]
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-m", "acp_server", *args],
                                       check=False, env=env)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert err == f"acp-server {args[0]}: cannot reach {shown(target)}: connection refused\n"


def test_an_unexpected_error_naming_the_address_is_redacted() -> None:
    async def command(args: argparse.Namespace, *, out: io.StringIO, err: io.StringIO) -> int:
        raise RuntimeError("GET http://user:secret@h:1/?token=abc123 broke")

    err = io.StringIO()
    assert run_command("acp-server x", command, argparse.Namespace(), out=io.StringIO(),
                       err=err) == 1
    assert err.getvalue() == ("acp-server x: unexpected error: RuntimeError: GET "
                              "http://***@h:1/?token=*** broke\n")
