"""The principals of one server: authentication, scopes, rate limits, ownership, the
audit log and revocation, as one object the guard and the doors share.

    async with open_principals(store, bootstrap=settings.token, limits=DEFAULT_TIERS,
                               share_sessions=False) as gate:
        caller = gate.caller(principal, client="10.0.0.7")   # what a request carries
        denial = caller.check(PROMPTING)         # None, or 403 (scope) / 429 (rate)
        caller.sees(session.owner)               # ownership: False → answer 404
        caller.sees_session(sid); caller.claim_session(sid)   # sessions (gate.sessions)
        caller.record("session.created", session_id, agent="reference")   # audit
        caller.denied(denial, "POST /tokens")    # the 403/429 answered: access.denied
        caller.not_owner(sid, "GET /session/ID/status")   # another's id, answered 404
        issued = await gate.create_token(caller, "ci", scopes=["read"])  # admin
        await gate.revoke_token(caller, "ci")    # refused within a second everywhere

Contracts:

* ``Caller`` is the request's principal with the server's policy: ``check(access)``
  answers a missing scope (403 ``forbidden``) before the rate limit (429
  ``rate_limit_exceeded``, the class's tier, ``retry_after`` seconds); only
  principals of the ``default`` rate class are limited (the bootstrap and local ones
  never are). ``sees(owner)`` is the ownership rule (``Principal.sees``, with
  ``--share-sessions``).
* ``denied`` and ``not_owner`` record a refusal in the audit log (``access.denied``,
  sampled per principal and reason: ``AuditLog.access_denied``); the doors call them
  where they answer a 403/429 or answer another principal's id as an unknown one.
* Revocation: revoking here drops the cached token and ends the token's open streams
  (``StreamRegistry``) at once; another instance learns it from the store's notice
  (PostgreSQL ``t``: ``tokens_changed`` re-reads those ids) or, failing that, from its
  cache lifetime (``ttl_s``); and while a token has streams open, its row is re-read
  every ``ttl_s`` (``run``), so they end within about a second of a revocation made
  anywhere (the CLI on the store, another instance, an expiry).
* ``run`` (started by ``open_principals``): the audit writer, and every ``ttl_s`` the
  count of live stored tokens (whether credentials are required), the re-check of
  tokens with open streams and the last-use times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from acp_server.principals import admin
from acp_server.principals.audit import AuditLog, prompt_text
from acp_server.principals.auth import TTL_S, Authenticator
from acp_server.principals.limits import FAILURE_TIERS, RateLimiter, Tier
from acp_server.principals.model import ADMIN, LOCAL, Access, Principal
from acp_server.principals.ownership import SessionOwners
from acp_server.principals.streams import LOCAL_STREAMS, StreamRegistry
from acp_server.principals.tokens import Issued
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.tokens import TokenRecord

log = logging.getLogger("acp_server.principals")
CALLERS_KEPT = 1024   # unlimited principals' callers kept, by (principal, client)


@dataclasses.dataclass(frozen=True, slots=True)
class Denial:
    """A request refused by the principals' policy; each door renders it in its shape."""

    status: int                    # 403 or 429
    code: str                      # forbidden | rate_limit_exceeded
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()
    extra: tuple[tuple[str, Any], ...] = ()   # extra body members (REST, LMSP, data)


def _scope_denial(scope: str) -> Denial:
    return Denial(403, "forbidden", f"This credential lacks the {scope!r} scope.",
                  extra=(("requiredScope", scope),))


SCOPE_DENIALS = {s: _scope_denial(s) for s in ("read", "prompt", "admin")}


