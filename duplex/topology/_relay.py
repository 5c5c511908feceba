"""Routes a connection worker relays whole to the server process, as ASGI messages.

The generation and robot routes (speech, images, videos: HTTP and their
WebSockets; the OpenPI robot socket) run where their request engines, the video
job store and their counters are: the server process (whose request engines are
local, or links to the engine processes that host them). A worker accepts the
request, applies the access policy, and then hands the route over: ``AsgiOpen``
carries the scope, and from then on the route runs in the server process exactly
as it does single-process, over a ``receive`` and a ``send`` that cross the link:

- ``receive`` is pulled: the route's ``receive()`` posts ``AsgiPull``, and the worker
  calls its own ``receive()`` once and answers ``AsgiIn``. So the worker reads a
  client's body or frames only as fast as the route takes them (at most one
  message in flight), and a client that leaves is seen by the route as the
  ``http.disconnect`` / ``websocket.disconnect`` the worker's server gave.
- ``send`` takes a credit (``RELAY_WINDOW`` messages the worker has not yet
  written), so a slow client backs up to its route only.
- Either side ends with ``AsgiEnd``: the route returned (server), or the client can no
  longer be written to, or the worker's call ended (worker). A route told so by the
  worker gets a disconnect from ``receive`` and ``OSError`` from ``send`` (what a
  single-process server gives for a client that left), so it winds down as there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, final

import trio

from duplex.logs import get_logger

from ._link import AsgiEnd, AsgiIn, AsgiOpen, AsgiOut, AsgiPull, AsgiWritten, Link, Tally, Window

__all__ = ["RELAY_WINDOW", "RelayClient", "RelayServer", "portable_scope"]

RELAY_WINDOW: Final = 8
"""``send`` messages in flight per relayed request (an audio sentence, a video chunk each)."""

_SCOPE_KEYS: Final = frozenset(
    {
        "type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "root_path",
        "query_string", "headers", "client", "server", "subprotocols",
    }
)  # fmt: skip
"""What of a scope crosses: plain data (the server's extensions and state stay behind)."""


def portable_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` less what is not plain data, headers as a list of byte pairs."""
    portable = {key: value for key, value in scope.items() if key in _SCOPE_KEYS}
    portable["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", ())]
    if "client" in portable and portable["client"] is not None:
        portable["client"] = tuple(portable["client"])
    if "server" in portable and portable["server"] is not None:
        portable["server"] = tuple(portable["server"])
    if "websocket.http.response" in scope.get("extensions", {}):
        # the worker's server answers a refused handshake over HTTP: a route may refuse so
        portable["extensions"] = {"websocket.http.response": {}}
    return portable


def _disconnect(scope: dict[str, Any]) -> dict[str, Any]:
    if scope["type"] == "websocket":
        return {"type": "websocket.disconnect", "code": 1006, "reason": ""}
    return {"type": "http.disconnect"}


@dataclass
class _Route:
    """One relayed request as the server process runs it."""

    scope: dict[str, Any]
    window: Window = field(default_factory=lambda: Window(RELAY_WINDOW))
    gone: bool = False
    """The worker ended it: the client left, or can no longer be written to."""

    def __post_init__(self) -> None:
        self.inbox_in, self.inbox = trio.open_memory_channel[dict[str, Any]](math.inf)

    def end(self) -> None:
        if not self.gone:
            self.gone = True
            self.window.close()
            self.inbox_in.send_nowait(_disconnect(self.scope))


@final
class RelayServer:
    """The server process's side of one worker link: runs each relayed request's route in
    ``app`` (the generation routes) until it returns."""

    def __init__(self, app: Any, link: Link, nursery: trio.Nursery) -> None:
        self.app = app
        self.link = link
        self.nursery = nursery
        self.routes: dict[int, _Route] = {}
        self.log = get_logger(component="relay")

    def on_message(self, message: AsgiOpen | AsgiIn | AsgiWritten | AsgiEnd) -> None:
        match message:
            case AsgiOpen(stream, scope):
                self.routes[stream] = route = _Route(scope)
                self.nursery.start_soon(self._run, stream, route)
            case AsgiIn(stream, received):
                if (route := self.routes.get(stream)) is not None and not route.gone:
                    route.inbox_in.send_nowait(received)
            case AsgiWritten(stream, count):
                if (route := self.routes.get(stream)) is not None:
                    route.window.give(count)
            case AsgiEnd(stream):
                if (route := self.routes.get(stream)) is not None:
                    route.end()

    def end_all(self) -> None:
        """The link ended: every route sees its client leave."""
        for route in self.routes.values():
            route.end()

    async def _run(self, stream: int, route: _Route) -> None:
        link = self.link

        async def receive() -> dict[str, Any]:
            if not route.gone:
                link.post(AsgiPull(stream))
            return await route.inbox.receive()

        async def send(message: dict[str, Any]) -> None:
            if not await route.window.take():
                raise OSError("the client left")
            link.post(AsgiOut(stream, message))

        try:
            await self.app(route.scope, receive, send)
        except Exception as exc:  # the app's own handlers answered what they could
            self.log.error("relayed route failed", path=route.scope.get("path"), exc_info=exc)
        finally:
            del self.routes[stream]
            if not route.gone:
                link.post(AsgiEnd(stream))


@dataclass
class _Relayed:
    """One relayed request as the worker holds it."""

    link: Link
    written: Tally = field(default_factory=lambda: Tally(RELAY_WINDOW))

    def __post_init__(self) -> None:
        self.pulls_in, self.pulls = trio.open_memory_channel[None](math.inf)
        self.outbox_in, self.outbox = trio.open_memory_channel[AsgiOut | AsgiEnd](math.inf)


@final
class RelayClient:
    """A worker's side: each call relays one request to the server process over ``link``."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.relayed: dict[int, _Relayed] = {}
        self._next = 0

    def on_message(self, message: AsgiPull | AsgiOut | AsgiEnd) -> None:
        stream = message.stream
        if (relayed := self.relayed.get(stream)) is None:
            return
        if isinstance(message, AsgiPull):
            relayed.pulls_in.send_nowait(None)
        else:
            relayed.outbox_in.send_nowait(message)

    def end_all(self) -> None:
        """The server process is gone: every relayed request ends."""
        for stream, relayed in self.relayed.items():
            relayed.outbox_in.send_nowait(AsgiEnd(stream))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """An ASGI app: the route runs in the server process."""
        stream, self._next = self._next, self._next + 1
        self.relayed[stream] = relayed = _Relayed(self.link)
        link = relayed.link
        ended_there = False
        link.post(AsgiOpen(stream, portable_scope(scope)))
        try:
            async with trio.open_nursery() as nursery:

                async def pull() -> None:
                    async for _ in relayed.pulls:
                        link.post(AsgiIn(stream, await receive()))

                nursery.start_soon(pull)
                async for message in relayed.outbox:
                    if isinstance(message, AsgiEnd):
                        ended_there = True
                        break
                    try:
                        await send(message.message)
                    except Exception:  # the client left (the server's own error for it)
                        break
                    credits = relayed.written.add()
                    if credits:
                        link.post(AsgiWritten(stream, credits))
                nursery.cancel_scope.cancel()
        finally:
            del self.relayed[stream]
            if not ended_there:
                link.post(AsgiEnd(stream))
