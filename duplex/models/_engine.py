"""The synchronous engine: per-slot input queues, one batched step per tick.

`Engine.step` follows vllm's ``EngineCore.step``: return early when nothing is
live, else schedule (build a `StepPlan`), execute (the runner), update (tag
outputs, record the step time). It imports no trio.

Threading: the driver runs `step` on a worker thread while trio keeps calling
`acquire_slot`, `push_input`, `reset` and `release_slot`. Those calls only
touch bookkeeping under a short lock and queue their effect on the runner
(new, reset, released slots); `step` applies the queue before it executes,
as vllm applies aborts before the update. The runner is touched by `step`
alone, so it needs no lock and never sees a half-applied command.

Late input: a tick whose slot has no frame steps it on silence (an underrun).
When the late frame then arrives, the slot runs one frame behind for good: one
frame per tick can never drain it. So each underrun is remembered as a frame
of *lag* (at most ``max_lag_frames``; a longer gap is the client pausing, and
owes nothing), and while lag is owed and a second frame
is already waiting, a queued frame that is itself silence (RMS under
``silence_rms``) is skipped: the model's timeline gets back the silence it was
given. Speech is never skipped; the lag is repaid in the user's next pause.

Prompts: `acquire_slot` takes a `SlotPrompt` (one with text or a voice is refused
with `PromptUnsupported` unless the spec ``supports_prompts``; one with only a
sampling goes to any model, and holds nothing); the plan of the slot's first tick
carries it in ``new_prompts``. While the runner replays it, the slot's steps
are *held*: the engine pops no input (it stays queued, nothing is lost, no
underrun or lag is counted) and the runner's outputs are silent. The first step
of a prompted slot (and the first after a `reset`) is held; after that the
runner's ``FrameOutput.holds_input`` says whether the next one is. Each held
step raises the slot's queue bound by one frame, so input sent in real time
during the replay is kept; that backlog stays as extra latency.

Replay steps: a replaying slot takes its held frame in each tick (so a replay
never runs slower than one frame per tick) and extra steps between ticks:
`replay` runs up to a given number of steps, each over every slot that still
holds (new ones included) and nothing else. The runner sees an ordinary
`StepPlan` of those slots, so the replay's result is the same whichever steps
carried it; only fewer ticks pass. The same path serves any prefill a runner
reports with ``holds_input`` (today: the prompt replay of a new slot, of a reset
one, and of a session moved onto a restarted engine). How many steps fit the
time left is the scheduler's answer (`replay_steps`, from the replay steps' own
measured times, which reach neither admission's window nor the step histogram);
the driver runs them in the slack.

Phases: with ``spec.tick_phases`` G > 1 every slot belongs to one of G groups
(a newcomer joins the smallest, lowest first) and ``step(now, phase)`` steps
only that group; the driver calls the G phases in turn, ``frame_period / G``
apart, so each slot still steps once per frame while each sub-tick's outputs
are a G-th of the whole (one CPU core sends them before the next group's are
due, instead of all sessions' at one instant). Queued commands (releases,
resets) are applied at whichever step comes first.

Scoring models (``spec.steps_on_input``, the silero VAD): a step takes only the
slots with a whole frame queued; a slot with none is skipped (no underrun, no
output), and its queued commands (a reset, its first state) reach the runner
before its next frame does. Each queued frame keeps the sample where it starts
in everything pushed to the slot, which its output carries as ``position``.

Video is aligned to the audio clock: a frame is stamped with the number of
input samples pushed before it, and reaches the model with the tick whose
audio covers that instant (not before its audio, not a tick late). When the
slot has no audio to wait for (an underrun with nothing queued), waiting
frames go out at once, so video-only input is never held back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import final

import numpy as np

from duplex.exceptions import (
    PromptUnsupported,
    RunnerContractError,
    SlotReleased,
    VideoInputUnsupported,
)
from duplex.pcm import float_to_pcm16

from ._interface import (
    FrameOutput,
    ModelRunner,
    ModelSpec,
    PcmFrame,
    SlotInput,
    SlotPrompt,
    StepPlan,
    VideoFrame,
)
from ._recorder import EngineRecorder
from ._scheduler import CapacityReport, Scheduler, SchedulerStatistics

__all__ = [
    "Engine",
    "EngineStatistics",
    "InputPush",
    "SlotHandle",
    "SlotOutput",
    "SlotStatistics",
]


@final
@dataclass(frozen=True, slots=True)
class SlotHandle:
    """A claim on one slot; ``generation`` tells a stale handle from the slot's next owner."""

    slot: int
    owner: str
    generation: int


