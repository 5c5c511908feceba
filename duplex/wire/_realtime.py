"""The OpenAI Realtime projection (``/v1/realtime``), sans-I/O.

A projection, not a second session: `RealtimeProjection.parse` turns one
Realtime client frame into the same typed client events the native codec
yields, and `RealtimeProjection.encode` turns one session server event into
the Realtime server events it stands for (``_realtime_encode``).

The projection holds only wire-level choices of one connection: the schema
(GA names and nested ``session.audio``, or beta names and flat fields), whether
the duplex extensions are on, and the output resampler's filter state. Ids,
epochs, transcripts, history and the audio formats come from the server events:
the G.711/PCM formats a ``session.update`` negotiates are session config
(``input_audio_codec``, ``output_audio_codec``), and the projection adopts them
from ``session.created|updated|resumed``, so a resumed socket keeps them.
The projection never works out a config itself. A ``session.update`` that names
another input format *pauses* it (`paused`, h11's ``PAUSED``): the socket reads no
further frame until the session answers, with ``session.updated`` or an error
refusing the update (``ErrorEvent.update_refused``), so the appends sent right
after it decode in whatever format the session then says it has. An error's
``param`` names the field as a Realtime client spells it (``wire_param``), also
when the session refused the value.

Inbound, a frame is read up to ``type`` and ``event_id`` by ``_envelope``, as on
the native route, and both spellings of the session fields are accepted
(``_realtime_session``). A Realtime feature the session does not have yet is
refused with a typed error naming it (``unsupported_event``,
``unsupported_parameter``, ``unsupported_turn_detection``), never accepted and
ignored. Without ``?duplex=1`` the session is turn-based (`initial_options`):
a commit or a VAD stop (``create_response``) or ``response.create`` produces
one response, spoken by the session's turn responder.

The duplex extensions (``playback.ack``, ``turn.signal``,
``session.resume``, ``session.event_ack``, ``session.close``,
``input_video.append`` in; ``response.listen``, ``overlap.decision``,
``playback.acknowledged``, ``session.resumed|replaced|resync_required|expired|closed``,
``input_video.consumed`` out) exist only with
``duplex=True`` and use the native codec's shapes, so both routes agree.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final, final

import numpy as np
import numpy.typing as npt

from duplex.codecs import alaw_to_float, ulaw_to_float
from duplex.exceptions import (
    BadAudio,
    BadEvent,
    ProtocolError,
    UnknownEvent,
    UnsupportedEvent,
    UnsupportedParameter,
    refuse_all,
)
from duplex.pcm import pcm16_to_float
from duplex.sessions import (
    COUNT,
    DURATION_MS,
    AudioAppend,
    AudioClear,
    AudioCommit,
    AudioDelta,
    ClientEvent,
    ErrorEvent,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    ResponseCancel,
    ResponseCreate,
    ResponseOptions,
    ServerEvent,
    SessionClose,
    SessionConfig,
    SessionCreated,
    SessionOptions,
    SessionResumed,
    SessionUpdate,
    SessionUpdated,
)

from ._envelope import DEFAULT_MAX_EVENT_BYTES, Envelope, read_envelope
from ._json_text import b64_decode, dumps
from ._native import client_event
from ._realtime_encode import DUPLEX_SERVER_EVENTS, RealtimeEncoder, Schema
from ._realtime_session import (
    AUDIO_FORMATS,
    FORMAT_SAMPLE_RATES,
    SERVER_VAD_DEFAULTS,
    WireFormats,
    audio_format,
    collect,
    modality,
    parse_session,
    parse_tools,
    tool_choice,
    turn_detection_options,
    wire_param,
)

__all__ = [
    "AUDIO_FORMATS",
    "DUPLEX_CLIENT_EVENTS",
    "DUPLEX_SERVER_EVENTS",
    "FORMAT_SAMPLE_RATES",
    "REALTIME_CLIENT_EVENTS",
    "TURN_BASED_OPTIONS",
    "UNSUPPORTED_CLIENT_EVENTS",
    "RealtimeProjection",
    "Schema",
    "WireFormats",
    "duplex_flag",
    "parse_realtime_event",
    "schema_from_headers",
]

REALTIME_CLIENT_EVENTS: tuple[str, ...] = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "output_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.truncate",
    "conversation.item.delete",
    "response.create",
    "response.cancel",
)
DUPLEX_CLIENT_EVENTS: tuple[str, ...] = (
    "playback.ack",
    "turn.signal",
    "session.resume",
    "session.event_ack",
    "session.close",
    "input_video.append",
)
UNSUPPORTED_CLIENT_EVENTS: dict[str, str] = {
    "transcription_session.update": "transcription-only sessions are not supported",
}
_TOP_LEVEL = frozenset({"type", "event_id"})
_FIELDS: dict[str, frozenset[str]] = {
    "session.update": frozenset({"session"}),
    "input_audio_buffer.append": frozenset({"audio"}),
    "response.create": frozenset({"response"}),
    "response.cancel": frozenset({"response_id"}),
    "conversation.item.create": frozenset({"item", "previous_item_id"}),
    "conversation.item.retrieve": frozenset({"item_id"}),
    "conversation.item.delete": frozenset({"item_id"}),
    "conversation.item.truncate": frozenset({"item_id", "content_index", "audio_end_ms"}),
}
_ITEM_KEYS = frozenset({"id", "type", "object", "status", "role", "content"})
_TOOL_ITEM_KEYS = {  # tool item type -> its fields (GA and beta agree)
    "function_call": frozenset({"id", "type", "object", "status", "call_id", "name", "arguments"}),
    "function_call_output": frozenset({"id", "type", "object", "status", "call_id", "output"}),
}
_PART_KEYS = {  # content type -> the fields it is read from (nothing else is accepted)
    "input_text": frozenset({"type", "text"}),
    "output_text": frozenset({"type", "text"}),
    "text": frozenset({"type", "text"}),
    "input_audio": frozenset({"type", "audio"}),
}
_CONTENT_TYPES = {  # role -> content types it may hold (GA and beta spellings)
    "user": ("input_text", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "text"),
}
TURN_BASED_OPTIONS = SessionOptions(
    turn_policy="turn_based",
    **turn_detection_options(SERVER_VAD_DEFAULTS | {"type": "server_vad"}, "", duplex=False),
)
"""How a Realtime session without ``?duplex=1`` starts: OpenAI's turn-based API with
its default ``server_vad`` (threshold 0.5, 300 ms padding, 500 ms silence, respond and
interrupt)."""
AGENT_SILENCE_MS = 400
"""The voice agent's end-of-turn silence (``silence_duration_ms``) when a session opens:
shorter than OpenAI's 500, so the first audio comes sooner; a ``turn_detection`` in a
``session.update`` sets it as OpenAI's API does (500 when left out)."""
AGENT_PREPARE_MS = 200
"""A pause this long has the voice agent prepare its reply (``vad_prepare_ms``), which
plays as soon as the silence reaches `AGENT_SILENCE_MS` and the turn is committed."""


