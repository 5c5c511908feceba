"""A socket for the stream protocols (Moshi's ``/api/chat``, ``/v1/audio/duplex``).

Their projections differ from the JSON ones in three ways, and this socket is
the I/O edge of each:

- a frame may stand for no session event (a page that completes no Opus packet,
  a control byte the server ignores), so `FramedSocket.receive` reads on until
  one does; or for an event due later (`Later`: a close that first lets the
  model finish), so it waits until then;
- the client expects a continuous audio stream (Moshi's web client closes the
  socket after 10 s without a server message, and plays what it gets as one
  timeline), while a session sends audio only while the model speaks: an
  `OutputClock` says how much silence is owed, and `FramedSocket.keep_flowing`
  sends it;
- the peer leaving ends the conversation (these protocols have no resume): the
  projection names the event that stands for it (`StreamProjection.left`).

Two tasks write (the connection actor's writer, `keep_flowing`); one lock
serialises them, so frames never interleave and the projection's encoder
state is touched by one task at a time.
"""

from __future__ import annotations

import contextlib
from typing import Final

import trio
from starlette.websockets import WebSocket, WebSocketState

from duplex.exceptions import ProtocolError
from duplex.sessions import ServerEvent, SessionOptions
from duplex.wire import Frame, Later, StreamProjection

from ._sockets import Received, SocketGone

__all__ = ["FramedSocket"]

PACE_S: Final = 0.08
"""How often `FramedSocket.keep_flowing` asks for owed frames: one model frame."""


class FramedSocket:
    """A WebSocket of this process through a `StreamProjection` (text or binary frames)."""

    def __init__(self, websocket: WebSocket, projection: StreamProjection) -> None:
        self.ws = websocket
        self.projection = projection
        self._peer_close: tuple[int | None, str] | None = None
        self._lock = trio.Lock()
        self._closed = trio.Event()
        self._left_told = False

    @property
    def open(self) -> bool:
        return self.ws.application_state is WebSocketState.CONNECTED and not self._closed.is_set()

    @property
    def initial_options(self) -> SessionOptions | None:
        return self.projection.initial_options

    @property
    def peer_close(self) -> tuple[int | None, str] | None:
        return self._peer_close

    async def receive(self) -> Received:
        while True:
            if self.projection.failed:  # the error goes out, then the close: read no more
                await self._closed.wait()
                return self._left()
            try:
                message = await self.ws.receive()
            except RuntimeError:  # starlette: the socket was closed under us
                self._peer_close = self._peer_close or (None, "")
                return self._left()
            if message["type"] == "websocket.disconnect":
                self._peer_close = (message.get("code", 1005), message.get("reason") or "")
                return self._left()
            text, data = message.get("text"), message.get("bytes")
            try:
                got = self.projection.parse(
                    text if text is not None else (data or b""), trio.current_time()
                )
            except ProtocolError as exc:
                return exc
            if isinstance(got, Later):
                await trio.sleep_until(got.at)
                return got.event
            if got is not None:
                return got

    def _left(self) -> Received:
        """The peer's leaving as an event, once; then ``None``."""
        if self._left_told:
            return None
        self._left_told = True
        return self.projection.left()

    async def send(self, event: ServerEvent, seq: int | None) -> None:
        async with self._lock:
            await self._write(self.projection.frames(event, seq, trio.current_time()))

    async def _write(self, frames: list[Frame]) -> None:
        try:
            for frame in frames:
                if isinstance(frame, str):
                    await self.ws.send_text(frame)
                else:
                    await self.ws.send_bytes(frame)
        except (OSError, RuntimeError, trio.BrokenResourceError) as exc:
            raise SocketGone from exc

    async def keep_flowing(self) -> None:
        """Send what the projection owes without a session event, every `PACE_S`, until
        the socket closes (run it next to the connection)."""
        while self.open:
            await trio.sleep(PACE_S)
            async with self._lock:
                if not self.open:
                    return
                try:
                    await self._write(self.projection.due(trio.current_time()))
                except SocketGone:
                    return  # the reader finds the peer gone and tells the session

    async def close(self, code: int, reason: str) -> None:
        if self.open:
            # already gone is fine: there is nothing left to close
            with contextlib.suppress(OSError, RuntimeError, trio.BrokenResourceError):
                await self.ws.close(code, reason)
        self._closed.set()
