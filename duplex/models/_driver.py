"""`EngineDriver`: the trio tick loop around a synchronous `Engine`.

Tick k is scheduled at ``t0 + k * period`` on trio's clock, so the cadence
never drifts and runs under ``MockClock``. With ``spec.tick_phases`` G > 1 the
grid is ``period / G`` and tick k steps the engine's phase group ``k mod G``.
Each step runs off the trio thread; a tick whose step finishes after the next
tick's scheduled time is late and counted, and the following ticks run back to
back until the loop is on its grid again (each tick consumes one queued input
frame, so catching up keeps latency instead of skipping frames). Outputs go to
each slot's subscriber (a bounded memory channel or a sink into the session's
mailbox) with ``send_nowait``: a full one drops the output and counts it, so
one slow session never holds up the tick.

A scoring model (``spec.steps_on_input``, the silero VAD) ticks only while some
slot has a whole frame queued, and one tick runs up to ``spec.max_steps_per_tick``
steps in one trip off the trio thread (each takes one frame of every slot that has
one), so a slot with a backlog catches up that many frames a tick; their outputs
go out in step order.

Replays in the slack: a slot that replays its prompt (or any prefill: its next step
holds its input) takes its frame in every tick and, between ticks, extra steps
batched over every replaying slot (`Engine.replay`). They run as units of the
process's `Slack` (the one request engines share; a private one when none is
given), so they start only after a tick's outputs are handed on, one unit at a
time with any batch work, and only when the next tick is not due. The engine's
scheduler says whether a step fits the time left (`Engine.replay_steps`: from
measured replay steps; before any, from a bound the tick steps give, or one probe
step), asked again before each step of a unit with the time really left; a unit
runs at most ``max_replay_steps`` and ends before the next tick on the grid even
when nothing else is live (the slack's window is then open). A tick due while a
unit runs waits for it (late, and counted by the slack as an overrun); the unit's
time raises the estimate. A replay step's output is silent; only a slot's last one
(``holds_input`` false: its next step takes input) is delivered, so the session is
ready at once and hears no extra silence; the others are counted as
``replay_frames_skipped``. Each prompted slot's time from `attach` to that output
goes to the recorder (``duplex_engine_prompt_ready_seconds``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar, final

import trio

from ._delivery import STALL_PERIODS, SlotDelivery
from ._engine import Engine, EngineStatistics, InputPush, SlotHandle, SlotOutput
from ._interface import ModelSpec, PcmFrame, SlotPrompt
from ._recorder import EngineRecorder
from ._scheduler import CapacityReport
from ._slack import Slack, SlackStatistics
from ._ticker import Fanout, Subscriber, Ticker, loop_counters

__all__ = ["DriverStatistics", "EngineDriver", "Offload"]

_T = TypeVar("_T")


class Offload(Protocol):
    """Runs a blocking callable away from the trio thread (``trio.to_thread.run_sync``)."""

    def __call__(self, sync_fn: Callable[[], _T], /) -> Awaitable[_T]: ...


async def inline(sync_fn: Callable[[], _T], /) -> _T:
    """The `Offload` that runs the callable on the event loop itself."""
    return sync_fn()


@final
@dataclass(frozen=True, slots=True)
class DriverStatistics:
    """Tick-loop and delivery counters, with the engine's own record.

    Args:
        ticks: loop iterations (idle ones included).
        idle_ticks: iterations with nothing live, where no step ran.
        late_ticks: steps that finished after the next tick's scheduled time.
        subscribers: attached slots.
        delivered: outputs handed to subscriber channels.
        dropped_full: outputs dropped because a subscriber's channel was full.
        dropped_closed: outputs dropped because a subscriber closed its channel
            (its slot is then detached).
        orphaned: outputs of slots detached while their step was running.
        engine: the engine's statistics.
        slack: the windows between its ticks that batch units ran in (``None``: no
            request engine shares the process).
        replay_units: slack units that ran replay steps.
        replay_frames_skipped: silent replay-step outputs not delivered (a slot's last
            replay output is delivered: it makes the session ready).
        replaying: slots whose next step replays (holds its input).
    """

    ticks: int
    idle_ticks: int
    late_ticks: int
    subscribers: int
    delivered: int
    dropped_full: int
    dropped_closed: int
    orphaned: int
    engine: EngineStatistics
    slack: SlackStatistics | None = None
    replay_units: int = 0
    replay_frames_skipped: int = 0
    replaying: int = 0

    def metric(self, name: str) -> float | None:
        """The value of ``ENGINE_METRICS`` entry ``name`` (``None``: nothing to report yet)."""
        engine = self.engine
        slack = self.slack
        values: dict[str, float | None] = {
            "duplex_engine_ticks_total": self.ticks,
            "duplex_engine_late_ticks_total": self.late_ticks,
            "duplex_engine_underruns_total": engine.underruns,
            "duplex_engine_silence_skipped_total": engine.silence_skipped,
            "duplex_engine_outputs_dropped_total": self.dropped_full + self.dropped_closed,
            "duplex_engine_input_frames_rejected_total": engine.frames_rejected,
            "duplex_engine_video_frames_dropped_total": engine.video_dropped,
            "duplex_engine_live_slots": engine.live_slots,
            "duplex_engine_slot_span": engine.slot_span,
            "duplex_engine_step_p99_seconds": engine.scheduler.p99_step_s,
            "duplex_engine_warmup_steps_total": engine.warmup_steps,
            "duplex_engine_replay_steps_total": engine.replay_steps,
            "duplex_engine_replaying_slots": self.replaying,
            "duplex_engine_slack_units_total": None if slack is None else slack.units,
            "duplex_engine_slack_deferred_total": None if slack is None else slack.deferred,
            "duplex_engine_slack_overran_total": None if slack is None else slack.overran,
            "duplex_engine_slack_beside_total": None if slack is None else slack.beside,
        }
        return values[name]


ENGINE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duplex_engine_ticks_total", "counter", "Engine ticks (current engine)"),
    ("duplex_engine_late_ticks_total", "counter", "Ticks whose step ended after the next tick"),
    ("duplex_engine_underruns_total", "counter", "Slot-ticks with no input (played as silence)"),
    ("duplex_engine_silence_skipped_total", "counter", "Queued silent frames skipped to repay lag"),
    ("duplex_engine_outputs_dropped_total", "counter", "Outputs dropped: a session fell behind"),
    ("duplex_engine_input_frames_rejected_total", "counter", "Input frames refused (queue full)"),
    ("duplex_engine_video_frames_dropped_total", "counter", "Video frames dropped (queue full)"),
    ("duplex_engine_live_slots", "gauge", "Slots in use"),
    ("duplex_engine_slot_span", "gauge", "Highest live slot + 1: the rows a step runs"),
    ("duplex_engine_step_p99_seconds", "gauge", "p99 step time over the recent window"),
    ("duplex_engine_warmup_steps_total", "counter", "Warm-up steps kept out of the window"),
    ("duplex_engine_replay_steps_total", "counter", "Prompt replay steps run between ticks"),
    ("duplex_engine_replaying_slots", "gauge", "Slots replaying their prompt now"),
    ("duplex_engine_slack_units_total", "counter", "Batch units run between ticks"),
    ("duplex_engine_slack_deferred_total", "counter", "Batch units that waited: no window fit"),
    ("duplex_engine_slack_overran_total", "counter", "Batch units still running at a step"),
    ("duplex_engine_slack_beside_total", "counter", "Steps run beside a lower-priority unit"),
)
"""The engine's metrics (name, kind, help), read from `DriverStatistics.metric`, labelled
with the model by whoever exports them."""


@final
class EngineDriver:
    """Ticks one engine at its frame rate and fans outputs out to subscribers.

    Every method but `run` is sync and non-blocking; they delegate to the
    engine, whose commands take effect at the start of the next step.

    Args:
        engine: the engine to drive.
        offload: how a step leaves the trio thread; ``None``: `inline` for a spec
            that ``steps_inline``, else ``trio.to_thread.run_sync``. Tests may pass
            `inline` so ``MockClock`` autojump cannot fire mid-step.
        recorder: where each tick's lateness goes (the engine records its steps in the
            same one); ``None``: not recorded.
        slack: the process's windows between ticks, which request engines' batch units
            run in: each step closes it, and its end opens it until the next tick is due;
            ``None``: nothing shares the process (replays then use a private one).
        replay_in_slack: replaying slots take extra steps between ticks (see the module
            docstring); ``False``: one frame per tick, as the ticks carry them.
        max_replay_steps: the most replay steps one slack unit runs.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        offload: Offload | None = None,
        recorder: EngineRecorder | None = None,
        slack: Slack | None = None,
        replay_in_slack: bool = True,
        max_replay_steps: int = 32,
    ) -> None:
        if max_replay_steps <= 0:
            raise ValueError(f"max_replay_steps must be positive, got {max_replay_steps}")
        self._engine = engine
        self._recorder = recorder
        self._slack = slack
        self._windows = slack if slack is not None else Slack()
        """Where the ticks open and close windows: the shared slack, or a private one."""
        self._replays = replay_in_slack and engine.spec.supports_prompts
        self._max_replay_steps = max_replay_steps
        self._engine_busy = trio.Lock()
        """Held around every trip to the engine's thread when replays run in the slack: a
        tick and a replay unit never step at once (`Engine.step` is not reentrant)."""
        self._replay_wanted = trio.Event()
        self._tick_ended = trio.Event()
        self._taken_at: dict[SlotHandle, float] = {}
        """Prompted slots not yet ready: when each was taken (trio's clock)."""
        self._replay_units = 0
        self._replay_skipped = 0
        if offload is None:
            offload = inline if engine.spec.steps_inline else trio.to_thread.run_sync
        self._offload = offload
        self._phases = engine.spec.tick_phases
        self._steps_per_tick = engine.spec.max_steps_per_tick
        self._stepping_since: float | None = None
        self.on_tick: Callable[[], None] | None = None
        """Called after each step's outputs are handed out: the engine process sends each
        session process its tick's outputs as one message then."""
        self._ticker = Ticker(engine.spec.frame_period_s / self._phases)
        self._fanout: Fanout[SlotHandle, SlotOutput] = Fanout(self.detach)
        self._delivery = SlotDelivery(self._fanout)

    @property
    def spec(self) -> ModelSpec:
        """The driven model's spec and capabilities."""
        return self._engine.spec

    def attach(
        self,
        owner: str,
        send_channel: Subscriber[SlotOutput],
        *,
        prompt: SlotPrompt | None = None,
    ) -> SlotHandle | None:
        """Take a slot (replaying ``prompt`` into it first) and deliver its outputs to
        ``send_channel``.

        The channel (or any `Subscriber`) stays the caller's: the driver never
        closes it. Bound it to a few frames; outputs that find it full are dropped.

        Returns:
            The slot handle, or ``None`` when admission says no (slots or step time).

        Raises:
            PromptUnsupported: a non-empty prompt for a model that takes none.
        """
        now = trio.current_time()
        handle = self._engine.acquire_slot(owner, prompt, now=now)
        if handle is not None:
            self._delivery.add(handle, send_channel)
            if prompt is not None and not prompt.empty:
                self._taken_at[handle] = now
                self._replay_wanted.set()
        return handle

    async def open_slot(
        self, owner: str, subscriber: Subscriber[SlotOutput], *, prompt: SlotPrompt | None = None
    ) -> SlotHandle | None:
        """`attach`, as a `SlotEngine` (the engine-process client's is a round trip)."""
        return self.attach(owner, subscriber, prompt=prompt)

    def detach(self, handle: SlotHandle) -> bool:
        """Release the slot; outputs of a step already running are dropped as orphaned.

        Returns:
            ``True`` if released now, ``False`` if it already was.
        """
        self._delivery.remove(handle)
        self._taken_at.pop(handle, None)
        return self._engine.release_slot(handle)

    def push_input(self, handle: SlotHandle, pcm: PcmFrame) -> InputPush:
        """Queue input audio; see `Engine.push_input` for framing and overflow."""
        return self._engine.push_input(handle, pcm)

    def push_video(self, handle: SlotHandle, frame_id: str, pts_ms: int, payload: bytes) -> int:
        """Queue a video frame; see `Engine.push_video`."""
        return self._engine.push_video(handle, frame_id, pts_ms, payload)

    def reset(self, handle: SlotHandle, epoch: int, *, clear_input: bool = True) -> None:
        """Start a new epoch for one slot; see `Engine.reset` (a prompted slot replays again)."""
        self._engine.reset(handle, epoch, clear_input=clear_input)
        self._replay_wanted.set()

    def capacity(self) -> CapacityReport:
        """How many slots admission allows now and what bounds it (on trio's clock, the
        one the steps are recorded on)."""
        return self._engine.capacity(trio.current_time())

    def stalled(self, now: float) -> bool:
        """A step has run for `STALL_PERIODS` frame periods and has not returned."""
        since = self._stepping_since
        return since is not None and now - since > STALL_PERIODS * self.spec.frame_period_s

    def statistics(self) -> DriverStatistics:
        """Snapshot of the loop and delivery counters."""
        engine = self._engine.statistics(trio.current_time())
        slack = None if self._slack is None else self._slack.statistics()
        return DriverStatistics(
            **loop_counters(self._ticker, self._fanout),
            engine=engine,
            slack=slack,
            replay_units=self._replay_units,
            replay_frames_skipped=self._replay_skipped,
            replaying=self._engine.replaying() if self._replays else 0,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick forever; run it in a nursery. Engine errors propagate (the engine is dead).

        Cancelling waits for a step in flight to finish, so no step outlives the loop.
        """
        if not self._replays:
            await self._ticker.run(self._has_work, self._tick, task_status=task_status)
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._replay_loop)
                await self._ticker.run(self._has_work, self._tick, task_status=task_status)
        except BaseExceptionGroup as group:  # one failure, as the ticks alone would raise it
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from group
            raise

    def _has_work(self) -> bool:
        live = self._engine.has_work()
        if not live:
            self._windows.idle()
        return live

    async def _tick(self, scheduled: float) -> None:
        # the phase follows the grid position (idle ticks included), so a group's
        # offset within the frame never moves
        phase = (self._ticker.ticks - 1) % self._phases if self._phases > 1 else None
        if self._recorder is not None:
            self._recorder.tick(trio.current_time() - scheduled)
        self._windows.step_started()
        try:
            if self._steps_per_tick == 1:
                steps = [await self._on_engine(partial(self._engine.step, scheduled, phase))]
            else:
                steps = await self._on_engine(partial(self._catch_up, scheduled))
            taken = self._taken_at
            for outputs in steps:
                for handle, output in outputs.items():
                    self._delivery.deliver(handle, output)
                    if taken and handle in taken and not output.frame.holds_input:
                        self._ready(handle)
            if self.on_tick is not None:
                self.on_tick()
        finally:
            # the window opens once the tick's outputs are handed on: a batch unit's
            # thread would otherwise hold the GIL while they are encoded and posted
            self._windows.step_ended(scheduled + self._ticker.period_s)
            self._tick_ended.set()
            self._tick_ended = trio.Event()

    async def _on_engine(self, work: Callable[[], _T]) -> _T:
        """One trip to the engine's thread, timed for `stalled`; with replays in the slack,
        after any other trip still running (a tick waits for a replay unit that overran)."""
        if not self._replays:
            return await self._timed(work)
        async with self._engine_busy:
            return await self._timed(work)

    async def _timed(self, work: Callable[[], _T]) -> _T:
        self._stepping_since = trio.current_time()
        try:
            return await self._offload(work)
        finally:
            self._stepping_since = None

    def _ready(self, handle: SlotHandle) -> None:
        """The prompted slot's replay is done: its time to ready is recorded."""
        taken = self._taken_at.pop(handle)
        if self._recorder is not None:
            self._recorder.prompt_ready(trio.current_time() - taken)

    async def _replay_loop(self) -> None:
        """Forever: while slots replay, run slack units of replay steps (module docstring)."""
        windows = self._windows
        while True:
            if not self._engine.replaying():
                self._replay_wanted = trio.Event()
                await self._replay_wanted.wait()
                continue
            await windows.acquire(self._engine.replay_step_s())
            try:
                # the next tick bounds the unit even where no live slot bounds the window
                until_tick = self._ticker.next_at - windows.margin_s - trio.current_time()
                budget = min(windows.time_left(), until_tick)
                steps = self._engine.replay_steps(budget, self._max_replay_steps)
                if steps:
                    await self._replay_unit(budget)
            finally:
                windows.release()
            if not steps:  # the window is too short for a step: the next one may not be
                await self._tick_ended.wait()

    async def _replay_unit(self, budget_s: float) -> None:
        """Run replay steps off the trio thread while the scheduler says the next fits the
        time left of ``budget_s``, and hand on each slot's last."""
        now = trio.current_time()
        replay = partial(self._engine.replay, now, self._max_replay_steps, within_s=budget_s)
        done = await self._on_engine(replay)
        self._replay_units += 1
        delivered = False
        taken = self._taken_at
        for outputs in done:
            for handle, output in outputs.items():
                if output.frame.holds_input:
                    self._replay_skipped += 1  # silent, and no input taken: nothing is lost
                    continue
                self._delivery.deliver(handle, output)
                delivered = True
                if taken and handle in taken:
                    self._ready(handle)
        if delivered and self.on_tick is not None:
            self.on_tick()

    def _catch_up(self, scheduled: float) -> list[dict[SlotHandle, SlotOutput]]:
        """Off the trio thread: up to ``max_steps_per_tick`` steps, while any input is queued."""
        steps = []
        for _ in range(self._steps_per_tick):
            outputs = self._engine.step(scheduled)
            if not outputs:
                break
            steps.append(outputs)
        return steps
