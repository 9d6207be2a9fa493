"""HAProxy (Debian's ``haproxy``) in front of several ``acp-server serve`` instances:
the load balancer of the multi-instance tests, started and stopped by the test.

    with HAProxy(tmp_path, [a.base_url, b.base_url], affinity="cookie") as lb:
        httpx.get(lb.base_url + "/health")                 # round robin, or sticky
        lb.backend_of(response)                            # "s0" / "s1" (the cookie)

Contracts: ``affinity`` is ``"none"`` (round robin), ``"cookie"`` (HAProxy inserts
the ``ACPSRV`` cookie naming the instance that answered; a client that returns it stays
there, as the ACP Streamable HTTP RFD asks of clients) or ``"hash"`` (the first two path
segments, ``/session/<id>``, hashed consistently: one session's requests reach one
instance, whatever the client keeps). Each server is health-checked on ``GET /health`` every 200 ms, so a killed
instance leaves the rotation without a test waiting on a timer: refused twice in a row
(400 ms), or not answering within ``timeout check`` (2 s) twice, a paused one. One slow
answer on a loaded machine does not take a live instance out (``fall 1`` and the
200 ms default check timeout did: a client's next request then reached the other
instance, which did not know its ``Acp-Connection-Id``; a 1 s check let a live
instance the machine did not run for ~1.4 s leave the rotation). ``start()`` returns once
the listener answers; the configuration is ``config_path`` and HAProxy's output goes to
``log_path``. ``haproxy_binary()`` is ``None`` where HAProxy is not installed (the
tests then skip; CI installs it, ``.ci/run``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit

import httpx

from tests.harness.process import free_port

Affinity = Literal["none", "cookie", "hash"]
COOKIE = "ACPSRV"
SKIP = "HAProxy is not installed (apt-get install haproxy; CI installs it)"
START_TIMEOUT_S = 15


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None)


BALANCE = {
    "none": "    balance roundrobin\n",
    "cookie": f"    balance roundrobin\n    cookie {COOKIE} insert indirect nocache httponly\n",
    # the first two path segments: every /session/<id>/… request of one session goes to
    # one instance (consistent hashing: a server leaving moves only its own sessions)
    "hash": "    balance uri depth 2\n    hash-type consistent\n",
}


def config(port: int, servers: list[str], affinity: Affinity) -> str:
    lines = [
        "global\n    maxconn 2000\n",
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 120s\n"
        "    timeout server 120s\n    timeout tunnel 1h\n    option http-server-close\n"
        # a connection refused by a killed instance is retried on another one
        "    option redispatch\n    retries 3\n"
        # X-Forwarded-For: the instances name the client with --trusted-proxy 127.0.0.1
        "    option forwardfor\n",
        f"frontend lb\n    bind 127.0.0.1:{port}\n    default_backend instances\n",
        "backend instances\n" + BALANCE[affinity]
        # the check names a loopback Host: the server refuses requests without one (421)
        + "    option httpchk\n"
        + "    http-check send meth GET uri /health ver HTTP/1.1 hdr Host localhost\n"
        + "    timeout check 2s\n"
        + "    default-server inter 200ms fall 2 rise 1\n",
    ]
    for index, url in enumerate(servers):
        parts = urlsplit(url)
        cookie = f" cookie s{index}" if affinity == "cookie" else ""
        lines.append(f"    server s{index} {parts.hostname}:{parts.port} check{cookie}\n")
    return "".join(lines)


class HAProxy:
    def __init__(self, directory: Path, servers: list[str], *,
                 affinity: Affinity = "none") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.config_path = directory / f"haproxy-{self.port}.cfg"
        self.log_path = directory / f"haproxy-{self.port}.log"
        self.config_path.write_text(config(self.port, servers, affinity))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HAProxy:
        binary = haproxy_binary()
        if binary is None:
            raise RuntimeError(SKIP)
        check = subprocess.run([binary, "-c", "-f", str(self.config_path)],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected {self.config_path}: {check.stdout}"
                               f"{check.stderr}")
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([binary, "-db", "-f", str(self.config_path)],
                                            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:   # the listener answers (any status: the servers may be checked later)
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {self.log_path.read_text()}")
            try:
                httpx.get(self.base_url + "/health", timeout=1)
                return self
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("haproxy did not start listening") from None
                time.sleep(0.05)

    def wait_up(self, count: int, timeout: float = START_TIMEOUT_S,
                headers: dict[str, str] | None = None) -> None:
        """Until ``count`` different instances have answered ``/health`` through us
        (``headers``: the token, when the instances need one). An answer slower than
        the client's timeout (an instance a loaded machine did not run for a while) is
        asked again, as a refusal is: only the deadline gives up."""
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.base_url, timeout=5, headers=headers) as client:
            while len(seen) < count:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {sorted(seen)} of {count} instances came up")
                client.cookies.clear()   # no affinity: let the balancer choose
                try:
                    response = client.get("/daemon/status")
                except httpx.TransportError:
                    response = None
                if response is not None and response.status_code == 200:
                    seen.add(str(response.json()["daemon"]["pid"]))
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    @staticmethod
    def backend_of(response: httpx.Response) -> str | None:
        """The instance named by the affinity cookie HAProxy set on ``response``."""
        return response.cookies.get(COOKIE)

    def __enter__(self) -> HAProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
