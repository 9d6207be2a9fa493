"""``acp-server token`` and ``acp-server audit``: the principals, on the store or over HTTP.

    $ acp-server token create ci --scope prompt --scope read --expires 30d
    acps_9f2c4d1e0b7a6c35_Qm9v…                      (stdout: the token, shown once)
    $ acp-server token list                            # NAME ID SCOPES CREATED LAST USED …
    $ acp-server token revoke ci                       # refused everywhere within a second
    $ acp-server audit --principal ci --since 2026-12-01
    $ acp-server token list --url https://team.box:4170 --token "$ADMIN"   # over HTTP

Contracts:

* Without ``--url`` the command works on the store ``serve`` uses, found the same way:
  ``--store`` (``sqlite:///PATH`` or ``postgresql://…``), else ``lmsp.sqlite3`` in
  ``--state-dir``, else in the workspace's state folder (``--workspace``, default the
  current folder); it says which on stderr. A ``--store`` of another kind, a
  ``--workspace`` that is no folder, or a state folder that cannot be made, is one line and exit status 2, nothing made (a
  store for a folder no server serves would hold tokens no server sees). Several instances on one PostgreSQL store
  see a change within a second (a notice; SQLite: the servers' cache lifetime). The
  audit log records the change under ``cli:<user>``.
* With ``--url`` it calls the server's ``/tokens`` and ``/audit`` routes with
  ``--token`` (default ``$ACP_SERVER_TOKEN``), which must hold the ``admin`` scope; a
  401 or 403 is one clear line and exit status 1.
* ``token create`` prints the token alone on stdout (``--json``: an object with it)
  and never again; the first of a store (revoked ones count) adds a line on stderr:
  from then on its servers need a credential from loopback clients too; ``list`` never shows a secret. Exit status: 0 done, 1 refused (a
  name taken, no such token, the server said no), 2 invalid arguments, 141 when the
  reader of stdout goes before all is printed (``| head -1``: nothing said, as
  ``acp-server tasks``; ``cli_run.printed``). A ``create`` or ``revoke`` is done by then.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any, TextIO

import anyio
import httpx

from acp_server.bearer import UnsendableTokenError, bearer_token
from acp_server.client.cli_run import printed
from acp_server.client.errors import redact_address
from acp_server.principals.admin import create_token, iso, revoke_token, token_json
from acp_server.principals.audit import AuditLog, as_json
from acp_server.principals.model import DEFAULT_RATE, SCOPES, UNLIMITED, \
    InvalidPrincipalError, check_name
from acp_server.rest.admin import audit_query
from acp_server.rest.errors import RestError
from acp_server.settings import TOKEN_ENV, default_state_dir
from acp_server.store import default_url, prepare_state_dir
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.postgres import PostgresTaskStore, is_postgres_url
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.tokens import TokenNameTakenError
from bridge.loggable import loggable


class Refused(Exception):
    """Exit status 1 with this message."""


def _where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="a running server's base URL: work over HTTP with an "
                                      "admin token instead of on the store")
    parser.add_argument("--token", default=None,
                        help=f"with --url: an admin bearer token (default ${TOKEN_ENV})")
    parser.add_argument("--store", metavar="URL", help="the store, as serve --store")
    parser.add_argument("--state-dir", help="the state folder, as serve --state-dir")
    parser.add_argument("--workspace", default=None,
                        help="the workspace whose state folder holds the store (default: "
                             "the current folder)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token; prints it once")
    create.add_argument("name", help="the principal: 1-64 letters, digits, . _ @ -")
    create.add_argument("--scope", action="append", default=[], choices=SCOPES,
                        help="read, prompt or admin (repeatable; default: prompt and read)")
    create.add_argument("--expires", metavar="DURATION",
                        help="expire after this long (30d, 12h, 90m, seconds)")
    create.add_argument("--unlimited", action="store_true",
                        help="not subject to the server's --rate-limit-* tiers")
    _where(create)
    listing = actions.add_parser("list", help="names, scopes, created, last used, expiry")
    listing.add_argument("--all", action="store_true", help="revoked tokens too")
    _where(listing)
    revoke = actions.add_parser("revoke", help="revoke the live token of a name")
    revoke.add_argument("name")
    _where(revoke)


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--principal", help="only this principal's records")
    parser.add_argument("--action", help="only this action (e.g. session.created)")
    parser.add_argument("--since", help="from this time (ISO 8601 or epoch seconds)")
    parser.add_argument("--until", help="before this time (ISO 8601 or epoch seconds)")
    parser.add_argument("--after", default="0", help="after this record (a seq)")
    parser.add_argument("--limit", default="100", help="at most this many records (1-1000)")
    _where(parser)


# -- the store ---------------------------------------------------------------------------
FIRST_TOKEN_NOTE = ("acp-server: the first token of this store: from now on its servers "
                    "need a credential from every client, loopback included (the console, "
                    "acp-server prompt: --token or $ACP_SERVER_TOKEN)")


class BadFolder(ValueError):
    """A store, workspace or state folder the command cannot use; the message says which."""


def store_url(args: argparse.Namespace) -> str:
    if args.store:
        if not args.store.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise BadFolder(f"Invalid store: {redact_address(args.store)!r}. "   # serve's words
                            "Must be sqlite:///PATH or postgresql://….")
        return str(args.store)
    if args.state_dir:
        state_dir = os.path.abspath(args.state_dir)
    else:
        workspace = args.workspace or os.getcwd()
        if not os.path.isdir(workspace):   # serve's own check and words
            raise BadFolder(f"Invalid workspace: {workspace!r}. Must be an existing directory.")
        state_dir = default_state_dir(workspace)
    try:
        prepare_state_dir(state_dir)
    except OSError as exc:
        raise BadFolder(f"Invalid state-dir: {state_dir!r}: cannot create it "
                        f"({exc.strerror or exc}). Pass --state-dir with a folder this user "
                        "may create or write.") from None
    return default_url(state_dir)


@contextlib.asynccontextmanager
async def open_store(url: str) -> AsyncIterator[Any]:
    """The store at ``url``, opened as an operator's tool: no instance identity, no
    recovery (a server's start does that)."""
    store = PostgresTaskStore(url) if is_postgres_url(url) else SqliteTaskStore(url)
    async with store:
        yield store


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:   # noqa: BLE001 - no user name: still an operator
        return "cli"


async def _on_store(args: argparse.Namespace) -> Any:
    url = store_url(args)
    shown = url.split("@")[-1] if is_postgres_url(url) else url   # no password on screen
    print(f"store: {shown}", file=sys.stderr)
    outcome: Any = None
    async with open_store(url) as store:
        audit = AuditLog(store)
        try:
            outcome = await _store_command(args, store, audit)
        except (InvalidPrincipalError, Refused) as exc:   # raised past the store's tasks
            outcome = exc
        await audit.flush()
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def _store_command(args: argparse.Namespace, store: Any, audit: AuditLog) -> Any:
    if args.command == "audit":
        try:
            query = audit_query(_audit_params(args))
        except RestError as exc:
            raise InvalidPrincipalError(exc.body["error"]) from None
        return {"records": as_json(await store.read_audit(query))}
    if args.token_command == "create":
        first = not await store.list_tokens(include_revoked=True, now=audit.clock())
        try:
            issued = await create_token(store, audit, by=_actor(), name=args.name,
                                        scopes=args.scope, expires=args.expires,
                                        rate_class=UNLIMITED if args.unlimited else DEFAULT_RATE)
        except TokenNameTakenError as exc:
            raise Refused(str(exc)) from None
        if first:   # security.md: no longer every local process's
            print(FIRST_TOKEN_NOTE, file=sys.stderr)
        return {"token": issued.token, **token_json(issued.record)}
    if args.token_command == "list":
        return {"tokens": [token_json(r) for r in
                           await store.list_tokens(include_revoked=args.all,
                                                   now=audit.clock())]}
    revoked = await revoke_token(store, audit, by=_actor(), name=args.name)
    if not revoked:
        raise Refused(f"No live token named {args.name!r}.")
    return {"revoked": [token_json(r) for r in revoked]}


def _audit_params(args: argparse.Namespace) -> dict[str, str]:
    params = {"principal": args.principal, "action": args.action, "since": args.since,
              "until": args.until, "after": args.after, "limit": args.limit}
    return {k: v for k, v in params.items() if v}


# -- over HTTP ---------------------------------------------------------------------------
def _authorization(args: argparse.Namespace) -> dict[str, str]:
    """The bearer header; a token no header can carry (a control character, CR LF,
    non-ASCII) is refused here without showing it (httpx's own error quoted it, or
    was a traceback)."""
    try:
        token = bearer_token(args.token or os.environ.get(TOKEN_ENV))
    except UnsendableTokenError as exc:
        raise InvalidPrincipalError(str(exc)) from None
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _over_http(args: argparse.Namespace) -> Any:
    headers = _authorization(args)
    if args.command != "audit" and args.token_command == "revoke":
        check_name(args.name)   # a path segment: "../session/ID" was DELETE /session/ID
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers,
                                 timeout=30) as client:
        if args.command == "audit":
            response = await client.get("/audit", params=_audit_params(args))
        elif args.token_command == "create":
            body: dict[str, Any] = {"name": args.name, "scopes": args.scope,
                                    "rateClass": UNLIMITED if args.unlimited else DEFAULT_RATE}
            if args.expires:
                body["expires"] = args.expires
            response = await client.post("/tokens", json=body)
        elif args.token_command == "list":
            response = await client.get("/tokens", params={"all": "true"} if args.all else {})
        else:
            response = await client.delete(f"/tokens/{args.name}")
    if response.status_code == 401:
        raise Refused(f"{args.url} refused the credential (401): check --token / ${TOKEN_ENV}.")
    if response.status_code == 403:
        raise Refused(f"{args.url} refused (403): {_message(response)} This needs a token "
                      "with the admin scope.")
    if response.status_code >= 400:
        raise Refused(f"{args.url} answered {response.status_code}: {_message(response)}")
    try:
        return response.json()
    except ValueError:
        raise Refused(f"{args.url} answered {response.status_code} without JSON: is it an "
                      "acp-server?") from None


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error") or response.text[:200])
    except (ValueError, AttributeError):
        return response.text[:200]


