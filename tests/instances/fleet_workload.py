"""The fleet, the seeded workload and its model for the crash-consistency test of
sessions across instances (``test_crash_consistency.py``)::

    fleet = Fleet(tmp_path, url, count=3, policy="fail", affinity="cookie")
    await fleet.start()                        # the instances, then HAProxy in front
    model = Model()
    async with Workload(model, fleet, random.Random(seed)) as work:   # readers inside
        await work.run(ops=16, kills=[(5, 1, 8)])   # kill -9 instance 1 at op 5, back at 8
        await work.drain()                     # every instance up, every queue empty

Contracts: the instances are real ``acp-server serve`` children (the reference agent)
on one PostgreSQL store, each on a fixed port (a restart binds the same one, with the
same ``--state-dir``, so HAProxy's configuration stays right), behind a real HAProxy.
Every request of the workload goes through the balancer. Operations (the seed picks
each from the model, never from server-made ids or time): create a session, prompts
(``/chunks 2`` short ones, ``/sleep 200ms`` long ones, ``/permission`` ones nobody
answers, which hold their session until a cancel or a kill), cancel, ``/load``, the
session listing, new SSE readers (from id 0 or from the session's last id) and
readers dropped and resumed by ``Last-Event-ID``. A kill (``kill -9``, the victim
the seed's, owner or not) may come with a prompt in flight (not waited for). A write
answered 503 with a retryable code (``owner_unreachable``, ``session_moved``,
``store_unavailable``: the session is moving) is sent again, as a client does; a
prompt refused ``prompt_queue_full`` is not. A write whose answer never came (the
connection broke, HAProxy answered for the killed instance, or the instance that
forwarded it says ``owner_lost``: the owner took it and died) has an unknown outcome,
except a prompt: each is sent under the model's own ``promptId`` and sent again under
it until an answer comes (the server admits it once: 202, or 200 once it has ended),
as our SDK does. Only a prompt still unanswered after ``WAIT_S`` is unknown
(``Prompt.accepted`` ``None``; its unique text finds it afterwards). Every answer,
streams included, is recorded (``Model.answers``, with the kills it spanned) for the
no-500 check; ``Model.log`` is the operation log a failure prints.
"""

from __future__ import annotations

import datetime
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx

from acp_server.rest.workspace import workspace_id
from tests.harness import ServeProcess, free_port
from tests.harness.haproxy import HAProxy
from tests.lmsp import stores
from tests.store.crash_workload import ReaderGroup

WAIT_S = 30       # a condition the fleet owes within this long (2 shared cores)
TTL_MS, RENEW_MS = 1500, 300
LIMIT = 5         # --max-pending-prompts-per-session
PROMPT_TEXT = {"short": "/chunks 2 short {n}", "long": "/sleep 200ms long {n}",
               "perm": "/permission perm {n}"}
SETTLING = frozenset({"turn_complete", "turn_error"})
# 503s a client retries: the session is moving between instances, or the store blinked
MOVING = frozenset({"owner_unreachable", "session_moved", "store_unavailable"})
LOST = frozenset({"owner_lost"})   # forwarded, no answer: the outcome unknown, not retried
REFUSED = frozenset({"prompt_queue_full"})   # a documented refusal, not retried


