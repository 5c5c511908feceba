"""What a connection actor talks to: a socket of decoded events, here or in a worker process.

The connection actor owns a session's socket logic (open, resume, refuse, the
one writer); it reads and writes through an ``EventSocket`` and never sees a
frame. Two kinds:

- ``WebSocketEvents``: a WebSocket in this process, decoded and encoded by its
  wire ``Projection``. ``duplex serve`` uses it with no connection workers, and
  each worker uses it for its own sockets;
- ``LinkedSocket`` (``_workers.py``): a socket a worker process holds, relayed
  over the worker's link, so the session process does no WebSocket I/O, JSON or
  base64 at all.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import trio
from starlette.websockets import WebSocket, WebSocketState

from duplex.exceptions import ProtocolError
from duplex.sessions import ClientEvent, ServerEvent, SessionOptions


class SocketGone(Exception):
    """The peer left while a frame was being written."""


class Projection(Protocol):
    """A wire protocol, per connection: frames to session events and back (sans-I/O)."""

    def parse(self, data: str | bytes) -> ClientEvent:
        """One frame to one event; raises only ``ProtocolError``."""
        ...

    def frames(self, event: ServerEvent, seq: int | None) -> list[str]:
        """One session event to the JSON text frames that carry it."""
        ...

    @property
    def initial_options(self) -> SessionOptions | None:
        """Options for a session this protocol opens without a ``session.create``."""
        ...

    def left(self, code: int | None) -> ClientEvent | None:
        """The event a peer's close with ``code`` stands for (``session.close`` for a client
        that cannot resume); ``None``: none, the session keeps its grace for a resume."""
        ...

    @property
    def paused(self) -> bool:
        """How the next frame parses waits on the session's answer to an earlier one: `parse`
        nothing until `frames` has carried it (h11's ``PAUSED``)."""
        ...


Received = ClientEvent | ProtocolError | None
"""One inbound frame: its event, the typed error it earned, or ``None`` when the peer left."""


class EventSocket(Protocol):
    """One client socket, as events."""

    @property
    def open(self) -> bool:
        """Frames may still be written."""
        ...

    @property
    def initial_options(self) -> SessionOptions | None:
        """The wire protocol's options for a session opened without ``session.create``."""
        ...

    @property
    def peer_close(self) -> tuple[int | None, str] | None:
        """The close code (``None``: unknown) and reason of a peer that left; ``None`` before."""
        ...

    async def receive(self) -> Received:
        """The next frame, decoded; waits for it."""
        ...

    async def send(self, event: ServerEvent, seq: int | None) -> None:
        """Write one event's frames; raises ``SocketGone`` when the peer is gone."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code``; a socket already gone is fine."""
        ...


class WebSocketEvents:
    """A WebSocket of this process, through its projection.

    While the projection is `Projection.paused`, `receive` holds the frame it read
    (one, so a peer that leaves is still seen) until `send` has carried the session's
    answer or the socket closes.
    """

    def __init__(self, websocket: WebSocket, projection: Projection) -> None:
        self.ws = websocket
        self.projection = projection
        self._peer_close: tuple[int | None, str] | None = None
        self._closed = False
        self._unpaused: trio.Event | None = None

    @property
    def open(self) -> bool:
        return self.ws.application_state is WebSocketState.CONNECTED

    @property
    def initial_options(self) -> SessionOptions | None:
        return self.projection.initial_options

    @property
    def peer_close(self) -> tuple[int | None, str] | None:
        return self._peer_close

    async def receive(self) -> Received:
        try:
            message = await self.ws.receive()
        except RuntimeError:  # starlette: the socket was closed under us
            self._peer_close = self._peer_close or (None, "")
            return None
        if message["type"] == "websocket.disconnect":
            code = message.get("code", 1005)
            self._peer_close = (code, message.get("reason") or "")
            # the next receive raises (starlette), which reads as gone: None
            return self.projection.left(code)
        text, data = message.get("text"), message.get("bytes")
        while self.projection.paused:
            if self._closed:
                return None
            self._unpaused = trio.Event()
            await self._unpaused.wait()
        try:
            return self.projection.parse(text if text is not None else (data or b""))
        except ProtocolError as exc:
            return exc

    async def send(self, event: ServerEvent, seq: int | None) -> None:
        texts = self.projection.frames(event, seq)
        self._wake()
        try:
            for text in texts:
                await self.ws.send_text(text)
        except (OSError, RuntimeError, trio.BrokenResourceError) as exc:
            raise SocketGone from exc

    def _wake(self) -> None:
        """Let a `receive` held by a paused projection look again."""
        if self._unpaused is not None:
            self._unpaused.set()
            self._unpaused = None

    async def close(self, code: int, reason: str) -> None:
        self._closed = True
        self._wake()
        if self.open:
            # already gone is fine: there is nothing left to close
            with contextlib.suppress(OSError, RuntimeError, trio.BrokenResourceError):
                await self.ws.close(code, reason)
