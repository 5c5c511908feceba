"""Putting the engine to sleep and waking it (``POST /v1/omni/sleep`` / ``/v1/omni/wakeup``).

Asleep, the session process's own realtime engine is stopped: its engine actor ends,
so the runner, its weights, its KV pool and its CUDA graphs are dropped; the garbage
collector runs until the engine is freed (``engine_released`` in the answer), CUDA's
cache is emptied and the heap trimmed, so the memory goes back to the system. Waking
spawns the engine actor again with the same build (the weights are loaded again: the
time to wake is a model load). While asleep the hub refuses new sessions
``engine_sleeping`` and the service routes answer it too (``duplex.services.omni``).

Sleeping with live sessions is refused (409 ``sessions_live``) unless forced: then each
session is ended (an ``error`` with the reason, then ``session.closed`` and the socket's
close), and the engine stops once they are gone (or after `DRAIN_S`).

Only a server whose engine runs in its own process can sleep (``engine_process = off``,
one session shard): engine processes and shards answer 501 ``sleep_unsupported``. The
request engines (images, video, audio, TTS, policy) keep their memory.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Final, final

import trio

from duplex.actors import ActorRef, ActorSystem
from duplex.exceptions import ProtocolError
from duplex.logs import get_logger
from duplex.runtime import SessionHub

from ._memory import malloc_trim

__all__ = ["DRAIN_S", "LocalEngineSleep", "SessionsLive", "SleepUnsupported"]

DRAIN_S: Final = 10.0
"""How long a forced sleep waits for the told sessions to end before it stops the engine."""
REASON: Final = "engine_sleeping: an operator put the engine to sleep (POST /v1/omni/sleep)"


@final
class SessionsLive(ProtocolError):
    code: ClassVar[str] = "sessions_live"
    status_hint: ClassVar[int] = 409


@final
class SleepUnsupported(ProtocolError):
    code: ClassVar[str] = "sleep_unsupported"
    status_hint: ClassVar[int] = 501


def _memory() -> dict[str, int]:
    """This process's resident memory and, where CUDA runs, its allocated device memory."""
    with open("/proc/self/statm") as statm:  # Linux: pages resident is the second field
        resident = int(statm.read().split()[1])
    figures = {"rss_bytes": os.sysconf("SC_PAGE_SIZE") * resident}
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return figures
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        figures["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated())
        figures["cuda_reserved_bytes"] = int(torch.cuda.memory_reserved())
    return figures


def _give_back() -> dict[str, int]:
    """Empty CUDA's cache and trim the heap (after the collections); the figures after."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass
    malloc_trim()
    return _memory()


async def _collect_until_gone(engines: list[weakref.ref[Any]]) -> bool:
    """Collect until the stopped engines are freed (their tasks wind down a few checkpoints
    after the actor stops): ``False`` if one still lives after `DRAIN_S`.

    The server froze its startup objects (``gc.freeze``: never collected), the engine's
    among them; they are unfrozen here and stay so while the engine sleeps (no session
    runs, so a long collection delays nobody's tick); waking freezes again.
    """
    gc.unfreeze()
    with trio.move_on_after(DRAIN_S):
        while True:
            gc.collect()
            if all(engine() is None for engine in engines):
                return True
            await trio.sleep(0.05)
    return False


def _refreeze() -> None:
    """As the server does after startup: the long-lived objects built so far frozen."""
    gc.collect()
    gc.freeze()
    gc.collect()


@final
class LocalEngineSleep:
    """The sleep of the engine this process runs itself.

    Args:
        system: the actor system the engine actor runs in.
        clock: wall seconds, for the answers' durations.

    `attach` hands it the engine once it is spawned; until then (or with engine
    processes, which never attach) sleeping is `SleepUnsupported`.
    """

    def __init__(self, system: ActorSystem, clock: Callable[[], float] = time.monotonic) -> None:
        self.system = system
        self.clock = clock
        self.hub: SessionHub | None = None
        self._refs: list[ActorRef[Any]] = []
        self._ref: ActorRef[Any] | None = None
        self._spawn: Callable[[], Awaitable[ActorRef[Any]]] | None = None
        self._lock = trio.Lock()
        self.asleep = False
        self.log = get_logger(component="sleep")

    def attach(
        self,
        hub: SessionHub,
        refs: list[ActorRef[Any]],
        ref: ActorRef[Any],
        spawn: Callable[[], Awaitable[ActorRef[Any]]],
    ) -> None:
        """The engine actor ``ref`` (in ``refs``, the actors stopped at shutdown) and how to
        spawn it again."""
        self.hub, self._refs, self._ref, self._spawn = hub, refs, ref, spawn

    async def sleep(self, *, force: bool = False) -> dict[str, Any]:
        """Stop the engine and give its memory back; the answer's figures.

        Raises:
            SleepUnsupported: no engine of this process's own to stop.
            SessionsLive: sessions are live and ``force`` is off.
        """
        async with self._lock:
            if self.asleep:
                return {"status": "asleep", "already": True}
            hub, ref = self.hub, self._ref
            if hub is None or ref is None or self._spawn is None:
                raise SleepUnsupported(
                    "This server cannot sleep: its engine runs in engine processes or session "
                    "shards (sleep needs engine_process = off and one session shard)."
                )
            live = hub.live_sessions
            if live and not force:
                raise SessionsLive(
                    f"{live} session(s) are live: sleep when they end, or with force=true "
                    "(each is told and ended).",
                    param="force",
                )
            started = self.clock()
            before = _memory()
            hub.sleeping = True  # no new session from here on
            told = await hub.evict_all(REASON) if live else 0
            with trio.move_on_after(DRAIN_S):
                while hub.live_sessions:
                    await trio.sleep(0.05)
            engines = [weakref.ref(engine) for engine in hub.engines.values()]
            for index, engine in list(hub.engines.items()):
                hub.engine_stopped(index, engine)
            del engine
            await self.system.stop(ref)
            if ref in self._refs:
                self._refs.remove(ref)
            self._ref = None
            released = await _collect_until_gone(engines)
            after = await trio.to_thread.run_sync(_give_back)
            self.asleep = True
            took = round(self.clock() - started, 3)
            self.log.info("engine asleep", sessions_told=told, took_s=took, **after)
            return {
                "status": "asleep",
                "sessions_told": told,
                "engine_released": released,
                "sleep_s": took,
                "memory_before": before,
                "memory_asleep": after,
            }

    async def wake(self) -> dict[str, Any]:
        """Spawn the engine again (a model load); admission opens once it runs."""
        async with self._lock:
            hub, spawn = self.hub, self._spawn
            if hub is None or spawn is None:
                raise SleepUnsupported("This server cannot sleep, so it has nothing to wake.")
            if not self.asleep:
                return {"status": "awake", "already": True}
            started = self.clock()
            ref = await spawn()  # returns once the engine runs (its actor's on_start)
            self._ref = ref
            self._refs.append(ref)
            await trio.to_thread.run_sync(_refreeze)  # the new engine, out of the GC's walks
            self.asleep = False
            hub.sleeping = False
            took = round(self.clock() - started, 3)
            after = _memory()
            self.log.info("engine awake", took_s=took, **after)
            return {"status": "awake", "wake_s": took, "memory_awake": after}
