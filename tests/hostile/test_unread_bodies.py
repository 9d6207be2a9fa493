"""A request body the server answers without reading (a refusal of the front layer, a
route that ignores its body) must not cost the client its answer nor the connection.

Found by the fuzz suite (``tests/fuzz``, bodies past 64 KiB): over HTTP/2 on the shipped
daemon (granian), a POST whose body (here 1.1 MB) the route never reads was answered,
the stream reset, and httpx's HTTP/2 client saw ``LocalProtocolError`` instead of the
answer; the same on one connection a third time stalled until the client's timeout (the
connection's flow-control window was never given back). The front layer now reads and
drops what is left of such a body after the answer (``BodyClock.drain``, up to
``front.UNREAD_DRAINED``). Over HTTP/1.1 each answer arrives and the connection is
closed after it (HTTP allows it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness.process import ServeProcess

BODY = b"x" * 1_100_000
UNREAD = [("POST", "/session/nope/cancel", 404), ("POST", "/workspaces/%2Fx%2Fy/acp", 400),
          ("DELETE", "/session/nope/pending-prompts/x", 404)]


@pytest.fixture(scope="module", params=["granian", "uvicorn"])
def daemon(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("unread"), "--http-server",
                      request.param) as child:
        yield child


def _three_times(daemon: ServeProcess, method: str, path: str) -> list[object]:
    answers: list[object] = []
    with httpx.Client(base_url=daemon.base_url, timeout=2, http1=False, http2=True) as http:
        for _ in range(3):
            try:
                answers.append(http.request(method, path, content=BODY).status_code)
            except httpx.HTTPError as exc:
                answers.append(type(exc).__name__)
        answers.append(http.get("/health").status_code)
    return answers


@pytest.mark.parametrize(("method", "path", "status"), UNREAD)
def test_http2_unread_body_is_answered(daemon: ServeProcess, method: str, path: str,
                                       status: int) -> None:
    assert _three_times(daemon, method, path) == [status] * 3 + [200]
