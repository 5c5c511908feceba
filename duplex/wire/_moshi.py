"""Moshi's ``/api/chat`` projection (Kyutai's reference server, NVIDIA's PersonaPlex), sans-I/O.

Every message is one binary WebSocket frame whose first byte is its kind:

- ``0x00`` handshake, server to client, the bare byte: sent when the session's
  engine slot takes input (`SessionReady`: its prompt is replayed), never before;
- ``0x01`` audio, both ways: Ogg-encapsulated Opus, 24 kHz mono (`OggOpusDecoder`
  in, `OggOpusEncoder` out: one model frame becomes its pages at once);
- ``0x02`` text, server to client: one UTF-8 piece of the model's text stream;
- ``0x05`` error, server to client: ``code: message`` in UTF-8.

From the client, ``0x03`` (the web client's control byte), ``0x04`` (metadata)
and ``0x06`` (ping) are accepted and ignored (counted); any other kind, an empty
or text frame, or a frame over ``max_size`` is an error that ends the
connection, as is any broken Ogg or Opus data: the stream cannot be resumed
after a bad page, so such errors carry a ``close``. Audio that arrives before
the handshake is decoded (the Ogg stream continues across it) and discarded, as
PersonaPlex's server does: the conversation starts without a backlog.

The projection keeps only wire state: its codecs, whether the handshake went out,
the output clock. The sessions it opens are ordinary duplex sessions
(`initial_options`): the query's prompt, ``overlap_policy="model"`` (the model
decides who speaks, as in Kyutai's server) and ``announce_ready``. A peer that
leaves closes the session (`left`): the protocol has no resume.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, final

import numpy as np

from duplex.codecs import SAMPLE_RATE, OggOpusDecoder, OggOpusEncoder
from duplex.exceptions import (
    BadEvent,
    BinaryFrameUnsupported,
    EventTooLarge,
    ProtocolError,
    UnknownEvent,
)
from duplex.sessions import (
    AudioAppend,
    AudioDelta,
    ClientEvent,
    ErrorEvent,
    ServerEvent,
    SessionClose,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionOptions,
    SessionPrompt,
    SessionReady,
    SessionSampling,
    TranscriptDelta,
)

from ._envelope import DEFAULT_MAX_EVENT_BYTES
from ._stream import Frame, Later, OutputClock

__all__ = [
    "CLIENT_IGNORED_KINDS",
    "KIND_AUDIO",
    "KIND_ERROR",
    "KIND_HANDSHAKE",
    "KIND_TEXT",
    "ChatQuery",
    "MoshiProjection",
    "error_frame",
]

KIND_HANDSHAKE: Final = 0x00
KIND_AUDIO: Final = 0x01
KIND_TEXT: Final = 0x02
KIND_ERROR: Final = 0x05
CLIENT_IGNORED_KINDS: Final = frozenset({0x03, 0x04, 0x06})
"""Control (the web client's start/endTurn/pause/restart), metadata, ping."""

MODEL_FRAME: Final = 1_920
"""One 80 ms model frame at 24 kHz: the unit of silence the output clock adds."""

CLOSE_CODES: Final = {
    "bad_audio": 1007,  # invalid frame payload data
    "event_too_large": 1009,  # message too big
    "binary_frame_unsupported": 1003,  # unsupported data (here: a text frame)
    "unknown_event": 1003,
}
"""WebSocket close code of each error the projection cannot go on after (else 1008)."""


def error_frame(event: ErrorEvent) -> bytes:
    """The ``0x05`` message of an error: ``code: message``, UTF-8."""
    return bytes([KIND_ERROR]) + f"{event.code}: {event.message}".encode()


def _fatal(exc: ProtocolError) -> ProtocolError:
    exc.close = (CLOSE_CODES.get(exc.code, 1008), exc.code)
    return exc


# --------------------------------------------------------------------- the query


_QUERY_SAMPLING: Final = {
    "text_temperature": ("text_temperature", float),
    "text_topk": ("text_top_k", int),
    "audio_temperature": ("audio_temperature", float),
    "audio_topk": ("audio_top_k", int),
    "pad_mult": ("pad_mult", float),
    "text_seed": ("text_seed", int),
    "audio_seed": ("audio_seed", int),
    "repetition_penalty_context": ("repetition_penalty_context", int),
    "repetition_penalty": ("repetition_penalty", float),
}
"""The Moshi web client's sampling parameters -> (`SessionSampling` field, type)."""
_MAX_PROMPT_CHARS: Final = 16_384
"""A text prompt longer than this is refused (the web client's personas are a few hundred)."""


def _number(params: Mapping[str, str], name: str, kind: type) -> float | int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise _fatal(
            BadEvent(f"{name} must be {'an integer' if kind is int else 'a number'}", param=name)
        ) from None
    if kind is float and not math.isfinite(value):
        raise _fatal(BadEvent(f"{name} must be finite", param=name))
    return value


@final
@dataclass(frozen=True, slots=True)
class ChatQuery:
    """What an ``/api/chat`` URL asks for: PersonaPlex's prompt and the web client's sampling.

    The sampling parameters become the session's `SessionSampling` (the session owns
    them and checks their ranges; each model applies what it can). Parameters the
    server does not know (``worker_auth_id``, ``email``, ``image_url``, ...) are
    ignored, as Kyutai's server ignores every parameter.
    """

    text_prompt: str | None = field(default=None, repr=False)
    voice_prompt: str | None = None
    sampling: SessionSampling | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> ChatQuery:
        """Read the query string's parameters.

        Raises:
            BadEvent: a parameter is malformed or out of range (``param`` names the
                query parameter; it carries a ``close``: the URL cannot change on the
                same socket).
        """
        values: dict[str, float | int] = {}
        for name, (key, kind) in _QUERY_SAMPLING.items():
            value = _number(params, name, kind)
            if value is None:
                continue
            try:
                SessionSampling(**{key: value})  # the session's range, named as the client did
            except BadEvent as exc:
                message = exc.message.replace(f"session.sampling.{key}", name)
                raise _fatal(BadEvent(message, param=name)) from None
            values[key] = value
        text = params.get("text_prompt") or None
        if text is not None and len(text) > _MAX_PROMPT_CHARS:
            raise _fatal(
                BadEvent(f"text_prompt is over {_MAX_PROMPT_CHARS} characters", param="text_prompt")
            )
        voice = params.get("voice_prompt") or None
        return cls(text, voice, SessionSampling(**values) if values else None)  # type: ignore[arg-type]

    def options(self) -> SessionOptions:
        """The options of the duplex session this conversation is."""
        prompt = None
        if self.text_prompt is not None or self.voice_prompt is not None:
            prompt = SessionPrompt(text=self.text_prompt, voice=self.voice_prompt)
        return SessionOptions(
            overlap_policy="model", prompt=prompt, sampling=self.sampling, announce_ready=True
        )


# -------------------------------------------------------------------- projection


@final
@dataclass(slots=True)
class MoshiStatistics:
    """What one connection's projection did with frames that carry no session event."""

    ignored_frames: int = 0
    """``0x03`` / ``0x04`` / ``0x06`` frames."""
    dropped_before_handshake_samples: int = 0
    silence_samples: int = 0
    skipped_samples: int = 0


@final
class MoshiProjection:
    """One ``/api/chat`` connection's codec (see the module docstring)."""

    def __init__(self, query: ChatQuery, *, max_size: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.query = query
        self.max_size = max_size
        self.decoder = OggOpusDecoder()
        self.encoder = OggOpusEncoder()
        self.clock = OutputClock(SAMPLE_RATE, MODEL_FRAME)
        self.live = False
        """A session is open on this socket (its leaving must close it)."""
        self.handshaken = False
        self._failed = False
        self._rest = np.zeros(0, dtype=np.int16)  # output short of one Opus packet
        self._silence = np.zeros(MODEL_FRAME, dtype=np.int16)
        self.stats = MoshiStatistics()

    @property
    def initial_options(self) -> SessionOptions:
        return self.query.options()

    @property
    def failed(self) -> bool:
        return self._failed

    # -- in ---------------------------------------------------------------

    def parse(self, data: str | bytes, now: float) -> ClientEvent | Later | None:
        try:
            return self._parse(data)
        except ProtocolError as exc:
            if exc.close is not None:
                self._failed = True
            raise

    def _parse(self, data: str | bytes) -> ClientEvent | None:
        if isinstance(data, str):
            raise _fatal(BinaryFrameUnsupported("/api/chat takes binary frames only"))
        if len(data) > self.max_size:
            raise _fatal(EventTooLarge(f"message is over {self.max_size} bytes"))
        if not data:
            raise _fatal(BadEvent("an empty message has no kind"))
        kind = data[0]
        if kind == KIND_AUDIO:
            try:
                pcm = self.decoder.feed(memoryview(data)[1:])
            except ProtocolError as exc:  # OggError, OpusDecodeError: the stream is dead
                raise _fatal(exc) from None
            if not self.handshaken:
                self.stats.dropped_before_handshake_samples += len(pcm)
                return None
            if not len(pcm):
                return None
            pcm.flags.writeable = False  # the session keeps it without copying
            return AudioAppend(pcm, SAMPLE_RATE)
        if kind in CLIENT_IGNORED_KINDS:
            self.stats.ignored_frames += 1
            return None
        raise _fatal(UnknownEvent(f"message kind 0x{kind:02x} is not one a client sends"))

    def left(self) -> ClientEvent | None:
        """A peer that leaves ends its conversation (there is no resume on ``/api/chat``)."""
        return SessionClose() if self.live else None

    # -- out --------------------------------------------------------------

    def frames(self, event: ServerEvent, seq: int | None, now: float) -> list[Frame]:
        match event:
            case AudioDelta():
                return self._audio(np.frombuffer(event.pcm, dtype="<i2"))
            case TranscriptDelta():
                return [bytes([KIND_TEXT]) + event.delta.encode()] if event.delta else []
            case SessionReady():
                self.handshaken = True
                self.clock.start(now)
                return [bytes([KIND_HANDSHAKE])]
            case SessionCreated():
                self.live = True
            case SessionClosed() | SessionExpired():
                self.live = False
            case ErrorEvent():
                return [error_frame(event)]
        return []

    def due(self, now: float) -> list[Frame]:
        owed = self.clock.owed_frames(now)
        self.stats.skipped_samples = self.clock.skipped_samples
        if not owed:
            return []
        self.stats.silence_samples += owed * MODEL_FRAME
        return self._audio(np.tile(self._silence, owed))

    def _audio(self, pcm: np.ndarray) -> list[Frame]:
        """Whole Opus packets now; a remainder waits for the next audio (never re-timed)."""
        if len(self._rest):
            pcm = np.concatenate([self._rest, pcm])
        n = self.encoder.frame_samples
        whole = len(pcm) - len(pcm) % n
        self._rest = pcm[whole:].copy()
        if not whole:
            return []
        self.clock.sent(whole)
        return [bytes([KIND_AUDIO]) + self.encoder.encode(np.ascontiguousarray(pcm[:whole]))]
