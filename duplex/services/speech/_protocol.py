"""The speech endpoints' protocol, sans I/O: request validation and the stream's state machine.

HTTP (``POST /v1/audio/speech`` and ``/batch``): `parse_speech` and
`parse_batch` turn a body into `SpeechParams` or a `Refusal` (OpenAI's
``{"error": {message, type, param, code}}`` with its status). Every field is
checked, unknown ones refused by name; nothing is clipped or ignored.

WebSocket (``/v1/audio/speech/stream``, vLLM-Omni's protocol): `SpeechStream`
takes each client frame and returns what to do, in order: `Reply` (a JSON
event to send now: errors), `Speak` (one sentence to synthesize, then send as
``audio.start``, binary audio, ``audio.done``), `FinishUtterance` (send
``session.done`` after the utterance's sentences) and `CloseStream`. The
route runs `Speak`, `FinishUtterance` and `CloseStream` in order and sends
`Reply` at once; this module never touches a socket or a clock.

Stream states::

    AWAIT_CONFIG --session.config--> READY --input.text--> SPEAKING --input.done--> READY
         any --session.close--> CLOSED      (session.config again: only in READY)
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from duplex.codecs import AUDIO_FORMATS, OPUS_RATE, STREAM_FORMATS
from duplex.exceptions import ProtocolError
from duplex.models.tts import MAX_SPEED, MIN_SPEED, SentenceBuffer
from duplex.refusals import Refusal, echo
from duplex.wire import dumps

from .._models import SPEECH

__all__ = [
    "MAX_BATCH_ITEMS",
    "MAX_INPUT_CHARS",
    "MAX_SPEECH_BODY",
    "MAX_STREAM_CONFIG_BYTES",
    "MAX_STREAM_TEXT_BYTES",
    "SAMPLE_RATES",
    "CloseStream",
    "FinishUtterance",
    "Refusal",
    "Reply",
    "Speak",
    "SpeechParams",
    "SpeechStream",
    "StreamConfig",
    "error_event",
    "parse_batch",
    "parse_speech",
    "refusal",
]

MAX_INPUT_CHARS: Final = 4096
"""The longest ``input`` (OpenAI's limit)."""
MAX_BATCH_ITEMS: Final = 64
"""The most inputs one ``/v1/audio/speech/batch`` takes."""
MAX_SPEECH_BODY: Final = 2 * 1024 * 1024
"""The largest body read (a full batch of the longest inputs, in 4-byte UTF-8, fits)."""
MAX_STREAM_TEXT_BYTES: Final = 128 * 1024
"""The largest ``input.text`` frame (vLLM-Omni's limit)."""
MAX_STREAM_CONFIG_BYTES: Final = 4 * 1024 * 1024
"""The largest ``session.config`` frame (vLLM-Omni's limit)."""
MAX_UTTERANCE_CHARS: Final = 1024 * 1024
"""The most text of one open sentence a stream holds (``split_granularity: sentence``; with
``none`` an utterance holds at most `MAX_INPUT_CHARS`, like one HTTP request)."""
SAMPLE_RATES: Final[tuple[int, ...]] = (8000, 16000, 22050, 24000, 44100, 48000)
"""Rates ``sample_rate`` may ask for (the engine's own rate is resampled)."""

VoiceCheck = Callable[[str], "str | Refusal | None"]
"""The TTS engine's voice check: an error message naming the valid voices, a refusal of its
own (an uploaded voice the TTS cannot speak with), or ``None``."""


def refusal(message: str, param: str | None = None, code: str = "invalid_value") -> Refusal:
    """A 400 naming ``param``."""
    return Refusal(400, message, code, param)


@final
@dataclass(frozen=True, slots=True)
class SpeechParams:
    """One validated speech request.

    Args:
        input: the text (non-empty, at most `MAX_INPUT_CHARS`).
        voice: a voice the engine has (checked).
        response_format: one of ``AUDIO_FORMATS``.
        speed: ``MIN_SPEED``..``MAX_SPEED``.
        sample_rate: one of `SAMPLE_RATES`; ``None``: the engine's own (``opus``: 24 kHz).
        stream: send the audio sentence by sentence as it is made.
        model: the model the client named: the TTS served, or an OpenAI alias of it
            (``None``: left out).
    """

    input: str
    voice: str = "alloy"
    response_format: str = "wav"
    speed: float = 1.0
    sample_rate: int | None = None
    stream: bool = False
    model: str | None = None


_SPEECH_FIELDS: Final = frozenset(
    {"model", "input", "voice", "response_format", "speed", "sample_rate", "stream",
     "stream_format", "instructions"}
)  # fmt: skip
_BATCH_FIELDS: Final = _SPEECH_FIELDS - {"stream", "stream_format"}


class _Bad(Exception):
    def __init__(self, refused: Refusal) -> None:
        self.refused = refused


def _fail(message: str, param: str | None = None, code: str = "invalid_value") -> _Bad:
    return _Bad(refusal(message, param, code))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_object(body: bytes | str) -> dict[str, Any]:
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _fail("The body is not valid JSON.", code="invalid_json") from None
    if not isinstance(value, dict):
        raise _fail("The body must be a JSON object.", code="invalid_json")
    return value


def _unknown(fields: Mapping[str, Any], known: frozenset[str], where: str = "") -> None:
    extra = sorted(set(fields) - known)
    if extra:
        names = ", ".join(f"{where}{name}" for name in extra)
        raise _fail(
            f"Unrecognized request argument supplied: {names}",
            f"{where}{extra[0]}",
            "unknown_parameter",
        )


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _fail(f"{param} must be a string.", param, "invalid_type")
    if not value.strip():
        raise _fail(f"{param} must not be empty.", param, "empty_input")
    if len(value) > MAX_INPUT_CHARS:
        raise _fail(
            f"{param} is {len(value)} characters; the most is {MAX_INPUT_CHARS}.",
            param,
            "string_above_max_length",
        )
    return value


def _common(fields: Mapping[str, Any], served: str, check_voice: VoiceCheck) -> dict[str, Any]:
    """The fields a speech request and a stream's config share, checked; ``model``: the
    ``served`` one or an OpenAI alias of it (``duplex.services._models``)."""
    out: dict[str, Any] = {}
    try:
        out["model"] = SPEECH.accepted(fields.get("model"), served)
    except ProtocolError as exc:
        raise _Bad(Refusal.of(exc)) from None
    voice = fields.get("voice", "alloy")
    if not isinstance(voice, str):
        raise _fail("voice must be a string.", "voice", "invalid_type")
    problem = check_voice(voice)
    if isinstance(problem, Refusal):
        raise _Bad(problem)
    if problem is not None:
        raise _fail(problem, "voice")
    out["voice"] = voice
    fmt = fields.get("response_format", "wav")
    if fmt not in AUDIO_FORMATS:
        raise _fail(
            f"response_format must be one of {', '.join(AUDIO_FORMATS)}; got {echo(fmt)}.",
            "response_format",
        )
    out["response_format"] = fmt
    speed = fields.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise _fail("speed must be a number.", "speed", "invalid_type")
    if isinstance(speed, float) and not math.isfinite(speed):  # isfinite(int) overflows
        raise _fail("speed must be a number.", "speed", "invalid_type")
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise _fail(f"speed must be {MIN_SPEED} to {MAX_SPEED}; got {speed}.", "speed")
    out["speed"] = float(speed)
    rate = fields.get("sample_rate")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, int) or rate not in SAMPLE_RATES:
            rates = ", ".join(map(str, SAMPLE_RATES))
            raise _fail(f"sample_rate must be one of {rates}; got {echo(rate)}.", "sample_rate")
        if fmt == "opus" and rate != OPUS_RATE:
            raise _fail(
                f"opus is encoded at {OPUS_RATE} Hz; leave sample_rate out or ask for {OPUS_RATE}.",
                "sample_rate",
            )
    out["sample_rate"] = rate
    instructions = fields.get("instructions")
    if instructions not in (None, ""):
        raise _fail(
            "instructions are not supported by this text-to-speech engine.",
            "instructions",
            "unsupported_parameter",
        )
    return out


