"""Every event of a duplex session, as frozen slotted value classes.

Client events (parsed by a wire projection) and runtime events (model, VAD,
connection, timers) go into `SessionMachine.handle`; server events come out
wrapped in `Send` effects (``_effects``); they are defined in ``_server_events``
and re-exported here. Constructors check their fields and
raise a `ProtocolError` subclass (h11's habit), so a parser can build them
directly. Audio-carrying classes compare by identity (``eq=False``). Do not
subclass these classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar, final

from duplex.exceptions import BadAudio, InvalidVideoFrames
from duplex.pcm import float_to_pcm16

from ._checks import COUNT, DURATION_MS, PIXELS, Pcm
from ._checks import check as _check
from ._checks import float_pcm as _float_pcm
from ._checks import is_int as _is_int
from ._config import SUPPORTED_SAMPLE_RATES, SessionOptions
from ._generation import ResponseOptions
from ._items import ITEM_ROLES
from ._server_events import (
    OVERLAP_ACTIONS,
    RESPONSE_STATUSES,
    SERVER_EVENT_TYPES,
    AudioDelta,
    ErrorEvent,
    FunctionCallDelta,
    FunctionCallDone,
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
    PlaybackAcknowledged,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    ServerEvent,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionReady,
    SessionReplaced,
    SessionResumed,
    SessionResyncRequired,
    SessionUpdated,
    TextDelta,
    TranscriptDelta,
    VideoConsumed,
    audio_ms,
)

TURN_SIGNALS = ("barge_in",)
_ITEM_KINDS: dict[str, str | None] = {  # item kind -> its role (None: any message role)
    "message": None,
    "function_call": "assistant",
    "function_call_output": "tool",
}
VIDEO_FORMATS = ("jpeg", "png", "rgb")

_E = TypeVar("_E")


def rebuilt(cls: type[_E], values: Iterable[object]) -> _E:
    """An event of ``cls`` from its field values in order, as pickle rebuilds one: without
    the constructor's checks, which it passed when it was first built (the journal's
    replay; a worker link's per-frame messages, where ``AudioAppend``'s finite-sample
    check alone is 8 us)."""
    event = object.__new__(cls)
    for name, value in zip(cls.__slots__, values, strict=True):  # type: ignore[attr-defined]
        object.__setattr__(event, name, value)
    return event


@final
@dataclass(frozen=True, slots=True)
class SessionCreate:
    """``session.create``: the actor builds the machine with these options; a live
    session refuses it (``illegal_state``)."""

    options: SessionOptions = field(default_factory=SessionOptions)
    event_id: str | None = None


@final
@dataclass(frozen=True, slots=True)
class SessionUpdate:
    """``session.update``: change the client-settable options."""

    options: SessionOptions = field(default_factory=SessionOptions)
    event_id: str | None = None


@final
@dataclass(frozen=True, slots=True, eq=False)
class AudioAppend:
    """``input_audio_buffer.append``: decoded mono float32 PCM at the client's rate.

    The machine resamples to the model rate itself (it owns the stateful
    resampler, so chunk boundaries are seamless). ``sample_rate=None`` means the
    session's ``input_sample_rate``.
    """

    pcm: Pcm = field(repr=False)
    sample_rate: int | None = None
    event_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "pcm", _float_pcm(self.pcm, "audio"))
        if self.sample_rate is not None:
            _check(
                self.sample_rate in SUPPORTED_SAMPLE_RATES,
                f"sample_rate must be one of {SUPPORTED_SAMPLE_RATES}",
                "sample_rate",
            )


@final
@dataclass(frozen=True, slots=True)
class AudioCommit:
    """``input_audio_buffer.commit``: close the current user turn."""

    event_id: str | None = None


@final
@dataclass(frozen=True, slots=True)
class AudioClear:
    """``input_audio_buffer.clear``: drop uncommitted input; advances the epoch."""

    event_id: str | None = None


@final
@dataclass(frozen=True, slots=True)
class TurnSignal:
    """``turn.signal``: a client-side turn decision (only ``barge_in`` so far)."""

    signal: str = "barge_in"
    source: str | None = None
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(self.signal in TURN_SIGNALS, f"event must be one of {TURN_SIGNALS}", "event")


@final
@dataclass(frozen=True, slots=True)
class PlaybackAck:
    """``playback.ack``: the client played ``played_ms`` of a response."""

    response_id: str
    played_ms: int
    item_id: str | None = None
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.response_id), "response_id must not be empty", "response_id")
        DURATION_MS.read(self.played_ms, "played_ms")


@final
@dataclass(frozen=True, slots=True)
class ResponseCreate:
    """``response.create``: ask the model to answer the committed input; ``options``
    override the session's generation config for this response (``None``: none)."""

    event_id: str | None = None
    options: ResponseOptions | None = None


