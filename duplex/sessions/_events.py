"""Every event of a duplex session, as frozen slotted value classes.

Client events (parsed by a wire projection) and runtime events (model, VAD,
connection, timers) go into `SessionMachine.handle`; server events come out
wrapped in `Send` effects (``_effects``). Constructors check their fields and
raise a `ProtocolError` subclass (h11's habit), so a parser can build them
directly. Audio-carrying classes compare by identity (``eq=False``). Do not
subclass these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import numpy as np
import numpy.typing as npt

from duplex.exceptions import BadAudio, BadEvent, InvalidVideoFrames, ProtocolError

from ._config import SUPPORTED_SAMPLE_RATES, Capabilities, SessionConfig, SessionOptions

Pcm = npt.NDArray[np.float32]

TURN_SIGNALS = ("barge_in",)
VIDEO_FORMATS = ("jpeg", "png", "rgb")
RESPONSE_STATUSES = ("completed", "cancelled", "incomplete", "failed")
OVERLAP_ACTIONS = ("drop", "listen", "barge_in", "pause", "resume")


def _check(ok: bool, message: str, param: str, exc: type[ProtocolError] = BadEvent) -> None:
    if not ok:
        raise exc(message, param=param)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _float_pcm(pcm: object, param: str) -> Pcm:
    """Normalise to a read-only 1-D float32 array with finite samples."""
    try:
        arr = np.array(pcm, dtype=np.float32, copy=True).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise BadAudio(f"{param} must be numeric samples", param=param) from exc
    _check(bool(np.isfinite(arr).all()), f"{param} has NaN or infinite samples", param, BadAudio)
    arr.flags.writeable = False
    return arr


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
        _check(
            _is_int(self.played_ms) and self.played_ms >= 0,
            "played_ms must be >= 0",
            "played_ms",
        )


@final
@dataclass(frozen=True, slots=True)
class ResponseCreate:
    """``response.create``: ask the model to answer the committed input."""

    event_id: str | None = None


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
        seq = self.last_received_server_event_seq
        _check(
            _is_int(seq) and seq >= 0,
            "last_received_server_event_seq must be >= 0",
            "last_received_server_event_seq",
        )


@final
@dataclass(frozen=True, slots=True)
class EventAck:
    """``session.event_ack``: the client holds everything up to this seq; trim the journal."""

    server_event_seq: int
    event_id: str | None = None

    def __post_init__(self) -> None:
        _check(
            _is_int(self.server_event_seq) and self.server_event_seq >= 0,
            "server_event_seq must be >= 0",
            "server_event_seq",
        )


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
        _check(_is_int(self.pts_ms) and self.pts_ms >= 0, "pts_ms must be >= 0", "pts_ms")
        if self.format == "rgb":
            w, h = self.width, self.height
            _check(
                _is_int(w) and _is_int(h) and w > 0 and h > 0,  # type: ignore[operator]
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
    """

    epoch: int
    pcm: bytes = field(default=b"", repr=False)
    text: str = ""
    speaking: bool = False
    end_of_turn: bool = False
    consumed_input_samples: int = 0
    consumed_video_frame_ids: tuple[str, ...] = ()
    latest_video_pts_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pcm, bytes | bytearray):
            arr = _float_pcm(self.pcm, "pcm")
            pcm16 = np.clip(np.round(arr * 32767.0), -32768, 32767).astype("<i2")
            object.__setattr__(self, "pcm", pcm16.tobytes())
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
    """A VAD found speech starting at ``audio_ms`` on the session's input clock."""

    audio_ms: float


@final
@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """A VAD found speech ending at ``audio_ms`` on the session's input clock."""

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


RuntimeEvent = (
    ModelFrame | SpeechStarted | SpeechStopped | ConnectionAttached | ConnectionDetached | Tick
) | ModelFailed
RUNTIME_EVENT_TYPES: tuple[type, ...] = RuntimeEvent.__args__  # type: ignore[attr-defined]
Event = ClientEvent | RuntimeEvent


@final
@dataclass(frozen=True, slots=True)
class SessionCreated:
    """``session.created``: connection-scoped (carries the credential, never replayed)."""

    session_id: str
    config: SessionConfig
    capabilities: Capabilities
    resume_token: str = field(repr=False)
    attachment_generation: int
    epoch: int


@final
@dataclass(frozen=True, slots=True)
class SessionUpdated:
    """``session.updated``."""

    session_id: str
    config: SessionConfig


@final
@dataclass(frozen=True, slots=True)
class SessionResumed:
    """``session.resumed``: connection-scoped; the rotated token and what gets replayed."""

    session_id: str
    resume_token: str = field(repr=False)
    attachment_generation: int
    epoch: int
    replay_count: int
    last_server_event_seq: int


