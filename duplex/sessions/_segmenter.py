"""`SpeechSegmenter`: OpenAI ``server_vad`` turn detection over speech probabilities.

The one segmenter of both VADs: the shared silero VAD's windows (through the
session's ``VadLink``, a probability a 32 ms window) and the built-in `EnergyVad`'s
frames (probability 1 for a loud 20 ms frame, else 0) go through it. Pure: it sees
``(start_ms, end_ms, probability)`` per window, in order, on one audio clock, and
returns events. It reads no time of its own, imports no model, and is tested
without one.

Rules (``ServerVadConfig``):

- A window is speech when ``probability >= threshold``.
- Idle -> speaking once a run of speech windows (no non-speech window and no gap
  between them) lasts ``min_speech_ms`` (0: its first window): `SegmentStarted`
  with ``audio_start_ms = run start - prefix_padding_ms``, clamped at 0 and at the
  previous segment's ``audio_end_ms`` (two segments never overlap; the audio
  before that end was already committed with the previous turn). A shorter run (a
  click) starts nothing.
- Speaking -> idle once a non-speech window ends ``silence_duration_ms`` or
  more after the end of the last speech window: `SegmentStopped` with
  ``audio_end_ms`` = the end of the last speech window. A gap in the windows
  (dropped audio) counts as silence: only the clock matters.
- Idle timeout (``idle_timeout_ms``): the caller arms it with
  `arm_idle_timeout` at the point of the input clock where the last response's
  audio finished playing. The first window ending ``idle_timeout_ms`` or more
  after that point, with no speech detected since, yields `IdleTimeout` once
  (``audio_start_ms`` = the armed point, ``audio_end_ms`` = that window's end)
  and disarms. Detected speech (start or stop) disarms it. It runs on the
  input audio clock, so it fires only while the client keeps sending audio,
  which a realtime client does (silence included).
- Pauses (``pause_ms``, off when ``None``): while speaking, the first window that
  ends ``pause_ms`` or more after the last speech window (and less than
  ``silence_duration_ms``, or the stop decides) yields `SegmentPaused` once; the
  next speech window of the same segment yields `SegmentResumed`. A voice agent
  prepares its reply at a pause and speaks it only if the stop follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

__all__ = [
    "IdleTimeout",
    "SegmentPaused",
    "SegmentResumed",
    "SegmentStarted",
    "SegmentStopped",
    "SegmenterEvent",
    "ServerVadConfig",
    "SpeechSegmenter",
]


@final
@dataclass(frozen=True, slots=True)
class ServerVadConfig:
    """OpenAI ``turn_detection: {type: server_vad}`` numbers, with OpenAI's defaults.

    Raises:
        ValueError: ``threshold`` outside [0, 1], or a negative duration.
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    idle_timeout_ms: int | None = None
    pause_ms: int | None = None
    min_speech_ms: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold <= 1.0):
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.prefix_padding_ms < 0 or self.silence_duration_ms < 0 or self.min_speech_ms < 0:
            raise ValueError("prefix_padding_ms, silence_duration_ms, min_speech_ms must be >= 0")
        if self.idle_timeout_ms is not None and self.idle_timeout_ms <= 0:
            raise ValueError(f"idle_timeout_ms must be positive, got {self.idle_timeout_ms}")
        if self.pause_ms is not None and self.pause_ms <= 0:
            raise ValueError(f"pause_ms must be positive, got {self.pause_ms}")


@final
@dataclass(frozen=True, slots=True)
class SegmentStarted:
    """Speech began (``input_audio_buffer.speech_started``).

    Args:
        audio_start_ms: where the turn's audio starts (prefix padding included).
        detected_at_ms: end of the window that decided it (how far the clock had run).
    """

    audio_start_ms: int
    detected_at_ms: int


@final
@dataclass(frozen=True, slots=True)
class SegmentStopped:
    """Speech ended (``input_audio_buffer.speech_stopped``).

    Args:
        audio_end_ms: end of the last speech window.
        detected_at_ms: end of the window that completed the silence.
    """

    audio_end_ms: int
    detected_at_ms: int


@final
@dataclass(frozen=True, slots=True)
class IdleTimeout:
    """No speech for ``idle_timeout_ms`` after the armed point
    (``input_audio_buffer.timeout_triggered``)."""

    audio_start_ms: int
    audio_end_ms: int


