"""The ``backpressure`` suite: the prompt-queue admission contract over REST.

    await run_backpressure(ctx)     # records every ``backpressure.*`` check in ctx

Each scenario uses its own fresh ``thread`` session (deleted afterwards) so that one
broken rule fails only its own check. Queues are filled with ``ctx.hold_prompt`` (a
prompt that stays pending >= 5 s); without one the filling checks are skipped.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from acp_server.conformance.context import (ORIGIN_META, CheckFailed, Context, Frame, Skip,
                                            Stream, describe)

TERMINAL = ("turn_complete", "turn_error")


def _body(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


SESSION_ATTEMPTS = 3   # a refusal the server calls retryable is asked again, so many times


async def new_session(ctx: Context) -> str:
    """A fresh ``thread`` session, deleted after the run. A refusal whose body says
    ``"retryable": true`` (``qwen serve``'s ``init_timeout`` when its agent starts
    slowly) is asked again, at most ``SESSION_ATTEMPTS`` times in all: a session is the
    scenario's precondition, not what its check is about."""
    for _ in range(SESSION_ATTEMPTS):
        response = await ctx.request("POST", "/session", json={"sessionScope": "thread",
                                                              "_meta": ORIGIN_META})
        if response.status_code == 200 or not _retryable(response):
            break
    if response.status_code != 200:
        raise CheckFailed(f"cannot create a session: {describe(response)}")
    sid = response.json()["sessionId"]
    ctx.later(lambda: ctx.request("DELETE", f"/session/{sid}"))
    return str(sid)


def _retryable(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("retryable") is True


async def post_prompt(ctx: Context, sid: str, text: str) -> httpx.Response:
    return await ctx.request("POST", f"/session/{sid}/prompt", json=_body(text))


def limit_of(ctx: Context) -> int:
    """The advertised limit, or Skip when it is off, unusable or nothing can hold."""
    if not isinstance((ctx.capabilities or {}).get("limits"), dict):
        raise Skip("no limits in /capabilities: the queue limit is unknown")
    limit = ctx.capabilities["limits"].get("maxPendingPromptsPerSession")  # type: ignore[index]
    if limit is None:
        raise Skip("the cap is disabled (maxPendingPromptsPerSession is null)")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise Skip(f"no usable limit advertised ({limit!r})")
    if limit > ctx.options.max_fill:
        raise Skip(f"limit {limit} is above --max-fill {ctx.options.max_fill}")
    if ctx.hold_prompt is None:
        raise Skip("no prompt that holds: pass --hold-prompt")
    return limit


async def fill(ctx: Context, sid: str, count: int) -> list[str]:
    """``count`` hold prompts, each answered 202; their prompt ids."""
    assert ctx.hold_prompt is not None
    ids = []
    for index in range(count):
        response = await post_prompt(ctx, sid, ctx.hold_prompt)
        if response.status_code != 202:
            raise CheckFailed(f"hold prompt {index + 1} of {count} was not admitted: "
                              f"{describe(response)}")
        ids.append(response.json()["promptId"])
    return ids


def _about(prompt_id: str, *kinds: str) -> Any:
    def match(frame: Frame) -> bool:
        data = frame.data if isinstance(frame.data, dict) else {}
        inner = data.get("data") if isinstance(data.get("data"), dict) else {}
        about = data.get("promptId") or inner.get("promptId")
        return frame.event in kinds and about == prompt_id
    return match


async def refused(ctx: Context, sid: str, what: str) -> httpx.Response:
    response = await post_prompt(ctx, sid, ctx.hold_prompt or "")
    if response.status_code != 503:
        raise CheckFailed(f"precondition: the queue should be full {what}: {describe(response)}")
    return response


async def check_capabilities(ctx: Context) -> None:
    limits = (ctx.capabilities or {}).get("limits")
    value = limits.get("maxPendingPromptsPerSession", "absent") if isinstance(limits, dict) \
        else "absent"
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    ctx.expect("backpressure.capabilities.limit", ok,
               f"GET /capabilities: limits.maxPendingPromptsPerSession = {value!r}")


async def check_refusal(ctx: Context) -> None:
    ids = ("backpressure.admission.exact-limit", "backpressure.refusal.retry-after",
           "backpressure.refusal.body", "backpressure.refusal.no-prompt-id")
    async with ctx.checking(*ids):
        limit = limit_of(ctx)
        sid = await new_session(ctx)
        await fill(ctx, sid, limit)
        response = await post_prompt(ctx, sid, ctx.hold_prompt or "")
        seen = describe(response, headers=("retry-after",))
        if not ctx.expect(ids[0], response.status_code == 503,
                          f"{limit} prompts admitted, prompt {limit + 1}: {seen}"):
            raise Skip("no refusal to inspect")
        ctx.expect(ids[1], response.headers.get("retry-after") == "5", seen)
        body = response.json()
        ok = (isinstance(body, dict) and body.get("code") == "prompt_queue_full"
              and isinstance(body.get("error"), str) and body.get("sessionId") == sid
              and body.get("limit") == limit and body.get("pendingCount") == limit)
        ctx.expect(ids[2], ok, f"expected code prompt_queue_full, error, sessionId {sid}, "
                               f"limit {limit}, pendingCount {limit}; {seen}")
        ctx.expect(ids[3], isinstance(body, dict) and "promptId" not in body, seen)


async def check_concurrent(ctx: Context) -> None:
    check = "backpressure.admission.concurrent"
    async with ctx.checking(check):
        limit = limit_of(ctx)
        sid = await new_session(ctx)
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await post_prompt(ctx, sid, ctx.hold_prompt or "")).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(2 * limit + 2):
                tg.start_soon(one)
        admitted = statuses.count(202)
        ctx.expect(check, admitted == limit and statuses.count(503) == len(statuses) - limit,
                   f"{len(statuses)} concurrent POST /session/{sid}/prompt with limit {limit}: "
                   f"{admitted} answered 202, statuses {sorted(statuses)}")