@final
@dataclass(frozen=True, slots=True)
class ResponseCancel:
    """``response.cancel``: stop the active response; advances the epoch."""

    response_id: str | None = None
    event_id: str | None = None


@final
@dataclass(frozen=True, slots=True)
class SessionResume:
    """``session.resume``: reattach with a token and replay after the cursor."""

    session_id: str
    resume_token: str = field(repr=False)
    last_received_server_event_seq: int = 0
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.session_id), "session_id must not be empty", "session_id")
        _check(bool(self.resume_token), "resume_token must not be empty", "resume_token")
        COUNT.read(self.last_received_server_event_seq, "last_received_server_event_seq")


@final
@dataclass(frozen=True, slots=True)
class EventAck:
    """``session.event_ack``: the client holds everything up to this seq; trim the journal."""

    server_event_seq: int
    event_id: str | None = None

    def __post_init__(self) -> None:
        COUNT.read(self.server_event_seq, "server_event_seq")


@final
@dataclass(frozen=True, slots=True)
class SessionClose:
    """``session.close``: end the session and release its resources."""

    event_id: str | None = None


@final
@dataclass(frozen=True, slots=True, eq=False)
class VideoAppend:
    """``input_video.append``: one encoded (jpeg/png) or raw RGB frame."""

    frame: bytes = field(repr=False)
    frame_id: str
    pts_ms: int
    format: str = "jpeg"
    width: int | None = None
    height: int | None = None
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(self.format in VIDEO_FORMATS, f"format must be one of {VIDEO_FORMATS}", "format")
        _check(bool(self.frame), "frame must not be empty", "frame", InvalidVideoFrames)
        _check(bool(self.frame_id), "frame_id must not be empty", "frame_id")
        COUNT.read(self.pts_ms, "pts_ms")
        for key in ("width", "height"):
            if getattr(self, key) is not None:
                PIXELS.read(getattr(self, key), key, InvalidVideoFrames)
        if self.format == "rgb":
            w, h = self.width, self.height
            _check(
                w is not None and h is not None,
                "raw rgb frames need positive width and height",
                "width",
                InvalidVideoFrames,
            )
            _check(
                len(self.frame) == w * h * 3,  # type: ignore[operator]
                "raw rgb frame size must be width * height * 3 bytes",
                "frame",
                InvalidVideoFrames,
            )


@final
@dataclass(frozen=True, slots=True, eq=False)
class ItemCreate:
    """``conversation.item.create``: add a message to the history.

    A user item holds text or audio (``pcm`` at ``sample_rate``, ``None``: the
    session's input rate; the machine resamples it); assistant and system items
    hold text. ``previous_item_id``: insert after that item (``None``: append;
    ``"root"``: first). ``item_id``: the client's id (``None``: the server makes one).
    """

    role: str
    text: str | None = None
    pcm: Pcm | None = field(default=None, repr=False)
    sample_rate: int | None = None
    item_id: str | None = None
    previous_item_id: str | None = None
    event_id: str | None = None
    kind: str = "message"
    """``message``, ``function_call`` (role ``assistant``, ``text`` the arguments) or
    ``function_call_output`` (role ``tool``, ``text`` the output)."""
    call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        _check(self.role in ITEM_ROLES, f"item.role must be one of {ITEM_ROLES}", "item.role")
        _check(self.kind in _ITEM_KINDS, f"item.type must be one of {_ITEM_KINDS}", "item.type")
        role = _ITEM_KINDS[self.kind]
        _check(role is None or self.role == role, f"a {self.kind} item has role {role}", "item")
        _check(
            (self.kind == "message") == (self.call_id is None),
            "call_id belongs to function_call and function_call_output items",
            "item.call_id",
        )
        _check(
            (self.kind == "function_call") == (self.name is not None),
            "name belongs to function_call items",
            "item.name",
        )
        _check(self.kind == "message" or self.text is not None, "a tool item holds text", "item")
        _check(self.role != "tool" or self.kind != "message", "tool items are tool results", "item")
        if self.pcm is not None:
            object.__setattr__(self, "pcm", _float_pcm(self.pcm, "item.content"))
        _check(
            (self.text is None) != (self.pcm is None),
            "an item holds exactly one content part: text or audio",
            "item.content",
        )
        _check(
            self.pcm is None or self.role == "user",
            "only user items may hold audio",
            "item.content",
        )
        if self.sample_rate is not None:
            _check(
                self.sample_rate in SUPPORTED_SAMPLE_RATES,
                f"sample_rate must be one of {SUPPORTED_SAMPLE_RATES}",
                "sample_rate",
            )
        _check(self.item_id is None or bool(self.item_id), "item.id must not be empty", "item.id")