def schema_from_headers(openai_beta: str | None) -> Schema:
    """``beta`` when the ``OpenAI-Beta`` header lists ``realtime=v1`` (the beta SDK sends it)."""
    if openai_beta is None:
        return "ga"
    parts = {part.strip().lower() for part in openai_beta.split(",")}
    return "beta" if "realtime=v1" in parts else "ga"


def duplex_flag(value: str | None) -> bool:
    """Read ``?duplex=``: ``1|true|on`` turn the extensions on, ``0|false|off`` or absent keep
    them off (vllm-omni's spelling).

    Raises:
        BadEvent: any other value (``param`` is ``duplex``), so a typo is not silently turn-based.
    """
    if value is None:
        return False
    word = value.strip().lower()
    if word in ("1", "true", "on"):
        return True
    if word in ("0", "false", "off", ""):
        return False
    raise BadEvent(
        f"duplex must be one of 1, true, on, 0, false, off; got {value!r}", param="duplex"
    )


# ----------------------------------------------------------------------- parsing


def _check_keys(obj: Mapping[str, Any], allowed: frozenset[str], prefix: str = "") -> None:
    """OpenAI refuses unknown parameters; so do we (nothing is silently dropped)."""
    for key in obj:
        if key not in allowed:
            raise BadEvent(f"unknown parameter '{prefix}{key}'", param=f"{prefix}{key}")


