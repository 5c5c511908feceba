"""The connection actor: one client socket, decoded on the way in, one writer on the way out.

Two halves, so neither can wait on the other:

- the *reader* task takes decoded frames from its ``EventSocket`` and tells the
  session, in wire order; when the session's mailbox is full it stops reading,
  which is backpressure all the way to the client's TCP window (through a
  worker's link credits when the socket lives in a connection worker);
- the actor's message loop is the only *writer*: it sends what the session
  tells it (``Outbound``) and closes the socket on ``CloseSocket``.

Bad input never reaches the session: the reader answers it with one typed
``error`` (connection-scoped, no ``server_event_seq``) and keeps reading, unless
the error carries a ``close`` (a wire protocol that cannot go on after it):
then the socket is closed after the error. A session opened on connect
(``autostart``) that is refused closes the socket too: 1013 when the server is
full, else 1008 with the error's code (its options came with the connection, so
trying again on the same socket cannot succeed). With a `WaitQueue` (``/api/chat``
and ``server.chat_wait_queue``) a full server holds the socket in line instead,
and the session opens when admission has room; a socket that finds others
waiting lines up behind them, and one that finds the line full gets the 1013.
The session lives on when this actor ends (``Detach`` starts its grace period).

Logs: ``connection opened`` (endpoint, peer) and ``connection closed`` (code,
reason, who closed) at info, or at warning when the server closed to refuse (1008,
1011, 1013); ``bad event`` (code, param, event type; never the
frame) at warning for the first `BAD_EVENTS_LOGGED` of a socket, the rest
counted in its ``connection closed`` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, final

import trio

from duplex import exceptions as errors
from duplex.actors import Actor, ActorContext, ActorRef, ControlMessage, LaneSpec
from duplex.runtime import (
    Attach,
    ClientNotReading,
    CloseSocket,
    Detach,
    FromClient,
    Outbound,
    SessionHub,
)
from duplex.sessions import (
    ErrorEvent,
    ServerEvent,
    SessionCreate,
    SessionOptions,
    SessionResume,
    SessionUpdate,
    resume_refused,
)

from ._access import ResumeGuard
from ._latency import ConnectionLatency
from ._sockets import EventSocket, SocketGone
from ._wait_queue import WaitQueue, WaitQueueFull

DETACH_TIMEOUT_S = 5.0
"""How long the reader waits to tell the session it left, on its way out."""


_FIRST_EVENT = "first-event"

BAD_EVENTS_LOGGED = 3
"""Bad events of one socket logged one by one; later ones are only counted (at close)."""

_CLIENT_TEXT_LOGGED = 64
"""Characters of a client-chosen string (a frame's ``type``, a resumed session id) a log
line keeps."""

_ORDINARY_CLOSES = frozenset({1000, 1001, 4001})
"""Codes of a server close that refuses nothing (a normal end, a shutdown, a takeover); any
other (1008 policy, 1011 internal error, 1013 try again later) is logged as a warning."""


@final
@dataclass(frozen=True, slots=True)
class ShutDown(ControlMessage):
    """The server is stopping: close the socket (1001) and stop."""


@final
@dataclass(frozen=True, slots=True)
class _FirstEventDue(ControlMessage):
    """The socket's time to open a session is up."""


@final
@dataclass(frozen=True, slots=True)
class _Refuse:
    """Close the socket for what its client did (a frame the stream cannot survive, a
    refused open): unlike `CloseSocket`, the session did not ask, so it is still told.
    An ordinary message, as `CloseSocket` is: it is written after the error before it."""

    code: int
    reason: str


@final
class ConnectionActor(Actor[Any]):
    """One socket of one session (or of a session that was never opened)."""

    lanes: ClassVar[tuple[LaneSpec, ...]] = (
        LaneSpec("control", capacity=16, priority=0),
        LaneSpec("data", capacity=1024, priority=10),
    )

    def __init__(
        self,
        socket: EventSocket,
        hub: SessionHub,
        generation: int,
        autostart: bool,
        first_event_timeout_s: float = 0.0,
        resume_guard: ResumeGuard | None = None,
        peer: str | None = None,
        endpoint: str | None = None,
        latency: ConnectionLatency | None = None,
        wait_queue: WaitQueue | None = None,
    ):
        """``resume_guard`` limits failed resumes by ``peer`` (its IP address) and session id;
        ``endpoint``: the route's path, for logs; ``latency``: times what the writer sends;
        ``wait_queue``: where a session opened on connect waits for room instead of being
        refused."""
        self.socket = socket
        self.hub = hub
        self.generation = generation
        self.autostart = autostart
        self.first_event_timeout_s = first_event_timeout_s
        self.session: ActorRef[Any] | None = None
        self.closing = False
        self.close_queued = False
        """A refusal's close is on its way (`_refuse`): the first-event timer has nothing
        left to say (a worker that held the socket past the timeout leaves it almost none,
        and its message may come before the refusal's close)."""
        self.resume_guard = resume_guard
        self.peer = peer
        self.resuming: str | None = None
        """The session id this socket resumed: the session refusing it is a failed resume."""
        self.heard = False
        """A client event reached a session: the first-event timer is off."""
        self.endpoint = endpoint
        self.session_id: str | None = None
        """The session this socket opened or asked to resume (for logs)."""
        self.closed_with: tuple[int, str] | None = None
        self.bad_events = 0
        self.latency = latency
        self.wait_queue = wait_queue
        self.waiting = False
        """In the wait queue: no session yet, and none to open from a client event."""
        self.reading = True
        """The reader runs: the peer has not left (a waiter that gets room after checks it)."""

    async def on_start(self, ctx: ActorContext) -> None:
        ctx.log.info(
            "connection opened", connection=self.generation, endpoint=self.endpoint, peer=self.peer
        )
        # a session opened on connect holds a model slot too: it must be used in time
        if self.first_event_timeout_s > 0:
            ctx.start_timer(_FIRST_EVENT, self.first_event_timeout_s, _FirstEventDue())
        if self.autostart:  # OpenAI clients expect session.created before they speak
            await self._open(ctx, self.socket.initial_options, None, on_connect=True)
        ctx.start_soon(self._read, ctx)

    async def on_stop(self, ctx: ActorContext) -> None:
        by = "server"
        if self.closed_with is None and self.socket.peer_close is not None:
            by, (code, reason) = "client", self.socket.peer_close
        else:
            code, reason = self.closed_with or (1001, "server_shutdown")
        if self.socket.open:
            with trio.move_on_after(1):
                await self.socket.close(1001, "server_shutdown")
        refused = by == "server" and code not in _ORDINARY_CLOSES
        (ctx.log.warning if refused else ctx.log.info)(
            "connection closed",
            connection=self.generation,
            session_id=self.session_id,
            peer=self.peer,
            code=code,
            reason=reason,
            by=by,
            bad_events=self.bad_events,
        )

    async def receive(self, ctx: ActorContext, message: Any) -> Any:
        match message:
            case Outbound(event, seq, input_at):
                await self._write(ctx, event, seq, input_at)
            case CloseSocket(code, reason):
                self.session = None  # the session closed us: it needs no Detach
                await self._close(ctx, code, reason)
            case ClientNotReading():  # the session let us go: it needs no Detach
                self.session = None
                await self._close(ctx, 1013, "client_not_reading")
            case _Refuse(code, reason):  # the reader detaches the session as it stops
                await self._close(ctx, code, reason)
            case ShutDown():
                ctx.stop()  # on_stop closes with 1001; the reader detaches the session
            case _FirstEventDue() if not (self.heard or self.closing or self.close_queued):
                limit = self.first_event_timeout_s
                if self.session is None:
                    exc = errors.FirstEventTimeout(f"no session was opened within {limit:g} s")
                else:  # opened on connect, and the client has said nothing since
                    exc = errors.FirstEventTimeout(
                        f"no client event within {limit:g} s of session.created"
                    )
                    await self._detach()  # a session that heard nothing ends at once
                await self._refuse(ctx, exc, close=(1008, "first_event_timeout"))
        return None

    # -- the writer ----------------------------------------------------------

    async def _write(
        self, ctx: ActorContext, event: ServerEvent, seq: int | None, input_at: float | None
    ) -> None:
        if not self.socket.open:
            return
        try:
            await self.socket.send(event, seq)
        except SocketGone:
            ctx.stop()  # the peer is gone; the reader tells the session
            return
        if self.latency is not None:
            self.latency.written(event, input_at, trio.current_time())

    async def _close(self, ctx: ActorContext, code: int, reason: str) -> None:
        if self.resuming is not None and reason == "session_resume_expired":
            self._resume_failed(self.resuming)  # a wrong resume token
        self.closing = True  # frames still in flight must not open a new session
        if self.closed_with is None and self.socket.peer_close is None:
            self.closed_with = (code, reason)
        await self.socket.close(code, reason)
        ctx.stop()

    # -- the reader ----------------------------------------------------------

    async def _read(self, ctx: ActorContext) -> None:
        try:
            while not self.closing:
                received = await self.socket.receive()
                if received is None or self.closing:
                    break
                if self.session is None and self.socket.peer_close is not None:
                    break  # what a peer's close stands for, with no session to end
                if isinstance(received, errors.ProtocolError):
                    self._log_bad_event(ctx, received)
                    await self._refuse(ctx, received, close=received.close)
                else:
                    await self._dispatch(ctx, received)
                    if self.session is not None and not self.heard:
                        self.heard = True
                        ctx.cancel_timer(_FIRST_EVENT)
        finally:
            self.reading = False
            await self._detach()
            ctx.stop()

    async def _dispatch(self, ctx: ActorContext, event: Any) -> None:
        if self.session is not None:
            await self.session.tell_eager(FromClient(self.generation, event))
            return
        if self.waiting:  # the session it waits for opens with the connection's options
            return
        if isinstance(event, SessionResume):
            # asked for: the close line names it either way (cut: the client chose it)
            self.session_id = event.session_id[:_CLIENT_TEXT_LOGGED]
            guard, now = self.resume_guard, trio.current_time()
            if guard is not None and guard.blocked(self.peer, event.session_id, now):
                exc = errors.RateLimited(
                    "too many failed session.resume attempts; try again later",
                    event_id=event.event_id,
                )
                await self._refuse(ctx, exc, close=(1008, "rate_limited"))
                return
            session = self.hub.lookup(event.session_id)
            if session is None:
                self._resume_failed(event.session_id)
                exc = resume_refused(event.session_id, event.event_id)
                await self._refuse(ctx, exc, close=(1008, "session_resume_expired"))
                return
            self.session, self.resuming = session, event.session_id
            await session.tell(Attach(self.generation, ctx.self, event))
            return
        options = event.options if isinstance(event, SessionCreate) else self.socket.initial_options
        opened = await self._open(
            ctx, options, getattr(event, "event_id", None), update=isinstance(event, SessionUpdate)
        )
        if opened and not isinstance(event, SessionCreate):  # any other first event autostarts
            assert self.session is not None
            await self.session.tell(FromClient(self.generation, event))

    async def _open(
        self,
        ctx: ActorContext,
        options: SessionOptions | None,
        event_id: str | None,
        *,
        on_connect: bool = False,
        update: bool = False,
    ) -> bool:
        """Admit a new session and attach this socket; refuse with a typed error if not
        (and close: when full, or when the options came with the connection). On connect,
        with a wait queue, a full server puts the socket in line instead (`_wait`).

        ``update``: the event that opens it is a ``session.update``; a refusal is its answer.
        """
        queue = self.wait_queue if on_connect else None
        if queue is not None and (queue.waiting or not self._has_room()):  # in line, uncounted
            self._start_waiting(ctx, queue, options)
            return False
        try:
            opened = await self.hub.open(options)
        except errors.ProtocolError as exc:
            if queue is not None and isinstance(exc, errors.ResourceExhausted):
                self._start_waiting(ctx, queue, options)
                return False
            await self._refused(ctx, exc, event_id, on_connect=on_connect, update=update)
            return False
        self.session, self.session_id = opened.ref, opened.session_id
        await opened.ref.tell(Attach(self.generation, ctx.self))
        return True

    async def _refused(
        self,
        ctx: ActorContext,
        exc: errors.ProtocolError,
        event_id: str | None,
        *,
        on_connect: bool,
        update: bool = False,
    ) -> None:
        """A session that could not open: the error, and the close it calls for."""
        exc.event_id = exc.event_id or event_id
        close = None
        if isinstance(exc, errors.ResourceExhausted):
            close = (1013, "resource_exhausted")
        elif on_connect:
            close = (1008, exc.code)
        await self._refuse(ctx, exc, close=close, update_refused=update)

    # -- the wait queue ------------------------------------------------------

    def _start_waiting(
        self, ctx: ActorContext, queue: WaitQueue, options: SessionOptions | None
    ) -> None:
        self.waiting = True
        ctx.cancel_timer(_FIRST_EVENT)  # a socket in line owes no event: it has no session
        ctx.start_soon(self._wait, ctx, queue, options)

    def _has_room(self) -> bool:
        """What `SessionHub.open` checks, read without trying (a try that fails is counted
        and logged as a refusal)."""
        hub = self.hub
        if hub.admission.live >= hub.admission.bound:
            return False
        return any(engine.capacity().admits for engine in hub.engines.values())

    async def _wait(
        self, ctx: ActorContext, queue: WaitQueue, options: SessionOptions | None
    ) -> None:
        """Wait in line for room, then open the session (its handshake follows)."""

        async def take() -> bool:
            try:
                opened = await self.hub.open(options)
            except errors.ResourceExhausted:
                return False  # another socket took the room first: keep our place
            except errors.ProtocolError as exc:
                await self._refused(ctx, exc, None, on_connect=True)
                return True
            with trio.CancelScope(shield=True):  # opened: it must be attached or closed
                self.session, self.session_id = opened.ref, opened.session_id
                await opened.ref.tell(Attach(self.generation, ctx.self))
                if not self.reading:  # the peer left meanwhile
                    await self._detach()
            return True

        try:
            await queue.wait(self._has_room, take)
        except WaitQueueFull:
            exc = errors.ResourceExhausted(
                "duplex_session_capacity_exhausted: every slot is taken and "
                f"{queue.size} sockets are waiting for one already"
            )
            await self._refused(ctx, exc, None, on_connect=True)
            return
        finally:
            self.waiting = False
        if self.session is not None and self.first_event_timeout_s > 0:
            ctx.start_timer(_FIRST_EVENT, self.first_event_timeout_s, _FirstEventDue())

    def _log_bad_event(self, ctx: ActorContext, exc: errors.ProtocolError) -> None:
        """One ``bad event`` line for each of the socket's first few; never the frame itself."""
        self.bad_events += 1
        if self.bad_events > BAD_EVENTS_LOGGED:
            return
        kind = exc.event_type
        ctx.log.warning(
            "bad event",
            connection=self.generation,
            session_id=self.session_id,
            peer=self.peer,
            code=exc.code,
            param=exc.param,
            event_type=None if kind is None else kind[:_CLIENT_TEXT_LOGGED],
            last_logged=self.bad_events == BAD_EVENTS_LOGGED,
        )

    def _resume_failed(self, session_id: str) -> None:
        if self.resume_guard is not None:
            self.resume_guard.fail(self.peer, session_id, trio.current_time())

    async def _refuse(
        self,
        ctx: ActorContext,
        exc: errors.ProtocolError,
        *,
        close: tuple[int, str] | None,
        update_refused: bool = False,
    ) -> None:
        error = ErrorEvent.from_exception(exc, update_refused=update_refused)
        if close is not None:
            self.close_queued = True
        await ctx.self.tell(Outbound(error, None))
        if close is not None:
            await ctx.self.tell(_Refuse(*close))

    async def _detach(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(DETACH_TIMEOUT_S):
            await session.tell(Detach(self.generation))
