"""``POST /v1/omni/sleep`` and ``/v1/omni/wakeup`` end to end on the loopback engine, in one
process and behind a connection worker: an idle engine sleeps (its actor stopped, its
memory given back) and wakes; asleep, new sessions, service requests and service sockets
get ``engine_sleeping`` and ``/health`` says so; live sessions refuse a sleep unless it
is forced, and then they are told."""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from .test_e2e_duplex import open_session
from .wsclient import Client, Server, client, running_server

KEY = "sk-operator-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}
LAYOUTS = {"one-process": {}, "worker": {"server.connection_workers": 1}}


@asynccontextmanager
async def authed(server: Server) -> AsyncIterator[Client]:
    async with connect(server.url, additional_headers=AUTH, max_queue=None) as ws:
        yield Client(ws)


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_an_idle_engine_sleeps_refuses_and_wakes(layout: str) -> None:
    overrides = {"server.api_keys": (KEY,), "server.tts": "espeak", **LAYOUTS[layout]}
    async with (
        running_server(**overrides) as server,
        httpx.AsyncClient(base_url=server.http, headers=AUTH, timeout=60) as http,
    ):
        assert (await httpx.AsyncClient().post(server.http + "/v1/omni/sleep")).status_code == 401
        assert (await http.post("/v1/audio/speech", json={"input": "Hi."})).status_code == 200
        bad = await http.post("/v1/omni/sleep", json={"force": "yes"})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "force")
        slept = await http.post("/v1/omni/sleep")
        assert slept.status_code == 200, slept.text
        answer = slept.json()
        assert answer["status"] == "asleep" and answer["sessions_told"] == 0
        assert answer["memory_asleep"]["rss_bytes"] > 0
        assert (await http.post("/v1/omni/sleep")).json() == {"status": "asleep", "already": True}
        health = (await http.get("/health")).json()
        assert health["status"] == "sleeping" and health["sessions"]["capacity"] == 0
        speech = await http.post("/v1/audio/speech", json={"input": "Hi."})
        assert (speech.status_code, speech.json()["error"]["code"]) == (503, "engine_sleeping")
        assert speech.headers["retry-after"] == "5"
        async with authed(server) as c:
            await c.send({"type": "session.create", "event_id": "x"})
            error = await c.recv()
            assert error["error"]["code"] == "engine_sleeping"
            with pytest.raises(ConnectionClosed) as closed:
                await c.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        socket = server.http.replace("http://", "ws://") + "/v1/audio/speech/stream"
        async with connect(socket, additional_headers=AUTH) as ws:
            assert json.loads(await ws.recv())["code"] == "engine_sleeping"
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        woke = await http.post("/v1/omni/wakeup")
        assert woke.status_code == 200 and woke.json()["status"] == "awake"
        assert woke.json()["wake_s"] >= 0
        assert (await http.post("/v1/omni/wakeup")).json()["already"] is True
        assert (await http.get("/health")).json()["status"] == "ok"
        assert (await http.post("/v1/audio/speech", json={"input": "Hi."})).status_code == 200
        async with authed(server) as c:
            await open_session(c)  # admission is open again


async def test_live_sessions_refuse_a_sleep_unless_forced_and_are_then_told() -> None:
    async with (
        running_server() as server,
        httpx.AsyncClient(base_url=server.http, timeout=60) as http,
    ):
        async with client(server) as c:
            await open_session(c)
            refused = await http.post("/v1/omni/sleep")
            assert refused.status_code == 409
            assert refused.json()["error"]["code"] == "sessions_live"
            assert (await http.get("/health")).json()["status"] == "ok"  # still serving
            forced = await http.post("/v1/omni/sleep?force=true")
            assert forced.status_code == 200, forced.text
            assert forced.json()["sessions_told"] == 1
            told = await c.until("error")
            assert "engine_sleeping" in told["error"]["message"]
            await c.until("session.closed")  # ended, its slot released
            with pytest.raises(ConnectionClosed):
                await c.until("never")
        assert (await http.get("/health")).json()["sessions"]["live"] == 0
        assert (await http.post("/v1/omni/wakeup")).status_code == 200
        async with client(server) as again:
            await open_session(again)


def runners() -> int:
    """Live Moshi engine runners in this process (each holds its weights, KV and graphs),
    the ones the server froze at startup (``gc.freeze``) included."""
    gc.unfreeze()
    try:
        return sum(type(o).__name__ == "MoshiEngineRunner" for o in gc.get_objects())
    finally:
        gc.freeze()


async def test_asleep_the_tiny_moshi_runner_and_its_weights_are_gone(tmp_path: Path) -> None:
    overrides = {"server.model": "tiny", "server.model_cache_dir": str(tmp_path)}
    async with (
        running_server(**overrides) as server,
        httpx.AsyncClient(base_url=server.http, timeout=120) as http,
    ):
        assert runners() == 1
        slept = await http.post("/v1/omni/sleep")
        assert slept.status_code == 200 and slept.json()["engine_released"] is True
        assert runners() == 0  # nothing holds it: its tensors are freed
        woke = await http.post("/v1/omni/wakeup")
        assert woke.status_code == 200 and runners() == 1
        async with client(server) as c:
            await open_session(c)