def _decode_audio(
    holder: dict[str, Any], formats: WireFormats, param: str
) -> tuple[npt.NDArray[np.float32], int]:
    """Base64 audio in the connection's input format, as float PCM and its rate.

    The text is popped from ``holder`` (its JSON object), so it is freed once decoded,
    before the samples are made (docs/protocol/realtime.md gives the memory this saves).
    """
    if not isinstance(holder.get("audio"), str):
        raise BadEvent(f"{param} must be a base64 string", param=param)
    raw = b64_decode(holder.pop("audio"), param, BadAudio)
    fmt = formats.input
    if fmt == "pcm16":
        if len(raw) % 2:
            raise BadAudio(f"{param}: pcm16 audio must be a whole number of samples", param=param)
        pcm = pcm16_to_float(np.frombuffer(raw, dtype="<i2"))
    else:
        pcm = ulaw_to_float(raw) if fmt == "g711_ulaw" else alaw_to_float(raw)
    pcm.flags.writeable = False  # the session keeps it without copying
    return pcm, formats.input_rate


def _decode_append(obj: dict[str, Any], formats: WireFormats, event_id: str | None) -> AudioAppend:
    pcm, rate = _decode_audio(obj, formats, "audio")
    return AudioAppend(pcm, rate, event_id)


def _string(obj: Mapping[str, Any], key: str, *, required: bool = True, prefix: str = "") -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise BadEvent(f"{prefix}{key} must be a non-empty string", param=f"{prefix}{key}")
    return value


def _tool_item(
    item: Mapping[str, Any], kind: str, previous: str | None, event_id: str | None
) -> ItemCreate:
    """A ``function_call`` (the model's call, replayed by the app) or a
    ``function_call_output`` (the app's result, which a following response continues from)."""
    _check_keys(item, _TOOL_ITEM_KEYS[kind], "item.")
    call_id = _string(item, "call_id", prefix="item.")
    item_id = _string(item, "id", required=False, prefix="item.")
    if kind == "function_call":
        arguments = item.get("arguments", "")
        if not isinstance(arguments, str):
            raise BadEvent("item.arguments must be a string", param="item.arguments")
        name = _string(item, "name", prefix="item.")
        return ItemCreate(
            "assistant", arguments, None, None, item_id, previous, event_id, kind, call_id, name
        )
    output = item.get("output")
    if not isinstance(output, str):
        raise BadEvent("item.output must be a string", param="item.output")
    return ItemCreate("tool", output, None, None, item_id, previous, event_id, kind, call_id)


