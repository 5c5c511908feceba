"""The contract between the engine and every frame-synchronous model.

The engine decides which slots run a tick and hands the runner a `StepPlan`;
the runner owns the tensors and per-slot state, runs one batched step over the
live slots, and returns a `StepOutput`. Plans and outputs are frozen value
classes checked when built; their reprs carry no audio, text or image bytes so
they can be logged (vllm's ``SchedulerOutput.anon_repr`` habit).

Do not subclass these classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "NO_AUDIO",
    "FrameOutput",
    "ModelRunner",
    "ModelSpec",
    "PcmFrame",
    "RunnerFactory",
    "SamplingRequest",
    "SlotInput",
    "SlotPrompt",
    "StepOutput",
    "StepPlan",
    "VideoFrame",
]

PcmFrame = npt.NDArray[np.float32]
"""Mono float32 PCM in [-1, 1], exactly ``ModelSpec.frame_samples`` long."""

NO_AUDIO: PcmFrame = np.zeros(0, dtype=np.float32)
"""The ``pcm`` of a `FrameOutput` of a model that outputs no audio (``outputs_audio=False``)."""
NO_AUDIO.flags.writeable = False


def _check_frame(pcm: PcmFrame, frame_samples: int, what: str) -> None:
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.float32:
        raise TypeError(f"{what} must be a float32 numpy array")
    if pcm.shape != (frame_samples,):
        raise ValueError(f"{what} must have shape ({frame_samples},), got {pcm.shape}")


def _check_slots(slots: tuple[int, ...], what: str) -> None:
    if len(set(slots)) != len(slots) or any(s < 0 for s in slots):
        raise ValueError(f"{what} must be distinct non-negative slot ids")


@final
@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What a model is and can do; sessions read capabilities from it.

    Args:
        name: registry name (``loopback``, later ``tiny``, ``moshi-7b``).
        sample_rate: input and output sample rate in Hz.
        frame_samples: samples per tick; the frame period is ``frame_samples / sample_rate``.
        supports_video_input: the runner consumes `VideoFrame`s.
        supports_model_native_turn_policy: ``speaking``/``end_of_turn`` are the model's own.
        max_slots: size of the slot pool (concurrent sessions) the runner allocates state for.
        supports_prompts: the runner takes a `SlotPrompt` per slot (PersonaPlex); others
            refuse a non-empty one when the slot is acquired, never ignore it.
        tick_phases: the engine spreads its slots over this many groups, stepped in
            turn at ``frame_period / tick_phases`` apart, so each slot still steps once
            per frame but a group's outputs leave in their own sub-tick instead of all
            slots' outputs at one instant. Pays for a model whose step cost grows with
            its rows anyway (the loopback); a batched GPU model wants 1 (one batch).
        steps_inline: a step is so cheap (the loopback's numpy copies, well under a
            millisecond for 64 rows) that it runs on the event loop: handing it to a
            thread and waking the loop for its result costs more than the step.
        steps_on_input: a scoring model (the silero VAD): a step takes only the slots
            with a whole input frame queued (no silence filler for the others, no
            output for them, no underruns), and each output's ``position`` is where its
            frame starts in everything pushed to the slot, so frames refused on
            overflow or cleared by a reset leave a gap in the clock, never a shift.
            Moshi-style models (``False``) step every live slot every frame.
        max_steps_per_tick: with ``steps_on_input``, one tick runs up to this many
            steps while input is queued, so a slot with a backlog catches up that many
            frames per tick; a clocked model takes exactly one step a tick (1).
        outputs_audio: the runner's outputs carry a frame of audio; ``False`` (a
            scoring model): their ``pcm`` is empty (`NO_AUDIO`) and the result is in
            ``FrameOutput.score``.
    """

    name: str
    sample_rate: int = 24_000
    frame_samples: int = 1_920
    supports_video_input: bool = False
    supports_model_native_turn_policy: bool = False
    max_slots: int = 64
    supports_prompts: bool = False
    tick_phases: int = 1
    steps_inline: bool = False
    steps_on_input: bool = False
    max_steps_per_tick: int = 1
    outputs_audio: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ModelSpec.name must not be empty")
        for key, value in (
            ("sample_rate", self.sample_rate),
            ("frame_samples", self.frame_samples),
            ("max_slots", self.max_slots),
            ("tick_phases", self.tick_phases),
            ("max_steps_per_tick", self.max_steps_per_tick),
        ):
            if value <= 0:
                raise ValueError(f"ModelSpec.{key} must be positive, got {value}")
        if (self.frame_samples * 1000) % self.sample_rate:
            raise ValueError("ModelSpec frame period must be a whole number of milliseconds")
        if self.max_steps_per_tick > 1 and not self.steps_on_input:
            raise ValueError("ModelSpec.max_steps_per_tick > 1 needs steps_on_input")
        if self.steps_on_input and self.tick_phases > 1:
            raise ValueError("ModelSpec.steps_on_input steps every slot with input: one phase")

    @property
    def frame_period_s(self) -> float:
        """Seconds per tick (0.08 for 1920 samples at 24 kHz)."""
        return self.frame_samples / self.sample_rate

    @property
    def frame_ms(self) -> int:
        """Milliseconds per tick."""
        return self.frame_samples * 1000 // self.sample_rate