@final
@dataclass(frozen=True, slots=True)
class SegmentPaused:
    """Speech paused for ``pause_ms`` (no Realtime event: a hint to prepare the reply).

    Args:
        audio_end_ms: end of the last speech window (where the stop would end the turn).
        detected_at_ms: end of the window that completed the pause.
    """

    audio_end_ms: int
    detected_at_ms: int


@final
@dataclass(frozen=True, slots=True)
class SegmentResumed:
    """Speech came back after a `SegmentPaused`, before the stop (the pause was not the end).

    Args:
        audio_start_ms: start of the speech window that resumed it.
    """

    audio_start_ms: int


SegmenterEvent = SegmentStarted | SegmentStopped | IdleTimeout | SegmentPaused | SegmentResumed
"""What `SpeechSegmenter.push` returns."""


@final
class SpeechSegmenter:
    """The server_vad state machine of one session (see the module docstring)."""

    def __init__(self, config: ServerVadConfig | None = None) -> None:
        self._config = config if config is not None else ServerVadConfig()
        self._speaking = False
        self._last_speech_end = 0
        self._floor = 0
        self._idle_from: int | None = None
        self._paused = False
        self._run: tuple[int, int] | None = None  # (start, end) of a run not yet speech

    @property
    def config(self) -> ServerVadConfig:
        """The rules in force."""
        return self._config

    @property
    def speaking(self) -> bool:
        """Between a `SegmentStarted` and its `SegmentStopped`."""
        return self._speaking

    @property
    def last_speech_end_ms(self) -> int:
        """End of the last speech window of the segment (while `speaking`: where the
        speech really stopped so far, the silence after it not counted)."""
        return self._last_speech_end

    @property
    def idle_armed_at(self) -> int | None:
        """Where the idle timeout was armed, or ``None``."""
        return self._idle_from

    def reconfigure(self, config: ServerVadConfig) -> None:
        """Apply new numbers from the next window on (``session.update``); state is kept."""
        self._config = config

    def reset(self, floor_ms: int = 0) -> None:
        """Back to idle, disarmed; no ``audio_start_ms`` will fall before ``floor_ms``."""
        self._speaking = False
        self._last_speech_end = 0
        self._floor = floor_ms
        self._idle_from = None
        self._paused = False
        self._run = None

    def arm_idle_timeout(self, at_ms: int) -> None:
        """Start the idle timer at ``at_ms`` on the input clock (playback of the last
        response ended there). A no-op effect while ``idle_timeout_ms`` is ``None``."""
        self._idle_from = at_ms

    def disarm_idle_timeout(self) -> None:
        """Stop the idle timer (a response started, or the session decided otherwise)."""
        self._idle_from = None

    def push(self, start_ms: int, end_ms: int, probability: float) -> tuple[SegmenterEvent, ...]:
        """Feed one window, in clock order; returns the events it decides.

        Raises:
            ValueError: ``end_ms <= start_ms``.
        """
        if end_ms <= start_ms:
            raise ValueError(f"empty window [{start_ms}, {end_ms})")
        cfg = self._config
        events: list[SegmenterEvent] = []
        if probability < cfg.threshold:
            self._run = None
        if probability >= cfg.threshold:
            if not self._speaking:
                run = self._run
                run_start = run[0] if run is not None and run[1] == start_ms else start_ms
                if end_ms - run_start < cfg.min_speech_ms:
                    self._run = (run_start, end_ms)
                    return ()
                self._run = None
                self._speaking = True
                self._idle_from = None
                start = max(0, self._floor, run_start - cfg.prefix_padding_ms)
                events.append(SegmentStarted(start, end_ms))
            elif self._paused:
                self._paused = False
                events.append(SegmentResumed(start_ms))
            self._last_speech_end = end_ms
        elif self._speaking and end_ms - self._last_speech_end >= cfg.silence_duration_ms:
            self._speaking = False
            self._paused = False
            self._idle_from = None
            self._floor = self._last_speech_end
            events.append(SegmentStopped(self._last_speech_end, end_ms))
        elif (
            self._speaking
            and not self._paused
            and cfg.pause_ms is not None
            and end_ms - self._last_speech_end >= cfg.pause_ms
        ):
            self._paused = True
            events.append(SegmentPaused(self._last_speech_end, end_ms))
        if (
            not self._speaking
            and self._idle_from is not None
            and cfg.idle_timeout_ms is not None
            and end_ms - self._idle_from >= cfg.idle_timeout_ms
        ):
            events.append(IdleTimeout(self._idle_from, end_ms))
            self._idle_from = None
        return tuple(events)
