"""Building response objects and the §6.3 events of one attempt, from ACP traffic.

    build = Attempt(record)                     # one per run of a task
    drafts = build.text("Hel")                  # [output_item.added, content_part.added, delta]
    finish = build.finish("end_turn", now)      # done events + response.completed, response

Mapping from ACP (issue 5): ``agent_message_chunk`` → ``response.output_text.delta``
(the output item and content part events open before the first delta and close
before the terminal event); stopReason ``end_turn`` → ``response.completed``;
``agent_thought_chunk`` → ``response.reasoning_text.delta`` in a ``reasoning`` output
item (``content: [{type: "reasoning_text", text}]``, ``summary: []``), opened before
its first delta, in the order the items began (thoughts first: index 0, the message
1), closed before the terminal event; ``max_tokens`` / ``max_turn_requests`` →
``response.incomplete`` (reason
``max_output_tokens`` / ``max_turn_requests``); ``refusal`` → ``response.incomplete``
(reason ``content_filter``); ``cancelled`` → ``response.cancelled``; errors →
``response.failed`` with ``response.error``. The task is ``succeeded`` for completed
and incomplete.

``max_output_tokens``: ACP prompts carry no such limit, so it is enforced here: text
past the limit (counted delta by delta, as below) is cut, the prompt is cancelled,
and the response ends ``incomplete`` with reason ``max_output_tokens``.

Usage: the agent's ``usage_update`` (``used`` / ``inputTokens`` / ``outputTokens``)
when it sends one; otherwise *counted*: tokens = words and punctuation marks
(``\\w+|[^\\w\\s]``) of the prompt text (input) and of the output text (output).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from acp_server.lmsp.params import ECHO_NAMES, echoed_params
from acp_server.lmsp.problems import problem
from acp_server.lmsp.requests import decode_stored
from acp_server.store.tasks import Finish, TaskRecord
from acp_server.lmsp.wire import (
    AnyEvent,
    ContentPartEvent,
    IncompleteDetails,
    InputTokensDetails,
    OutputItemEvent,
    OutputTokensDetails,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningDeltaEvent,
    ReasoningDoneEvent,
    ReasoningText,
    ResponseError,
    ResponseEvent,
    ResponseObject,
    TextDeltaEvent,
    TextDoneEvent,
    Usage,
    encode,
)

_TOKEN = re.compile(r"\w+|[^\w\s]")
INCOMPLETE_REASONS = {"max_tokens": "max_output_tokens", "max_turn_requests": "max_turn_requests",
                      "refusal": "content_filter"}


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


_ECHOED = re.compile(b"|".join(re.escape(name) for name in (
    b'"metadata"', b'"instructions"', b'"max_output_tokens"', b'"background"',
    b'"previous_response_id"', *ECHO_NAMES)))   # one scan of the bytes for any of them


def echoed(record: TaskRecord) -> dict[str, Any]:
    """The request members a response object repeats: ``metadata``, ``instructions``,
    ``max_output_tokens``, ``background``, ``previous_response_id`` and the parameters
    of ``acp_server.lmsp.params`` (decoded once per stored request, then remembered).
    A run of a task takes them once (``Attempt.echo``) for every response it builds."""
    if _ECHOED.search(record.request) is None:   # common: nothing to decode
        return {}
    request = record.request
    if len(request) > ECHO_CACHED_BYTES:   # (a cache of 1 MiB keys would hold GBs)
        return dict(_echo_of.__wrapped__(request))
    return dict(_echo_of(request))


ECHO_CACHED_BYTES = 16 << 10   # requests remembered by ``_echo_of``: at most 16 MiB


@functools.lru_cache(maxsize=1024)
def _echo_of(request: bytes) -> tuple[tuple[str, Any], ...]:
    stored = decode_stored(request)
    fields: list[tuple[str, Any]] = []
    if stored.metadata is not None:
        fields.append(("metadata", dict(stored.metadata)))
    if stored.instructions is not None:
        fields.append(("instructions", stored.instructions))
    if stored.max_output_tokens is not None:
        fields.append(("max_output_tokens", stored.max_output_tokens))
    if stored.background is True:
        fields.append(("background", True))
    if stored.previous_response_id is not None:
        fields.append(("previous_response_id", stored.previous_response_id))
    fields += echoed_params(request)
    return tuple(fields)


def base_response(record: TaskRecord, status: str, echo: dict[str, Any] | None = None,
                  **fields: Any) -> ResponseObject:
    """``echo``: ``echoed(record)`` when the caller has it already."""
    return ResponseObject(id=record.response_id, created_at=int(record.created_at),
                          status=status, model=record.model,  # type: ignore[arg-type]
                          **(echoed(record) if echo is None else echo), **fields)


def created_event(record: TaskRecord) -> ResponseEvent:
    return ResponseEvent(type="response.created", response=base_response(record, "queued"))


def in_progress_event(record: TaskRecord, echo: dict[str, Any] | None = None
                      ) -> ResponseEvent:
    return ResponseEvent(type="response.in_progress",
                         response=base_response(record, "in_progress", echo))


def error_finish(record: TaskRecord, code: str, message: str, *, status: str = "failed"
                 ) -> Finish:
    """``response.failed`` (or ``.cancelled``) with no output: recovery, queued cancel."""
    if status == "cancelled":
        response = base_response(record, "cancelled")
        return Finish(events=[ResponseEvent(type="response.cancelled", response=response)],
                      response=encode(response))
    response = base_response(record, "failed", error=ResponseError(code=code, message=message))
    error = encode(problem(code, message, with_status=False))
    return Finish(events=[ResponseEvent(type="response.failed", response=response)],
                  response=encode(response), error=error)


def recovery_finish(record: TaskRecord, target: str) -> Finish:
    if target == "cancelled":
        return error_finish(record, "", "", status="cancelled")
    detail = "The server restarted while the task was running."
    if record.on_restart == "retry":
        detail = f"The server restarted during the last of {record.attempt} attempts."
    return error_finish(record, "server_restarted", detail)


class Attempt:
    """The output of one run of a task: text so far, usage, and its events."""

    def __init__(self, record: TaskRecord, input_text: str,
                 max_output_tokens: int | None = None) -> None:
        self.record = record
        self.limit = max_output_tokens
        self.counted = 0            # output tokens, counted delta by delta
        self.truncated = False      # the limit was reached: later text is dropped
        self.item_id = "msg_" + record.response_id.removeprefix("resp_") + f"_{record.attempt}"
        self.thought_id = "rs_" + self.item_id.removeprefix("msg_")
        self.text_parts: list[str] = []
        self.thought_parts: list[str] = []
        self.order: list[str] = []   # the output items as they opened: message, reasoning
        self.input_tokens = count_tokens(input_text)
        self.reported_usage: Usage | None = None
        self.echo = echoed(record)   # what each of its response objects repeats

    @property
    def output_text(self) -> str:
        return "".join(self.text_parts)

    @property
    def opened(self) -> bool:
        return "message" in self.order

    def _open(self, kind: str, item: OutputItem) -> list[AnyEvent]:
        if kind in self.order:
            return []
        self.order.append(kind)
        return [OutputItemEvent(type="response.output_item.added",
                                output_index=len(self.order) - 1, item=item)]

    def thought(self, delta: str) -> list[AnyEvent]:
        """Events for a chunk of the agent's thoughts (none once ``truncated``)."""
        if self.truncated or not delta:
            return []
        drafts = self._open("reasoning", OutputReasoning(id=self.thought_id))
        self.thought_parts.append(delta)
        drafts.append(ReasoningDeltaEvent(item_id=self.thought_id, delta=delta,
                                          output_index=self.order.index("reasoning")))
        return drafts

    def text(self, delta: str) -> list[AnyEvent]:
        """Events for a chunk of text; past ``max_output_tokens`` it is cut (at a token
        boundary) and ``truncated`` is set."""
        if self.limit is not None:
            if self.truncated:
                return []
            tokens = list(_TOKEN.finditer(delta))
            if self.counted + len(tokens) > self.limit:
                keep = self.limit - self.counted
                delta = delta[:tokens[keep - 1].end()] if keep > 0 else ""
                self.truncated = True
                self.counted = self.limit
                if not delta:
                    return []
            else:
                self.counted += len(tokens)
        drafts: list[AnyEvent] = []
        if not self.opened:
            drafts += self._open("message", OutputMessage(id=self.item_id))
            drafts.append(ContentPartEvent(type="response.content_part.added",
                                           item_id=self.item_id, part=OutputText(),
                                           output_index=self.order.index("message")))
        self.text_parts.append(delta)
        drafts.append(TextDeltaEvent(item_id=self.item_id, delta=delta,
                                     output_index=self.order.index("message")))
        return drafts

    def usage_update(self, update: dict[str, Any]) -> None:
        """ACP ``usage_update``; accepts the shapes agents send (best effort): token
        counts at the top, or (the model agent's: ACP's own members are the context
        window's ``used`` / ``size``) under ``_meta["acp-server/usage"]``."""
        meta = update.get("_meta")
        reported = meta.get("acp-server/usage") if isinstance(meta, dict) else None
        if isinstance(reported, dict):
            update = reported
        inp = update.get("inputTokens", update.get("input_tokens"))
        out = update.get("outputTokens", update.get("output_tokens"))
        if isinstance(inp, int) and isinstance(out, int):
            def count(*names: str) -> int:
                found = [update[n] for n in names if isinstance(update.get(n), int)]
                return found[0] if found else 0

            self.reported_usage = Usage(
                input_tokens=inp, output_tokens=out, total_tokens=inp + out,
                input_tokens_details=InputTokensDetails(
                    cached_tokens=count("cachedReadTokens", "cached_tokens"),
                    cache_write_tokens=count("cachedWriteTokens", "cache_write_tokens")),
                output_tokens_details=OutputTokensDetails(
                    reasoning_tokens=count("thoughtTokens", "reasoning_tokens")))

    def usage(self) -> Usage:
        if self.reported_usage is not None:
            return self.reported_usage
        out = count_tokens(self.output_text)
        if self.limit is not None:
            out = min(out, self.limit)
        return Usage(input_tokens=self.input_tokens, output_tokens=out,
                     total_tokens=self.input_tokens + out)

    def _item(self, kind: str, item_status: str) -> OutputItem:
        if kind == "reasoning":
            return OutputReasoning(id=self.thought_id, status=item_status,  # type: ignore[arg-type]
                                   content=[ReasoningText(text="".join(self.thought_parts))])
        return OutputMessage(id=self.item_id, status=item_status,  # type: ignore[arg-type]
                             content=[OutputText(text=self.output_text)])

    def _output(self, item_status: str) -> list[OutputItem]:
        return [self._item(kind, item_status) for kind in self.order]

    def _close_item(self, item_status: str) -> list[AnyEvent]:
        events: list[AnyEvent] = []
        for index, kind in enumerate(self.order):
            item = self._item(kind, item_status)
            if isinstance(item, OutputReasoning):
                events.append(ReasoningDoneEvent(item_id=item.id, output_index=index,
                                                 text=item.content[0].text))
            else:
                part = item.content[0]
                events += [TextDoneEvent(item_id=item.id, text=part.text, output_index=index),
                           ContentPartEvent(type="response.content_part.done", item_id=item.id,
                                            part=part, output_index=index)]
            events.append(OutputItemEvent(type="response.output_item.done", output_index=index,
                                          item=item))
        return events

    def finish(self, stop_reason: str, now: float) -> tuple[str, Finish]:
        """(task status, what the terminal transition writes) for a stopReason; a
        completed response's ``completed_at`` is ``now`` (wall-clock seconds)."""
        if self.truncated:
            stop_reason = "max_tokens"   # we stopped it at max_output_tokens
        elif stop_reason == "cancelled":
            return "cancelled", self.cancelled()
        reason = INCOMPLETE_REASONS.get(stop_reason)
        item_status = "incomplete" if reason else "completed"
        response = base_response(
            self.record, "incomplete" if reason else "completed", self.echo,
            output=self._output(item_status), usage=self.usage(),
            completed_at=None if reason else int(now),
            incomplete_details=IncompleteDetails(reason=reason) if reason else None)
        kind = "response.incomplete" if reason else "response.completed"
        events = [*self._close_item(item_status), ResponseEvent(type=kind, response=response)]
        return "succeeded", Finish(events=events, response=encode(response))

    def cancelled(self) -> Finish:
        response = base_response(self.record, "cancelled", self.echo,
                                 output=self._output("incomplete"), usage=self.usage())
        return Finish(events=[ResponseEvent(type="response.cancelled", response=response)],
                      response=encode(response))

    def failed(self, code: str, message: str) -> Finish:
        response = base_response(self.record, "failed", self.echo,
                                 output=self._output("incomplete"), usage=self.usage(),
                                 error=ResponseError(code=code, message=message))
        return Finish(events=[ResponseEvent(type="response.failed", response=response)],
                      response=encode(response),
                      error=encode(problem(code, message, with_status=False)))
