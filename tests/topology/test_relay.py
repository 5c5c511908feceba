"""A relayed route (``topology/_relay.py``) over an in-memory link: the worker's ASGI call on
one end, the route on the other. Credits hold a route to ``RELAY_WINDOW`` messages its
client has not taken; the worker reads from its client only when the route asks; a client
that leaves, a client that cannot be written to, and a link that ends all reach the route
as they would single-process (a disconnect from ``receive``, ``OSError`` from ``send``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from duplex.topology._link import Link
from duplex.topology._relay import RELAY_WINDOW, RelayClient, RelayServer, portable_scope

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/audio/speech",
    "headers": [(b"host", b"x")],
    "client": ["127.0.0.1", 5],
    "state": {"not": "sent"},
    "extensions": {"x": {}},
}


@asynccontextmanager
async def relayed(app: App) -> AsyncIterator[tuple[RelayClient, Link]]:
    """A worker's `RelayClient` linked to a server's `RelayServer` running ``app``."""
    a, b = trio.testing.memory_stream_pair()
    worker, server = Link(a), Link(b)
    client = RelayClient(worker)
    async with trio.open_nursery() as nursery:
        relay = RelayServer(app, server, nursery)

        async def serve() -> None:
            async for message in server.messages():
                relay.on_message(message)
            relay.end_all()

        async def listen() -> None:
            async for message in worker.messages():
                client.on_message(message)

        for task in (worker.send_loop, server.send_loop, serve, listen):
            nursery.start_soon(task)
        yield client, worker
        nursery.cancel_scope.cancel()


class Peer:
    """The worker's HTTP server side of one request: a body, then what the client does."""

    def __init__(self, body: bytes = b"hi") -> None:
        self.inbox = [{"type": "http.request", "body": body, "more_body": False}]
        self.reads = 0
        self.left = trio.Event()
        self.sent: list[dict[str, Any]] = []
        self.writable = trio.Event()
        self.writable.set()
        self.broken = False

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.inbox:
            return self.inbox.pop(0)
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        await self.writable.wait()
        if self.broken:
            raise OSError("connection reset")
        self.sent.append(message)


async def test_scope_crosses_as_plain_data_and_the_answer_comes_back() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body[::-1]})

    peer = Peer(b"abc")
    async with relayed(app) as (client, _):
        await client(SCOPE, peer.receive, peer.send)
    assert seen == [portable_scope(SCOPE)] and "state" not in seen[0]
    assert seen[0]["client"] == ("127.0.0.1", 5)
    assert [m.get("body") for m in peer.sent] == [None, b"cba"]
    assert peer.reads == 1  # pulled once: the route read only its body
    assert client.relayed == {}


async def test_a_slow_client_holds_its_route_to_the_window() -> None:
    sends = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal sends
        await receive()
        for k in range(3 * RELAY_WINDOW):
            await send({"type": "http.response.body", "body": b"%d" % k, "more_body": True})
            sends += 1
        await send({"type": "http.response.body", "body": b""})

    peer = Peer()
    peer.writable = trio.Event()  # the client reads nothing yet
    async with relayed(app) as (client, _), trio.open_nursery() as nursery:
        nursery.start_soon(client, SCOPE, peer.receive, peer.send)
        await trio.testing.wait_all_tasks_blocked()
        assert sends == RELAY_WINDOW  # and the route waits
        peer.writable.set()
    assert len(peer.sent) == 3 * RELAY_WINDOW + 1 and sends == 3 * RELAY_WINDOW


async def test_a_client_that_leaves_is_a_disconnect_to_the_route() -> None:
    outcome: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        outcome.append((await receive())["type"])  # waits for the client to leave

    peer = Peer()
    async with relayed(app) as (client, _), trio.open_nursery() as nursery:
        nursery.start_soon(client, SCOPE, peer.receive, peer.send)
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == []
        peer.left.set()
    assert outcome == ["http.disconnect"]


async def test_a_client_that_cannot_be_written_ends_the_route_as_single_process() -> None:
    outcome: list[str] = []
    done = trio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            while True:
                await send({"type": "http.response.body", "body": b"x", "more_body": True})
                await trio.sleep(0)
        except OSError:
            outcome.append("send failed")
        outcome.append((await receive())["type"])
        done.set()

    peer = Peer()
    peer.broken = True
    async with relayed(app) as (client, _):
        await client(SCOPE, peer.receive, peer.send)  # returns at its first failed write
        with trio.fail_after(5):
            await done.wait()
    assert outcome == ["send failed", "http.disconnect"]


async def test_a_link_that_ends_ends_its_routes() -> None:
    outcome: list[str] = []
    done = trio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        outcome.append((await receive())["type"])
        outcome.append((await receive())["type"])
        done.set()

    peer = Peer()
    async with relayed(app) as (client, worker), trio.open_nursery() as nursery:
        nursery.start_soon(client, SCOPE, peer.receive, peer.send)
        await trio.testing.wait_all_tasks_blocked()
        await worker.stream.aclose()  # the worker is gone
        with trio.fail_after(5):
            await done.wait()
        nursery.cancel_scope.cancel()
    assert outcome == ["http.request", "http.disconnect"]
