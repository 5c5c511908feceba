"""The user's side of turn taking: input, turn detection, commits and response requests.

`SessionMachine` (``_state``) owns one `UserTurns` next to its `TurnTaking`
(the floor, responses and playback) and calls it with the effect list. Split
from ``_state`` only to keep modules small; the session and turn tables stay there.

Turn detection (``SessionConfig.turn_detection``):

- ``none``: no speech events (a VAD actor's are ignored and counted); the
  client commits (``input_audio_buffer.commit``) and asks (``response.create``).
- ``server_vad``: speech boundaries come from the built-in energy VAD
  (``vad="energy"``) or from outside (``vad="external"``, or ``"silero"``: the
  session actor's link to the shared silero VAD, ``runtime/_vad_link.py``), as
  `SpeechStarted`/`SpeechStopped` runtime events with unpadded input-clock times.
  ``speech_started`` shows the start minus ``vad_prefix_padding_ms`` (not
  before the uncommitted buffer, not below 0) and names the user item the
  speech becomes; with ``vad_create_response`` a stop commits that span
  (``[padded start, stop)``; what follows stays in the buffer) and requests a
  response; ``vad_idle_timeout_ms`` of input audio with no speech, turn or
  response commits the silence after ``input_audio_buffer.timeout_triggered``.

A response request is a `ModelSignal` for the model; under ``turn_based`` the
turn responder (``_responder``) answers the newest user item itself.

With the agent cascade (``Capabilities.agent_cascade``, turn-based sessions) the runtime
hears and answers instead: speech start asks it to transcribe the pending user item
(`Transcribe`), the commit closes that transcript, and its `AsrResult` s become the
item's transcript (and ``input_audio_transcription`` events when transcription is on).
A response opens at once; its `AgentReply` goes out once the transcript it answers is
final, and the reply's `AgentChunk` s stream through the responder, paced in real time.

Prepared replies (``vad_prepare_ms``): a `SpeechPaused` (speech quiet that long, the
turn not yet over) asks for the transcript so far (a provisional `Transcribe`) and then
for a reply to it, under an id of its own; its chunks are kept, not sent. If the turn is
committed where the pause began and its final transcript is the one answered, the
response plays them at once (no wait for the ASR, the reply model and the TTS after the
commit); otherwise (`SpeechResumed`, another end, another transcript, a changed setting
or conversation, a new epoch) the prepared reply is cancelled (`CancelReply`) and counted,
and the turn is answered as usual. Nothing of a prepared reply reaches the client unless
the turn it answers is committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from duplex import exceptions as errors

from ._config import Capabilities, SessionConfig, TurnPolicy
from ._conversation import Conversation
from ._effects import AgentReply, CancelReply, Effect, ModelAppendAudio, ModelSignal, Transcribe
from ._events import (
    AgentChunk,
    AgentToolCall,
    AsrResult,
    AudioAppend,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeout,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    ItemCreate,
    ItemDelete,
    ItemDeleted,
    ItemRetrieve,
    ItemRetrieved,
    ItemTruncate,
    ServerEvent,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
)
from ._generation import FunctionTool, ResponseOptions, ResponseSettings
from ._input import InputPath
from ._items import HistoryItem
from ._responder import TurnResponder
from ._turns import TurnTaking

__all__ = ["USER_TURN_COUNTERS", "ItemEvent", "UserTurns"]

USER_TURN_COUNTERS = (
    "ignored_events",
    "auto_turns_skipped",
    "responder_frames_dropped",
    "agent_chunks_dropped",
    "transcripts_dropped",
    "replies_prepared",
    "prepared_replies_used",
    "prepared_replies_discarded",
)
TRANSCRIPTION_FAILED = (
    "transcription_failed",
    "The transcription of this turn failed: the speech recognizer was lost or overloaded "
    "mid-turn. The item keeps what was heard before; the next turn is transcribed.",
)
"""The ``error`` code and message of ``input_audio_transcription.failed``."""
MAX_TRANSCRIBING = 16
"""User items whose transcript may be pending at once; beyond it the oldest is forgotten
(its late result is dropped and counted)."""
"""Counted here; the machine adds ``ignored_events`` to its own in `SessionMachine.statistics`."""

Emit = Callable[[list[Effect], ServerEvent], None]
_Awaiting = tuple[str, str, ResponseSettings, tuple[str, ...] | None, tuple[FunctionTool, ...]]
ItemEvent = ItemCreate | ItemRetrieve | ItemDelete | ItemTruncate


@dataclass(eq=False, slots=True)
class _Prepared:
    """A reply prepared at a pause in the user's speech (module docstring)."""

    item_id: str
    end_ms: float
    reply_id: str
    epoch: int
    settings: ResponseSettings
    tools: tuple[FunctionTool, ...]
    before: tuple[str, ...]
    """The conversation's item ids it answers after (the turn's own item comes last)."""
    text: str | None = None
    """The transcript it answers (``None``: not asked yet)."""
    response_id: str | None = None
    """The response that took it (its chunks go there once released)."""
    released: bool = False
    chunks: list[AgentChunk | AgentToolCall] = field(default_factory=list)


