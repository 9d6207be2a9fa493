"""The clients with stored tokens: what each shows for a 401, a 403 (a scope the
token lacks) and a 429 — the SDK's typed errors, the CLIs' one line, ``acp-server
connect`` keeping its connection when one message is refused."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from acp_server.client import (DaemonClient, DaemonForbiddenError, DaemonRateLimitError,
                               DaemonUnauthorizedError, ForbiddenError, TaskClient)
from acp_server.client.prompt_cli import add_prompt_arguments, run_prompt_args
from acp_server.client.tasks_cli import add_tasks_arguments, run_tasks_args
from tests.acp_http.server import running_acp_server
from tests.connect.harness import spawn_adapter
from tests.principals.helpers import mint

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"
INIT = {"protocolVersion": 1, "clientCapabilities": {}}


class Frozen:
    def __call__(self) -> float:
        return 0.0


def _cli(add, run, *argv: str) -> tuple[int, str]:  # noqa: ANN001
    import argparse

    parser = argparse.ArgumentParser()
    add(parser)
    err = io.StringIO()
    code = run(parser.parse_args(list(argv)), out=io.StringIO(), err=err)
    return code, err.getvalue()


async def test_the_sdk_raises_typed_errors(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, token=BOOT, principals_clock=Frozen(),
                                  rate_limit_read=1) as srv:
        reader = await mint(srv.server, "reader", "read")
        async with DaemonClient(srv.base_url, token=reader) as client:
            with pytest.raises(DaemonForbiddenError) as forbidden:
                await client.create_or_attach_session()
            assert forbidden.value.required_scope == "prompt" and forbidden.value.status == 403
            await client.capabilities()   # the one read of the minute
            with pytest.raises(DaemonRateLimitError) as limited:
                await client.capabilities()
            assert limited.value.tier == "read" and limited.value.retry_after_s == 60.0
        async with DaemonClient(srv.base_url, token="acps_0123456789abcdef_nope") as client:
            with pytest.raises(DaemonUnauthorizedError):
                await client.capabilities()
        async with TaskClient(srv.base_url, token=reader) as tasks:
            with pytest.raises(ForbiddenError) as problem:
                await tasks.create({"model": "reference", "input": "hi"})
            assert problem.value.required_scope == "prompt"


async def test_the_clis_say_what_to_do(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, token=BOOT) as srv:
        reader = await mint(srv.server, "reader", "read")
        code, err = await _run_thread(_cli, add_prompt_arguments, run_prompt_args,
                                      "--url", srv.base_url, "--token", reader, "hello")
        assert code != 0 and "lacks the 'prompt' scope" in err and "'prompt' scope" in err
        assert reader not in err
        code, err = await _run_thread(_cli, add_tasks_arguments, run_tasks_args, "list",
                                      "--url", srv.base_url, "--token", "wrong")
        assert code != 0 and "check --token" in err


async def _run_thread(fn, *args):  # noqa: ANN001, ANN202
    import anyio.to_thread

    return await anyio.to_thread.run_sync(lambda: fn(*args))


async def test_connect_keeps_its_connection_when_a_scope_is_missing(
        tmp_path: Path, anyio_backend: str) -> None:
    async with running_acp_server(tmp_path, token=BOOT) as srv:
        reader = await mint(srv.server, "reader", "read")
        transport = ("--transport", "http1") if anyio_backend == "trio" else ()
        async with spawn_adapter(srv.base_url + "/acp", "--token", reader,
                                 *transport) as adapter:
            assert "result" in await adapter.request("initialize", INIT)
            refused = await adapter.request("session/new", {"cwd": srv.workspace,
                                                            "mcpServers": []})
            assert refused["error"]["data"] == {"errorKind": "forbidden",
                                                "requiredScope": "prompt"}
            listed = await adapter.request("session/list", {})
            assert listed["result"] == {"sessions": []}
        assert reader not in "\n".join(adapter.stderr)


async def test_the_conformance_runner_says_why_it_cannot_start(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    from acp_server.cli import main

    async with running_acp_server(tmp_path, token=BOOT) as srv:
        wrong = await _run_thread(main, ["conformance", srv.base_url, "--token", "nope"])
        assert wrong == 2 and "refused the credentials (401)" in capsys.readouterr().err
        reader = await mint(srv.server, "reader", "prompt")   # no read scope
        refused = await _run_thread(main, ["conformance", srv.base_url, "--token", reader])
        err = capsys.readouterr().err
        assert refused == 2 and "refused this client (403)" in err and "'read' scope" in err
