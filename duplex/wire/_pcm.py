"""The raw ``/v1/audio/duplex`` projection (vllm-omni's PersonaPlex tooling endpoint), sans-I/O.

In: a JSON text ``{"type": "open", "persona": "...", "voice": "..."}`` opens the
session (``persona`` is the prompt text, ``voice`` the voice prompt); binary
frames are float32 little-endian mono PCM at 24 kHz (a binary frame before
``open`` opens a session without a prompt, as vllm-omni does);
``{"type": "close"}`` ends it once the model has had the time to answer the
audio already sent (`drain_at`), answered by ``{"type": "done"}``.

Out: ``{"type": "ready"}`` when the session's slot takes input (its prompt is
replayed; `SessionReady`), binary float32 PCM at 24 kHz, a continuous stream
(silence is added while the model is quiet, as on ``/api/chat``), the model's
text as ``{"type": "text", "text": "..."}``, errors as ``{"type": "error",
"error": {"code", "message", "param"}}``, ``{"type": "done"}`` when the session
closes (``"reason"`` added when it ended on its own, e.g. ``idle_ttl_expired``).

Errors leave the session usable (a bad frame is refused, the next one is read):
the stream has no state a bad frame could break.
"""

from __future__ import annotations

from typing import Any, Final, final

import numpy as np

from duplex.exceptions import BadAudio, BadEvent, EventTooLarge, UnknownEvent, UnsupportedEvent
from duplex.pcm import pcm16_to_float
from duplex.refusals import echo
from duplex.sessions import (
    AudioAppend,
    AudioDelta,
    ClientEvent,
    ErrorEvent,
    ServerEvent,
    SessionClose,
    SessionClosed,
    SessionCreate,
    SessionCreated,
    SessionExpired,
    SessionOptions,
    SessionPrompt,
    SessionReady,
    TranscriptDelta,
)

from ._envelope import DEFAULT_MAX_EVENT_BYTES, read_envelope
from ._json_text import dumps
from ._stream import Frame, Later, OutputClock

__all__ = ["FLUSH_MARGIN_S", "PcmProjection"]

SAMPLE_RATE: Final = 24_000
MODEL_FRAME: Final = 1_920
FLUSH_MARGIN_S: Final = 0.24
"""After the model has taken the last input (on the real-time estimate), this long for its
answer to that frame to come out: a step and the delivery, with room for a late tick."""


def _options(prompt: SessionPrompt | None = None) -> SessionOptions:
    return SessionOptions(overlap_policy="model", prompt=prompt, announce_ready=True)


def _optional_string(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadEvent(f"{key} must be a string", param=key)
    return value


@final
class PcmProjection:
    """One ``/v1/audio/duplex`` connection's codec (see the module docstring)."""

    def __init__(self, *, max_size: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_size = max_size
        self.clock = OutputClock(SAMPLE_RATE, MODEL_FRAME)
        self.live = False
        self.closing = False
        self.ready_at: float | None = None
        self.appended_samples = 0
        self.last_append_at: float | None = None
        self._silence = np.zeros(MODEL_FRAME, dtype="<f4")

    @property
    def initial_options(self) -> SessionOptions:
        return _options()

    @property
    def failed(self) -> bool:
        return False

    # -- in ---------------------------------------------------------------

    def parse(self, data: str | bytes, now: float) -> ClientEvent | Later | None:
        if isinstance(data, str):
            envelope = read_envelope(data, max_size=self.max_size)
            body = envelope.body
            if envelope.type == "open":
                text, voice = _optional_string(body, "persona"), _optional_string(body, "voice")
                prompt = None if text is None and voice is None else SessionPrompt(text, voice)
                return SessionCreate(_options(prompt), envelope.event_id)
            if envelope.type == "close":
                self.closing = True
                return Later(SessionClose(envelope.event_id), self.drain_at(now))
            if envelope.type == "text":
                raise UnsupportedEvent("text input is not supported; send audio", param="type")
            raise UnknownEvent(f"unknown message type {echo(envelope.type)}", param="type")
        if len(data) > self.max_size:
            raise EventTooLarge(f"message is over {self.max_size} bytes")
        if len(data) % 4:
            raise BadAudio("float32 audio must be a whole number of samples", param="audio")
        pcm = np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)
        if not np.isfinite(pcm).all():
            raise BadAudio("float32 audio has NaN or infinite samples", param="audio")
        if not len(pcm):
            return None
        pcm.flags.writeable = False
        self.appended_samples += len(pcm)
        self.last_append_at = now
        return AudioAppend(pcm, SAMPLE_RATE)

    def drain_at(self, now: float) -> float:
        """When the model will have answered every sample sent so far.

        An estimate: the slot takes one frame per tick from its first input-taking
        tick (``ready``), so input sent faster than real time is taken by ``ready_at +
        appended / rate``, and input sent in real time just after it arrives.
        """
        start = self.ready_at if self.ready_at is not None else now
        taken = max(start + self.appended_samples / SAMPLE_RATE, self.last_append_at or now)
        return max(now, taken) + FLUSH_MARGIN_S

    def left(self) -> ClientEvent | None:
        return SessionClose() if self.live else None

    # -- out --------------------------------------------------------------

    def frames(self, event: ServerEvent, seq: int | None, now: float) -> list[Frame]:
        match event:
            case AudioDelta():
                pcm = pcm16_to_float(np.frombuffer(event.pcm, dtype="<i2"))
                self.clock.sent(len(pcm))
                return [pcm.astype("<f4").tobytes()]
            case TranscriptDelta():
                return [dumps({"type": "text", "text": event.delta})] if event.delta else []
            case SessionReady():
                self.ready_at = now
                self.clock.start(now)
                return [dumps({"type": "ready"})]
            case SessionCreated():
                self.live = True
            case SessionClosed():
                self.live = False
                return [dumps({"type": "done"})]
            case SessionExpired():
                self.live = False
                return [dumps({"type": "done", "reason": event.reason})]
            case ErrorEvent():
                error = {"code": event.code, "message": event.message, "param": event.param}
                return [dumps({"type": "error", "error": error})]
        return []

    def due(self, now: float) -> list[Frame]:
        if self.closing:  # draining: only the model's own answer
            return []
        owed = self.clock.owed_frames(now)
        if not owed:
            return []
        self.clock.sent(owed * MODEL_FRAME)
        return [np.tile(self._silence, owed).tobytes()]
