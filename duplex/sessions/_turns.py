"""Turn-taking: the response lifecycle, overlap policy, output pause and playback.

`SessionMachine` (``_state``) owns one `TurnTaking` and calls it with the
effect list; refusals are raised as `ProtocolError` before anything changes,
and the machine turns them into one ``error`` event. Split from ``_state``
only to keep modules small: the session and turn tables stay in ``_state``.

Invariants kept here:

- ``response.created`` once per response, before its deltas; exactly one
  ``response.done``, whose transcript is the concatenation of its deltas.
- A text-only response (``ResponseSettings.text_only``) sends `TextDelta` s and no audio;
  one past ``max_output_tokens`` text frames ends ``incomplete`` (a new epoch fences
  the rest); an out-of-band one (``conversation: "none"``) never joins the history.
- Model output of another epoch is never sent (the frame is dropped and
  counted); held frames of a cancelled response are dropped and counted.
- A tool call of the agent's reply is a ``function_call`` output item after the
  response's message item (output 1, 2, ...), sent whole when the reply model made it,
  and listed again in ``response.done``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from duplex.exceptions import (
    AudioEndOutOfRange,
    BadEvent,
    IllegalState,
    ItemNotFound,
    PlaybackAckTooLate,
    PlaybackItemNotFound,
    ResponseNotActive,
)

from ._config import (
    Capabilities,
    OverlapPolicy,
    PlaybackCommitPolicy,
    SessionConfig,
    TurnPolicy,
)
from ._effects import Effect, ModelReset
from ._events import (
    AudioDelta,
    FunctionCallDelta,
    FunctionCallDone,
    InputSpeechStarted,
    InputSpeechStopped,
    ItemTruncate,
    ItemTruncated,
    ModelFrame,
    OverlapDecision,
    PlaybackAck,
    PlaybackAcknowledged,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    ServerEvent,
    TextDelta,
    TranscriptDelta,
    audio_ms,
)
from ._generation import ResponseSettings
from ._items import HistoryItem
from ._ledger import History, PlaybackLedger

__all__ = ["STILL_SPEAKING_MS", "TURN_COUNTERS", "TurnState", "TurnTaking"]

STILL_SPEAKING_MS = 40.0
"""Quiet tail (two 20 ms VAD frames) under which a speaker still counts as speaking."""

TURN_COUNTERS = (
    "stale_frames_dropped",
    "held_frames_dropped",
    "responses_created",
    "responses_done",
    "barge_ins",
    "backchannels",
    "pauses",
    "resumes",
    "tool_calls_cut",
)

Emit = Callable[[list[Effect], ServerEvent], None]


class TurnState(enum.Enum):
    """Who holds the floor."""

    LISTENING = "listening"
    RESPONDING = "responding"
    PAUSED = "paused"


@dataclass(slots=True)
class _Response:
    response_id: str
    item_id: str
    epoch: int
    ledger: PlaybackLedger
    settings: ResponseSettings
    calls: list[HistoryItem] = field(default_factory=list)
    open_call: str | None = None
    """The agent's ``call_id`` of the last call while its arguments still stream."""


