"""Wire types of the REST surface: request bodies, response bodies, header checks.

    body = await read_json(request, PromptBody, limit=config.max_body_bytes)  # 400 / 413
    return json_response(202, PromptAccepted(promptId=..., lastEventId=3, eventEpoch=...))

Contracts:

* Bodies are read up to ``limit`` bytes (``RestConfig.max_body_bytes``) (a ``Content-Length`` above it is
  refused before reading): over the cap → 413. An empty body is ``{}`` (Express's
  ``json()`` does the same). Malformed JSON → 400 ``{"error": "Invalid JSON in
  request body"}``; well-formed JSON of the wrong shape → 400 ``invalid_request_body``.
* Decoders and encoders are built once, at import.
* Fields whose bad values have a peer-specific error code are typed ``Any`` here and
  checked by the route, so the route can answer with that code.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType
from starlette.requests import Request

from acp_server.http import body
from acp_server.http.headers import DECIMAL
from acp_server.rest.errors import RestError, bad_request
from bridge import status
from bridge.wire import iso  # noqa: F401 - the one time formatter, for the routes

T = TypeVar("T")

CLIENT_ID_HEADER = "x-qwen-client-id"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
PROMPT_ID = _CLIENT_ID   # a prompt's own id (``prompt_id``): it appears in paths
MIN_MAX_QUEUED, MAX_MAX_QUEUED = 16, 2048


# -- request bodies ---------------------------------------------------------------------
class CreateSessionBody(msgspec.Struct):
    cwd: str | None = None
    sessionScope: Any = None
    sessionId: Any = None
    approvalMode: Any = UNSET   # checked (``check_approval_mode``), then not used
    agent: str | None = None   # an agent profile name (default: the server's default agent)
    meta: Any = msgspec.field(default=None, name="_meta")   # {"acp-server/origin": label}


class PromptBody(msgspec.Struct):
    prompt: Any = None
    deadlineMs: Any = None
    promptId: Any = None   # the client's id for the prompt (``prompt_id``): sent again, safe


class PermissionVoteBody(msgspec.Struct):
    outcome: Any = None


class RestoreBody(msgspec.Struct):
    cwd: str | None = None
    agent: str | None = None
    approvalMode: Any = UNSET   # as CreateSessionBody's


class EmptyBody(msgspec.Struct):
    """Routes whose body is optional and ignored (cancel, heartbeat)."""


class BranchBody(msgspec.Struct):
    """``POST /session/{id}/branch``: ``name`` is taken and not kept; ``atRecordId``
    names a record of the peer's transcript to branch at (a branch point), which this
    server does not keep: present, it is refused as the peer refuses a stale one."""
    name: Any = None
    atRecordId: Any = msgspec.UNSET


class ApprovalModeBody(msgspec.Struct):
    """``POST /session/{id}/approval-mode`` (qwen's): ``mode`` one of the agent's mode
    ids; ``persist`` and ``planMode`` checked as qwen checks them, then not used."""
    mode: Any = None
    persist: Any = UNSET
    planMode: Any = UNSET


class ModelBody(msgspec.Struct):
    """``POST /session/{id}/model`` (qwen's)."""
    modelId: Any = None


class ConfigOptionBody(msgspec.Struct):
    """``POST /session/{id}/config-option`` (qwen's): ``configId`` one of the agent's
    options (qwen's ``reasoning_effort`` stands for its ``thought_level`` one), ``value``
    a non-empty string (or a boolean, for an ACP boolean option); ``persist`` checked,
    then not used."""
    configId: Any = None
    value: Any = None
    persist: Any = UNSET


# -- response bodies ----------------------------------------------------------------------
class ApprovalModeSet(msgspec.Struct):
    """qwen's ``DaemonApprovalModeResult``: ``previous`` the mode before (the agent's
    current mode as last known); ``persisted`` always ``false`` (no settings are written)."""
    sessionId: str
    mode: str
    previous: str
    persisted: bool


class ConfigOptionSet(msgspec.Struct):
    """qwen's ``DaemonSessionConfigOptionResult``: the agent's options after the change."""
    configOptions: list[Any]
    persisted: bool


class SessionCreated(msgspec.Struct, omit_defaults=True):
    sessionId: str
    workspaceCwd: str
    attached: bool
    clientId: str
    createdAt: str
    eventEpoch: str | None = None
    # an attach only (``attached``), as the peer's: a prompt is queued or running there
    # (its SDK's ``DaemonSessionClient.createOrAttach`` keeps it); never ``true``
    hasRunningBackgroundTasks: bool | UnsetType = UNSET
    hasActivePrompt: bool | UnsetType = UNSET


class SessionRestored(msgspec.Struct):
    """``/resume``: the peer's fields in the peer's order; no history."""

    sessionId: str
    workspaceCwd: str
    attached: bool
    clientId: str
    createdAt: str
    state: dict[str, Any]   # the agent's session state (modes, configOptions, models, ...)
    hasRunningBackgroundTasks: bool
    hasActivePrompt: bool
    lastEventId: int
    eventEpoch: str


class PromptTerminal(msgspec.Struct, omit_defaults=True, kw_only=True):
    """How one prompt ended: ``terminal`` ``completed`` | ``cancelled`` | ``failed``."""

    v: int   # always 1
    promptId: str
    terminal: str
    stopReason: str | None = None
    errorCode: str | None = None
    at: int

    @classmethod
    def of(cls, terminal: status.PromptTerminal) -> PromptTerminal:
        return cls(v=1, promptId=terminal.prompt_id, terminal=terminal.terminal,
                   stopReason=terminal.stop_reason, errorCode=terminal.error_code,
                   at=terminal.at)


class SessionLoaded(msgspec.Struct):
    """``/load``: ``/resume``'s fields plus the history; ``lastEventId`` is the id of
    the last event in ``compactedReplay`` + ``liveJournal`` (subscribe from it)."""

    sessionId: str
    workspaceCwd: str
    attached: bool
    clientId: str
    createdAt: str
    state: dict[str, Any]
    hasRunningBackgroundTasks: bool
    hasActivePrompt: bool
    compactedReplay: list[msgspec.Raw]   # bus events, adjacent agent_message_chunks joined
    liveJournal: list[msgspec.Raw]       # the running prompt's events
    lastEventId: int
    eventEpoch: str
    promptTerminals: list[PromptTerminal]


class ForkedFrom(msgspec.Struct):
    sessionId: str


class SessionBranched(msgspec.Struct):
    sessionId: str
    workspaceCwd: str
    attached: bool
    clientId: str
    createdAt: str
    forkedFrom: ForkedFrom
    lastEventId: int
    eventEpoch: str


class PromptAccepted(msgspec.Struct):
    promptId: str
    lastEventId: int
    eventEpoch: str


class Heartbeat(msgspec.Struct, omit_defaults=True):
    """``lastSeenAt``: epoch milliseconds, as the peer's (``Date.now()``)."""
    sessionId: str
    lastSeenAt: int
    clientId: str | None = None


class CreateTokenBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /tokens`` (admin)."""

    name: str
    scopes: list[str] = []
    expires: str | None = None       # 30d, 12h, seconds
    rateClass: str = "default"       # default | unlimited


# -- the answers built from the bridge's state (capabilities, health, status, listings) --
class JournalRefusal(msgspec.Struct):
    """The last session journal record the store refused (``JournalHealth``)."""

    sessionId: str
    kind: str     # session | prompt | terminal | event | end | marker
    reason: str   # the database's message, its first line (cut)
    at: float     # epoch seconds


class JournalHealth(msgspec.Struct, omit_defaults=True):
    """The durable session journal in `GET /health?deep=1`: the records the store
    refused for good since start (not retried; see docs/operations.md)."""

    recordsRefused: int
    lastRefused: JournalRefusal | UnsetType = UNSET


class StoreReport(msgspec.Struct, omit_defaults=True):
    """The durable store in `GET /health?deep=1`: `ok`, or `down` with why and since when
    (ISO 8601 UTC with milliseconds, as every time the REST door writes)."""

    status: Literal["ok", "down"]
    reason: str | UnsetType = UNSET
    downSince: str | UnsetType = UNSET


class Health(msgspec.Struct, omit_defaults=True):
    """`GET /health?deep=1` (a plain `/health` answers `{"status": "ok"}`)."""

    status: str
    store: StoreReport | UnsetType = UNSET   # when composed
    journal: JournalHealth | UnsetType = UNSET   # with a durable session journal
    workspaceCount: int | UnsetType = UNSET
    sessions: int | UnsetType = UNSET
    pendingPermissions: int | UnsetType = UNSET
    activePrompts: int | UnsetType = UNSET
    pendingPrompts: int | UnsetType = UNSET
    queuedPrompts: int | UnsetType = UNSET
    connectedClients: int | UnsetType = UNSET
    uptimeMs: int | UnsetType = UNSET


class RestLimits(msgspec.Struct):
    maxPendingPromptsPerSession: int | None
    maxSessionsPerWorkspace: int | None
    # what @qwen-code/sdk waits on a load or resume, plus its 10 s (else 70 s in all)
    sessionRestoreTimeoutMs: int


class AgentsInfo(msgspec.Struct):
    default: str
    available: list[str]


class WorkspaceInfo(msgspec.Struct):
    """The workspace this daemon serves; ``id`` names it in ``/workspace/{id}/…``."""

    id: str
    cwd: str
    primary: bool


class RestCapabilities(msgspec.Struct):
    v: int
    protocolVersions: dict[str, Any]
    acpServerVersion: str
    mode: str
    features: list[str]
    workspaceCwd: str
    transports: list[str]
    policy: dict[str, str]
    limits: RestLimits
    agents: AgentsInfo
    workspaces: list[WorkspaceInfo]


class AgentStatus(msgspec.Struct):
    """One agent of ``/daemon/status``: its process state, its live sessions, and the
    ``agentInfo`` of its ``initialize`` answer (``null`` before its first start)."""

    name: str
    default: bool
    state: Literal["not_started", "running", "exited"]
    sessions: int
    agentInfo: dict[str, Any] | None


class DaemonStatus(msgspec.Struct):
    v: int
    detail: str
    generatedAt: str
    status: str
    issues: list[Any]
    daemon: dict[str, Any]
    security: dict[str, Any]
    limits: dict[str, Any]
    agents: list[AgentStatus]
    capabilities: dict[str, Any]
    runtime: dict[str, Any]
    # ``?detail=full`` only: {"sessions": [...]}, this instance's live sessions
    full: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class TurnErrorInfo(msgspec.Struct, omit_defaults=True):
    """How the session's last turn that ran failed (its ``turn_error``)."""

    message: str
    code: str
    errorKind: str | UnsetType = UNSET


class InteractionOption(msgspec.Struct, omit_defaults=True):
    optionId: str
    label: str | UnsetType = UNSET   # the option's ``name``
    kind: str | UnsetType = UNSET


class PendingInteraction(msgspec.Struct, omit_defaults=True):
    """An open permission request as qwen serve lists it (``rest.interactions``)."""

    requestId: str
    kind: Literal["permission", "user_question"]
    createdAt: str
    options: list[InteractionOption]
    action: Annotated[dict[str, Any], msgspec.Meta(
        description="`permission`: the tool call's `{type, title, content, locations, "
                    "input}`, each when present")] | UnsetType = UNSET
    title: str | UnsetType = UNSET                      # ``user_question``
    questions: list[dict[str, Any]] | UnsetType = UNSET   # ``user_question``


class SessionStatus(msgspec.Struct):
    sessionId: str
    workspaceCwd: str
    createdAt: str
    clientCount: int
    hasActivePrompt: bool
    activePromptId: str | None
    pendingPrompts: int
    queuedPrompts: int
    isWaitingForPermission: bool
    pendingInteractionCount: int
    subscribers: int
    lastEventId: int
    eventEpoch: str
    isWaitingForUserQuestion: bool
    pendingInteractions: list[PendingInteraction]
    activeWorkState: Annotated[Literal["active", "idle", "unknown", "unsupported"], msgspec.Meta(
        description="qwen serve's: `active` while the session has a prompt queued or "
                    "running; else `unsupported` (an ACP agent does not report work of its "
                    "own between turns, so `idle` and `unknown` are never answered)")]
    hasRunningBackgroundTasks: bool
    hasTurnError: Annotated[bool, msgspec.Meta(
        description="The last prompt that ran ended in `turn_error` (`turnError` says how); "
                    "false again once the next prompt starts running")]
    updatedAt: Annotated[str, msgspec.Meta(
        description="When the last prompt that ran ended (strictly increasing); absent "
                    "before the first, and after a restart. The listing's is the last "
                    "activity and always there")] | UnsetType = UNSET
    turnError: TurnErrorInfo | UnsetType = UNSET


class SessionSummary(SessionStatus, kw_only=True):
    """An item of ``GET /workspace/{workspace}/sessions``: the status and more."""

    updatedAt: str
    agent: str
    maxPendingPrompts: int | None
    activePromptText: str | None
    origin: Annotated[str, msgspec.Meta(
        description="Who made it (`_meta[\"acp-server/origin\"]` at creation; `lmsp` for "
                    "LMSP tasks); null for a person's session")] | None
    owner: Annotated[str, msgspec.Meta(
        description="The principal that made it (`bootstrap`, `local` or a token's name); "
                    "null when this instance does not know")] | None = None
    displayName: Annotated[str, msgspec.Meta(
        description="qwen serve's name of a session without a title: its first prompt's "
                    "first text, cut to 200 code points and `...`; absent before its first "
                    "prompt with text (a session its agent loaded from the agent's own "
                    "store is named by its first prompt here)")] | UnsetType = UNSET
    isArchived: Annotated[bool, msgspec.Meta(
        description="Always false: a live session is never archived (as qwen's live "
                    "listing says)")] = False


class SessionPage(msgspec.Struct, omit_defaults=True):
    sessions: list[SessionSummary]
    nextCursor: Annotated[str, msgspec.Meta(description="The `cursor` of the next page; "
                                            "absent on the last one")] | UnsetType = UNSET


class EndedSession(msgspec.Struct):
    """An item of ``GET /workspace/{workspace}/ended-sessions``: a closed session the
    journal keeps (its agent died, the idle timeout closed it), which ``/load`` or
    ``/resume`` brings back."""

    sessionId: str
    workspaceCwd: str
    agent: str
    createdAt: str
    endedAt: Annotated[str, msgspec.Meta(description="When it closed (ISO 8601, UTC)")]
    origin: str | None
    owner: Annotated[str, msgspec.Meta(
        description="The principal that made it; null when the journal has none")] | None
    forkedFrom: str | None


class EndedSessionPage(msgspec.Struct, omit_defaults=True):
    sessions: list[EndedSession]
    nextCursor: Annotated[str, msgspec.Meta(description="The `cursor` of the next page; "
                                            "absent on the last one")] | UnsetType = UNSET


class PendingPrompt(msgspec.Struct):
    promptId: str
    queuedAt: int
    text: str
    state: Literal["queued", "running"]


class PendingPrompts(msgspec.Struct):
    pendingPrompts: list[PendingPrompt]


class PendingPromptRemoved(msgspec.Struct):
    """``DELETE /session/{id}/pending-prompts/{promptId}``'s answer, as the peer's:
    ``removed`` is ``False`` when the session has no such pending prompt."""
    removed: bool


class EmptyObject(msgspec.Struct):
    """An empty JSON object."""



_decoders: dict[type, msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (CreateSessionBody, PromptBody, PermissionVoteBody, RestoreBody, EmptyBody,
              BranchBody, CreateTokenBody, ApprovalModeBody, ModelBody, ConfigOptionBody)
}


# -- body reading -------------------------------------------------------------------------


def too_large(limit: int) -> RestError:
    return RestError(413, {"error": "Request body too large", "code": "payload_too_large",
                           "limit": limit})


async def read_body(request: Request, *, limit: int) -> bytes:
    """The raw body, at most ``limit`` bytes (else 413)."""
    try:
        return await body.read_body(request, limit=limit)
    except body.BodyTooLarge:
        raise too_large(limit) from None


def decode(raw: bytes, type_: type[T]) -> T:
    if not raw.strip():
        raw = b"{}"
    try:
        return body.decode_json(raw, _decoders[type_])
    except body.BodyError as exc:   # too deep / too many containers, before msgspec runs
        raise bad_request(exc.message, "invalid_json") from None
    except msgspec.ValidationError as exc:
        raise bad_request(f"Invalid request body: {exc}", "invalid_request_body") from None
    except msgspec.DecodeError:
        raise RestError(400, {"error": "Invalid JSON in request body"}) from None


async def read_json(request: Request, type_: type[T], *, limit: int) -> T:
    return decode(await read_body(request, limit=limit), type_)


# -- headers and small values -------------------------------------------------------------
def client_id(request: Request) -> str | None:
    """``X-Qwen-Client-Id`` when present, validated as the peer does."""
    value = request.headers.get(CLIENT_ID_HEADER)
    if value is None:
        return None
    if not _CLIENT_ID.fullmatch(value):
        raise bad_request("`X-Qwen-Client-Id` must be a non-empty token of 128 characters or fewer",
                          "invalid_client_id")
    return value


def prompt_id(value: Any) -> str | None:
    """A prompt body's ``promptId``: ``None`` when absent, else a token of 1 to 128
    characters (the client id's alphabet: it appears in paths), else 400
    ``invalid_prompt_id``."""
    if value is None:
        return None
    if not isinstance(value, str) or not PROMPT_ID.fullmatch(value):
        raise bad_request("`promptId` must be a non-empty token of 128 characters or fewer "
                          "(letters, digits, '.', '_', ':', '-')", "invalid_prompt_id")
    return value


def max_queued(request: Request) -> int | None:
    value = request.query_params.get("maxQueued")
    if value is None:
        return None
    if not DECIMAL.fullmatch(value) or not MIN_MAX_QUEUED <= int(value) <= MAX_MAX_QUEUED:
        raise bad_request(
            f"`maxQueued` must be an integer in [{MIN_MAX_QUEUED}, {MAX_MAX_QUEUED}]",
            "invalid_max_queued")
    return int(value)


def is_uuid(value: Any) -> bool:
    """An RFC 4122 UUID of version 1 to 5."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return False
    return parsed.variant == uuid.RFC_4122 and parsed.version in (1, 2, 3, 4, 5) \
        and str(parsed) == value.lower()


# qwen serve's approval modes (its ``APPROVAL_MODES``, in its order, which its 400 lists)
APPROVAL_MODES = ("plan", "default", "auto-edit", "auto", "yolo")


def check_approval_mode(value: Any) -> None:
    """``approvalMode`` of a create, load or resume body: absent, or one of qwen's
    modes; anything else (``null`` too) is its 400 ``invalid_approval_mode`` with the
    ``allowed`` modes. A known mode is not used: an ACP agent's modes are its own."""
    if value is not UNSET and value not in APPROVAL_MODES:
        raise bad_request("`approvalMode` must be a known approval mode when provided",
                          "invalid_approval_mode", allowed=list(APPROVAL_MODES))
