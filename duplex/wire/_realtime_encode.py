"""Session server events -> OpenAI Realtime server events (GA or beta names).

The outbound half of the Realtime projection (`RealtimeProjection` composes
it with the parser). One session event may stand for several wire events: a
`ResponseCreated` is ``response.created`` + ``response.output_item.added`` +
``conversation.item.added`` (GA; beta ``conversation.item.created``) +
``response.content_part.added``, and a `ResponseDone` closes them all in
reverse; a tool call is a ``function_call`` output item after it, opened by its first
`FunctionCallDelta` (each one an ``arguments.delta``) and closed by its
`FunctionCallDone`. A text-only response (its `ResponseSettings`) has a text part and
``response.output_text.delta|done`` instead of audio; an out-of-band one announces no
conversation item. The only state is the output resampler (24 kHz model audio to 8 kHz
G.711), reset at each response; ids, epochs and transcripts come from the events.

``rate_limits.updated`` follows every ``response.done`` with an empty list: this
server meters no requests or tokens (capacity is admission: a session is
admitted or refused when it connects, and input is bounded by
``input_backpressure``), so there is no limit to report; an empty list says so
rather than inventing numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal, final

import numpy as np

from duplex.codecs import alaw_encode, ulaw_encode
from duplex.pcm import float_to_pcm16, pcm16_to_float
from duplex.sessions import (
    AudioDelta,
    ErrorEvent,
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
    ResponseCreated,
    ResponseDone,
    ResponseSettings,
    ServerEvent,
    SessionConfig,
    SessionCreated,
    SessionUpdated,
    StreamingResampler,
    TextDelta,
    TranscriptDelta,
)

from ._json_text import b64, number, string
from ._native import encode_server_event
from ._realtime_session import FORMAT_SAMPLE_RATES, GA_FORMATS, WireFormats

__all__ = ["DUPLEX_SERVER_EVENTS", "RealtimeEncoder"]

Schema = Literal["ga", "beta"]

DUPLEX_SERVER_EVENTS: tuple[str, ...] = (
    "response.listen",
    "overlap.decision",
    "playback.acknowledged",
    "session.resumed",
    "session.replaced",
    "session.resync_required",
    "session.ready",
    "session.expired",
    "session.closed",
    "input_video.consumed",
)
_CANCEL_REASONS = {  # session reason -> RealtimeResponseStatus.reason
    "barge_in": "turn_detected",
    "turn_detected": "turn_detected",
    "client_cancelled": "client_cancelled",
    "input_cleared": "client_cancelled",
    "session_closed": "client_cancelled",
}


def _ms(value: float) -> int:
    return round(value)


def _tokens(limit: int | None) -> int | str:
    return "inf" if limit is None else limit


def _beta_modalities(modality: str) -> list[str]:
    """Beta spells audio responses ``["audio", "text"]`` (the transcript is text)."""
    return ["audio", "text"] if modality == "audio" else ["text"]


def _transcription(config: SessionConfig) -> dict[str, Any] | None:
    """The input transcription setting as sent (``None``: off)."""
    setting = config.input_transcription
    if setting is None or not setting.enabled:
        return None
    echo: dict[str, Any] = {"model": setting.model}
    if setting.language is not None:
        echo["language"] = setting.language
    if setting.prompt is not None:
        echo["prompt"] = setting.prompt
    return echo


def _turn_detection(config: SessionConfig, *, ga: bool) -> dict[str, Any] | None:
    """The session's turn detection as Realtime's ``turn_detection`` (``None``: off)."""
    if not config.vad_enabled:
        return None
    echo: dict[str, Any] = {
        "type": "server_vad",
        "threshold": float(config.vad_threshold),
        "prefix_padding_ms": config.vad_prefix_padding_ms,
        "silence_duration_ms": config.vad_hangover_ms,
        "create_response": config.vad_create_response,
        "interrupt_response": config.vad_interrupt_response,
    }
    if ga:  # beta's TurnDetection has no idle timeout
        echo["idle_timeout_ms"] = config.vad_idle_timeout_ms or None
    return echo


@final
class RealtimeEncoder:
    """Projects server events onto Realtime events for one connection.

    Args:
        schema: ``"ga"`` or ``"beta"`` event names and session shapes.
        duplex: emit the duplex extensions (native shapes) and their extra fields.
        model: echoed as ``session.model`` (GA only: beta's field is a closed list).
        random_bytes: randomness for the ``event_<hex>`` ids.
    """

    def __init__(
        self,
        *,
        schema: Schema = "ga",
        duplex: bool = False,
        model: str | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.schema: Schema = schema
        self.duplex = duplex
        self.model = model
        self._random_bytes = random_bytes
        self._formats = WireFormats()
        self._resampler: StreamingResampler | None = None

    def encode(
        self, event: ServerEvent, seq: int | None, formats: WireFormats
    ) -> list[dict[str, Any]]:
        """The Realtime server events that ``event`` stands for, JSON-ready, in order.

        Args:
            event: a server event from ``duplex.sessions``.
            seq: its ``server_event_seq`` (``None``: connection-scoped). With
                ``duplex=True`` it is stamped on the *last* wire event of the
                group, so a client cursor at ``seq`` means the whole group arrived;
                the others carry ``null``.
            formats: the audio formats to encode in (the session's, as the projection
                last saw them; a `session.*` echo shows its own config's).

        Returns:
            Zero or more dicts with ``type`` and ``event_id``. Session events with
            no Realtime counterpart become their native form with ``duplex=True``
            and nothing otherwise.
        """
        self._formats = formats
        events = self._project(event)
        if self.duplex:  # every event has the key; null but on the group's last
            for wire in events:
                wire["server_event_seq"] = None
            if events:
                events[-1]["server_event_seq"] = seq
        return events

    def _new(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": f"event_{self._random_bytes(12).hex()}", **fields}

    def _name(self, ga: str, beta: str) -> str:
        return ga if self.schema == "ga" else beta

    def _project(self, event: ServerEvent) -> list[dict[str, Any]]:
        match event:
            case SessionCreated():
                return self._session_created(event)
            case SessionUpdated():
                session = self._session(event.session_id, event.config)
                return [self._new("session.updated", session=session)]
            case InputAudioCommitted():
                return self._committed(event)
            case InputAudioCleared():
                extra = {"epoch": event.epoch} if self.duplex else {}
                return [self._new("input_audio_buffer.cleared", **extra)]
            case InputSpeechStarted():
                started = _ms(event.audio_start_ms)
                kind = "input_audio_buffer.speech_started"
                return [self._new(kind, audio_start_ms=started, item_id=event.item_id)]
            case InputSpeechStopped():
                stopped = _ms(event.audio_end_ms)
                kind = "input_audio_buffer.speech_stopped"
                return [self._new(kind, audio_end_ms=stopped, item_id=event.item_id)]
            case InputAudioTimeout():
                if self.schema == "beta":  # beta has no such event; the commit follows
                    return []
                return [
                    self._new(
                        "input_audio_buffer.timeout_triggered",
                        audio_start_ms=_ms(event.audio_start_ms),
                        audio_end_ms=_ms(event.audio_end_ms),
                        item_id=event.item_id,
                    )
                ]
            case InputTranscriptionDelta():
                kind = "conversation.item.input_audio_transcription.delta"
                return [self._new(kind, item_id=event.item_id, content_index=0, delta=event.delta)]
            case InputTranscriptionCompleted():
                kind = "conversation.item.input_audio_transcription.completed"
                usage = {"type": "duration", "seconds": round(event.audio_seconds, 3)}
                return [
                    self._new(
                        kind,
                        item_id=event.item_id,
                        content_index=0,
                        transcript=event.transcript,
                        usage=usage,
                    )
                ]
            case InputTranscriptionFailed():
                kind = "conversation.item.input_audio_transcription.failed"
                error = {"type": "transcription_error", "code": event.code,
                         "message": event.message, "param": None}  # fmt: skip
                return [self._new(kind, item_id=event.item_id, content_index=0, error=error)]
            case ItemAdded():
                item = self._history_item(event.item)
                previous = event.previous_item_id
                return [
                    *self._item_events(item, done=False, previous=previous),
                    *self._item_events(item, done=True, previous=previous),
                ]
            case ItemRetrieved():
                item = self._history_item(event.item)
                return [self._new("conversation.item.retrieved", item=item)]
            case ItemDeleted():
                return [self._new("conversation.item.deleted", item_id=event.item_id)]
            case ItemTruncated():
                return [
                    self._new(
                        "conversation.item.truncated",
                        item_id=event.item_id,
                        content_index=event.content_index,
                        audio_end_ms=event.audio_end_ms,
                    )
                ]
            case ResponseCreated():
                return self._response_created(event)
            case AudioDelta():
                return self._audio_delta(event)
            case TranscriptDelta():
                kind = self._name(
                    "response.output_audio_transcript.delta", "response.audio_transcript.delta"
                )
                extra = {"epoch": event.epoch, "audio_start_ms": event.audio_start_ms}
                body = self._part_ids(event.response_id, event.item_id)
                return [
                    self._new(kind, **body, delta=event.delta, **(extra if self.duplex else {}))
                ]
            case TextDelta():
                kind = self._name("response.output_text.delta", "response.text.delta")
                body = self._part_ids(event.response_id, event.item_id)
                return [self._new(kind, **body, delta=event.delta)]
            case ResponseDone():
                return self._response_done(event)
            case FunctionCallDelta():
                return self._function_call_delta(event)
            case FunctionCallDone():
                return self._function_call_done(event)
            case ErrorEvent():
                error = {
                    "type": event.type,
                    "code": event.code,
                    "message": event.message,
                    "param": event.param,
                    "event_id": event.event_id,
                }
                return [self._new("error", error=error)]
        if not self.duplex:
            return []
        native = encode_server_event(event, None, random_bytes=self._random_bytes)
        native.pop("server_event_seq")
        return [native]

    # --------------------------------------------------------------- session echo

    def _session(self, session_id: str, config: SessionConfig) -> dict[str, Any]:
        fin, fout = config.input_audio_codec, config.output_audio_codec
        if self.schema == "ga":
            session: dict[str, Any] = {"type": "realtime", "object": "realtime.session"}
            session["id"] = session_id
            if self.model is not None:
                session["model"] = self.model
            session["instructions"] = config.instructions
            session["output_modalities"] = [config.output_modalities.value]
            input_format = dict(GA_FORMATS[fin])
            if fin == "pcm16":  # 16 kHz input is this server's extension of audio/pcm
                input_format["rate"] = config.input_sample_rate
            session["audio"] = {
                "input": {
                    "format": input_format,
                    "transcription": _transcription(config),
                    "noise_reduction": None,
                    "turn_detection": _turn_detection(config, ga=True),
                },
                "output": {"format": GA_FORMATS[fout], "speed": 1.0, "voice": config.voice},
            }
            session["max_output_tokens"] = _tokens(config.max_output_tokens)
        else:
            session = {"id": session_id, "object": "realtime.session"}
            session["instructions"] = config.instructions
            session["modalities"] = _beta_modalities(config.output_modalities.value)
            session["voice"] = config.voice
            session["input_audio_format"] = fin
            session["output_audio_format"] = fout
            session["input_audio_transcription"] = _transcription(config)
            session["input_audio_noise_reduction"] = None
            session["turn_detection"] = _turn_detection(config, ga=False)
            session["speed"] = 1.0
            session["temperature"] = config.temperature
            session["max_response_output_tokens"] = _tokens(config.max_output_tokens)
        session["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            }
            for tool in config.tools
        ]
        session["tool_choice"] = config.tool_choice
        if self.duplex:
            session.update(
                overlap_policy=config.overlap_policy.value,  # the wire name, a plain str
                overlap_short_ack_ms=config.short_ack_ms,
                overlap_barge_in_ms=config.barge_in_ms,
                false_interruption_enabled=config.false_interruption_enabled,
                false_interruption_timeout_s=config.false_interruption_timeout_s,
                playback_commit_policy=config.playback_commit_policy.value,
                idle_timeout_s=config.idle_ttl_s,
                disconnect_grace_s=config.disconnect_grace_s,
            )
        return session

    def _session_created(self, event: SessionCreated) -> list[dict[str, Any]]:
        session = self._session(event.session_id, event.config)
        extra: dict[str, Any] = {}
        if self.duplex:
            session["epoch"] = event.epoch
            session["capabilities"] = event.capabilities.as_dict()
            extra = {
                "resume_token": event.resume_token,
                "attachment_generation": event.attachment_generation,
            }
        conversation = {"id": f"conv_{event.session_id}", "object": "realtime.conversation"}
        return [
            self._new("session.created", session=session, **extra),
            self._new("conversation.created", conversation=conversation),
        ]

    # ------------------------------------------------------------------- items

    def _item_events(
        self, item: dict[str, Any], *, done: bool, previous: str | bool | None = False
    ) -> list[dict[str, Any]]:
        """GA announces an item twice (added, done); beta once (created, when added).

        ``previous``: the ``previous_item_id`` to send (``False``: none sent).
        """
        extra = {} if previous is False else {"previous_item_id": previous}
        if self.schema == "beta":
            return [] if done else [self._new("conversation.item.created", item=item, **extra)]
        kind = "conversation.item.done" if done else "conversation.item.added"
        return [self._new(kind, item=item, **extra)]

    def _history_item(self, item: HistoryItem) -> dict[str, Any]:
        """A history item as a Realtime ``message`` item (one content part), or a tool item."""
        tool = {"id": item.item_id, "object": "realtime.item", "type": item.content}
        if item.content == "function_call":
            return {
                **tool, "status": item.status, "call_id": item.call_id,
                "name": item.name, "arguments": item.text,
            }  # fmt: skip
        if item.content == "function_call_output":
            return {**tool, "status": item.status, "call_id": item.call_id, "output": item.text}
        part: dict[str, Any]
        if item.role == "assistant":
            if item.content == "audio":
                kind = self._name("output_audio", "audio")
                part = {"type": kind, "transcript": item.text}
            else:
                part = {"type": self._name("output_text", "text"), "text": item.text}
        elif item.content == "audio":
            part = {"type": "input_audio", "transcript": item.text or None}
        else:
            part = {"type": "input_text", "text": item.text}
        return {
            "id": item.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": item.role,
            "status": item.status,
            "content": [part],
        }

    def _committed(self, event: InputAudioCommitted) -> list[dict[str, Any]]:
        extra = {"turn_id": event.turn_id, "audio_end_ms": event.audio_end_ms}
        committed = self._new(
            "input_audio_buffer.committed",
            item_id=event.item_id,
            previous_item_id=event.previous_item_id,
            **(extra if self.duplex else {}),
        )
        item = {
            "id": event.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        return [
            committed,
            *self._item_events(item, done=False),
            *self._item_events(item, done=True),
        ]

    def _assistant(
        self, item_id: str, status: str, transcript: str | None, *, text_only: bool = False
    ) -> dict[str, Any]:
        content = []
        if transcript is not None and text_only:
            content.append({"type": self._name("output_text", "text"), "text": transcript})
        elif transcript is not None:
            content.append({"type": self._name("output_audio", "audio"), "transcript": transcript})
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def _response(
        self, response_id: str, status: str, settings: ResponseSettings, **fields: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"id": response_id, "object": "realtime.response", "status": status}
        if self.schema == "ga":
            body["output_modalities"] = [settings.output_modalities.value]
            output = {"format": GA_FORMATS[self._formats.output], "voice": settings.voice}
            body["audio"] = {"output": output}
        else:
            body["modalities"] = _beta_modalities(settings.output_modalities.value)
            body["output_audio_format"] = self._formats.output
            body["voice"] = settings.voice
            body["temperature"] = settings.temperature
        body["max_output_tokens"] = _tokens(settings.max_output_tokens)
        if not settings.in_conversation:
            body["conversation_id"] = None  # out of band
        return {**body, **fields}

    def _metadata(self, settings: ResponseSettings, extra: dict[str, str]) -> dict[str, str] | None:
        """The client's metadata, plus the duplex fields when the extensions are on."""
        merged = {**dict(settings.metadata or ()), **(extra if self.duplex else {})}
        return merged if merged or settings.metadata is not None else None

    def _part_ids(self, response_id: str, item_id: str) -> dict[str, Any]:
        return {
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
        }

    # --------------------------------------------------------------- responses

    def _response_created(self, event: ResponseCreated) -> list[dict[str, Any]]:
        self._resampler = None  # a new response starts with fresh filter state
        settings = event.settings
        item = self._assistant(event.item_id, "in_progress", None)
        metadata = self._metadata(settings, {"epoch": str(event.epoch)})
        response = self._response(
            event.response_id,
            "in_progress",
            settings,
            output=[],
            status_details=None,
            metadata=metadata,
        )
        part = (
            {"type": "text", "text": ""}
            if settings.text_only
            else {"type": "audio", "transcript": ""}
        )
        return [
            self._new("response.created", response=response),
            self._new(
                "response.output_item.added",
                response_id=event.response_id,
                output_index=0,
                item=item,
            ),
            *(self._item_events(item, done=False) if settings.in_conversation else []),
            self._new(
                "response.content_part.added",
                **self._part_ids(event.response_id, event.item_id),
                part=part,
            ),
        ]

    def _function_call_delta(self, event: FunctionCallDelta) -> list[dict[str, Any]]:
        """A tool call grows: its item opens with its first delta, then each delta is one
        ``arguments.delta``."""
        rid, index, call = event.response_id, event.output_index, event.item
        opened: list[dict[str, Any]] = []
        if event.opens:
            open_item = {**self._history_item(call), "status": "in_progress", "arguments": ""}
            opened = [
                self._new(
                    "response.output_item.added",
                    response_id=rid,
                    output_index=index,
                    item=open_item,
                ),
                *(self._item_events(open_item, done=False) if event.in_conversation else []),
            ]
        if not event.delta:
            return opened
        ids = self._call_ids(rid, index, call)
        return [*opened, self._new("response.function_call_arguments.delta", **ids,
                                    delta=event.delta)]  # fmt: skip

    def _function_call_done(self, event: FunctionCallDone) -> list[dict[str, Any]]:
        """A tool call is over: ``arguments.done`` (GA's also names the function; beta's has
        no such field), then its item closes. One cut off before its end is ``incomplete``
        and leaves the conversation (``conversation.item.deleted``)."""
        rid, index, call = event.response_id, event.output_index, event.item
        done_item = self._history_item(call)
        if not event.complete:
            done_item = {**done_item, "status": "incomplete"}
        ids = self._call_ids(rid, index, call)
        name = {"name": call.name} if self.schema == "ga" else {}
        closed: list[dict[str, Any]] = []
        if event.in_conversation:
            closed = (
                self._item_events(done_item, done=True)
                if event.complete
                else [self._new("conversation.item.deleted", item_id=call.item_id)]
            )
        return [
            self._new("response.function_call_arguments.done", **ids, arguments=call.text, **name),
            *closed,
            self._new(
                "response.output_item.done", response_id=rid, output_index=index, item=done_item
            ),
        ]

    @staticmethod
    def _call_ids(response_id: str, output_index: int, call: HistoryItem) -> dict[str, Any]:
        return {
            "response_id": response_id,
            "item_id": call.item_id,
            "output_index": output_index,
            "call_id": call.call_id,
        }

    def _audio_payload(self, event: AudioDelta) -> bytes:
        """The delta's audio in the output format (resampled for G.711; may be empty)."""
        fmt = self._formats.output
        rate = FORMAT_SAMPLE_RATES[fmt]
        if fmt == "pcm16" and event.sample_rate == rate:
            return event.pcm  # the model's PCM16 passes through untouched
        resampler = self._resampler
        if resampler is None or (resampler.in_rate, resampler.out_rate) != (
            event.sample_rate,
            rate,
        ):
            self._resampler = StreamingResampler(event.sample_rate, rate)
        pcm = self._resampler.process(pcm16_to_float(np.frombuffer(event.pcm, dtype="<i2")))
        pcm16 = float_to_pcm16(pcm)
        if fmt == "pcm16":
            return pcm16.astype("<i2").tobytes()
        return ulaw_encode(pcm16) if fmt == "g711_ulaw" else alaw_encode(pcm16)

    def _audio_delta(self, event: AudioDelta) -> list[dict[str, Any]]:
        payload = self._audio_payload(event)
        if not payload:
            return []
        fmt = self._formats.output
        kind = self._name("response.output_audio.delta", "response.audio.delta")
        extra: dict[str, Any] = {}
        if self.duplex:
            extra = {
                "epoch": event.epoch,
                "audio_start_ms": event.audio_start_ms,
                "format": fmt,
                "sample_rate_hz": FORMAT_SAMPLE_RATES[fmt],
            }
        ids = self._part_ids(event.response_id, event.item_id)
        return [self._new(kind, **ids, delta=b64(payload), **extra)]

    def audio_delta_text(
        self, event: AudioDelta, seq: int | None, formats: WireFormats
    ) -> list[str]:
        """`encode` of an audio delta, as JSON text, from a template.

        The event sent for every frame: the same text as ``_json_text.dumps`` of
        each dict `encode` returns, without building them.
        """
        self._formats = formats
        payload = self._audio_payload(event)
        if not payload:
            return []
        kind = self._name("response.output_audio.delta", "response.audio.delta")
        extra = ""
        if self.duplex:
            fmt = formats.output
            extra = (
                f',"epoch":{number(event.epoch)},'
                f'"audio_start_ms":{number(event.audio_start_ms)},"format":{string(fmt)},'
                f'"sample_rate_hz":{number(FORMAT_SAMPLE_RATES[fmt])},'
                f'"server_event_seq":{number(seq)}'
            )
        return [
            f'{{"type":"{kind}","event_id":"event_{self._random_bytes(12).hex()}",'
            f'"response_id":{string(event.response_id)},"item_id":{string(event.item_id)},'
            f'"output_index":0,"content_index":0,"delta":"{b64(payload)}"{extra}}}'
        ]

    def _response_done(self, event: ResponseDone) -> list[dict[str, Any]]:
        rid, iid, settings = event.response_id, event.item_id, event.settings
        item_status = "completed" if event.status == "completed" else "incomplete"
        item = self._assistant(iid, item_status, event.transcript, text_only=settings.text_only)
        details: dict[str, Any] = {"type": event.status}
        if event.status == "cancelled" and event.reason in _CANCEL_REASONS:
            details["reason"] = _CANCEL_REASONS[event.reason]
        if event.status == "incomplete" and event.reason == "max_output_tokens":
            details["reason"] = "max_output_tokens"
        if event.status == "failed":
            details["error"] = {"type": "server_error", "code": event.reason}
        metadata = self._metadata(
            settings,
            {"epoch": str(event.epoch), "reason": event.reason, "audio_ms": str(event.audio_ms)},
        )
        calls = [self._history_item(call) for call in event.calls]
        response = self._response(
            rid,
            event.status,
            settings,
            output=[item, *calls],
            status_details=details,
            metadata=metadata,
        )
        ids = self._part_ids(rid, iid)
        if settings.text_only:
            part = {"type": "text", "text": event.transcript}
            text_done = self._name("response.output_text.done", "response.text.done")
            closing = [self._new(text_done, **ids, text=event.transcript)]
        else:
            part = {"type": "audio", "transcript": event.transcript}
            audio_done = self._name("response.output_audio.done", "response.audio.done")
            transcript_done = self._name(
                "response.output_audio_transcript.done", "response.audio_transcript.done"
            )
            closing = [
                self._new(audio_done, **ids),
                self._new(transcript_done, **ids, transcript=event.transcript),
            ]
        return [
            *closing,
            self._new("response.content_part.done", **ids, part=part),
            self._new("response.output_item.done", response_id=rid, output_index=0, item=item),
            *(self._item_events(item, done=True) if settings.in_conversation else []),
            self._new("response.done", response=response),
            self._new("rate_limits.updated", rate_limits=[]),
        ]
