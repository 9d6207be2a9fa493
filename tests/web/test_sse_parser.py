"""The console's SSE parser (``/web/sse.js``), run in chromium on the module the daemon
serves: the WHATWG event-stream rules, on every way a stream can be cut into chunks,
and on the daemon's own streams read with fetch()."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page

from tests.web.conftest import Console

# Every chunking of these streams must give the same events, retries and comments.
PARSE = """async ([stream, cuts]) => {
  const { SseParser } = await import('/web/sse.js');
  const results = [];
  for (const cut of cuts) {
    const out = { events: [], retries: [], comments: [] };
    const parser = new SseParser({
      onEvent: (e) => out.events.push([e.type, e.data, e.lastEventId]),
      onRetry: (ms) => out.retries.push(ms),
      onComment: (c) => out.comments.push(c),
    });
    if (cut === 'each') for (const ch of stream) parser.feed(ch);
    else { parser.feed(stream.slice(0, cut)); parser.feed(stream.slice(cut)); }
    parser.end();
    results.push(out);
  }
  return results;
}"""

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("the REST stream's opening", "retry: 3000\n\n: heartbeat\n\nid: 1\nevent: session_update\n"
     'data: {"id":1}\n\n', {"events": [["session_update", '{"id":1}', "1"]],
                            "retries": [3000], "comments": ["heartbeat"]}),
    ("retry inside the first event frame", "retry: 3000\nid: 7\nevent: x\ndata: a\n\n",
     {"events": [["x", "a", "7"]], "retries": [3000], "comments": []}),
    ("CRLF and lone CR line ends", "id: 2\r\nevent: a\rdata: one\r\ndata: two\r\r\n",
     {"events": [["a", "one\ntwo", "2"]], "retries": [], "comments": []}),
    ("multi-line data, no space, empty data line", "data:x\ndata\ndata:  y\n\n",
     {"events": [["message", "x\n\n y", ""]], "retries": [], "comments": []}),
    ("id persists; a frame without data is not dispatched", "id: 5\n\nevent: lone\n\ndata: d\n\n",
     {"events": [["message", "d", "5"]], "retries": [], "comments": []}),
    ("id with NUL is ignored; unknown fields and bad retry too",
     "id: 3\n\ndata: a\n\nid: 4\u0000x\nfoo: bar\nretry: 1s\ndata: b\n\n",
     {"events": [["message", "a", "3"], ["message", "b", "3"]], "retries": [], "comments": []}),
    ("a leading BOM and a comment with no space", "\ufeff:ping\ndata: z\n\n",
     {"events": [["message", "z", ""]], "retries": [], "comments": ["ping"]}),
    ("an unfinished frame at the end is dropped", "data: done\n\ndata: partial\n",
     {"events": [["message", "done", ""]], "retries": [], "comments": []}),
]


@pytest.mark.parametrize(("stream", "expected"), [(s, e) for _, s, e in CASES],
                         ids=[name for name, _, _ in CASES])
def test_every_chunking_gives_the_same_events(console: Console, page: Page, stream: str,
                                              expected: dict[str, Any]) -> None:
    page.goto(console.url("/web/sse.js"))   # same origin, so the module can be imported
    cuts: list[Any] = ["each", *range(len(stream) + 1)]
    results = page.evaluate(PARSE, [stream, cuts])
    for cut, result in zip(cuts, results, strict=True):
        assert result == expected, f"cut at {cut}"


READ = """async (path) => {
  const { readStream } = await import('/web/api.js');
  const events = [];
  await readStream(path, { lastEventId: 0, onEvent: (e) => {
    events.push([e.type, e.lastEventId, JSON.parse(e.data).type]);
  }});
  return events;
}"""


def test_reads_an_lmsp_stream_to_its_end(console: Console, page: Page) -> None:
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "/chunks 3 a b c"}}).json()
    page.goto(console.url("/"))
    events = page.evaluate(READ, f"/lmsp/v1/tasks/{task['id']}/events")
    # Last-Event-ID: 0 → the events after 0; the stream closes after the terminal event.
    assert [e[1] for e in events] == [str(i) for i in range(1, len(events) + 1)]
    assert all(kind == data_type for kind, _, data_type in events)
    assert events[-1][0] == "response.completed"
    assert "response.output_text.delta" in {e[0] for e in events}


FOLLOW = """(path) => new Promise(async (resolve) => {
  const { follow } = await import('/web/api.js');
  const ids = [];
  const states = [];
  follow(path, {
    onEvent: (type, data, id) => { ids.push(Number(id)); },
    onState: (state) => {
      states.push(state);
      if (state === 'ended') resolve({ ids, states });
    },
  });
})"""


def test_follow_resumes_after_the_stream_closes(console: Console, page: Page) -> None:
    """A closed stream is reopened (after the server's ``retry``) with Last-Event-ID:
    no event twice; the task's stream then answers 204 and the follow ends."""
    task = console.client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "/chunks 3 x y z"}}).json()
    page.goto(console.url("/"))
    result = page.evaluate(FOLLOW, f"/lmsp/v1/tasks/{task['id']}/events")
    assert result["ids"] == list(range(len(result["ids"])))   # 0.. once each, in order
    assert result["states"] == ["live", "reconnecting", "ended"]
