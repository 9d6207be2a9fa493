"""The ``/acp`` half of the crash-consistency workload (``test_crash_consistency.py``):
one resumable ACP connection over the WebSocket (``tests/acp_http/wsclient.py``, anyio +
wsproto, both backends) whose operations join the seeded REST ones::

    acp = AcpOps(work, cwd=str(tmp_path))   # work: a crash_workload.Workload
    await acp.open()                        # initialize with acp-server/resumable
    work.acp = acp                          # its choices join work._choose's
    ...                                     # the kill drops the socket, no close frame
    await check_acp_loads(after, model)     # after the restart: load by cursor

Contracts: the operations are ``session/new`` (the session joins the model with a REST
reader, as a REST create), ``session/prompt`` under ``_meta["acp-server/promptId"]``
(its answer comes at the turn's end, so it counts as acknowledged once the server has
journaled it: the REST reader sees an event of that prompt, ``pending_prompt_added`` or
its start, which are published only once the prompt's record is committed),
``session/cancel`` (a request: settles the head as REST's cancel does), the answer to a
``session/request_permission`` (allow), ``session/close`` and ``session/delete`` (the
session's journal goes, as with REST's DELETE) and a close frame 1000, which ends the
connection as ``DELETE /acp`` does (docs/acp.md): the sessions it made are closed
(``connection_closed``) but kept in the journal, as an idle timeout or an agent death
leaves them (``Session.closed``); a new connection takes its place. Every prompt
settled before the kill had its JSON-RPC answer (``end_turn`` or ``cancelled``) before
the next operation. After the restart
``check_acp_loads`` loads each live ACP session on a fresh connection with
``_meta["acp-server/lastEventId"]`` / ``["acp-server/eventEpoch"]`` set to what the old
connection saw: only what followed comes (ids past the cursor, in order, none twice,
every ``session_update`` of the full read past it), under the same epoch, no resync (a
session that resynced under ``--session-write-behind``: ``resync: "epoch_reset"`` and
nothing replayed, as docs/editors.md says of a foreign epoch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import anyio

from tests.acp_http.wsclient import WsClient, ws_connect
from tests.store.crash_workload import (
    WAIT_S,
    InFlight,
    Prompt,
    Session,
    Workload,
    permission_request_id,
    settled_in,
)

EVENT_META = "acp-server/event"
RESUMABLE = {"protocolVersion": 1, "_meta": {"acp-server/resumable": True}}


def _text(value: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": value}]


def event_of(frame: dict[str, Any]) -> dict[str, Any] | None:
    """The ``{sessionId, id, epoch}`` marker of an event frame, else None."""
    params = frame.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    marker = meta.get(EVENT_META) if isinstance(meta, dict) else None
    return marker if isinstance(marker, dict) else None


class AcpPeer:
    """One ``/acp`` WebSocket connection: every frame it got, answers by id."""

    def __init__(self, ws: WsClient) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self.replies: dict[Any, dict[str, Any]] = {}
        self.ended = False
        self.next_id = 1
        self.sessions: list[str] = []   # the ones it made (a close frame 1000 closes them)
        self._changed = anyio.Event()

    async def pump(self) -> None:
        try:
            while True:
                frame = await self.ws.receive_json(timeout=24 * 3600)
                self.frames.append(frame)
                if "method" not in frame and "id" in frame:
                    self.replies[frame["id"]] = frame
                self._notify()
        except Exception:   # noqa: BLE001 - the kill, a close: the socket is gone
            pass
        finally:
            self.ended = True
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, check: Callable[[], bool], what: str) -> None:
        with anyio.fail_after(WAIT_S):
            while not check():
                if self.ended:
                    raise AssertionError(f"the /acp connection ended before {what} "
                                         f"(last frames {self.frames[-3:]})")
                await self._changed.wait()

    async def send(self, method: str, params: dict[str, Any]) -> int:
        rpc_id, self.next_id = self.next_id, self.next_id + 1
        await self.ws.send_json({"jsonrpc": "2.0", "id": rpc_id, "method": method,
                                 "params": params})
        return rpc_id

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rpc_id = await self.send(method, params)
        await self.wait_for(lambda: rpc_id in self.replies, f"the answer to {method}")
        reply = self.replies[rpc_id]
        assert "result" in reply, f"{method}: {reply}"
        return reply["result"]  # type: ignore[no-any-return]

    def last_event_id(self, session_id: str) -> int:
        ids = [m["id"] for f in self.frames if (m := event_of(f)) is not None
               and m.get("sessionId", session_id) == session_id]
        return max(ids, default=0)


async def open_peer(work: Workload) -> AcpPeer:
    """A resumable connection in the workload's task group, initialized."""
    ready: list[AcpPeer] = []
    opened = anyio.Event()

    async def run() -> None:
        async with ws_connect(work.base_url, "/acp") as ws:
            peer = AcpPeer(ws)
            ready.append(peer)
            opened.set()
            await peer.pump()

    assert work._tg is not None
    work._tg.start_soon(run)
    with anyio.fail_after(WAIT_S):
        await opened.wait()
    peer = ready[0]
    await peer.call("initialize", RESUMABLE)
    return peer