def prompt_body(text: str, prompt_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": [{"type": "text", "text": text}]}
    if prompt_id is not None:
        body["promptId"] = prompt_id
    return body


@dataclass(eq=False)
class Prompt:
    session_id: str
    kind: str                     # short | long | perm
    text: str
    accepted: bool | None = None  # 202 (or 200: ended); False: refused; None: no answer
    prompt_id: str | None = None
    # Model.tick() as the first attempt that may have been admitted went out: the last
    # attempt, unless an earlier one got no answer (taken or not: unknown). It ends
    # before any prompt whose 202 came after this.
    sent: int = 0
    answered: int | None = None   # Model.tick() as its 202 (or 200) came (None: none)
    maybe_taken: bool = False     # an attempt got no answer


@dataclass(eq=False)
class Session:
    session_id: str
    epoch: str
    prompts: list[Prompt] = field(default_factory=list)   # sent, in the order sent

    def accepted(self) -> list[Prompt]:
        return [p for p in self.prompts if p.accepted]

    def unknown(self) -> list[Prompt]:
        return [p for p in self.prompts if p.accepted is None]


@dataclass
class Answer:
    method: str
    path: str
    status: int
    body: str
    balancer: bool      # HAProxy answered (an HTML page), not an instance
    spanned_kill: bool  # a kill came while the request was out


class Reader:
    """One SSE reader of one session through the balancer, as an editor reads: it
    resumes by ``Last-Event-ID`` (and the epoch it knows) whenever its stream ends or
    breaks, until stopped. ``seen`` holds every envelope with an id, ``frames`` every
    envelope; ``epochs`` the ``X-Qwen-Event-Epoch`` of each connection."""

    def __init__(self, session_id: str, name: str, epoch: str, start: int) -> None:
        self.session_id, self.name, self.epoch = session_id, name, epoch
        self.start = start            # the Last-Event-ID of its first connection
        self.seen: list[dict[str, Any]] = []
        self.frames: list[dict[str, Any]] = []
        self.epochs: list[str | None] = []
        self.statuses: list[int] = []
        self.connections = 0
        self.stopped = False
        self._scope = anyio.CancelScope()
        self._changed = anyio.Event()

    def last_id(self) -> int:
        return int(self.seen[-1]["id"]) if self.seen else self.start

    def drop(self) -> None:
        """End the current connection; the reader resumes from its last id."""
        self._scope.cancel()

    def stop(self) -> None:
        self.stopped = True
        self._scope.cancel()

    async def run(self, client: httpx.AsyncClient) -> None:
        while not self.stopped:
            self._scope = anyio.CancelScope()
            with self._scope:
                await self._connect(client)
            if not self.stopped:
                await anyio.sleep(0.05)   # a client's back-off before it reconnects

    async def _connect(self, client: httpx.AsyncClient) -> None:
        headers = {"Last-Event-ID": str(self.last_id()), "X-Qwen-Event-Epoch": self.epoch}
        self.connections += 1
        try:
            async with client.stream("GET", f"/session/{self.session_id}/events",
                                     headers=headers) as response:
                self.statuses.append(response.status_code)
                self.epochs.append(response.headers.get("x-qwen-event-epoch"))
                if response.status_code != 200:
                    await response.aread()
                    return
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        envelope = json.loads(line[len("data: "):])
                        self.frames.append(envelope)
                        if envelope.get("id") is not None:
                            self.seen.append(envelope)
                        self._notify()
        except httpx.TransportError:
            pass   # an instance killed under it, or the balancer cut it: resume

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, check: Callable[[], bool], what: str) -> None:
        with anyio.fail_after(WAIT_S):
            while not check():
                with anyio.move_on_after(0.5):   # frames wake it; a reconnect may not
                    await self._changed.wait()
        _ = what


@dataclass
class Model:
    """What the fleet acknowledged, and the operations' log."""

    sessions: dict[str, Session] = field(default_factory=dict)
    readers: list[Reader] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    unknown_creates: int = 0      # creates whose answer never came
    counter: int = 0
    clock: int = 0                # a logical clock of sends and answers (tick)

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def note(self, line: str) -> None:
        """A line of the log, with the wall clock (as the instances' and HAProxy's logs)."""
        self.log.append(f"{datetime.datetime.now():%H:%M:%S.%f}"[:12] + f" {line}")

    def next_text(self, kind: str) -> str:
        self.counter += 1
        return PROMPT_TEXT[kind].format(n=self.counter)


