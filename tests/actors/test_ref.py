"""Tell, ask, replies and timers, under trio's MockClock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from duplex.actors import Actor, ActorContext, LaneSpec, Overflow, Restart, open_actor_system
from duplex.exceptions import ActorStopped, AskTimeout, MailboxFull
from duplex.metrics import MetricsRegistry

from .helpers import Journal, Ping, Recorder, Stop


@dataclass(frozen=True)
class Slow:
    seconds: float


@dataclass(frozen=True)
class Later:
    value: int


@dataclass(frozen=True)
class Answer:
    pass


class Sleeper(Actor[Any]):
    """Replies after sleeping; defers replies for Later and answers them on Answer."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, int]] = []

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        match message:
            case Slow(seconds):
                await trio.sleep(seconds)
                return seconds
            case Later(value):
                self.pending.append((ctx.defer_reply(), value))
            case Answer():
                for reply, value in self.pending:
                    reply.send(value * 10)
                self.pending.clear()
        return None


async def test_ask_returns_the_reply(registry: MetricsRegistry) -> None:
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(Recorder, Journal(), "r", name="r")
        assert await ref.ask(Ping(42), timeout=1) == 42
        assert system.lookup("r") is ref
        assert system.lookup("/user/r") is ref


async def test_ask_timeout_is_typed_and_late_reply_is_counted(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(Sleeper, name="s")
        start = trio.current_time()
        with pytest.raises(AskTimeout):
            await ref.ask(Slow(5), timeout=2)
        assert trio.current_time() - start == pytest.approx(2)
        await trio.sleep(4)  # the actor replies at t=5: nobody is waiting
        assert (
            registry.counter("duplex_ask_late_replies_total", "", ["actor"]).value(actor="Sleeper")
            == 1
        )
        assert await ref.ask(Slow(1), timeout=2) == 1


async def test_deferred_replies(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(Sleeper, name="s")
        results: list[int] = []
        async with trio.open_nursery() as nursery:
            for v in (1, 2):
                nursery.start_soon(lambda v=v: _collect(ref.ask(Later(v), timeout=5), results))
            await trio.sleep(1)
            await ref.tell(Answer())
        assert sorted(results) == [10, 20]


async def _collect(aw: Any, into: list[Any]) -> None:
    into.append(await aw)


async def test_stopped_actor_dead_letters(registry: MetricsRegistry) -> None:
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(Recorder, Journal(), "r", name="r", restart=Restart.TEMPORARY)
        await ref.tell(Stop())
        while ref.alive:
            await trio.sleep(0)
        await ref.tell(Ping(1))
        with pytest.raises(ActorStopped):
            await ref.ask(Ping(2), timeout=1)
        # the tell is dead-lettered; the asker is told instead
        assert [d.message for d in system.dead_letters] == [Ping(1)]
        assert (
            registry.counter("duplex_dead_letters_total", "", ["reason"]).value(reason="stopped")
            == 1
        )
        assert system.lookup("r") is None


async def test_ask_dropped_by_overflow_fails_the_asker(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    lanes = (
        LaneSpec("control", capacity=4, priority=0),
        LaneSpec("data", capacity=1, overflow=Overflow.DROP_OLDEST),
    )
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(Sleeper, name="s", lanes=lanes)
        errors: list[BaseException] = []

        async def ask_and_record() -> None:
            try:
                await ref.ask(Slow(0), timeout=10)
            except MailboxFull as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            ref.tell_nowait(Slow(3))  # occupies the actor
            await trio.sleep(1)
            nursery.start_soon(ask_and_record)
            await trio.sleep(1)
            ref.tell_nowait(Slow(0))  # pushes the queued ask out
        assert len(errors) == 1
        dropped = registry.counter("duplex_mailbox_dropped_total", "", ["actor", "lane", "reason"])
        assert dropped.value(actor="Sleeper", lane="data", reason="overflow") == 1


@dataclass(frozen=True)
class Arm:
    key: str
    delay: float
    repeat: bool = False


@dataclass(frozen=True)
class Disarm:
    key: str


@dataclass(frozen=True)
class Fired:
    key: str


class TimerActor(Actor[Any]):
    def __init__(self, fired: list[tuple[str, float]]):
        self.fired = fired

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        match message:
            case Arm(key, delay, repeat):
                ctx.start_timer(key, delay, Fired(key), repeat=repeat)
            case Disarm(key):
                return ctx.cancel_timer(key)
            case Fired(key):
                self.fired.append((key, trio.current_time()))
        return None


async def test_timers_fire_on_time_repeat_and_cancel(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    fired: list[tuple[str, float]] = []
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(TimerActor, fired, name="t")
        t0 = trio.current_time()
        await ref.tell(Arm("once", 1.5))
        await ref.tell(Arm("tick", 0.08, repeat=True))
        await ref.tell(Arm("replaced", 1.0))
        await ref.tell(Arm("replaced", 2.0))
        await trio.sleep(0.5)
        assert await ref.ask(Disarm("tick"), timeout=1) is True
        assert await ref.ask(Disarm("tick"), timeout=1) is False
        await trio.sleep(3)
    rel = [(k, round(t - t0, 6)) for k, t in fired]
    assert rel == [("tick", 0.08 * i) for i in range(1, 7)] + [("once", 1.5), ("replaced", 2.0)]


async def test_negative_timer_delay_is_refused(registry: MetricsRegistry) -> None:
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(TimerActor, [], name="t")
        with pytest.raises(ValueError, match="delay"):
            await ref.ask(Arm("x", -1), timeout=1)


class WithTask(Actor[Any]):
    """A background task that feeds the actor, then fails on request."""

    def __init__(self, seen: list[Any], fail: trio.Event, failures: list[int]):
        self.seen = seen
        self.fail = fail
        self.failures = failures

    async def on_start(self, ctx: ActorContext) -> None:
        ctx.start_soon(self.pump, ctx)

    async def pump(self, ctx: ActorContext) -> None:
        await ctx.self.tell(Ping("from task"))
        await self.fail.wait()
        if not self.failures:
            self.failures.append(1)
            raise RuntimeError("task failed")
        await trio.sleep_forever()

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        self.seen.append(message)


async def test_background_task_feeds_the_actor_and_its_crash_restarts_it(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    seen: list[Any] = []
    fail = trio.Event()
    async with open_actor_system(registry=registry) as system:
        await system.spawn(WithTask, seen, fail, [], name="w")
        await trio.sleep(1)
        assert seen == [Ping("from task")]
        fail.set()
        await trio.sleep(1)
        # the task's crash restarted the actor: the new incarnation's task told again
        assert seen == [Ping("from task"), Ping("from task")]
        restarts = registry.counter("duplex_actor_restarts_total", "", ["actor"])
        assert restarts.value(actor="WithTask") == 1


async def test_wait_stopped_returns_when_the_actor_is_gone(
    autojump_clock: trio.testing.MockClock, registry: MetricsRegistry
) -> None:
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(Recorder, Journal(), "r", name="r", restart=Restart.TEMPORARY)
        with trio.move_on_after(1) as scope:
            await ref.wait_stopped()
        assert scope.cancelled_caught
        await ref.tell(Stop())
        with trio.fail_after(1):
            await ref.wait_stopped()


async def test_tell_eager_delivers_without_a_checkpoint_and_waits_when_full(
    registry: MetricsRegistry, autojump_clock: trio.testing.MockClock
) -> None:
    """With room on the lane the message is queued before `tell_eager` returns, and no
    other task ran in between; a full ``block`` lane makes it wait like `tell`."""
    lanes = (LaneSpec("data", capacity=1, overflow=Overflow.BLOCK),)
    async with open_actor_system(registry=registry) as system:
        ref = await system.spawn(Sleeper, name="s", lanes=lanes)
        ran: list[str] = []

        async def other() -> None:
            ran.append("other")

        async with trio.open_nursery() as nursery:
            ref.tell_nowait(Slow(5))  # the actor is busy for 5 s
            await trio.sleep(1)
            nursery.start_soon(other)
            await ref.tell_eager(Slow(0))  # room: queued at once, no checkpoint
            assert ran == [] and ref.statistics().lane("data").queued == 1
            started = trio.current_time()
            await ref.tell_eager(Slow(0))  # full: waits until the actor takes the first
            assert trio.current_time() - started == pytest.approx(4.0)
