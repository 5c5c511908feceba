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

With engine processes (`ProcessEngineSleep`, the default on a GPU), a sleep stops the
engine processes themselves: everything they hold (the realtime engine and the request
engines built beside it: images, video, audio, TTS, policy, ASR) goes back to the system
with the process, and waking starts them again. Every session process (this one and each
shard) closes its admission first and, when forced, ends its sessions; their engine links
reconnect by themselves once the engines are back.

What cannot sleep answers 501 ``sleep_unsupported``: an in-process engine beside session
shards (each shard has its own engine). With an in-process engine the request engines
(images, video, audio, TTS, policy) keep their memory.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Final, Protocol, final

import trio

from duplex.actors import ActorRef, ActorSystem
from duplex.exceptions import ProtocolError
from duplex.logs import get_logger
from duplex.runtime import SessionHub

from ._memory import malloc_trim

__all__ = [
    "DRAIN_S",
    "SLEEP_REASON",
    "LocalEngineSleep",
    "ProcessEngineSleep",
    "SessionsLive",
    "SleepUnsupported",
    "WakeUnfinished",
]

DRAIN_S: Final = 10.0
"""How long a forced sleep waits for the told sessions to end before it stops the engine."""
WAKE_S: Final = 600.0
"""How long a wake waits for the engine processes to be built again (a 7B model's load and
graph captures take tens of seconds; a crash loop would take for ever)."""
WAKE_LINK_S: Final = 30.0
"""How long a wake waits, after the engine processes are ready, for this process to link
them (it reconnects every ``CONNECT_RETRY_S``)."""
SLEEP_REASON: Final = "engine_sleeping: an operator put the engine to sleep (POST /v1/omni/sleep)"


@final
class SessionsLive(ProtocolError):
    code: ClassVar[str] = "sessions_live"
    status_hint: ClassVar[int] = 409


@final
class WakeUnfinished(ProtocolError):
    """The engine processes did not all come back within `WAKE_S`: they are still being
    started (admission stays closed); another wake waits for them again."""

    code: ClassVar[str] = "engine_starting"
    status_hint: ClassVar[int] = 503


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
            told = await hub.evict_all(SLEEP_REASON) if live else 0
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


class _ShardQueries(Protocol):
    """The server's session shards, asked by name (``_shards.ShardProcesses``)."""

    async def query(self, what: str) -> list[Any]: ...


class _Pausable(Protocol):
    """The engine processes' supervision (``_children.Children``)."""

    processes: dict[int, trio.Process]

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...


def _with_children(pids: list[int]) -> list[int]:
    """``pids`` and every live process under them (an engine process's ASR children)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grown = set(pids), True
    while grown:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    return sorted(tree)


def _process_memory(pids: list[int]) -> dict[str, int]:
    """The resident memory of ``pids`` and their children together and, where
    ``nvidia-smi`` answers, the device memory they hold (what a sleep gives back)."""
    resident = 0
    tree = _with_children(pids)
    for pid in tree:
        try:
            with open(f"/proc/{pid}/statm") as statm:
                resident += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
    figures = {"engine_processes": len(pids), "rss_bytes": resident}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return figures
    try:
        found = subprocess.run(
            [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        used = 0
        for line in found.splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip().isdigit() and int(pid) in tree:
                used += int(mib.strip()) * (1 << 20)
        figures["gpu_used_bytes"] = used
        total = subprocess.run(
            [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        figures["device_used_bytes"] = sum(int(v) for v in total.split()) * (1 << 20)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return figures


@final
class ProcessEngineSleep:
    """The sleep of the engine processes: each session process closes its admission (and,
    forced, ends its sessions), then the engine processes stop; waking starts them again
    and opens admission once every session process has its engines back.

    Args:
        hub: this process's session hub (shard 0).
        engines: the engine processes' supervision.
        clock: wall seconds, for the answers' durations.

    `attach_shards` gives it the other session shards once they run.
    """

    def __init__(
        self, hub: SessionHub, engines: _Pausable, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.hub = hub
        self.engines = engines
        self.clock = clock
        self.shards: _ShardQueries | None = None
        self._lock = trio.Lock()
        self.asleep = False
        self.log = get_logger(component="sleep")

    def attach_shards(self, shards: _ShardQueries) -> None:
        self.shards = shards

    async def _ask(self, what: str) -> int:
        """Every shard's answer to ``what``, summed (a shard that does not answer: 0)."""
        if self.shards is None:
            return 0
        return sum(answer or 0 for answer in await self.shards.query(what))

    async def _live(self) -> int:
        return self.hub.live_sessions + await self._ask("live")

    async def sleep(self, *, force: bool = False) -> dict[str, Any]:
        """Close admission everywhere, end the sessions if forced, stop the engine processes.

        Raises:
            SessionsLive: sessions are live and ``force`` is off (admission opens again).
        """
        async with self._lock:
            if self.asleep:
                return {"status": "asleep", "already": True}
            started = self.clock()
            self.hub.sleeping = True  # no new session from here on, in any session process
            live = self.hub.live_sessions + await self._ask("sleep")
            if live and not force:
                self.hub.sleeping = False
                await self._ask("wake")
                raise SessionsLive(
                    f"{live} session(s) are live: sleep when they end, or with force=true "
                    "(each is told and ended).",
                    param="force",
                )
            told = 0
            if live:
                told = await self.hub.evict_all(SLEEP_REASON) + await self._ask("evict")
                with trio.move_on_after(DRAIN_S):
                    while await self._live():
                        await trio.sleep(0.05)
            pids = [p.pid for p in self.engines.processes.values()]
            before = await trio.to_thread.run_sync(_process_memory, pids)
            await self.engines.pause()
            after = await trio.to_thread.run_sync(_process_memory, pids)
            self.asleep = True
            took = round(self.clock() - started, 3)
            self.log.info("engine processes asleep", sessions_told=told, took_s=took, **after)
            return {
                "status": "asleep",
                "sessions_told": told,
                "engine_released": not self.engines.processes,
                "sleep_s": took,
                "memory_before": before,
                "memory_asleep": after,
            }

    async def wake(self) -> dict[str, Any]:
        """Start the engine processes (model loads); admission opens once every session
        process has linked them again.

        Raises:
            WakeUnfinished: they were not all ready within `WAKE_S` (still starting).
        """
        async with self._lock:
            if not self.asleep:
                return {"status": "awake", "already": True}
            started = self.clock()
            with trio.move_on_after(WAKE_S) as waited:
                await self.engines.resume()
            if waited.cancelled_caught:
                raise WakeUnfinished(
                    f"The engine processes did not all start within {WAKE_S:.0f} s; they are "
                    "still being started (see the server's log). Call wakeup again to wait."
                )
            with trio.move_on_after(WAKE_LINK_S):
                while len(self.hub.engines) < len(self.engines.processes):
                    await trio.sleep(0.05)
            self.asleep = False
            self.hub.sleeping = False
            await self._ask("wake")
            took = round(self.clock() - started, 3)
            pids = [p.pid for p in self.engines.processes.values()]
            after = await trio.to_thread.run_sync(_process_memory, pids)
            self.log.info("engine processes awake", took_s=took, **after)
            return {"status": "awake", "wake_s": took, "memory_awake": after}