@final
@dataclass(frozen=True, slots=True)
class VideoFrame:
    """One video frame queued for a slot; ``payload`` is the decoded image bytes."""

    frame_id: str
    pts_ms: int
    payload: bytes = field(repr=False)


@final
@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """How a session asks its slot to be sampled; ``None``: the model's own setting.

    The session layer checked every value's range already (``SessionSampling``);
    a runner applies what it can and ignores the rest (docs/protocol/moshi.md
    lists what each model applies), so a value in range never fails a session.

    Args:
        text_temperature, audio_temperature: 0 is greedy.
        text_top_k, audio_top_k: 0 keeps the whole vocabulary.
        text_seed, audio_seed: sampling seeds: the same seeds and input give the
            same output, wherever the session runs.
        repetition_penalty, repetition_penalty_context, pad_mult: the Moshi web
            client's other knobs.
    """

    text_temperature: float | None = None
    text_top_k: int | None = None
    audio_temperature: float | None = None
    audio_top_k: int | None = None
    text_seed: int | None = None
    audio_seed: int | None = None
    repetition_penalty: float | None = None
    repetition_penalty_context: int | None = None
    pad_mult: float | None = None


@final
@dataclass(frozen=True, slots=True)
class SlotPrompt:
    """What a session asks the model to be, fixed when its slot is taken.

    A prompt-capable runner replays its text and voice into the slot before the
    slot goes live (and again after every reset of the slot, since a reset wipes
    what the replay built). Its sampling applies on any runner that samples.

    Args:
        text: a system prompt (persona, task), in the model's own language.
        voice: the name of a voice prompt the runner resolves itself (e.g. a file
            in the checkpoint folder); never a path a client chooses.
        sampling: the session's sampling (``None``: the model's own).
    """

    text: str | None = field(default=None, repr=False)
    voice: str | None = None
    sampling: SamplingRequest | None = None

    def __post_init__(self) -> None:
        if self.text is not None and not isinstance(self.text, str):
            raise TypeError("SlotPrompt.text must be a string")
        if self.voice is not None and not isinstance(self.voice, str):
            raise TypeError("SlotPrompt.voice must be a string")
        if self.sampling is not None and not isinstance(self.sampling, SamplingRequest):
            raise TypeError("SlotPrompt.sampling must be a SamplingRequest")

    @property
    def empty(self) -> bool:
        """Nothing to replay (no text, no voice); the sampling may still be set."""
        return not (self.text and self.text.strip()) and not self.voice

    @property
    def replay(self) -> SlotPrompt:
        """The part a runner replays (text and voice), without the sampling."""
        return SlotPrompt(self.text, self.voice)


@final
@dataclass(frozen=True, slots=True)
class SlotInput:
    """One live slot's input for one tick.

    Args:
        slot: slot id.
        frame: the input frame, or ``None`` for an underrun (the runner feeds silence)
            or for a tick the runner asked to hold (``held``).
        position: audio-clock position of this frame in the slot's stream, in samples;
            it advances by one frame per tick the slot is live, underruns included.
        video: video frames that arrived since the previous tick, oldest first.
        held: the engine kept the slot's input queued because the runner's previous
            output for it said ``holds_input`` (a prompt replay); ``frame`` is ``None``.
    """

    slot: int
    frame: PcmFrame | None = field(repr=False)
    position: int
    video: tuple[VideoFrame, ...] = ()
    held: bool = False

    @property
    def underrun(self) -> bool:
        """No input arrived in time for this tick."""
        return self.frame is None


