"""``acp-server serve`` as a child process, for the tests that need the real thing:
the HTTP server (``--http-server``) and its guards as shipped, signals, crashes, several
instances; with ``--tls-cert`` the URL is ``https://`` and the clients trust any
certificate.

    with ServeProcess(tmp_path, "--max-sessions", "0") as child:        # synchronous
        child.http.get("/health")
    async with ServeProcess(tmp_path, "--token", "t") as child:         # either backend
        await child.client.get("/health")                # the token is sent
        stream = await child.raw()                       # a bare TCP connection
    child = ServeProcess(tmp_path, "--store", url).start()   # crash tests:
    child.kill(); child.start()                               # SIGKILL, then again

Contracts: the child runs this checkout (``PYTHONPATH``) as ``python -m acp_server serve
--port 0 --workspace W --state-dir S`` plus ``flags`` (a later flag wins), without the
caller's ``ACP_SERVER_TOKEN``; ``S`` is ``state_dir`` taken from the workspace (default
``"state"``: ``<workspace>/state``; ``None`` leaves ``--state-dir`` out, the server's
default). ``start()`` returns once the listening line and the state line were read
(``base_url``, ``port``, ``pid``; the lines as ``listening`` and ``state_line``), or
fails with the child's stderr; it is ``spawn()`` (the process, not waited for: a test
that watches the start-up) then ``wait_listening()``. stderr goes to ``stderr_path`` (``<state dir>.log``, or
``<workspace>.serve.log``), read with ``stderr_text()`` at any time.
``stop()`` sends SIGTERM and waits (SIGKILL after ``timeout``) and returns the exit
status; leaving a ``with`` / ``async with`` block stops it.
"""

from __future__ import annotations

import os
import queue
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import anyio
import anyio.abc
import anyio.to_thread
import httpx

from tests.harness.unhandled import unhandled_lines

ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV = "ACP_SERVER_TOKEN"
START_TIMEOUT_S = 30
# the clients' timeout: a bound against a hang, never a timing (a loaded machine
# may not run the child for seconds: a CI worker once took an answer past 10 s)
CLIENT_TIMEOUT_S = 30
LISTENING = re.compile(r"acp-server listening on (https?://(?:\[[^\]]+\]|[^:\s]+):(\d+)) ")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PICK = random.SystemRandom()      # not the test's seeded ``random``: workers would agree