class TurnTaking:
    """One session's floor. Methods that can pause output take ``now`` from the machine;
    the input clock arrives with each append (`input_advanced`).

    Args:
        config: the session config (the machine replaces it on ``session.update``).
        capabilities: the model's capabilities.
        emit: journals and sends one server event (the machine's ``_emit``).
        new_id: makes ``<prefix>_<hex>`` ids from the injected randomness.
    """

    def __init__(
        self,
        config: SessionConfig,
        capabilities: Capabilities,
        *,
        emit: Emit,
        new_id: Callable[[str], str],
    ) -> None:
        self.config = config
        self.capabilities = capabilities
        self.input_ms = 0.0
        self.speech_ms = 0.0
        self.turn = TurnState.LISTENING
        self.epoch = 0
        self.history = History(config.max_history_items)
        self.speech_active = False
        self.counts = dict.fromkeys(TURN_COUNTERS, 0)
        self._emit = emit
        self._new_id = new_id
        self._order = 0
        self._response: _Response | None = None
        self._ledgers: dict[str, PlaybackLedger] = {}
        self._overlap_start: float | None = None
        self._paused_at: float | None = None
        self._held: list[ModelFrame] = []
        self._requested: ResponseSettings | None = None  # for the next response the model opens

    @property
    def response_id(self) -> str | None:
        """The open response, if any."""
        return self._response.response_id if self._response else None

    def next_order(self) -> int:
        """Position of a new history item (user turns and responses share it)."""
        self._order += 1
        return self._order

    # ------------------------------------------------------------------- history
    # The history's one writer: the user turns and the conversation's item events change it
    # through these (docs/architecture.md, "Who owns which state").

    def add_user_item(self, item_id: str, audio_ms: float) -> None:
        """A closed user turn, at the end of the conversation."""
        self.history.add_user(item_id, self.next_order(), audio_ms)

    def insert_item(self, item: HistoryItem) -> None:
        """A client-created item, at its order."""
        self.history.insert(item)

    def remove_item(self, item_id: str) -> bool:
        return self.history.remove(item_id)

    def set_item_text(self, item_id: str, text: str) -> bool:
        """A user item's transcript (or its failure's text)."""
        return self.history.set_text(item_id, text)

    # ------------------------------------------------------------------- epoch

    def advance_epoch(self, out: list[Effect], reason: str, *, clear_input: bool) -> None:
        """Fence off in-flight model output: later frames must carry the new epoch."""
        self.epoch += 1
        out.append(ModelReset(self.epoch, reason, clear_input))

    # ------------------------------------------------------------ speech, overlap

    def pause_deadline(self) -> float | None:
        """When paused output resumes if no real user turn comes (speech must have ended)."""
        if self.turn is not TurnState.PAUSED or self.speech_active or self._paused_at is None:
            return None
        return self._paused_at + self.config.false_interruption_timeout_s

    def reconfigure(self, config: SessionConfig) -> None:
        """Take the config of a ``session.update``."""
        self.config = config

    def input_advanced(self, input_ms: float, speech_ms: float) -> None:
        """New input audio: the input clock, and where the latest speech ended on it."""
        self.input_ms = input_ms
        self.speech_ms = speech_ms

    def reset_speech(self) -> None:
        """Input was cleared: forget the speech segment and the overlap."""
        self.speech_active = False
        self._overlap_start = None

    @property
    def turn_based(self) -> bool:
        """``turn_policy="turn_based"``: responses only on request; no overlap policy."""
        return self.config.turn_policy == TurnPolicy.TURN_BASED

    def speech_started(
        self,
        out: list[Effect],
        at_ms: float,
        *,
        shown_ms: float | None = None,
        item_id: str = "",
        now: float,
    ) -> bool:
        """A VAD saw speech start at ``at_ms``; ``False`` if already inside speech (ignored).

        ``shown_ms`` is the padded start sent to the client (default ``at_ms``).
        Duplex: an overlap with a response starts (``overlap_policy``).
        Turn-based: ``vad_interrupt_response`` cancels the response (``turn_detected``).
        """
        if self.speech_active:
            return False
        self.speech_active = True
        self._emit(out, InputSpeechStarted(at_ms if shown_ms is None else shown_ms, item_id))
        if self._response is None:
            return True
        if not self.turn_based or (
            self.capabilities.agent_cascade and self.config.vad_interrupt_response
        ):  # the agent's replies follow the overlap policy: a backchannel does not interrupt
            self._start_overlap(out, at_ms, now=now)
        elif self.config.vad_interrupt_response:
            self.counts["barge_ins"] += 1
            self.finish(out, "cancelled", "turn_detected")
            self.advance_epoch(out, "turn_detected", clear_input=False)
        return True

    def speech_stopped(
        self, out: list[Effect], at_ms: float, *, item_id: str = "", now: float
    ) -> bool:
        """A VAD saw speech end: classify the overlap (backchannel / listen / barge-in).

        Returns ``False`` if no speech was active (ignored).
        """
        if not self.speech_active:
            return False
        self.speech_active = False
        self._emit(out, InputSpeechStopped(at_ms, item_id))
        start, self._overlap_start = self._overlap_start, None
        if start is None or self._response is None:
            self.fire_pause_timer(out, now=now)
            return True
        overlap = max(0.0, at_ms - start)
        if self.config.overlap_policy is OverlapPolicy.BARGE_IN_ON_SPEECH:
            if overlap >= self.config.barge_in_ms:
                self.barge_in(out, "speech_over_barge_in_ms", overlap)
            elif overlap < self.config.short_ack_ms:
                self.counts["backchannels"] += 1
                self._decide(out, "drop", "backchannel", overlap)
            else:
                self._decide(out, "listen", "short_overlap", overlap)
        self.fire_pause_timer(out, now=now)
        return True

    def check_overlap(self, out: list[Effect]) -> None:
        """Barge in once ongoing speech over output reaches ``barge_in_ms`` of input audio."""
        start = self._overlap_start
        if (
            start is None
            or not self.speech_active
            or self._response is None
            or self.config.overlap_policy is not OverlapPolicy.BARGE_IN_ON_SPEECH
        ):
            return
        overlap = self.speech_ms - start
        if overlap >= self.config.barge_in_ms:
            self.barge_in(out, "speech_over_barge_in_ms", overlap)

    def turn_signal(self, out: list[Effect]) -> None:
        """A client-side barge-in (``turn.signal``)."""
        if not self.capabilities.supports_barge_in:
            raise IllegalState("this model does not support barge-in", param="event")
        if self._response is None:
            self._decide(out, "drop", "no_active_response", 0.0)
            return
        start = self._overlap_start
        overlap = self.speech_ms - start if start is not None else 0.0
        self.barge_in(out, "client_turn_signal", overlap)

    def barge_in(self, out: list[Effect], reason: str, overlap_ms: float) -> None:
        """Interrupt: decision, ``response.done`` cancelled/barge_in, new epoch."""
        self.counts["barge_ins"] += 1
        self._decide(out, "barge_in", reason, overlap_ms)
        self.finish(out, "cancelled", "barge_in")
        self.advance_epoch(out, "barge_in", clear_input=False)

    def fire_pause_timer(self, out: list[Effect], *, now: float) -> None:
        """Resume paused output if the false-interruption timeout has passed."""
        deadline = self.pause_deadline()
        if deadline is not None and now >= deadline:
            self._resume_output(out, "false_interruption", now=now)

    def _start_overlap(self, out: list[Effect], at_ms: float, *, now: float) -> None:
        self._overlap_start = at_ms
        policy = self.config.overlap_policy
        if policy is OverlapPolicy.IGNORE:
            self._decide(out, "drop", "overlap_policy_ignore", 0.0)
        elif policy is OverlapPolicy.MODEL:
            self._decide(out, "listen", "model_decides", 0.0)
        elif self.config.false_interruption_enabled and self.turn is TurnState.RESPONDING:
            self.counts["pauses"] += 1
            self._decide(out, "pause", "speech_started", 0.0)
            self.turn = TurnState.PAUSED
            self._paused_at = now
        self.check_overlap(out)

    def _decide(self, out: list[Effect], action: str, reason: str, overlap_ms: float) -> None:
        decision = OverlapDecision(  # the event carries the wire name, a plain string
            self.config.overlap_policy.value, action, reason, round(overlap_ms, 1), self.response_id
        )
        self._emit(out, decision)

    # --------------------------------------------------------------- responses

    def cancel(self, out: list[Effect], response_id: str | None) -> None:
        """``response.cancel``: done cancelled/client_cancelled and a new epoch."""
        if self._response is None or response_id not in (None, self._response.response_id):
            raise ResponseNotActive("that response is not active", param="response_id")
        self.finish(out, "cancelled", "client_cancelled")
        self.advance_epoch(out, "response_cancelled", clear_input=False)

    def finish(self, out: list[Effect], status: str, reason: str) -> None:
        """Close the open response (if any) with its one ``response.done``."""
        resp = self._response
        if resp is None:
            return
        self._close_call(out, resp, complete=False)
        self.counts["held_frames_dropped"] += len(self._held)
        self.counts["responses_done"] += 1
        self._held = []
        self._response = None
        self.turn = TurnState.LISTENING
        self._overlap_start = None
        self._paused_at = None
        ledger = resp.ledger
        ledger.done = True
        ledger.status = "completed" if status == "completed" else "incomplete"
        done = ResponseDone(
            resp.response_id,
            resp.item_id,
            resp.epoch,
            status,
            reason,
            ledger.transcript,
            ledger.sent_ms,
            resp.settings,
            tuple(resp.calls),
        )
        self._emit(out, done)
        commit_all = self.config.playback_commit_policy is PlaybackCommitPolicy.COMMIT_ALL_ON_DONE
        if (commit_all or ledger.text_only) and (  # text is not played: nothing to ack
            ledger.sent_ms > 0 or ledger.transcript
        ):
            ledger.committed_ms = ledger.sent_ms
            self.history.commit_assistant(ledger)
        else:  # an item already committed by acks takes the response's final status
            self.history.commit_assistant(ledger, insert=False)

    def frame(self, out: list[Effect], frame: ModelFrame, *, now: float) -> None:
        """Project one model frame: fence by epoch, hold while paused, else send."""
        if frame.epoch != self.epoch:
            self.counts["stale_frames_dropped"] += 1
            return
        if self.turn is TurnState.PAUSED and len(self._held) >= self.config.max_held_frames:
            self._resume_output(out, "hold_overflow", now=now)
        self._route(out, frame, now=now)

    def function_call(
        self, out: list[Effect], name: str, arguments: str, call_id: str, *, done: bool = True
    ) -> None:
        """A piece of a tool call of the open response. A new ``call_id`` opens the response's
        next output item, a ``function_call`` (``call_id`` empty: one is made); each piece adds
        ``arguments`` text; ``done`` closes it and puts it in the history at once (unless the
        response is out of band). A new call while one is open cuts that one off
        (`_close_call`)."""
        resp = self._response
        if resp is None:
            return
        opens = resp.open_call is None or resp.open_call != call_id
        if opens:
            self._close_call(out, resp, complete=False)
            resp.calls.append(
                HistoryItem(
                    self._new_id("item"),
                    "assistant",
                    self.next_order(),
                    0.0,
                    "",
                    "function_call",
                    call_id=call_id or self._new_id("call"),
                    name=name,
                )
            )
            resp.open_call = call_id
        item = resp.calls[-1]
        if arguments:
            item = dataclasses.replace(item, text=item.text + arguments)
            resp.calls[-1] = item
        if opens or arguments:
            self._emit(
                out,
                FunctionCallDelta(
                    resp.response_id,
                    resp.epoch,
                    len(resp.calls),  # the message item is output 0
                    item,
                    arguments,
                    opens,
                    resp.settings.in_conversation,
                ),
            )
        if done:
            self._close_call(out, resp, complete=True)

    def _close_call(self, out: list[Effect], resp: _Response, *, complete: bool) -> None:
        """Close the call still streaming, if any. A complete one joins the conversation; one
        cut off (the response ended, or another call began, before its last piece) stays an
        output of the response but not in the history: its arguments may not even parse."""
        if resp.open_call is None:
            return
        resp.open_call = None
        item = resp.calls[-1]
        in_conversation = resp.settings.in_conversation
        if complete and in_conversation:
            self.history.insert(item)
        if not complete:
            self.counts["tool_calls_cut"] += 1
        self._emit(
            out,
            FunctionCallDone(
                resp.response_id, resp.epoch, len(resp.calls), item, in_conversation, complete
            ),
        )

    def request(self, settings: ResponseSettings) -> None:
        """A ``response.create`` to the model (duplex): the next response it opens runs
        with ``settings``."""
        self._requested = settings

    def open_response(self, out: list[Effect], settings: ResponseSettings, *, now: float) -> str:
        """Open a response now (the turn responder's request); returns its id."""
        self._requested = settings
        self._open(out, now=now)
        assert self._response is not None
        return self._response.response_id

    def user_speaking_now(self) -> bool:
        """Speech is active and not just in the VAD's hangover: the newest input was loud.

        A response that opens while the user has already gone quiet (but the VAD is still
        waiting out its hangover) is not an overlap.
        """
        return self.speech_active and self.input_ms - self.speech_ms <= STILL_SPEAKING_MS

    def _open(self, out: list[Effect], *, now: float) -> None:
        settings, self._requested = self._requested or self.config.response_settings(), None
        response_id = self._new_id("resp")
        ledger = PlaybackLedger(response_id, f"item_{response_id}", self.next_order())
        ledger.text_only, ledger.out_of_band = settings.text_only, not settings.in_conversation
        self._ledgers[response_id] = ledger
        while len(self._ledgers) > self.config.max_tracked_responses:
            del self._ledgers[next(iter(self._ledgers))]
        self._response = _Response(response_id, ledger.item_id, self.epoch, ledger, settings)
        self.turn = TurnState.RESPONDING
        self.counts["responses_created"] += 1
        self._emit(out, ResponseCreated(response_id, ledger.item_id, self.epoch, settings))
        if self.user_speaking_now() and not self.turn_based:
            self._start_overlap(out, self.input_ms, now=now)

    def _route(self, out: list[Effect], frame: ModelFrame, *, now: float) -> None:
        if self.turn is TurnState.PAUSED:
            self._held.append(frame)
            return
        if not frame.speaking:
            if self._response is not None:
                reason = "end_of_turn" if frame.end_of_turn else "model_listen"
                self._yield(out, "turn_detected" if self.speech_active else reason)
            return
        if self._response is None:
            self._open(out, now=now)
            if self.turn is TurnState.PAUSED:
                self._held.append(frame)
                return
        resp = self._response
        if resp is None:  # opening barged in at once; the frame belongs to the old epoch
            self.counts["stale_frames_dropped"] += 1
            return
        rate = self.config.model_sample_rate
        rid, item, epoch = resp.response_id, resp.item_id, resp.epoch
        if resp.settings.text_only:  # the frame's audio is not sent: only its text
            resp.ledger.record(0.0, frame.text)
            if frame.text:
                self._emit(out, TextDelta(rid, item, epoch, frame.text))
        else:
            start = resp.ledger.record(audio_ms(frame.pcm, rate), frame.text)
            if frame.pcm:
                self._emit(out, AudioDelta(rid, item, epoch, frame.pcm, rate, start))
            if frame.text:
                self._emit(out, TranscriptDelta(rid, item, epoch, frame.text, start))
        limit = resp.settings.max_output_tokens
        if limit is not None and resp.ledger.text_frames >= limit and not frame.end_of_turn:
            self.finish(out, "incomplete", "max_output_tokens")  # the rest is fenced off
            self.advance_epoch(out, "max_output_tokens", clear_input=False)
        elif frame.end_of_turn:
            self._yield(out, "end_of_turn")

    def _yield(self, out: list[Effect], reason: str) -> None:
        self.finish(out, "completed", reason)
        self._emit(out, ResponseListen(self.epoch, reason))

    def _resume_output(self, out: list[Effect], reason: str, *, now: float) -> None:
        start = self._overlap_start
        self.counts["resumes"] += 1
        self._decide(out, "resume", reason, self.speech_ms - start if start is not None else 0.0)
        self.turn = TurnState.RESPONDING if self._response else TurnState.LISTENING
        self._paused_at = None
        held, self._held = self._held, []
        for frame in held:
            if frame.epoch == self.epoch:
                self._route(out, frame, now=now)
            else:
                self.counts["held_frames_dropped"] += 1

    # ---------------------------------------------------------------- playback

    def item_deleted(self, item_id: str) -> None:
        """The client deleted ``item_id``: its response's item never comes back (acks and
        truncates of it are refused)."""
        for ledger in self._ledgers.values():
            if ledger.item_id == item_id:
                ledger.deleted = True

    def _ledger_of_item(self, item_id: str) -> PlaybackLedger | None:
        return next(
            (x for x in self._ledgers.values() if x.item_id == item_id and not x.deleted), None
        )

    def ack(self, out: list[Effect], event: PlaybackAck) -> None:
        """``playback.ack``: advance the ledger; under ``ack_only`` commit to history.

        Raises:
            PlaybackItemNotFound: no tracked response has that id, its item was
                deleted, or ``item_id`` is not its item.
            PlaybackAckTooLate: ``ack_only`` and a newer user turn is in the history.
        """
        ledger = self._ledgers.get(event.response_id)
        if ledger is None:
            raise PlaybackItemNotFound("no such response", param="response_id")
        if ledger.deleted:
            raise PlaybackItemNotFound("the response's item was deleted", param="response_id")
        if event.item_id is not None and event.item_id != ledger.item_id:
            raise PlaybackItemNotFound("item_id does not match the response", param="item_id")
        played = min(max(ledger.played_ms, float(event.played_ms)), ledger.sent_ms)
        if (
            self.config.playback_commit_policy is PlaybackCommitPolicy.ACK_ONLY
            and played > ledger.committed_ms
        ):
            if self.history.has_user_after(ledger.order):
                raise PlaybackAckTooLate(
                    "a newer user turn is already in the history", param="played_ms"
                )
            ledger.committed_ms = played
            self.history.commit_assistant(ledger)
        ledger.played_ms = played
        acked = PlaybackAcknowledged(
            ledger.response_id,
            ledger.item_id,
            ledger.played_ms,
            ledger.committed_ms,
            ledger.generated_ms,
            ledger.sent_ms,
            ledger.committed_ms > 0,
        )
        self._emit(out, acked)

    def truncate(self, out: list[Effect], event: ItemTruncate) -> None:
        """``conversation.item.truncate``: the client heard ``audio_end_ms`` of an assistant item.

        The playback ledger moves to it (played and committed) and the history
        keeps that much audio and the transcript spoken before it. Truncating the
        item of the active response cancels the response first (the client
        stopped playing it).

        Raises:
            ItemNotFound: no tracked assistant audio item has that id (or it was deleted).
            BadEvent: ``content_index`` is not 0 (items have one content part).
            AudioEndOutOfRange: ``audio_end_ms`` is past the audio sent for the item.
        """
        ledger = self._ledger_of_item(event.item_id)
        if ledger is None:
            raise ItemNotFound(
                f"no assistant audio item {event.item_id!r} (or no longer tracked)",
                param="item_id",
            )
        if event.content_index != 0:
            raise BadEvent("assistant items have one content part (0)", param="content_index")
        if event.audio_end_ms > round(ledger.sent_ms):
            raise AudioEndOutOfRange(
                f"audio_end_ms {event.audio_end_ms} is past the item's "
                f"{round(ledger.sent_ms)} ms of audio",
                param="audio_end_ms",
            )
        if self._response is not None and self._response.item_id == event.item_id:
            self.finish(out, "cancelled", "client_cancelled")
            self.advance_epoch(out, "response_cancelled", clear_input=False)
        ledger.played_ms = ledger.committed_ms = float(event.audio_end_ms)
        self.history.commit_assistant(ledger)
        self._emit(out, ItemTruncated(event.item_id, 0, event.audio_end_ms))