@final
@dataclass(frozen=True, slots=True)
class ItemRetrieve:
    """``conversation.item.retrieve``."""

    item_id: str
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.item_id), "item_id must not be empty", "item_id")


@final
@dataclass(frozen=True, slots=True)
class ItemDelete:
    """``conversation.item.delete``."""

    item_id: str
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.item_id), "item_id must not be empty", "item_id")


@final
@dataclass(frozen=True, slots=True)
class ItemTruncate:
    """``conversation.item.truncate``: the client heard ``audio_end_ms`` of an assistant item."""

    item_id: str
    content_index: int
    audio_end_ms: int
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.item_id), "item_id must not be empty", "item_id")
        COUNT.read(self.content_index, "content_index")
        DURATION_MS.read(self.audio_end_ms, "audio_end_ms")


ClientEvent = (
    SessionCreate
    | SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | TurnSignal
    | PlaybackAck
    | ResponseCreate
    | ResponseCancel
    | SessionResume
    | EventAck
    | SessionClose
    | VideoAppend
    | ItemCreate
    | ItemRetrieve
    | ItemDelete
    | ItemTruncate
)
CLIENT_EVENT_TYPES: tuple[type, ...] = ClientEvent.__args__  # type: ignore[attr-defined]


@final
@dataclass(frozen=True, slots=True, eq=False)
class ModelFrame:
    """One model tick for this session.

    ``pcm`` is mono int16 little-endian at the model rate (a float32 array is
    converted). ``epoch`` is the epoch the model had when it took the input
    that produced this frame; the machine drops frames of other epochs.
    ``consumed_input_samples`` counts model-rate input samples taken since the
    previous frame (it drains the input ledger whatever the epoch).
    ``holds_input``: the slot is still replaying its prompt, so its next tick takes
    no input; the first frame without it makes the session ready (`SessionReady`).
    """

    epoch: int
    pcm: bytes = field(default=b"", repr=False)
    text: str = ""
    speaking: bool = False
    end_of_turn: bool = False
    consumed_input_samples: int = 0
    consumed_video_frame_ids: tuple[str, ...] = ()
    latest_video_pts_ms: int | None = None
    holds_input: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.pcm, bytes | bytearray):
            arr = _float_pcm(self.pcm, "pcm")
            object.__setattr__(self, "pcm", float_to_pcm16(arr).astype("<i2").tobytes())
        elif isinstance(self.pcm, bytearray):
            object.__setattr__(self, "pcm", bytes(self.pcm))
        _check(len(self.pcm) % 2 == 0, "pcm16 must have an even byte count", "pcm", BadAudio)
        _check(_is_int(self.epoch) and self.epoch >= 0, "epoch must be >= 0", "epoch")
        _check(
            _is_int(self.consumed_input_samples) and self.consumed_input_samples >= 0,
            "consumed_input_samples must be >= 0",
            "consumed_input_samples",
        )
        object.__setattr__(self, "consumed_video_frame_ids", tuple(self.consumed_video_frame_ids))


@final
@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """A VAD found speech starting at ``audio_ms`` on the session's input clock.

    The seam for a model VAD (``vad="external"``): a VAD actor sends these and
    `SpeechStopped` as runtime events, unpadded; the machine applies
    ``vad_prefix_padding_ms`` and the turn-detection policy.
    """

    audio_ms: float


@final
@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """A VAD found speech ending at ``audio_ms`` on the session's input clock."""

    audio_ms: float


@final
@dataclass(frozen=True, slots=True)
class SpeechPaused:
    """A VAD found speech quiet since ``audio_ms`` for ``vad_prepare_ms`` (not yet the
    turn's end): the agent may prepare its reply to the turn as it stands."""

    audio_ms: float


@final
@dataclass(frozen=True, slots=True)
class SpeechResumed:
    """Speech came back at ``audio_ms`` after a `SpeechPaused`: the pause was not the end."""

    audio_ms: float


@final
@dataclass(frozen=True, slots=True)
class ConnectionAttached:
    """A socket joined: a fresh session (``resume=None``) or a resume/takeover."""

    generation: int
    resume: SessionResume | None = None


@final
@dataclass(frozen=True, slots=True)
class ConnectionDetached:
    """The socket of ``generation`` is gone (closed, failed, or replaced)."""

    generation: int