class Fleet:
    """``count`` instances on one PostgreSQL store behind HAProxy; ``kill``/``restart``
    one by index (same port, same state dir). ``kill_clock`` moves on as a kill begins
    and as it ends: a request that saw it move, or odd, was out during a kill."""

    def __init__(self, tmp: Path, url: str, count: int, policy: str, affinity: Any) -> None:
        self.tmp, self.affinity = tmp, affinity
        self.workspace = tmp / "ws"   # one workspace folder, as a team host has
        self.workspace.mkdir(exist_ok=True)
        self.children = [ServeProcess(
            self.workspace, "--port", str(free_port()), "--store", url,
            *stores.lease_flags(), "--session-lease-ttl-ms", str(TTL_MS),
            "--session-lease-renew-ms", str(RENEW_MS), "--session-on-restart", policy,
            "--max-pending-prompts-per-session", str(LIMIT),
            state_dir=f"state-{n}") for n in range(count)]
        self.down: set[int] = set()
        self.kill_clock = 0
        self.lb: HAProxy | None = None

    @property
    def base_url(self) -> str:
        assert self.lb is not None
        return self.lb.base_url

    async def start(self) -> None:
        async with anyio.create_task_group() as tg:   # in parallel: each takes a second
            for child in self.children:
                tg.start_soon(anyio.to_thread.run_sync, child.start)
        self.lb = HAProxy(self.tmp, [c.base_url for c in self.children],
                          affinity=self.affinity)
        if os.environ.get("ACP_FLEET_CRASH_VERBOSE"):   # every request in lb.log_path
            text = self.lb.config_path.read_text()
            text = text.replace("global\n", "global\n    log stderr format raw local0 info\n")
            text = text.replace("defaults\n", "defaults\n    log global\n    option httplog\n")
            self.lb.config_path.write_text(text)
        await anyio.to_thread.run_sync(self.lb.start)
        await self.wait_up()

    async def wait_up(self) -> None:
        """Every instance answers through the balancer (hashing sends one path to one
        instance: there, each answers directly and the balancer answers)."""
        assert self.lb is not None
        if self.affinity != "hash":
            await anyio.to_thread.run_sync(self.lb.wait_up, len(self.children))
            return
        await anyio.to_thread.run_sync(self.lb.wait_up, 1)
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            for child in self.children:
                assert (await client.get(child.base_url + "/health")).status_code == 200

    async def kill(self, index: int) -> None:
        self.kill_clock += 1
        self.down.add(index)
        await anyio.to_thread.run_sync(self.children[index].kill)
        self.kill_clock += 1

    async def restart(self, index: int) -> None:
        await anyio.to_thread.run_sync(self.children[index].start)
        self.down.discard(index)

    async def all_up(self) -> None:
        for index in sorted(self.down):
            await self.restart(index)
        await self.wait_up()

    def stop(self) -> None:
        if self.lb is not None:
            self.lb.stop()
        for child in self.children:
            child.kill()


