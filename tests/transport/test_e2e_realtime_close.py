"""How a Realtime client's leaving ends its session, and the close code the log names.

A turn-based Realtime client (no ``?duplex=1``) cannot resume: when it closes cleanly
(1000, as the official SDK does when its ``connect()`` block ends) its session ends at
once, not after ``session.disconnect_grace_s``. A client that can resume (``?duplex=1``)
keeps its session for the grace, and so does one whose connection just drops (1006: it
may be a network fault). The close code logged is the one on the wire, never 1006 for a
clean close.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import trio
from openai import AsyncOpenAI
from structlog.testing import capture_logs
from websockets.trio.client import connect

from .wsclient import Server, running_server

LONG_GRACE = {"session.disconnect_grace_s": 600.0}
"""A grace no test waits out: a session that ends within a test's time ended at once."""


async def wait_for(logs: list[dict[str, Any]], event: str, **fields: Any) -> dict[str, Any]:
    """The first log line ``event`` with ``fields`` (lines are written as actors stop)."""
    with trio.fail_after(10):
        while True:
            for line in logs:
                if line["event"] == event and all(line.get(k) == v for k, v in fields.items()):
                    return line
            await trio.sleep(0.01)


async def live_sessions(server: Server) -> int:
    async with httpx.AsyncClient() as http:
        health = (await http.get(server.http + "/health")).json()
    return int(health["sessions"]["live"])


def _sdk_session(base_url: str) -> str:
    """The GA client, given only ``base_url`` (http): open, update, leave (close 1000)."""

    async def run() -> str:
        client = AsyncOpenAI(api_key="unused", base_url=base_url)
        async with client.realtime.connect(model="gpt-realtime") as conn:
            created = await conn.recv()
            await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
            async for event in conn:
                if event.type == "session.updated":
                    break
        assert created.type == "session.created"
        return str(created.session.id)  # type: ignore[union-attr]

    return asyncio.run(run())


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "two-workers"])
async def test_the_sdk_closing_with_1000_ends_its_session_at_once(workers: int) -> None:
    overrides = {**LONG_GRACE, "server.connection_workers": workers}
    with capture_logs() as logs:
        async with running_server(**overrides) as server:
            base = server.http + "/v1"
            session_id = await trio.to_thread.run_sync(_sdk_session, base)
            closed = await wait_for(logs, "session closed", session_id=session_id)
            assert closed["reason"] == "client_close"  # not disconnect_grace_expired
            gone = await wait_for(logs, "connection closed", session_id=session_id)
            assert gone["by"] == "client"
            if workers == 0:  # a worker tells the session process only that its peer left
                assert (gone["code"], gone["log_level"]) == (1000, "info")
            assert await live_sessions(server) == 0
            # and the server goes on: the next SDK session opens
            assert await trio.to_thread.run_sync(_sdk_session, base) != session_id
    assert not [line for line in logs if line.get("reason") == "disconnect_grace_expired"]


async def test_a_resumable_client_or_a_dropped_one_keeps_its_session() -> None:
    """``?duplex=1`` closing with 1000, and a turn-based client whose TCP connection just
    ends (no close frame: 1006 on the wire), keep their sessions for the grace; the
    resumable one then resumes it."""
    with capture_logs() as logs:
        async with running_server(**LONG_GRACE) as server:
            ws_base = server.http.replace("http://", "ws://") + "/v1/realtime"
            async with connect(ws_base + "?duplex=1") as ws:
                created = json.loads(await ws.recv())
                await ws.send(json.dumps({"type": "session.update", "session": {}}))
                while json.loads(await ws.recv())["type"] != "session.updated":
                    pass
            kept = created["session"]["id"]
            gone = await wait_for(logs, "connection closed", session_id=kept)
            assert (gone["code"], gone["by"]) == (1000, "client")

            async with connect(ws_base) as ws:
                dropped = json.loads(await ws.recv())["session"]["id"]
                await ws.send(json.dumps({"type": "session.update", "session": {}}))
                while json.loads(await ws.recv())["type"] != "session.updated":
                    pass
                await ws.stream.aclose()  # the TCP connection ends: no close frame
            gone = await wait_for(logs, "connection closed", session_id=dropped)
            assert (gone["code"], gone["by"]) == (1006, "client")
            assert await live_sessions(server) == 2  # both held for their grace

            async with connect(ws_base + "?duplex=1&resume=1") as ws:
                await ws.send(
                    json.dumps(
                        {
                            "type": "session.resume",
                            "session_id": kept,
                            "resume_token": created["resume_token"],
                            "last_received_server_event_seq": 0,
                        }
                    )
                )
                resumed = json.loads(await ws.recv())
                assert resumed["type"] == "session.resumed", resumed
