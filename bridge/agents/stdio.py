"""ACP agents as child processes speaking newline-delimited JSON-RPC 2.0 on stdio::

    factory = StdioAgentFactory(["qwen", "--acp"], env={"HOME": "/tmp/agent-home"})
    async with anyio.create_task_group() as tg:
        conn = await factory.connect(client, tg)       # spawns the process
        info = await conn.request("initialize", {"protocolVersion": 1})
        ...
        await conn.aclose()                            # stdin EOF → SIGTERM → SIGKILL

Contracts (see ``bridge.agents.base``):

* One id table per direction: our request ids count from 0; the agent's request ids
  are independent and echoed verbatim in our answers.
* One reader task dispatches stdout lines in order. ``session/update`` reaches
  ``client.session_update`` synchronously as ``msgspec.Raw`` (the agent's exact
  params bytes), before any later response resolves its ``request()``. Results are
  decoded to plain values (unknown fields survive); error answers raise ``AgentError``,
  bounded (``bridge.wire.agent_error``).
* Agent-to-client requests run concurrently, each in its own task of the task group;
  unknown methods are answered -32601 with ``data: {method}``. When the connection
  goes away, handlers still running are cancelled. The agent may withdraw one it
  sent (``$/cancel_request {requestId}``, ACP's protocol-level cancellation): its
  handler is cancelled (a permission request is resolved as cancelled, reason
  ``request_cancelled``) and the request is answered -32800, as ACP asks; one
  already answered, or unknown, is left alone.
* At most ``max_requests_in_flight`` of the agent's requests are handled at once; one
  more is answered -32603 "Too many requests in flight" (``data: {limit}``) by the
  reader itself, which waits for that write (an agent that floods requests without
  reading the answers holds up only its own stdout).
* After a ``session/update`` the reader waits for the client's flow control
  (``wait_for_readers(session_id)`` when it has one: the session's uncommitted events
  and slow readers, each wait bounded, ``bridge.bus``), as an in-process agent does:
  an agent flooding updates fills its own stdout, never the journal's backlog that
  every session's commits wait behind.
* A line longer than ``max_line_bytes`` is a protocol failure: the agent is treated
  as lost and stopped. A line that is no JSON-RPC is ignored, with a warning at
  stderr's bounded rate (``bridge.agents.stderr``: an agent that floods its stdout
  with them costs the log at most that), the rest counted.
* Death (stdout EOF, exit, broken pipe, protocol failure): every pending call raises
  ``AgentDiedError(message, exit_code)`` (the message names the exit code, the last
  stdout line that was no JSON-RPC and the last stderr lines, each bounded),
  ``client.connection_lost`` is called once,
  ``closed`` becomes True and the process is reaped. ``aclose()`` fails pending calls
  the same way but does not call ``connection_lost``.
* ``env`` entries are added to (override) the inherited environment; names in
  ``unset_env`` (e.g. the server's own token) are removed from what the child gets.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from bridge.agents.base import AgentClient, PendingRequests, RequestError
from bridge.agents.child import open_child
from bridge.agents.children import ChildRegistry
from bridge.agents.stderr import StderrLog
from bridge.errors import AgentDiedError, AgentUnavailableError, said_line
from bridge.loggable import loggable
from bridge.wire import agent_error
from bridge.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    UNSET,
    JsonRpcError,
    Message,
    decode_message,
    decode_value,
    encode_error,
    encode_notification,
    encode_result,
)

__all__ = ["StdioAgentFactory", "StdioAgentConnection", "DEFAULT_MAX_LINE_BYTES"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
# The agent's own requests (permissions, fs, elicitations) handled at once; past it one
# is answered -32603 at once by the reader, which waits for that write: an agent that
# floods requests and never reads its answers stalls itself, never the server's memory.
DEFAULT_MAX_REQUESTS_IN_FLIGHT = 1024
_STDERR_LINE_BYTES = 64 * 1024
_PIPE_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
_STRAY_CHARS = 200


def _key(request_id: Any) -> tuple[type, Any]:
    """A dict key for a JSON-RPC id: ``1`` and ``"1"`` are different ids."""
    return (type(request_id), request_id)


class _SessionIdOnly(msgspec.Struct):
    sessionId: str


_session_id_decoder = msgspec.json.Decoder(_SessionIdOnly)


class StdioAgentFactory:
    """``AgentFactory`` spawning ``command`` for each connection."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        unset_env: Iterable[str] = (),
        registry: ChildRegistry | None = None,
        name: str | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        shutdown_grace_s: float = 2.0,
        max_requests_in_flight: int = DEFAULT_MAX_REQUESTS_IN_FLIGHT,
    ) -> None:
        if not command:
            raise ValueError("command must not be empty")
        self.command = list(command)
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.unset_env = frozenset(unset_env)
        self.registry = registry
        self.name = name or os.path.basename(self.command[0])
        self.max_line_bytes = max_line_bytes
        self.shutdown_grace_s = shutdown_grace_s
        self.max_requests_in_flight = max_requests_in_flight

    async def connect(self, client: AgentClient, task_group: anyio.abc.TaskGroup) -> StdioAgentConnection:
        environ: dict[str, str] | None = None
        if self.env is not None or self.unset_env:
            environ = {k: v for k, v in {**os.environ, **(self.env or {})}.items()
                       if k not in self.unset_env}
        try:
            # Its own process group (stopped as a whole), fds 0-2 and nothing else.
            process = open_child(self.command, cwd=self.cwd, env=environ)
        except OSError as exc:
            raise AgentUnavailableError(self.name, exc, self.cwd) from exc
        connection = StdioAgentConnection(
            process,
            client,
            name=self.name,
            max_line_bytes=self.max_line_bytes,
            shutdown_grace_s=self.shutdown_grace_s,
            registry=self.registry,
            max_requests_in_flight=self.max_requests_in_flight,
        )
        if self.registry is not None:
            self.registry.record(process.pid, self.command)
        connection.start(task_group)
        return connection


