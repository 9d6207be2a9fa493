"""The models of ``--model-server``, listed at start and again while the server runs.

    catalog = ModelCatalog("http://127.0.0.1:11434/v1", taken={"reference"}, interval_s=30)
    offered = await catalog.start()          # the listing at start: ["qwen3:14b", ...]
    catalog.on_models = add_to_the_bridge    # called with each model newly offered
    async with catalog:                      # the task group its listings run in
        await catalog.refresh()              # something named a model nobody knows
        await catalog.refresh(wait_s=1.0)    # a listing is read: wait at most 1 s

Contracts:

* ``start`` lists once (within ``discover_models``' bounds; ``api_key``, if any, sent as
  ``Authorization: Bearer``). Afterwards ``refresh``
  lists again, at most once per ``interval_s`` (measured on ``clock``, a monotonic one,
  from the start of the previous listing; ``0`` = never again after ``start``), and
  single-flight: callers arriving while a listing runs wait for that one. A listing runs
  in the catalog's own task group, so a caller that gives up (is cancelled, or
  ``wait_s`` passes) never aborts it; the next caller finds its result.
* Models are only ever added: a model listed for the first time is offered from then
  on (``on_models`` is called with the new ids, in listing order), at most
  ``MAX_OFFERED`` in all (the rest is logged once, never offered); a model that
  disappears from the listing stays offered (sessions using it keep working; a new
  session may still name it; the model server answers its prompts as it does). When
  ``on_models`` raises (a bug, logged) none of those models counts as offered, so the
  next listing hands them over again (``on_models`` must take a model twice). A model
  whose id an agent configured by name (``taken``) already has is never offered
  (logged once per id).
* A listing that fails changes nothing and is logged in one line: the first failure,
  then a failure with another cause, or the same one again after ``LOG_EVERY_S``; the
  others at debug level. The listing after a failure is rate-limited like any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from bridge.agents.upstream import public_url
from bridge.loggable import loggable

log = logging.getLogger("acp_server")

LOG_EVERY_S = 600.0   # the same listing failure, logged again at most this often
MAX_OFFERED = 1000    # models offered in all (listings only add): the rest is not
DEFAULT_INTERVAL_S = 30.0

Lister = Callable[[str], Awaitable[list[str]]]


def _lister(api_key: str | None) -> Lister:
    async def listing(url: str) -> list[str]:
        from bridge.agents.model import discover_models

        return await discover_models(url, api_key=api_key)

    return listing


class ModelCatalog:
    def __init__(self, url: str, *, taken: Iterable[str] = (),
                 interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, lister: Lister | None = None,
                 api_key: str | None = None) -> None:
        self.url = url
        self.shown = public_url(url)   # in the log: credentials in the URL hidden
        self.taken = frozenset(taken)
        self.interval_s = interval_s
        self.clock = clock
        self.lister = lister or _lister(api_key)   # the key: Authorization: Bearer
        self.offered: dict[str, None] = {}   # every model offered, in first-listed order
        self.listings = 0                      # listings started (the first included)
        self.on_models: Callable[[list[str]], Any] | None = None
        self._clashed: set[str] = set()
        self._full = False   # MAX_OFFERED reached (logged once)
        self._last_start: float | None = None
        self._running: anyio.Event | None = None   # set when the listing in flight ends
        self._failure: tuple[str, float] | None = None   # the last one logged, and when
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> ModelCatalog:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None
        tg.cancel_scope.cancel()   # a listing in flight: abandoned, nothing changes
        return await tg.__aexit__(kind, exc, tb)

    async def start(self) -> list[str]:
        """The listing at start: the models offered (none when it failed; logged)."""
        await self._listing()
        return list(self.offered)

    def due(self) -> bool:
        """Whether ``refresh`` would list now (or join the listing in flight)."""
        if self._running is not None:
            return True
        if self.interval_s <= 0 and self._last_start is not None:
            return False
        return self._last_start is None or self.clock() - self._last_start >= self.interval_s

    async def refresh(self, *, wait_s: float | None = None) -> None:
        """List again if due (see the module docstring), and wait for that listing (at
        most ``wait_s``; ``None``: to its end). Returns at once when not due."""
        if not self.due() or self._tg is None:
            return
        if self._running is None:
            self._running = anyio.Event()
            self._tg.start_soon(self._run, self._running)
        done = self._running
        with anyio.move_on_after(wait_s if wait_s is not None else float("inf")):
            await done.wait()

    async def _run(self, done: anyio.Event) -> None:
        try:
            await self._listing()
        finally:
            self._running = None
            done.set()

    async def _listing(self) -> None:
        self._last_start = self.clock()
        self.listings += 1
        try:
            models = await self.lister(self.url)
        except Exception as exc:   # noqa: BLE001 - the server goes on; nothing changes
            self._failed(str(exc) or type(exc).__name__)
            return
        self._failure = None
        clash = [m for m in models if m in self.taken and m not in self._clashed]
        if clash:
            self._clashed.update(clash)
            log.warning("model server %s: not offering %s: an agent configured by name has "
                        "it", self.shown, loggable(", ".join(clash)))
        new = [m for m in models if m not in self.taken and m not in self.offered]
        room = MAX_OFFERED - len(self.offered)
        if len(new) > room:
            if not self._full:
                self._full = True
                log.warning("model server %s offers %d models already: not offering %d "
                            "more (%s, …) until a restart", self.shown, MAX_OFFERED,
                            len(new) - room, new[room])
            new = new[:room]
        if new and self.on_models is not None:
            try:
                self.on_models(new)
            except Exception:   # noqa: BLE001 - a bug: logged, never the server's end
                log.exception("model server %s: could not offer %s (the next listing "
                              "tries again)", self.shown, ", ".join(new))
                return
        if self.listings == 1:
            log.info("model server %s offers: %s", self.shown, ", ".join(new) or "(none)")
        elif new:
            log.info("model server %s now also offers: %s", self.shown, ", ".join(new))
        self.offered.update(dict.fromkeys(new))

    def _failed(self, cause: str) -> None:
        now = self.clock()
        last = self._failure
        if last is None or last[0] != cause or now - last[1] >= LOG_EVERY_S:
            self._failure = (cause, now)
            log.error("cannot list the models of %s: %s", self.shown, cause)
        else:
            log.debug("cannot list the models of %s (again): %s", self.shown, cause)


__all__ = ["DEFAULT_INTERVAL_S", "LOG_EVERY_S", "MAX_OFFERED", "ModelCatalog"]
