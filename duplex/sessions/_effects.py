"""Effects: what `SessionMachine.handle` asks the session actor to do, in order.

Frozen slotted value classes like the events (they are the other half of the
same contract, split out only to keep modules small). Do not subclass them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

from ._events import Pcm, ServerEvent, VideoAppend
from ._generation import FunctionTool, ResponseSettings
from ._items import HistoryItem

# WebSocket close codes the machine asks for.
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_SESSION_REPLACED = 4001


@final
@dataclass(frozen=True, slots=True)
class Send:
    """Write ``event`` on the socket of ``generation``.

    ``seq`` is its ``server_event_seq`` (already journaled); ``None`` marks a
    connection-scoped event (handshake replies, takeover notices, errors to a
    refused socket) that is never journaled or replayed.
    """

    event: ServerEvent
    seq: int | None
    generation: int


@final
@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the socket of ``generation`` with a WebSocket close code, after pending sends."""

    generation: int
    code: int
    reason: str


@final
@dataclass(frozen=True, slots=True, eq=False)
class ModelAppendAudio:
    """Feed model-rate float32 input to the model; its output for it carries ``epoch``."""

    epoch: int
    pcm: Pcm = field(repr=False)
    audio_start_ms: float


@final
@dataclass(frozen=True, slots=True, eq=False)
class ModelAppendVideo:
    """Feed one video frame, stamped against the input audio clock."""

    epoch: int
    frame: VideoAppend
    audio_clock_ms: float


@final
@dataclass(frozen=True, slots=True)
class ModelSignal:
    """A turn hint for the model: ``commit`` (turn closed) or ``response_create``."""

    epoch: int
    signal: str
    turn_id: int


@final
@dataclass(frozen=True, slots=True)
class ModelReset:
    """The epoch advanced: stop the current output; stamp later output with ``epoch``.

    ``clear_input`` also drops input the model has queued but not consumed.
    """

    epoch: int
    reason: str
    clear_input: bool = False


@final
@dataclass(frozen=True, slots=True)
class ReleaseResources:
    """The session is over: free its engine slot and everything else; sent once.

    ``expired``: a timer ended it (idle lease, disconnect grace, a socket that left
    before any event), not the client.
    """

    reason: str
    expired: bool = False


@final
@dataclass(frozen=True, slots=True)
class Transcribe:
    """The agent's ASR stage: hear the user item ``item_id`` from ``start_ms`` on the
    input clock (audio arrives with ``ModelAppendAudio``); ``end_ms`` set: the turn ends
    there, so finish it and answer with a final `AsrResult`. ``provisional``: the speech
    paused at ``end_ms`` but the turn goes on: answer what is heard up to there (an
    `AsrResult` with ``until_ms``) and keep hearing."""

    item_id: str
    start_ms: float
    end_ms: float | None = None
    provisional: bool = False


@final
@dataclass(frozen=True, slots=True)
class AgentReply:
    """The agent's reply stages (LLM, TTS) answer ``response_id`` from ``context`` (the
    conversation it sees, oldest first) with ``settings`` and ``tools``, as `AgentChunk` s.
    A `ModelReset` of a later epoch cancels it end to end."""

    epoch: int
    response_id: str
    settings: ResponseSettings
    context: tuple[HistoryItem, ...] = field(repr=False)
    tools: tuple[FunctionTool, ...] = ()


@final
@dataclass(frozen=True, slots=True)
class CancelReply:
    """Stop the agent's reply ``response_id`` end to end (a prepared reply the turn did
    not use); its late chunks are dropped."""

    response_id: str


Effect = (
    (Send | CloseConnection | ModelAppendAudio | ModelAppendVideo | ModelSignal | ModelReset)
    | ReleaseResources
    | Transcribe
    | AgentReply
    | CancelReply
)
EFFECT_TYPES: tuple[type, ...] = Effect.__args__  # type: ignore[attr-defined]