def free_port() -> int:
    """A loopback port nothing listens on now (for a ``--port`` to pass a child), taken
    below the kernel's ephemeral range. A port the kernel handed out would be free again
    only until it hands it out next: as the source port of any outgoing connection (a
    client, the store's), which then stops a child restarted on it from listening."""
    high = min(_ephemeral_low(), 32768)
    for _ in range(100):
        port = _PICK.randrange(15000, high)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    def __init__(self, workspace: Path | str, *flags: str, state_dir: Path | str | None = "state",
                 env: dict[str, str] | None = None, cwd: Path | str | None = None,
                 shell_prefix: str = "", runner: Sequence[str] = ("-m", "acp_server"),
                 app_errors_expected: bool = False) -> None:
        """``shell_prefix`` runs before ``exec`` in ``sh -c`` (``ulimit -Sn 1024;``);
        ``runner`` is what Python runs before ``serve`` (the benchmarks' ``bench.server``).
        A block that ends without an error of its own fails when the child's log has a
        server's line for an exception out of the app (``tests.harness.unhandled``),
        unless ``app_errors_expected``."""
        self.workspace = Path(workspace)
        self.state_dir = self.workspace / state_dir if state_dir is not None else None
        self.flags = flags
        self.env = env or {}
        self.cwd = cwd
        self.shell_prefix = shell_prefix
        self.runner = tuple(runner)
        self.app_errors_expected = app_errors_expected
        self.stderr_path = (self.state_dir.with_name(self.state_dir.name + ".log")
                            if self.state_dir is not None
                            else self.workspace.with_name(self.workspace.name + ".serve.log"))
        self.process: subprocess.Popen[str] | None = None
        self.listening = self.state_line = ""
        self.base_url = ""
        self.port = 0
        self._http: httpx.Client | None = None
        self._client: httpx.AsyncClient | None = None

    # -- the process ----------------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        state = ["--state-dir", str(self.state_dir)] if self.state_dir is not None else []
        return [sys.executable, *self.runner, "serve", "--port", "0", "--workspace",
                str(self.workspace), *state, *self.flags]

    @property
    def token(self) -> str | None:
        flags = list(self.flags)
        return flags[flags.index("--token") + 1] if "--token" in flags else None

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def start(self) -> ServeProcess:
        """Start the child and wait for its listening line."""
        return self.spawn().wait_listening()

    def spawn(self) -> ServeProcess:
        """Start the child without waiting (a test that watches its start-up: then
        ``wait_listening()``, or ``kill()``)."""
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(self.env)
        command: Any = self.argv
        if self.shell_prefix:
            command = ["sh", "-c", f"{self.shell_prefix} exec {shlex.join(self.argv)}"]
        self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "a") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                            text=True, env=env, cwd=self.cwd)
        return self

    def wait_listening(self) -> ServeProcess:
        """Wait for the spawned child's listening and state lines."""
        assert self.process is not None and self.process.stdout is not None
        line = _next_line(self.process.stdout)
        match = LISTENING.match(line)
        state_line = _next_line(self.process.stdout) if match else ""
        if match is None or not state_line.startswith("state in "):
            self.kill()
            raise AssertionError(f"acp-server serve did not start: {line!r} {state_line!r}\n"
                                 f"{self.stderr_text()[-4000:]}")
        self.listening, self.state_line = line, state_line
        self.base_url, self.port = match.group(1), int(match.group(2))
        return self

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM, then wait (SIGKILL past ``timeout``); the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_stdout()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._close_stdout()

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _close_stdout(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    # -- clients --------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def http(self) -> httpx.Client:
        """A synchronous client on the child (with its token), closed on stop."""
        if self._http is None:
            self._http = httpx.Client(base_url=self.base_url, timeout=CLIENT_TIMEOUT_S,
                                      headers=self._headers(), verify=False)
        return self._http

    @property
    def client(self) -> httpx.AsyncClient:
        """The asynchronous client of an ``async with`` block (with the token)."""
        assert self._client is not None, "use `async with ServeProcess(...)`"
        return self._client

    async def raw(self) -> anyio.abc.SocketStream:
        """A bare TCP connection to the child."""
        return await anyio.connect_tcp("127.0.0.1", self.port)

    # -- with / async with ------------------------------------------------------------------
    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, exc_type: object = None, *exc: object) -> None:
        if self._http is not None:
            self._http.close()
        self.stop()
        if exc_type is None and not self.app_errors_expected:
            found = unhandled_lines(self.stderr_text())
            assert not found, (f"the server logged {len(found)} exception(s) out of the app:\n"
                               f"{self.stderr_text()[-4000:]}")

    async def __aenter__(self) -> ServeProcess:
        await anyio.to_thread.run_sync(self.start)
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=CLIENT_TIMEOUT_S,
                                         headers=self._headers(), verify=False)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        with anyio.CancelScope(shield=True):
            if self._client is not None:
                await self._client.aclose()
            await anyio.to_thread.run_sync(self.__exit__, exc_type, exc, tb)


async def read_until_closed(stream: anyio.abc.SocketStream) -> bytes:
    """Everything the server sends on ``stream`` until it closes the connection."""
    received = b""
    while True:
        try:
            received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            return received


async def read_chunk_burst(base_url: str, session_id: str, chunks: int, *,
                           http2: bool = False) -> tuple[int, bool]:
    """On a new client (HTTP/2 with prior knowledge when ``http2``): open the session's
    event stream, post a ``/chunks N`` prompt, read until its ``turn_complete``;
    (``agent_message_chunk`` frames seen, whether a ``client_evicted`` came)."""
    seen, evicted = 0, False
    async with httpx.AsyncClient(base_url=base_url, http1=not http2, http2=http2,
                                 timeout=60) as reader:
        async with reader.stream("GET", f"/session/{session_id}/events") as events:
            posted = await reader.post(f"/session/{session_id}/prompt", json={"prompt": [
                {"type": "text", "text": f"/chunks {chunks} " + "y" * chunks}]})
            assert posted.status_code == 202, posted.text
            async for line in events.aiter_lines():
                seen += line.count("agent_message_chunk")
                evicted = evicted or "client_evicted" in line
                if line.startswith("event: turn_complete"):
                    break
    return seen, evicted


def _next_line(stdout: IO[str]) -> str:
    """The child's next stdout line, or ``""`` past ``START_TIMEOUT_S``."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        return ""
