"""The ``lmsp`` suite: LMSP v1 async tasks (§7) and their event streams (§6.4).

    await run_lmsp(ctx)     # records every ``lmsp.*`` check in ctx

Tasks use ``options.model`` or the first model of ``/lmsp/v1/capabilities``; a quick
task carries ``options.quick_prompt``, a long one ``ctx.hold_prompt``. Every task the
runner leaves unfinished is cancelled afterwards.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx

from acp_server.conformance.context import (CheckFailed, Context, Frame, Skip, Stream, describe,
                                            json_of)

BASE = "/lmsp/v1"
TERMINAL = {"succeeded", "failed", "cancelled"}
TERMINAL_EVENTS = {"response.completed", "response.incomplete", "response.failed",
                   "response.cancelled"}
NEXT = {"queued": {"loading", "running", "cancelled", "failed"},
        "loading": {"running", "cancelling", "failed"},
        "running": {"succeeded", "failed", "cancelling"},
        "cancelling": {"cancelled"},
        "succeeded": set(), "failed": set(), "cancelled": set()}
TASK_FIELDS = ("id", "object", "type", "status", "created_at", "updated_at", "response_id",
               "on_restart", "response", "error")


def reachable(source: str, target: str) -> bool:
    """``target`` follows ``source`` through zero or more §7.2 transitions."""
    seen, todo = {source}, [source]
    while todo:
        for state in NEXT.get(todo.pop(), ()):
            if state not in seen:
                seen.add(state)
                todo.append(state)
    return target in seen


def model(ctx: Context) -> str:
    if ctx.options.model:
        return ctx.options.model
    if ctx.lmsp_capabilities is None:
        raise CheckFailed("no LMSP here: GET /lmsp/v1/capabilities did not answer 200 "
                          "with a JSON object")
    models = ctx.lmsp_capabilities.get("models") or []
    if not models:
        raise Skip("no model advertised by /lmsp/v1/capabilities: pass --model")
    first = models[0]
    return str(first.get("id") if isinstance(first, dict) else first)


def envelope(ctx: Context, text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "response", "input": {"model": model(ctx), "input": text}, **extra}


async def create(ctx: Context, text: str, *, headers: dict[str, str] | None = None,
                 **extra: Any) -> tuple[dict[str, Any], httpx.Response]:
    response = await ctx.request("POST", f"{BASE}/tasks", json=envelope(ctx, text, **extra),
                                 headers=headers)
    if response.status_code != 202:
        raise CheckFailed(f"task not created: {describe(response)}")
    task = response.json()
    task_id = task["id"]
    ctx.later(lambda: ctx.request("POST", f"{BASE}/tasks/{task_id}/cancel"))
    return task, response


async def get(ctx: Context, task_id: str) -> dict[str, Any]:
    response = await ctx.request("GET", f"{BASE}/tasks/{task_id}")
    if response.status_code != 200:
        raise CheckFailed(f"task not readable: {describe(response)}")
    return response.json()  # type: ignore[no-any-return]


def events(ctx: Context, task_id: str, *, headers: dict[str, str] | None = None,
           params: dict[str, str] | None = None, expect: int | None = 200) -> Any:
    return ctx.stream("GET", f"{BASE}/tasks/{task_id}/events", headers=headers, params=params,
                      expect=expect)


async def all_events(ctx: Context, task_id: str, **kwargs: Any) -> list[Frame]:
    """Every frame until the server closes the stream (bounded by the settle bound)."""
    async with events(ctx, task_id, **kwargs) as stream:
        await stream.wait_for_end(ctx.options.settle_timeout_s)
        return list(stream.frames)


def seqs(frames: list[Frame]) -> list[Any]:
    return [f.data.get("sequence_number") if isinstance(f.data, dict) else None for f in frames]


async def watch_statuses(ctx: Context, task_id: str, first: str) -> list[str]:
    """The distinct statuses polled until a terminal one (settle bound)."""
    seen = [first]
    with anyio.fail_after(ctx.options.settle_timeout_s):
        while seen[-1] not in TERMINAL:
            await anyio.sleep(ctx.options.poll_interval_s)
            status = (await get(ctx, task_id))["status"]
            if status != seen[-1]:
                seen.append(status)
    return seen


async def check_lifecycle(ctx: Context) -> None:
    """A quick task from creation to its end, then what a finished task answers."""
    ids = ("lmsp.create.shape", "lmsp.create.readable", "lmsp.state.transitions",
           "lmsp.events.created-first", "lmsp.events.contiguous", "lmsp.events.resume-header",
           "lmsp.events.resume-query", "lmsp.events.finished-204", "lmsp.events.bad-cursor",
           "lmsp.cancel.finished")
    async with ctx.checking(*ids):
        task, response = await create(ctx, ctx.options.quick_prompt)
        missing = [k for k in TASK_FIELDS if k not in task]
        with_events = bool((ctx.lmsp_capabilities or {}).get("capabilities", {})
                           .get("event_resume"))
        ok = (not missing and task["object"] == "task" and task["type"] == "response"
              and task["status"] in NEXT and task["on_restart"] == "fail"
              and isinstance(task["created_at"], int) and isinstance(task["updated_at"], int)
              and task["error"] is None and (task["response"] is None
                                             or task["status"] == "succeeded")
              and (not with_events or isinstance(task.get("events_url"), str)))
        ctx.expect(ids[0], ok, f"missing {missing}; {describe(response)}")
        readable = await ctx.request("GET", f"{BASE}/tasks/{task['id']}")
        ctx.expect(ids[1], readable.status_code == 200 and json_of(readable).get("id") == task["id"],
                   describe(readable))
        statuses = await watch_statuses(ctx, task["id"], task["status"])
        bad = [(a, b) for a, b in zip(statuses, statuses[1:]) if not reachable(a, b)]
        ctx.expect(ids[2], task["status"] == "queued" and not bad,
                   f"statuses observed: {statuses}; not allowed by §7.2: {bad}")
        if not with_events:
            raise Skip("event_resume is false: no event stream")
        await _check_events(ctx, task["id"], ids)
        cancel = await ctx.request("POST", f"{BASE}/tasks/{task['id']}/cancel")
        finished = statuses[-1]
        body = json_of(cancel)
        if finished in ("succeeded", "failed"):
            ctx.expect(ids[9], cancel.status_code == 409
                       and body.get("code") == "task_not_cancelable", describe(cancel))
        else:
            ctx.skipped(ids[9], f"the quick task ended {finished}")


async def _check_events(ctx: Context, task_id: str, ids: tuple[str, ...]) -> None:
    frames = await all_events(ctx, task_id)
    numbers = seqs(frames)
    first = frames[0] if frames else None
    ctx.expect(ids[3], first is not None and first.event == "response.created"
               and numbers[0] == 0, f"first frame: {first.event if first else None} "
                                    f"{str(first.data)[:200] if first else ''}")
    terminal = [i for i, f in enumerate(frames) if f.event in TERMINAL_EVENTS]
    ok = numbers == list(range(len(frames))) and terminal == [len(frames) - 1] \
        and all(f.id == str(n) for f, n in zip(frames, numbers))
    ctx.expect(ids[4], ok, f"sequence numbers {numbers}, SSE ids {[f.id for f in frames]}, "
                           f"terminal events at {terminal} of {len(frames)}")
    last = len(frames) - 1
    cursor = min(1, last)
    tail = numbers[cursor + 1:]
    async with ctx.checking(ids[5]):
        got = seqs(await all_events(ctx, task_id, headers={"Last-Event-ID": str(cursor)}))
        ctx.expect(ids[5], got == tail, f"Last-Event-ID: {cursor} gave {got}, expected {tail}")
    async with ctx.checking(ids[6]):
        got = seqs(await all_events(ctx, task_id, params={"starting_after": str(cursor)}))
        ctx.expect(ids[6], got == tail, f"?starting_after={cursor} gave {got}, expected {tail}")
    async with ctx.checking(ids[7]):
        response = await ctx.request("GET", f"{BASE}/tasks/{task_id}/events",
                                     headers={"Last-Event-ID": str(last),
                                              "Accept": "text/event-stream"})
        ctx.expect(ids[7], response.status_code == 204, describe(response))
    async with ctx.checking(ids[8]):
        seen = []
        for bad in ("abc", "-1"):
            response = await ctx.request("GET", f"{BASE}/tasks/{task_id}/events",
                                         headers={"Last-Event-ID": bad,
                                                  "Accept": "text/event-stream"})
            body = json_of(response)
            if response.status_code != 400 or body.get("code") != "invalid_request":
                seen.append(describe(response))
        ctx.expect(ids[8], not seen, "; ".join(seen))


async def _wait_running(ctx: Context, stream: Stream) -> None:
    await stream.wait_for(lambda f: f.event == "response.in_progress",
                          timeout=ctx.options.settle_timeout_s)


async def check_cancel_running(ctx: Context) -> None:
    ids = ("lmsp.cancel.running", "lmsp.cancel.idempotent", "lmsp.state.terminal-final")
    async with ctx.checking(*ids):
        if ctx.hold_prompt is None:
            raise Skip("no prompt that holds: pass --hold-prompt")
        task, _ = await create(ctx, ctx.hold_prompt)
        async with events(ctx, task["id"]) as stream:
            await _wait_running(ctx, stream)
            first = await ctx.request("POST", f"{BASE}/tasks/{task['id']}/cancel")
            again = await ctx.request("POST", f"{BASE}/tasks/{task['id']}/cancel")
            await stream.wait_for_end(ctx.options.settle_timeout_s)
        final = await get(ctx, task["id"])
        status = json_of(first).get("status") if first.status_code == 200 else None
        last_event = stream.frames[-1].event if stream.frames else None
        ctx.expect(ids[0], status == "cancelling" and final["status"] == "cancelled"
                   and last_event == "response.cancelled",
                   f"cancel while running: {describe(first)}; then status {final['status']}, "
                   f"last event {last_event}")
        ctx.expect(ids[1], again.status_code == 200
                   and json_of(again).get("status") in ("cancelling", "cancelled"),
                   f"second cancel: {describe(again)}")
        later = [final["status"]]
        for _ in range(3):
            later.append((await get(ctx, task["id"]))["status"])
        tail = await ctx.request("GET", f"{BASE}/tasks/{task['id']}/events",
                                 headers={"Last-Event-ID": str(len(stream.frames) - 1),
                                          "Accept": "text/event-stream"})
        ok = set(later) == {"cancelled"} and tail.status_code == 204
        ctx.expect(ids[2], ok, f"after response.cancelled, GET gave {later}; events after "
                               f"the terminal one: {describe(tail)}")


async def check_cancel_queued(ctx: Context) -> None:
    check = "lmsp.cancel.queued"
    async with ctx.checking(check):
        if ctx.hold_prompt is None:
            raise Skip("no prompt that holds: pass --hold-prompt")
        created = [(await create(ctx, ctx.hold_prompt))[0]
                   for _ in range(ctx.options.saturate_tasks)]
        queued = None
        for task in reversed(created):
            if (await get(ctx, task["id"]))["status"] == "queued":
                queued = task
                break
        if queued is None:
            raise Skip(f"no task stayed queued behind {len(created)} running ones "
                       "(raise --saturate-tasks)")
        cancel = await ctx.request("POST", f"{BASE}/tasks/{queued['id']}/cancel")
        ctx.expect(check, cancel.status_code == 200 and json_of(cancel).get("status") == "cancelled",
                   f"cancel of a queued task: {describe(cancel)}")


async def check_not_found(ctx: Context) -> None:
    check = "lmsp.not-found"
    async with ctx.checking(check):
        unknown = f"task_conformance{uuid.uuid4().hex}"
        seen = []
        for method, path in (("GET", f"{BASE}/tasks/{unknown}"),
                             ("POST", f"{BASE}/tasks/{unknown}/cancel")):
            response = await ctx.request(method, path)
            body = json_of(response)
            if response.status_code != 404 or body.get("code") != "task_not_found":
                seen.append(describe(response))
        ctx.expect(check, not seen, "; ".join(seen))


async def check_idempotency(ctx: Context) -> None:
    ids = ("lmsp.idempotency.replay", "lmsp.idempotency.conflict")
    async with ctx.checking(*ids):
        key = f"conformance-{uuid.uuid4().hex}"
        first, _ = await create(ctx, ctx.options.quick_prompt, headers={"Idempotency-Key": key})
        replay = await ctx.request("POST", f"{BASE}/tasks",
                                   json=envelope(ctx, ctx.options.quick_prompt),
                                   headers={"Idempotency-Key": key})
        ok = replay.status_code == 202 and json_of(replay).get("id") == first["id"] \
            and replay.headers.get("idempotent-replayed") == "true"
        ctx.expect(ids[0], ok, f"first task {first['id']}; replay: "
                               f"{describe(replay, headers=('idempotent-replayed',))}")
        other = await ctx.request("POST", f"{BASE}/tasks",
                                  json=envelope(ctx, ctx.options.quick_prompt + " (other)"),
                                  headers={"Idempotency-Key": key})
        body = json_of(other)
        ctx.expect(ids[1], other.status_code == 422
                   and body.get("code") == "idempotency_key_reused", describe(other))


async def check_on_restart(ctx: Context) -> None:
    check = "lmsp.on-restart.validated"
    async with ctx.checking(check):
        seen = []
        bogus = await ctx.request("POST", f"{BASE}/tasks",
                                  json=envelope(ctx, ctx.options.quick_prompt,
                                                on_restart="sometimes"))
        if bogus.status_code != 400 or json_of(bogus).get("code") != "invalid_request":
            seen.append(describe(bogus))
        snapshots = (ctx.lmsp_capabilities or {}).get("capabilities", {}).get("snapshots")
        if snapshots is False:
            resume = await ctx.request("POST", f"{BASE}/tasks",
                                       json=envelope(ctx, ctx.options.quick_prompt,
                                                     on_restart="resume"))
            if resume.status_code != 400 \
                    or json_of(resume).get("code") != "unsupported_capability":
                seen.append(describe(resume))
        retry, _ = await create(ctx, ctx.options.quick_prompt, on_restart="retry")
        if retry.get("on_restart") != "retry":
            seen.append(f"on_restart retry came back as {retry.get('on_restart')!r}")
        ctx.expect(check, not seen, "; ".join(seen))


SCENARIOS = (check_lifecycle, check_cancel_running, check_cancel_queued, check_not_found,
             check_idempotency, check_on_restart)