def _item_create(obj: Mapping[str, Any], formats: WireFormats, event_id: str | None) -> ItemCreate:
    """A ``message`` item with one content part (user text/audio, system or assistant
    text), or a tool item (``function_call``, ``function_call_output``)."""
    item = obj.get("item")
    if not isinstance(item, dict):
        raise BadEvent("item must be an object", param="item")
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise BadEvent("item.type must be a string", param="item.type")
    if kind in _TOOL_ITEM_KEYS:
        return _tool_item(item, kind, _string(obj, "previous_item_id", required=False), event_id)
    if kind != "message":
        raise UnsupportedParameter(
            f"item.type={kind!r}: message, function_call and function_call_output items "
            "are supported",
            param="item.type",
        )
    _check_keys(item, _ITEM_KEYS, "item.")
    role = item.get("role")
    if not isinstance(role, str) or role not in _CONTENT_TYPES:
        raise BadEvent(f"item.role must be one of {tuple(_CONTENT_TYPES)}", param="item.role")
    content = item.get("content")
    if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
        raise BadEvent("item.content must be a list of objects", param="item.content")
    if len(content) != 1:
        raise UnsupportedParameter(
            "an item holds exactly one content part here", param="item.content"
        )
    part = content[0]
    kind = part.get("type")
    if not isinstance(kind, str) or kind not in _CONTENT_TYPES[role]:
        raise UnsupportedParameter(
            f"item.content.0.type={kind!r}: {role} items hold {_CONTENT_TYPES[role]}",
            param="item.content.0.type",
        )
    if kind == "input_audio" and part.get("transcript") is not None:
        raise UnsupportedParameter(
            "item.content.0.transcript: a transcript of user audio is not supported",
            param="item.content.0.transcript",
        )
    allowed = _PART_KEYS[kind] | ({"transcript"} if kind == "input_audio" else set())
    _check_keys(part, frozenset(allowed), "item.content.0.")
    item_id = _string(item, "id", required=False)
    previous = _string(obj, "previous_item_id", required=False)
    if kind == "input_audio":
        pcm, rate = _decode_audio(part, formats, "item.content.0.audio")
        return ItemCreate(role, None, pcm, rate, item_id, previous, event_id)
    text = part.get("text")
    if not isinstance(text, str):
        raise BadEvent("item.content.0.text must be a string", param="item.content.0.text")
    return ItemCreate(role, text, None, None, item_id, previous, event_id)


def _item_truncate(obj: Mapping[str, Any], event_id: str | None) -> ItemTruncate:
    content_index = COUNT.read(obj.get("content_index"), "content_index")
    audio_end_ms = DURATION_MS.read(obj.get("audio_end_ms"), "audio_end_ms")
    return ItemTruncate(_string(obj, "item_id"), int(content_index), int(audio_end_ms), event_id)


_RESPONSE_FIELDS: dict[str, tuple[str, Callable[[object, str], object] | None]] = {
    # response.create field (either schema) -> (ResponseOptions field, reader)
    "conversation": ("conversation", None),
    "instructions": ("instructions", None),
    "voice": ("voice", None),
    "temperature": ("temperature", None),
    "max_output_tokens": ("max_output_tokens", None),
    "max_response_output_tokens": ("max_output_tokens", None),
    "output_modalities": ("output_modalities", modality),
    "modalities": ("output_modalities", modality),
    "tools": ("tools", parse_tools),
    "tool_choice": ("tool_choice", tool_choice),
}


def _metadata(value: object, param: str) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadEvent(f"{param} must be an object", param=param)
    return tuple(value.items())


def _input(value: object, param: str) -> tuple[str, ...]:
    """``input``: the items a response answers, as ``item_reference`` s by id."""
    if not isinstance(value, list):
        raise BadEvent(f"{param} must be a list", param=param)
    ids: list[str] = []
    for index, ref in enumerate(value):
        at = f"{param}.{index}"
        if not isinstance(ref, dict) or ref.get("type") != "item_reference":
            raise UnsupportedParameter(
                f"{at}: only item_reference inputs are supported (create items first)",
                param=at,
            )
        _check_keys(ref, frozenset({"type", "id"}), f"{at}.")
        ids.append(_string(ref, "id"))
    return tuple(ids)


def _response_audio(value: object, param: str, fields: dict[str, Any], output: str) -> None:
    """GA ``response.audio.output``: ``voice``, and ``format`` restating the session's."""
    audio = value if isinstance(value, dict) else None
    if audio is None or set(audio) - {"output"} or not isinstance(audio.get("output"), dict):
        raise BadEvent(f"{param} must be an object with an output object", param=param)
    for key, item in audio["output"].items():
        at = f"{param}.output.{key}"
        if key == "voice":
            fields["voice"] = item
        elif key == "format":
            fmt, _rate = audio_format(item, at)
            if fmt != output:
                raise UnsupportedParameter(
                    f"{at}: a response speaks the session's output format", param=at
                )
        else:
            raise BadEvent(f"unknown parameter '{at}'", param=at)