# -- printing ----------------------------------------------------------------------------
def _print(args: argparse.Namespace, result: Any, out: TextIO) -> None:
    if args.json:
        print(json.dumps(result, indent=2), file=out)
    elif args.command == "audit":
        for r in result["records"]:   # one line each, by the log's rule (``loggable``)
            detail = json.dumps(r["detail"], separators=(",", ":"), ensure_ascii=False)
            principal, action, target, client = (loggable(r[k] or "-", 256) for k in (
                "principal", "action", "target", "client"))
            print(f"{r['seq']:>6}  {iso(r['at'])}  {principal:<16} {action:<20} "
                  f"{target}  {client}  {loggable(detail, 8192)}", file=out)
    elif args.token_command == "create":
        print(result["token"], file=out)
        expires = f", expires {result['expiresAt']}" if result["expiresAt"] else ""
        print(f"token {result['name']!r} ({', '.join(result['scopes'])}{expires}): shown "
              "once, keep it now", file=sys.stderr)
    elif args.token_command == "list":
        rows = [("NAME", "ID", "SCOPES", "CREATED", "LAST USED", "EXPIRES", "REVOKED")]
        rows += [(t["name"], t["id"], ",".join(t["scopes"]), t["createdAt"],
                  t["lastUsedAt"] or "-", t["expiresAt"] or "-", t["revokedAt"] or "-")
                 for t in result["tokens"]]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)
    else:
        for t in result["revoked"]:
            print(f"revoked {t['name']!r} ({t['id']})", file=out)


def run_principals_args(args: argparse.Namespace) -> int:
    try:
        result = anyio.run(_over_http if args.url else _on_store, args)
    except (InvalidPrincipalError, BadFolder) as exc:
        print(f"acp-server: {exc}", file=sys.stderr)
        return 2
    except Refused as exc:
        print(f"acp-server: {exc}", file=sys.stderr)
        return 1
    except (StoreUnavailableError, httpx.HTTPError) as exc:
        print(f"acp-server: {exc}", file=sys.stderr)
        return 1
    return printed(lambda out: _print(args, result, out), sys.stdout)   # 141: `| head`


__all__ = ["add_audit_arguments", "add_token_arguments", "run_principals_args", "store_url"]
