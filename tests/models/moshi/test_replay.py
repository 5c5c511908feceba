"""PersonaPlex prompts replayed in the slack (tiny-personaplex, a WAV voice, on CPU): fewer
ticks than frames, the same tokens and audio as the one-frame-per-tick replay, and no
tick missed by a live session on the same engine.

Steps take mock time: each moves the MockClock and the engine's timer on by a fixed cost
(a tick 12 ms plus 2 ms a row, a replay step 6 ms plus 1 ms a row), so the windows and the
step estimates are the same on any machine, and the real compute only has to finish."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import trio
import trio.testing

from duplex.models import (
    Engine,
    EngineDriver,
    EngineRecorder,
    ModelSpec,
    SlotOutput,
    SlotPrompt,
    StepOutput,
    StepPlan,
)
from duplex.models.moshi._checkpoint import LoadedMoshi, build_tiny_checkpoint, load_checkpoint
from duplex.models.moshi._engine_runner import MoshiEngineRunner
from duplex.models.moshi._models import moshi_spec

from ..models_support import FRAME, FakeTimer, tone
from .test_prompt import TEXT, _write_wav

PERIOD = 0.08
LIVE_FRAMES = 6
"""Frames each joiner speaks after its replay (compared between the two replays)."""
T = TypeVar("T")


async def inline(sync_fn: Callable[[], T]) -> T:
    await trio.lowlevel.checkpoint()
    return sync_fn()


@pytest.fixture(scope="module")
def plex(tmp_path_factory: pytest.TempPathFactory) -> LoadedMoshi:
    folder: Path = tmp_path_factory.mktemp("tiny-personaplex-replay")
    checkpoint = build_tiny_checkpoint(folder, seed=3, preset="tiny-personaplex")
    _write_wav(folder / "voices" / "speech.wav", 1.0, noise=True)  # 13 frames of voice
    return load_checkpoint(checkpoint)


class Clocked:
    """The real runner; each step moves the mock clock and the timer on by its cost."""

    def __init__(
        self, inner: MoshiEngineRunner, clock: trio.testing.MockClock, timer: FakeTimer
    ) -> None:
        self.inner = inner
        self.clock = clock
        self.timer = timer

    @property
    def spec(self) -> ModelSpec:
        return self.inner.spec

    def reset_slot(self, slot: int) -> None:
        self.inner.reset_slot(slot)

    def check_prompt(self, prompt: SlotPrompt) -> None:
        self.inner.check_prompt(prompt)

    def execute(self, plan: StepPlan) -> StepOutput:
        out = self.inner.execute(plan)
        replay = all(item.held for item in plan.inputs)
        rows = len(plan.inputs)
        cost = 0.006 + 0.001 * rows if replay else 0.012 + 0.002 * rows
        self.timer.now += cost
        self.clock.jump(cost)
        return out


@dataclass
class Run:
    """What each session received: (time received, output)."""

    got: dict[str, list[tuple[float, SlotOutput]]] = field(default_factory=dict)
    joined_at: float = 0.0
    late_ticks: int = 0
    replay_steps: int = 0
    held: int = 0
    ready_count: int = 0

    def live(self, name: str) -> list[SlotOutput]:
        """The session's outputs that took input (after its replay)."""
        return [out for _, out in self.got[name] if out.input_samples]

    def ready(self, name: str) -> tuple[int, float]:
        """Ticks the session's replay was given (its held outputs sent at ticks), and the
        time from joining to the first output after its replay."""
        outs = self.got[name]
        index = next(i for i, (_, out) in enumerate(outs) if not out.frame.holds_input)
        return index, outs[index][0] - self.joined_at


