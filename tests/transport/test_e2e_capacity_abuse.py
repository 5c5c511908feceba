"""Capacity taken without a word: silent sockets, create-and-drop cycles, one peer's many sockets.

Each limit is tested both ways: it refuses (or frees), and service comes back.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.trio.client import ClientConnection, connect

from duplex.sessions import SessionState

from .test_e2e_duplex import wait_detached
from .wsclient import ENERGY_VAD, Server, client, running_server


async def _live(server: Server) -> int:
    async with httpx.AsyncClient() as http:
        health = (await http.get(server.http + "/health")).json()
    return int(health["sessions"]["live"])


async def _until_live(server: Server, count: int, within_s: float) -> None:
    with trio.fail_after(within_s):
        while await _live(server) != count:
            await trio.sleep(0.05)


async def _updated(ws: ClientConnection) -> None:
    await ws.send(json.dumps({"type": "session.update", "session": {}}))
    with trio.fail_after(5):
        while (event := json.loads(await ws.recv()))["type"] != "session.updated":
            assert event["type"] != "error", event


async def test_a_silent_realtime_socket_is_closed_and_frees_its_slot() -> None:
    """/v1/realtime opens its session on connect; before, a silent socket held it for good."""
    overrides = {"server.first_event_timeout_s": 0.5, "server.max_sessions": 1, **ENERGY_VAD}
    async with running_server(**overrides) as server:
        url = server.url.replace("/v1/duplex", "/v1/realtime")
        async with connect(url) as silent:
            assert json.loads(await silent.recv())["type"] == "session.created"
            with trio.fail_after(5):
                while (error := json.loads(await silent.recv()))["type"] != "error":
                    pass
            assert (error["type"], error["error"]["code"]) == ("error", "first_event_timeout")
            with pytest.raises(ConnectionClosed) as closed:
                await silent.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        await _until_live(server, 0, within_s=2)  # not after the 30 s resume grace
        async with connect(url) as talking:  # the slot is free, and a client that speaks keeps it
            assert json.loads(await talking.recv())["type"] == "session.created"
            await _updated(talking)
            await trio.sleep(1.0)  # twice the timeout: a session that was used is never timed out
            await _updated(talking)


async def test_create_and_drop_cycles_do_not_hold_slots_for_the_grace() -> None:
    """Before, each dropped session held its slot for ``disconnect_grace_s`` (30 s)."""
    async with running_server(**{"server.max_sessions": 2}) as server:
        for _ in range(6):
            async with client(server) as c:
                await c.send({"type": "session.create"})
                assert (await c.recv())["type"] == "session.created"
            await _until_live(server, 0, within_s=2)
        async with client(server) as a, client(server) as b:
            for c in (a, b):
                await c.send({"type": "session.create"})
                assert (await c.recv())["type"] == "session.created"


async def test_a_used_session_still_waits_for_its_resume() -> None:
    async with running_server() as server:
        async with client(server) as c:
            await c.send({"type": "session.create"})
            created = await c.recv()
            await c.send({"type": "session.update", "session": {}})
            await c.until("session.updated")
        # once it has seen its socket go, it waits (a session that ended would be gone)
        machine = await wait_detached(server, created["session"]["id"])
        assert machine.state is SessionState.DETACHED
        assert await _live(server) == 1  # inside its grace
        async with client(server) as again:
            await again.send(
                {
                    "type": "session.resume",
                    "session_id": created["session"]["id"],
                    "resume_token": created["resume_token"],
                }
            )
            assert (await again.recv())["type"] == "session.resumed"


async def test_one_peer_may_hold_only_so_many_sockets_and_gets_in_again() -> None:
    async with (
        running_server(**{"server.max_connections_per_peer": 2}) as server,
        connect(server.url),
        connect(server.url) as second,
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(server.url):
                pass
        response = refused.value.response
        assert response.status_code == 429
        assert json.loads(response.body)["error"]["code"] == "too_many_connections"
        async with httpx.AsyncClient() as http:  # an HTTP request in flight counts too
            assert (await http.get(server.http + "/health")).status_code == 429
        await second.aclose()
        with trio.fail_after(2):
            while True:  # the refused peer gets in once one of its sockets has closed
                try:
                    async with connect(server.url) as third:
                        await third.send(json.dumps({"type": "session.create"}))
                        assert json.loads(await third.recv())["type"] == "session.created"
                        break
                except InvalidStatus:
                    await trio.sleep(0.05)
