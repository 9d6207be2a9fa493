"""A seeded REST workload against a real ``acp-server serve``, and the model of what it
acknowledged, for the crash-consistency test (``test_crash_consistency.py``)::

    model = Model(workspace_id(str(tmp_path)))
    async with Workload(model, base_url, random.Random(seed)) as work:   # readers run inside
        await work.run(ops=12)            # the seed picks each operation from the model
        await work.start_in_flight()      # maybe one more request, not awaited
        kill_the_server()                 # the readers' streams break; nothing is retried

Contracts: operations run one at a time; each waits for its answer, then for the
session's *stable state* as its primary reader sees it: every prompt the model says is
settled has its terminal event in the stream, and the prompt at the head of the queue
(one that never ends by itself: ``/sleep 60s`` or ``/permission``) has started (its
echo; for a permission prompt, its ``permission_request``). So what was running, queued
or settled at the kill is known exactly, whatever the machine's speed. The choice of an
operation depends only on the seed and on the model (never on server-made ids or on
time), so a seed replays the same workload. Every HTTP response, streams included, is
recorded in ``model.responses``; an answer that is not the one the model expects fails
at once, naming the operation. With ``work.extended`` (set by the test) an agent death
(``/crash`` on a session with nothing running: every live session ends with
``session_died`` and is closed, kept in the journal) joins the choices, and the request
in flight may be a cancel or allow of a session's only prompt or a drop of a queued
one; ``work.acp`` (``crash_acp.AcpOps``) adds the ``/acp`` operations.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import anyio.abc
import httpx

WAIT_S = 30   # a condition the server owes within this long (generous: 2 shared cores)
PROMPT_TEXT = {"short": "/chunks 2 short {n}", "long": "/sleep 60s long {n}",
               "perm": "/permission perm {n}"}
SETTLING = frozenset({"turn_complete", "turn_error"})


def prompt_body(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


@dataclass(eq=False)
class Prompt:
    """An accepted (202) prompt and what the model says became of it."""

    prompt_id: str
    session_id: str
    kind: str                   # short | long | perm | crash
    text: str
    outcome: str | None = None  # completed | cancelled, once settled before the kill


@dataclass(eq=False)
class Session:
    session_id: str
    epoch: str
    how: str                    # create | branch | attach
    prompts: list[Prompt] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)   # prompt ids, in the order they ended
    deleted: bool = False
    closed: bool = False        # closed otherwise (connection, agent death, idle): kept
    marker: bool | None = False   # --session-write-behind: its marker at the kill (None:
                                  # either; crash_window.py), so a resync is due
    new_epoch: str | None = None  # the epoch it came back under, when it resynced
    killed_at: int = 0          # the last event id its primary reader saw before the kill

    def pending(self) -> list[Prompt]:
        return [p for p in self.prompts if p.outcome is None]

    def head(self) -> Prompt | None:
        pending = self.pending()
        return pending[0] if pending else None


@dataclass
class Answer:
    method: str
    path: str
    status: int


@dataclass
class InFlight:
    """The request sent just before the kill, whose answer never came (or came late)."""

    op: str                     # create | branch | prompt | delete | cancel | allow | drop
    session_id: str | None      # the session it was about (branch, prompt, delete)
    text: str | None = None     # a prompt's text
    status: int | None = None   # set if its answer arrived before the kill
    body: Any = None            # and its body
    prompt: Prompt | None = None   # cancel, allow, drop: the prompt it would settle

    def answered(self, *statuses: int) -> bool:
        return self.status in statuses


class Reader:
    """One SSE reader of one session: every envelope it saw, per connection, and the
    ``X-Qwen-Event-Epoch`` of each connection's response."""

    def __init__(self, session_id: str, name: str) -> None:
        self.session_id, self.name = session_id, name
        self.seen: list[dict[str, Any]] = []
        self.epochs: list[str | None] = []
        self.statuses: list[int] = []
        self.ended = False
        self._changed = anyio.Event()
        self._scope = anyio.CancelScope()

    def stop(self) -> None:
        """Close this reader's stream (the session is left without it)."""
        self._scope.cancel()

    def last_id(self) -> int:
        ids = [e["id"] for e in self.seen if e.get("id") is not None]
        return ids[-1] if ids else 0

    async def run(self, client: httpx.AsyncClient, *, epoch: str | None = None) -> None:
        """Read until the stream ends or breaks; reconnects from ``last_id()``."""
        headers = {"Last-Event-ID": str(self.last_id())}
        if epoch is not None:
            headers["X-Qwen-Event-Epoch"] = epoch
        self._scope = anyio.CancelScope()
        try:
            with self._scope:
                await self._read(client, headers)
        finally:
            self.ended = True
            self._notify()

    async def _read(self, client: httpx.AsyncClient, headers: dict[str, str]) -> None:
        try:
            async with client.stream("GET", f"/session/{self.session_id}/events",
                                     headers=headers) as response:
                self.statuses.append(response.status_code)
                self.epochs.append(response.headers.get("x-qwen-event-epoch"))
                self._notify()
                if response.status_code == 200:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            self.seen.append(json.loads(line[len("data: "):]))
                            self._notify()
        except httpx.TransportError:
            pass   # the server was killed under it

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, check: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
        with anyio.fail_after(WAIT_S):
            while not check(self.seen):
                if self.ended:
                    raise AssertionError(
                        f"reader {self.name} ended before {what} (statuses {self.statuses}, "
                        f"last {[(e.get('id'), e['type']) for e in self.seen[-3:]]})")
                await self._changed.wait()


