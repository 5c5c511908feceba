"""The engine watchdog on trio's MockClock: a stalled engine process is killed, once; a
slow one that still ticks, or an idle one, never is; and the setting's bounds.

The `RemoteEngine`s here are real, on a real socket pair; the engine process's side is
played by the statuses it sends every ``STATUS_PERIOD_S`` (`EngineStatus`: its live slots
and its tick count). ``tests/topology/test_e2e_engine_process.py`` stops a real engine
process with SIGSTOP and checks what its clients are told.
"""

from __future__ import annotations

import dataclasses

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from duplex.config import load_config
from duplex.exceptions import ConfigError
from duplex.metrics import MetricsRegistry
from duplex.models import LOOPBACK_SPEC, CapacityLimit, CapacityReport, DriverStatistics
from duplex.topology._engine_client import RemoteEngine
from duplex.topology._engine_link import STATUS_PERIOD_S, EngineStatus
from duplex.topology._link import Link
from duplex.topology._watchdog import EngineWatchdog

TIMEOUT_S = 5.0


class Hub:
    """The session hub's engines (``EngineSet``)."""

    def __init__(self) -> None:
        self.engines: dict[int, object] = {}
        self.export_engine_metrics = True


class Killer:
    """Records the kills the watchdog asks for (the server's ``Children.kill``)."""

    def __init__(self) -> None:
        self.killed: list[int] = []

    def kill(self, index: int) -> bool:
        self.killed.append(index)
        return True


def status(live: int, ticks: int) -> EngineStatus:
    report = CapacityReport(4, live, 4 - live, CapacityLimit.POOL, None, None, 0.08)
    statistics = DriverStatistics(ticks, 0, 0, live, 0, 0, 0, 0, engine=None, slack=None)  # type: ignore[arg-type]
    return EngineStatus(report, statistics)


async def remote_engine() -> RemoteEngine:
    ours, _theirs = trio.socket.socketpair()
    return RemoteEngine(LOOPBACK_SPEC, 0, Link(trio.SocketStream(ours)))


def watchdog(hub: Hub, killer: Killer) -> tuple[EngineWatchdog, MetricsRegistry]:
    registry = MetricsRegistry()
    kills = registry.counter("duplex_engine_stall_kills_total", "kills")
    return EngineWatchdog(hub, killer, TIMEOUT_S, kills), registry  # type: ignore[arg-type]


def kills(registry: MetricsRegistry) -> float:
    (family,) = [f for f in registry.families() if f.name == "duplex_engine_stall_kills_total"]
    return sum(s.value for s in family.samples)


async def feed(engine: RemoteEngine, seconds: float, live: int, ticks_every_s: float) -> None:
    """Statuses every ``STATUS_PERIOD_S`` for ``seconds``: ticks end every
    ``ticks_every_s`` (``inf``: none ends, a step stuck in a kernel)."""
    start = trio.current_time()
    while (now := trio.current_time()) - start < seconds:
        ticks = 0 if ticks_every_s == float("inf") else int((now - start) / ticks_every_s)
        engine.on_message(status(live, ticks))
        await trio.sleep(STATUS_PERIOD_S)


@pytest.mark.parametrize("silent", [False, True], ids=["stuck-step", "stopped-process"])
async def test_an_engine_with_live_slots_and_no_tick_is_killed_once(
    autojump_clock: trio.testing.MockClock, silent: bool
) -> None:
    hub, killer = Hub(), Killer()
    engine = await remote_engine()
    hub.engines[0] = engine
    with capture_logs() as logs:
        dog, registry = watchdog(hub, killer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dog.run)
            engine.on_message(status(live=2, ticks=7))
            if silent:  # stopped (SIGSTOP): nothing comes at all
                await trio.sleep(TIMEOUT_S - 1)
            else:  # stuck in a step: statuses keep coming, the tick count does not move
                await feed(engine, TIMEOUT_S - 1, live=2, ticks_every_s=float("inf"))
            assert killer.killed == []  # not yet
            await trio.sleep(1 + dog.period_s + 0.01)
            assert killer.killed == [0]
            await trio.sleep(10 * TIMEOUT_S)  # its link has not ended yet: not killed again
            assert killer.killed == [0]
            nursery.cancel_scope.cancel()
    assert kills(registry) == 1
    (line,) = [entry for entry in logs if entry["event"] == "engine process stalled; killing it"]
    assert line["reason"] == "stalled" and line["engine"] == 0 and line["live_slots"] == 2
    assert line["log_level"] == "error"

    # its replacement (a new link, a new RemoteEngine) is watched afresh
    hub.engines[0] = fresh = await remote_engine()
    fresh.on_message(status(live=1, ticks=0))
    await trio.sleep(TIMEOUT_S + 0.1)
    assert dog.check() == [0] and killer.killed == [0, 0]


async def test_a_slow_engine_that_still_ticks_and_an_idle_one_are_never_killed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub, killer = Hub(), Killer()
    slow, idle = await remote_engine(), await remote_engine()
    hub.engines = {0: slow, 1: idle}
    dog, registry = watchdog(hub, killer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dog.run)
        # a step of 0.9 of the timeout, for a minute: late every tick, yet ticking
        nursery.start_soon(feed, slow, 60.0, 3, 0.9 * TIMEOUT_S)
        # no live slot: nothing to tick, its tick count stays
        nursery.start_soon(feed, idle, 60.0, 0, float("inf"))
        await trio.sleep(61)
        nursery.cancel_scope.cancel()
    assert killer.killed == [] and kills(registry) == 0
    # once the slow one's ticks stop (its last status said 3 live), it is
    await trio.sleep(TIMEOUT_S)
    assert dog.check() == [0]


async def test_an_unlinked_engine_is_not_watched(autojump_clock: trio.testing.MockClock) -> None:
    hub, killer = Hub(), Killer()
    engine = await remote_engine()
    hub.engines[0] = engine
    dog, _ = watchdog(hub, killer)
    engine.on_message(status(live=2, ticks=1))
    engine.disconnect()  # the process exited: its supervisor restarts it already
    await trio.sleep(2 * TIMEOUT_S)
    assert dog.check() == [] and killer.killed == []


def test_the_stall_timeout_is_bounded_and_zero_turns_it_off() -> None:
    def server(value: float) -> object:
        return load_config(env={}, overrides={"server.engine_stall_timeout_s": value}).engine

    assert load_config(env={}).engine.stall_timeout_s == 5.0
    assert server(0).stall_timeout_s == 0  # type: ignore[attr-defined]
    assert server(1).stall_timeout_s == 1  # type: ignore[attr-defined]
    env = {"DUPLEX_ENGINE_STALL_TIMEOUT_S": "30"}
    assert load_config(env=env).engine.stall_timeout_s == 30
    for bad in (-1, 0.5, 3601, float("nan")):
        with pytest.raises(ConfigError, match="engine_stall_timeout_s"):
            server(bad)
    with pytest.raises(ValueError, match="timeout_s"):
        EngineWatchdog(Hub(), Killer(), 0, MetricsRegistry().counter("c", "c"))  # type: ignore[arg-type]
    assert dataclasses.is_dataclass(load_config(env={}).server)
