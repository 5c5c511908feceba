"""A node's server as its Ray actor runs it (the class alone, no Ray): started, reported,
stopped."""

from __future__ import annotations

import time

import trio
from websockets.trio.client import connect

from duplex.cluster import NodeServer

from ..transport.test_e2e_duplex import open_session
from ..transport.wsclient import Client

ENV = {
    "DUPLEX_AGENT": "false",
    "DUPLEX_REALTIME_VAD": "energy",
    "DUPLEX_TTS": "none",
    "DUPLEX_MAX_SESSIONS": "1",
    "DUPLEX_LOG_LEVEL": "warning",
}


async def test_a_node_reports_its_server_s_sessions_refusals_and_exit() -> None:
    node = NodeServer("t1", env=ENV)
    try:
        deadline = time.monotonic() + 60
        while (report := node.report()).status != "ok":
            assert report.exited is None and time.monotonic() < deadline, report
            await trio.sleep(0.2)
        assert (report.live, report.capacity, report.refused) == (0, 1, 0)
        ws_url = node.url().replace("http", "ws", 1) + "/v1/duplex"
        async with connect(ws_url) as first, connect(ws_url) as second:
            created = await open_session(Client(first))
            assert created["session"]["id"].startswith("duplex-nt1-")  # its name, in its ids
            await Client(second).send({"type": "session.create", "event_id": "x"})
            assert (await Client(second).recv())["error"]["code"] == "resource_exhausted"
            report = node.report()
            assert (report.live, report.refused) == (1, 1)
        assert node.stop(grace_s=5) == 0  # SIGTERM: a clean stop
        assert node.report().exited == 0
    finally:
        node.stop(grace_s=1)
