"""The native ``/v1/duplex`` JSON projection, sans-I/O.

`parse_client_event` turns one text frame into a typed client event from
``duplex.sessions`` or raises the `ProtocolError` subclass of the wire code
(``invalid_json``, ``unknown_event``, ``bad_event``, ``bad_audio``,
``unsupported_audio_format``, ``event_too_large``, ``binary_frame_unsupported``,
``invalid_video_frames``), with ``event_id`` filled whenever it could be read.
Nothing else escapes (websockets' "parse errors never escape the core"). The
frame up to ``type`` and ``event_id`` is read by ``_envelope``, shared with the
Realtime projection; `client_event` reads the rest.

`encode_server_event` turns a server event into a JSON-ready dict stamped with
``event_id`` (``event_<hex>``) and ``server_event_seq`` (``None`` for
connection-scoped events, which are never journaled). Audio in: base64 PCM16
LE or float32 LE with ``sample_rate``; audio out: base64 PCM16 LE at 24 kHz.
This dict is the wire edge: no dict with a ``type`` key goes further in.
`NativeProjection.frames` writes it as JSON text; audio deltas, one per frame,
are written by `audio_delta_text` from a template with the same text.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from duplex.exceptions import (
    BadAudio,
    BadEvent,
    InvalidVideoFrames,
    ProtocolError,
    UnknownEvent,
    UnsupportedAudioFormat,
)
from duplex.pcm import pcm16_to_float
from duplex.refusals import echo
from duplex.sessions import (
    DURATION_MS,
    SUPPORTED_SAMPLE_RATES,
    AudioAppend,
    AudioClear,
    AudioCommit,
    AudioDelta,
    ClientEvent,
    ErrorEvent,
    EventAck,
    FunctionCallDelta,
    FunctionCallDone,
    HistoryItem,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeout,
    InputSpeechStarted,
    InputSpeechStopped,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    ItemAdded,
    ItemDeleted,
    ItemRetrieved,
    ItemTruncated,
    OverlapDecision,
    PlaybackAck,
    PlaybackAcknowledged,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    ServerEvent,
    SessionClose,
    SessionClosed,
    SessionConfig,
    SessionCreate,
    SessionCreated,
    SessionExpired,
    SessionOptions,
    SessionPrompt,
    SessionReady,
    SessionReplaced,
    SessionResume,
    SessionResumed,
    SessionResyncRequired,
    SessionUpdate,
    SessionUpdated,
    TextDelta,
    TranscriptDelta,
    TurnSignal,
    VideoAppend,
    VideoConsumed,
)

from ._envelope import DEFAULT_MAX_EVENT_BYTES, Envelope, read_envelope
from ._json_text import b64, b64_decode, dumps, number, string

__all__ = [
    "CLIENT_EVENT_NAMES",
    "DEFAULT_MAX_EVENT_BYTES",
    "SERVER_EVENT_NAMES",
    "audio_delta_text",
    "client_event",
    "encode_server_event",
    "parse_client_event",
]

_PCM16_NAMES = ("pcm16", "pcm_s16le", "s16le")
_F32_NAMES = ("float32", "pcm_f32le", "f32le")

_SESSION_FIELDS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    # wire key -> (SessionOptions field, accepted JSON types)
    "overlap_policy": ("overlap_policy", str),
    "overlap_short_ack_ms": ("short_ack_ms", int),
    "short_ack_ms": ("short_ack_ms", int),
    "overlap_barge_in_ms": ("barge_in_ms", int),
    "barge_in_ms": ("barge_in_ms", int),
    "false_interruption_enabled": ("false_interruption_enabled", bool),
    "false_interruption_timeout_s": ("false_interruption_timeout_s", (int, float)),
    "playback_commit_policy": ("playback_commit_policy", str),
    "input_sample_rate": ("input_sample_rate", int),
    "prompt": ("prompt", dict),
}
_PROMPT_FIELDS = ("text", "voice")


# ------------------------------------------------------------------ field readers


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, required: bool) -> Any:
    """Read one typed field; bools never pass for numbers."""
    if key not in obj or obj[key] is None:
        if required:
            raise BadEvent(f"missing required field {key!r}", param=key)
        return None
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise BadEvent(f"{key} must be {_names(kinds)}", param=key)
    if not isinstance(value, kinds):
        raise BadEvent(f"{key} must be {_names(kinds)}", param=key)
    return value


_MS_NUMBER = replace(DURATION_MS, integer=False)


def _ms(obj: Mapping[str, Any], key: str) -> int:
    """A required millisecond count (`DURATION_MS`); JSON numbers may be fractional."""
    return int(_MS_NUMBER.read(_get(obj, key, (int, float), required=True), key))


def _names(kinds: tuple[type, ...]) -> str:
    words = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}
    return " or ".join(words.get(k, k.__name__) for k in kinds)


def _audio_format(obj: Mapping[str, Any]) -> str:
    fmt = _get(obj, "format", str, required=False) or "pcm16"
    if isinstance(fmt, str) and fmt in _PCM16_NAMES:
        return "pcm16"
    if fmt in _F32_NAMES:
        return "float32"
    raise UnsupportedAudioFormat(
        f"audio format {echo(fmt)} is not supported; use pcm16 or float32", param="format"
    )


def _decode_audio(raw: bytes, fmt: str) -> np.ndarray:
    width = 2 if fmt == "pcm16" else 4
    if len(raw) % width:
        raise BadAudio(f"{fmt} audio must be a whole number of samples", param="audio")
    if fmt == "pcm16":
        pcm = pcm16_to_float(np.frombuffer(raw, dtype="<i2"))
    else:
        pcm = np.frombuffer(raw, dtype="<f4").astype(np.float32, copy=False)  # a view, if LE
        if not np.isfinite(pcm).all():
            raise BadAudio("float32 audio has NaN or infinite samples", param="audio")
    pcm.flags.writeable = False  # the session keeps it without copying
    return pcm


# ---------------------------------------------------------------------- parsers


def _session_options(obj: Mapping[str, Any]) -> SessionOptions:
    session = _get(obj, "session", dict, required=False) or {}
    unknown = sorted(set(session) - set(_SESSION_FIELDS))
    if unknown:  # refused, never silently ignored
        raise BadEvent(
            f"unknown session field {unknown[0]!r}; known: {', '.join(sorted(_SESSION_FIELDS))}",
            param=f"session.{unknown[0]}",
        )
    values: dict[str, Any] = {}
    for key, (name, kind) in _SESSION_FIELDS.items():
        try:
            value = _get(session, key, kind, required=False)
        except BadEvent as exc:
            raise BadEvent(exc.message, param=f"session.{key}") from exc
        if value is not None:
            values[name] = _prompt(value) if key == "prompt" else value
    return SessionOptions(**values)


def _prompt(obj: Mapping[str, Any]) -> SessionPrompt:
    """``session.prompt``: ``{text?, voice?}`` strings (unknown keys refused)."""
    unknown = sorted(set(obj) - set(_PROMPT_FIELDS))
    if unknown:
        raise BadEvent(
            f"unknown session.prompt field {unknown[0]!r}; known: text, voice",
            param=f"session.prompt.{unknown[0]}",
        )
    fields: dict[str, str | None] = {}
    for key in _PROMPT_FIELDS:
        try:
            fields[key] = _get(obj, key, str, required=False)
        except BadEvent as exc:
            raise BadEvent(exc.message, param=f"session.prompt.{key}") from exc
    return SessionPrompt(text=fields["text"], voice=fields["voice"])


def _append(obj: dict[str, Any]) -> AudioAppend:
    fmt = _audio_format(obj)
    rate = _get(obj, "sample_rate", int, required=False)
    if rate is None:
        rate = _get(obj, "sample_rate_hz", int, required=False)
    if rate is not None and rate not in SUPPORTED_SAMPLE_RATES:
        raise UnsupportedAudioFormat(
            f"sample_rate {rate} is not supported; use one of {SUPPORTED_SAMPLE_RATES}",
            param="sample_rate",
        )
    _get(obj, "audio", str, required=True)
    # Popped from the event, so the base64 text is freed once decoded, and the bytes
    # once they are samples: no two of text, bytes and samples outlive their step.
    pcm = _decode_audio(b64_decode(obj.pop("audio"), "audio", BadAudio), fmt)
    return AudioAppend(pcm, rate, obj.get("event_id"))


def _video(obj: Mapping[str, Any]) -> VideoAppend:
    frame = b64_decode(_get(obj, "frame", str, required=True), "frame", InvalidVideoFrames)
    frame_id = obj.get("frame_id")
    if isinstance(frame_id, int) and not isinstance(frame_id, bool):
        frame_id = str(frame_id)
    if not isinstance(frame_id, str):
        raise BadEvent("frame_id must be a string", param="frame_id")
    return VideoAppend(
        frame=frame,
        frame_id=frame_id,
        pts_ms=_get(obj, "pts_ms", int, required=True),
        format=_get(obj, "format", str, required=False) or "jpeg",
        width=_get(obj, "width", int, required=False),
        height=_get(obj, "height", int, required=False),
        event_id=obj.get("event_id"),
    )


def _turn_signal(obj: Mapping[str, Any]) -> TurnSignal:
    payload = _get(obj, "payload", dict, required=False) or {}
    source = payload.get("source") if isinstance(payload.get("source"), str) else None
    signal = _get(obj, "event", str, required=True)
    return TurnSignal(signal, source, obj.get("event_id"))


_PARSERS: dict[str, Callable[[dict[str, Any]], ClientEvent]] = {
    "session.create": lambda o: SessionCreate(_session_options(o), o.get("event_id")),
    "session.update": lambda o: SessionUpdate(_session_options(o), o.get("event_id")),
    "input_audio_buffer.append": _append,
    "input_audio_buffer.commit": lambda o: AudioCommit(o.get("event_id")),
    "input_audio_buffer.clear": lambda o: AudioClear(o.get("event_id")),
    "turn.signal": _turn_signal,
    "playback.ack": lambda o: PlaybackAck(
        _get(o, "response_id", str, required=True),
        _ms(o, "played_ms"),
        _get(o, "item_id", str, required=False),
        o.get("event_id"),
    ),
    "response.create": lambda o: ResponseCreate(o.get("event_id")),
    "response.cancel": lambda o: ResponseCancel(
        _get(o, "response_id", str, required=False), o.get("event_id")
    ),
    "session.resume": lambda o: SessionResume(
        _get(o, "session_id", str, required=True),
        _get(o, "resume_token", str, required=True),
        _get(o, "last_received_server_event_seq", int, required=False) or 0,
        o.get("event_id"),
    ),
    "session.event_ack": lambda o: EventAck(
        _get(o, "server_event_seq", int, required=True), o.get("event_id")
    ),
    "session.close": lambda o: SessionClose(o.get("event_id")),
    "input_video.append": _video,
}
CLIENT_EVENT_NAMES: tuple[str, ...] = tuple(_PARSERS)


def parse_client_event(
    data: str | bytes, *, max_size: int = DEFAULT_MAX_EVENT_BYTES
) -> ClientEvent:
    """Parse one WebSocket message.

    Args:
        data: a text frame (``str``); ``bytes`` means a binary frame, which is refused.
        max_size: the largest accepted message, in bytes of UTF-8.

    Returns:
        The typed client event.

    Raises:
        ProtocolError: a subclass per wire code; ``event_id`` is set when readable.
    """
    return client_event(read_envelope(data, max_size=max_size))


def client_event(envelope: Envelope) -> ClientEvent:
    """The native client event of a frame's envelope (the Realtime projection reads its
    duplex extensions with it too).

    Raises:
        ProtocolError: a subclass per wire code, with the envelope's ``event_id``.
    """
    try:
        parser = _PARSERS.get(envelope.type)
        if parser is None:
            raise UnknownEvent(f"unknown event type {envelope.type!r}", param="type")
        return parser(envelope.body)  # its event_id, read with .get, is the envelope's
    except ProtocolError as exc:
        exc.event_id = exc.event_id or envelope.event_id
        exc.event_type = exc.event_type or envelope.type
        raise


# --------------------------------------------------------------------- encoders


def _config(config: SessionConfig) -> dict[str, Any]:
    return {
        "overlap_policy": config.overlap_policy.value,  # the wire name, a plain str
        "overlap_short_ack_ms": config.short_ack_ms,
        "overlap_barge_in_ms": config.barge_in_ms,
        "overlap_silence_rms": config.vad_threshold_rms,
        "false_interruption_enabled": config.false_interruption_enabled,
        "false_interruption_timeout_s": config.false_interruption_timeout_s,
        "playback_commit_policy": config.playback_commit_policy.value,
        "input_sample_rate": config.input_sample_rate,
        "output_audio_format": "pcm16",
        "output_sample_rate": config.output_sample_rate,
        "idle_timeout_s": config.idle_ttl_s,
        "disconnect_grace_s": config.disconnect_grace_s,
    }


def _body(event: ServerEvent) -> tuple[str, dict[str, Any]]:
    match event:
        case SessionCreated():
            session = {"id": event.session_id, "epoch": event.epoch, **_config(event.config)}
            session["capabilities"] = event.capabilities.as_dict()
            return "session.created", {
                "session": session,
                "resume_token": event.resume_token,
                "attachment_generation": event.attachment_generation,
            }
        case SessionUpdated():
            return "session.updated", {"session": {"id": event.session_id, **_config(event.config)}}
        case SessionResumed():
            return "session.resumed", {
                "session_id": event.session_id,
                "resume_token": event.resume_token,
                "attachment_generation": event.attachment_generation,
                "epoch": event.epoch,
                "replay_count": event.replay_count,
                "last_server_event_seq": event.last_server_event_seq,
            }
        case SessionReplaced():
            return "session.replaced", {
                "session_id": event.session_id,
                "attachment_generation": event.attachment_generation,
            }
        case SessionReady():
            return "session.ready", {"session_id": event.session_id}
        case SessionExpired() | SessionClosed():
            name = "session.expired" if isinstance(event, SessionExpired) else "session.closed"
            return name, {"session_id": event.session_id, "reason": event.reason}
        case SessionResyncRequired():
            return "session.resync_required", {
                "session_id": event.session_id,
                "reason": event.reason,
                "last_server_event_seq": event.last_server_event_seq,
            }
        case InputAudioCommitted():
            return "input_audio_buffer.committed", {
                "item_id": event.item_id,
                "turn_id": event.turn_id,
                "audio_end_ms": event.audio_end_ms,
            }
        case InputAudioCleared():
            return "input_audio_buffer.cleared", {"epoch": event.epoch}
        case InputSpeechStarted():
            return "input_audio_buffer.speech_started", {"audio_start_ms": event.audio_start_ms}
        case InputSpeechStopped():
            return "input_audio_buffer.speech_stopped", {"audio_end_ms": event.audio_end_ms}
        case InputAudioTimeout():
            return "input_audio_buffer.timeout_triggered", {
                "audio_start_ms": event.audio_start_ms,
                "audio_end_ms": event.audio_end_ms,
                "item_id": event.item_id,
            }
        case InputTranscriptionDelta():
            return "conversation.item.input_audio_transcription.delta", {
                "item_id": event.item_id,
                "content_index": 0,
                "delta": event.delta,
            }
        case InputTranscriptionCompleted():
            return "conversation.item.input_audio_transcription.completed", {
                "item_id": event.item_id,
                "content_index": 0,
                "transcript": event.transcript,
            }
        case InputTranscriptionFailed():
            return "conversation.item.input_audio_transcription.failed", {
                "item_id": event.item_id,
                "content_index": 0,
                "error": {
                    "type": "transcription_error",
                    "code": event.code,
                    "message": event.message,
                    "param": None,
                },
            }
        case ItemAdded():
            return "conversation.item.created", {
                "previous_item_id": event.previous_item_id,
                "item": _item(event.item),
            }
        case ItemRetrieved():
            return "conversation.item.retrieved", {"item": _item(event.item)}
        case ItemDeleted():
            return "conversation.item.deleted", {"item_id": event.item_id}
        case ItemTruncated():
            return "conversation.item.truncated", {
                "item_id": event.item_id,
                "content_index": event.content_index,
                "audio_end_ms": event.audio_end_ms,
            }
        case ResponseCreated():
            return "response.created", {
                "response": {
                    "id": event.response_id,
                    "object": "realtime.response",
                    "status": "in_progress",
                    "output": [{"id": event.item_id, "role": "assistant"}],
                    "metadata": {"epoch": event.epoch},
                }
            }
        case AudioDelta():
            return "response.audio.delta", {
                **_delta_ids(event.response_id, event.item_id, event.epoch),
                "delta": b64(event.pcm),
                "format": "pcm16",
                "sample_rate_hz": event.sample_rate,
                "audio_start_ms": event.audio_start_ms,
            }
        case TranscriptDelta():
            return "response.audio_transcript.delta", {
                **_delta_ids(event.response_id, event.item_id, event.epoch),
                "delta": event.delta,
                "audio_start_ms": event.audio_start_ms,
            }
        case TextDelta():  # a text-only response (not settable on this protocol yet)
            return "response.text.delta", {
                **_delta_ids(event.response_id, event.item_id, event.epoch),
                "delta": event.delta,
            }
        case ResponseDone():
            return "response.done", {
                "response": {
                    "id": event.response_id,
                    "object": "realtime.response",
                    "status": event.status,
                    "status_details": {"reason": event.reason},
                    "output": [
                        {"id": event.item_id, "role": "assistant", "transcript": event.transcript},
                        *(_item(call) for call in event.calls),
                    ],
                    "metadata": {"epoch": event.epoch, "audio_ms": event.audio_ms},
                }
            }
        case FunctionCallDelta():
            return "response.function_call_arguments.delta", {
                "response_id": event.response_id,
                "item_id": event.item.item_id,
                "output_index": event.output_index,
                "call_id": event.item.call_id,
                "name": event.item.name,
                "delta": event.delta,
                "epoch": event.epoch,
            }
        case FunctionCallDone():
            return "response.function_call_arguments.done", {
                "response_id": event.response_id,
                "item_id": event.item.item_id,
                "output_index": event.output_index,
                "call_id": event.item.call_id,
                "name": event.item.name,
                "arguments": event.item.text,
                "complete": event.complete,
                "epoch": event.epoch,
            }
        case ResponseListen():
            return "response.listen", {
                "epoch": event.epoch,
                "response": {
                    "object": "realtime.response",
                    "status": "listening",
                    "metadata": {"reason": event.reason},
                },
            }
        case OverlapDecision():
            return "overlap.decision", {
                "policy": event.policy,
                "action": event.action,
                "reason": event.reason,
                "overlap_ms": event.overlap_ms,
                "response_id": event.response_id,
            }
        case PlaybackAcknowledged():
            return "playback.acknowledged", {
                "response_id": event.response_id,
                "item_id": event.item_id,
                "played_ms": event.played_ms,
                "committed_ms": event.committed_ms,
                "playback": {
                    "generated_ms": event.generated_ms,
                    "sent_ms": event.sent_ms,
                    "played_ms": event.played_ms,
                    "committed_ms": event.committed_ms,
                },
                "history_committed": event.history_committed,
            }
        case VideoConsumed():
            return "input_video.consumed", {
                "frame_ids": list(event.frame_ids),
                "latest_pts_ms": event.latest_pts_ms,
            }
        case ErrorEvent():
            return "error", {
                "error": {
                    "type": event.type,
                    "code": event.code,
                    "message": event.message,
                    "event_id": event.event_id,
                    "param": event.param,
                }
            }
    raise TypeError(f"not a server event: {type(event).__name__}")


def _item(item: HistoryItem) -> dict[str, Any]:
    wire = {
        "id": item.item_id,
        "object": "realtime.item",
        "type": "message",
        "role": item.role,
        "status": item.status,
        "content_type": item.content,
        "audio_ms": item.audio_ms,
        "text": item.text,
    }
    if item.content.startswith("function_call"):  # a tool item names its call
        wire.update(call_id=item.call_id, name=item.name)
    return wire


def _delta_ids(response_id: str, item_id: str, epoch: int) -> dict[str, Any]:
    return {
        "response_id": response_id,
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        "epoch": epoch,
    }


SERVER_EVENT_NAMES: tuple[str, ...] = (
    "session.created",
    "session.updated",
    "session.resumed",
    "session.replaced",
    "session.expired",
    "session.resync_required",
    "session.ready",
    "session.closed",
    "input_audio_buffer.committed",
    "input_audio_buffer.cleared",
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
    "input_audio_buffer.timeout_triggered",
    "conversation.item.created",
    "conversation.item.retrieved",
    "conversation.item.deleted",
    "conversation.item.truncated",
    "response.created",
    "response.audio.delta",
    "response.audio_transcript.delta",
    "response.text.delta",
    "response.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.listen",
    "overlap.decision",
    "playback.acknowledged",
    "input_video.consumed",
    "error",
)


def encode_server_event(
    event: ServerEvent,
    seq: int | None,
    *,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> dict[str, Any]:
    """The JSON-ready wire form of ``event``.

    Args:
        event: a server event from ``duplex.sessions``.
        seq: its ``server_event_seq`` from the `Send` effect (``None``: connection-scoped).
        random_bytes: randomness for the ``event_<hex>`` id.

    Returns:
        A dict with ``type``, ``event_id``, ``server_event_seq`` and the event's fields.
    """
    name, body = _body(event)
    return {
        "type": name,
        "event_id": f"event_{random_bytes(12).hex()}",
        "server_event_seq": seq,
        **body,
    }


def audio_delta_text(
    event: AudioDelta,
    seq: int | None,
    *,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> str:
    """`encode_server_event` of an audio delta, as its JSON text, from a template.

    The event sent for every frame: the same text as `dumps` of the dict, field
    for field, without building the dict (``_json_text`` says why).
    """
    return (
        f'{{"type":"response.audio.delta","event_id":"event_{random_bytes(12).hex()}",'
        f'"server_event_seq":{number(seq)},"response_id":{string(event.response_id)},'
        f'"item_id":{string(event.item_id)},"output_index":0,"content_index":0,'
        f'"epoch":{number(event.epoch)},"delta":"{b64(event.pcm)}","format":"pcm16",'
        f'"sample_rate_hz":{number(event.sample_rate)},'
        f'"audio_start_ms":{number(event.audio_start_ms)}}}'
    )


class NativeProjection:
    """The native protocol as a connection's codec; it keeps no state of its own."""

    def __init__(self, *, max_size: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_size = max_size

    def parse(self, data: str | bytes) -> ClientEvent:
        return parse_client_event(data, max_size=self.max_size)

    def frames(self, event: ServerEvent, seq: int | None) -> list[str]:
        if isinstance(event, AudioDelta):
            return [audio_delta_text(event, seq)]
        return [dumps(encode_server_event(event, seq))]

    @property
    def initial_options(self) -> SessionOptions | None:
        """Sessions opened by a first event other than ``session.create`` use the defaults."""
        return None

    def left(self, code: int | None) -> ClientEvent | None:
        """Nothing: a native client may resume, so its session keeps its grace after any
        close (a client that means to end it sends ``session.close``)."""
        return None

    @property
    def paused(self) -> bool:
        """Never: a native append names its own format, so no frame waits on the session."""
        return False