class AcpOps:
    """The seeded ``/acp`` operations of one workload (see the module docstring)."""

    def __init__(self, work: Workload, cwd: str) -> None:
        self.work, self.cwd = work, cwd
        self.peer: AcpPeer | None = None
        self.prompt_rpc: dict[str, tuple[AcpPeer, int]] = {}   # prompt id -> its request
        self.peers: list[AcpPeer] = []

    async def open(self) -> None:
        self.peer = await open_peer(self.work)
        self.peers.append(self.peer)

    def choices(self) -> list[tuple[str, Callable[[], Any]]]:
        m = self.work.model
        live = m.live()
        out: list[tuple[str, Callable[[], Any]]] = [("acp new", self.new)]
        for s in live:
            short = s.session_id[:8]
            for kind in ("short", "long", "perm"):
                out.append((f"acp prompt {kind} {short}", lambda s=s, k=kind: self.prompt(s, k)))
            head = s.head()
            if head is not None:
                out.append((f"acp cancel {short}", lambda s=s: self.cancel(s)))
                if head.kind == "perm" and self.prompt_rpc.get(head.prompt_id, (None,))[0] \
                        is self.peer:
                    out.append((f"acp allow {short}", lambda s=s: self.allow(s)))
            if s.prompts:
                out.append((f"acp close {short}", lambda s=s: self.remove(s, "session/close")))
                out.append((f"acp delete {short}",
                            lambda s=s: self.remove(s, "session/delete")))
        if self.peer is not None and any(s.session_id in self.peer.sessions for s in live):
            out.append(("acp close frame 1000", self.close_frame))
        return out

    async def new(self) -> None:
        assert self.peer is not None
        result = await self.peer.call("session/new", {"cwd": self.cwd, "mcpServers": []})
        session_id = result["sessionId"]
        status = await self.work.client.get(f"/session/{session_id}/status")
        assert status.status_code == 200, status.text
        session = Session(session_id, status.json()["eventEpoch"], "acp")
        self.work.model.sessions[session_id] = session
        self.peer.sessions.append(session_id)
        self.work.add_reader(session_id)

    def _send_prompt(self, session: Session, prompt_id: str, text: str) -> Any:
        assert self.peer is not None
        return self.peer.send("session/prompt", {
            "sessionId": session.session_id, "prompt": _text(text),
            "_meta": {"acp-server/promptId": prompt_id}})

    async def prompt(self, session: Session, kind: str) -> None:
        assert self.peer is not None
        text = self.work.model.next_text(kind)
        prompt_id = f"acp-{self.work.model.counter}"
        rpc_id = await self._send_prompt(session, prompt_id, text)
        self.prompt_rpc[prompt_id] = (self.peer, rpc_id)
        reader = self.work.model.primary(session.session_id)
        # Journaled: an event of it reached the REST stream (published once committed).
        await reader.wait_for(lambda seen: any(e.get("promptId") == prompt_id for e in seen),
                              f"{text} journaled")
        session.prompts.append(Prompt(prompt_id, session.session_id, kind, text))
        await self.work.stable(session)
        await self.answered(session)

    async def answered(self, session: Session) -> None:
        """Every ACP prompt of the session settled so far had its JSON-RPC answer."""
        for prompt in session.prompts:
            sent = self.prompt_rpc.get(prompt.prompt_id)
            if prompt.outcome is None or sent is None or sent[0].ended:
                continue
            peer, rpc_id = sent
            await peer.wait_for(lambda p=peer, i=rpc_id: i in p.replies,
                                f"the answer to {prompt.text}")
            want = "end_turn" if prompt.outcome == "completed" else "cancelled"
            assert peer.replies[rpc_id].get("result") == {"stopReason": want}, (
                prompt.text, peer.replies[rpc_id])

    async def cancel(self, session: Session) -> None:
        assert self.peer is not None
        assert await self.peer.call("session/cancel", {"sessionId": session.session_id}) == {}
        self.work._settle(session, session.pending()[0], "cancelled")
        await self.work.stable(session)
        await self.answered(session)

    async def allow(self, session: Session) -> None:
        head = session.pending()[0]
        peer = self.prompt_rpc[head.prompt_id][0]
        reader = self.work.model.primary(session.session_id)
        request_id = permission_request_id(reader.seen, head.prompt_id)
        asked = next(e["id"] for e in reader.seen if e["type"] == "permission_request"
                     and e["data"]["requestId"] == request_id)
        # The connection that sent the prompt is asked too: a JSON-RPC request carrying
        # the same event id.
        def ask_frames() -> list[dict[str, Any]]:
            return [f for f in peer.frames if f.get("method") == "session/request_permission"
                    and "id" in f and (event_of(f) or {}).get("id") == asked]
        await peer.wait_for(lambda: bool(ask_frames()), "the permission request")
        ask = ask_frames()[-1]
        await peer.ws.send_json({"jsonrpc": "2.0", "id": ask["id"], "result": {
            "outcome": {"outcome": "selected", "optionId": "allow_once"}}})
        await reader.wait_for(lambda seen: settled_in(seen, head.prompt_id),
                              f"{head.text} allowed")
        self.work._settle(session, head, "completed")
        await self.work.stable(session)
        await self.answered(session)

    async def remove(self, session: Session, method: str) -> None:
        assert self.peer is not None
        assert await self.peer.call(method, {"sessionId": session.session_id}) == {}
        session.deleted = True
        await self._gone([session])

    async def close_frame(self) -> None:
        """A close frame 1000 ends the connection as ``DELETE /acp`` does: the sessions
        it made are closed (``connection_closed``), not deleted: the journal keeps them."""
        peer = self.peer
        assert peer is not None
        mine = [s for s in self.work.model.live() if s.session_id in peer.sessions]
        await peer.ws.close(1000)
        await peer.wait_for(lambda: peer.ended, "its close")
        for session in mine:
            session.closed = True
        await self._gone(mine)
        await self.open()

    async def _gone(self, sessions: list[Session]) -> None:
        for session in sessions:
            for reader in self.work.model.readers:
                if reader.session_id == session.session_id:
                    await reader.wait_for(lambda _, r=reader: r.ended,
                                          f"{reader.name} ended (closed)")
            status = await self.work.client.get(f"/session/{session.session_id}/status")
            assert status.status_code == 404, (session.session_id, status.text)

    async def send_in_flight(self, session: Session, text: str) -> InFlight:
        """A prompt over ``/acp`` not waited for (its answer never comes before the kill)."""
        prompt_id = f"acp-{self.work.model.counter}"
        await self._send_prompt(session, prompt_id, text)
        return InFlight("prompt", session.session_id, text=text,
                        body={"promptId": prompt_id, "via": "acp"})