def rate_denial(klass: str, tier: Tier, wait_s: float, now: float) -> Denial:
    """``qwen serve``'s 429: ``Retry-After`` and ``X-RateLimit-*``, body ``{error:
    "Rate limit exceeded", code: "rate_limit_exceeded", tier, retryAfterMs}``."""
    retry_ms = math.ceil(wait_s * 1000)
    headers = ((b"retry-after", str(max(1, math.ceil(wait_s))).encode()),
               (b"x-ratelimit-limit", str(int(tier.per_minute)).encode()),
               (b"x-ratelimit-remaining", b"0"),
               (b"x-ratelimit-reset", str(math.ceil(now + wait_s)).encode()))
    return Denial(429, "rate_limit_exceeded", "Rate limit exceeded", headers,
                  (("tier", klass), ("retryAfterMs", retry_ms)))


class Caller:
    """A request's principal, with the policy of the server it calls."""

    __slots__ = ("principal", "gate", "client", "charged", "_passed")

    def __init__(self, principal: Principal, gate: Gate, client: str | None = None) -> None:
        self.principal = principal
        self.gate = gate
        self.client = client
        self.charged: str | None = None   # the rate class ``check`` took a request of
        # The last Access an unlimited principal passed: its answer cannot change.
        self._passed: Access | None = None

    def uncharge(self) -> None:
        """Give back the request ``check`` counted: another instance serves (and
        counts) it (``acp_server.fleet``: a forward)."""
        if self.charged is not None:
            self.gate.limiter.give_back(self.principal.name, self.charged)
            self.charged = None

    @property
    def name(self) -> str:
        return self.principal.name

    def check(self, access: Access) -> Denial | None:
        if access is self._passed:
            return None
        principal = self.principal
        if access.scope is not None and not principal.has(access.scope):
            return SCOPE_DENIALS[access.scope]
        if not principal.limited:
            self._passed = access   # scopes and rate class are fixed: the same next time
            return None
        if access.klass is not None:
            limiter = self.gate.limiter
            wait = limiter.take(principal.name, access.klass)
            if wait is None:
                self.charged = access.klass
            else:
                tier = limiter.tier(access.klass)
                assert tier is not None
                return rate_denial(access.klass, tier, wait, self.gate.clock())
        return None

    def denied(self, denial: Denial, request: str) -> None:
        """``denial`` (from ``check``) is the request's answer: the ``access.denied``
        audit record (sampled), ``request`` naming what was asked (``POST /tokens``,
        an ``/acp`` method)."""
        extra = dict(denial.extra)
        if denial.code == "forbidden":
            self.gate.audit.access_denied(self.principal.name, client=self.client,
                                          reason="missing_scope", request=request,
                                          required_scope=extra.get("requiredScope"))
        else:
            self.gate.audit.access_denied(self.principal.name, client=self.client,
                                          reason="rate_limited", request=request,
                                          tier=extra.get("tier"))

    def not_owner(self, target: str, request: str) -> None:
        """``target`` exists and is another principal's: the request is answered as an
        unknown id (404, ``-32602``) and recorded as ``access.denied`` of reason
        ``not_owner`` (sampled); an id nobody owns records nothing."""
        self.gate.audit.access_denied(self.principal.name, client=self.client,
                                      reason="not_owner", request=request, target=target)

    def sees(self, owner: str | None) -> bool:
        return self.principal.sees(owner, shared=self.gate.share_sessions)

    def sees_session(self, session_id: str) -> bool:
        """Whether the session exists for it (``False``: the door answers 404)."""
        if self.gate.share_sessions or ADMIN in self.principal.scopes:
            return True   # whoever owns it (``Principal.sees``): no need to look
        return self.sees(self.gate.sessions.owner(session_id))

    def claim_session(self, session_id: str) -> bool:
        """It made (or restored) the session: its owner unless the session has one;
        whether it sees the session then (another's restore won a race: 404)."""
        return self.sees(self.gate.sessions.claim(session_id, self.principal.name))

    def record(self, action: str, target: str | None = None, **detail: Any) -> None:
        self.gate.audit.record(self.principal.name, action, target, client=self.client,
                               **detail)

    def prompt_accepted(self, session_id: str, prompt_id: str, prompt: Any, door: str) -> None:
        """The ``prompt.accepted`` record: the prompt's id, its text only with
        ``--audit-prompts``."""
        audit = self.gate.audit
        if audit.store is None:
            return
        detail = {"prompt_id": prompt_id, "door": door}
        if audit.prompts:
            detail["text"] = prompt_text(prompt)
        audit.append(self.principal.name, "prompt.accepted", session_id, self.client, detail)

    def setting_changed(self, session_id: str, setting: str, old: Any, new: Any,
                        door: str) -> None:
        """The ``setting.changed`` record of a setter the session's agent accepted
        (approval mode, model, config option): the setting (``mode``, ``model``,
        ``config:<configId>``), its value before as last known (``null``: the agent
        never said) and after."""
        self.record("setting.changed", session_id, setting=setting, old=old, new=new,
                    door=door)

    def permission_answered(self, session_id: str, request_id: str,
                            outcome: Mapping[str, Any], door: str) -> None:
        option = outcome.get("optionId")
        self.record("permission.answered", session_id, request_id=request_id,
                    outcome=outcome.get("outcome"), door=door,
                    **({"option_id": option} if isinstance(option, str) else {}))


