"""The session state machine: events in, effects out, time passed in.

Two rules, after h11's ``_state.py``:

1. The tables come first and decide which rule applies: ``SESSION_TABLE`` maps
   (session state, event type) to a rule, ``TURN_TABLE`` refines it by turn
   state for the response events. The session state changes only in this file;
   the turn state (listening, responding, paused) changes only inside
   `TurnTaking` (``_turns.py``), its one owner, whose methods the handlers here
   call. So a transition is found from the tables: the cell names the handler,
   and the handler's turn calls name the turn change.
2. The machine does no I/O and reads no clock. ``handle(event, now)`` returns
   effects; the session actor performs them, and asks `next_deadline` when to
   send a `Tick`.

Session lifecycle::

    AWAITING --attach--> ACTIVE --detach--> DETACHED --resume--> ACTIVE
    ACTIVE --resume from another socket (takeover)--> ACTIVE
    ACTIVE | DETACHED --close | idle_ttl | disconnect_grace--> CLOSED
    ACTIVE --detach before any client event--> CLOSED (nothing to resume; frees the slot)

Turn, inside ACTIVE/DETACHED::

    LISTENING --speaking frame--> RESPONDING --speech, false-interruption on--> PAUSED
    PAUSED --timeout, no real turn--> RESPONDING
    RESPONDING | PAUSED --done | cancel | barge-in | clear | failure--> LISTENING

Under ``turn_policy="turn_based"`` model frames open nothing: a request
(``response.create``, a VAD stop) opens the response and the turn responder
speaks it (``_user_turns``, ``_responder``); speech start may cancel it.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

from duplex import exceptions as errors

from ._config import Capabilities, SessionConfig, TurnPolicy
from ._effects import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY_VIOLATION,
    CLOSE_SESSION_REPLACED,
    CloseConnection,
    Effect,
    ModelAppendVideo,
    ReleaseResources,
    Send,
)
from ._events import (
    CLIENT_EVENT_TYPES,
    AgentChunk,
    AgentToolCall,
    AsrResult,
    AudioAppend,
    AudioClear,
    AudioCommit,
    ConnectionAttached,
    ConnectionDetached,
    ErrorEvent,
    Event,
    EventAck,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    ModelFailed,
    ModelFrame,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    ServerEvent,
    SessionClose,
    SessionClosed,
    SessionCreate,
    SessionCreated,
    SessionExpired,
    SessionReady,
    SessionReplaced,
    SessionResume,
    SessionResumed,
    SessionResyncRequired,
    SessionUpdate,
    SessionUpdated,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    Tick,
    TurnSignal,
    VideoAppend,
    VideoConsumed,
)
from ._ids import new_session_id
from ._items import HistoryItem
from ._journal import Journal, Replay
from ._ledger import SessionStatistics
from ._resume import ResumeCredential
from ._turns import TurnState, TurnTaking
from ._user_turns import ItemEvent, UserTurns

__all__ = [
    "SESSION_TABLE",
    "TURN_TABLE",
    "Handle",
    "Ignore",
    "Reject",
    "SessionMachine",
    "SessionState",
    "TurnState",
]


class SessionState(enum.Enum):
    """Whether the session exists, has a socket, or is over."""

    AWAITING = "awaiting"
    ACTIVE = "active"
    DETACHED = "detached"
    CLOSED = "closed"


@final
@dataclass(frozen=True, slots=True)
class Handle:
    """Run the named handler."""

    method: str


@final
@dataclass(frozen=True, slots=True)
class Reject:
    """Answer with exactly one ``error`` naming the event; nothing else changes."""

    error: type[errors.ProtocolError]
    message: str


@final
@dataclass(frozen=True, slots=True)
class Ignore:
    """Drop and count: the event has no one to answer (no socket, or the session is over)."""

    reason: str


Rule = Handle | Reject | Ignore

_LIVE_CLIENT: dict[type, Rule] = {
    SessionCreate: Reject(
        errors.IllegalState, "session.create is only valid before a session exists"
    ),
    SessionUpdate: Handle("_on_session_update"),
    AudioAppend: Handle("_on_audio_append"),
    AudioCommit: Handle("_on_audio_commit"),
    AudioClear: Handle("_on_audio_clear"),
    TurnSignal: Handle("_on_turn_signal"),
    PlaybackAck: Handle("_on_playback_ack"),
    ResponseCreate: Handle("_on_response_create"),
    ResponseCancel: Handle("_on_response_cancel"),
    SessionResume: Reject(
        errors.IllegalState, "session.resume must be a new connection's first message"
    ),
    EventAck: Handle("_on_event_ack"),
    SessionClose: Handle("_on_session_close"),
    VideoAppend: Handle("_on_video_append"),
    ItemCreate: Handle("_on_item"),
    ItemRetrieve: Handle("_on_item"),
    ItemDelete: Handle("_on_item"),
    ItemTruncate: Handle("_on_item"),
}
_LIVE_RUNTIME: dict[type, Rule] = {
    ModelFrame: Handle("_on_model_frame"),
    SpeechStarted: Handle("_on_speech"),
    SpeechStopped: Handle("_on_speech"),
    SpeechPaused: Handle("_on_speech_pause"),
    SpeechResumed: Handle("_on_speech_pause"),
    ConnectionAttached: Handle("_on_resume_attach"),
    ConnectionDetached: Handle("_on_detach"),
    Tick: Handle("_on_tick"),
    ModelFailed: Handle("_on_model_failed"),
    AsrResult: Handle("_on_asr_result"),
    AgentChunk: Handle("_on_agent_chunk"),
    AgentToolCall: Handle("_on_agent_tool_call"),
}
_MODEL_EVENTS = (
    *(ModelFrame, SpeechStarted, SpeechStopped, ModelFailed),
    *(AsrResult, AgentChunk, AgentToolCall, SpeechPaused, SpeechResumed),
)
_NO_SOCKET: dict[type, Rule] = {t: Ignore("no_connection") for t in CLIENT_EVENT_TYPES}
_CLOSED: dict[type, Rule] = {
    t: Reject(errors.SessionClosed, "the session is closed") for t in CLIENT_EVENT_TYPES
}

SESSION_TABLE: dict[SessionState, dict[type, Rule]] = {
    SessionState.AWAITING: {
        **_NO_SOCKET,
        **{t: Ignore("not_started") for t in _MODEL_EVENTS},
        ModelFrame: Handle("_on_early_frame"),  # it may already say the slot is ready
        ConnectionAttached: Handle("_on_first_attach"),
        ConnectionDetached: Ignore("not_started"),
        Tick: Handle("_on_tick"),
    },
    SessionState.ACTIVE: {**_LIVE_CLIENT, **_LIVE_RUNTIME},
    SessionState.DETACHED: {**_NO_SOCKET, **_LIVE_RUNTIME},
    SessionState.CLOSED: {
        **_CLOSED,
        **{t: Ignore("closed") for t in _MODEL_EVENTS},
        ConnectionAttached: Handle("_on_closed_attach"),
        ConnectionDetached: Ignore("closed"),
        Tick: Handle("_on_tick"),
    },
}

TURN_TABLE: dict[tuple[TurnState, type], Rule] = {
    (TurnState.LISTENING, ResponseCancel): Reject(
        errors.ResponseNotActive, "no response is active"
    ),
    (TurnState.RESPONDING, ResponseCreate): Reject(
        errors.ResponseAlreadyActive, "a response is already active"
    ),
    (TurnState.PAUSED, ResponseCreate): Reject(
        errors.ResponseAlreadyActive, "a response is already active (paused)"
    ),
}

# Lookups for `handle`, which runs for every frame. The event classes are final, so a
# type's membership is ``isinstance`` without walking a 17-class tuple; only these
# types have TURN_TABLE rows, so the others skip building and hashing its key.
_CLIENT_TYPES = frozenset(CLIENT_EVENT_TYPES)
_TURN_RULED = frozenset(kind for _, kind in TURN_TABLE)


_COUNTERS = (
    "events_journaled",
    "connection_events_sent",
    "errors",
    "stale_client_events",
    "ignored_events",
    "session_resumes",
    "takeovers",
    "resume_failures",
    "model_frames_ignored",
)


def resume_refused(session_id: str, event_id: str | None = None) -> errors.SessionResumeExpired:
    """The answer to every failed ``session.resume``: an unknown id, an ended or expired
    session and a wrong token read the same (``session_resume_expired``), so a client that
    guesses learns nothing about which session ids exist."""
    return errors.SessionResumeExpired(
        f"unknown or expired duplex session: {session_id[:100]}", event_id=event_id
    )


class SessionMachine:
    """One session's facts and decisions; the session actor only runs its effects.

    Args:
        config: policy and limits (checked when built).
        capabilities: what the model can do (video, barge-in, ...).
        random_bytes: randomness for ids and resume tokens (``os.urandom``).
        session_id: a preallocated id; default ``duplex-<32 hex>``.
    """

    def __init__(
        self,
        config: SessionConfig | None = None,
        capabilities: Capabilities | None = None,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
        session_id: str | None = None,
    ) -> None:
        self._config = config or SessionConfig()
        self._caps = capabilities or Capabilities()
        self._random_bytes = random_bytes
        self._session_id = session_id or new_session_id(random_bytes)
        self._set_state(SessionState.AWAITING)
        self._generation: int | None = None
        self._sender: int | None = None
        self._now = 0.0
        self._journal = Journal(
            ttl_s=self._config.journal_ttl_s, max_bytes=self._config.journal_max_bytes
        )
        self._turns = TurnTaking(self._config, self._caps, emit=self._emit, new_id=self._new_id)
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._user = UserTurns(
            self._config,
            self._caps,
            self._turns,
            emit=self._emit,
            new_id=self._new_id,
        )
        self._inputs = self._user.inputs
        self._credential = ResumeCredential(random_bytes)
        self._last_activity = 0.0
        self._heard_client = False
        self._detached_at: float | None = None
        self._ready = False
        """The engine slot has taken input (its prompt, if any, replayed)."""

    # ----------------------------------------------------------- read-only view

    @property
    def session_id(self) -> str:
        """Server-allocated, never reused."""
        return self._session_id

    @property
    def epoch(self) -> int:
        """The interruption fence; model output of other epochs is dropped."""
        return self._turns.epoch

    @property
    def state(self) -> SessionState:
        """Lifecycle state."""
        return self._state

    @property
    def turn_state(self) -> TurnState:
        """Who holds the floor."""
        return self._turns.turn

    @property
    def generation(self) -> int | None:
        """The attached socket's generation, if one is attached."""
        return self._generation

    @property
    def config(self) -> SessionConfig:
        """Current configuration (``session.update`` replaces it)."""
        return self._config

    @property
    def capabilities(self) -> Capabilities:
        """The model's capabilities."""
        return self._caps

    @property
    def active_response_id(self) -> str | None:
        """The open response, if any."""
        return self._turns.response_id

    @property
    def history(self) -> tuple[HistoryItem, ...]:
        """Conversation items the model's context should hold, oldest first."""
        return self._turns.history.items

    @property
    def input_ms(self) -> float:
        """The input audio clock: model-rate input received, in ms."""
        return self._inputs.input_ms

    def statistics(self) -> SessionStatistics:
        """A frozen snapshot of the counters, the input ledger and the journal."""
        counts = dict(self._counts)
        for key, value in self._user.counts.items():  # ignored_events: the machine's and these
            counts[key] = counts.get(key, 0) + value
        return SessionStatistics(
            **counts,
            **self._turns.counts,
            history_dropped=self._turns.history.dropped,
            input=self._inputs.ledger.statistics(),
            journal=self._journal.statistics(),
        )

    def rule_for(self, event: Event) -> Rule:
        """The table rule that `handle` applies to ``event`` now."""
        kind = type(event)
        rule = self._rules[kind]
        if kind in _TURN_RULED and isinstance(rule, Handle):
            rule = TURN_TABLE.get((self._turns.turn, kind), rule)
        return rule

    def next_deadline(self) -> float | None:
        """When the next timer fires (lease, false interruption, journal TTL), if any."""
        if self._state not in (SessionState.ACTIVE, SessionState.DETACHED):
            return None
        deadlines = [self._last_activity + self._config.idle_ttl_s]
        if self._detached_at is not None:
            deadlines.append(self._detached_at + self._config.disconnect_grace_s)
        for deadline in (
            self._turns.pause_deadline(),
            self._journal.next_deadline(),
            self._user.deadline(),
        ):
            if deadline is not None:
                deadlines.append(deadline)
        return min(deadlines)

    def handle(self, event: Event, now: float, *, generation: int | None = None) -> list[Effect]:
        """Apply one event at time ``now`` (seconds) and return the effects, in order.

        Args:
            event: a client event (from the socket of ``generation``) or a runtime event.
            now: the current time; timers due by then fire first.
            generation: for client events, the socket they came from; events of a
                superseded socket are dropped and counted. ``None``: the current one.

        Returns:
            Effects for the session actor to perform in order. A refused client
            event yields exactly one ``error`` naming its ``event_id``; nothing raises.
        """
        self._now = now
        out: list[Effect] = []
        self._fire_timers(out)
        if type(event) in _CLIENT_TYPES and self._state is SessionState.ACTIVE:
            if generation is not None and generation != self._generation:
                self._counts["stale_client_events"] += 1
                return out
            self._last_activity = now
            self._heard_client = True
        self._sender = generation if generation is not None else self._generation
        rule = self.rule_for(event)
        if isinstance(rule, Ignore):
            self._counts["ignored_events"] += 1
        elif isinstance(rule, Reject):
            self._error(out, rule.error(rule.message), event)
        else:
            try:
                getattr(self, rule.method)(event, out)
            except errors.ProtocolError as exc:  # handlers raise before changing anything
                self._error(out, exc, event)
        if self._turns.response_id is not None:  # idle time counts from the response's end
            self._user.responding()
        return out

    def _emit(self, out: list[Effect], event: ServerEvent) -> None:
        seq = self._journal.append(event, self._now)
        self._counts["events_journaled"] += 1
        if self._generation is not None:
            out.append(Send(event, seq, self._generation))

    def _direct(self, out: list[Effect], event: ServerEvent, generation: int) -> None:
        self._counts["connection_events_sent"] += 1
        out.append(Send(event, None, generation))

    def _error(self, out: list[Effect], exc: errors.ProtocolError, event: object) -> None:
        self._counts["errors"] += 1
        err = ErrorEvent.from_exception(
            exc, getattr(event, "event_id", None), update_refused=isinstance(event, SessionUpdate)
        )
        if self._state is SessionState.ACTIVE:
            self._emit(out, err)
        elif self._sender is not None:
            self._direct(out, err, self._sender)

    def _refuse_socket(
        self, out: list[Effect], exc: errors.ProtocolError, generation: int, reason: str
    ) -> None:
        self._counts["resume_failures"] += 1
        self._direct(out, ErrorEvent.from_exception(exc), generation)
        out.append(CloseConnection(generation, CLOSE_POLICY_VIOLATION, reason))

    def _set_state(self, state: SessionState) -> None:
        self._state = state
        self._rules: dict[type, Rule] = SESSION_TABLE[state]  # looked up once per change

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{self._random_bytes(8).hex()}"

    # ------------------------------------------------------------ timers, leases

    def _fire_timers(self, out: list[Effect]) -> None:
        if self._state not in (SessionState.ACTIVE, SessionState.DETACHED):
            return
        self._journal.expire(self._now)
        detached = self._detached_at
        if detached is not None and self._now >= detached + self._config.disconnect_grace_s:
            self._expire(out, "disconnect_grace_expired")
        elif self._now >= self._last_activity + self._config.idle_ttl_s:
            self._expire(out, "idle_ttl_expired")
        else:
            self._turns.fire_pause_timer(out, now=self._now)
            self._user.play(out, now=self._now)

    def _expire(self, out: list[Effect], reason: str) -> None:
        self._turns.finish(out, "incomplete", "session_expired")
        self._emit(out, SessionExpired(self._session_id, reason))
        self._shutdown(out, CLOSE_GOING_AWAY, reason, expired=True)

    def _shutdown(
        self, out: list[Effect], code: int, reason: str, *, expired: bool = False
    ) -> None:
        if self._generation is not None:
            out.append(CloseConnection(self._generation, code, reason))
        out.append(ReleaseResources(reason, expired))
        self._set_state(SessionState.CLOSED)
        self._generation = None
        self._detached_at = None

    def _on_tick(self, event: Tick, out: list[Effect]) -> None:
        """Timers already ran in `handle`."""

    # -------------------------------------------------- attach, resume, takeover

    def _on_first_attach(self, event: ConnectionAttached, out: list[Effect]) -> None:
        if event.resume is not None:
            self._refuse_resume(out, event.resume, event.generation)
            return
        self._set_state(SessionState.ACTIVE)
        self._generation = event.generation
        self._last_activity = self._now
        token = self._credential.issue()
        created = SessionCreated(
            self._session_id, self._config, self._caps, token, event.generation, self.epoch
        )
        self._direct(out, created, event.generation)
        if self._ready and self._config.announce_ready:
            self._direct(out, SessionReady(self._session_id), event.generation)

    def _on_resume_attach(self, event: ConnectionAttached, out: list[Effect]) -> None:
        resume = event.resume
        if resume is None or event.generation == self._generation:
            exc = errors.IllegalState(
                "this session is attached; send session.resume on a new socket"
            )
            self._refuse_socket(out, exc, event.generation, "illegal_state")
            return
        if resume.session_id != self._session_id or not self._credential.verify(
            resume.resume_token
        ):
            self._refuse_resume(out, resume, event.generation)
            return
        old = self._generation
        if old is not None:
            self._counts["takeovers"] += 1
            self._direct(out, SessionReplaced(self._session_id, event.generation), old)
            out.append(CloseConnection(old, CLOSE_SESSION_REPLACED, "session_replaced"))
        self._counts["session_resumes"] += 1
        self._heard_client = True  # it proved its token: a client that uses this session
        self._set_state(SessionState.ACTIVE)
        self._generation = event.generation
        self._detached_at = None
        self._last_activity = self._now
        token = self._credential.issue()
        replay = self._journal.replay_after(resume.last_received_server_event_seq)
        last = self._journal.last_seq
        count = len(replay.events) if isinstance(replay, Replay) else 0
        resumed = SessionResumed(
            self._session_id, token, event.generation, self.epoch, count, last, self._config
        )
        self._direct(out, resumed, event.generation)
        if isinstance(replay, Replay):
            out.extend(Send(ev, seq, event.generation) for seq, ev in replay.events)
        else:
            resync = SessionResyncRequired(self._session_id, replay.reason, last)
            self._direct(out, resync, event.generation)

    def _on_closed_attach(self, event: ConnectionAttached, out: list[Effect]) -> None:
        if event.resume is not None:
            self._refuse_resume(out, event.resume, event.generation)
            return
        exc = errors.SessionResumeExpired(f"session {self._session_id} has ended")
        self._refuse_socket(out, exc, event.generation, "session_resume_expired")

    def _refuse_resume(self, out: list[Effect], resume: SessionResume, generation: int) -> None:
        """One refusal for every resume that fails (an unknown, ended or expired id, a wrong
        token): what it says never tells a prober which ids exist (`resume_refused`)."""
        exc = resume_refused(resume.session_id, resume.event_id)
        self._refuse_socket(out, exc, generation, "session_resume_expired")

    def _on_detach(self, event: ConnectionDetached, out: list[Effect]) -> None:
        if event.generation != self._generation:
            self._counts["ignored_events"] += 1
            return
        self._generation = None
        if not self._heard_client:  # a socket that opened a session and left: no grace to hold
            self._expire(out, "detached_before_any_event")
            return
        self._set_state(SessionState.DETACHED)
        self._detached_at = self._now

    def _on_session_close(self, event: SessionClose, out: list[Effect]) -> None:
        self._turns.finish(out, "cancelled", "session_closed")
        self._emit(out, SessionClosed(self._session_id, "client_close"))
        self._shutdown(out, CLOSE_NORMAL, "client_close")

    def _on_session_update(self, event: SessionUpdate, out: list[Effect]) -> None:
        config = self._config.apply_update(event.options)
        self._config = config
        self._turns.reconfigure(config)
        self._user.reconfigure(config)
        self._emit(out, SessionUpdated(self._session_id, config))
        if event.options.tools and not self._caps.reply_tools:
            # taken (a tool item still answers), but no function_call will ever come: say so
            self._counts["errors"] += 1
            warning = errors.ToolsNotCallable(
                "session.tools were accepted, but the model that answers cannot call tools: "
                "no function_call will come. Serve a chat checkpoint as the agent's reply "
                "model (duplex serve --llm PATH) to have them called (docs/agent.md).",
                event_id=event.event_id,
                param="session.tools",
            )
            self._emit(out, ErrorEvent.from_exception(warning))

    def _on_event_ack(self, event: EventAck, out: list[Effect]) -> None:
        if event.server_event_seq > self._journal.last_seq:
            raise errors.BadEvent(
                "server_event_seq is past the last event", param="server_event_seq"
            )
        self._journal.ack(event.server_event_seq)

    def _on_audio_append(self, event: AudioAppend, out: list[Effect]) -> None:
        self._user.append(out, event, now=self._now)

    def _on_audio_commit(self, event: AudioCommit, out: list[Effect]) -> None:
        self._user.commit(out)

    def _on_audio_clear(self, event: AudioClear, out: list[Effect]) -> None:
        self._user.clear(out)

    def _on_video_append(self, event: VideoAppend, out: list[Effect]) -> None:
        if not self._caps.supports_video_input:
            raise errors.VideoInputUnsupported("this model takes no video input", param="frame")
        out.append(ModelAppendVideo(self.epoch, event, self.input_ms))

    def _on_speech(self, event: SpeechStarted | SpeechStopped, out: list[Effect]) -> None:
        if isinstance(event, SpeechStarted):
            self._user.speech_started(out, event, now=self._now)
        else:
            self._user.speech_stopped(out, event, now=self._now)

    def _on_speech_pause(self, event: SpeechPaused | SpeechResumed, out: list[Effect]) -> None:
        if isinstance(event, SpeechPaused):
            self._user.speech_paused(out, event)
        else:
            self._user.speech_resumed(out, event)

    # ------------------------------------------------------- responses, playback

    def _on_turn_signal(self, event: TurnSignal, out: list[Effect]) -> None:
        self._turns.turn_signal(out)

    def _on_response_create(self, event: ResponseCreate, out: list[Effect]) -> None:
        if self._config.turn_policy == TurnPolicy.DUPLEX and self._inputs.samples == 0:
            raise errors.InputAudioBufferEmpty("response.create needs input audio first")
        self._user.request_response(out, event.options, now=self._now)

    def _on_item(self, event: ItemEvent, out: list[Effect]) -> None:
        self._user.item(out, event)

    def _on_response_cancel(self, event: ResponseCancel, out: list[Effect]) -> None:
        self._turns.cancel(out, event.response_id)

    def _on_playback_ack(self, event: PlaybackAck, out: list[Effect]) -> None:
        self._turns.ack(out, event)

    def _on_asr_result(self, event: AsrResult, out: list[Effect]) -> None:
        self._user.asr_result(out, event, now=self._now)

    def _on_agent_chunk(self, event: AgentChunk, out: list[Effect]) -> None:
        self._user.agent_chunk(out, event, now=self._now)

    def _on_agent_tool_call(self, event: AgentToolCall, out: list[Effect]) -> None:
        self._user.agent_tool_call(out, event)

    def _on_model_failed(self, event: ModelFailed, out: list[Effect]) -> None:
        self._turns.finish(out, "failed", "engine_error")
        self._emit(out, ErrorEvent.from_exception(errors.EngineError(event.message)))
        self._turns.advance_epoch(out, "engine_failed", clear_input=True)
        self._inputs.ledger.clear()

    def _note_ready(self, event: ModelFrame, out: list[Effect]) -> None:
        """The first frame whose slot takes input next: tell the socket once, if asked to."""
        if self._ready or event.holds_input:
            return
        self._ready = True
        if self._config.announce_ready and self._generation is not None:
            self._direct(out, SessionReady(self._session_id), self._generation)

    def _on_early_frame(self, event: ModelFrame, out: list[Effect]) -> None:
        """A frame before the first socket attached: only its readiness counts."""
        self._counts["ignored_events"] += 1
        self._note_ready(event, out)

    def _on_model_frame(self, event: ModelFrame, out: list[Effect]) -> None:
        self._note_ready(event, out)
        if event.consumed_input_samples:
            self._inputs.ledger.consume(event.consumed_input_samples * 2)
        if event.consumed_video_frame_ids:
            ids = event.consumed_video_frame_ids
            self._emit(out, VideoConsumed(ids, event.latest_video_pts_ms))
        if self._config.turn_policy == TurnPolicy.TURN_BASED:  # the turn responder speaks instead
            self._counts["model_frames_ignored"] += 1
            return
        opened = self._turns.counts["responses_created"]
        self._turns.frame(out, event, now=self._now)
        if self._turns.counts["responses_created"] != opened:
            self._inputs.ledger.answered()
