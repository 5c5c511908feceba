"""The session actor: runs one `SessionMachine` and performs its effects.

It holds no session facts of its own. Everything from a connection (attach,
client events, detach) arrives on one ``client`` lane, so wire order is kept
(a close never overtakes an earlier append); engine output (the model's and
the shared VAD's) arrives on the ``model`` lane; the lease timer on ``control``.

A session with ``vad="silero"`` holds a slot on the shared VAD, one more
engine, for its whole life (taken at admission, like its model slot): every
``ModelAppendAudio`` chunk also goes to its `VadLink`, the scored windows come
back into the mailbox as that slot's `FromEngine` (its own `MailboxSink`, which
tells the two engines apart), and the link turns them into the machine's
``SpeechStarted`` / ``SpeechStopped``. A clearing ``ModelReset`` or a
turn-detection change restarts the stream; a VAD restart moves it onto the new
VAD (`VadReplaced`).

Logs, at info, from the effects it performs (the machine itself logs nothing):
``session created``, ``session resumed``, ``session replaced``, ``session
expired`` (reason) and ``session closed`` (reason), each with ``session_id`` and
``connection`` (the socket generation); never a resume token or audio.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, final

import numpy as np
import trio

from duplex.actors import Actor, ActorContext, ActorRef, ControlMessage, LaneSpec, Overflow
from duplex.exceptions import InternalError, MailboxFull, PromptUnsupported
from duplex.models import (
    EngineDriver,
    SamplingRequest,
    SlotEngine,
    SlotHandle,
    SlotOutput,
    SlotPrompt,
    VadWindow,
)
from duplex.sessions import (
    AgentReply,
    AudioDelta,
    CancelReply,
    ClientEvent,
    CloseConnection,
    ConnectionAttached,
    ConnectionDetached,
    Effect,
    ErrorEvent,
    Event,
    ModelAppendAudio,
    ModelAppendVideo,
    ModelFailed,
    ModelFrame,
    ModelReset,
    ModelSignal,
    ReleaseResources,
    Send,
    ServerEvent,
    SessionClose,
    SessionConfig,
    SessionCreated,
    SessionMachine,
    SessionReplaced,
    SessionResume,
    SessionResumed,
    Tick,
    Transcribe,
    VideoAppend,
)

from ._agent_link import AgentLink
from ._heard import Heard, Hearing
from ._input_times import InputTimes
from ._vad_link import VadLink

T = TypeVar("T")

# -- messages to the session actor ----------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Attach:
    """A socket joins (new session or resume); ``connection`` receives its events."""

    generation: int
    connection: ActorRef[Any]
    resume: SessionResume | None = None


@final
@dataclass(frozen=True, slots=True)
class Detach:
    generation: int


@final
@dataclass(frozen=True, slots=True)
class FromClient:
    generation: int
    event: ClientEvent


@final
@dataclass(frozen=True, slots=True, eq=False)
class FromEngine:
    output: SlotOutput
    sink: MailboxSink[SlotOutput]


@final
@dataclass(frozen=True, slots=True, eq=False)
class FromAgent:
    """What the agent cascade made for the session (`AsrResult`, `AgentChunk`)."""

    event: Event


@final
@dataclass(frozen=True, slots=True)
class LeaseTimer(ControlMessage):
    pass


@final
@dataclass(frozen=True, slots=True, eq=False)
class EngineReplaced(ControlMessage):
    """The engine crashed and restarted: move onto ``driver``."""

    driver: SlotEngine
    reason: str


@final
@dataclass(frozen=True, slots=True)
class EngineLost(ControlMessage):
    """The engine is gone (its process exited): fail what it was doing now, not when a new
    one is up (minutes, for a 7B model); an `EngineReplaced` follows once one runs."""

    reason: str


@final
@dataclass(frozen=True, slots=True)
class Evict(ControlMessage):
    """The server ends the session (a forced sleep of its engine): the client is told
    ``reason`` as an engine error, then the session closes as on ``session.close``."""

    reason: str


@final
@dataclass(frozen=True, slots=True, eq=False)
class VadReplaced(ControlMessage):
    """The shared VAD crashed and restarted: move the session's stream onto ``driver``."""

    driver: EngineDriver


