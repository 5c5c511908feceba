"""The ingress against real duplex servers, with a table given by the test (no Ray)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import trio
from websockets.trio.client import connect

from duplex.cluster import Ingress, NodeReport, NodeState, serve_ingress

from ..transport.test_e2e_duplex import open_session
from ..transport.test_e2e_workers import echo
from ..transport.wsclient import Client, Server, running_server, tone


class Table:
    """A node table the test writes."""

    def __init__(self) -> None:
        self.reports: list[NodeReport] = []

    async def nodes(self) -> list[NodeReport]:
        return list(self.reports)


@asynccontextmanager
async def ingress_at(table: Table) -> AsyncIterator[tuple[Ingress, str]]:
    ingress = Ingress(table, refresh_s=0.05)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_ingress, ingress, "127.0.0.1", 0)
        try:
            yield ingress, url
        finally:
            nursery.cancel_scope.cancel()
            await ingress.aclose()


def node(
    name: str, server: Server, *, live: int = 0, capacity: int = 8, seq: int = 1
) -> NodeReport:
    return NodeReport(name, server.http, NodeState.SERVING, live, capacity, 0.0, seq)


async def test_a_session_through_the_ingress_echoes_and_carries_its_node() -> None:
    table = Table()
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(running_server(**{"server.node_name": "a1"}))
        table.reports = [node("a1", server)]
        ingress, url = await stack.enter_async_context(ingress_at(table))
        await ingress.refreshed.wait()
        ws = await stack.enter_async_context(connect(url.replace("http", "ws") + "/v1/duplex"))
        c = Client(ws)
        created = await open_session(c)
        assert created["session"]["id"].startswith("duplex-na1-")
        await echo(c, tone(4))
        async with httpx.AsyncClient() as http:
            health = (await http.get(url + "/health")).json()
        assert health["sessions"] == {"live": 0, "capacity": 8}  # as the table says
        print(json.dumps(health))