def _response_options(obj: Mapping[str, Any], output: str) -> ResponseOptions | None:
    """``response.create``'s overrides, every bad field named at once."""
    response = obj.get("response")
    if response is None:
        return None
    if not isinstance(response, dict):
        raise BadEvent("response must be an object", param="response")
    problems: list[ProtocolError] = []
    fields: dict[str, Any] = {}
    for key, value in response.items():
        param = f"response.{key}"
        if key in _RESPONSE_FIELDS:
            name, reader = _RESPONSE_FIELDS[key]
            read = value if reader is None else collect(problems, reader, value, param)
            if reader is None or read is not None:
                fields[name] = read
        elif key == "metadata":
            fields["metadata"] = collect(problems, _metadata, value, param)
        elif key == "input":
            fields["input"] = collect(problems, _input, value, param)
        elif key == "audio":
            collect(problems, _response_audio, value, param, fields, output)
        elif key == "parallel_tool_calls" and isinstance(value, bool):
            continue  # no tool is ever called: either holds
        elif key in ("prompt", "reasoning", "parallel_tool_calls"):
            problems.append(UnsupportedParameter(f"{param} is not supported", param=param))
        else:
            problems.append(BadEvent(f"unknown parameter '{param}'", param=param))
    options = collect(problems, lambda: ResponseOptions(**fields))
    refuse_all(problems)
    return options


CLEAN_CLOSE_CODES: Final = frozenset({1000, 1001})
"""A peer's close codes that say it meant to leave (normal closure, going away)."""