def settled_in(events: list[dict[str, Any]], prompt_id: str) -> bool:
    return any(e["type"] in SETTLING and e.get("promptId") == prompt_id for e in events)


def started_in(events: list[dict[str, Any]], prompt: Prompt, after: int = 0) -> bool:
    """The prompt's turn started (its echo; a permission prompt: its ask), in an event
    past id ``after``."""
    marker = "permission_request" if prompt.kind == "perm" else "session_update"
    return any(e["type"] == marker and e.get("promptId") == prompt.prompt_id
               and (e.get("id") or 0) > after for e in events)


def permission_request_id(events: list[dict[str, Any]], prompt_id: str) -> str:
    asked = [e for e in events if e["type"] == "permission_request"
             and e.get("promptId") == prompt_id]
    return str(asked[-1]["data"]["requestId"])


class Model:
    """What the server acknowledged before the kill."""

    def __init__(self, workspace: str, policy: str = "fail") -> None:
        self.workspace = workspace
        self.policy = policy              # --session-on-restart
        self.window = 0                   # --session-write-behind
        self.sessions: dict[str, Session] = {}
        self.default: str | None = None   # the workspace's default session
        self.readers: list[Reader] = []
        self.responses: list[Answer] = []
        self.log: list[str] = []          # the operations, for the failure message
        self.in_flight: InFlight | None = None
        self.counter = 0

    def live(self) -> list[Session]:
        return [s for s in self.sessions.values() if not s.deleted and not s.closed]

    def primary(self, session_id: str) -> Reader:
        return next(r for r in self.readers if r.session_id == session_id)

    def next_text(self, kind: str) -> str:
        self.counter += 1
        return PROMPT_TEXT[kind].format(n=self.counter)


class ReaderGroup:
    """A workload's two clients (``client``; ``streams`` for event streams) and the task
    group its readers live in: entered, the group opens; left, the group is cancelled
    and both clients are closed."""

    client: httpx.AsyncClient
    streams: httpx.AsyncClient
    _tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(*exc)
        with anyio.CancelScope(shield=True):
            await self.client.aclose()
            await self.streams.aclose()


