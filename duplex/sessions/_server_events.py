"""Server events: what the session says, wrapped in `Send` effects (``_effects``).

Split from ``_events`` only to keep modules small; ``_events`` re-exports every
name here, so callers import from one place. Frozen, slotted, checked when
built. Do not subclass these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

from duplex.exceptions import ProtocolError

from ._checks import check as _check
from ._config import Capabilities, SessionConfig
from ._generation import ResponseSettings
from ._items import HistoryItem

RESPONSE_STATUSES = ("completed", "cancelled", "incomplete", "failed")
OVERLAP_ACTIONS = ("drop", "listen", "barge_in", "pause", "resume")


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
    """``session.resumed``: connection-scoped; the rotated token, what gets replayed and
    the session's config now (a new socket's projection learns the negotiated formats)."""

    session_id: str
    resume_token: str = field(repr=False)
    attachment_generation: int
    epoch: int
    replay_count: int
    last_server_event_seq: int
    config: SessionConfig


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
class SessionReady:
    """``session.ready``: connection-scoped, sent once, and only to a session opened with
    ``announce_ready``: its engine slot has run its first tick that takes input (a
    prompt, if any, is replayed), so audio sent from now on is heard without waiting
    behind the replay. Moshi's ``/api/chat`` handshake waits for it."""

    session_id: str


@final
@dataclass(frozen=True, slots=True)
class SessionClosed:
    """``session.closed``."""

    session_id: str
    reason: str


@final
@dataclass(frozen=True, slots=True)
class InputAudioCommitted:
    """``input_audio_buffer.committed``: the user item ``item_id`` holds the turn's audio.

    ``previous_item_id`` is the item before it in the history (``None``: the first).
    """

    item_id: str
    turn_id: int
    audio_end_ms: float
    previous_item_id: str | None = None


@final
@dataclass(frozen=True, slots=True)
class InputAudioCleared:
    """``input_audio_buffer.cleared``."""

    epoch: int


@final
@dataclass(frozen=True, slots=True)
class InputSpeechStarted:
    """``input_audio_buffer.speech_started``: ``audio_start_ms`` on the input clock
    (session start = 0) includes ``vad_prefix_padding_ms``; ``item_id`` names the
    user item a commit of this speech will create."""

    audio_start_ms: float
    item_id: str = ""


@final
@dataclass(frozen=True, slots=True)
class InputSpeechStopped:
    """``input_audio_buffer.speech_stopped``: where speech ended on the input clock."""

    audio_end_ms: float
    item_id: str = ""


@final
@dataclass(frozen=True, slots=True)
class InputAudioTimeout:
    """``input_audio_buffer.timeout_triggered``: ``vad_idle_timeout_ms`` of input audio
    without speech (from ``audio_start_ms`` to ``audio_end_ms`` on the input clock);
    the silence is committed as the user item ``item_id``."""

    audio_start_ms: float
    audio_end_ms: float
    item_id: str


@final
@dataclass(frozen=True, slots=True)
class InputTranscriptionDelta:
    """``conversation.item.input_audio_transcription.delta``: more of the user item's
    transcript, as the ASR stage hears it (appended, never revised)."""

    item_id: str
    delta: str


@final
@dataclass(frozen=True, slots=True)
class InputTranscriptionCompleted:
    """``conversation.item.input_audio_transcription.completed``: the user item's final
    transcript (it may differ from the deltas' concatenation: the final pass decides)."""

    item_id: str
    transcript: str
    audio_seconds: float = 0.0
    """How long the transcribed audio is (the ``usage`` of a duration-billed ASR)."""


@final
@dataclass(frozen=True, slots=True)
class InputTranscriptionFailed:
    """``conversation.item.input_audio_transcription.failed``: the user item's transcription
    failed (the ASR stage was lost or refused it mid-turn); the item keeps what was heard
    before, and the next turn is transcribed as usual."""

    item_id: str
    code: str
    message: str


@final
@dataclass(frozen=True, slots=True)
class ItemAdded:
    """``conversation.item.created`` (beta) / ``.added`` + ``.done`` (GA): a client-created
    item is in the history after ``previous_item_id`` (``None``: first)."""

    item: HistoryItem
    previous_item_id: str | None = None


