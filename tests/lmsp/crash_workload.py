"""The seeded workload and its model for the LMSP crash-consistency test
(``test_crash_consistency.py``)::

    model = Model()
    async with Workload(model, child.base_url, random.Random(seed)) as work:
        await work.run(8)                   # 8 operations, each brought to a stable state
        await work.start_in_flight()        # maybe one more request, not waited for
        child.kill()

Contracts: the server runs ``--max-running-tasks SLOTS`` and the reference agent; a
*short* task (``/chunks 3``) ends ``succeeded`` soon after it is claimed, a *long* one
(``/sleep 60s``) runs until cancelled. After every operation the workload waits until
each task is in the state the model predicts (claims are FIFO: the oldest queued tasks
fill the free slots; a claimed short one has ended, a claimed long one is ``running``),
so at the kill the model knows what was settled, running and queued. Operations: task
creates (``POST /tasks``, ``on_restart`` ``fail`` or ``retry``; background responses,
``POST /responses``; half of them with an ``Idempotency-Key``), replays of a keyed
create, cancels (by task, or by response), a cancel of a finished task (409), deletes
of finished responses (a delete of an unfinished one: 409), listings and retrievals
checked against the model, and SSE subscribers of a task's events (``Reader``: every
frame with its id, the cursor of docs/lmsp.md). Every answer is recorded
(``Model.answers``) for the no-5xx check; ``Model.log`` is the operation log a failure
prints.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import httpx

from tests.store.crash_workload import Answer   # one answer seen: method, path, status

SLOTS = 2          # --max-running-tasks
WAIT_S = 30        # any single wait (a PostgreSQL lease is 3 s in the tests)
TERMINAL = {"succeeded", "failed", "cancelled"}
API = "/lmsp/v1"


@dataclass
class Task:
    task_id: str
    response_id: str
    kind: str                  # short | long
    policy: str                # fail | retry
    via: str                   # task | response (a background response)
    body: dict[str, Any]
    key: str | None
    state: str = "queued"      # the model's: queued | running | succeeded | cancelled | deleted
    final: dict[str, Any] | None = None   # the task object once finished
    # queued at the kill, but a cancel in flight freed a slot: it may have been claimed
    # before the kill (so the restart rule applies to it) or not
    maybe_claimed: bool = False
    running_at_kill: bool = False
    # the end a listing showed while a restarted server recovered (killed again later):
    # it must keep it
    ended_seen: str | None = None


@dataclass
class Reader:
    """One subscriber of a task's events, across its connections: ``seen`` holds
    ``(id, event, data)`` of every frame, ``ended`` is set when a connection ends."""

    task_id: str
    name: str
    seen: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    ended: bool = False
    statuses: list[int] = field(default_factory=list)   # of each connection
    by_query: bool | None = None   # resumed by ``starting_after`` (else ``Last-Event-ID``);
                                   # None: the checker alternates
    response_id: str | None = None   # set: reads ``GET /responses/{id}?stream=true``

    def last_id(self) -> int | None:
        return self.seen[-1][0] if self.seen else None


@dataclass
class InFlight:
    """The request sent just before the kill; its answer may or may not have come."""

    op: str                          # create | burst | cancel | delete
    task: Task | None = None         # cancel, delete: the task it is about
    # burst: several creates at once (one group commit, or a few), each an InFlight
    creates: list[InFlight] = field(default_factory=list)
    key: str | None = None           # create: its Idempotency-Key, if any
    via: str = "task"
    body: dict[str, Any] | None = None
    status: int | None = None        # set if the answer arrived
    answer: Any = None

    def answered(self, *statuses: int) -> bool:
        return self.status in statuses


@dataclass
class Model:
    tasks: dict[str, Task] = field(default_factory=dict)   # creation order
    readers: list[Reader] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    in_flight: InFlight | None = None
    counter: int = 0
    kills: int = 0                 # SIGKILLs so far (a second one during recovery)

    def in_state(self, *states: str) -> list[Task]:
        return [t for t in self.tasks.values() if t.state in states]

    def settle(self) -> list[Task]:
        """FIFO claims into the free slots; the tasks newly claimed, oldest first."""
        claimed = []
        while len(self.in_state("running")) < SLOTS and self.in_state("queued"):
            task = self.in_state("queued")[0]
            task.state = "running"
            claimed.append(task)
        return claimed


def task_body(text: str, policy: str) -> dict[str, Any]:
    return {"type": "response", "on_restart": policy,
            "input": {"model": "reference", "input": text}}


def response_body(text: str) -> dict[str, Any]:
    return {"model": "reference", "input": text, "background": True}


class Workload:
    def __init__(self, model: Model, base_url: str, rng: random.Random,
                 on_answer: Callable[[], None] | None = None) -> None:
        """``on_answer`` is called as each answer's head arrives (a kill after N answers)."""
        self.model, self.rng, self.on_answer = model, rng, on_answer
        self.client = httpx.AsyncClient(base_url=base_url, timeout=WAIT_S,
                                        event_hooks={"response": [self._record]})
        self._tg: anyio.abc.TaskGroup | None = None

    async def _record(self, response: httpx.Response) -> None:
        self.model.answers.append(Answer(response.request.method,
                                         response.request.url.path, response.status_code))
        if self.on_answer is not None:
            self.on_answer()

    async def __aenter__(self) -> Workload:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(et, exc, tb)
        await self.client.aclose()
        return None

    # -- reading -----------------------------------------------------------------------
    async def get(self, task_id: str) -> dict[str, Any]:
        answer = await self.client.get(f"{API}/tasks/{task_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    async def until(self, task_id: str, statuses: set[str], why: str) -> dict[str, Any]:
        """Polls the task (the store has no notice a client could wait on otherwise)."""
        with anyio.fail_after(WAIT_S):
            while True:
                task = await self.get(task_id)
                if task["status"] in statuses:
                    return task
                await anyio.sleep(0.02)
        raise AssertionError(why)   # pragma: no cover - fail_after raised

    async def listed(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        params: dict[str, Any] = {"limit": 100}
        while True:
            answer = await self.client.get(f"{API}/tasks", params=params)
            assert answer.status_code == 200, answer.text
            page = answer.json()
            found.update({t["id"]: t for t in page["data"]})
            if not page["has_more"]:
                return found
            params["after"] = page["last_id"]

    async def full_read(self, task_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        """Every event of a finished task, from 0."""
        answer = await self.client.get(f"{API}/tasks/{task_id}/events")
        assert answer.status_code == 200, answer.text
        return _frames(answer.text)

    def subscribe(self, task_id: str, name: str, reader: Reader | None = None,
                  cursor: int | None = None, by_query: bool = False) -> Reader:
        """A reader streaming the task's events in the background (from ``cursor``)."""
        if reader is None:
            reader = Reader(task_id, name)
            self.model.readers.append(reader)
        reader.ended = False
        assert self._tg is not None
        self._tg.start_soon(self._read, reader, cursor, by_query)
        return reader

    async def _read(self, reader: Reader, cursor: int | None, by_query: bool) -> None:
        headers, params = {}, {}
        path = f"{API}/tasks/{reader.task_id}/events"
        if reader.response_id is not None:   # the SDK's retrieve(stream=True, ...)
            path, params = f"{API}/responses/{reader.response_id}", {"stream": "true"}
        if cursor is not None and by_query:
            params["starting_after"] = str(cursor)
        elif cursor is not None:
            headers["Last-Event-ID"] = str(cursor)
        try:
            async with self.client.stream("GET", path, headers=headers, params=params,
                                          timeout=httpx.Timeout(WAIT_S, read=None)) as stream:
                reader.statuses.append(stream.status_code)
                frame: dict[str, str] = {}
                async for line in stream.aiter_lines():
                    if not line:
                        if "data" in frame:
                            reader.seen.append((int(frame["id"]), frame["event"],
                                                json.loads(frame["data"])))
                        frame = {}
                    elif not line.startswith(":") and ":" in line:
                        name, _, value = line.partition(":")
                        frame[name] = value[1:] if value.startswith(" ") else value
        except httpx.TransportError:
            pass   # the kill
        finally:
            reader.ended = True

    async def reader_at(self, reader: Reader, check: Any, why: str) -> None:
        """Waits until ``check(reader.seen)`` (frames arrive in the background)."""
        with anyio.fail_after(WAIT_S):
            while not check(reader.seen):
                if reader.ended:
                    raise AssertionError(f"{reader.name} ended before {why}: {reader.seen}")
                await anyio.sleep(0.01)

    # -- the workload -------------------------------------------------------------------
    async def run(self, count: int) -> None:
        for _ in range(count):
            await self.step()

    async def step(self) -> None:
        m, rng = self.model, self.rng
        live = m.in_state("queued", "running")
        done = m.in_state("succeeded", "cancelled")
        keyed = [t for t in m.tasks.values() if t.key and t.state != "deleted"]
        options = ["create"] * 4
        options += ["list", "subscribe", "subscribe", "retrieve"] * bool(m.tasks)
        options += ["cancel"] * 2 * bool(live) + ["delete", "cancel_done"] * bool(done)
        options += ["replay"] * bool(keyed)
        op = rng.choice(options)
        if op == "create":
            await self.create(rng.choice(("short", "short", "long")))
        elif op == "cancel":
            await self.cancel(rng.choice(live))
        elif op == "cancel_done":
            task = rng.choice(done)
            answer = await self.client.post(f"{API}/tasks/{task.task_id}/cancel")
            m.log.append(f"cancel finished {task.task_id} -> {answer.status_code}")
            expect = 200 if task.state == "cancelled" else 409
            assert answer.status_code == expect, answer.text
        elif op == "delete":
            await self.delete(rng.choice(done))
        elif op == "replay":
            task = rng.choice(keyed)
            await self.replay(task)
        elif op == "list":
            listed = await self.listed()
            m.log.append("list")
            for task in m.tasks.values():
                if task.state == "deleted":
                    assert task.task_id not in listed, task
                else:
                    assert listed[task.task_id]["status"] == task.state, (
                        task, listed[task.task_id])
        elif op == "retrieve":
            task = rng.choice(list(m.tasks.values()))
            await self.retrieve(task)
        else:
            task = rng.choice([t for t in m.tasks.values() if t.state != "deleted"]
                              or [None]) if m.tasks else None
            if task is not None:
                reader = self.subscribe(task.task_id, f"reader{len(m.readers)}")
                m.log.append(f"subscribe {reader.name} to {task.task_id}")
                # it has the head at least before the next operation
                await self.reader_at(reader, lambda seen: seen, "its first frame")

    def _text(self, kind: str) -> str:
        self.model.counter += 1
        n = self.model.counter
        return f"/chunks 3 short {n}" if kind == "short" else f"/sleep 60s long {n}"

    def create_request(self, kind: str, via: str, policy: str, key: str | None
                       ) -> tuple[str, dict[str, Any], dict[str, str]]:
        text = self._text(kind)
        headers = {"Idempotency-Key": key} if key else {}
        if via == "response":
            return f"{API}/responses", response_body(text), headers
        return f"{API}/tasks", task_body(text, policy), headers

    async def create(self, kind: str) -> Task:
        m, rng = self.model, self.rng
        via = rng.choice(("task", "task", "response"))
        policy = "fail" if via == "response" else rng.choice(("fail", "retry"))
        key = f"key-{m.counter}-{rng.randrange(10**6)}" if rng.random() < 0.5 else None
        path, body, headers = self.create_request(kind, via, policy, key)
        answer = await self.client.post(path, json=body, headers=headers)
        assert answer.status_code == (200 if via == "response" else 202), answer.text
        task = await self.adopt(answer.json(), kind, via, policy, body, key)
        m.log.append(f"create {kind} {via} {policy} key={key} -> {task.task_id}")
        await self.settle()
        return task

    async def adopt(self, answered: dict[str, Any], kind: str, via: str, policy: str,
                    body: dict[str, Any], key: str | None) -> Task:
        """A created task into the model (a response's task found by its response id)."""
        if via == "response":
            listed = await self.listed()
            task_id = next(t["id"] for t in listed.values() if t["response_id"] == answered["id"])
            response_id = answered["id"]
        else:
            task_id, response_id = answered["id"], answered["response_id"]
        task = Task(task_id, response_id, kind, policy, via, body, key)
        self.model.tasks[task_id] = task
        return task

    async def settle(self) -> None:
        """Waits for the state the model predicts: claimed short tasks ended, claimed
        long ones running, queued ones queued."""
        while True:
            claimed = self.model.settle()
            if not claimed:
                break
            for task in claimed:
                if task.kind == "short":
                    task.final = await self.until(task.task_id, TERMINAL, "a short task ended")
                    assert task.final["status"] == "succeeded", task.final
                    task.state = "succeeded"
                else:
                    await self.until(task.task_id, {"running"}, "a long task running")
        for task in self.model.in_state("queued"):
            assert (await self.get(task.task_id))["status"] == "queued", task

    async def cancel(self, task: Task) -> None:
        by_response = task.via == "response" and self.rng.random() < 0.5
        if by_response:
            answer = await self.client.post(f"{API}/responses/{task.response_id}/cancel")
            assert answer.status_code == 200, answer.text
        else:
            answer = await self.client.post(f"{API}/tasks/{task.task_id}/cancel")
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] in ("cancelling", "cancelled"), answer.text
        self.model.log.append(f"cancel {task.state} {task.task_id}"
                              f"{' by response' if by_response else ''}")
        task.final = await self.until(task.task_id, TERMINAL, "the cancel")
        assert task.final["status"] == "cancelled", task.final
        task.state = "cancelled"
        await self.settle()

    async def delete(self, task: Task) -> None:
        answer = await self.client.delete(f"{API}/responses/{task.response_id}")
        self.model.log.append(f"delete {task.task_id} -> {answer.status_code}")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"id": task.response_id, "object": "response.deleted",
                                 "deleted": True}
        task.state = "deleted"

    async def replay(self, task: Task) -> httpx.Response:
        path = f"{API}/responses" if task.via == "response" else f"{API}/tasks"
        assert task.key is not None
        answer = await self.client.post(path, json=task.body,
                                        headers={"Idempotency-Key": task.key})
        self.model.log.append(f"replay {task.key} -> {answer.status_code}")
        assert answer.status_code == (200 if task.via == "response" else 202), answer.text
        assert answer.headers.get("idempotent-replayed") == "true", answer.headers
        got = answer.json()["id"]
        assert got == (task.response_id if task.via == "response" else task.task_id), (
            f"replay of {task.key} answered {got}, not {task.task_id}")
        return answer

    async def retrieve(self, task: Task) -> None:
        self.model.log.append(f"retrieve {task.task_id}")
        answer = await self.client.get(f"{API}/responses/{task.response_id}")
        if task.state == "deleted":
            assert answer.status_code == 404, answer.text
            return
        assert answer.status_code == 200, answer.text
        want = {"queued": "queued", "running": "in_progress", "succeeded": "completed",
                "cancelled": "cancelled"}[task.state]
        assert answer.json()["status"] == want, (task, answer.json())
        got = await self.get(task.task_id)
        assert got["status"] == task.state, (task, got)
        if task.final is not None:
            assert got == task.final, (got, task.final)

    async def follow_mid_stream(self, ensure: bool) -> None:
        """Three subscribers of a running long task, each having read its stream so far
        (to its ``response.in_progress``; the stream open and silent), to be resumed
        after the kill by ``Last-Event-ID``, by ``starting_after``, and as its response
        by ``starting_after``. None without a running long task, unless ``ensure``:
        then one is created first."""
        running = [t for t in self.model.in_state("running") if t.kind == "long"]
        if not running and ensure:
            running = [await self.create("long")]
        if not running:
            return
        task = running[0]
        for by_query, door in ((False, "task"), (True, "task"), (True, "response")):
            reader = Reader(task.task_id, f"mid-stream{len(self.model.readers)}",
                            by_query=by_query,
                            response_id=task.response_id if door == "response" else None)
            self.model.readers.append(reader)
            self.subscribe(task.task_id, reader.name, reader)
            self.model.log.append(f"subscribe {reader.name} to running {task.task_id} "
                                  f"({door}, resumed by "
                                  f"{'starting_after' if by_query else 'Last-Event-ID'})")
            await self.reader_at(reader, lambda seen: any(
                event == "response.in_progress" for _, event, _ in seen), "its running head")

    # -- the request in flight at the kill ------------------------------------------------
    async def start_in_flight(self) -> InFlight | None:
        """Maybe one more request (the seed's choice), not waited for."""
        m, rng = self.model, self.rng
        if rng.random() < 0.5:
            return None
        live = m.in_state("queued", "running")
        done = m.in_state("succeeded", "cancelled")
        op = rng.choice(["create", "create", "burst"] + ["cancel"] * bool(live)
                        + ["delete"] * bool(done))
        flight = InFlight(op)
        requests: list[tuple[InFlight, str, str, dict[str, str]]] = []
        if op in ("create", "burst"):
            flight.creates = [flight] if op == "create" else [
                InFlight("create") for _ in range(rng.randint(2, 6))]
            for create in flight.creates:
                create.via = rng.choice(("task", "response"))
                create.key = f"flight-{rng.randrange(10**6)}" if rng.random() < 0.5 else None
                path, create.body, headers = self.create_request("short", create.via,
                                                                 "fail", create.key)
                requests.append((create, "POST", path, headers))
        elif op == "cancel":   # a response's cancel waits for its end; a task's does not
            flight.task = rng.choice(live)
            flight.via = rng.choice(("task", flight.task.via))
            path = (f"{API}/responses/{flight.task.response_id}/cancel"
                    if flight.via == "response" else f"{API}/tasks/{flight.task.task_id}/cancel")
            requests.append((flight, "POST", path, {}))
        else:
            flight.task, flight.via = rng.choice(done), "response"
            requests.append((flight, "DELETE", f"{API}/responses/{flight.task.response_id}", {}))
        m.in_flight = flight
        m.log.append(f"in flight: {op}{'' if flight.creates else ' by ' + flight.via} "
                     f"{flight.task.task_id if flight.task else ''}"
                     f"{' key=' + flight.key if flight.key else ''}"
                     f"{f' ({len(flight.creates)} creates)' if op == 'burst' else ''}")

        async def send(one: InFlight, method: str, path: str, headers: dict[str, str]) -> None:
            try:
                answer = await self.client.request(method, path, json=one.body,
                                                   headers=headers)
                one.status = answer.status_code
                one.answer = answer.json() if answer.content else None
            except httpx.TransportError:
                pass

        assert self._tg is not None
        for request in requests:
            self._tg.start_soon(send, *request)
        # When the kill comes, the seed's choice: at once (the request may not have left),
        # once answered (the answer must hold; a burst: its first answer), or a few
        # milliseconds on (mid-way, perhaps). Either outcome is checked whole; no
        # assertion depends on which.
        when = rng.choice(("now", "answered", "soon"))
        m.log.append(f"  (killed {when})")
        if when == "answered":
            with anyio.fail_after(WAIT_S):
                while all(one.status is None for one, *_ in requests):
                    await anyio.sleep(0.005)
        else:
            await anyio.sleep(0 if when == "now" else rng.uniform(0.001, 0.03))
        return flight


def _frames(text: str) -> list[tuple[int, str, dict[str, Any]]]:
    frames, frame = [], {}
    for line in text.split("\n"):
        if not line:
            if "data" in frame:
                frames.append((int(frame["id"]), frame["event"], json.loads(frame["data"])))
            frame = {}
        elif not line.startswith(":") and ":" in line:
            name, _, value = line.partition(":")
            frame[name] = value[1:] if value.startswith(" ") else value
    return frames
