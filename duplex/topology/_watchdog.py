"""The engine watchdog: an engine process that is alive but no longer ticks is killed.

An engine process that crashes is restarted by its supervisor (``_engines.py``) and its
sessions are told (``engine_error``) and moved onto the new one. One that is alive but
stuck (stopped by a signal, a step stuck in a kernel or a driver call) ends nothing: its
sessions get no audio, their slots stay held, and ``/health`` only says ``stalled``.
The watchdog runs in the server process and reads the server's links to its engine
processes (`RemoteEngine.stalled_for`: live slots, of any session process, and no
progress): one stalled for ``engine.stall_timeout_s`` is sent SIGKILL, so the
crash path above takes over. A slow engine whose ticks still end is never killed; an
engine that runs inside a session process (``engine_process = off``) is not watched
(there is nothing to kill but the server itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, final

import trio

from duplex.logs import get_logger
from duplex.metrics import Counter

from ._engine_client import EngineSet, RemoteEngine

__all__ = ["EngineWatchdog"]


class Killer(Protocol):
    """Who kills an engine process (the server's ``Children`` of engine processes)."""

    def kill(self, index: int) -> bool: ...


@final
class EngineWatchdog:
    """Kills an engine process stalled for ``timeout_s``; one kill per linked incarnation.

    Args:
        engines: this process's links to the engine processes (the session hub).
        killer: kills engine process ``index`` (SIGKILL); its supervisor restarts it.
        timeout_s: how long live slots may go without progress (> 0).
        kills: counts the kills (``duplex_engine_stall_kills_total``).
        clock: the time now (trio's, so that tests run on a ``MockClock``).
    """

    def __init__(
        self,
        engines: EngineSet,
        killer: Killer,
        timeout_s: float,
        kills: Counter,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.engines = engines
        self.killer = killer
        self.timeout_s = timeout_s
        self.kills = kills
        self.clock = clock
        self._killed: set[int] = set()
        """``id`` of each `RemoteEngine` killed: its link ends soon; never killed twice."""
        self.log = get_logger(component="engine-watchdog")

    @property
    def period_s(self) -> float:
        """How often it looks: a stall is acted on within a quarter of the timeout."""
        return self.timeout_s / 4

    def check(self) -> list[int]:
        """Kill every engine process stalled for the timeout now; the indices killed."""
        now = self.clock()
        killed = []
        for index, engine in sorted(self.engines.engines.items()):
            if not isinstance(engine, RemoteEngine) or id(engine) in self._killed:
                continue
            quiet_s = engine.stalled_for(now)
            if quiet_s < self.timeout_s:
                continue
            self._killed.add(id(engine))
            live = max(engine.slots, engine.capacity().live)
            if self.killer.kill(index):
                self.kills.inc()
                killed.append(index)
                self.log.error(
                    "engine process stalled; killing it",
                    engine=index,
                    reason="stalled",
                    quiet_s=round(quiet_s, 2),
                    live_slots=live,
                    timeout_s=self.timeout_s,
                )
        # forget engines no longer linked: ids may be reused by new objects
        linked = {id(e) for e in self.engines.engines.values()}
        self._killed &= linked
        return killed

    async def run(self) -> None:
        """Forever (until cancelled): `check` every `period_s`."""
        while True:
            await trio.sleep(self.period_s)
            self.check()