@final
@dataclass(frozen=True, slots=True)
class SlotOutput:
    """One slot's output for one tick, tagged for fencing and audio accounting.

    Args:
        handle: the slot's owner.
        epoch: the slot's epoch when this tick's input was taken; a session
            drops outputs whose epoch is older than its own.
        tick: engine tick number.
        at: the ``now`` passed to `Engine.step` (the tick's scheduled time).
        position: audio-clock position of this tick's input frame, in samples.
        input_samples: real input samples consumed (0 on an underrun; two
            frames' worth when a silent frame was skipped to repay lag).
        frame: what the model produced.
        pcm16: ``frame.pcm`` as little-endian PCM16 bytes, the wire's format: the
            whole tick is converted in one vectorised call on the step's thread.
    """

    handle: SlotHandle
    epoch: int
    tick: int
    at: float
    position: int
    input_samples: int
    frame: FrameOutput
    pcm16: bytes = field(default=b"", repr=False)


@final
@dataclass(frozen=True, slots=True)
class InputPush:
    """What `Engine.push_input` did with a chunk; overflow is reported, never silent.

    Args:
        frames_queued: whole frames this call added to the slot's queue.
        frames_rejected: whole frames refused because the queue was full (newest dropped).
        buffered_samples: samples waiting for the next whole frame.
        queue_depth: frames queued after this call.
    """

    frames_queued: int
    frames_rejected: int
    buffered_samples: int
    queue_depth: int

    @property
    def overflowed(self) -> bool:
        """Some input was refused: the caller is pushing faster than real time."""
        return self.frames_rejected > 0


@final
@dataclass(frozen=True, slots=True)
class SlotStatistics:
    """Counters of one live slot."""

    handle: SlotHandle
    epoch: int
    ticks: int
    underruns: int
    lag_frames: int
    silence_skipped: int
    queue_depth: int
    peak_queue_depth: int
    max_input_frames: int
    frames_rejected: int
    video_queued: int
    video_dropped: int


@final
@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """Engine counters; step times come from the scheduler's window.

    ``overrun_steps`` counts steps whose measured duration exceeded the frame
    period (the engine cannot keep cadence at that batch size); lateness
    against the tick clock is counted by the driver. ``warmup_steps`` counts
    steps the runner flagged as warm-up (``StepOutput.warmup``: graph capture,
    first use), which never reach the step-time window.
    """

    ticks: int
    live_slots: int
    underruns: int
    silence_skipped: int
    slot_underruns: Mapping[int, int]
    frames_rejected: int
    video_dropped: int
    overrun_steps: int
    warmup_steps: int
    scheduler: SchedulerStatistics
    replay_steps: int = 0
    """Replay steps run between ticks (`Engine.replay`); not counted in ``ticks``."""
    slot_span: int = 0
    """The highest live slot id + 1: the rows a static-shape step runs (slots are handed
    out lowest first, so one session left on a high slot keeps the step that wide)."""


@dataclass(slots=True)
class _Slot:
    """The per-session slot: the engine's only mutable per-session state."""

    handle: SlotHandle
    max_input_frames: int
    max_video_frames: int
    frame_samples: int
    phase: int = 0
    """The group this slot steps in (see "Phases" in the module docstring)."""
    epoch: int = 0
    ticks: int = 0
    prompt: SlotPrompt | None = None
    fresh: bool = True
    reset_pending: bool = False
    holding: bool = False
    """The next tick replays the prompt: its input stays queued."""

    held: int = 0
    """Held ticks since the input was last cleared: the queue may exceed its bound by
    this many frames, the backlog a replay leaves (so input sent meanwhile is kept)."""
    queue: deque[PcmFrame] = field(init=False)
    starts: deque[int] = field(init=False)
    """Where each queued frame starts among the samples pushed (``steps_on_input`` only)."""
    partial: PcmFrame = field(init=False)
    filled: int = 0
    video: deque[tuple[int, VideoFrame]] = field(init=False)
    """Waiting video frames with the input sample count they are due at."""
    pushed: int = 0
    """Input samples pushed so far (the slot's audio clock)."""
    consumed: int = 0
    """Input samples consumed, skipped, refused or cleared so far."""
    underruns: int = 0
    lag: int = 0
    gap: int = 0
    silence_skipped: int = 0
    peak_queue_depth: int = 0
    frames_rejected: int = 0
    video_dropped: int = 0

    def __post_init__(self) -> None:
        self.queue = deque()  # bounded by push_input: max_input_frames + held
        self.starts = deque()
        self.partial = np.zeros(self.frame_samples, dtype=np.float32)
        self.video = deque(maxlen=self.max_video_frames)

    @property
    def replays(self) -> bool:
        """The slot has a prompt to replay (not only a sampling)."""
        return self.prompt is not None and not self.prompt.empty

    def clear_input(self) -> None:
        self.queue.clear()
        self.starts.clear()
        self.filled = 0
        self.consumed = self.pushed  # nothing before this point will be consumed
        self.held = 0
        self.lag = 0  # nothing is waiting, so nothing runs late
        self.video.clear()