@final
@dataclass(frozen=True, slots=True)
class Inspect(ControlMessage):
    """Ask for the machine (tests and diagnostics read its properties)."""


# -- messages the session actor sends to a connection ---------------------


@final
@dataclass(frozen=True, slots=True)
class Outbound:
    """One event for the socket; ``input_at``: when the input behind this audio was pushed to
    the engine (an `AudioDelta` from a model frame), so the writer can time the frame."""

    event: ServerEvent
    seq: int | None
    input_at: float | None = None


@final
@dataclass(frozen=True, slots=True)
class CloseSocket:
    code: int
    reason: str


@final
@dataclass(frozen=True, slots=True)
class ClientNotReading(ControlMessage):
    """The session let this socket go: its writer's queue was full (the client read nothing
    while that many events waited). Close it (1013 ``client_not_reading``) once the writer
    is free; what it had queued is in the session's journal, for a resume."""


class Releaser(Protocol):
    """The session's owner (the hub): told once its resources are freed, so its capacity
    returns, and of each socket it let go, so they are counted."""

    def released(self, session_id: str) -> None: ...

    def let_go(self, session_id: str) -> None: ...


VAD_WINDOW_BUFFER = 32
"""Scored windows (32 ms each) a session may fall behind before the VAD drops (counted)."""


@final
class MailboxSink(Generic[T]):
    """One engine slot's output (the model's frames, the VAD's windows), straight into
    its session's mailbox (``model`` lane).

    A driver calls `send_nowait` on the trio thread after each step; no pump
    task sits between a driver and the session. Bounded like a channel: at most
    ``limit`` items queued and not yet handled, and beyond that (or before the
    session is bound) ``trio.WouldBlock``: the driver drops the item and counts
    it. A closed sink (session released, driver replaced) raises
    ``trio.ClosedResourceError``, and items it already queued are ignored by the
    session.
    """

    __slots__ = ("_ref", "_wrap", "closed", "limit", "queued")

    def __init__(self, limit: int, wrap: Callable[[T, MailboxSink[T]], object]) -> None:
        self.limit = limit
        self.queued = 0
        self.closed = False
        self._wrap = wrap
        self._ref: ActorRef[Any] | None = None

    def bind(self, ref: ActorRef[Any]) -> None:
        """Deliver to ``ref`` from now on (the session actor, once it runs)."""
        self._ref = ref

    def send_nowait(self, item: T, /) -> None:
        if self.closed:
            raise trio.ClosedResourceError("the session no longer takes this stream's output")
        if self._ref is None or self.queued >= self.limit:
            raise trio.WouldBlock
        try:
            self._ref.tell_nowait(self._wrap(item, self))
        except MailboxFull:
            raise trio.WouldBlock from None
        self.queued += 1

    def handled(self) -> None:
        """The session took one item off its mailbox."""
        self.queued -= 1


def engine_sink(limit: int) -> MailboxSink[SlotOutput]:
    """Where a slot's engine output goes: its session's mailbox, as `FromEngine`."""
    return MailboxSink(limit, FromEngine)


def vad_sink(limit: int = VAD_WINDOW_BUFFER) -> MailboxSink[SlotOutput]:
    """Where a VAD slot's windows go: its session's mailbox, as `FromEngine` (the sink
    says which engine they came from)."""
    return MailboxSink(limit, FromEngine)


@dataclass(eq=False)
class VadResources:
    """A session's slot on the shared VAD and where its windows arrive."""

    link: VadLink
    sink: MailboxSink[SlotOutput]
    overflow_logged: bool = False