def parse_speech(body: bytes | str, served: str, check_voice: VoiceCheck) -> SpeechParams | Refusal:
    """A ``POST /v1/audio/speech`` body (OpenAI's fields, plus ``sample_rate`` and ``stream``)
    for the TTS named ``served``."""
    try:
        fields = _json_object(body)
        _unknown(fields, _SPEECH_FIELDS)
        if "input" not in fields:
            raise _fail("input is required.", "input", "missing_required_parameter")
        text = _text(fields["input"], "input")
        common = _common(fields, served, check_voice)
        stream = fields.get("stream", False)
        if not isinstance(stream, bool):
            raise _fail("stream must be a boolean.", "stream", "invalid_type")
        stream_format = fields.get("stream_format", "audio")
        if stream_format != "audio":
            raise _fail(
                "stream_format must be audio (server-sent events are not supported).",
                "stream_format",
            )
        if stream and common["response_format"] not in STREAM_FORMATS:
            raise _fail(
                f"stream supports response_format {', '.join(STREAM_FORMATS)}.",
                "response_format",
            )
    except _Bad as bad:
        return bad.refused
    return SpeechParams(input=text, stream=stream, **common)


def parse_batch(
    body: bytes | str, served: str, check_voice: VoiceCheck
) -> list[SpeechParams] | Refusal:
    """A ``POST /v1/audio/speech/batch`` body: the speech fields, with ``input`` a list of
    1..`MAX_BATCH_ITEMS` texts; one `SpeechParams` per text, in order."""
    try:
        fields = _json_object(body)
        _unknown(fields, _BATCH_FIELDS)
        inputs = fields.get("input")
        if inputs is None:
            raise _fail("input is required.", "input", "missing_required_parameter")
        if not isinstance(inputs, list):
            raise _fail("input must be a list of strings.", "input", "invalid_type")
        if not 1 <= len(inputs) <= MAX_BATCH_ITEMS:
            count = len(inputs)
            raise _fail(f"input must hold 1 to {MAX_BATCH_ITEMS} texts; got {count}.", "input")
        texts = [_text(value, f"input[{i}]") for i, value in enumerate(inputs)]
        common = _common(fields, served, check_voice)
    except _Bad as bad:
        return bad.refused
    return [SpeechParams(input=text, **common) for text in texts]


