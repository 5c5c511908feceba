"""A prompted session is ready as soon as its replay is done, in the slack: on its first
engine and again on a restarted one (the session's state rebuilt by the same replay).

The engine runs the replay test runner (`PrefillRunner`: a prompt of N characters is a
prefill of N frames, each step taking mock time), so ticks and windows are on the mock clock.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from duplex import sessions as ds
from duplex.actors import ActorSystem, Restart, open_actor_system
from duplex.models import Engine, EngineDriver, EngineRecorder
from duplex.runtime._actor import (
    Attach,
    EngineReplaced,
    Outbound,
    SessionActor,
    SessionResources,
    engine_sink,
    slot_prompt,
)

from ..models.models_support import FakeTimer
from ..models.test_replay import SPEC, PrefillRunner, inline
from .session_fakes import Hub, Socket

PERIOD = SPEC.frame_period_s
PROMPT_FRAMES = 60


def prompted_driver(clock: trio.testing.MockClock, *, in_slack: bool = True) -> EngineDriver:
    timer = FakeTimer()
    recorder = EngineRecorder(SPEC.name, SPEC.max_slots)
    engine = Engine(PrefillRunner(clock, timer), timer=timer)
    return EngineDriver(engine, offload=inline, recorder=recorder, replay_in_slack=in_slack)


async def wait_ready(told: list[object], after: int = 0) -> float:
    """When the socket was told ``session.ready`` (the first time past ``after`` messages)."""
    with trio.fail_after(60):
        while True:
            for message in told[after:]:
                if isinstance(message, Outbound) and isinstance(message.event, ds.SessionReady):
                    return trio.current_time()
            await trio.sleep(PERIOD / 8)


async def open_session(
    system: ActorSystem, driver: EngineDriver, told: list[object]
) -> tuple[Any, float]:
    config = ds.SessionConfig(prompt=ds.SessionPrompt("x" * PROMPT_FRAMES), announce_ready=True)
    machine = ds.SessionMachine(config)
    sink = engine_sink(8)
    started = trio.current_time()
    handle = driver.attach(machine.session_id, sink, prompt=slot_prompt(config))
    assert handle is not None
    ref = await system.spawn(
        SessionActor,
        machine,
        SessionResources(driver, handle, sink),
        Hub(),
        name=machine.session_id,
        restart=Restart.TEMPORARY,
        lanes=SessionActor.lanes_for(machine.config),
    )
    socket = await system.spawn(Socket, told)
    await ref.tell(Attach(1, socket))
    return ref, started


async def test_session_ready_comes_when_the_replay_ends_in_the_slack(
    autojump_clock: trio.testing.MockClock,
) -> None:
    took = {}
    for in_slack in (False, True):
        driver = prompted_driver(autojump_clock, in_slack=in_slack)
        told: list[object] = []
        async with open_actor_system() as system, trio.open_nursery() as nursery:
            await nursery.start(driver.run)
            ref, started = await open_session(system, driver, told)
            took[in_slack] = await wait_ready(told) - started
            await system.stop(ref)
            nursery.cancel_scope.cancel()
    assert took[False] >= (PROMPT_FRAMES - 1) * PERIOD  # one frame per tick
    assert took[True] < PROMPT_FRAMES * PERIOD / 6  # in the slack: a few ticks
    ready = [m for m in told if isinstance(m, Outbound) and isinstance(m.event, ds.SessionReady)]
    assert len(ready) == 1


async def test_a_session_moved_onto_a_restarted_engine_replays_its_prompt_in_the_slack(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first, second = prompted_driver(autojump_clock), prompted_driver(autojump_clock)
    told: list[object] = []
    async with open_actor_system() as system, trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await nursery.start(second.run)
        ref, _ = await open_session(system, first, told)
        await wait_ready(told)
        await trio.sleep(4 * PERIOD)
        moved = trio.current_time()
        await ref.tell(EngineReplaced(second, "engine crashed"))
        with trio.fail_after(60):
            while second.statistics().engine.live_slots == 0 or second.statistics().replaying:
                await trio.sleep(PERIOD / 8)
        rebuilt = trio.current_time() - moved
        stats = second.statistics()
        await system.stop(ref)
        nursery.cancel_scope.cancel()
    assert stats.engine.replay_steps > PROMPT_FRAMES // 2  # the prefill ran in the slack
    assert rebuilt < PROMPT_FRAMES * PERIOD / 6
    assert stats.late_ticks == 0
