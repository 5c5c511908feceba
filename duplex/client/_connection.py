"""A Realtime (``?duplex=1``) client on trio and ``websockets`` that survives a dropped socket.

One ``RealtimeClient`` is one session. ``receive`` returns server events in
order, each once; when the socket drops (anything but our own ``close``), the
next ``send`` or ``receive`` reconnects with ``?resume=1`` and a
``session.resume`` carrying the last seq seen, and the journal's replay fills
the gap. Reconnects are serialised: whichever task notices the drop first
reconnects, the others wait for it and go on on the new socket.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, final

import trio
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.trio.client import ClientConnection, connect

from ._state import ResumeRefused, ServerEvent, SessionCursor, realtime_url


@final
@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How hard to try after a drop: ``attempts`` connects, ``delay_s`` apart, doubling up to
    ``max_delay_s``."""

    attempts: int = 8
    delay_s: float = 0.2
    max_delay_s: float = 2.0


class ClientClosed(Exception):
    """The client was closed, or the server ended the session for good."""


@final
class RealtimeClient:
    """One session over ``WS /v1/realtime?duplex=1``; open it with ``RealtimeClient.open``."""

    def __init__(
        self,
        nursery: trio.Nursery,
        url: str,
        *,
        api_key: str | None = None,
        reconnect: ReconnectPolicy = ReconnectPolicy(),
        ack_every: int = 64,
    ) -> None:
        self._nursery = nursery
        self.url = url
        self.api_key = api_key
        self.policy = reconnect
        self.ack_every = ack_every
        self.cursor = SessionCursor()
        self.reconnects = 0
        self._ws: ClientConnection | None = None
        self._generation = 0
        self._lock = trio.Lock()
        self._send_lock = trio.Lock()
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(
        cls, url: str, *, api_key: str | None = None, **options: Any
    ) -> AsyncIterator[RealtimeClient]:
        """Connect (``url``: ``ws://host:port`` or a ``/v1/realtime`` URL) and wait for
        ``session.created``, which ``receive`` then returns first."""
        try:
            async with trio.open_nursery() as nursery:
                client = cls(nursery, url, api_key=api_key, **options)
                try:
                    await client._connect(resume=False)
                    yield client
                finally:
                    await client.close()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # one failure: raise it as itself, not in a group
            if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
                raise group.exceptions[0] from group
            raise

    @property
    def session_id(self) -> str | None:
        return self.cursor.session_id

    async def _connect(self, *, resume: bool) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        opener = connect(
            realtime_url(self.url, resume=resume),
            additional_headers=headers,
            max_queue=None,
            ping_interval=None,
        )
        ws = await opener.open_connection(self._nursery)
        if resume:
            await ws.send(json.dumps(self.cursor.resume_event()))
        self._ws = ws
        self._generation += 1

    async def _reconnect(self, generation: int) -> None:
        """Reconnect unless another task already did since ``generation``."""
        async with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            if self._generation != generation:
                return
            if not self.cursor.resumable:
                raise ClientClosed("the socket dropped before the session was created")
            delay = self.policy.delay_s
            for attempt in range(self.policy.attempts):
                try:
                    await self._connect(resume=True)
                    self.reconnects += 1
                    return
                except (OSError, InvalidHandshake, ConnectionClosed):
                    if attempt + 1 == self.policy.attempts:
                        raise
                    await trio.sleep(delay)
                    delay = min(2 * delay, self.policy.max_delay_s)

    async def send(self, event: dict[str, Any]) -> None:
        """Send one client event; after a drop, on the resumed socket."""
        while True:
            ws, generation = self._ws, self._generation
            if self._closed or ws is None:
                raise ClientClosed("the client is closed")
            try:
                async with self._send_lock:
                    await ws.send(json.dumps(event))
                return
            except ConnectionClosed:
                await self._reconnect(generation)

    async def append(self, pcm16: bytes) -> None:
        """``input_audio_buffer.append`` of PCM16 at 24 kHz."""
        await self.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()}
        )

    async def ack(self, response_id: str, played_ms: float) -> None:
        """``playback.ack``: ``played_ms`` of ``response_id`` has been played."""
        await self.send(
            {"type": "playback.ack", "response_id": response_id, "played_ms": int(played_ms)}
        )

    async def receive(self) -> ServerEvent:
        """The next server event, each journaled one once, across reconnects.

        Raises:
            ResumeRefused: the server refused the resume (the session is gone).
            ClientClosed: the client was closed, or the session closed.
        """
        while True:
            ws, generation = self._ws, self._generation
            if self._closed or ws is None:
                raise ClientClosed("the client is closed")
            try:
                text = await ws.recv()
            except ConnectionClosed as exc:
                if self._closed:
                    raise ClientClosed("the client is closed") from exc
                if exc.rcvd is not None and exc.rcvd.code in (1000, 1008, 4001):
                    # closed on purpose: session.close, a refused resume, a takeover
                    raise ClientClosed(f"closed by the server: {exc.rcvd.code}") from exc
                await self._reconnect(generation)
                continue
            event = ServerEvent.parse(text if isinstance(text, str) else text.decode())
            if event.type == "error" and generation > 1 and _refused_resume(event):
                raise ResumeRefused(event.data["error"].get("message", "resume refused"))
            if not self.cursor.receive(event):
                continue
            ack = self.cursor.event_ack(self.ack_every)
            if ack is not None:
                self._nursery.start_soon(self._send_quietly, ack)
            return event

    async def _send_quietly(self, event: dict[str, Any]) -> None:
        """A bookkeeping send (``session.event_ack``): a drop just skips it."""
        ws = self._ws
        if ws is None or self._closed:
            return
        try:
            async with self._send_lock:
                await ws.send(json.dumps(event))
        except ConnectionClosed:
            pass

    async def drop(self) -> None:
        """Cut the socket without a close handshake, as a network failure would (tests)."""
        if self._ws is not None:
            await trio.aclose_forcefully(self._ws.stream)

    async def close(self) -> None:
        """Close the socket (the session then waits out its disconnect grace)."""
        if self._closed:
            return
        self._closed = True
        if self._ws is not None:
            with trio.move_on_after(2):
                await self._ws.aclose()


def _refused_resume(event: ServerEvent) -> bool:
    code = event.data.get("error", {}).get("code")
    return code in ("session_resume_expired", "rate_limited")