class Gate:
    def __init__(self, authenticator: Authenticator, *, limiter: RateLimiter | None = None,
                 audit: AuditLog | None = None, share_sessions: bool = False,
                 clock: Callable[[], float] = time.time,
                 failures: RateLimiter | None = None) -> None:
        """``failures``: the failed credentials per client address not on loopback
        (``acp_server.http.policy``; default ``FAILURE_TIERS`` on the monotonic clock)."""
        self.authenticator = authenticator
        self.limiter = limiter or RateLimiter({})
        self.failures = failures if failures is not None else RateLimiter(FAILURE_TIERS)
        self.audit = audit or AuditLog(None)
        self.streams = StreamRegistry()
        self.sessions = SessionOwners()   # is_live set by the composition
        self.share_sessions = share_sessions
        self.clock = clock
        self._tg: anyio.abc.TaskGroup | None = None
        self._callers: dict[tuple[int, str | None], Caller] = {}

    def caller(self, principal: Principal, client: str | None = None) -> Caller:
        """The ``Caller`` of a request. An unlimited principal's is made once per
        (principal object, client) and shared (it holds no per-request state:
        ``charged`` is only ever set for a limited one, and ``_passed``, the last
        ``Access`` it passed, stays true for it: an unlimited principal is never rate
        limited and a ``Principal``'s scopes never change, it is frozen); at most
        ``CALLERS_KEPT`` kept (cleared when full)."""
        if principal.limited:
            return Caller(principal, self, client)
        key = (id(principal), client)   # a Principal's own hash is a tuple's: slower
        found = self._callers.get(key)
        if found is None or found.principal is not principal:
            found = Caller(principal, self, client)
            if len(self._callers) >= CALLERS_KEPT:
                self._callers.clear()
            self._callers[key] = found
        return found

    # -- revocation --------------------------------------------------------------------
    def tokens_changed(self, token_ids: list[str]) -> None:
        """Another instance created or revoked these tokens (a store notice)."""
        self.authenticator.forget(token_ids)
        if self._tg is not None:
            self._tg.start_soon(self._recheck, token_ids)

    async def _recheck(self, token_ids: list[str]) -> None:
        gone = await self.authenticator.revalidate(token_ids)
        if gone:
            ended = self.streams.end(gone)
            log.info("tokens revoked elsewhere: %s (%d open streams ended)", gone, ended)
        await self.authenticator.refresh()
        self._close_open_mode()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]
                  = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self.audit.run)
            tg.start_soon(self._watch)
            task_status.started()

    async def _watch(self) -> None:
        auth = self.authenticator
        while True:
            await anyio.sleep(auth.ttl_s)
            try:
                await auth.refresh()
                self._close_open_mode()
                held = self.streams.held()
                if held:
                    gone = await auth.revalidate(held)
                    if gone:
                        self.streams.end(gone)
                await auth.flush_used()
            except Exception:   # noqa: BLE001 - the next round tries again
                log.exception("principals: the periodic check failed")

    # -- administration ----------------------------------------------------------------
    @property
    def _store(self) -> admin.AdminStore:
        store = self.authenticator.store
        if store is None:
            raise StoreUnavailableError("no token store")
        return store  # type: ignore[return-value]

    async def create_token(self, by: Caller, name: str, *, scopes: list[str] = (),  # type: ignore[assignment]
                           expires: str | None = None, rate_class: str = "default") -> Issued:
        issued = await admin.create_token(self._store, self.audit, by=by.name, name=name,
                                          scopes=scopes, expires=expires,
                                          rate_class=rate_class, client=by.client)
        self.authenticator.forget([issued.record.id])
        self.authenticator.stored_tokens = True
        self._close_open_mode()
        return issued

    def _close_open_mode(self) -> None:
        """A credential is required now: the ``local`` principal's streams (opened
        while none was) end, as a revoked token's."""
        if self.authenticator.required and self.streams.count(LOCAL_STREAMS):
            ended = self.streams.end([LOCAL_STREAMS])
            log.info("a credential is required now: %d local streams ended", ended)

    async def revoke_token(self, by: Caller, name: str) -> list[TokenRecord]:
        revoked = await admin.revoke_token(self._store, self.audit, by=by.name, name=name,
                                           client=by.client)
        ids = [r.id for r in revoked]
        self.authenticator.forget(ids)
        self.streams.end(ids)
        await self.authenticator.refresh()
        return revoked

    async def list_tokens(self, *, include_revoked: bool = False) -> list[TokenRecord]:
        await self.authenticator.flush_used(force=True)
        return await self._store.list_tokens(include_revoked=include_revoked,
                                             now=self.audit.clock())


