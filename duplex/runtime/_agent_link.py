"""A session's link to the agent cascade: it performs `Transcribe` and `AgentReply`.

The machine decides (when to hear a turn, when to answer, when a reply is cancelled);
this link does the I/O with the shared model stages (``duplex.models.agent``) and tells
the session what came back, as `AsrResult` and `AgentChunk` runtime events.

- Hearing: every input chunk (``ModelAppendAudio``) is kept here at 16 kHz on the
  session's input clock, as the session's `Hearing` made it (one resampler, shared with
  the VAD). A `Transcribe` opens (or, with ``end_ms``, closes) a stream over
  one user item; one task per session sends each open stream's new audio to the shared
  ASR every `ASR_CHUNK_MS` and reports the growing transcript, and the final one once the
  turn's audio up to ``end_ms`` is in.
- Answering: an `AgentReply` starts one reply task: the reply model's tokens are cut
  into clauses (the first as soon as it has a few words, so the first audio does not
  wait for the whole reply), each spoken by the shared TTS and sent as it is made.
  Text-only replies send the tokens as they come; a tool call the reply model makes
  goes to the session as `AgentToolCall` pieces as its arguments stream (after the
  speech before it). A `ModelReset` of a later epoch cancels the task: the reply model's
  request is aborted with it, a TTS request is withdrawn, and the machine drops what it
  had queued.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import trio

from duplex.exceptions import ModelError
from duplex.logs import get_logger
from duplex.models.agent import (
    ASR_SAMPLE_RATE,
    AgentModels,
    AsrChunk,
    ChatMessage,
    ReplyDelta,
    ReplyRequest,
    ToolSpec,
)
from duplex.pcm import float_to_pcm16
from duplex.sessions import (
    AgentChunk,
    AgentReply,
    AgentToolCall,
    AsrResult,
    Event,
    HistoryItem,
    StreamingResampler,
    Transcribe,
)

from ._heard import Heard

__all__ = ["ASR_CHUNK_MS", "AgentLink"]

ASR_CHUNK_MS = 240.0
"""Audio an open stream gathers before it goes to the ASR (a partial transcript each)."""
KEEP_MS = 3000.0
"""Input kept before the oldest open stream (or the newest audio): a turn's padded start
comes a little after its audio (the VAD's latency plus ``vad_prefix_padding_ms``)."""
_CLAUSE = re.compile(r"[.!?;:,](\s|$)")
_SENTENCE = re.compile(r"[.!?](\s|$)")
FIRST_CLAUSE_WORDS = 2
"""The first clause goes to TTS at its first punctuation once it has this many words."""

Deliver = Callable[[Event], Awaitable[None]]


@dataclass(eq=False)
class _Stream:
    item_id: str
    cursor_ms: float
    end_ms: float | None = None
    text: str = ""
    key: str = ""
    peek_ms: float | None = None  # a provisional end to answer (a pause), if any


@dataclass(eq=False)
class _Reply:
    epoch: int
    response_id: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class AgentLink:
    """One session's use of the shared agent stages.

    Args:
        models: the process's agent stages.
        session_id: names the session's ASR streams.
        model_rate: the session's audio rate (input in, speech out).
    """

    def __init__(self, models: AgentModels, session_id: str, model_rate: int) -> None:
        self.models = models
        self._session = session_id
        self._rate = model_rate
        self._deliver: Deliver = _nowhere
        self._audio = np.zeros(0, np.int16)
        self._audio_start_ms = 0.0  # input clock of self._audio[0]
        self._input_ms = 0.0  # input clock at the end of the input pushed so far
        self._streams: dict[str, _Stream] = {}
        self._wake = trio.Event()
        self._reply: _Reply | None = None
        self._nursery: trio.Nursery | None = None
        self._serial = 0
        self._log = get_logger(component="agent")

    # ------------------------------------------------------------------ tasks

    async def run(
        self, deliver: Deliver, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The session's hearing loop and its reply tasks, until cancelled; ``deliver``
        tells the session a runtime event (its mailbox, ``model`` lane)."""
        self._deliver = deliver
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._hear_loop()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self._abort_streams()

    # ---------------------------------------------------------------- hearing

    @property
    def _end_ms(self) -> float:
        return self._audio_start_ms + self._audio.size * 1000.0 / ASR_SAMPLE_RATE

    def push(self, heard: Heard) -> None:
        """One chunk of the session's input, at 16 kHz."""
        if heard.fresh:  # a new run (a gap in the input, or it was cleared): start over there
            self._audio = np.zeros(0, np.int16)
            self._audio_start_ms = heard.start_ms
        self._input_ms = heard.end_ms
        self._audio = np.concatenate([self._audio, float_to_pcm16(heard.samples)])
        keep_from = min([s.cursor_ms for s in self._streams.values()] + [self._end_ms]) - KEEP_MS
        self._trim(keep_from)
        if self._streams:
            self._wake.set()

    def _trim(self, from_ms: float) -> None:
        drop = int((from_ms - self._audio_start_ms) * ASR_SAMPLE_RATE / 1000.0)
        if drop > 0:
            self._audio = self._audio[drop:]
            self._audio_start_ms += drop * 1000.0 / ASR_SAMPLE_RATE

    def _slice(self, start_ms: float, end_ms: float) -> np.ndarray:
        rate = ASR_SAMPLE_RATE / 1000.0
        a = max(0, round((start_ms - self._audio_start_ms) * rate))
        b = max(a, round((end_ms - self._audio_start_ms) * rate))
        return self._audio[a:b]

    def transcribe(self, effect: Transcribe) -> None:
        """Open a stream over the item, close it at ``end_ms``, or (``provisional``) answer
        what it holds up to ``end_ms`` and keep it open."""
        stream = self._streams.get(effect.item_id)
        if stream is None:
            self._serial += 1
            stream = _Stream(effect.item_id, effect.start_ms, key=f"{self._session}/{self._serial}")
            self._streams[effect.item_id] = stream
        if effect.provisional:
            stream.peek_ms = effect.end_ms
        else:
            stream.end_ms = effect.end_ms
        self._wake.set()

    async def _hear_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            for stream in list(self._streams.values()):
                try:
                    await self._advance(stream)
                except ModelError as exc:  # queue full, the runner or its process lost
                    self._log.warning("asr failed", session_id=self._session, exc_info=True)
                    self._streams.pop(stream.item_id, None)  # the turn ends with what was heard
                    error = f"{type(exc).__name__}: {str(exc)[:200]}"
                    await self._deliver(AsrResult(stream.item_id, stream.text, True, error=error))
                    # closed in the ASR too: its decoder (a full queue left it open) or its
                    # lost-stream entry (a dead child's) would otherwise stay for good
                    await self._abort(stream)

    async def _advance(self, stream: _Stream) -> None:
        """Hear what the stream has gathered; its end may come while a chunk is heard, so
        it is read again before each."""
        while True:
            end = stream.end_ms
            if end is not None and self._input_ms >= end:  # (the resampler may hold a few ms)
                pcm = self._slice(stream.cursor_ms, end)
                result = await self.models.hear(AsrChunk(stream.key, pcm, final=True))
                self._streams.pop(stream.item_id, None)
                await self._deliver(AsrResult(stream.item_id, result.text, final=True))
                return
            peek, stream.peek_ms = stream.peek_ms, None
            if peek is not None and end is None:  # a pause: what is heard up to it
                if self._input_ms < peek:
                    stream.peek_ms = peek  # its audio is not all here yet
                else:
                    pcm = self._slice(stream.cursor_ms, max(stream.cursor_ms, peek))
                    stream.cursor_ms = max(stream.cursor_ms, peek)
                    chunk = AsrChunk(stream.key, pcm, provisional=True)
                    result = await self.models.hear(chunk)
                    stream.text = result.text or stream.text
                    await self._deliver(AsrResult(stream.item_id, result.text, until_ms=peek))
                    continue
            until = self._end_ms if end is None else min(self._end_ms, end)
            if until - stream.cursor_ms < ASR_CHUNK_MS:
                return
            pcm = self._slice(stream.cursor_ms, until)
            stream.cursor_ms = until
            result = await self.models.hear(AsrChunk(stream.key, pcm))
            if result.text and result.text != stream.text:
                stream.text = result.text
                await self._deliver(AsrResult(stream.item_id, result.text))

    async def _abort_streams(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await self._abort(stream)

    async def _abort(self, stream: _Stream) -> None:
        """Close ``stream`` in the ASR without hearing more (best effort)."""
        empty = np.zeros(0, np.int16)
        try:
            await self.models.hear(AsrChunk(stream.key, empty, final=True, abort=True))
        except Exception:  # the engine is going away too, or still full: nothing more to do
            self._log.debug("asr stream abort failed", exc_info=True)

    def clear_input(self) -> None:
        """The input was cleared: drop the audio and the open streams (freed in the ASR); the
        session's `Hearing` starts a new run, which sets the clock again."""
        self._audio = np.zeros(0, np.int16)
        if self._streams and self._nursery is not None:
            self._nursery.start_soon(self._abort_streams)

    # --------------------------------------------------------------- answering

    def reply(self, effect: AgentReply) -> None:
        """Start answering (any reply still running is cancelled first: one at a time)."""
        if self._reply is not None:
            self._reply.scope.cancel()
            self._reply = None
        if self._nursery is None:
            return
        reply = _Reply(effect.epoch, effect.response_id)
        self._reply = reply
        self._nursery.start_soon(self._answer, effect, reply)

    def cancel_reply(self, epoch: int) -> None:
        """Cancel a reply of an epoch before ``epoch``."""
        reply = self._reply
        if reply is not None and reply.epoch < epoch:
            reply.scope.cancel()
            self._reply = None

    def cancel(self, response_id: str) -> None:
        """Cancel the reply ``response_id`` (a prepared one the turn did not use)."""
        reply = self._reply
        if reply is not None and reply.response_id == response_id:
            reply.scope.cancel()
            self._reply = None

    async def _answer(self, effect: AgentReply, reply: _Reply) -> None:
        rid, settings = effect.response_id, effect.settings
        request = ReplyRequest(
            messages=tuple(_message(item) for item in effect.context),
            instructions=settings.instructions,
            temperature=settings.temperature,
            max_tokens=settings.max_output_tokens,
            tools=tuple(ToolSpec(t.name, t.description, t.parameters_json) for t in effect.tools),
        )
        reason = "stop"
        with reply.scope:
            try:
                if settings.text_only:
                    reason = await self._answer_text(rid, request)
                else:
                    reason = await self._answer_speech(rid, request, settings.voice)
            except Exception:
                self._log.exception("agent reply failed", session_id=self._session)
                reason = "error"
            await self._deliver(AgentChunk(rid, final=True, reason=reason))
        if self._reply is reply:
            self._reply = None

    async def _answer_text(self, rid: str, request: ReplyRequest) -> str:
        reason = "stop"
        async for delta in self.models.replier.stream(request):
            if delta.call_name:
                await self._deliver(_tool_call(rid, delta))
            elif delta.text:
                await self._deliver(AgentChunk(rid, text=delta.text))
            reason = delta.finish or reason
        return reason

    async def _answer_speech(self, rid: str, request: ReplyRequest, voice: str) -> str:
        reason, pending, spoken = "stop", "", 0
        async for delta in self.models.replier.stream(request):
            reason = delta.finish or reason
            if delta.call_name:  # what was said before the call is spoken first
                spoken += await self._speak(rid, pending, voice)
                pending = ""
                await self._deliver(_tool_call(rid, delta))
                continue
            if not delta.text:
                continue
            pending += delta.text
            while (cut := _cut(pending, first=spoken == 0)) is not None:
                piece, pending = pending[:cut], pending[cut:]
                spoken += await self._speak(rid, piece, voice)
        if pending.strip():
            await self._speak(rid, pending, voice)
        return reason

    async def _speak(self, rid: str, text: str, voice: str) -> int:
        if not text.strip():
            return 0
        samples, rate = await self.models.speak(text.strip(), voice)
        if rate != self._rate:  # a sentence's seconds of audio: off the sessions' loop
            resampler = StreamingResampler(rate, self._rate)
            samples = await trio.to_thread.run_sync(resampler.process, samples)
        await self._deliver(AgentChunk(rid, samples, text))
        return 1


async def _nowhere(event: Event) -> None:
    """Before `AgentLink.run`: nothing is heard or answered yet."""


def _cut(text: str, *, first: bool) -> int | None:
    """Where the next piece to speak ends in ``text`` (``None``: not yet): the first at its
    first punctuation once it has `FIRST_CLAUSE_WORDS` words, later ones at a sentence end."""
    pattern = _CLAUSE if first else _SENTENCE
    for match in pattern.finditer(text):
        end = match.end()
        if not first or len(text[:end].split()) >= FIRST_CLAUSE_WORDS:
            return end
    return None


def _message(item: HistoryItem) -> ChatMessage:
    kind = item.content if item.content.startswith("function_call") else "message"
    return ChatMessage(item.role, item.text, kind, item.call_id, item.name)


def _tool_call(response_id: str, delta: ReplyDelta) -> AgentToolCall:
    """A piece of a tool call, as the session takes it."""
    return AgentToolCall(
        response_id, delta.call_name, delta.text, delta.call_id, done=delta.call_done
    )