class Workload(ReaderGroup):
    """Runs the seeded operations on ``base_url``; readers live in its task group."""

    def __init__(self, model: Model, base_url: str, rng: random.Random) -> None:
        self.model, self.base_url, self.rng = model, base_url, rng
        self.client = httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(WAIT_S),
                                        event_hooks={"response": [self._record]})
        self.streams = httpx.AsyncClient(base_url=base_url,
                                         timeout=httpx.Timeout(WAIT_S, read=None),
                                         event_hooks={"response": [self._record]})
        self.acp: Any = None   # crash_acp.AcpOps: its operations join the choices
        self.idle = False      # idle-timeout closes join the choices (a short timeout)
        self.extended = False  # agent deaths (``/crash``) join the choices, and a cancel,
                               # allow or drop may be the request in flight

    async def _record(self, response: httpx.Response) -> None:
        self.model.responses.append(Answer(response.request.method,
                                           response.request.url.path, response.status_code))

    # -- readers --------------------------------------------------------------------------
    def add_reader(self, session_id: str, *, epoch: str | None = None) -> Reader:
        count = sum(1 for r in self.model.readers if r.session_id == session_id)
        reader = Reader(session_id, f"{session_id[:8]}#{count}")
        self.model.readers.append(reader)
        self.resume(reader, epoch=epoch)
        return reader

    def resume(self, reader: Reader, *, epoch: str | None = None) -> None:
        assert self._tg is not None
        reader.ended = False   # not ended while its connection is being made
        self._tg.start_soon(lambda: reader.run(self.streams, epoch=epoch))

    # -- operations -----------------------------------------------------------------------
    async def run(self, ops: int) -> None:
        for _ in range(ops):
            name, operation = self._choose()
            self.model.log.append(name)
            await operation()

    def _choose(self) -> tuple[str, Callable[[], Any]]:
        m, rng = self.model, self.rng
        live = m.live()
        choices: list[tuple[str, Callable[[], Any]]] = [("create", self.create)]
        if len(live) < 4:
            choices.append(("attach", self.attach))
        for s in live:
            head = s.head()
            for kind in ("short", "short", "long", "perm"):
                choices.append((f"prompt {kind} {s.session_id[:8]}",
                                lambda s=s, k=kind: self.prompt(s, k)))
            choices.append((f"reader {s.session_id[:8]}", lambda s=s: self.reader(s)))
            choices.append((f"branch {s.session_id[:8]}", lambda s=s: self.branch(s)))
            if head is not None:
                choices.append((f"cancel {s.session_id[:8]}", lambda s=s: self.cancel(s)))
                if head.kind == "perm":
                    choices.append((f"allow {s.session_id[:8]}", lambda s=s: self.allow(s)))
                for p in s.pending():
                    choices.append((f"drop {p.text}", lambda s=s, p=p: self.drop(s, p)))
            if len(s.prompts) >= 2:
                choices.append((f"delete {s.session_id[:8]}", lambda s=s: self.delete(s)))
            if self.idle and head is None:
                choices.append((f"idle {s.session_id[:8]}", lambda s=s: self.idle_close(s)))
            if self.extended and head is None:
                choices.append((f"agent death {s.session_id[:8]}",
                                lambda s=s: self.agent_death(s)))
        if self.acp is not None:
            choices += self.acp.choices()
        if not live:
            choices = [("create", self.create)]
        return rng.choice(choices)

    async def _expect(self, response: httpx.Response, status: int, what: str) -> Any:
        assert response.status_code == status, (
            f"{what}: {response.status_code} {response.text[:300]} (expected {status})")
        return response.json() if response.content else None

    def _new_session(self, body: dict[str, Any], how: str) -> Session:
        session = Session(body["sessionId"], body["eventEpoch"], how)
        self.model.sessions[session.session_id] = session
        self.add_reader(session.session_id)
        return session

    async def create(self) -> None:
        body = await self._expect(await self.client.post(
            "/session", json={"sessionScope": "thread"}), 200, "create")
        self._new_session(body, "create")

    async def attach(self) -> None:
        m = self.model
        body = await self._expect(await self.client.post("/session", json={}), 200, "attach")
        default = m.sessions.get(m.default) if m.default else None
        if default is not None and not default.deleted and not default.closed:
            assert (body["sessionId"], body["attached"]) == (default.session_id, True), body
        else:
            assert body["attached"] is False and body["sessionId"] not in m.sessions, body
            m.default = self._new_session(body, "attach").session_id

    async def prompt(self, session: Session, kind: str) -> None:
        text = self.model.next_text(kind)
        body = await self._expect(await self.client.post(
            f"/session/{session.session_id}/prompt", json=prompt_body(text)), 202, "prompt")
        assert body["eventEpoch"] == session.epoch, body
        session.prompts.append(Prompt(body["promptId"], session.session_id, kind, text))
        await self.stable(session)

    async def reader(self, session: Session) -> None:
        self.add_reader(session.session_id, epoch=session.epoch)
        await self.stable(session)

    async def branch(self, session: Session) -> None:
        response = await self.client.post(f"/session/{session.session_id}/branch", json={})
        if session.head() is not None:   # queued or running prompts: refused
            body = await self._expect(response, 409, "branch of a busy session")
            assert body["code"] == "branch_while_prompt_active", body
            return
        body = await self._expect(response, 201, "branch")
        assert body["forkedFrom"]["sessionId"] == session.session_id, body
        self._new_session(body, "branch")

    async def cancel(self, session: Session) -> None:
        await self._expect(await self.client.post(f"/session/{session.session_id}/cancel"),
                           204, "cancel")
        self._settle(session, session.pending()[0], "cancelled")
        await self.stable(session)

    async def allow(self, session: Session) -> None:
        head = session.pending()[0]
        request_id = permission_request_id(self.model.primary(session.session_id).seen,
                                           head.prompt_id)
        await self._expect(await self.client.post(f"/permission/{request_id}", json={
            "outcome": {"outcome": "selected", "optionId": "allow_once"}}), 200, "allow")
        self._settle(session, head, "completed")
        await self.stable(session)

    async def drop(self, session: Session, prompt: Prompt) -> None:
        await self._expect(await self.client.delete(
            f"/session/{session.session_id}/pending-prompts/{prompt.prompt_id}"), 200, "drop")
        self._settle(session, prompt, "cancelled")
        await self.stable(session)

    async def delete(self, session: Session) -> None:
        await self._expect(await self.client.delete(f"/session/{session.session_id}"), 204,
                           "delete")
        session.deleted = True
        for reader in self.model.readers:
            if reader.session_id == session.session_id:
                await reader.wait_for(lambda _: reader.ended, "its stream ended (deleted)")

    async def idle_close(self, session: Session) -> None:
        """Its readers go; with nothing running it is idle, and the server (a short
        ``--session-idle-timeout-ms``) closes it: closed, kept in the journal."""
        for reader in self.model.readers:
            if reader.session_id == session.session_id:
                await reader.wait_for(lambda _, r=reader: bool(r.statuses), "connected")
                reader.stop()
                await reader.wait_for(lambda _, r=reader: r.ended, f"{reader.name} stopped")
        with anyio.fail_after(WAIT_S):   # polled: closed by the reaper, no one is told
            while (await self.client.get(
                    f"/session/{session.session_id}/status")).status_code != 404:
                await anyio.sleep(0.05)
        session.closed = True

    async def agent_death(self, session: Session) -> None:
        """``/crash``: the reference agent (in process, one connection for all its
        sessions) dies mid-turn: that turn ends ``agent_died``, then every live session
        (all on that agent) ends with ``session_died``: closed, kept in the journal."""
        text = "/crash death"
        for reader in self.model.readers:   # every stream open first: it sees the death
            if not self.model.sessions[reader.session_id].deleted:
                await reader.wait_for(lambda _, r=reader: bool(r.statuses) or r.ended,
                                      f"{reader.name} connected")
        body = await self._expect(await self.client.post(
            f"/session/{session.session_id}/prompt", json=prompt_body(text)), 202, "crash")
        session.prompts.append(Prompt(body["promptId"], session.session_id, "crash", text,
                                      outcome="failed"))
        for other in self.model.live():
            other.closed = True
            for reader in self.model.readers:
                if reader.session_id == other.session_id:
                    await reader.wait_for(lambda _, r=reader: r.ended, f"{reader.name} ended")
            died = [e for e in self.model.primary(other.session_id).seen
                    if e["type"] == "session_died"]
            assert len(died) == 1, (other.session_id, [
                (e.get("id"), e["type"], e.get("promptId"))
                for e in self.model.primary(other.session_id).seen])
            status = await self.client.get(f"/session/{other.session_id}/status")
            assert status.status_code == 404, status.text
        ended = [e for e in self.model.primary(session.session_id).seen
                 if e.get("promptId") == body["promptId"] and e["type"] in SETTLING]
        assert [(e["type"], e["data"].get("code")) for e in ended] == [
            ("turn_error", "agent_died")], ended

    def _settle(self, session: Session, prompt: Prompt, outcome: str) -> None:
        prompt.outcome = outcome
        session.settled.append(prompt.prompt_id)

    async def stable(self, session: Session) -> None:
        """Short prompts at the head run to their end; the head that never ends by
        itself has started. Then every settled prompt's terminal is in the stream."""
        reader = self.model.primary(session.session_id)
        while (head := session.head()) is not None and head.kind == "short":
            await reader.wait_for(lambda seen: settled_in(seen, head.prompt_id),
                                  f"{head.text} ended")
            self._settle(session, head, "completed")
        if head is not None:
            await reader.wait_for(lambda seen: started_in(seen, head), f"{head.text} started")
        for prompt_id in session.settled:
            await reader.wait_for(lambda seen: settled_in(seen, prompt_id),
                                  f"the terminal of {prompt_id}")
        # Every other reader of the session has caught up with the primary one.
        last = reader.last_id()
        for other in self.model.readers:
            if other.session_id == session.session_id and other is not reader:
                await other.wait_for(lambda _: other.last_id() >= last, f"{other.name} at {last}")

    # -- the request in flight at the kill ------------------------------------------------
    async def start_in_flight(self) -> InFlight | None:
        """Maybe send one more request (chosen by the seed) and not wait for it."""
        m, rng = self.model, self.rng
        if rng.random() < 0.5:
            return None
        live = m.live()
        options = ["create"] + ([f"{op}" for op in ("branch", "prompt", "delete")]
                                if live else [])
        # A cancel or allow of a session's only prompt, a drop of a queued one: either
        # way nothing else changes place (the test's settle_flight finds which it was).
        settles = {"cancel": [(s, s.pending()[0]) for s in live if len(s.pending()) == 1],
                   "allow": [(s, s.pending()[0]) for s in live if len(s.pending()) == 1
                             and s.pending()[0].kind == "perm"],
                   "drop": [(s, p) for s in live for p in s.pending()[1:]]}
        offered = [op for op, cands in settles.items() if cands] if self.extended else []
        # Half the time one of those when there is one (else they would be rare).
        op = rng.choice(offered if offered and rng.random() < 0.5 else options + offered)
        if op in settles:
            return self._settle_in_flight(op, *rng.choice(settles[op]))
        target = rng.choice(live).session_id if op != "create" else None
        if op == "prompt" and self.acp is not None and rng.random() < 0.5:   # over /acp
            flight = await self.acp.send_in_flight(m.sessions[target],
                                                   m.next_text("short"))
            m.in_flight = flight
            m.log.append(f"in flight: acp prompt {target}")
            return flight
        flight = InFlight(op, target)
        if op == "create":
            method, path, body = "POST", "/session", {"sessionScope": "thread"}
        elif op == "branch":
            method, path, body = "POST", f"/session/{target}/branch", {}
        elif op == "prompt":
            flight.text = m.next_text("short")
            method, path, body = "POST", f"/session/{target}/prompt", prompt_body(flight.text)
        else:
            method, path, body = "DELETE", f"/session/{target}", None

        async def send() -> None:
            try:
                response = await self.client.request(method, path, json=body)
                flight.body = response.json() if response.content else None
                flight.status = response.status_code
            except httpx.TransportError:
                pass

        assert self._tg is not None
        self._tg.start_soon(send)
        m.in_flight = flight
        m.log.append(f"in flight: {op} {target or ''}")
        return flight

    def _settle_in_flight(self, op: str, session: Session, prompt: Prompt) -> InFlight:
        sid = session.session_id
        flight = InFlight(op, sid, text=prompt.text, prompt=prompt)
        if op == "cancel":
            method, path, body = "POST", f"/session/{sid}/cancel", None
        elif op == "allow":
            request_id = permission_request_id(self.model.primary(sid).seen, prompt.prompt_id)
            method, path, body = "POST", f"/permission/{request_id}", {
                "outcome": {"outcome": "selected", "optionId": "allow_once"}}
        else:
            method, body = "DELETE", None
            path = f"/session/{sid}/pending-prompts/{prompt.prompt_id}"

        async def send() -> None:
            try:
                response = await self.client.request(method, path, json=body)
                flight.status = response.status_code
            except httpx.TransportError:
                pass

        assert self._tg is not None
        self._tg.start_soon(send)
        self.model.in_flight = flight
        self.model.log.append(f"in flight: {op} {prompt.text} {sid}")
        return flight
