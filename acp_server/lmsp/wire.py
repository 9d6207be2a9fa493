"""LMSP v1 wire types: task and response objects, response events, capabilities.

    body = encode(task_object(record))            # bytes, JSON
    draft = TextDeltaEvent(type="response.output_text.delta", item_id="msg_1", delta="hi")
    data = encode(msgspec.structs.replace(draft, sequence_number=7))

Contracts:

* Every event Struct has ``type`` first and ``sequence_number`` second; drafts carry
  ``sequence_number=-1`` and the store sets the real number inside the transaction
  that writes them (LMSP §6.4).
* No event carries a top-level ``error`` member (§6.3); failures live in
  ``response.error``.
* Stored blobs (the final response, the task's problem object) are embedded as
  ``msgspec.Raw`` so they are written byte for byte, never re-encoded.
* Encoders/decoders are built once, at import.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec
from msgspec import UNSET, UnsetType

TaskStatus = Literal["queued", "loading", "running", "cancelling", "succeeded", "failed",
                     "cancelled"]
ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed",
                         "cancelled"]
OnRestart = Literal["fail", "retry", "resume"]


# -- response object (§6.2) ------------------------------------------------------------
class OutputText(msgspec.Struct, kw_only=True):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = msgspec.field(default_factory=list)


class OutputMessage(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = msgspec.field(default_factory=list)


class ReasoningText(msgspec.Struct, kw_only=True):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class OutputReasoning(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning"):
    """The agent's thoughts (ACP ``agent_thought_chunk``) as the OpenAI Responses API's
    reasoning item with raw ``reasoning_text`` content (no summary is made)."""

    id: str
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    summary: list[Any] = msgspec.field(default_factory=list)
    content: list[ReasoningText] = msgspec.field(default_factory=list)


OutputItem = Union[OutputMessage, OutputReasoning]


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0          # no prompt cache here: 0 unless the agent reports some
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0       # counted usage leaves reasoning out: 0 unless reported


class Usage(msgspec.Struct, kw_only=True):
    """OpenAI's ``ResponseUsage``: the ``*_details`` members are required by its SDK."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(
        default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = msgspec.field(
        default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseError(msgspec.Struct, kw_only=True):
    code: str
    message: str


class IncompleteDetails(msgspec.Struct, kw_only=True):
    reason: str


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text"] = "text"   # the only format served (structured output refused)


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat = msgspec.field(default_factory=TextFormat)
    verbosity: Literal["low", "medium", "high"] | None = None   # a hint, repeated


class ReasoningConfig(msgspec.Struct, kw_only=True):
    effort: None = None    # refused when set: no agent takes a reasoning effort
    summary: None = None   # refused when set: no agent writes summaries


class ResponseObject(msgspec.Struct, kw_only=True):
    """OpenAI's ``Response`` (every member its SDK requires), with the request's
    parameters repeated as they were applied (``acp_server.lmsp.params``)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None   # only when ``status`` is ``completed``
    status: ResponseStatus
    model: str
    output: list[OutputItem] = msgspec.field(default_factory=list)
    usage: Usage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    instructions: str | None = None           # the request's, repeated (as OpenAI does)
    max_output_tokens: int | None = None      # likewise
    background: bool = False                  # created with ``background: true``
    previous_response_id: str | None = None   # the response it continues
    store: bool = True
    parallel_tool_calls: bool = True
    tool_choice: Literal["auto", "none"] = "auto"
    tools: list[Any] = msgspec.field(default_factory=list)   # function tools are refused
    temperature: float | None = None          # sampling is the agent's: always null (not applied)
    top_p: float | None = None                # likewise
    top_logprobs: int = 0                     # no logprobs: more than 0 is refused
    max_tool_calls: int | None = None         # refused when set (an agent's tools are its own)
    text: TextConfig = msgspec.field(default_factory=TextConfig)
    truncation: Literal["auto", "disabled"] = "disabled"
    reasoning: ReasoningConfig = msgspec.field(default_factory=ReasoningConfig)
    service_tier: Literal["default"] = "default"   # the tier used, whatever was asked
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class ItemText(msgspec.Struct, kw_only=True):
    """A text part of an input item: ``input_text`` (``output_text`` in an assistant's)."""

    type: Literal["input_text", "output_text"] = "input_text"
    text: str = ""


class InputItem(msgspec.Struct, kw_only=True):
    """One message of a response's ``input`` (``GET /responses/{id}/input_items``)."""

    id: str
    type: Literal["message"] = "message"
    role: str
    status: Literal["completed"] = "completed"
    content: list[ItemText]


class InputItemList(msgspec.Struct, kw_only=True):
    """A page of a response's input items (OpenAI's ``input_items`` list)."""

    object: Literal["list"] = "list"
    data: list[InputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(msgspec.Struct, kw_only=True):
    """The answer of ``DELETE /responses/{id}``."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


# -- task object (§7.1) ----------------------------------------------------------------
class TaskObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["task"] = "task"
    type: Literal["response"] = "response"
    status: TaskStatus
    created_at: int
    updated_at: int
    response_id: str
    events_url: str
    on_restart: OnRestart
    response: msgspec.Raw | None = None   # a ResponseObject, only when succeeded
    error: msgspec.Raw | None = None      # a problem object, only when failed


class TaskSummary(TaskObject, kw_only=True):
    """An item of ``GET /lmsp/v1/tasks``: the task object, its model, its input's text
    (cut to ``INPUT_PREVIEW_CHARS``) and final usage."""

    model: str
    input_text: str = ""
    usage: Usage | None = None


class TaskList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[TaskSummary]
    first_id: str | None
    last_id: str | None
    has_more: bool


# -- response events (§6.3) ------------------------------------------------------------
class ResponseEvent(msgspec.Struct, kw_only=True):
    """``response.created`` / ``.in_progress`` / terminal events."""

    type: str
    sequence_number: int = -1
    response: ResponseObject


class OutputItemEvent(msgspec.Struct, kw_only=True):
    type: str   # response.output_item.added / .done
    sequence_number: int = -1
    output_index: int = 0
    item: OutputItem


class ContentPartEvent(msgspec.Struct, kw_only=True):
    type: str   # response.content_part.added / .done
    sequence_number: int = -1
    item_id: str
    output_index: int = 0
    content_index: int = 0
    part: OutputText


class TextDeltaEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int = -1
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class TextDoneEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int = -1
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ReasoningDeltaEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    sequence_number: int = -1
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str


class ReasoningDoneEvent(msgspec.Struct, kw_only=True):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    sequence_number: int = -1
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str


class PermissionDecidedEvent(msgspec.Struct, kw_only=True):
    """A permission the agent asked during the task, answered by the server's policy
    (``--lmsp-permissions``; ``acp_server/lmsp/permissions.py``)."""

    type: Literal["response.permission_decided"] = "response.permission_decided"
    sequence_number: int = -1
    request_id: str
    policy: str
    outcome: dict[str, Any]
    option_kind: str | None = None
    tool_call: Any = None


AnyEvent = Union[ResponseEvent, OutputItemEvent, ContentPartEvent, TextDeltaEvent,
                 TextDoneEvent, ReasoningDeltaEvent, ReasoningDoneEvent, PermissionDecidedEvent]
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed",
                             "response.cancelled"})


# -- capabilities (§5) -----------------------------------------------------------------
class CapabilityFlags(msgspec.Struct, kw_only=True):
    tasks: bool = True
    event_resume: bool = True
    snapshots: bool = False
    idempotency: bool = True
    background: bool = True            # POST /responses {"background": true}, retrieve, cancel
    previous_response_id: bool = True  # conversation state across responses


class Limits(msgspec.Struct, kw_only=True):
    event_retention_seconds: int
    task_retention_seconds: int
    idempotency_key_ttl_seconds: int
    max_request_bytes: int


class Capabilities(msgspec.Struct, kw_only=True):
    object: Literal["capabilities"] = "capabilities"
    version: str = "1.0"
    capabilities: CapabilityFlags
    limits: Limits
    models: list[str]


# -- problem objects (§9.3) ------------------------------------------------------------
class ErrorPointer(msgspec.Struct, kw_only=True):
    pointer: str
    detail: str


class Problem(msgspec.Struct, kw_only=True):
    """RFC 9457 problem object. Extensions are only those of its ``code`` (§9.3);
    unset members are omitted, ``None`` ones are sent as ``null``."""

    type: str
    title: str
    status: int | UnsetType = UNSET
    detail: str | UnsetType = UNSET
    instance: str | UnsetType = UNSET
    code: str
    # ``detail`` again, in an answer's problem (not in ``task.error``): the OpenAI SDKs
    # put only an error's ``message`` in their exception text
    message: str | UnsetType = UNSET
    param: str | UnsetType = UNSET
    errors: list[ErrorPointer] | UnsetType = UNSET
    capability: str | UnsetType = UNSET
    task_id: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    task_status: str | UnsetType = UNSET
    response_id: str | UnsetType = UNSET
    response_status: str | UnsetType = UNSET
    earliest_sequence_number: int | None | UnsetType = UNSET
    retention_seconds: int | UnsetType = UNSET
    limit: int | UnsetType = UNSET
    pendingCount: int | UnsetType = UNSET
    required_scope: str | UnsetType = UNSET      # 403 forbidden: the scope it lacks
    tier: str | UnsetType = UNSET                # 429 rate_limit_exceeded
    retry_after_ms: int | UnsetType = UNSET


_encoder = msgspec.json.Encoder()
encode = _encoder.encode
decode_any = msgspec.json.Decoder().decode
decode_response = msgspec.json.Decoder(ResponseObject).decode


def canonical(value: Any) -> bytes:
    """JSON with recursively sorted keys: the idempotency fingerprint input (§9.2)."""
    return msgspec.json.encode(value, order="sorted")