@dataclass(eq=False)
class SessionResources:
    """The engine slot (and VAD stream) a session holds and where their output arrives."""

    driver: SlotEngine
    handle: SlotHandle
    sink: MailboxSink[SlotOutput]
    released: bool = field(default=False)
    vad: VadResources | None = None
    agent: AgentLink | None = None


@final
class SessionActor(Actor[Any]):
    """One session: a machine, an engine slot, and the sockets attached over time."""

    lanes: ClassVar[tuple[LaneSpec, ...]] = (
        LaneSpec("control", capacity=64, priority=0),
        LaneSpec("client", capacity=256, overflow=Overflow.BLOCK, priority=10),
        LaneSpec("video", capacity=8, overflow=Overflow.DROP_OLDEST, priority=15),
        LaneSpec("model", capacity=64, overflow=Overflow.BLOCK, priority=20),
    )
    """Client events keep wire order on one lane; video frames have their own bounded
    drop-oldest lane (a stale frame is worth less than a fresh one; drops are counted)."""

    @classmethod
    def lanes_for(cls, config: SessionConfig) -> tuple[LaneSpec, ...]:
        """The class lanes with the video lane sized from the session config."""
        return tuple(
            LaneSpec("video", config.video_lane_size, Overflow.DROP_OLDEST, lane.priority)
            if lane.name == "video"
            else lane
            for lane in cls.lanes
        )

    @classmethod
    def route(cls, message: object) -> str:
        if isinstance(message, ControlMessage):
            return "control"
        if isinstance(message, FromEngine | FromAgent):
            return "model"
        if isinstance(message, FromClient) and isinstance(message.event, VideoAppend):
            return "video"
        return "client"

    def __init__(self, machine: SessionMachine, resources: SessionResources, owner: Releaser):
        self.machine = machine
        self.resources = resources
        self.owner = owner
        self.connections: dict[int, ActorRef[Any]] = {}
        self.hearing = Hearing(machine.config.model_sample_rate)
        """The input at 16 kHz for the VAD and the ASR: resampled once for both."""
        self.armed: float | None = None
        self.closed: int | None = None
        """The socket generation the current effects closed (for the session's end line)."""
        self.engine_lost = False
        """Told `EngineLost` and not yet moved onto a new engine."""
        self.input_times = InputTimes()
        self.input_at: float | None = None
        """When the input of the model frame being applied was pushed (`Outbound.input_at`)."""

    async def on_start(self, ctx: ActorContext) -> None:
        self.resources.sink.bind(ctx.self)
        if self.resources.vad is not None:
            self.resources.vad.sink.bind(ctx.self)
        agent = self.resources.agent
        if agent is not None:

            async def deliver(event: Event) -> None:
                await ctx.self.tell(FromAgent(event))

            ctx.start_soon(agent.run, deliver)
        ctx.start_soon(self._guard, ctx)

    async def on_stop(self, ctx: ActorContext) -> None:
        self._release()

    async def _guard(self, ctx: ActorContext) -> None:
        """Frees the slot and tells the sockets when the actor ends without a session end."""
        try:
            await trio.sleep_forever()
        finally:
            if not self.resources.released:  # a crash or a shutdown, not a session end
                self._end_lost(ctx, "actor_stopped")

    def _end_lost(self, ctx: ActorContext, reason: str) -> None:
        """End a session the machine did not end (a crash, a restart with no room): log it,
        free its slot and VAD stream, tell the hub and every socket (1011), and stop.

        The one end path besides the machine's own ``ReleaseResources``; idempotent
        (`_release` frees once, and a stopping actor ignores another stop)."""
        self._log_closed(ctx, reason)
        self._release()
        for connection in self.connections.values():
            self._notify_lost(connection)
        ctx.stop()

    async def _replace_engine(self, ctx: ActorContext, driver: SlotEngine, reason: str) -> None:
        res = self.resources
        res.sink.closed = True
        res.driver.detach(res.handle)
        sink = engine_sink(res.sink.limit)
        try:  # the prompt was accepted by the same model before the restart
            prompt = slot_prompt(self.machine.config)
            handle = await driver.open_slot(self.machine.session_id, sink, prompt=prompt)
        except PromptUnsupported:
            handle = None
        if handle is None:  # the old slot is already detached; `_release` detaches it again
            ctx.log.error("no slot on the restarted engine; ending the session")
            self._end_lost(ctx, "engine_restart_no_slot")
            return
        self.resources = SessionResources(driver, handle, sink, vad=res.vad, agent=res.agent)
        self.input_times.clear()  # the old engine's queue is gone
        sink.bind(ctx.self)
        # told again even after `EngineLost`: the new slot takes the session's next epoch
        # here, and input sent while no engine ran was dropped (and counted)
        self.engine_lost = False
        await self._apply(ctx, ModelFailed(f"the engine restarted ({reason})"))

    async def _replace_vad(self, ctx: ActorContext, driver: EngineDriver) -> None:
        vad = self.resources.vad
        if vad is None or self.resources.released:
            return
        vad.sink.closed = True
        vad.link.close()  # the old VAD is gone; its pool goes with it
        sink = vad_sink(vad.sink.limit)
        handle = driver.attach(self.machine.session_id, sink)
        if handle is None:  # the new pool is as large as the old one: never expected
            ctx.log.error("no stream on the restarted VAD; ending the session")
            self._end_lost(ctx, "vad_restart_no_stream")
            return
        ended = vad.link.replace(driver, handle)
        self.resources.vad = VadResources(vad.link, sink)
        sink.bind(ctx.self)
        ctx.log.warning("the VAD restarted; the session moved onto it")
        for event in ended:
            await self._apply(ctx, event)

    @staticmethod
    def _post(connection: ActorRef[Any], message: Outbound | CloseSocket) -> bool:
        """Queue ``message`` for the socket's writer; False if its queue is full.

        A session never waits on a socket: a client that reads nothing would otherwise
        hold the session, its engine slot's output and the reader that waits on the
        session's own full mailbox, each waiting on the other.
        """
        try:
            connection.tell_nowait(message)
        except (trio.WouldBlock, MailboxFull):
            return False
        return True

    async def _let_go(self, ctx: ActorContext, generation: int, connection: ActorRef[Any]) -> None:
        """Detach a socket whose client stopped reading; the session stays, resumable."""
        if self.connections.pop(generation, None) is None:
            return
        self._tell_not_reading(ctx, generation, connection)
        await self._apply(ctx, ConnectionDetached(generation))

    def _tell_not_reading(
        self, ctx: ActorContext, generation: int, connection: ActorRef[Any]
    ) -> None:
        self.owner.let_go(self.machine.session_id)
        ctx.log.warning(
            "client not reading: its socket is let go, the session stays resumable",
            session_id=self.machine.session_id,
            connection=generation,
        )
        with contextlib.suppress(trio.WouldBlock, MailboxFull):
            connection.tell_nowait(ClientNotReading())

    def _notify_lost(self, connection: ActorRef[Any]) -> None:
        err = ErrorEvent.from_exception(InternalError("the session ended unexpectedly"))
        for message in (Outbound(err, None), CloseSocket(1011, "internal_error")):
            try:
                connection.tell_nowait(message)
            except (trio.WouldBlock, MailboxFull):
                break  # the connection is stuck; its own reader ends it

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        match message:
            case FromClient(generation, event):
                await self._apply(ctx, event, generation)
            case FromEngine(output, sink):
                sink.handled()
                vad = self.resources.vad
                if sink is self.resources.sink and not sink.closed:  # else: an old engine's
                    self.input_at = self.input_times.consume(output.input_samples)
                    try:
                        await self._apply(ctx, _model_frame(output))
                    finally:
                        self.input_at = None
                elif vad is not None and sink is vad.sink and not sink.closed:  # the VAD's
                    for event in vad.link.on_window(VadWindow.of(output)):
                        await self._apply(ctx, event)
            case FromAgent(event):
                if not self.resources.released:
                    await self._apply(ctx, event)
            case Attach(generation, connection, resume):
                self.connections[generation] = connection
                await self._apply(ctx, ConnectionAttached(generation, resume))
            case Detach(generation):
                self.connections.pop(generation, None)
                await self._apply(ctx, ConnectionDetached(generation))
            case EngineReplaced(driver, reason):
                await self._replace_engine(ctx, driver, reason)
            case EngineLost(reason):
                if not self.engine_lost and not self.resources.released:
                    self.engine_lost = True
                    await self._apply(ctx, ModelFailed(f"the engine stopped ({reason})"))
            case Evict(reason):
                await self._apply(ctx, ModelFailed(reason))
                await self._apply(ctx, SessionClose())
            case VadReplaced(driver):
                await self._replace_vad(ctx, driver)
            case LeaseTimer():
                self.armed = None
                await self._apply(ctx, Tick())
            case Inspect():
                return self.machine
        return None

    async def _apply(self, ctx: ActorContext, event: Event, generation: int | None = None) -> None:
        effects = self.machine.handle(event, trio.current_time(), generation=generation)
        vad = self.resources.vad
        if vad is not None and vad.link.config is not self.machine.config:
            vad.link.reconfigure(self.machine.config)  # before any audio of the new config
        self.closed = None  # a session's end closes its socket in the same effects, if any
        for effect in effects:
            await self._perform(ctx, effect)
        # Most events push the deadline later (every append renews the idle lease);
        # the armed timer then fires early, finds nothing due and re-arms. Re-arming
        # only for an earlier deadline keeps timer churn off the per-frame path.
        deadline = self.machine.next_deadline()
        if deadline is not None and (self.armed is None or deadline < self.armed):
            self.armed = deadline
            ctx.start_timer("lease", max(0.0, deadline - trio.current_time()), LeaseTimer())

    async def _perform(self, ctx: ActorContext, effect: Effect) -> None:
        res = self.resources
        match effect:
            case Send(event, seq, generation):
                if seq is None or isinstance(event, ErrorEvent):  # lifecycle replies, errors
                    self._log_sent(ctx, event, generation)
                connection = self.connections.get(generation)
                if connection is not None:
                    input_at = self.input_at if isinstance(event, AudioDelta) else None
                    if not self._post(connection, Outbound(event, seq, input_at)):
                        await self._let_go(ctx, generation, connection)
            case CloseConnection(generation, code, reason):
                self.closed = generation
                connection = self.connections.pop(generation, None)
                if connection is not None and not self._post(connection, CloseSocket(code, reason)):
                    self._tell_not_reading(ctx, generation, connection)
            case ModelAppendAudio(_, pcm, start_ms):
                pcm = np.asarray(pcm, dtype=np.float32)
                vad = res.vad if res.vad is not None and res.vad.link.enabled else None
                if vad is not None or res.agent is not None:
                    heard = self.hearing.push(pcm, start_ms)
                    if vad is not None:
                        self._push_vad(ctx, vad, heard)
                    if res.agent is not None:
                        res.agent.push(heard)
                push = res.driver.push_input(res.handle, pcm)
                self.input_times.push(
                    len(pcm) - push.frames_rejected * res.driver.spec.frame_samples,
                    trio.current_time(),
                )
                if push.overflowed:  # the machine's input ledger bounds this; never expected
                    ctx.log.error("engine input queue overflow", rejected=push.frames_rejected)
                    await self._apply(ctx, ModelFailed("engine input queue overflow"))
            case ModelAppendVideo(_, frame, _):
                res.driver.push_video(res.handle, frame.frame_id, frame.pts_ms, frame.frame)
            case ModelReset(epoch, _, clear_input):
                res.driver.reset(res.handle, epoch, clear_input=clear_input)
                if res.agent is not None:  # the reply of the old epoch stops, end to end
                    res.agent.cancel_reply(epoch)
                    if clear_input:
                        res.agent.clear_input()
                if clear_input:
                    self.input_times.clear()
                    self.hearing.restart()
                if clear_input and res.vad is not None:  # the machine forgot the speech too
                    res.vad.link.restart()
            case ModelSignal():
                pass  # frame-synchronous models take turns from the audio itself
            case Transcribe():
                if res.agent is not None:
                    res.agent.transcribe(effect)
            case AgentReply():
                if res.agent is not None:
                    res.agent.reply(effect)
            case CancelReply(response_id):
                if res.agent is not None:
                    res.agent.cancel(response_id)
            case ReleaseResources(reason, expired):
                if expired:
                    ctx.log.info(
                        "session expired",
                        session_id=self.machine.session_id,
                        connection=self.closed,
                        reason=reason,
                    )
                self._log_closed(ctx, reason)
                self._release()
                ctx.stop()

    def _log_sent(self, ctx: ActorContext, event: ServerEvent, generation: int) -> None:
        """The lifecycle line of a connection-scoped reply (never its resume token), or the
        debug line of an error the machine answered an event with."""
        session_id = self.machine.session_id
        match event:
            case SessionCreated():
                ctx.log.info("session created", session_id=session_id, connection=generation)
            case SessionResumed(replay_count=replayed):
                ctx.log.info(
                    "session resumed",
                    session_id=session_id,
                    connection=generation,
                    replayed=replayed,
                )
            case SessionReplaced(attachment_generation=new):
                ctx.log.info(
                    "session replaced", session_id=session_id, connection=generation, by=new
                )
            case ErrorEvent(code=code, param=param):  # a refused event: per-event detail
                ctx.log.debug(
                    "event refused",
                    session_id=session_id,
                    connection=generation,
                    code=code,
                    param=param,
                )

    def _log_closed(self, ctx: ActorContext, reason: str) -> None:
        ctx.log.info(
            "session closed",
            session_id=self.machine.session_id,
            connection=self.closed,
            reason=reason,
        )

    def _push_vad(self, ctx: ActorContext, vad: VadResources, heard: Heard) -> None:
        push = vad.link.push(heard)
        if push is not None and push.overflowed and not vad.overflow_logged:
            vad.overflow_logged = True  # counted in the link's statistics from here on
            ctx.log.warning("VAD stream fell behind; windows refused (a gap, taken as silence)")

    def _release(self) -> None:
        if not self.resources.released:
            self.resources.released = True
            self.resources.sink.closed = True
            self.resources.driver.detach(self.resources.handle)
            if self.resources.vad is not None:
                self.resources.vad.sink.closed = True
                self.resources.vad.link.close()
            self.owner.released(self.machine.session_id)


def _model_frame(output: SlotOutput) -> ModelFrame:
    frame = output.frame
    return ModelFrame(
        epoch=output.epoch,
        pcm=output.pcm16,
        text=frame.text,
        speaking=frame.speaking,
        end_of_turn=frame.end_of_turn,
        consumed_input_samples=output.input_samples,
        consumed_video_frame_ids=tuple(frame.video_frame_ids),
        latest_video_pts_ms=frame.latest_video_pts_ms,
        holds_input=frame.holds_input,
    )


def slot_prompt(config: SessionConfig) -> SlotPrompt | None:
    """The engine's form of the session's prompt and sampling (``None`` when it has neither)."""
    prompt, sampling = config.prompt, config.sampling
    if prompt is None and sampling is None:
        return None
    request = None
    if sampling is not None:
        request = SamplingRequest(**{key: getattr(sampling, key) for key in sampling.given})
    if prompt is None:
        return SlotPrompt(sampling=request)
    return SlotPrompt(text=prompt.text, voice=prompt.voice, sampling=request)
