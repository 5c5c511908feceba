"""The sleep of engine processes as objects: paused children are not restarted, and what
cannot sleep says so (501)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio

from duplex.actors import ActorSystem
from duplex.topology._sleep import (
    WAKE_S,
    LocalEngineSleep,
    ProcessEngineSleep,
    SessionsLive,
    SleepUnsupported,
    WakeUnfinished,
)


async def test_an_engine_of_its_own_beside_shards_cannot_sleep() -> None:
    """An in-process engine beside session shards (each shard has one) is never attached:
    a sleep, and a wake, answer 501 ``sleep_unsupported`` naming why."""
    sleeper = LocalEngineSleep(cast(ActorSystem, None))
    for call in (sleeper.sleep, sleeper.wake):
        with pytest.raises(SleepUnsupported) as refused:
            await call()
        assert refused.value.status_hint == 501


class Hub:
    def __init__(self, live: int) -> None:
        self.sleeping = False
        self.live_sessions = live
        self.engines: dict[int, Any] = {0: object()}
        self.evicted = 0

    async def evict_all(self, reason: str) -> int:
        self.evicted, self.live_sessions = self.live_sessions, 0
        return self.evicted


class Engines:
    def __init__(self) -> None:
        self.processes: dict[int, Any] = {}
        self.paused = 0
        self.resumed = 0

    async def pause(self) -> None:
        self.paused += 1

    async def resume(self) -> None:
        self.resumed += 1


class Shards:
    """Two shards with one live session each, answering the sleep's queries."""

    def __init__(self) -> None:
        self.live = [1, 1]
        self.sleeping = [False, False]
        self.asked: list[str] = []

    async def query(self, what: str) -> list[Any]:
        self.asked.append(what)
        if what in ("sleep", "wake"):
            self.sleeping = [what == "sleep"] * 2
        if what == "evict":
            told, self.live = self.live, [0, 0]
            return told
        return list(self.live)


async def test_live_sessions_in_any_shard_refuse_until_forced() -> None:
    hub, engines, shards = Hub(live=0), Engines(), Shards()
    sleeper = ProcessEngineSleep(hub, engines)  # type: ignore[arg-type]
    sleeper.attach_shards(shards)
    with pytest.raises(SessionsLive) as refused:
        await sleeper.sleep()
    assert "2 session(s)" in str(refused.value)
    assert not hub.sleeping and shards.sleeping == [False, False]  # admission open again
    assert engines.paused == 0
    answer = await sleeper.sleep(force=True)
    assert answer["sessions_told"] == 2 and engines.paused == 1
    assert hub.sleeping and shards.sleeping == [True, True]
    assert (await sleeper.sleep())["already"] is True
    with trio.fail_after(1):
        woke = await sleeper.wake()
    assert woke["status"] == "awake" and engines.resumed == 1
    assert not hub.sleeping and shards.sleeping == [False, False]


class Stuck(Engines):
    """Engine processes that never come back (a model that cannot load, a crash loop)."""

    async def resume(self) -> None:
        self.resumed += 1
        await trio.sleep_forever()


async def test_a_wake_whose_engines_never_start_answers_503_and_stays_asleep(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub, engines = Hub(live=0), Stuck()
    sleeper = ProcessEngineSleep(hub, engines)  # type: ignore[arg-type]
    await sleeper.sleep()
    started = trio.current_time()
    with pytest.raises(WakeUnfinished) as refused:
        await sleeper.wake()
    assert refused.value.status_hint == 503 and trio.current_time() - started == WAKE_S
    assert sleeper.asleep and hub.sleeping  # admission stays closed
    engines.resume = Engines.resume.__get__(engines)  # type: ignore[method-assign]
    assert (await sleeper.wake())["status"] == "awake"  # they came back: a wake opens it
    assert not hub.sleeping