@final
@dataclass(frozen=True, slots=True)
class Tick:
    """Nothing happened but time passed; lets deadlines fire."""


@final
@dataclass(frozen=True, slots=True)
class ModelFailed:
    """The model or engine failed for this session; the message is for the client."""

    message: str = "engine failure"


@final
@dataclass(frozen=True, slots=True)
class AsrResult:
    """The agent's ASR stage heard ``text`` in the user item ``item_id`` so far
    (``final``: the whole turn, after `Transcribe` closed it)."""

    item_id: str
    text: str
    final: bool = False
    until_ms: float | None = None
    """Set: the answer to a provisional `Transcribe` (what is heard up to there)."""
    error: str | None = None
    """Set on a final result: the turn's transcription failed (the ASR was lost or refused
    it), and ``text`` is what was heard before; the reason is logged, never sent."""


@final
@dataclass(frozen=True, slots=True, eq=False)
class AgentChunk:
    """A piece of the agent's reply to ``response_id``: ``pcm`` (model rate, float32 or
    PCM16 bytes; none for a text-only reply) with the ``text`` it speaks; ``final``: the
    reply is over (``reason`` says why: ``stop``, ``length``, ``error``)."""

    response_id: str
    pcm: Pcm | bytes = field(default=b"", repr=False)
    text: str = ""
    final: bool = False
    reason: str = "stop"


@final
@dataclass(frozen=True, slots=True)
class AgentToolCall:
    """A piece of a tool call in the agent's reply to ``response_id``: the tool ``name``,
    the next ``arguments`` text (JSON, as the model writes it), ``done`` on the call's last
    piece. The first piece of a ``call_id`` opens the call, those that follow (same
    ``call_id``) extend it; a whole call is one piece with ``done``. ``call_id`` empty: the
    session makes one. The reply's final `AgentChunk` still ends the response."""

    response_id: str
    name: str
    arguments: str
    call_id: str = ""
    done: bool = True


RuntimeEvent = (
    (ModelFrame | SpeechStarted | SpeechStopped | ConnectionAttached | ConnectionDetached | Tick)
    | ModelFailed
    | AsrResult
    | AgentChunk
    | AgentToolCall
    | SpeechPaused
    | SpeechResumed
)
RUNTIME_EVENT_TYPES: tuple[type, ...] = RuntimeEvent.__args__  # type: ignore[attr-defined]
Event = ClientEvent | RuntimeEvent

__all__ = [
    "CLIENT_EVENT_TYPES",
    "OVERLAP_ACTIONS",
    "RESPONSE_STATUSES",
    "RUNTIME_EVENT_TYPES",
    "SERVER_EVENT_TYPES",
    "TURN_SIGNALS",
    "VIDEO_FORMATS",
    "AgentChunk",
    "AgentToolCall",
    "AsrResult",
    "AudioAppend",
    "AudioClear",
    "AudioCommit",
    "AudioDelta",
    "ClientEvent",
    "ConnectionAttached",
    "ConnectionDetached",
    "ErrorEvent",
    "Event",
    "EventAck",
    "FunctionCallDelta",
    "FunctionCallDone",
    "InputAudioCleared",
    "InputAudioCommitted",
    "InputAudioTimeout",
    "InputSpeechStarted",
    "InputSpeechStopped",
    "InputTranscriptionCompleted",
    "InputTranscriptionDelta",
    "InputTranscriptionFailed",
    "ItemAdded",
    "ItemCreate",
    "ItemDelete",
    "ItemDeleted",
    "ItemRetrieve",
    "ItemRetrieved",
    "ItemTruncate",
    "ItemTruncated",
    "ModelFailed",
    "ModelFrame",
    "OverlapDecision",
    "Pcm",
    "PlaybackAck",
    "PlaybackAcknowledged",
    "ResponseCancel",
    "ResponseCreate",
    "ResponseCreated",
    "ResponseDone",
    "ResponseListen",
    "RuntimeEvent",
    "ServerEvent",
    "SessionClose",
    "SessionClosed",
    "SessionCreate",
    "SessionCreated",
    "SessionExpired",
    "SessionReady",
    "SessionReplaced",
    "SessionResume",
    "SessionResumed",
    "SessionResyncRequired",
    "SessionUpdate",
    "SessionUpdated",
    "SpeechPaused",
    "SpeechResumed",
    "SpeechStarted",
    "SpeechStopped",
    "TextDelta",
    "Tick",
    "TranscriptDelta",
    "TurnSignal",
    "VideoAppend",
    "VideoConsumed",
    "audio_ms",
]