@final
@dataclass(frozen=True, slots=True)
class SessionReplaced:
    """``session.replaced``: sent to the superseded socket before it is closed."""

    session_id: str
    attachment_generation: int


@final
@dataclass(frozen=True, slots=True)
class SessionExpired:
    """``session.expired``: ``idle_ttl_expired`` or ``disconnect_grace_expired``."""

    session_id: str
    reason: str


@final
@dataclass(frozen=True, slots=True)
class SessionResyncRequired:
    """``session.resync_required``: the replay cursor fell out of the journal."""

    session_id: str
    reason: str
    last_server_event_seq: int


@final
@dataclass(frozen=True, slots=True)
class SessionClosed:
    """``session.closed``."""

    session_id: str
    reason: str


@final
@dataclass(frozen=True, slots=True)
class InputAudioCommitted:
    """``input_audio_buffer.committed``."""

    item_id: str
    turn_id: int
    audio_end_ms: float


@final
@dataclass(frozen=True, slots=True)
class InputAudioCleared:
    """``input_audio_buffer.cleared``."""

    epoch: int


@final
@dataclass(frozen=True, slots=True)
class InputSpeechStarted:
    """``input_audio_buffer.speech_started``."""

    audio_start_ms: float


@final
@dataclass(frozen=True, slots=True)
class InputSpeechStopped:
    """``input_audio_buffer.speech_stopped``."""

    audio_end_ms: float


@final
@dataclass(frozen=True, slots=True)
class ResponseCreated:
    """``response.created``: exactly once per response, before its deltas."""

    response_id: str
    item_id: str
    epoch: int


@final
@dataclass(frozen=True, slots=True)
class AudioDelta:
    """``response.audio.delta``: PCM16 LE at ``sample_rate`` (the model rate)."""

    response_id: str
    item_id: str
    epoch: int
    pcm: bytes = field(repr=False)
    sample_rate: int
    audio_start_ms: float


@final
@dataclass(frozen=True, slots=True)
class TranscriptDelta:
    """``response.audio_transcript.delta``."""

    response_id: str
    item_id: str
    epoch: int
    delta: str
    audio_start_ms: float


@final
@dataclass(frozen=True, slots=True)
class ResponseDone:
    """``response.done``: exactly one per response; ``transcript`` == concat of its deltas."""

    response_id: str
    item_id: str
    epoch: int
    status: str
    reason: str
    transcript: str
    audio_ms: float

    def __post_init__(self) -> None:
        _check(self.status in RESPONSE_STATUSES, "unknown response status", "status")


@final
@dataclass(frozen=True, slots=True)
class ResponseListen:
    """``response.listen``: the model chose to listen."""

    epoch: int
    reason: str


@final
@dataclass(frozen=True, slots=True)
class OverlapDecision:
    """``overlap.decision``: one per overlap-policy decision."""

    policy: str
    action: str
    reason: str
    overlap_ms: float
    response_id: str | None = None

    def __post_init__(self) -> None:
        _check(self.action in OVERLAP_ACTIONS, "unknown overlap action", "action")


@final
@dataclass(frozen=True, slots=True)
class PlaybackAcknowledged:
    """``playback.acknowledged``: the ledger after an ack."""

    response_id: str
    item_id: str
    played_ms: float
    committed_ms: float
    generated_ms: float
    sent_ms: float
    history_committed: bool


@final
@dataclass(frozen=True, slots=True)
class VideoConsumed:
    """``input_video.consumed``: frames the model took (an input fact, not epoch-fenced)."""

    frame_ids: tuple[str, ...]
    latest_pts_ms: int | None


@final
@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """``error``: one per refused client event, naming its ``event_id``."""

    code: str
    type: str
    message: str
    event_id: str | None = None
    param: str | None = None

    @classmethod
    def from_exception(cls, exc: ProtocolError, event_id: str | None = None) -> ErrorEvent:
        """The wire form of a refused event; ``event_id`` fills a missing one."""
        return cls(exc.code, exc.error_type, exc.message, exc.event_id or event_id, exc.param)


ServerEvent = (
    SessionCreated
    | SessionUpdated
    | SessionResumed
    | SessionReplaced
    | SessionExpired
    | SessionResyncRequired
    | SessionClosed
    | InputAudioCommitted
    | InputAudioCleared
    | InputSpeechStarted
    | InputSpeechStopped
    | ResponseCreated
    | AudioDelta
    | TranscriptDelta
    | ResponseDone
    | ResponseListen
    | OverlapDecision
    | PlaybackAcknowledged
    | VideoConsumed
    | ErrorEvent
)
SERVER_EVENT_TYPES: tuple[type, ...] = ServerEvent.__args__  # type: ignore[attr-defined]


def audio_ms(pcm16: bytes, sample_rate: int) -> float:
    """Duration of mono PCM16 bytes in milliseconds."""
    return len(pcm16) / 2 * 1000.0 / sample_rate
