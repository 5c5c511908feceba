"""One session's stream on the shared silero VAD (``SessionConfig.vad="silero"``).

The VAD is an engine like the model's (`duplex.models.silero_engine` behind an
`EngineDriver`): the session's stream is a slot on it, its 16 kHz input that
slot's input, and each scored window an output whose ``score`` is the speech
probability. What is per session and no engine's business stays here: the
clock mapping and the segmenter (session policy); the 16 kHz input comes from the
session's `Hearing` (one resampler, shared with the agent's ASR).

The session actor owns a `VadLink` next to its engine slot. It is synchronous
and trio-free; the actor feeds it and applies what it returns:

- `push`: every ``ModelAppendAudio`` chunk, as the session's `Hearing` made it
  16 kHz (a `Heard`), is pushed to the stream while turn detection is on.
- `on_window`: each scored window (`VadWindow.of` the VAD engine's output)
  goes through a per-session `SpeechSegmenter` (threshold ``vad_threshold``,
  silence ``vad_hangover_ms``, no prefix padding: the machine pads; pauses of
  ``vad_prepare_ms``) and comes back as the machine's runtime
  `SpeechStarted`/`SpeechStopped` (and `SpeechPaused`/`SpeechResumed`),
  unpadded, on the input clock.
- `restart`: the machine forgot the speech in progress (input cleared, engine
  failure, a turn-detection setting changed): a new epoch for the stream.
- `replace`: the VAD crashed and restarted: a new slot on the new driver.

Clocks. A window's ``start`` is where it starts among all the samples pushed
to the stream (a refused window leaves a gap, never a shift). A *run* is audio
pushed without a gap; it starts on a window boundary (`restart` pads the
partial window with zeros, then drops it with the reset) at stream sample
``base``, with its first chunk's `Heard.start_ms` as ``base_ms`` and the
resampler's delay `Heard.delay_ms`. So stream time ``t`` ms maps to input time
``base_ms + (t - base / 16) - delay_ms``, never before ``base_ms``. A `Heard`
that starts a new run (a gap in the input clock) restarts the stream too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, final

import numpy as np

from duplex.models import (
    VAD_SAMPLE_RATE,
    VAD_WINDOW_SAMPLES,
    InputPush,
    SlotHandle,
    VadWindow,
)
from duplex.sessions import (
    VAD_KEYS,
    Pcm,
    SegmentPaused,
    SegmentResumed,
    SegmentStarted,
    SegmentStopped,
    ServerVadConfig,
    SessionConfig,
    SpeechPaused,
    SpeechResumed,
    SpeechSegmenter,
    SpeechStarted,
    SpeechStopped,
    VadMode,
)

from ._heard import Heard

__all__ = ["VadLink", "VadLinkStatistics", "VadStreams"]

SpeechEvent = SpeechStarted | SpeechStopped | SpeechPaused | SpeechResumed


class VadStreams(Protocol):
    """What a link needs of the shared VAD (its `duplex.models.EngineDriver`)."""

    def push_input(self, handle: SlotHandle, pcm: Pcm) -> InputPush: ...

    def reset(self, handle: SlotHandle, epoch: int, *, clear_input: bool = True) -> None: ...

    def detach(self, handle: SlotHandle) -> bool: ...


@final
@dataclass(frozen=True, slots=True)
class VadLinkStatistics:
    """Counters of one session's VAD stream.

    Args:
        windows: windows that reached the segmenter.
        stale_windows: windows dropped: an earlier epoch or stream, or turn detection off.
        overflow_windows: windows the VAD refused because this stream's queue was full
            (it fell ``VAD_MAX_PENDING_MS`` behind).
        restarts: new epochs (input cleared, settings changed, turn detection re-enabled).
        replacements: new streams after a VAD restart.
    """

    windows: int
    stale_windows: int
    overflow_windows: int
    restarts: int
    replacements: int


def segmenter_config(config: SessionConfig) -> ServerVadConfig:
    """The segmenter's rules for a session config (the machine pads and times out)."""
    return ServerVadConfig(
        threshold=config.vad_threshold,
        prefix_padding_ms=0,
        silence_duration_ms=config.vad_hangover_ms,
        idle_timeout_ms=None,
        pause_ms=config.vad_prepare_ms or None,
    )