@final
@dataclass(frozen=True, slots=True)
class ItemRetrieved:
    """``conversation.item.retrieved``: the history's view of one item."""

    item: HistoryItem


@final
@dataclass(frozen=True, slots=True)
class ItemDeleted:
    """``conversation.item.deleted``."""

    item_id: str


@final
@dataclass(frozen=True, slots=True)
class ItemTruncated:
    """``conversation.item.truncated``: the assistant item keeps ``audio_end_ms`` of audio
    (what was heard) and only the transcript spoken before it."""

    item_id: str
    content_index: int
    audio_end_ms: int


@final
@dataclass(frozen=True, slots=True)
class ResponseCreated:
    """``response.created``: exactly once per response, before its deltas."""

    response_id: str
    item_id: str
    epoch: int
    settings: ResponseSettings = field(default_factory=ResponseSettings)
    """How the response runs (modality, conversation, limits): its echo on the wire."""


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
class TextDelta:
    """``response.output_text.delta``: text of a text-only response (no audio comes)."""

    response_id: str
    item_id: str
    epoch: int
    delta: str


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
    settings: ResponseSettings = field(default_factory=ResponseSettings)
    """As on ``response.created``; a text-only response's ``transcript`` is its text."""
    calls: tuple[HistoryItem, ...] = ()
    """The ``function_call`` items the response made (after its message item), in order."""

    def __post_init__(self) -> None:
        _check(self.status in RESPONSE_STATUSES, "unknown response status", "status")


@final
@dataclass(frozen=True, slots=True)
class FunctionCallDelta:
    """A response's tool call grew: ``delta`` is the new text of its arguments, ``item`` the
    ``function_call`` item so far (``text`` its arguments up to here), output
    ``output_index``. ``opens``: the call's first delta, which opens its item."""

    response_id: str
    epoch: int
    output_index: int
    item: HistoryItem
    delta: str
    opens: bool = False
    in_conversation: bool = True


@final
@dataclass(frozen=True, slots=True)
class FunctionCallDone:
    """A response's tool call is over: ``item`` is its whole ``function_call`` item (``name``,
    ``call_id``, ``text`` its JSON arguments: the `FunctionCallDelta` s that came before it,
    joined), the response's output ``output_index`` (its message item is 0). It joins the
    conversation unless the response is out of band."""

    response_id: str
    epoch: int
    output_index: int
    item: HistoryItem
    in_conversation: bool = True
    complete: bool = True
    """``False``: cut off before its last piece (the response ended first); not in the
    conversation, whatever ``in_conversation`` says of its response."""


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
    update_refused: bool = False
    """The refused event was a ``session.update``: this error is the session's answer to it,
    as ``session.updated`` is to an update it took. Never on the wire: a projection that
    waits for the answer (the Realtime one, after a change of input codec) reads it."""

    @classmethod
    def from_exception(
        cls, exc: ProtocolError, event_id: str | None = None, *, update_refused: bool = False
    ) -> ErrorEvent:
        """The wire form of a refused event; ``event_id`` fills a missing one."""
        return cls(
            exc.code, exc.error_type, exc.message, exc.event_id or event_id, exc.param,
            update_refused,
        )  # fmt: skip


ServerEvent = (
    SessionCreated
    | SessionUpdated
    | SessionResumed
    | SessionReplaced
    | SessionExpired
    | SessionResyncRequired
    | SessionReady
    | SessionClosed
    | InputAudioCommitted
    | InputAudioCleared
    | InputSpeechStarted
    | InputSpeechStopped
    | InputAudioTimeout
    | InputTranscriptionDelta
    | InputTranscriptionCompleted
    | InputTranscriptionFailed
    | ItemAdded
    | ItemRetrieved
    | ItemDeleted
    | ItemTruncated
    | ResponseCreated
    | AudioDelta
    | TranscriptDelta
    | TextDelta
    | ResponseDone
    | FunctionCallDelta
    | FunctionCallDone
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