async def check_acp_loads(work: Workload, model: Any, acp: AcpOps,
                          fulls: dict[str, list[dict[str, Any]]]) -> None:
    """Each live ACP session, loaded on a fresh connection with the cursor the old one
    reached, gets only what followed, under the same epoch."""
    sessions = [s for s in model.live() if s.how == "acp"]
    if not sessions:
        return
    peer = await open_peer(work)
    for session in sessions:
        old = next(p for p in acp.peers if session.session_id in p.sessions)
        cursor = old.last_event_id(session.session_id)
        start = len(peer.frames)
        result = await peer.call("session/load", {
            "sessionId": session.session_id, "cwd": acp.cwd, "mcpServers": [],
            "_meta": {"acp-server/lastEventId": cursor,
                      "acp-server/eventEpoch": session.epoch}})
        events = result["_meta"]["acp-server/events"]
        if session.new_epoch is not None:   # write-behind, its marker set: a new epoch
            assert (events.get("resync"), events["eventEpoch"]) == (
                "epoch_reset", session.new_epoch), events
            cursor = events["lastEventId"]   # docs/editors.md: nothing is replayed
        else:
            assert events.get("resync") is None and events["eventEpoch"] == session.epoch, (
                events)
        replayed = [(m["id"], f) for f in peer.frames[start:]
                    if (m := event_of(f)) is not None
                    and m.get("sessionId", session.session_id) == session.session_id]
        ids = [i for i, _ in replayed]
        assert ids == sorted(set(ids)) and all(i > cursor for i in ids), (
            f"{session.session_id}: replayed ids {ids} after cursor {cursor}")
        full = {e["id"]: e for e in fulls[session.session_id] if e.get("id") is not None}
        wanted = [i for i, e in full.items() if i > cursor and e["type"] == "session_update"]
        got = {i: f for i, f in replayed if f.get("method") == "session/update"}
        assert sorted(got) == wanted, (
            f"{session.session_id}: session/update ids {sorted(got)} after cursor {cursor}, "
            f"the full read has {wanted}")
        for event_id, frame in got.items():
            assert frame["params"]["update"] == full[event_id]["data"]["update"], event_id
    with contextlib.suppress(Exception):
        await peer.ws.close(4000)   # not 1000: leave the sessions as they are