@final
class VadLink:
    """A session's silero stream: resampler, clock mapping, segmenter (module docstring).

    Args:
        streams: the shared VAD's engine driver.
        handle: the slot this session holds on it (``streams.attach``).
        config: the session's config.
    """

    def __init__(self, streams: VadStreams, handle: SlotHandle, config: SessionConfig) -> None:
        self.streams = streams
        self.handle = handle
        self.config = config
        self.epoch = 0
        self.segmenter = SpeechSegmenter(segmenter_config(config))
        self._delay_ms = 0.0  # the resampler's delay in the current run
        self._pushed = 0  # 16 kHz samples pushed to the stream
        self._base = 0  # stream sample where the current run starts (a window boundary)
        self._base_ms: float | None = None  # input-clock ms of the run's first sample
        self._last_ms = 0.0  # input-clock end of the newest window seen
        self._windows = 0
        self._stale = 0
        self._overflow = 0
        self._restarts = 0
        self._replacements = 0

    @property
    def enabled(self) -> bool:
        """Turn detection is on with this VAD: audio is pushed and windows are read."""
        return self.config.vad is VadMode.SILERO and self.config.vad_enabled

    def statistics(self) -> VadLinkStatistics:
        """Snapshot of the counters."""
        return VadLinkStatistics(
            self._windows, self._stale, self._overflow, self._restarts, self._replacements
        )

    def push(self, heard: Heard) -> InputPush | None:
        """Queue one 16 kHz input chunk.

        Returns:
            What the VAD did with it, or ``None`` while turn detection is off.
        """
        if not self.enabled:
            return None
        if heard.fresh and self._base_ms is not None:
            self.restart()  # the input clock jumped (never expected): start a new run
        if self._base_ms is None:
            self._base_ms = heard.start_ms
            self._delay_ms = heard.delay_ms
        if heard.samples.size == 0:
            return None
        result = self.streams.push_input(self.handle, heard.samples)
        self._pushed += heard.samples.size
        self._overflow += result.frames_rejected
        return result

    def on_window(self, window: VadWindow) -> tuple[SpeechEvent, ...]:
        """One scored window; returns the machine's speech events it decides (usually none)."""
        if (
            window.handle != self.handle
            or window.epoch != self.epoch
            or not self.enabled
            or self._base_ms is None
        ):
            self._stale += 1
            return ()
        self._windows += 1
        self._last_ms = self._to_input_ms(window.end_ms)
        events: list[SpeechEvent] = []
        for found in self.segmenter.push(window.start_ms, window.end_ms, window.probability):
            if isinstance(found, SegmentStarted):
                events.append(SpeechStarted(self._to_input_ms(found.audio_start_ms)))
            elif isinstance(found, SegmentStopped):
                events.append(SpeechStopped(self._to_input_ms(found.audio_end_ms)))
            elif isinstance(found, SegmentPaused):
                events.append(SpeechPaused(self._to_input_ms(found.audio_end_ms)))
            elif isinstance(found, SegmentResumed):
                events.append(SpeechResumed(self._to_input_ms(found.audio_start_ms)))
        return tuple(events)

    def reconfigure(self, config: SessionConfig) -> None:
        """Take the machine's new config; a turn-detection change restarts the stream,
        as the machine forgets the speech in progress then (`UserTurns.reconfigure`)."""
        changed = any(getattr(config, k) != getattr(self.config, k) for k in VAD_KEYS)
        changed = changed or config.model_sample_rate != self.config.model_sample_rate
        self.config = config
        if changed:
            self.restart()

    def restart(self) -> None:
        """A new epoch: queued windows dropped, fresh recurrent state and segmenter.

        The partial window is padded with zeros (dropped with the queue), so the
        next run starts on a window boundary; its first chunk sets the clock.
        """
        pad = -self._pushed % VAD_WINDOW_SAMPLES
        if pad:
            self.streams.push_input(self.handle, np.zeros(pad, dtype=np.float32))
            self._pushed += pad
        self.epoch += 1
        self._restarts += 1
        self.streams.reset(self.handle, self.epoch, clear_input=True)
        self._begin_run()

    def replace(self, streams: VadStreams, handle: SlotHandle) -> tuple[SpeechEvent, ...]:
        """Move onto a restarted VAD's new slot.

        Returns:
            A `SpeechStopped` at the last scored window when speech was in
            progress (its windows died with the old VAD), so the turn ends.
        """
        ended: tuple[SpeechEvent, ...] = ()
        if self.segmenter.speaking:
            ended = (SpeechStopped(self._last_ms),)
        self.streams, self.handle = streams, handle
        self._pushed = 0
        self._replacements += 1
        self._begin_run()
        return ended

    def close(self) -> None:
        """Give the stream back (idempotent)."""
        self.streams.detach(self.handle)

    # -- internals ---------------------------------------------------------

    def _begin_run(self) -> None:
        self.segmenter = SpeechSegmenter(segmenter_config(self.config))
        self.segmenter.reset(self._pushed * 1000 // VAD_SAMPLE_RATE)
        self._base = self._pushed
        self._base_ms = None

    def _to_input_ms(self, stream_ms: int) -> float:
        assert self._base_ms is not None
        base_stream_ms = self._base * 1000.0 / VAD_SAMPLE_RATE
        return max(self._base_ms, self._base_ms + (stream_ms - base_stream_ms) - self._delay_ms)