@final
@dataclass(frozen=True, slots=True)
class StepPlan:
    """The engine's decision for one tick, sent to the runner as a diff.

    ``new_slots`` went live since the last step, ``continuing_slots`` were live
    before, ``released_slots`` were dropped (their state is already reset).
    ``inputs`` holds one entry per live slot, ordered by slot id.
    ``new_prompts`` holds the `SlotPrompt` of new slots that have one: something to
    replay, a sampling, or both.
    """

    tick: int
    frame_samples: int
    new_slots: tuple[int, ...]
    continuing_slots: tuple[int, ...]
    released_slots: tuple[int, ...]
    inputs: tuple[SlotInput, ...]
    new_prompts: Mapping[int, SlotPrompt] = field(default_factory=dict)

    def __post_init__(self) -> None:
        live = self.new_slots + self.continuing_slots
        _check_slots(live, "live slots")
        _check_slots(self.released_slots, "released slots")
        if set(live) & set(self.released_slots):
            raise ValueError("a slot cannot be live and released in one plan")
        if tuple(i.slot for i in self.inputs) != tuple(sorted(live)):
            raise ValueError("inputs must hold one entry per live slot, ordered by slot id")
        for item in self.inputs:
            if item.frame is not None:
                _check_frame(item.frame, self.frame_samples, f"input frame of slot {item.slot}")
                if item.held:
                    raise ValueError(f"held input of slot {item.slot} must carry no frame")
        if not set(self.new_prompts) <= set(self.new_slots):
            raise ValueError("new_prompts must name new slots only")

    @property
    def live_slots(self) -> tuple[int, ...]:
        """Slots stepped this tick, ordered by slot id."""
        return tuple(i.slot for i in self.inputs)


@final
@dataclass(frozen=True, slots=True)
class FrameOutput:
    """What the model produced for one slot in one tick.

    Args:
        slot: slot id.
        pcm: output audio frame, float32, exactly ``frame_samples``.
        text: text produced this tick (may be empty).
        speaking: the model is producing speech in this frame.
        end_of_turn: the model finished its turn at this frame.
        video_frame_ids: ids of the video frames consumed this tick.
        latest_video_pts_ms: pts of the newest consumed video frame, if any.
        holds_input: the slot's next tick is still a prompt replay: the engine keeps
            its input queued and sends ``held`` instead (no input is lost, none is
            counted as an underrun; the session just hears silence meanwhile).
        score: what a scoring model found in this frame (the silero VAD: the speech
            probability in [0, 1]); ``None`` for a model that outputs audio.
    """

    slot: int
    pcm: PcmFrame = field(repr=False)
    text: str = field(default="", repr=False)
    speaking: bool = False
    end_of_turn: bool = False
    video_frame_ids: tuple[str, ...] = ()
    latest_video_pts_ms: int | None = None
    holds_input: bool = False
    score: float | None = None


@final
@dataclass(frozen=True, slots=True)
class StepOutput:
    """The runner's result for one tick: one `FrameOutput` per live slot, ordered by slot id.

    ``warmup``: the step did one-off work (captured a CUDA graph, first use of a
    kernel), so its duration says nothing about the batch; the engine keeps it out of
    the step-time window that admission reads.
    """

    outputs: tuple[FrameOutput, ...]
    warmup: bool = False

    def check(self, plan: StepPlan, *, audio: bool = True) -> None:
        """Validate against the plan it answers; ``audio``: the spec's ``outputs_audio``
        (``False``: every ``pcm`` is empty and every ``score`` set).

        Raises:
            ValueError, TypeError: slots or frames do not match the plan.
        """
        if tuple(o.slot for o in self.outputs) != plan.live_slots:
            raise ValueError("step output slots do not match the plan's live slots")
        if not audio:
            for out in self.outputs:
                if out.pcm is not NO_AUDIO:  # the shared empty frame: nothing to check
                    _check_frame(out.pcm, 0, f"output frame of slot {out.slot}")
                if out.score is None:
                    raise ValueError(f"output of slot {out.slot} of a scoring model has no score")
            return
        for out in self.outputs:
            _check_frame(out.pcm, plan.frame_samples, f"output frame of slot {out.slot}")


class ModelRunner(Protocol):
    """Executes plans; never chooses who runs (vllm's ``GPUModelRunner`` role).

    The engine calls `reset_slot` and `execute` from one thread at a time, so a
    runner needs no locking of its own. A runner whose spec ``supports_prompts``
    may also define ``check_prompt(prompt: SlotPrompt) -> None`` (raising
    ``PromptUnsupported``): the engine calls it, from the acquiring thread, before
    it hands out a prompted slot, so a bad prompt fails the session's start.
    """

    @property
    def spec(self) -> ModelSpec:
        """The model this runner executes."""
        ...

    def reset_slot(self, slot: int) -> None:
        """Return one slot's state to fresh without touching any other slot."""
        ...

    def execute(self, plan: StepPlan) -> StepOutput:
        """Run one batched step over ``plan.inputs`` and return their outputs."""
        ...


RunnerFactory = Callable[[ModelSpec], ModelRunner]
"""Builds a runner for a spec (callers may ``dataclasses.replace`` ``max_slots``)."""