def _events(ctx: Context, sid: str) -> Any:
    return ctx.stream("GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"})


async def _readmitted(ctx: Context, check: str, sid: str, what: str) -> None:
    response = await post_prompt(ctx, sid, ctx.hold_prompt or "")
    ctx.expect(check, response.status_code == 202,
               f"after {what}, the next prompt: {describe(response)}")


async def check_release_completed(ctx: Context) -> None:
    """A quick prompt completes; then ``limit`` hold prompts must all be admitted, which
    they can only be if the completed prompt gave its slot back."""
    check = "backpressure.release.completed"
    async with ctx.checking(check):
        limit = limit_of(ctx)
        sid = await new_session(ctx)
        async with _events(ctx, sid) as events:
            quick = await post_prompt(ctx, sid, ctx.options.quick_prompt)
            if quick.status_code != 202:
                raise CheckFailed(f"prompt not admitted: {describe(quick)}")
            done = await events.wait_for(_about(quick.json()["promptId"], *TERMINAL),
                                         timeout=ctx.options.settle_timeout_s)
        admitted = await _admitted(ctx, sid, limit)
        ctx.expect(check, admitted == limit, f"after a prompt settled ({done.event}), "
                                             f"{admitted} of {limit} prompts admitted")


async def check_release_cancelled(ctx: Context) -> None:
    check = "backpressure.release.cancelled"
    async with ctx.checking(check):
        limit = limit_of(ctx)
        sid = await new_session(ctx)
        async with _events(ctx, sid) as events:
            first = (await fill(ctx, sid, limit))[0]
            await refused(ctx, sid, f"after {limit} prompts")
            cancel = await ctx.request("POST", f"/session/{sid}/cancel")
            if cancel.status_code not in (200, 202, 204):
                raise CheckFailed(f"cancel refused: {describe(cancel)}")
            await events.wait_for(_about(first, *TERMINAL))
            await _readmitted(ctx, check, sid, "the running prompt was cancelled")


async def check_release_dropped(ctx: Context) -> None:
    check = "backpressure.release.dropped"
    async with ctx.checking(check):
        limit = limit_of(ctx)
        if limit < 2:
            raise Skip("limit 1: no prompt is ever queued")
        sid = await new_session(ctx)
        async with _events(ctx, sid) as events:
            last = (await fill(ctx, sid, limit))[-1]
            await refused(ctx, sid, f"after {limit} prompts")
            dropped = await ctx.request("DELETE", f"/session/{sid}/pending-prompts/{last}")
            if dropped.status_code in (404, 405) and "pending" not in dropped.text.lower():
                raise Skip(f"no DELETE /session/:id/pending-prompts/:promptId route "
                           f"({dropped.status_code})")
            if dropped.status_code not in (200, 202, 204):
                raise CheckFailed(f"drop refused: {describe(dropped)}")
            await _wait_settled(events, last, ctx)
            await _readmitted(ctx, check, sid, f"queued prompt {last} was dropped")


async def _wait_settled(events: Stream, prompt_id: str, ctx: Context) -> None:
    """The dropped prompt's terminal event, when the server publishes one."""
    with anyio.move_on_after(ctx.options.timeout_s):
        await events.wait_for(_about(prompt_id, *TERMINAL, "pending_prompt_completed",
                                     "prompt_cancelled"))


