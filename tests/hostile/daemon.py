"""The real ``acp-server serve`` as a child process (its HTTP server and connection
guards exactly as shipped; ``--http-server`` picks one), driven from a test on either
anyio backend. With ``--tls-cert`` the URL is ``https://`` (the client trusts any
certificate).

    async with running_daemon(tmp_path, "--header-timeout-ms", "300") as daemon:
        response = await daemon.client.get("/health")
        stream = await daemon.raw()                 # a bare TCP connection
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx

from acp_server.settings import TOKEN_ENV

ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"acp-server listening on (https?://127\.0\.0\.1:(\d+)) ")


@dataclass
class Daemon:
    base_url: str
    port: int
    pid: int
    client: httpx.AsyncClient
    stderr: list[bytes]

    async def raw(self) -> anyio.abc.SocketStream:
        return await anyio.connect_tcp("127.0.0.1", self.port)


async def read_until_closed(stream: anyio.abc.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while True:
        try:
            received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            return received


@contextlib.asynccontextmanager
async def running_daemon(tmp_path: Path, *flags: str, env: dict[str, str] | None = None,
                         shell_prefix: str = "") -> AsyncIterator[Daemon]:
    """``shell_prefix`` runs before ``exec`` in ``sh -c`` (e.g. ``ulimit -Sn 1024;``)."""
    full_env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    argv = [sys.executable, "-m", "acp_server", "serve", "--port", "0",
            "--workspace", str(tmp_path), "--state-dir", str(tmp_path / "state"), *flags]
    command: Any = argv
    if shell_prefix:
        import shlex
        command = ["sh", "-c", f"{shell_prefix} exec {shlex.join(argv)}"]
    process = await anyio.open_process(command, env=full_env, cwd=str(tmp_path))
    stderr: list[bytes] = []
    try:
        assert process.stdout is not None and process.stderr is not None
        async with anyio.create_task_group() as tg:
            async def drain_stderr() -> None:
                async for chunk in process.stderr:   # type: ignore[union-attr]
                    stderr.append(chunk)

            tg.start_soon(drain_stderr)
            line = b""
            with anyio.fail_after(30):
                while b"\n" not in line:
                    line += await process.stdout.receive()
            match = _LISTENING.match(line.decode())
            assert match, (line, b"".join(stderr))
            token = None
            if "--token" in flags:
                token = flags[flags.index("--token") + 1]
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with httpx.AsyncClient(base_url=match.group(1), timeout=10,
                                         headers=headers, verify=False) as client:
                yield Daemon(match.group(1), int(match.group(2)), process.pid, client, stderr)
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
            with anyio.fail_after(15):
                await process.wait()
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