class StdioAgentConnection:
    """``AgentConnection`` over a child process's stdin/stdout. Build it via the factory."""

    # A request given up on goes on in the agent: ``bridge.turn`` keeps waiting for a
    # cancelled turn's answer past its grace (``Session.straggler``).
    out_of_process = True

    def __init__(
        self,
        process: anyio.abc.Process,
        client: AgentClient,
        *,
        name: str,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        shutdown_grace_s: float = 2.0,
        registry: ChildRegistry | None = None,
        max_requests_in_flight: int = DEFAULT_MAX_REQUESTS_IN_FLIGHT,
    ) -> None:
        assert process.stdin and process.stdout and process.stderr, "all three pipes are needed"
        self.name = name
        self._process = process
        self._client = client
        self._stdin = process.stdin
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self._max_line_bytes = max_line_bytes
        self._grace = shutdown_grace_s
        self._prefix = f"[agent {name} pid={process.pid}]"
        self._registry = registry
        # The agent's stderr: logged at a bounded rate, its last lines kept for the
        # message of its death.
        self.stderr = StderrLog(self._prefix)
        self.stderr_tail = self.stderr.tail
        # its stdout lines that are no JSON-RPC: warned of at the same bounded rate
        self._invalid = StderrLog(self._prefix, what="invalid stdout", logger=logger,
                                  level=logging.WARNING)
        self._task_group: anyio.abc.TaskGroup | None = None
        self._requests = PendingRequests()
        self._write_lock = anyio.Lock()
        self._death: AgentDiedError | None = None
        self._stray = ""   # its last stdout line that was no JSON-RPC (bounded)
        self._lost = anyio.Event()
        self._closing = False
        self._close_done = anyio.Event()
        self._reaping = False
        self._reaped = anyio.Event()
        self._reader_scope = anyio.CancelScope()
        self._stderr_scope = anyio.CancelScope()
        self._reader_done = anyio.Event()
        self._stderr_done = anyio.Event()
        self._handler_scopes: set[anyio.CancelScope] = set()
        # the agent's requests whose handler runs, by id (``$/cancel_request``)
        self._in_flight: dict[tuple[type, Any], anyio.CancelScope] = {}
        self._withdrawn: set[tuple[type, Any]] = set()
        self._serving = 0   # the agent's requests being handled (tasks alive)
        self._max_requests_in_flight = max_requests_in_flight
        self._over_cap_logged = False
        # Flow control of its updates (``AgentSide.wait_for_readers``): the reader
        # waits, after an update, as an in-process agent does, so its stdout fills
        self._flow = getattr(client, "wait_for_readers", None)
        self._updated: str | None = None   # the session of the update just dispatched
        self._handlers = {
            "session/request_permission": client.request_permission,
            "fs/read_text_file": client.read_text_file,
            "fs/write_text_file": client.write_text_file,
        }
        elicit = getattr(client, "create_elicitation", None)
        if elicit is not None:
            self._handlers["elicitation/create"] = elicit

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start the stdout reader and the stderr logger in ``task_group``."""
        self._task_group = task_group
        task_group.start_soon(self._read_stdout)
        task_group.start_soon(self._read_stderr)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    @property
    def stray_line(self) -> str:
        """The last line it wrote on stdout that was no JSON-RPC (bounded), or ``""``."""
        return self._stray

    @property
    def closed(self) -> bool:
        return self._closing or self._death is not None

    # --- client → agent ------------------------------------------------------------

    async def request(self, method: str, params: Any) -> Any:
        """Send a request; the decoded result, or ``AgentError`` / ``AgentDiedError``."""
        if self.closed:
            raise self._death or AgentDiedError("Agent connection closed")
        return await self._requests.call(self._send_line, method, params)

    async def notify(self, method: str, params: Any) -> None:
        if self.closed:
            raise self._death or AgentDiedError("Agent connection closed")
        await self._send_line(encode_notification(method, params))

    async def _send_line(self, data: bytes) -> None:
        try:
            async with self._write_lock:
                if self._death is not None:
                    raise self._death
                await self._stdin.send(data + b"\n")
        except _PIPE_ERRORS as exc:
            # Prefer the reader's verdict (it knows the exit code); don't wait forever.
            logger.debug("%s write failed: %r", self._prefix, exc)
            with anyio.move_on_after(self._grace):
                await self._lost.wait()
            self._lose(AgentDiedError(f"Agent stdin closed: {exc!r}", self._process.returncode))
            assert self._death is not None
            raise self._death from None

    # --- shutdown ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Fail pending calls, then stop the process: stdin EOF, grace, SIGTERM, grace,
        SIGKILL. Returns once the process is reaped and the background tasks ended."""
        if self._closing:
            await self._close_done.wait()
            return
        self._closing = True
        try:
            self._lose(AgentDiedError("Agent connection closed"), notify=False)
            with anyio.CancelScope(shield=True):
                await self._reap()
                # Give the reader a moment to drain what the agent wrote before exiting
                # (a grandchild may still hold the pipes open: then cut it short).
                with anyio.move_on_after(min(self._grace, 0.5)):
                    await self._reader_done.wait()
                    await self._stderr_done.wait()
                self._reader_scope.cancel()
                self._stderr_scope.cancel()
                await self._reader_done.wait()
                await self._stderr_done.wait()
                with anyio.move_on_after(self._grace):
                    await self._process.aclose()
        finally:
            self._close_done.set()

    async def _reap(self) -> None:
        """Make sure the process is gone; shielded; concurrent callers wait for the first."""
        if self._reaping:
            await self._reaped.wait()
            return
        self._reaping = True
        try:
            with anyio.CancelScope(shield=True):
                process = self._process
                with anyio.move_on_after(self._grace):
                    try:
                        await self._stdin.aclose()
                    except _PIPE_ERRORS:
                        pass
                if process.returncode is None:
                    with anyio.move_on_after(self._grace):
                        await process.wait()
                if process.returncode is None:
                    logger.warning("%s still running %.1fs after stdin EOF: SIGTERM", self._prefix, self._grace)
                    self._signal_group(signal.SIGTERM)
                    with anyio.move_on_after(self._grace):
                        await process.wait()
                if process.returncode is None:
                    logger.warning("%s ignored SIGTERM: SIGKILL", self._prefix)
                    self._signal_group(signal.SIGKILL)
                    with anyio.move_on_after(5):
                        await process.wait()
                self._signal_group(signal.SIGKILL)   # whatever it left in its group
        finally:
            if self._registry is not None:
                self._registry.forget(process.pid)
            self._reaped.set()

    def _signal_group(self, signum: int) -> None:
        """Signal the child's whole process group (it leads one of its own)."""
        try:
            os.killpg(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _lose(self, error: AgentDiedError, *, notify: bool = True) -> None:
        """Mark the connection dead (once): fail pending calls, cancel agent-request
        handlers, and, unless we are closing it ourselves, tell the client."""
        if self._death is not None:
            return
        self._death = error
        self._lost.set()
        self._requests.fail_all(error)
        for scope in list(self._handler_scopes):
            scope.cancel()
        if notify and not self._closing:
            try:
                self._client.connection_lost(error)
            except Exception:
                logger.exception("%s AgentClient.connection_lost failed", self._prefix)

    # --- agent → client ------------------------------------------------------------

    async def _read_stdout(self) -> None:
        finished = False
        try:
            with self._reader_scope:
                reason, wait_for_exit = await self._read_lines()
                finished = True
            if finished:
                with anyio.CancelScope(shield=True):  # bounded; must not leave an orphan
                    await self._agent_gone(reason, wait_for_exit)
        finally:
            self._invalid.close()
            self._reader_done.set()
            if not finished and not self._closing:
                # Cancelled from outside (the host is shutting down): no orphan.
                self._lose(AgentDiedError("Agent connection cancelled"), notify=False)
                if self._process.returncode is None:
                    self._signal_group(signal.SIGKILL)
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                        await self._process.wait()

    async def _read_lines(self) -> tuple[str, bool]:
        """Dispatch lines until the stream ends: (why it ended, wait for an exit code)."""
        while True:
            try:
                line = await self._stdout.receive_until(b"\n", self._max_line_bytes)
            except anyio.IncompleteRead:
                tail = self._stdout.buffer
                if tail.strip():
                    self._dispatch(tail)
                return "Agent process exited (stdout closed)", True
            except anyio.DelimiterNotFound:
                return self._line_too_long()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return "Agent process exited (stdout closed)", True
            # receive_until enforces max_bytes only while the delimiter is missing: a
            # long line that arrived in one read is caught here.
            if len(line) > self._max_line_bytes:
                return self._line_too_long()
            if line.strip():
                refused = self._dispatch(line)
                if refused is not None:   # over the cap: answered here, the reader waits
                    try:
                        await self._send_line(refused)
                    except AgentDiedError:
                        pass
                elif self._updated is not None and self._flow is not None:
                    updated, self._updated = self._updated, None
                    await self._flow(updated)   # bounded: ``bridge.bus`` flow control

    def _line_too_long(self) -> tuple[str, bool]:
        limit = self._max_line_bytes
        logger.error("%s protocol failure: a line exceeds %d bytes", self._prefix, limit)
        return f"Agent sent a line over the {limit}-byte limit", False

    async def _agent_gone(self, reason: str, wait_for_exit: bool) -> None:
        if wait_for_exit and self._process.returncode is None:
            with anyio.move_on_after(self._grace):
                await self._process.wait()
        code = self._process.returncode
        message = reason if code is None else f"{reason}, exit code {code}"
        with anyio.move_on_after(0.2):   # let the last stderr lines arrive
            await self._stderr_done.wait()
        if self._stray:
            message += f"; its last line on stdout was no JSON-RPC: {self._stray}"
        if self.stderr_tail:
            message += "; last stderr: " + " | ".join(   # the log's rule: one line
                loggable(line, 500) for line in list(self.stderr_tail)[-3:])[-500:]
        if not self._closing:
            logger.warning("%s %s", self._prefix, message)
        self._lose(AgentDiedError(message, code))
        if not self._closing:
            await self._reap()

    def _dispatch(self, line: bytes) -> bytes | None:
        """Handle one line; returns the answer to send at once to a request refused
        because ``max_requests_in_flight`` of the agent's requests are being handled."""
        try:
            msg = decode_message(line)
        except JsonRpcError as exc:
            self._invalid.say(f"ignoring invalid message: {exc}")
            self._stray = said_line(line[:_STRAY_CHARS * 4].decode("utf-8", "replace"),
                                    _STRAY_CHARS)
            return None
        if msg.is_response:
            self._resolve(msg)
        elif msg.is_notification:
            self._on_notification(msg)
        elif self._death is None:   # a dead agent's requests have nobody to answer
            assert self._task_group is not None, "start() runs the reader that calls this"
            if self._serving >= self._max_requests_in_flight:
                if not self._over_cap_logged:
                    self._over_cap_logged = True
                    logger.warning("%s over %d requests of its own in flight: refusing more "
                                   "until they are answered", self._prefix,
                                   self._max_requests_in_flight)
                return encode_error(msg.id, INTERNAL_ERROR, "Too many requests in flight",
                                    {"limit": self._max_requests_in_flight})
            self._serving += 1
            scope = anyio.CancelScope()
            self._in_flight[_key(msg.id)] = scope   # before a $/cancel_request can follow
            self._task_group.start_soon(self._serve_agent_request, msg, scope)
        return None

    def _resolve(self, msg: Message) -> None:
        if not self._requests.resolve(msg, agent_error):   # bounded
            logger.warning("%s response to an unknown or already answered request id %s: ignored",
                           self._prefix, loggable(repr(msg.id), 128))

    def _on_notification(self, msg: Message) -> None:
        if msg.method == "elicitation/complete":
            self._elicitation_complete(msg)
            return
        if msg.method == "$/cancel_request":
            self._withdraw(msg)
            return
        if msg.method != "session/update":
            logger.info("%s ignoring notification %s", self._prefix, loggable(msg.method, 128))
            return
        if msg.params is UNSET:
            logger.warning("%s session/update without params", self._prefix)
            return
        try:
            session_id = _session_id_decoder.decode(msg.params).sessionId
        except msgspec.DecodeError as exc:
            logger.warning("%s session/update without a sessionId: %s", self._prefix, exc)
            return
        try:
            self._client.session_update(session_id, msg.params)
        except Exception:
            logger.exception("%s AgentClient.session_update failed", self._prefix)
        self._updated = session_id

    def _elicitation_complete(self, msg: Message) -> None:
        params = decode_value(msg.params) if msg.params is not UNSET else None
        complete = getattr(self._client, "complete_elicitation", None)
        sid = params.get("sessionId") if isinstance(params, dict) else None
        if complete is not None and isinstance(params, dict):
            complete(sid if isinstance(sid, str) else None, params)

    def _withdraw(self, msg: Message) -> None:
        """``$/cancel_request``: the agent withdraws a request of its own that is still
        being handled (the handler is cancelled; ``_serve_agent_request`` answers -32800)."""
        params = decode_value(msg.params) if msg.params is not UNSET else None
        target = params.get("requestId") if isinstance(params, dict) else None
        if not isinstance(target, (str, int)) or isinstance(target, bool):
            logger.info("%s $/cancel_request without a requestId: ignored", self._prefix)
            return
        scope = self._in_flight.get(_key(target))
        if scope is None:
            return   # answered already, or never asked: nothing to withdraw
        self._withdrawn.add(_key(target))
        scope.cancel()

    async def _serve_agent_request(self, msg: Message, scope: anyio.CancelScope) -> None:
        request_key = _key(msg.id)
        self._handler_scopes.add(scope)
        try:
            with scope:
                reply = await self._answer(msg)
                self._in_flight.pop(request_key, None)   # answered: no longer withdrawable
                await self._send_line(reply)
            if scope.cancelled_caught and request_key in self._withdrawn:
                await self._send_line(encode_error(msg.id, REQUEST_CANCELLED,
                                                   "Request cancelled"))
        except AgentDiedError:
            pass  # nobody left to answer
        finally:
            self._serving -= 1
            self._handler_scopes.discard(scope)
            self._in_flight.pop(request_key, None)
            self._withdrawn.discard(request_key)
            if self._serving * 2 < self._max_requests_in_flight:
                self._over_cap_logged = False

    async def _answer(self, msg: Message) -> bytes:
        """The encoded answer to an agent request (never raises for handler failures)."""
        method = msg.method
        handler = self._handlers.get(method)  # type: ignore[arg-type]
        if handler is None:
            logger.info("%s unknown agent request %s", self._prefix, loggable(method, 128))
            return encode_error(msg.id, METHOD_NOT_FOUND, "Method not found", {"method": method})
        try:
            params = decode_value(msg.params)
            session_id = params.get("sessionId") if isinstance(params, dict) else None
            if not isinstance(session_id, str):
                raise RequestError(INVALID_PARAMS, 'Invalid params: "sessionId" must be a string')
            return encode_result(msg.id, await handler(session_id, params))
        except RequestError as exc:
            return encode_error(msg.id, exc.code, exc.message, exc.data)
        except Exception as exc:
            logger.exception("%s handler for %s failed", self._prefix, loggable(method, 128))
            return encode_error(msg.id, INTERNAL_ERROR, "Internal error", {"details": str(exc)})

    async def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        stream = BufferedByteReceiveStream(self._process.stderr)
        try:
            with self._stderr_scope:
                while True:
                    try:
                        line = await stream.receive_until(b"\n", _STDERR_LINE_BYTES)
                    except anyio.DelimiterNotFound:
                        line = await stream.receive(_STDERR_LINE_BYTES)
                    except anyio.IncompleteRead:
                        line = stream.buffer
                        if line:
                            self.stderr.line(line)
                        return
                    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return
                    self.stderr.line(line)
        finally:
            self.stderr.close()
            self._stderr_done.set()
