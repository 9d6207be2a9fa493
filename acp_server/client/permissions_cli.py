"""How ``acp-server prompt`` answers the agent's permission requests.

    answerer = PermissionAnswerer(client, session_id, err=sys.stderr,
                                  ask=TerminalAsker(sys.stdin, sys.stderr) if tty else None,
                                  policy="reject")
    async with anyio.create_task_group() as tg:
        on_event = lambda event: answerer.see(event, tg)   # DaemonClient.prompt(on_event=…)

Contracts:

* In a terminal (``ask`` given) the request is shown on stderr, with the agent's
  options numbered, and the person's choice is sent (Enter alone, or end of input,
  sends the policy's answer). A request answered elsewhere first (the console,
  another client) is said so and stops waiting.
* Without one, the policy answers at once (``--permissions allow|reject|cancel``):
  ``reject`` (the default) picks the agent's first ``reject_once``/``reject_always``
  option, ``allow`` its first ``allow_once``/``allow_always``, ``cancel`` answers
  ``cancelled``; with no option of that kind the answer is ``cancelled``. Each
  decision is one line on stderr, naming the policy. Options that are not objects
  (a server's garbage) are no options; titles are printed as one line.
* The terminal is read by a daemon thread, so an unanswered question never holds the
  process at exit (Ctrl-C included).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, TextIO

import anyio
import anyio.abc
import anyio.lowlevel

from acp_server.client import DaemonClient, DaemonError, DaemonEvent
from acp_server.client.errors import one_line

POLICIES = ("reject", "allow", "cancel")
_KINDS = {"reject": ("reject_once", "reject_always"), "allow": ("allow_once", "allow_always")}
# ACP tool kinds, as a person reads them.
TOOL_KINDS = {"read": "reads files", "edit": "edits files", "delete": "deletes files",
              "move": "moves files", "search": "searches", "execute": "runs a command",
              "think": "thinks", "fetch": "fetches from the network",
              "switch_mode": "switches mode",
              "other": "other: the agent did not say what kind of tool this is"}


def options_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's options that are options (objects), whatever else the server sent."""
    options = data.get("options")
    return [o for o in options if isinstance(o, dict)] if isinstance(options, list) else []


def policy_answer(policy: str, options: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The vote the policy gives for these options."""
    for option in options:
        if option.get("kind") in _KINDS.get(policy, ()) and isinstance(option.get("optionId"),
                                                                        str):
            return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}
    return {"outcome": {"outcome": "cancelled"}}


def describe(answer: dict[str, Any]) -> str:
    outcome = answer["outcome"]
    return outcome["optionId"] if outcome["outcome"] == "selected" else "cancelled"


def request_title(data: dict[str, Any]) -> str:
    tool = data.get("toolCall") if isinstance(data.get("toolCall"), dict) else {}
    title = one_line(str(tool.get("title") or "a tool call"), 200)
    kind = tool.get("kind")
    if not kind:
        return title
    said = TOOL_KINDS.get(kind, kind) if isinstance(kind, str) else str(kind)
    return f"{title} ({one_line(said, 100)})"


class TerminalAsker:
    """Asks on a terminal: the question on ``err``, one line read from ``source``."""

    def __init__(self, source: TextIO, err: TextIO) -> None:
        self.source = source
        self.err = err

    async def __call__(self, data: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
        options = options_of(data)
        lines = [f"\nThe agent asks permission: {request_title(data)}"]
        lines += [f"  {i}) {one_line(str(o.get('name') or o.get('optionId')), 200)}  "
                  f"[{one_line(str(o.get('optionId')), 100)}]" for i, o in enumerate(options, 1)]
        lines.append(f"Choose 1-{len(options)} (Enter: {describe(default)}): ")
        while True:
            self.err.write("\n".join(lines))
            self.err.flush()
            line = await self._read_line()
            choice = line.strip()
            if not choice:
                return default
            if choice.isdigit() and 1 <= int(choice) <= len(options):
                picked = options[int(choice) - 1]
                return {"outcome": {"outcome": "selected", "optionId": picked.get("optionId")}}
            lines = [f"Not a choice: {choice!r}. Choose 1-{len(options)}: "]

    async def _read_line(self) -> str:
        """One line (``""`` at the end of input), read by a daemon thread."""
        token = anyio.lowlevel.current_token()
        got = anyio.Event()
        box: list[str] = []

        def deliver(line: str) -> None:
            box.append(line)
            got.set()

        def read() -> None:
            line = self.source.readline()
            try:
                anyio.from_thread.run_sync(deliver, line, token=token)
            except RuntimeError:   # the loop has ended meanwhile
                pass

        threading.Thread(target=read, name="acp-server prompt: terminal", daemon=True).start()
        await got.wait()
        return box[0]


class PermissionAnswerer:
    """Answers the ``permission_request`` events of one prompt."""

    def __init__(self, client: DaemonClient, session_id: str, *, err: TextIO,
                 policy: str = "reject", ask: TerminalAsker | None = None) -> None:
        self.client = client
        self.session_id = session_id
        self.err = err
        self.policy = policy
        self.ask = ask
        self._waiting: dict[str, anyio.CancelScope] = {}
        self._lock = anyio.Lock()   # one question on the terminal at a time

    def see(self, event: DaemonEvent, tg: anyio.abc.TaskGroup) -> None:
        data = event.data if isinstance(event.data, dict) else {}
        request_id = data.get("requestId")
        if not isinstance(request_id, str):
            return
        if event.type == "permission_request":
            tg.start_soon(self._answer, request_id, data)
        elif event.type == "permission_resolved" and request_id in self._waiting:
            self._waiting.pop(request_id).cancel()
            self._say(f"permission {request_id} answered elsewhere")

    async def _answer(self, request_id: str, data: dict[str, Any]) -> None:
        default = policy_answer(self.policy, options_of(data))
        if self.ask is None:
            how = f"--permissions {self.policy}"
            if self.policy == "reject":
                how += "; --permissions allow allows"
            self._say(f"permission asked: {request_title(data)}: answered {describe(default)} "
                      f"({how})")
            await self._vote(request_id, default)
            return
        with anyio.CancelScope() as scope:
            self._waiting[request_id] = scope
            async with self._lock:
                answer = await self.ask(data, default)
            self._waiting.pop(request_id, None)
            await self._vote(request_id, answer)

    async def _vote(self, request_id: str, answer: dict[str, Any]) -> None:
        try:
            accepted = await self.client.respond_to_permission(request_id, answer,
                                                               session_id=self.session_id)
        except DaemonError as exc:   # the turn's own outcome says the rest
            self._say(f"the answer to permission {request_id} was not taken: {exc}")
            return
        if not accepted:
            self._say("permission already answered elsewhere")

    def _say(self, text: str) -> None:
        self.err.write(f"acp-server prompt: {one_line(text)}\n")
        self.err.flush()
