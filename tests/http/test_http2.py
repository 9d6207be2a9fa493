"""HTTP/2 on both servers (granian, hyper's HTTP/2; uvicorn, ``acp_server.http.http2``):
h2c by prior knowledge on the HTTP/1.1 port, HTTP/2 over TLS by ALPN, mutual TLS; REST,
``/acp`` (Streamable HTTP) and LMSP through ``httpx`` with ``http2=True``; ``curl`` as a
second client (issue #26)."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.bridge.helpers import wait_until
from tests.harness import ServeProcess

pytestmark = pytest.mark.anyio
CURL = shutil.which("curl")
OPENSSL = shutil.which("openssl")
needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed")
SERVERS = pytest.mark.parametrize("server", ["granian", "uvicorn"])


def h2c(base_url: str, **kwargs: Any) -> httpx.AsyncClient:
    """An HTTP/2-only client: prior knowledge on http://."""
    return httpx.AsyncClient(base_url=base_url, http1=False, http2=True, timeout=20, **kwargs)


def rpc(rpc_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}


@SERVERS
async def test_rest_acp_and_lmsp_over_h2c(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--http-server", server) as daemon, h2c(daemon.base_url) as client:
        # REST: a session, a prompt, its events on an SSE stream of the same connection
        created = await client.post("/session", json={})
        assert created.http_version == "HTTP/2" and created.status_code == 200
        sid = created.json()["sessionId"]
        frames: list[str] = []
        async with aconnect_sse(client, "GET", f"/session/{sid}/events") as source:
            assert source.response.http_version == "HTTP/2"
            prompt = await client.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": "/chunks 3 over h2"}]})
            assert prompt.status_code == 202
            with anyio.fail_after(20):
                async for sse in source.aiter_sse():
                    frames.append(sse.event)
                    if sse.event == "turn_complete":
                        break
        assert frames.count("session_update") >= 3

        # /acp Streamable HTTP: initialize, the connection stream, session/new, a prompt
        init = await client.post("/acp", json=rpc(0, "initialize", {"protocolVersion": 1}))
        assert init.http_version == "HTTP/2" and init.status_code == 200
        conn = init.headers["acp-connection-id"]
        headers = {"Acp-Connection-Id": conn}
        async with aconnect_sse(client, "GET", "/acp", headers=headers) as stream:
            assert stream.response.status_code == 200
            new = await client.post("/acp", headers=headers, json=rpc(
                1, "session/new", {"cwd": str(tmp_path), "mcpServers": []}))
            assert new.status_code == 202
            with anyio.fail_after(20):
                async for sse in stream.aiter_sse():
                    message = json.loads(sse.data) if sse.data else {}
                    if message.get("id") == 1:
                        assert "sessionId" in message["result"]
                        break
        assert (await client.delete("/acp", headers=headers)).status_code in (200, 202, 204)

        # LMSP: a durable task, created and read back over the same HTTP/2 connection
        task = await client.post("/lmsp/v1/tasks", json={
            "type": "response", "input": {"model": "reference", "input": "h2"}})
        assert task.http_version == "HTTP/2" and task.status_code == 202, task.text
        task_id = task.json()["id"]
        with anyio.fail_after(20):
            while (await client.get(f"/lmsp/v1/tasks/{task_id}")).json()["status"] not in (
                    "succeeded", "failed", "cancelled"):
                await anyio.sleep(0.05)
        read = await client.get(f"/lmsp/v1/tasks/{task_id}")
        assert read.http_version == "HTTP/2" and read.json()["status"] == "succeeded"


@needs_curl
@SERVERS
async def test_curl_prior_knowledge_and_http1_on_one_port(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--http-server", server) as daemon:
        for flag, version in (("--http2-prior-knowledge", "2"), ("--http1.1", "1.1")):
            out = await anyio.run_process([CURL, "-sS", flag, "-w", "\n%{http_version}",
                                           daemon.base_url + "/health"])
            body, seen = out.stdout.decode().rsplit("\n", 1)
            assert seen == version and json.loads(body) == {"status": "ok"}


def make_certificates(folder: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for localhost/127.0.0.1 and a client one."""
    files = {name: folder / f"{name}.pem" for name in
             ("ca", "ca-key", "server", "server-key", "client", "client-key")}
    (folder / "server.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                       "extendedKeyUsage=serverAuth\n")
    (folder / "client.cnf").write_text("extendedKeyUsage=clientAuth\n")   # X.509 v3

    def run(*argv: str) -> None:
        subprocess.run([OPENSSL or "openssl", *argv], check=True, capture_output=True)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *curve, "-keyout", str(files["ca-key"]), "-out", str(files["ca"]),
        "-subj", "/CN=acp-server test CA", "-days", "2")
    for who, cn in (("server", "localhost"), ("client", "client")):
        csr = folder / f"{who}.csr"
        run("req", *curve, "-keyout", str(files[f"{who}-key"]), "-out", str(csr),
            "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", str(csr), "-CA", str(files["ca"]), "-CAkey",
            str(files["ca-key"]), "-CAcreateserial", "-out", str(files[who]), "-days", "2",
            "-extfile", str(folder / f"{who}.cnf"))
    return files


@needs_openssl
@needs_curl
@SERVERS
async def test_tls_with_alpn_h2_and_http1(tmp_path: Path, server: str) -> None:
    certs = make_certificates(tmp_path)
    async with ServeProcess(tmp_path, "--http-server", server, "--tls-cert", str(certs["server"]),
                              "--tls-key", str(certs["server-key"])) as daemon:
        assert daemon.base_url.startswith("https://127.0.0.1:")
        url = daemon.base_url.replace("127.0.0.1", "localhost")
        for flag, version in (("--http2", "2"), ("--http1.1", "1.1")):
            out = await anyio.run_process([CURL, "-sS", flag, "--cacert", str(certs["ca"]),
                                           "-w", "\n%{http_version}", url + "/health"])
            body, seen = out.stdout.decode().rsplit("\n", 1)
            assert seen == version and json.loads(body) == {"status": "ok"}
        context = ssl.create_default_context(cafile=str(certs["ca"]))
        async with httpx.AsyncClient(base_url=url, http2=True, verify=context) as client:
            created = await client.post("/session", json={})
            assert created.http_version == "HTTP/2" and created.status_code == 200
        plain = await anyio.run_process([CURL, "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                                         daemon.base_url.replace("https", "http") + "/health"],
                                        check=False)
        assert plain.stdout != b"200"   # no plain HTTP on a TLS port


@needs_openssl
@needs_curl
@SERVERS
async def test_mutual_tls(tmp_path: Path, server: str) -> None:
    certs = make_certificates(tmp_path)
    async with ServeProcess(tmp_path, "--http-server", server, "--tls-cert", str(certs["server"]),
                              "--tls-key", str(certs["server-key"]),
                              "--tls-client-ca", str(certs["ca"])) as daemon:
        url = daemon.base_url.replace("127.0.0.1", "localhost") + "/health"
        base = [CURL, "-sS", "--http2", "--cacert", str(certs["ca"]), "-w", "\n%{http_version}"]
        without = await anyio.run_process([*base, url], check=False)
        assert without.returncode != 0
        with_cert = await anyio.run_process([*base, "--cert", str(certs["client"]), "--key",
                                             str(certs["client-key"]), url])
        assert with_cert.stdout.decode().endswith("\n2")


@needs_openssl
@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the ACP SDK is asyncio's
@SERVERS
async def test_acp_websocket_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str) -> None:
    """The ACP Python SDK's WebSocket transport over ``wss://`` (its default TLS context,
    trusting the test's CA through ``SSL_CERT_FILE``): a session made and prompted."""
    from acp import PROTOCOL_VERSION, Client, connect_to_agent, text_block
    from acp.schema import AgentMessageChunk, ClientCapabilities
    from acp.ws import create_websocket_stream

    class Recording(Client):   # type: ignore[misc]
        def __init__(self) -> None:
            self.said: list[str] = []

        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            if isinstance(update, AgentMessageChunk):
                self.said.append(update.content.text)

    certs = make_certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certs["ca"]))
    async with ServeProcess(tmp_path, "--http-server", server, "--tls-cert", str(certs["server"]),
                              "--tls-key", str(certs["server-key"])) as daemon:
        url = daemon.base_url.replace("https://127.0.0.1", "wss://localhost") + "/acp"
        client = Recording()
        conn = connect_to_agent(client, await create_websocket_stream(url))
        await conn.initialize(protocol_version=PROTOCOL_VERSION,
                              client_capabilities=ClientCapabilities())
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        with anyio.fail_after(20):
            result = await conn.prompt(session_id=session.session_id,
                                       prompt=[text_block("over wss")])
        assert result.stop_reason == "end_turn"
        # the SDK runs each notification's handler in its own task: wait for them
        await wait_until(lambda: "".join(client.said) == "Echo: over wss")
        await conn.close()