async def session_run(
    plex: LoadedMoshi,
    clock: trio.testing.MockClock,
    *,
    in_slack: bool,
    live: int,
    joiners: int,
    voice: str | None = "speech",
) -> Run:
    """``live`` unprompted sessions stream from the start; after 3 ticks ``joiners`` join at
    once with the prompt; run until each joiner has spoken `LIVE_FRAMES` frames."""
    timer = FakeTimer()
    runner = MoshiEngineRunner(plex, moshi_spec("tiny-personaplex"), seed=7)
    engine = Engine(Clocked(runner, clock, timer), timer=timer, max_input_frames=400)
    recorder = EngineRecorder("tiny-personaplex", runner.spec.max_slots)
    driver = EngineDriver(engine, offload=inline, recorder=recorder, replay_in_slack=in_slack)
    run = Run()
    live_names = [f"live{i}" for i in range(live)]
    join_names = [f"join{i}" for i in range(joiners)]

    async def collect(name: str, recv: trio.MemoryReceiveChannel[SlotOutput]) -> None:
        async for out in recv:
            run.got[name].append((trio.current_time(), out))

    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        sends = {}
        for name in live_names + join_names:
            send, recv = trio.open_memory_channel[SlotOutput](1024)
            sends[name] = send
            run.got[name] = []
            nursery.start_soon(collect, name, recv)
        for i, name in enumerate(live_names):
            handle = driver.attach(name, sends[name])
            assert handle is not None
            for k in range(300):  # pushed up front: a live session never underruns
                driver.push_input(handle, tone(100 + i, k))
        await trio.sleep(2.5 * PERIOD)
        run.joined_at = trio.current_time()
        prompt = SlotPrompt(text=TEXT, voice=voice)
        for i, name in enumerate(join_names):
            handle = driver.attach(name, sends[name], prompt=prompt)
            assert handle is not None
            for k in range(LIVE_FRAMES):
                driver.push_input(handle, tone(200 + i, k))
        for _ in range(400):
            if all(len(run.live(name)) >= LIVE_FRAMES for name in join_names):
                break
            await trio.sleep(PERIOD)
        nursery.cancel_scope.cancel()
    stats = driver.statistics()
    run.late_ticks = stats.late_ticks
    run.replay_steps = stats.engine.replay_steps
    replay = next(r for r in (runner.replay(s) for s in range(16)) if r is not None)
    run.held = replay.held
    run.ready_count = recorder.ready.count
    return run


def _same(a: list[SlotOutput], b: list[SlotOutput], *, exact: bool) -> None:
    assert [o.frame.text for o in a] == [o.frame.text for o in b]
    pcm_a, pcm_b = np.stack([o.frame.pcm for o in a]), np.stack([o.frame.pcm for o in b])
    if exact:
        np.testing.assert_array_equal(pcm_a, pcm_b)
    else:  # other batches around the same rows: float rounding only
        np.testing.assert_allclose(pcm_a, pcm_b, rtol=0, atol=1e-4)


async def test_a_replay_in_the_slack_takes_fewer_ticks_and_gives_the_same_output(
    plex: LoadedMoshi, autojump_clock: trio.testing.MockClock
) -> None:
    slow = await session_run(plex, autojump_clock, in_slack=False, live=0, joiners=1)
    fast = await session_run(plex, autojump_clock, in_slack=True, live=0, joiners=1)
    assert slow.held == fast.held > 40  # 13 voice frames, 12 of silence, the text's tokens
    slow_ticks, slow_ready = slow.ready("join0")
    fast_ticks, fast_ready = fast.ready("join0")
    assert slow_ticks == slow.held - 1 and slow.replay_steps == 0
    assert fast_ticks < fast.held // 4 and fast.replay_steps > fast.held // 2
    assert fast_ready < slow_ready / 4
    assert slow.ready_count == fast.ready_count == 1
    # the same tokens and audio, bit for bit: the replay's result did not change, only its speed
    _same(fast.live("join0"), slow.live("join0"), exact=True)
    assert len(fast.live("join0")) >= LIVE_FRAMES
    assert any(o.frame.pcm.any() for o in fast.live("join0"))
    assert fast.late_ticks == slow.late_ticks == 0


async def test_live_sessions_miss_no_tick_while_others_replay_in_the_slack(
    plex: LoadedMoshi, autojump_clock: trio.testing.MockClock
) -> None:
    slow = await session_run(plex, autojump_clock, in_slack=False, live=2, joiners=2)
    fast = await session_run(plex, autojump_clock, in_slack=True, live=2, joiners=2)
    assert fast.late_ticks == 0
    for name in ("live0", "live1"):
        outs = fast.got[name]
        ticks = [out.tick for _, out in outs]
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # one output every tick
        first = outs[0][1].at
        for received, out in outs:
            assert out.at == pytest.approx(first + (out.tick - ticks[0]) * PERIOD)
            assert received - out.at < PERIOD  # each handed on before the next tick
            assert out.input_samples == FRAME  # never an underrun
        # the neighbours' replay did not change what the live sessions hear
        count = min(len(outs), len(slow.got[name]))
        _same([o for _, o in outs[:count]], [o for _, o in slow.got[name][:count]], exact=False)
    for name in ("join0", "join1"):
        ticks, _ = fast.ready(name)
        assert ticks < fast.held // 3
        _same(fast.live(name), slow.live(name)[: len(fast.live(name))], exact=False)
    assert fast.ready_count == 2