@dataclass(slots=True)
class _PlanSlots:
    """The slots one plan steps: new or continuing, their prompts, the ones to reset."""

    to_reset: list[int]
    new: list[int] = field(default_factory=list)
    continuing: list[int] = field(default_factory=list)
    prompts: dict[int, SlotPrompt] = field(default_factory=dict)

    def enter(self, slot: _Slot) -> None:
        """``slot`` steps in this plan: its first step (with its prompt) or a later one,
        with its runner state reset first if it is new or was reset."""
        slot_id = slot.handle.slot
        (self.new if slot.fresh else self.continuing).append(slot_id)
        if slot.fresh and slot.prompt is not None:
            self.prompts[slot_id] = slot.prompt
        if slot.fresh or slot.reset_pending:
            self.to_reset.append(slot_id)
        slot.fresh = slot.reset_pending = False


@final
class Engine:
    """Owns one model runner and its slot pool; not tied to trio or threads.

    Args:
        runner: executes the batched steps; owns tensors and per-slot state.
        scheduler: slot pool and admission; built from the runner's spec if omitted.
        max_input_frames: bound of each slot's input queue, in frames.
        max_video_frames: bound of each slot's video queue (drop-oldest, counted).
        max_lag_frames: most underruns a slot remembers as lag to repay (0: never skip).
        silence_rms: a queued frame under this RMS (full scale 1.0) may be skipped
            to repay lag; the default is -50 dBFS.
        timer: monotonic seconds used only to measure step compute time.
        recorder: where each step's time goes, by batch size (warm-up steps left out);
            ``None``: not recorded.
    """

    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler | None = None,
        *,
        max_input_frames: int = 25,
        max_video_frames: int = 8,
        max_lag_frames: int = 6,
        silence_rms: float = 10 ** (-50 / 20),
        timer: Callable[[], float] = time.perf_counter,
        recorder: EngineRecorder | None = None,
    ) -> None:
        if max_input_frames <= 0 or max_video_frames <= 0:
            raise ValueError("max_input_frames and max_video_frames must be positive")
        if max_lag_frames < 0 or not silence_rms >= 0:
            raise ValueError("max_lag_frames and silence_rms must be >= 0")
        self._runner = runner
        self._spec = runner.spec
        self._scheduler = scheduler or Scheduler(
            self._spec.max_slots, self._spec.frame_period_s, phases=self._spec.tick_phases
        )
        self._max_input_frames = max_input_frames
        self._max_video_frames = max_video_frames
        self._max_lag = max_lag_frames
        self._silence_energy = silence_rms * silence_rms * self._spec.frame_samples
        self._on_input = self._spec.steps_on_input
        self._timer = timer
        self._recorder = recorder
        self._lock = threading.Lock()
        self._stepping = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._releasing: list[int] = []
        self._generation = 0
        self._ticks = 0
        self._underruns = 0
        self._silence_skipped = 0
        self._frames_rejected = 0
        self._video_dropped = 0
        self._overruns = 0
        self._warmups = 0
        self._replay_steps = 0

    @property
    def spec(self) -> ModelSpec:
        """The model's spec and capabilities."""
        return self._spec

    def acquire_slot(
        self, owner: str, prompt: SlotPrompt | None = None, *, now: float | None = None
    ) -> SlotHandle | None:
        """Take a slot for ``owner``; ``None`` when admission says no (no slot or no time).

        ``now`` is the time on the clock `step` is given (it ages the step-time window;
        ``None``: the last step's).

        The slot goes live at the next step with fresh runner state; a non-empty
        ``prompt`` is replayed into it first (see the module docstring). Its sampling
        reaches the runner with it, on any model (a runner applies what it can).

        Raises:
            PromptUnsupported: ``prompt`` is not empty and the model takes no prompts.
        """
        if prompt is not None and prompt.empty and prompt.sampling is None:
            prompt = None
        replays = prompt is not None and not prompt.empty
        if replays and not self._spec.supports_prompts:
            raise PromptUnsupported(f"model {self._spec.name!r} takes no prompt")
        check = getattr(self._runner, "check_prompt", None)
        if replays and check is not None:
            check(prompt)  # reads only files: safe next to a running step
        with self._lock:
            slot = self._scheduler.allocate(now)
            if slot is None:
                return None
            self._generation += 1
            handle = SlotHandle(slot, owner, self._generation)
            sizes = [0] * self._spec.tick_phases
            for live in self._slots.values():
                sizes[live.phase] += 1
            self._slots[slot] = _Slot(
                handle,
                self._max_input_frames,
                self._max_video_frames,
                self._spec.frame_samples,
                phase=sizes.index(min(sizes)),
                prompt=prompt,
                holding=replays,
            )
            return handle

    def release_slot(self, handle: SlotHandle) -> bool:
        """Stop stepping a slot; its id returns to the pool once the runner dropped its state.

        Returns:
            ``True`` if released now, ``False`` if the handle was already released.
        """
        with self._lock:
            if self._live(handle) is None:
                return False
            del self._slots[handle.slot]
            self._scheduler.release(handle.slot)
            self._releasing.append(handle.slot)
            return True

    def push_input(self, handle: SlotHandle, pcm: PcmFrame) -> InputPush:
        """Queue mono float32 input of any length; it is cut into whole frames.

        Overflow policy: a whole frame that finds the queue full is refused
        (newest dropped), counted, and reported in the result.

        Raises:
            SlotReleased: the handle was released.
            TypeError, ValueError: ``pcm`` is not a 1-D float32 array.
        """
        if not isinstance(pcm, np.ndarray) or pcm.dtype != np.float32 or pcm.ndim != 1:
            raise TypeError("pcm must be a 1-D float32 numpy array")
        frame_samples = self._spec.frame_samples
        with self._lock:
            slot = self._require(handle)
            queued = rejected = 0
            pos = 0
            size = len(pcm)
            while pos < size:
                if slot.filled == 0 and size - pos >= frame_samples:
                    # a whole frame straight from the chunk: one copy, not two via `partial`
                    frame = pcm[pos : pos + frame_samples]
                    slot.pushed += frame_samples
                    pos += frame_samples
                else:
                    take = min(frame_samples - slot.filled, size - pos)
                    slot.partial[slot.filled : slot.filled + take] = pcm[pos : pos + take]
                    slot.filled += take
                    slot.pushed += take
                    pos += take
                    if slot.filled < frame_samples:
                        break
                    slot.filled = 0
                    frame = slot.partial
                if len(slot.queue) < slot.max_input_frames + slot.held:
                    slot.queue.append(frame.copy())
                    if self._on_input:
                        slot.starts.append(slot.pushed - frame_samples)
                    queued += 1
                else:
                    rejected += 1
            slot.consumed += rejected * frame_samples  # refused: never to be consumed
            slot.frames_rejected += rejected
            self._frames_rejected += rejected
            slot.peak_queue_depth = max(slot.peak_queue_depth, len(slot.queue))
            return InputPush(queued, rejected, slot.filled, len(slot.queue))

    def push_video(self, handle: SlotHandle, frame_id: str, pts_ms: int, payload: bytes) -> int:
        """Queue one video frame; it reaches the model with the audio pushed before it.

        The queue is bounded (drop-oldest when full, counted).

        Returns:
            How many older frames were dropped to make room (0 or 1).

        Raises:
            VideoInputUnsupported: the model does not take video.
            SlotReleased: the handle was released.
        """
        if not self._spec.supports_video_input:
            raise VideoInputUnsupported(f"model {self._spec.name!r} does not take video input")
        with self._lock:
            slot = self._require(handle)
            dropped = int(len(slot.video) == slot.max_video_frames)
            slot.video.append((slot.pushed, VideoFrame(frame_id, pts_ms, payload)))
            slot.video_dropped += dropped
            self._video_dropped += dropped
            return dropped

    def reset(self, handle: SlotHandle, epoch: int, *, clear_input: bool = True) -> None:
        """Start a new epoch: reset the slot's runner state, and drop its queued input
        unless ``clear_input`` is false (a barge-in keeps what the user is saying).

        Other slots are untouched. Outputs of a step already running carry the
        previous epoch, so the session can fence them off. A prompted slot
        replays its prompt again (the reset wiped it), holding its input meanwhile.

        Raises:
            SlotReleased: the handle was released.
        """
        with self._lock:
            slot = self._require(handle)
            if clear_input:
                slot.clear_input()
            slot.epoch = epoch
            slot.reset_pending = True
            slot.holding = slot.replays

    def has_work(self) -> bool:
        """A step would do something: a slot is live (with ``steps_on_input``: has a whole
        frame queued) or a release awaits the runner."""
        with self._lock:
            if self._releasing:
                return True
            if self._on_input:
                return any(slot.queue for slot in self._slots.values())
            return bool(self._slots)

    def step(self, now: float, phase: int | None = None) -> dict[SlotHandle, SlotOutput]:
        """Run one tick over the live slots of ``phase`` (``None``: every live slot);
        ``now`` is the tick's scheduled time.

        Returns:
            One output per slot of the phase that was live when the step began.

        Raises:
            RunnerContractError: the runner's output does not match the plan.
            RuntimeError: another step is already running.
        """
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError("Engine.step is not reentrant")
        try:
            return self._step(now, phase)
        finally:
            self._stepping.release()

    def replaying(self) -> int:
        """Live slots whose next step replays (holds its input): the batch `replay` steps."""
        with self._lock:
            return sum(slot.holding for slot in self._slots.values())

    def replay_step_s(self) -> float:
        """The window one replay step over the slots replaying now needs, by the scheduler
        (`Scheduler.replay_step_s`; 0: nothing measured yet, or nothing replays)."""
        with self._lock:
            batch = sum(slot.holding for slot in self._slots.values())
            estimate = self._scheduler.replay_step_s(batch) if batch else None
            return 0.0 if estimate is None else estimate

    def replay_steps(self, time_s: float, limit: int) -> int:
        """How many replay steps fit in ``time_s`` seconds, at most ``limit`` (the
        scheduler's `Scheduler.replay_steps` for the slots replaying now)."""
        with self._lock:
            batch = sum(slot.holding for slot in self._slots.values())
            return self._scheduler.replay_steps(batch, time_s, limit)

    def replay(
        self, now: float, steps: int, *, within_s: float | None = None
    ) -> list[dict[SlotHandle, SlotOutput]]:
        """Run up to ``steps`` replay steps (see the module docstring), each over the slots
        that still hold their input; stop early when none does, or, with ``within_s``, when
        the scheduler says the next step no longer fits the time left of ``within_s``
        seconds from the call (on the engine's timer: the steps' real times, not their
        estimate, decide how many run). ``now`` stamps the outputs.

        Returns:
            Each step's outputs, in order (empty: nothing replays).

        Raises:
            RunnerContractError: the runner's output does not match the plan.
            RuntimeError: another step is already running.
        """
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError("Engine.replay runs beside no other step")
        try:
            until = None if within_s is None else self._timer() + within_s
            done: list[dict[SlotHandle, SlotOutput]] = []
            for _ in range(steps):
                if until is not None and not self.replay_steps(until - self._timer(), 1):
                    break
                outputs = self._step(now, None, replay=True)
                if not outputs:
                    break
                done.append(outputs)
            return done
        finally:
            self._stepping.release()

    def capacity(self, now: float | None = None) -> CapacityReport:
        """How many slots may be live at ``now`` and what bounds it (see `Scheduler.report`)."""
        with self._lock:
            return self._scheduler.report(now)

    def statistics(self, now: float | None = None) -> EngineStatistics:
        """Snapshot of the engine counters (``now`` ages the step-time window)."""
        with self._lock:
            return EngineStatistics(
                ticks=self._ticks,
                live_slots=len(self._slots),
                underruns=self._underruns,
                silence_skipped=self._silence_skipped,
                slot_underruns=MappingProxyType({i: s.underruns for i, s in self._slots.items()}),
                frames_rejected=self._frames_rejected,
                video_dropped=self._video_dropped,
                overrun_steps=self._overruns,
                warmup_steps=self._warmups,
                scheduler=self._scheduler.statistics(now),
                replay_steps=self._replay_steps,
                slot_span=max(self._slots, default=-1) + 1,
            )

    def slot_statistics(self, handle: SlotHandle) -> SlotStatistics:
        """Counters of one live slot.

        Raises:
            SlotReleased: the handle was released.
        """
        with self._lock:
            slot = self._require(handle)
            return SlotStatistics(
                handle=handle,
                epoch=slot.epoch,
                ticks=slot.ticks,
                underruns=slot.underruns,
                lag_frames=slot.lag,
                silence_skipped=slot.silence_skipped,
                queue_depth=len(slot.queue),
                peak_queue_depth=slot.peak_queue_depth,
                max_input_frames=slot.max_input_frames,
                frames_rejected=slot.frames_rejected,
                video_queued=len(slot.video),
                video_dropped=slot.video_dropped,
            )

    # -- internals ---------------------------------------------------------

    def _live(self, handle: SlotHandle) -> _Slot | None:
        slot = self._slots.get(handle.slot)
        # ``is`` first: callers pass back the very handle they were given, and the
        # dataclass ``__eq__`` (a Python-level tuple compare) is the slow path
        same = slot is not None and (slot.handle is handle or slot.handle == handle)
        return slot if same else None

    def _require(self, handle: SlotHandle) -> _Slot:
        slot = self._live(handle)
        if slot is None:
            raise SlotReleased(f"slot handle {handle} was released")
        return slot

    def _step(
        self, now: float, phase: int | None, *, replay: bool = False
    ) -> dict[SlotHandle, SlotOutput]:
        plan, released, to_reset, tags = self._schedule(phase, replay=replay)
        for slot_id in to_reset:
            self._runner.reset_slot(slot_id)
        if plan is None:
            self._update(now, None, released, 0.0)
            return {}
        started = self._timer()
        result = self._runner.execute(plan)
        duration = self._timer() - started
        try:
            result.check(plan, audio=self._spec.outputs_audio)
        except (TypeError, ValueError) as exc:
            raise RunnerContractError(f"runner {self._spec.name!r}: {exc}") from exc
        self._update(
            now, plan, released, duration, tags, result.outputs, warmup=result.warmup, replay=replay
        )
        if not self._spec.outputs_audio:
            return {
                handle: SlotOutput(handle, epoch, plan.tick, now, item.position, consumed, out)
                for (handle, epoch, consumed), item, out in zip(
                    tags, plan.inputs, result.outputs, strict=True
                )
            }
        # np.array of the equal-shaped rows is np.stack without its per-row Python work
        pcm = np.array([out.pcm for out in result.outputs], dtype=np.float32)
        pcm16 = float_to_pcm16(pcm).astype("<i2", copy=False)
        return {
            handle: SlotOutput(
                handle, epoch, plan.tick, now, item.position, consumed, out, row.tobytes()
            )
            for (handle, epoch, consumed), item, out, row in zip(
                tags, plan.inputs, result.outputs, pcm16, strict=True
            )
        }

    def _schedule(
        self, phase: int | None, *, replay: bool = False
    ) -> tuple[StepPlan | None, tuple[int, ...], list[int], list[tuple[SlotHandle, int, int]]]:
        """Apply queued commands and take one frame per live slot of ``phase``, under the lock;
        ``replay``: only the slots that hold their input, whatever their phase."""
        frame_samples = self._spec.frame_samples
        with self._lock:
            released = tuple(self._releasing)
            to_reset = list(released)
            plan_slots = _PlanSlots(to_reset)
            new, continuing, prompts = plan_slots.new, plan_slots.continuing, plan_slots.prompts
            inputs: list[SlotInput] = []
            tags: list[tuple[SlotHandle, int, int]] = []
            for slot_id in sorted(self._slots):
                slot = self._slots[slot_id]
                if replay and not slot.holding:
                    continue
                if phase is not None and slot.phase != phase:
                    continue
                if self._on_input:  # a scoring model: only slots with a frame step
                    if slot.queue:
                        plan_slots.enter(slot)
                        slot.consumed += frame_samples
                        slot.ticks += 1
                        tags.append((slot.handle, slot.epoch, frame_samples))
                        inputs.append(
                            SlotInput(slot_id, slot.queue.popleft(), slot.starts.popleft())
                        )
                    continue
                plan_slots.enter(slot)
                if slot.holding:  # a prompt replay tick: the input waits, nothing is owed
                    inputs.append(SlotInput(slot_id, None, slot.ticks * frame_samples, held=True))
                    tags.append((slot.handle, slot.epoch, 0))
                    slot.ticks += 1
                    slot.held += 1
                    continue
                skipped = self._repay_lag(slot)
                frame = slot.queue.popleft() if slot.queue else None
                if frame is None:
                    slot.underruns += 1
                    self._underruns += 1
                    slot.gap += 1
                    # a gap longer than max_lag is the client pausing, not running late
                    slot.lag = min(slot.lag + 1, self._max_lag) if slot.gap <= self._max_lag else 0
                else:
                    slot.gap = 0
                consumed = (0 if frame is None else frame_samples) + skipped * frame_samples
                slot.consumed += consumed
                video = self._due_video(slot, idle=frame is None and not slot.queue)
                inputs.append(SlotInput(slot_id, frame, slot.ticks * frame_samples, video))
                tags.append((slot.handle, slot.epoch, consumed))
                slot.ticks += 1
            if not inputs:
                return None, released, to_reset, tags
            plan = StepPlan(
                tick=self._ticks,  # a replay step takes the number of the tick it precedes
                frame_samples=frame_samples,
                new_slots=tuple(new),
                continuing_slots=tuple(continuing),
                released_slots=released,
                inputs=tuple(inputs),
                new_prompts=MappingProxyType(prompts),
            )
            if replay:
                self._replay_steps += 1
            else:
                self._ticks += 1
            return plan, released, to_reset, tags

    @staticmethod
    def _due_video(slot: _Slot, *, idle: bool) -> tuple[VideoFrame, ...]:
        """The waiting frames whose audio this tick has reached (all of them when idle)."""
        due = []
        while slot.video and (idle or slot.video[0][0] <= slot.consumed):
            due.append(slot.video.popleft()[1])
        return tuple(due)

    def _repay_lag(self, slot: _Slot) -> int:
        """Skip the oldest queued frame if lag is owed, it is silence and another waits."""
        if not slot.lag or len(slot.queue) < 2:
            return 0
        head = slot.queue[0]
        if float(np.dot(head, head)) >= self._silence_energy:
            return 0
        slot.queue.popleft()
        slot.lag -= 1
        slot.silence_skipped += 1
        self._silence_skipped += 1
        return 1

    def _update(
        self,
        now: float,
        plan: StepPlan | None,
        released: tuple[int, ...],
        duration: float,
        tags: Sequence[tuple[SlotHandle, int, int]] = (),
        outputs: Sequence[FrameOutput] = (),
        *,
        warmup: bool = False,
        replay: bool = False,
    ) -> None:
        """Record the step (unless it was warm-up; a replay step in the replay window only),
        learn which slots hold their next input, and return the released slot ids to the
        pool."""
        with self._lock:
            if self._spec.supports_prompts:  # only a prompted slot ever holds its input
                for (handle, epoch, _), out in zip(tags, outputs, strict=True):
                    slot = self._live(handle)
                    if slot is not None and slot.epoch == epoch and not slot.reset_pending:
                        slot.holding = slot.replays and out.holds_input
            for slot_id in released:
                self._releasing.remove(slot_id)
                self._scheduler.free(slot_id)
            if plan is not None and warmup:  # it measured a capture, not the batch
                self._warmups += 1
            elif plan is not None and replay:
                self._scheduler.record_replay_step(len(plan.inputs), duration, now)
            elif plan is not None:
                self._scheduler.record_step(len(plan.inputs), duration, now)
                if self._spec.supports_prompts and all(item.held for item in plan.inputs):
                    # every slot replayed: this tick measured a replay step too
                    self._scheduler.record_replay_step(len(plan.inputs), duration, now)
                if self._recorder is not None:
                    self._recorder.step(len(plan.inputs), duration)
                self._overruns += duration > self._spec.frame_period_s / self._spec.tick_phases