class UserTurns:
    """Input, turn detection and requests for one session; ``now`` comes from the machine.

    Args:
        config: the session config (the machine replaces it on ``session.update``).
        capabilities: the model's capabilities (the responder's frame period).
        turns: the session's turn taking (the floor and responses).
        emit: journals and sends one server event (the machine's ``_emit``).
        new_id: makes ``<prefix>_<hex>`` ids.
    """

    def __init__(
        self,
        config: SessionConfig,
        capabilities: Capabilities,
        turns: TurnTaking,
        *,
        emit: Emit,
        new_id: Callable[[str], str],
    ) -> None:
        self.config = config
        self.inputs = InputPath(config)
        self.turns = turns
        self.conversation = Conversation(
            turns,
            new_id=new_id,
            model_rate=config.model_sample_rate,
        )
        self.responder = TurnResponder(config.model_sample_rate, capabilities.chunk_period_ms)
        self.counts = dict.fromkeys(USER_TURN_COUNTERS, 0)
        self.turn_id = 0
        self._emit = emit
        self._new_id = new_id
        self._pending_item: str | None = None  # the user item the current speech becomes
        self._speech_start_ms = 0.0  # padded start of the current speech (input clock)
        self._idle_from_ms = 0.0  # the idle timeout counts input audio from here
        self._agent = capabilities.agent_cascade
        self._heard: dict[str, str] = {}  # item id -> transcript sent as deltas (pending ASR)
        self._failed: dict[str, str] = {}
        """Items whose transcription failed (told ``failed``: final, never asked again),
        with what was heard before: their text once committed."""
        self._awaiting: _Awaiting | None = None
        """(item id, response id, settings, input ids, tools): a response waiting on the
        item's transcript."""
        self._prepared: _Prepared | None = None
        self._committed_end: dict[str, float] = {}
        """The newest committed item: its end (on a sample: within a millisecond of the
        VAD's stop, where a prepared reply's pause began)."""

    @property
    def hears(self) -> bool:
        """The agent cascade transcribes this session's user turns."""
        return self._agent and self.turn_based

    @property
    def turn_based(self) -> bool:
        """``turn_policy="turn_based"``."""
        return self.config.turn_policy == TurnPolicy.TURN_BASED

    def reconfigure(self, config: SessionConfig) -> None:
        """Take a new config; a restarted VAD forgets the speech in progress."""
        self.config = config
        if self.inputs.reconfigure(config) and self.turns.speech_active:
            self.turns.reset_speech()
            self._pending_item = None

    def deadline(self) -> float | None:
        """When the responder's next frame is due, if any."""
        return self.responder.deadline()

    def responding(self) -> None:
        """A response is open: idle time counts from now on."""
        self._idle_from_ms = self.inputs.input_ms

    # --------------------------------------------------------------------- input

    def append(self, out: list[Effect], event: AudioAppend, *, now: float) -> None:
        """``input_audio_buffer.append``: resample, detect speech, feed the model."""
        pcm, start_ms, speech = self.inputs.append(event)
        self.turns.input_advanced(self.inputs.input_ms, self.inputs.speech_ms)
        for found in speech:
            if isinstance(found, SpeechStarted):
                self.speech_started(out, found, now=now)
            else:
                self.speech_stopped(out, found, now=now)
        self.turns.check_overlap(out)
        if pcm.size:
            out.append(ModelAppendAudio(self.turns.epoch, pcm, start_ms))
        self._check_idle(out, now=now)

    def commit(
        self,
        out: list[Effect],
        start_ms: float | None = None,
        end_ms: float | None = None,
        item_id: str | None = None,
    ) -> None:
        """Close the user turn into a history item (raises before changing anything)."""
        start, end, pcm = self.inputs.commit(start_ms, end_ms, count_turn=not self.turn_based)
        self.turn_id += 1
        item_id = item_id or self._pending_item or self._new_id("item")
        self._pending_item = None
        previous = self.conversation.last_item_id()
        self.conversation.add_user_audio(item_id, end - start, pcm, start)
        self._committed_end = {item_id: end}
        self._emit(out, InputAudioCommitted(item_id, self.turn_id, end, previous))
        if self.hears:
            self._transcribe(out, Transcribe(item_id, start, end))
        out.append(ModelSignal(self.turns.epoch, "commit", self.turn_id))
        self._idle_from_ms = max(self._idle_from_ms, end)
        if self.turns.speech_active:  # speech goes on: it becomes another item
            self._pending_item = self._new_id("item")

    def clear(self, out: list[Effect]) -> None:
        """``input_audio_buffer.clear``: cancel, fence, drop the buffer."""
        self.turns.reset_speech()
        self.turns.finish(out, "cancelled", "input_cleared")
        self.turns.advance_epoch(out, "input_cleared", clear_input=True)
        self.inputs.clear()
        if self._pending_item is not None:  # its speech is gone: no transcript comes
            self._heard.pop(self._pending_item, None)
        self._discard(out)  # (the new epoch cancels it in the runtime too)
        self._pending_item = None
        self._idle_from_ms = self.inputs.input_ms
        self._emit(out, InputAudioCleared(self.turns.epoch))

    def item(self, out: list[Effect], event: ItemEvent) -> None:
        """``conversation.item.create|retrieve|delete|truncate`` (raise before changing)."""
        match event:
            case ItemCreate():
                self._emit(out, self.conversation.create(event, self.config.input_sample_rate))
            case ItemRetrieve():
                self._emit(out, ItemRetrieved(self.conversation.get(event.item_id)))
            case ItemDelete():
                self.conversation.delete(event.item_id)
                self.turns.item_deleted(event.item_id)
                self._emit(out, ItemDeleted(event.item_id))
            case ItemTruncate():
                self.turns.truncate(out, event)

    # ------------------------------------------------------------ turn detection

    def speech_started(self, out: list[Effect], event: SpeechStarted, *, now: float) -> None:
        """A VAD (built in or external) saw speech start."""
        if not self.config.vad_enabled or self.turns.speech_active:
            self.counts["ignored_events"] += 1  # no turn detection, or already inside speech
            return
        padded = event.audio_ms - self.config.vad_prefix_padding_ms
        self._speech_start_ms = max(0.0, padded, self.inputs.buffer_start_ms)
        self._pending_item = self._pending_item or self._new_id("item")
        self.turns.speech_started(
            out, event.audio_ms, shown_ms=self._speech_start_ms, item_id=self._pending_item, now=now
        )
        if self.hears:
            self._transcribe(out, Transcribe(self._pending_item, self._speech_start_ms))

    def speech_stopped(self, out: list[Effect], event: SpeechStopped, *, now: float) -> None:
        """A VAD saw speech end; with ``vad_create_response`` the turn is committed and answered."""
        item_id = self._pending_item or ""
        if not self.config.vad_enabled or not self.turns.speech_stopped(
            out, event.audio_ms, item_id=item_id, now=now
        ):
            self.counts["ignored_events"] += 1  # no turn detection, or no speech to stop
            return
        self._idle_from_ms = max(self._idle_from_ms, event.audio_ms)
        if self.config.vad_create_response:
            self._auto_turn(out, self._speech_start_ms, event.audio_ms, item_id or None, now=now)

    def speech_paused(self, out: list[Effect], event: SpeechPaused) -> None:
        """Speech paused for ``vad_prepare_ms``: prepare the reply to the turn so far."""
        item_id = self._pending_item
        if (
            not self.hears
            or not self.config.vad_create_response
            or not self.config.vad_prepare_ms
            or not self.turns.speech_active
            or item_id is None
            or item_id in self._failed  # its transcription failed: nothing more to hear
            or self.turns.response_id is not None  # speech over a reply: the overlap policy's
        ):
            self.counts["ignored_events"] += 1
            return
        self._discard(out)
        settings = self.config.response_settings(None)
        tools = () if settings.tool_choice == "none" else self.config.tools
        before = tuple(item.item_id for item in self.turns.history.items)
        self._prepared = _Prepared(
            item_id, event.audio_ms, self._new_id("prep"), self.turns.epoch, settings, tools, before
        )
        out.append(Transcribe(item_id, self._speech_start_ms, event.audio_ms, provisional=True))

    def speech_resumed(self, out: list[Effect], event: SpeechResumed) -> None:
        """Speech came back after a pause: the reply prepared at it is not needed."""
        if self._prepared is None or self._prepared.response_id is not None:
            self.counts["ignored_events"] += 1
            return
        self._discard(out)

    def _discard(self, out: list[Effect]) -> None:
        """Drop the prepared reply (cancelled in the runtime if it was asked for)."""
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared.released:
            return
        self.counts["prepared_replies_discarded"] += 1
        if prepared.text is not None:
            out.append(CancelReply(prepared.reply_id))

    def _check_idle(self, out: list[Effect], *, now: float) -> None:
        timeout = self.config.vad_idle_timeout_ms
        if (
            not timeout
            or not self.config.vad_enabled
            or self.turns.speech_active
            or self.turns.response_id is not None
        ):
            return
        start = max(self._idle_from_ms, self.inputs.buffer_start_ms)
        end = self.inputs.input_ms
        if end - start < timeout:
            return
        item_id = self._new_id("item")
        self._idle_from_ms = end
        self._emit(out, InputAudioTimeout(start, end, item_id))
        self._auto_turn(out, start, end, item_id, now=now)

    def _auto_turn(
        self, out: list[Effect], start: float, end: float, item_id: str | None, *, now: float
    ) -> None:
        """Commit and (with ``vad_create_response``) request; skipped and counted if refused."""
        try:
            self.commit(out, start, end, item_id)
            if self.config.vad_create_response:
                self.request_response(out, now=now)
        except errors.ProtocolError:  # empty buffer, backpressure, already responding
            self.counts["auto_turns_skipped"] += 1

    # ----------------------------------------------------------------- responses

    def request_response(
        self, out: list[Effect], options: ResponseOptions | None = None, *, now: float
    ) -> None:
        """Duplex: hint the model. Turn-based: the responder answers the newest user or
        tool item (of ``options.input`` when given, else of the conversation).

        Raises:
            ResponseAlreadyActive: turn-based and a response is open.
            InputAudioBufferEmpty: turn-based and there is no user or tool item to answer.
            ItemNotFound: ``options.input`` names no item.
        """
        settings = self.config.response_settings(options)
        source = None
        if self.turn_based:
            if self.turns.response_id is not None:
                raise errors.ResponseAlreadyActive("a response is already active")
            only = options.input if options is not None else None
            source = self.conversation.latest_source(only)
            if source is None:
                raise errors.InputAudioBufferEmpty(
                    "response.create needs a user or tool item first"
                )
        out.append(ModelSignal(self.turns.epoch, "response_create", self.turn_id))
        if source is None:
            self.turns.request(settings)
            return
        response_id = self.turns.open_response(out, settings, now=now)
        self.inputs.ledger.answered()
        if not self._agent:
            self.responder.start(source, self.turns.epoch, response_id, now)
            self.play(out, now=now)
            return
        self.responder.start_stream(self.turns.epoch, response_id, now)
        only = options.input if options is not None else None
        tools = self.config.tools
        if options is not None and options.tools is not None:
            tools = options.tools
        if settings.tool_choice == "none":
            tools = ()
        prepared = self._prepared
        if prepared is not None and not (
            not prepared.released  # (one already played answers nothing more)
            and options is None
            and prepared.item_id == source.item_id
            and abs(prepared.end_ms - self._committed_end.get(source.item_id, -1.0)) < 1.0
            and prepared.epoch == self.turns.epoch
            and prepared.settings == settings
            and prepared.tools == tools
            and (*prepared.before, source.item_id)
            == tuple(item.item_id for item in self.turns.history.items)
        ):
            self._discard(out)  # it answers another turn, conversation or setting
            prepared = None
        if prepared is not None:
            prepared.response_id = response_id
        if source.item_id in self._heard:  # its transcript is still coming
            self._awaiting = (source.item_id, response_id, settings, only, tools)
        else:
            self._reply(out, response_id, settings, only, tools, now=now)

    # ------------------------------------------------------------------- agent

    def _transcribe(self, out: list[Effect], effect: Transcribe) -> None:
        if effect.item_id in self._failed:  # its turn keeps what was heard before
            self.turns.set_item_text(effect.item_id, self._failed[effect.item_id])
            return
        self._heard.setdefault(effect.item_id, "")
        while len(self._heard) > MAX_TRANSCRIBING:
            del self._heard[next(iter(self._heard))]
        out.append(effect)

    def _reply(
        self,
        out: list[Effect],
        response_id: str,
        settings: ResponseSettings,
        only: tuple[str, ...] | None,
        tools: tuple[FunctionTool, ...],
        *,
        now: float,
    ) -> None:
        """Ask the cascade for the reply, with the conversation it answers as context (or
        play the reply prepared for it, if it answers the same transcript)."""
        self._awaiting = None
        prepared = self._prepared
        if prepared is not None and prepared.response_id == response_id:
            heard = next(
                (i.text for i in self.turns.history.items if i.item_id == prepared.item_id), None
            )
            if prepared.text is not None and prepared.text == heard:
                self._release(out, prepared, now=now)
                return
            self._discard(out)
        items = self.turns.history.items
        if only is not None:
            wanted = set(only)
            items = tuple(item for item in items if item.item_id in wanted)
        out.append(AgentReply(self.turns.epoch, response_id, settings, items, tools))

    def asr_result(self, out: list[Effect], event: AsrResult, *, now: float) -> None:
        """The cascade heard (some of) a user item: transcript events, the reply prepared
        at a pause, and the reply that waited on it."""
        sent = self._heard.get(event.item_id)
        if sent is None:  # cleared, deleted or forgotten meanwhile
            self.counts["transcripts_dropped"] += 1
            return
        events = self.config.input_transcription is not None
        if not event.final:
            if event.text.startswith(sent) and len(event.text) > len(sent):  # append-only
                self._heard[event.item_id] = event.text
                if events:
                    delta = event.text[len(sent) :]
                    self._emit(out, InputTranscriptionDelta(event.item_id, delta))
            if event.until_ms is not None:
                self._prepare(out, event)
            return
        del self._heard[event.item_id]
        self.turns.set_item_text(event.item_id, event.text)
        if event.error is not None:
            self._failed[event.item_id] = event.text
            while len(self._failed) > MAX_TRANSCRIBING:
                del self._failed[next(iter(self._failed))]
        if events and event.error is not None:
            self._emit(out, InputTranscriptionFailed(event.item_id, *TRANSCRIPTION_FAILED))
        elif events:
            seconds = next(
                (
                    i.audio_ms / 1000.0
                    for i in self.turns.history.items
                    if i.item_id == event.item_id
                ),
                0.0,
            )
            self._emit(out, InputTranscriptionCompleted(event.item_id, event.text, seconds))
        waiting = self._awaiting
        if waiting is not None and waiting[0] == event.item_id:
            _, response_id, settings, only, tools = waiting
            if response_id == self.turns.response_id:
                self._reply(out, response_id, settings, only, tools, now=now)
            else:
                self._awaiting = None

    def _prepare(self, out: list[Effect], event: AsrResult) -> None:
        """The turn so far is heard: ask for the prepared reply to it."""
        prepared = self._prepared
        if (
            prepared is None
            or prepared.item_id != event.item_id
            or prepared.end_ms != event.until_ms
            or prepared.text is not None
        ):
            return  # an answer to a pause since discarded
        if not event.text.strip() or prepared.epoch != self.turns.epoch:
            self._discard(out)
            return
        prepared.text = event.text
        self.counts["replies_prepared"] += 1
        wanted = set(prepared.before)
        context = tuple(i for i in self.turns.history.items if i.item_id in wanted)
        turn = HistoryItem(prepared.item_id, "user", float("inf"), 0.0, event.text)
        reply = AgentReply(
            prepared.epoch, prepared.reply_id, prepared.settings, (*context, turn), prepared.tools
        )
        out.append(reply)

    def _release(self, out: list[Effect], prepared: _Prepared, *, now: float) -> None:
        """The turn is the one the prepared reply answers: play what it has made so far,
        and what it makes from now on."""
        self.counts["prepared_replies_used"] += 1
        prepared.released = True
        chunks, prepared.chunks = prepared.chunks, []
        for chunk in chunks:
            if isinstance(chunk, AgentChunk):
                self.agent_chunk(out, chunk, now=now)
            else:
                self.agent_tool_call(out, chunk)

    def _held(self, event: AgentChunk | AgentToolCall) -> AgentChunk | AgentToolCall | None:
        """A chunk of the prepared reply: kept until the turn is committed (``None``), or
        addressed to the response that took it; other chunks pass unchanged."""
        prepared = self._prepared
        if prepared is None or event.response_id != prepared.reply_id:
            return event
        if not prepared.released:
            prepared.chunks.append(event)
            return None
        assert prepared.response_id is not None
        return dataclasses.replace(event, response_id=prepared.response_id)

    def agent_chunk(self, out: list[Effect], event: AgentChunk, *, now: float) -> None:
        """A piece of the cascade's reply: into the responder, which paces it out."""
        mapped = self._held(event)
        if mapped is None:
            return
        event = mapped  # type: ignore[assignment]
        responder = self.responder
        if not responder.streaming or responder.response_id != event.response_id:
            self.counts["agent_chunks_dropped"] += 1  # its response ended (barge-in, cancel)
            return
        if responder.response_id != self.turns.response_id:
            self.counts["responder_frames_dropped"] += responder.stop()
            self.counts["agent_chunks_dropped"] += 1
            return
        responder.feed(event.pcm, event.text, event.final, now)
        self.play(out, now=now)

    def agent_tool_call(self, out: list[Effect], event: AgentToolCall) -> None:
        """A piece of a tool call in the cascade's reply: the ``function_call`` output of its
        response opens, grows or closes, sent at once (the reply's audio before it may still
        be playing; its final chunk, after the call, still ends the response)."""
        mapped = self._held(event)
        if mapped is None:
            return
        event = mapped  # type: ignore[assignment]
        responder = self.responder
        if (
            not responder.streaming
            or responder.response_id != event.response_id
            or event.response_id != self.turns.response_id
        ):
            self.counts["agent_chunks_dropped"] += 1  # its response ended (barge-in, cancel)
            return
        self.turns.function_call(out, event.name, event.arguments, event.call_id, done=event.done)

    def play(self, out: list[Effect], *, now: float) -> None:
        """Route the responder's due frames; drop them if their response ended."""
        if not self.responder.active:
            return
        if self.responder.response_id != self.turns.response_id:
            self.counts["responder_frames_dropped"] += self.responder.stop()
            return
        for frame in self.responder.due(now):
            self.turns.frame(out, frame, now=now)