LOCAL_GATE = Gate(Authenticator(None))
# What a request the guard did not see carries (a door composed without the front
# layer, in tests): the local principal, no audit, no limits.
LOCAL_CALLER = Caller(LOCAL, LOCAL_GATE)


@contextlib.asynccontextmanager
async def open_principals(store: Any, *, bootstrap: str | None = None,
                          limits: Mapping[str, Tier] | None = None,
                          share_sessions: bool = False, audit_prompts: bool = False,
                          audit_retention_s: float = 30 * 86400, ttl_s: float = TTL_S,
                          clock: Callable[[], float] = time.time,
                          monotonic: Callable[[], float] = time.monotonic
                          ) -> AsyncIterator[Gate]:
    """The ``Gate`` over ``store`` (an open store with ``TokenOps`` and ``AuditOps``),
    its background running for the block; leaving writes what the audit log and the
    last-use times still hold (as far as the store allows)."""
    authenticator = Authenticator(store, bootstrap=bootstrap, ttl_s=ttl_s, clock=clock,
                                  monotonic=monotonic)
    gate = Gate(authenticator, limiter=RateLimiter(limits or {}, clock=monotonic),
                audit=AuditLog(store, prompts=audit_prompts, retention_s=audit_retention_s,
                               clock=clock),
                share_sessions=share_sessions, clock=clock)
    await authenticator.refresh()
    store.on_tokens_changed = gate.tokens_changed
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(gate.run)
            try:
                yield gate
            finally:
                tg.cancel_scope.cancel()
    finally:
        store.on_tokens_changed = None
        with anyio.move_on_after(5, shield=True):
            try:
                await gate.audit.flush()
                await authenticator.flush_used(force=True)
            except Exception as exc:   # noqa: BLE001 - the store is going away anyway
                log.warning("principals: records not written at shutdown: %s", exc)


__all__ = ["Caller", "Denial", "Gate", "LOCAL_CALLER", "LOCAL_GATE", "SCOPE_DENIALS",
           "open_principals", "rate_denial"]
