"""A browser ``EventSource`` (Playwright driving Debian's chromium) reads the REST and
LMSP event streams: every event it dispatches carries JSON data, keep-alives included.
(``/acp`` streams need ``Acp-Connection-Id``, a header ``EventSource`` cannot send.)

Playwright's sync API runs in a worker thread, so the tests run under both backends.
Skipped, with the reason, when Playwright or ``/usr/bin/chromium`` is missing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

sync_api = pytest.importorskip("playwright.sync_api")

from acp_server.lmsp import LmspConfig  # noqa: E402
from tests.lmsp.server import running_lmsp  # noqa: E402
from tests.rest.server import running_server  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.clients]
CHROMIUM = "/usr/bin/chromium"

# Collects every named event until `stop` arrives; `data` must parse as JSON.
COLLECT = """async ([url, names, stop, before]) => {
  const seen = [];
  return await new Promise((resolve, reject) => {
    const es = new EventSource(url);
    for (const name of names) {
      es.addEventListener(name, (e) => {
        seen.push({type: name, id: e.lastEventId, data: JSON.parse(e.data)});
        if (name === stop) { es.close(); resolve(seen); }
      });
    }
    es.onmessage = (e) => seen.push({type: "message", data: e.data});
    es.onerror = () => { es.close(); reject(new Error("EventSource error")); };
    es.onopen = () => { if (before) fetch(before.url, {method: "POST",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify(before.body)}); };
  });
}"""


def _browse(base_url: str, script: str, arg: Any) -> Any:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(base_url + "/health")     # same origin as the streams
            return page.evaluate(script, arg)
        finally:
            browser.close()


@pytest.fixture(scope="module", autouse=True)
def _chromium() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not installed: the EventSource test needs Debian's chromium")


async def test_eventsource_reads_rest_events(tmp_path: Path) -> None:
    async with running_server(tmp_path, heartbeat_s=0.05) as srv:
        sid = (await srv.create_session(sessionScope="thread"))["sessionId"]
        names = ["session_update", "turn_complete", "pending_prompt_added"]
        prompt = {"url": f"/session/{sid}/prompt",
                  "body": {"prompt": [{"type": "text", "text": "/sleep 200ms /chunks 3 browser"}]}}
        seen = await anyio.to_thread.run_sync(
            _browse, srv.base_url, COLLECT, [f"/session/{sid}/events", names, "turn_complete",
                                             prompt])
    assert [e["type"] for e in seen if e["type"] == "message"] == []   # no unnamed event
    assert seen[-1]["data"]["type"] == "turn_complete"
    chunks = [e["data"]["data"]["update"]["content"]["text"] for e in seen
              if e["type"] == "session_update"
              and e["data"]["data"]["update"]["sessionUpdate"] == "agent_message_chunk"]
    assert "".join(chunks) == "Echo: browser"
    ids = [int(e["id"]) for e in seen]
    assert ids == list(range(ids[0], ids[0] + len(ids)))


async def test_eventsource_reads_lmsp_events(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, config=LmspConfig(keepalive_s=0.05)) as srv:
        task = await srv.create("/sleep 200ms /chunks 4 from the browser")
        names = ["response.created", "response.in_progress", "response.output_text.delta",
                 "response.completed"]
        seen = await anyio.to_thread.run_sync(
            _browse, srv.base_url, COLLECT,
            [f"/lmsp/v1/tasks/{task['id']}/events", names, "response.completed", None])
    assert [e["type"] for e in seen][:2] == ["response.created", "response.in_progress"]
    assert [int(e["id"]) for e in seen] == [e["data"]["sequence_number"] for e in seen]
    deltas = "".join(e["data"]["delta"] for e in seen if e["type"] == "response.output_text.delta")
    assert deltas == "Echo: from the browser"
