"""Supervision: strategies, restart types, intensity, escalation, backoff, shutdown."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from duplex.actors import (
    Actor,
    ActorContext,
    Backoff,
    Restart,
    Strategy,
    SupervisorSpec,
    open_actor_system,
)
from duplex.actors._supervisor import unwrap
from duplex.exceptions import RestartIntensityExceeded
from duplex.metrics import MetricsRegistry

from .helpers import Crash, Journal, Ping, Recorder, Stop

TEMPORARY = Restart.TEMPORARY


async def settle() -> None:
    """Let restarts run to completion (every task blocked, clock jumps)."""
    await trio.sleep(1)


async def spawn_all(system: Any, journal: Journal, names: str, **kw: Any) -> list[Any]:
    return [await system.spawn(Recorder, journal, n, name=n, **kw) for n in names]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (Strategy.ONE_FOR_ONE, [("b", "restart:boom"), ("b", "start")]),
        (
            Strategy.ONE_FOR_ALL,
            [("c", "stop"), ("a", "stop"), ("a", "start"), ("b", "restart:boom"),
             ("b", "start"), ("c", "start")],
        ),
        (
            Strategy.REST_FOR_ONE,
            [("c", "stop"), ("b", "restart:boom"), ("b", "start"), ("c", "start")],
        ),
    ],
)  # fmt: skip
async def test_strategies(
    autojump_clock: trio.testing.MockClock,
    registry: MetricsRegistry,
    strategy: Strategy,
    expected: list[tuple[str, str]],
) -> None:
    journal = Journal()
    root = SupervisorSpec(strategy=strategy)
    async with open_actor_system(registry=registry, root=root) as system:
        a, b, c = await spawn_all(system, journal, "abc")
        journal.events.clear()
        await b.tell(Crash())
        await settle()
        assert journal.events == expected
        # refs survive restarts: the mailbox is kept
        assert [await r.ask(Ping(n), timeout=1) for n, r in enumerate((a, b, c))] == [0, 1, 2]
        journal.events.clear()
    # ordered shutdown: reverse start order
    assert journal.events == [("c", "stop"), ("b", "stop"), ("a", "stop")]


@pytest.mark.parametrize(
    ("restart", "after_stop", "after_crash"),
    [
        (Restart.PERMANENT, True, True),
        (Restart.TRANSIENT, False, True),
        (Restart.TEMPORARY, False, False),
    ],
)
async def test_restart_types(
    autojump_clock: trio.testing.MockClock,
    registry: MetricsRegistry,
    restart: Restart,
    after_stop: bool,
    after_crash: bool,
) -> None:
    journal = Journal()
    async with open_actor_system(registry=registry) as system:
        stopper = await system.spawn(Recorder, journal, "s", name="s", restart=restart)
        crasher = await system.spawn(Recorder, journal, "c", name="c", restart=restart)
        await stopper.tell(Stop())
        await crasher.tell(Crash())
        await settle()
        assert stopper.alive is after_stop
        assert crasher.alive is after_crash
        assert journal.of("s").count("start") == (2 if after_stop else 1)
        assert journal.of("c").count("start") == (2 if after_crash else 1)


async def test_intensity_exceeded_escalates_out_of_the_root(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    journal = Journal()
    root = SupervisorSpec(max_restarts=3, period=5.0)
    with pytest.raises(BaseExceptionGroup) as info:
        async with open_actor_system(registry=registry, root=root) as system:
            a, _b = await spawn_all(system, journal, "ab")
            for _ in range(4):
                await a.tell(Crash())
                await trio.sleep(1)  # 4 crashes within 5 s
            await trio.sleep_forever()
    leaf = unwrap(info.value)
    assert isinstance(leaf, RestartIntensityExceeded)
    assert "4 restarts within 5.0 s" in str(leaf)
    # the surviving child was stopped before the escalation; the crashed one had no stop
    assert journal.events[-1] == ("b", "stop")
    assert journal.of("a").count("stop") == 0
    assert (
        registry.counter("duplex_actor_restarts_total", "", ["actor"]).value(actor="Recorder") == 3
    )


async def test_intensity_window_slides(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    journal = Journal()
    async with open_actor_system(
        registry=registry, root=SupervisorSpec(max_restarts=3, period=5.0)
    ) as system:
        (a,) = await spawn_all(system, journal, "a")
        for _ in range(10):  # one crash every 2 s: never more than 3 in 5 s
            await a.tell(Crash())
            await trio.sleep(2)
        assert a.alive
        assert journal.of("a").count("start") == 11


class Parent(Actor[Any]):
    """Spawns a child that it lets crash; its own supervision allows one restart."""

    supervision = SupervisorSpec(max_restarts=1, period=10.0)

    def __init__(self, journal: Journal):
        self.journal = journal
        self.child: Any = None

    async def on_start(self, ctx: ActorContext) -> None:
        self.journal.events.append(("parent", "start"))
        self.child = await ctx.spawn(Recorder, self.journal, "child", name="child")

    async def on_stop(self, ctx: ActorContext) -> None:
        self.journal.events.append(("parent", "stop"))

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        if isinstance(message, Crash):
            await self.child.tell(message)
            return None
        return await self.child.ask(message, timeout=1)


async def test_child_escalation_restarts_the_parent(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    journal = Journal()
    async with open_actor_system(registry=registry) as system:
        parent = await system.spawn(Parent, journal, name="p")
        assert system.lookup("/user/p/child") is not None
        await parent.tell(Crash())
        await settle()
        assert journal.of("parent").count("start") == 1  # one restart is within intensity
        await parent.tell(Crash())
        await settle()
        # the second child restart exceeds the parent's intensity: the parent restarts
        assert journal.of("parent").count("start") == 2
        assert await parent.ask(Ping("ok"), timeout=1) == "ok"
        journal.events.clear()
    # shutdown: children stop before their parent
    assert journal.events == [("child", "stop"), ("parent", "stop")]


async def test_crash_in_on_start_fails_the_first_spawn(registry: MetricsRegistry) -> None:
    journal = Journal()
    async with open_actor_system(registry=registry) as system:
        with pytest.raises(RuntimeError, match="failed to start"):
            await system.spawn(Recorder, journal, "x", 1, name="x")
        assert system.lookup("x") is None
        # the name is free again
        ref = await system.spawn(Recorder, journal, "x", name="x")
        assert await ref.ask(Ping(1), timeout=1) == 1


async def test_crash_in_on_start_during_restart_counts_toward_intensity(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    journal = Journal()

    class FailsAfterFirst(Recorder):
        async def on_start(self, ctx: ActorContext) -> None:
            self.journal.events.append((self.name, "start"))
            if self.journal.of(self.name).count("start") > 1:
                raise RuntimeError("cannot restart")

    with pytest.raises(BaseExceptionGroup) as info:
        async with open_actor_system(
            registry=registry, root=SupervisorSpec(max_restarts=3, period=5.0)
        ) as system:
            ref = await system.spawn(FailsAfterFirst, journal, "f", name="f")
            await ref.tell(Crash())
            await trio.sleep_forever()
    assert isinstance(unwrap(info.value), RestartIntensityExceeded)
    assert journal.of("f").count("start") == 4  # first start + 3 failed restarts


async def test_backoff_delays_restarts(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    journal = Journal()
    spec = SupervisorSpec(max_restarts=5, period=60.0, backoff=Backoff(0.5, 2.0, 1.5))
    starts: list[float] = []

    class Timed(Recorder):
        async def on_start(self, ctx: ActorContext) -> None:
            starts.append(trio.current_time())

    async with open_actor_system(registry=registry, root=spec) as system:
        ref = await system.spawn(Timed, journal, "t", name="t")
        for _ in range(4):
            t = trio.current_time()
            await ref.tell(Crash())
            while len(starts) < 2 or starts[-1] < t:
                await trio.sleep(0.01)
    delays = [round(s - starts[0], 2) for s in starts[1:]]
    assert delays[0] == pytest.approx(0.5, abs=0.02)
    assert delays[1] - delays[0] == pytest.approx(1.0, abs=0.02)
    assert delays[2] - delays[1] == pytest.approx(1.5, abs=0.02)  # capped at maximum
    assert delays[3] - delays[2] == pytest.approx(1.5, abs=0.02)


class Hangs(Actor[Any]):
    def __init__(self, finished: list[str]):
        self.finished = finished

    async def on_stop(self, ctx: ActorContext) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.finished.append(f"cancelled at {trio.current_time():.1f}")

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        return None


async def test_shutdown_timeout_then_cancellation(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    finished: list[str] = []
    t0 = trio.current_time()
    async with open_actor_system(registry=registry) as system:
        await system.spawn(Hangs, finished, name="h", shutdown_timeout=2.5)
    assert finished == [f"cancelled at {t0 + 2.5:.1f}"]
    assert trio.current_time() - t0 == pytest.approx(2.5)


class StopsAt(Actor[Any]):
    """Records when it stopped."""

    def __init__(self, stopped: list[tuple[str, float]], name: str):
        self.stopped, self.name = stopped, name

    async def on_stop(self, ctx: ActorContext) -> None:
        self.stopped.append((self.name, trio.current_time()))

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        return None


async def test_temporary_children_stop_together_and_before_the_older_ones(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    """Three stuck temporary children (sessions) take one shutdown timeout, not three; the
    child started before them (what they may use) stops only once they are gone."""
    finished: list[str] = []
    stopped: list[tuple[str, float]] = []
    t0 = trio.current_time()
    async with open_actor_system(registry=registry) as system:
        await system.spawn(StopsAt, stopped, "engine", name="engine")
        for n in range(3):
            await system.spawn(
                Hangs, finished, name=f"session-{n}", shutdown_timeout=2.5, restart=TEMPORARY
            )
        await system.spawn(StopsAt, stopped, "newest", name="newest", restart=TEMPORARY)
    assert finished == [f"cancelled at {t0 + 2.5:.1f}"] * 3
    assert stopped == [("newest", pytest.approx(t0)), ("engine", pytest.approx(t0 + 2.5))]
    assert trio.current_time() - t0 == pytest.approx(2.5)
    finished.clear()
    async with open_actor_system(registry=registry) as system:  # permanent: one at a time
        for n in range(2):
            await system.spawn(Hangs, finished, name=f"service-{n}", shutdown_timeout=2.5)
    assert finished == [f"cancelled at {t0 + 5.0:.1f}", f"cancelled at {t0 + 7.5:.1f}"]


async def test_no_task_outlives_the_system(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    before = trio.lowlevel.current_statistics().tasks_living
    async with open_actor_system(registry=registry) as system:
        parent = await system.spawn(Parent, Journal(), name="p")
        await parent.tell(Crash())
        await trio.sleep(1)
        assert trio.lowlevel.current_statistics().tasks_living > before
        assert system.paths() == ["/user/p", "/user/p/child"]
    assert trio.lowlevel.current_statistics().tasks_living == before
    assert system.paths() == []


class SpawnsSibling(Actor[Any]):
    """Its on_start spawns another top-level actor (as a connection opens a session)."""

    def __init__(self, system: Any, journal: Journal):
        self.system = system
        self.journal = journal

    async def on_start(self, ctx: ActorContext) -> None:
        await self.system.spawn(Recorder, self.journal, "sibling", name="sibling")

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        return None


class SlowStart(Actor[Any]):
    async def on_start(self, ctx: ActorContext) -> None:
        await trio.sleep(5)

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        return None


async def test_on_start_may_spawn_a_sibling_and_spawns_do_not_wait_for_each_other(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    journal = Journal()
    async with open_actor_system(registry=registry) as system:
        with trio.fail_after(1):
            await system.spawn(SpawnsSibling, system, journal, name="opener")
        assert system.lookup("sibling") is not None
        done: list[str] = []
        async with trio.open_nursery() as nursery:

            async def spawn(cls: type[Actor[Any]], name: str, *args: Any) -> None:
                await system.spawn(cls, *args, name=name)
                done.append(f"{name}@{trio.current_time():.0f}")

            nursery.start_soon(spawn, SlowStart, "slow")
            await trio.sleep(0.1)
            nursery.start_soon(spawn, Recorder, "fast", journal, "fast")
        assert done == ["fast@0", "slow@5"]


class _Holder(Actor[Any]):
    """An actor whose one argument is the thing a test watches."""

    def __init__(self, payload: object) -> None:
        self.payload = payload

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        ctx.stop()  # as a session ends itself
        return None


async def test_an_exited_child_keeps_nothing_of_its_arguments_alive() -> None:
    """The supervisor lets go of a child once its exit is handled: its arguments (a session's
    engine, say) are freed, not kept until the next child exits."""
    import gc
    import weakref

    class Payload:
        pass

    payload = Payload()
    watched = weakref.ref(payload)
    async with open_actor_system(registry=MetricsRegistry()) as system:
        ref = await system.spawn(_Holder, payload, name="held", restart=Restart.TEMPORARY)
        del payload
        await ref.tell(Ping())
        del ref  # a ref reaches its cell, as a live child's would
        await trio.sleep(0.1)
        assert system.lookup("held") is None
        gc.collect()
        assert watched() is None