# -- the stream ------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class StreamConfig:
    """A stream's ``session.config``: how its sentences are spoken and sent."""

    voice: str = "alloy"
    response_format: str = "wav"
    speed: float = 1.0
    sample_rate: int | None = None
    split_granularity: str = "sentence"
    model: str | None = None


_CONFIG_FIELDS: Final = frozenset(
    {"type", "model", "voice", "response_format", "speed", "sample_rate", "split_granularity",
     "instructions"}
)  # fmt: skip


@final
@dataclass(frozen=True, slots=True)
class Reply:
    """A JSON event to send now."""

    text: str


@final
@dataclass(frozen=True, slots=True)
class Speak:
    """Synthesize ``text`` and send it: ``audio.start``, one binary frame, ``audio.done``."""

    utterance_index: int
    sentence_index: int
    text: str
    config: StreamConfig

    def start_event(self, sample_rate: int) -> str:
        return dumps(
            {
                "type": "audio.start",
                "utterance_index": self.utterance_index,
                "sentence_index": self.sentence_index,
                "sentence_text": self.text,
                "format": self.config.response_format,
                "sample_rate": sample_rate,
                "channels": 1,
            }
        )

    def done_event(self) -> str:
        return dumps(
            {
                "type": "audio.done",
                "utterance_index": self.utterance_index,
                "sentence_index": self.sentence_index,
            }
        )


@final
@dataclass(frozen=True, slots=True)
class FinishUtterance:
    """Send ``session.done`` once the utterance's sentences are out."""

    utterance_index: int
    total_sentences: int

    def event(self) -> str:
        return dumps(
            {
                "type": "session.done",
                "utterance_index": self.utterance_index,
                "total_sentences": self.total_sentences,
            }
        )


@final
@dataclass(frozen=True, slots=True)
class CloseStream:
    """Close the socket (after what was queued before)."""

    code: int
    reason: str


StreamAction = Reply | Speak | FinishUtterance | CloseStream


def error_event(message: str, code: str | None = None) -> str:
    """vLLM-Omni's stream error, ``{type: error, message}``, with our ``code``."""
    event: dict[str, Any] = {"type": "error", "message": message}
    if code is not None:
        event["code"] = code
    return dumps(event)


class StreamState(enum.Enum):
    AWAIT_CONFIG = "await_config"
    READY = "ready"
    SPEAKING = "speaking"
    CLOSED = "closed"