async def check_failure(ctx: Context) -> None:
    check = "backpressure.failure.no-poison"
    async with ctx.checking(check):
        if ctx.fail_prompt is None:
            raise Skip("no prompt that fails: pass --fail-prompt")
        sid = await new_session(ctx)
        async with _events(ctx, sid) as events:
            failing = await post_prompt(ctx, sid, ctx.fail_prompt)
            following = await post_prompt(ctx, sid, ctx.options.quick_prompt)
            if failing.status_code != 202 or following.status_code != 202:
                raise CheckFailed(f"prompts not admitted: {describe(failing)}; "
                                  f"{describe(following)}")
            bad = await events.wait_for(_about(failing.json()["promptId"], *TERMINAL),
                                        timeout=ctx.options.settle_timeout_s)
            if bad.event != "turn_error":
                raise Skip(f"the fail prompt did not fail (it ended with {bad.event})")
            good = await events.wait_for(_about(following.json()["promptId"], *TERMINAL),
                                         timeout=ctx.options.settle_timeout_s)
            ctx.expect(check, good.event == "turn_complete",
                       f"after a turn_error, the next prompt ended with {good.event}: "
                       f"{good.data}")


async def _one_turn(ctx: Context, sid: str) -> None:
    """A quick prompt, run to its end (a branch needs some history)."""
    async with _events(ctx, sid) as events:
        turn = await post_prompt(ctx, sid, ctx.options.quick_prompt)
        if turn.status_code != 202:
            raise CheckFailed(f"prompt not admitted: {describe(turn)}")
        await events.wait_for(_about(turn.json()["promptId"], *TERMINAL),
                              timeout=ctx.options.settle_timeout_s)


async def _admitted(ctx: Context, sid: str, limit: int) -> int:
    """How many of ``limit`` hold prompts are admitted, stopping at the first refusal."""
    for count in range(limit):
        if (await post_prompt(ctx, sid, ctx.hold_prompt or "")).status_code != 202:
            return count
    return limit


async def check_branch(ctx: Context) -> None:
    """Two like sessions, one branched: both must then admit as many prompts (the
    control session isolates this from any other leak). A server that cannot branch
    an empty session gets one finished turn in each first."""
    check = "backpressure.branch.no-slot"
    async with ctx.checking(check):
        if "session_branch" not in ((ctx.capabilities or {}).get("features") or []):
            raise Skip("the target does not advertise session_branch")
        limit = limit_of(ctx)
        control, sid = await new_session(ctx), await new_session(ctx)
        path, body = f"/session/{sid}/branch", {"name": "conformance"}
        branch = await ctx.request("POST", path, json=body)
        if branch.status_code not in (200, 201):
            await _one_turn(ctx, control)
            await _one_turn(ctx, sid)
            branch = await ctx.request("POST", path, json=body)
        if branch.status_code not in (200, 201):
            raise CheckFailed(f"branch failed: {describe(branch)}")
        child = branch.json().get("sessionId")
        if child:
            ctx.later(lambda: ctx.request("DELETE", f"/session/{child}"))
        expected, admitted = await _admitted(ctx, control, limit), await _admitted(ctx, sid, limit)
        ctx.expect(check, admitted == expected and expected > 0,
                   f"after POST /session/{sid}/branch, {admitted} of {limit} prompts admitted "
                   f"(a session not branched: {expected})")


async def check_status(ctx: Context) -> None:
    check = "backpressure.status.counts"
    async with ctx.checking(check):
        limit = limit_of(ctx)
        sid = await new_session(ctx)
        count = min(limit, 3)
        await fill(ctx, sid, count)
        response = await ctx.request("GET", "/daemon/status")
        activity = ((response.json().get("runtime") or {}).get("activity") or {}) \
            if response.status_code == 200 else {}
        pending, queued, active = (activity.get(k) for k in
                                   ("pendingPrompts", "queuedPrompts", "activePrompts"))
        ok = (all(isinstance(v, int) for v in (pending, queued, active))
              and pending >= count and queued >= count - 1 and active >= 1  # type: ignore[operator]
              and pending == queued + active)  # type: ignore[operator]
        ctx.expect(check, ok, f"{count} prompts pending in {sid}; runtime.activity = "
                              f"{activity}; {describe(response) if not ok else ''}")


SCENARIOS = (check_capabilities, check_refusal, check_concurrent, check_release_completed,
             check_release_cancelled, check_release_dropped, check_failure, check_branch,
             check_status)