class Workload(ReaderGroup):
    """The seeded operations through the balancer; the readers live in its task group."""

    def __init__(self, model: Model, fleet: Fleet, rng: random.Random) -> None:
        self.model, self.fleet, self.rng = model, fleet, rng
        self.client = self._client(httpx.Timeout(WAIT_S))
        self.streams = self._client(httpx.Timeout(WAIT_S, read=None))

    def _client(self, timeout: httpx.Timeout) -> httpx.AsyncClient:
        fleet = self.fleet

        async def sent(request: httpx.Request) -> None:
            request.extensions["kill_clock"] = fleet.kill_clock

        async def record(response: httpx.Response) -> None:
            await response.aread() if response.status_code != 200 else None
            html = response.headers.get("content-type", "").startswith("text/html")
            self.model.answers.append(Answer(
                response.request.method, response.request.url.path, response.status_code,
                response.text[:300] if response.status_code != 200 else "", html,
                _during_kill(response.request.extensions["kill_clock"], fleet.kill_clock)))

        return httpx.AsyncClient(base_url=fleet.base_url, timeout=timeout,
                                 event_hooks={"request": [sent], "response": [record]})

    # -- requests ---------------------------------------------------------------------------
    async def send(self, method: str, path: str, body: Any = None,
                   attempt: Callable[[], None] | None = None) -> httpx.Response | None:
        """One write through the balancer, sent again while the fleet answers that the
        session is moving; ``None`` when no answer came (its outcome unknown).
        ``attempt`` is called as each attempt goes out."""
        with anyio.fail_after(WAIT_S):
            while True:
                if attempt is not None:
                    attempt()
                try:
                    response = await self.client.request(method, path, json=body)
                except httpx.TransportError:
                    return None
                if response.headers.get("content-type", "").startswith("text/html"):
                    return None   # HAProxy answered for an instance killed under it
                if response.status_code == 503 and _code(response) in LOST:
                    return None   # the owner took it and died: done or not, unknown
                if response.status_code != 503 or _code(response) not in MOVING:
                    return response
                await anyio.sleep(0.1)   # a client's back-off (Retry-After, shortened)

    # -- readers ----------------------------------------------------------------------------
    def add_reader(self, session: Session, start: int) -> Reader:
        count = sum(1 for r in self.model.readers if r.session_id == session.session_id)
        reader = Reader(session.session_id, f"{session.session_id[:8]}#{count}",
                        session.epoch, start)
        self.model.readers.append(reader)
        assert self._tg is not None
        self._tg.start_soon(reader.run, self.streams)
        return reader

    # -- operations -------------------------------------------------------------------------
    async def run(self, ops: int, kills: list[tuple[int, int, int]]) -> None:
        """``ops`` operations; each kill ``(at, victim, back)``: ``kill -9`` of instance
        ``victim`` before operation ``at`` (maybe with a prompt in flight), started
        again before operation ``back`` (or at the drain)."""
        for n in range(ops):
            for at, victim, back in kills:
                if n == back and victim in self.fleet.down:
                    self.model.note(f"restart {victim}")
                    await self.fleet.restart(victim)
                if n == at:
                    await self._kill(victim)
            name, operation = self._choose()
            self.model.note(name)
            await operation()

    async def _kill(self, victim: int) -> None:
        flight = self.rng.random() < 0.5 and bool(self.model.sessions)
        if flight:
            session = self.rng.choice(list(self.model.sessions.values()))
            kind = self.rng.choice(("short", "long"))
            assert self._tg is not None
            self._tg.start_soon(self.prompt, session, kind)
            await anyio.sleep(self.rng.choice((0, 0.001, 0.01, 0.05)))
        self.model.note(f"kill -9 instance {victim}{' (a prompt in flight)' * flight}")
        await self.fleet.kill(victim)

    def _choose(self) -> tuple[str, Callable[[], Any]]:
        sessions = list(self.model.sessions.values())
        choices: list[tuple[str, Callable[[], Any]]] = []
        if len(sessions) < 4:
            choices += [("create", self.create)] * 2
        for s in sessions:
            short = s.session_id[:8]
            for kind in ("short", "short", "long", "long", "perm"):
                choices.append((f"prompt {kind} {short}", lambda s=s, k=kind: self.prompt(s, k)))
            choices.append((f"cancel {short}", lambda s=s: self.cancel(s)))
            choices.append((f"load {short}", lambda s=s: self.load(s)))
            choices.append((f"reader {short}", lambda s=s: self.reader(s)))
        for r in self.model.readers:
            if not r.stopped:
                choices.append((f"resume {r.name}", lambda r=r: self.resume(r)))
        choices.append(("list", self.listing))
        return self.rng.choice(choices)

    async def create(self) -> None:
        response = await self.send("POST", "/session", {"sessionScope": "thread"})
        if response is None:
            self.model.unknown_creates += 1
            self.model.note("  (no answer)")
            return
        assert response.status_code == 200, f"create: {response.status_code} {response.text}"
        body = response.json()
        session = Session(body["sessionId"], body["eventEpoch"])
        self.model.sessions[session.session_id] = session
        self.model.note(f"  -> {session.session_id}")
        self.add_reader(session, 0)

    async def prompt(self, session: Session, kind: str) -> None:
        text = self.model.next_text(kind)
        prompt = Prompt(session.session_id, kind, text)
        session.prompts.append(prompt)
        own_id = f"w-{self.model.counter}"   # the model's: unique, as the text

        def attempt() -> None:
            if not prompt.maybe_taken:
                prompt.sent = self.model.tick()

        response = None
        with anyio.move_on_after(WAIT_S):
            while (response := await self.send("POST", f"/session/{session.session_id}/prompt",
                                               prompt_body(text, own_id), attempt)) is None:
                prompt.maybe_taken = True   # sent again under its id: admitted once
                self.model.note(f"  ({text}: no answer, sent again)")
                await anyio.sleep(0.1)
        if response is None:
            self.model.note(f"  ({text}: no answer)")
            return
        if response.status_code == 503 and _code(response) in REFUSED:
            prompt.accepted = False
            assert response.headers.get("retry-after") == "5", response.headers
            return
        assert response.status_code in (200, 202), \
            f"prompt: {response.status_code} {response.text}"
        body = response.json()
        assert body["promptId"] == own_id, (body, own_id)
        if response.status_code == 202:
            assert body["eventEpoch"] == session.epoch, (body, session.epoch)
        else:   # ended before the answer came: sent again after a lost one
            assert prompt.maybe_taken and response.headers["idempotent-replayed"] == "true"
        prompt.accepted, prompt.prompt_id = True, own_id
        prompt.answered = self.model.tick()

    async def cancel(self, session: Session) -> None:
        response = await self.send("POST", f"/session/{session.session_id}/cancel")
        if response is not None:
            assert response.status_code == 204, f"cancel: {response.status_code} {response.text}"

    async def load(self, session: Session) -> None:
        response = await self.send("POST", f"/session/{session.session_id}/load", {})
        if response is None:
            return
        assert response.status_code == 200, f"load: {response.status_code} {response.text}"
        body = response.json()
        assert body["eventEpoch"] == session.epoch, (body["eventEpoch"], session.epoch)
        ids = [t["promptId"] for t in body["promptTerminals"]]
        assert len(ids) == len(set(ids)), f"a prompt with two terminals: {ids}"

    async def listing(self) -> None:
        response = await self.send("GET", f"/workspace/{workspace_of(self.fleet)}/sessions")
        if response is not None:
            assert response.status_code == 200, f"list: {response.status_code} {response.text}"

    async def reader(self, session: Session) -> None:
        start = 0
        if self.rng.random() < 0.5:   # from where the session is now
            response = await self.send("GET", f"/session/{session.session_id}/status")
            if response is not None and response.status_code == 200:
                start = int(response.json()["lastEventId"])
        self.add_reader(session, start)
        self.model.note(f"  (from {start})")

    async def resume(self, reader: Reader) -> None:
        await reader.wait_for(lambda: reader.connections > 0, "connected")
        reader.drop()

    # -- the end ----------------------------------------------------------------------------
    async def drain(self) -> None:
        """Every instance up again, then every session's queue run to its end: a prompt
        holding its session (a permission nobody answers) is cancelled."""
        self.model.note("drain: every instance up")
        await self.fleet.all_up()
        with anyio.fail_after(WAIT_S * 2):
            for session in self.model.sessions.values():
                while True:
                    response = await self.send("GET", f"/session/{session.session_id}/status")
                    assert response is not None and response.status_code == 200, response
                    status = response.json()
                    if status["pendingPrompts"] == 0 and status["activePromptId"] is None:
                        break
                    active = next((p for p in session.prompts
                                   if p.prompt_id == status["activePromptId"]), None)
                    if active is None or active.kind == "perm":
                        await self.cancel(session)
                    await anyio.sleep(0.05)   # polled: nothing tells a client otherwise


def _during_kill(sent: int, answered: int) -> bool:
    return sent != answered or sent % 2 == 1


def workspace_of(fleet: Fleet) -> str:
    return workspace_id(str(fleet.workspace))


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None
