"""Documentation types of the OpenAPI document: the error bodies that ``rest.errors``
builds from its tables, and the request bodies as accepted (the routes decode looser
types, ``acp_server.rest.wire``, so that they can answer the peer's own error codes).

    from acp_server.ops.openapi_types import RestError, PromptQueueFull

Contract: documentation only. No route encodes or decodes with these types; a field
changes here when the route's errors or bodies change (the live schemathesis run checks
that). Every REST answer is a type of ``acp_server.rest.wire`` that its route encodes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from acp_server.lmsp import wire as lmsp_wire


class RestError(msgspec.Struct):
    """Every REST error: a message, and the peer's ``code`` and fields where it has them
    (``code`` is the JSON-RPC error code, an integer, for an agent error)."""

    error: str
    code: str | int | UnsetType = UNSET


class PromptQueueFull(msgspec.Struct):
    """503 of ``POST /session/{id}/prompt``: exactly these five members."""

    error: str
    code: Literal["prompt_queue_full"]
    sessionId: str
    limit: int
    pendingCount: int


# Request bodies as accepted. The wire types type some fields ``Any`` so that the route
# can answer the peer's own error code; these say what passes.
class CreateSessionRequest(msgspec.Struct):
    cwd: str | None = None   # the workspace (the only one); another → 400 workspace_mismatch
    sessionScope: Literal["single", "thread"] | None = None
    sessionId: Annotated[str, msgspec.Meta(
        description="A UUID (RFC 4122, versions 1-5); forces `thread`")] | None = None
    agent: Annotated[str, msgspec.Meta(examples=["reference"])] | None = None
    meta: Annotated[dict[str, Any], msgspec.Meta(
        description="`{\"acp-server/origin\": LABEL}` labels a session made by a program "
                    "(`[a-z][a-z0-9._-]{0,31}`; anything else is ignored)")] | None = \
        msgspec.field(default=None, name="_meta")


class PromptRequest(msgspec.Struct):
    prompt: Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1, description=(
        "ACP content blocks, e.g. {\"type\": \"text\", \"text\": \"hello\"}"))]
    deadlineMs: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    promptId: Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9._:-]{1,128}$", description=(
        "The client's id for the prompt: sent again under it (an answer lost), the "
        "prompt is not admitted twice"))] | None = None


class SelectedOutcome(msgspec.Struct, tag_field="outcome", tag="selected"):
    optionId: Annotated[str, msgspec.Meta(min_length=1)]


class CancelledOutcome(msgspec.Struct, tag_field="outcome", tag="cancelled"):
    pass


class PermissionVote(msgspec.Struct):
    outcome: SelectedOutcome | CancelledOutcome


class InputText(msgspec.Struct):
    type: Literal["input_text"]
    text: str


class InputMessage(msgspec.Struct):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]
    type: Literal["message"] = "message"


class ResponseRequest(msgspec.Struct):
    """``POST /lmsp/v1/responses`` (and a task's ``input``); unknown members are ignored."""

    model: Annotated[str, msgspec.Meta(min_length=1, examples=["reference"], description=(
        "An agent of the server (`reference` always is one)"))]
    input: str | Annotated[list[InputMessage], msgspec.Meta(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    metadata: dict[str, str] | None = None
    stream: bool | None = None
    background: Annotated[bool, msgspec.Meta(description=(
        "Answer at once (`queued`); retrieve, stream or cancel it by id later"))] | None = None
    store: Annotated[bool, msgspec.Meta(description=(
        "`false`: not retrievable by id (not allowed with `background`)"))] | None = None
    previous_response_id: Annotated[str, msgspec.Meta(min_length=1, description=(
        "Continue this finished response's conversation (404 unknown, 409 unfinished)"
    ))] | None = None
    # OpenAI's parameters (acp_server.lmsp.params): repeated in the response as applied;
    # where only a no-op value is accepted, any other is 400 unsupported_capability
    parallel_tool_calls: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    text: Annotated[dict[str, Any], msgspec.Meta(description=(
        '`{"format": {"type": "text"}, "verbosity": …}`; another format is refused'))] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Annotated[Literal["auto", "default", "flex", "scale", "priority"],
                            msgspec.Meta(description="Accepted; the response says `default`")
                            ] | None = None
    tools: Annotated[list[Any], msgspec.Meta(max_length=0, description=(
        "Only `[]`: an agent runs its own tools"))] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=0)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2, description=(
        "Accepted, not applied (the agents choose their own sampling): "
        "the response says `null`"))] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1, description=(
        "Accepted, not applied, as `temperature`"))] | None = None
    max_tool_calls: Annotated[None, msgspec.Meta(description="Only `null`")] = None
    reasoning: Annotated[dict[str, None], msgspec.Meta(description=(
        "`effort` and `summary` only `null`"))] | None = None
    conversation: Annotated[None, msgspec.Meta(description=(
        "Only `null`: continue with `previous_response_id`"))] = None
    prompt: Annotated[None, msgspec.Meta(description="Only `null`: no prompt templates")] = None


class TaskEnvelope(msgspec.Struct):
    type: Literal["response"]
    input: ResponseRequest
    on_restart: lmsp_wire.OnRestart = "fail"


# -- principals: /tokens and /audit (acp_server.rest.admin, admin scope) -----------------
class TokenInfo(msgspec.Struct):
    """A stored token as listed (never its secret); times are ISO 8601 or null."""

    name: str
    id: str
    scopes: list[Literal["admin", "prompt", "read"]]
    rateClass: Literal["default", "unlimited"]
    createdAt: str
    createdBy: str
    expiresAt: str | None
    lastUsedAt: str | None
    revokedAt: str | None
    revokedBy: str | None


class TokenCreated(TokenInfo):
    """``POST /tokens``: the token itself, shown this once."""

    token: str


class TokenList(msgspec.Struct):
    tokens: list[TokenInfo]


class TokensRevoked(msgspec.Struct):
    revoked: list[TokenInfo]


class AuditEntry(msgspec.Struct):
    seq: int
    at: float
    principal: str
    action: str
    target: str | None
    client: str | None
    detail: dict[str, Any]


class AuditPage(msgspec.Struct):
    records: list[AuditEntry]
    nextCursor: str | None


class RateLimited(msgspec.Struct):
    """429 of the rate limits (``qwen serve``'s shape), with ``Retry-After``."""

    error: str
    code: Literal["rate_limit_exceeded"]
    tier: Literal["prompt", "mutation", "read"]
    retryAfterMs: int


class WhoAmI(msgspec.Struct):
    """``GET /whoami``: the caller's principal (``kind``: bootstrap, local or token)."""

    name: str
    kind: Literal["bootstrap", "local", "token"]
    scopes: list[Literal["admin", "prompt", "read"]]
    rateClass: Literal["default", "unlimited"]
    sharedSessions: bool