@final
class RealtimeProjection:
    """One connection's Realtime codec: frames in, session events out, and back.

    Args:
        schema: ``"ga"`` (GA event names, nested ``session.audio``) or ``"beta"``.
        duplex: add the duplex extensions and ``session.capabilities`` (``?duplex=1``).
        model: the model named in ``?model=``, echoed in ``session.created``; a
            ``session.update`` may restate it but not change it.
        max_size: the largest accepted frame, in bytes of UTF-8.
        formats: the audio formats until a session event says otherwise (OpenAI's
            default is PCM16); from ``session.created|updated|resumed`` on, the session's.
        random_bytes: randomness for the ``event_<hex>`` ids.
        vad: the VAD behind ``server_vad`` in a turn-based session (``SessionOptions.vad``;
            the server passes ``server.realtime_vad``); ``None``: the server's session default.
        agent: the voice agent answers (``server.agent``): ``?duplex=1`` sessions open
            turn-based too, with the agent's turn timing (`AGENT_SILENCE_MS`,
            `AGENT_PREPARE_MS`).
    """

    def __init__(
        self,
        *,
        schema: Schema = "ga",
        duplex: bool = False,
        model: str | None = None,
        max_size: int = DEFAULT_MAX_EVENT_BYTES,
        formats: WireFormats | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
        vad: str | None = None,
        agent: bool = False,
    ) -> None:
        if schema not in ("ga", "beta"):
            raise ValueError(f"schema must be 'ga' or 'beta', got {schema!r}")
        self.schema: Schema = schema
        self.duplex = duplex
        self.model = model
        self.agent = agent
        self.max_size = max_size
        base = TURN_BASED_OPTIONS
        if agent:
            base = replace(base, vad_hangover_ms=AGENT_SILENCE_MS, vad_prepare_ms=AGENT_PREPARE_MS)
        self._turn_based = base if vad is None else replace(base, vad=vad)
        self._initial = formats or WireFormats()
        self._config: SessionConfig | None = None  # the session's, as of the last event sent
        self._unanswered: deque[bool] = deque()
        """This socket's ``session.update`` s the session has not answered yet, oldest first;
        ``True``: it names another input format, so the projection is paused until its answer."""
        self._pausing = 0
        """How many of `_unanswered` pause (counted, so `paused` costs the same however many
        updates a client sends ahead of their answers)."""
        self._replayed_through = 0  # events up to this seq are a resume's replay
        self._encoder = RealtimeEncoder(
            schema=schema, duplex=duplex, model=model, random_bytes=random_bytes
        )

    @property
    def initial_options(self) -> SessionOptions | None:
        """The options to open this connection's session with (``hub.open``).

        Without the duplex extensions the session is OpenAI's turn-based API
        (`TURN_BASED_OPTIONS`, with the projection's ``vad``); with them, ``None``:
        the server's own defaults, unless the voice agent answers (``agent``): then
        turn-based too.
        """
        return None if self.duplex and not self.agent else self._turn_based

    def left(self, code: int | None) -> ClientEvent | None:
        """What the peer's close with ``code`` stands for. A turn-based Realtime client
        (no ``?duplex=1``) cannot resume: a clean close (1000, 1001) ends its session at
        once (``session.close``) rather than holding it for a resume that cannot come. With
        the duplex extensions, or after an abnormal close, ``None``: the session keeps its
        grace."""
        return SessionClose() if not self.duplex and code in CLEAN_CLOSE_CODES else None

    @property
    def formats(self) -> WireFormats:
        """The formats the session said it has (``session.created|updated|resumed``; the
        constructor's until then): client frames decode in them, server events encode in them."""
        return self._initial if self._config is None else WireFormats.of(self._config)

    @property
    def paused(self) -> bool:
        """A ``session.update`` naming another input format is unanswered: read no frame
        until `frames` has carried the session's answer (the format of the next append
        is the session's to say)."""
        return self._pausing > 0

    def _follow(self, event: ServerEvent, seq: int | None) -> None:
        """Adopt the session's config from the events that carry it, and count its answers
        to this socket's updates (a resume's replay answers the previous socket's)."""
        if seq is not None and seq <= self._replayed_through:
            return  # replayed: older than session.resumed's config
        match event:
            case SessionCreated():
                self._config = event.config
            case SessionResumed():
                self._config = event.config
                self._replayed_through = event.last_server_event_seq
            case SessionUpdated():
                self._config = event.config
                self._answered()
            case ErrorEvent(update_refused=True):
                self._answered()

    def _answered(self) -> None:
        """The session answered the oldest unanswered update (it answers them in order)."""
        if self._unanswered:
            self._pausing -= self._unanswered.popleft()

    # ------------------------------------------------------------------ inbound

    def parse(self, data: str | bytes) -> ClientEvent:
        """Parse one WebSocket message.

        Appends decode in `formats`, the session's. A ``session.update`` naming
        another input format pauses the projection (`paused`) until the session
        answers it, so the appends after it decode in the format the session took.

        Args:
            data: a text frame; ``bytes`` (a binary frame) is refused.

        Returns:
            The typed client event for the session.

        Raises:
            ProtocolError: a subclass per wire code, ``event_id`` set when readable.
            RuntimeError: called while `paused` (the caller waits for the answer).
        """
        if self.paused:
            raise RuntimeError("paused: wait for the session's answer to session.update")
        envelope = read_envelope(data, max_size=self.max_size)
        try:
            return self._parse(envelope)
        except ProtocolError as exc:
            exc.event_id = exc.event_id or envelope.event_id
            exc.event_type = exc.event_type or envelope.type
            raise  # parse_session names fields as the client spelled them

    def _parse(self, envelope: Envelope) -> ClientEvent:
        kind, event_id, obj = envelope.type, envelope.event_id, envelope.body
        if kind in UNSUPPORTED_CLIENT_EVENTS:
            raise UnsupportedEvent(f"{kind}: {UNSUPPORTED_CLIENT_EVENTS[kind]}", param="type")
        if kind in DUPLEX_CLIENT_EVENTS:
            if not self.duplex:
                raise UnknownEvent(
                    f"{kind} is a duplex extension; connect with ?duplex=1", param="type"
                )
            return client_event(envelope)  # the native shapes, from the same object
        if kind not in REALTIME_CLIENT_EVENTS:
            raise UnknownEvent(f"unknown event type {kind!r}", param="type")
        _check_keys(obj, _TOP_LEVEL | _FIELDS.get(kind, frozenset()))
        match kind:
            case "session.update":
                options = parse_session(obj.get("session"), duplex=self.duplex, model=self.model)
                codec, rate = options.input_audio_codec, options.input_sample_rate
                pauses = (codec is not None and codec != self.formats.input) or (
                    rate is not None and rate != self.formats.input_rate
                )
                self._unanswered.append(pauses)
                self._pausing += pauses
                return SessionUpdate(options, event_id)
            case "input_audio_buffer.append":
                return _decode_append(obj, self.formats, event_id)
            case "input_audio_buffer.commit":
                return AudioCommit(event_id)
            case "input_audio_buffer.clear":
                return AudioClear(event_id)
            case "output_audio_buffer.clear":
                return ResponseCancel(None, event_id)
            case "conversation.item.create":
                return _item_create(obj, self.formats, event_id)
            case "conversation.item.retrieve":
                return ItemRetrieve(_string(obj, "item_id"), event_id)
            case "conversation.item.delete":
                return ItemDelete(_string(obj, "item_id"), event_id)
            case "conversation.item.truncate":
                return _item_truncate(obj, event_id)
            case "response.create":
                return ResponseCreate(event_id, _response_options(obj, self.formats.output))
            case _:  # "response.cancel"
                response_id = obj.get("response_id")
                if response_id is not None and not isinstance(response_id, str):
                    raise BadEvent("response_id must be a string", param="response_id")
                return ResponseCancel(response_id, event_id)

    # ----------------------------------------------------------------- outbound

    def encode(self, event: ServerEvent, seq: int | None) -> list[dict[str, Any]]:
        """The Realtime server events that ``event`` stands for, JSON-ready, in order.

        Args:
            event: a server event from ``duplex.sessions``.
            seq: its ``server_event_seq`` from the `Send` effect (``None``:
                connection-scoped). With ``duplex=True`` it is stamped on the
                last wire event of the group (the others carry ``null``), so a
                client cursor at ``seq`` means the whole group arrived; without it
                no seq is sent.

        Returns:
            Zero or more dicts with ``type`` and ``event_id``: the wire edge.
        """
        self._follow(event, seq)
        if isinstance(event, ErrorEvent):
            event = replace(event, param=wire_param(event.param, self.schema))
        return self._encoder.encode(event, seq, self.formats)

    def frames(self, event: ServerEvent, seq: int | None) -> list[str]:
        """`encode` as the JSON text frames to send (audio deltas from a template)."""
        if isinstance(event, AudioDelta):  # follows no config; its text equals `dumps`'s
            return self._encoder.audio_delta_text(event, seq, self.formats)
        return [dumps(wire) for wire in self.encode(event, seq)]


def parse_realtime_event(
    data: str | bytes,
    *,
    schema: Schema = "ga",
    duplex: bool = False,
    max_size: int = DEFAULT_MAX_EVENT_BYTES,
    formats: WireFormats | None = None,
) -> ClientEvent:
    """Parse one frame without connection state (appends decode in ``formats``).

    A convenience over `RealtimeProjection.parse` for tools and tests; a server
    keeps one `RealtimeProjection` per connection so ``session.update`` sticks.

    Raises:
        ProtocolError: as `RealtimeProjection.parse`.
    """
    projection = RealtimeProjection(
        schema=schema, duplex=duplex, max_size=max_size, formats=formats or WireFormats()
    )
    return projection.parse(data)
