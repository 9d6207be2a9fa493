"""Wire types the client decodes and encodes (msgspec Structs, snake_case in Python,
camelCase on the wire). Decoders are built once, at import.

    accepted = decode(PROMPT_ACCEPTED, response.content)   # PromptAccepted(prompt_id=…, …)
    event = decode(EVENT, sse.data)                        # DaemonEvent(type="turn_complete", …)

Contracts: unknown fields are ignored (the server may add fields); a body of the wrong
shape, or JSON nested deeper than the decoder recurses, raises ``DaemonProtocolError``
from ``decode``. Request types encode only the
fields that are set. ``path_segment`` puts an id in a path as one segment: ``/``, ``?``,
``%`` are escaped and ``.``/``..`` too (httpx would resolve them to the parent path).
"""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import quote

import msgspec

from acp_server.client import errors
from acp_server.client.errors import DaemonProtocolError

T = TypeVar("T")


def path_segment(value: str) -> str:
    """``value`` as one path segment, naming no other path (module contract)."""
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


# -- responses ------------------------------------------------------------------------------
class PromptAccepted(msgspec.Struct, rename="camel"):
    """The 202 envelope of ``POST /session/{id}/prompt``."""

    prompt_id: str
    last_event_id: int | None = None
    event_epoch: str | None = None


class PromptResult(msgspec.Struct, rename="camel"):
    """How a turn ended: a blocking 200 body, or a ``turn_complete``."""

    stop_reason: str = "end_turn"
    prompt_id: str | None = None


class ForkedFrom(msgspec.Struct, rename="camel"):
    session_id: str


class SessionInfo(msgspec.Struct, rename="camel"):
    """``POST /session``, ``/load``, ``/resume`` and ``/branch`` answers."""

    session_id: str
    workspace_cwd: str | None = None
    attached: bool = False
    client_id: str | None = None
    created_at: str | None = None
    event_epoch: str | None = None
    last_event_id: int | None = None
    has_active_prompt: bool | None = None
    forked_from: ForkedFrom | None = None


class Limits(msgspec.Struct, rename="camel"):
    max_pending_prompts_per_session: int | None = None
    max_sessions_per_workspace: int | None = None
    max_total_sessions: int | None = None
    session_restore_timeout_ms: int | None = None


class Capabilities(msgspec.Struct, rename="camel"):
    v: int = 1
    mode: str | None = None
    features: list[str] = msgspec.field(default_factory=list)
    workspace_cwd: str | None = None
    transports: list[str] = msgspec.field(default_factory=list)
    policy: dict[str, Any] = msgspec.field(default_factory=dict)
    limits: Limits = msgspec.field(default_factory=Limits)
    protocol_versions: dict[str, Any] = msgspec.field(default_factory=dict)
    workspaces: list[dict[str, Any]] = msgspec.field(default_factory=list)   # {id, cwd, …}


class DaemonEvent(msgspec.Struct, rename="camel"):
    """One SSE frame's JSON. ``id`` is ``None`` on synthetic frames
    (``replay_complete``, ``state_resync_required``, ``slow_client_warning``,
    ``client_evicted``)."""

    type: str
    data: Any = None
    id: int | None = None
    v: int = 1
    prompt_id: str | None = None
    originator_client_id: str | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class PendingPrompts(msgspec.Struct, rename="camel"):
    pending_prompts: list[dict[str, Any]] = msgspec.field(default_factory=list)


class PendingPromptRemoved(msgspec.Struct):
    """``DELETE /session/{id}/pending-prompts/{promptId}``'s 200."""

    removed: bool


# -- requests -------------------------------------------------------------------------------
class CreateSessionRequest(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Body of ``POST /session``; ``workspace_cwd`` is sent as ``cwd``."""

    workspace_cwd: str | None = msgspec.field(default=None, name="cwd")
    session_id: str | None = None
    session_scope: str | None = None
    approval_mode: str | None = None
    model_service_id: str | None = None
    agent: str | None = None   # an acp-server agent profile name


class RestoreRequest(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Body of ``POST /session/{id}/load`` and ``/resume``."""

    workspace_cwd: str | None = msgspec.field(default=None, name="cwd")
    agent: str | None = None


class PromptRequest(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Body of ``POST /session/{id}/prompt``: ACP content blocks."""

    prompt: list[dict[str, Any]]
    deadline_ms: int | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")
    # the prompt's own id (an acp-server extension): sent again under it, it runs once
    prompt_id: str | None = None

    @classmethod
    def text(cls, text: str, **fields: Any) -> PromptRequest:
        return cls(prompt=[{"type": "text", "text": text}], **fields)


# -- codecs ----------------------------------------------------------------------------------
PROMPT_ACCEPTED = msgspec.json.Decoder(PromptAccepted)
PROMPT_RESULT = msgspec.json.Decoder(PromptResult)
SESSION_INFO = msgspec.json.Decoder(SessionInfo)
CAPABILITIES = msgspec.json.Decoder(Capabilities)
EVENT = msgspec.json.Decoder(DaemonEvent)
PENDING_PROMPTS = msgspec.json.Decoder(PendingPrompts)
PENDING_PROMPT_REMOVED = msgspec.json.Decoder(PendingPromptRemoved)
ANY = msgspec.json.Decoder()
ENCODER = msgspec.json.Encoder()


def decode(decoder: msgspec.json.Decoder[T], data: bytes | str) -> T:
    """Decode or raise ``DaemonProtocolError`` naming what was wrong."""
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DaemonProtocolError(f"Malformed daemon answer: {exc}") from exc
    except RecursionError as exc:   # msgspec's depth limit: not a DecodeError
        raise DaemonProtocolError("Malformed daemon answer: JSON nested too deep") from exc


def decode_body(content: bytes) -> Any:
    """An error body: its JSON when it is JSON, else its text."""
    return errors.decode_body(content)
