"""File descriptors running out (issue 35), against a real ``duplex serve`` whose descriptor
limit is low (192, soft and hard, so raising the soft one does not help).

Before: with the limit reached (1,100 stalled bodies at 1,024), ``accept`` failed with
``EMFILE`` and ``/health`` and new sessions were offline until the stalls timed out
(30 s). Now the server holds connections below its limit by a reserve: at the cap the
longest-waiting stalled body is closed to make room (both ways: refused at the cap, the
newcomer served); when every held connection works (open WebSockets) a newcomer gets
``/health`` and ``503 server_busy``, and is served in full once one of them closes.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
from websockets.exceptions import InvalidStatus
from websockets.trio.client import connect

from tests.helpers import parse_metrics

from .test_e2e_bounded_media import serving

FILES = 192
CONFIG = """
[server]
agent = false
"""


async def figures(http: httpx.AsyncClient, url: str) -> tuple[float, float, float]:
    """The cap, the held connections that work, and those evicted (idle: accepted, its
    request not read yet; uploading: a stalled body)."""
    reply = await http.get(url + "/metrics", headers={"Connection": "close"})
    assert reply.status_code == 200, reply.text[:300]
    found = parse_metrics(reply.text)
    limit = found.one("duplex_http_connections_limit")
    working = found.one("duplex_http_connections", state="working")
    assert limit is not None and working is not None
    shed = ("evicted_idle", "evicted_uploading")
    evicted = sum(found.sum("duplex_http_connections_shed_total", reason=r) for r in shed)
    return limit, working, evicted


async def test_connections_past_the_descriptor_limit_keep_health_and_sessions(
    tmp_path: Path,
) -> None:
    async with (
        serving(tmp_path, CONFIG, max_open_files=FILES) as (url, _, lines),
        httpx.AsyncClient(timeout=10) as http,
    ):
        port = int(url.rsplit(":", 1)[1])
        limit, _, _ = await figures(http, url)
        assert 8 <= limit <= FILES - 64, limit  # below the descriptors, by the reserve
        head = (
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{"
        ).encode()

        # 1. stalled bodies, more than the process has descriptors for: the oldest go
        stalled = []
        for _ in range(FILES + 20):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(head)
            stalled.append(stream)
        with trio.fail_after(5):  # before: offline until the 30 s body deadline
            assert (await http.get(url + "/health")).status_code == 200
            whole = {"input": "Hi.", "voice": "alloy", "response_format": "wav"}
            assert (await http.post(url + "/v1/audio/speech", json=whole)).status_code == 200
            async with connect(url.replace("http", "ws") + "/v1/realtime") as ws:
                assert b"session.created" in (await ws.recv()).encode()
        _, _, evicted = await figures(http, url)
        assert evicted >= FILES + 20 - limit, (evicted, limit)
        for stream in stalled:
            await stream.aclose()
        assert not any("accept failed" in line for line in lines)

        # 2. every held connection works (open WebSockets): a newcomer gets /health only
        async with trio.open_nursery() as nursery:
            opened: list[trio.Event] = []
            release = trio.Event()
            close_one = trio.Event()

            async def hold(last: bool) -> None:
                async with connect(url.replace("http", "ws") + "/v1/duplex"):
                    opened[-1].set()
                    await (close_one.wait() if last else release.wait())

            for index in range(int(limit)):
                opened.append(trio.Event())
                nursery.start_soon(hold, index == 0)
                await opened[-1].wait()
            with trio.fail_after(5):
                assert (await http.get(url + "/health")).status_code == 200
                busy = await http.post(url + "/v1/audio/speech", json=whole)
                assert busy.status_code == 503, busy.text
                assert busy.json()["error"]["code"] == "server_busy"
                assert busy.headers["retry-after"] == "1"
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(url.replace("http", "ws") + "/v1/realtime"):
                        pass  # pragma: no cover
                assert refused.value.response.status_code == 503
            close_one.set()  # one session ends: a newcomer is served in full again
            with trio.fail_after(5):
                while (await http.post(url + "/v1/audio/speech", json=whole)).status_code != 200:
                    await trio.sleep(0.05)
            release.set()
        counted = parse_metrics((await http.get(url + "/metrics")).text)
        assert counted.sum("duplex_http_connections_shed_total", reason="busy") >= 2