@final
class SpeechStream:
    """One ``/v1/audio/speech/stream`` connection's protocol state.

    Args:
        served: the TTS's name (``model`` names it, or an OpenAI alias of it).
        check_voice: the engine's voice check.
    """

    def __init__(self, served: str, check_voice: VoiceCheck) -> None:
        self._served = served
        self._check_voice = check_voice
        self.state = StreamState.AWAIT_CONFIG
        self.config: StreamConfig | None = None
        self.utterance_index = 0
        self._sentences = 0
        self._buffer = SentenceBuffer(max_buffer=MAX_UTTERANCE_CHARS)
        self._whole: list[str] = []  # split_granularity none: the utterance's text so far
        self._whole_chars = 0

    def receive(self, frame: str | bytes) -> list[StreamAction]:
        """The actions one client frame asks for (errors included; the stream stays usable)."""
        if self.state is StreamState.CLOSED:
            return []
        if isinstance(frame, bytes):
            return [Reply(error_event("binary frames are not accepted: send JSON", "bad_frame"))]
        limit = (
            MAX_STREAM_CONFIG_BYTES if self.state is StreamState.AWAIT_CONFIG else
            max(MAX_STREAM_CONFIG_BYTES, MAX_STREAM_TEXT_BYTES)
        )  # fmt: skip
        if len(frame) > limit:
            return [Reply(error_event(f"frame over {limit} bytes", "frame_too_large"))]
        try:
            event = _json_object(frame)
        except _Bad as bad:
            return [Reply(error_event(bad.refused.message, bad.refused.code))]
        kind = event.get("type")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            known = ", ".join(_HANDLERS)
            message = f"unknown event type {echo(kind)}: use {known}"
            return [Reply(error_event(message, "unknown_event"))]
        try:
            return handler(self, event)
        except _Bad as bad:
            return [Reply(error_event(bad.refused.message, bad.refused.code))]

    def _configure(self, event: dict[str, Any]) -> list[StreamAction]:
        if self.state is StreamState.SPEAKING:
            raise _fail("session.config mid-utterance: send input.done first", code="bad_state")
        _unknown(event, _CONFIG_FIELDS)
        common = _common(event, self._served, self._check_voice)
        granularity = event.get("split_granularity", "sentence")
        if granularity not in ("sentence", "none"):
            raise _fail("split_granularity must be sentence or none.", "split_granularity")
        self.config = StreamConfig(split_granularity=granularity, **common)
        self.state = StreamState.READY
        return []

    def _need_config(self) -> StreamConfig:
        if self.config is None:
            raise _fail("send session.config first", code="config_required")
        return self.config

    def _speak(self, pieces: list[str]) -> list[StreamAction]:
        config = self._need_config()
        out: list[StreamAction] = []
        for piece in pieces:
            out.append(Speak(self.utterance_index, self._sentences, piece, config))
            self._sentences += 1
        return out

    def _input_text(self, event: dict[str, Any]) -> list[StreamAction]:
        config = self._need_config()
        _unknown(event, frozenset({"type", "text"}))
        text = event.get("text")
        if not isinstance(text, str):
            raise _fail("input.text needs text, a string.", "text", "invalid_type")
        if len(text.encode()) > MAX_STREAM_TEXT_BYTES:
            raise _fail(f"text over {MAX_STREAM_TEXT_BYTES} bytes", "text", "text_too_large")
        if config.split_granularity == "none":
            if self._whole_chars + len(text) > MAX_INPUT_CHARS:
                raise _fail(
                    f"more than {MAX_INPUT_CHARS} characters before input.done "
                    "(split_granularity none speaks the utterance as one input)",
                    "text",
                    "text_too_large",
                )
            self._whole.append(text)
            self._whole_chars += len(text)
            self.state = StreamState.SPEAKING
            return []
        try:
            pieces = self._buffer.feed(text)
        except ValueError as exc:
            raise _fail(str(exc), "text", "text_too_large") from None
        self.state = StreamState.SPEAKING
        return self._speak(pieces)

    def _input_done(self, event: dict[str, Any]) -> list[StreamAction]:
        config = self._need_config()
        _unknown(event, frozenset({"type"}))
        if config.split_granularity == "sentence":
            actions = self._speak(self._buffer.flush())
        else:  # the whole utterance as one request (its runner still speaks it by sentence)
            whole = "".join(self._whole).strip()
            self._whole, self._whole_chars = [], 0
            actions = self._speak([whole] if whole else [])
        actions.append(FinishUtterance(self.utterance_index, self._sentences))
        self.utterance_index += 1
        self._sentences = 0
        self.state = StreamState.READY
        return actions

    def _close(self, event: dict[str, Any]) -> list[StreamAction]:
        self.state = StreamState.CLOSED
        return [CloseStream(1000, "session_closed")]


_HANDLERS: Final[dict[str, Callable[[SpeechStream, dict[str, Any]], list[StreamAction]]]] = {
    "session.config": SpeechStream._configure,
    "input.text": SpeechStream._input_text,
    "input.done": SpeechStream._input_done,
    "session.close": SpeechStream._close,
}
