"""HTTP requests within the limits that took the host down (issue 35), against a real
``duplex serve``: speech amplified a few kilobytes into hundreds of megabytes, stalled
and trickled bodies held their sockets for minutes, one peer's requests had no cap.
Each limit is shown both ways: it refuses, and the server serves once the cause is gone.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import wave
from pathlib import Path

import httpx
import trio

from .test_e2e_bounded_media import serving

SPEECH = """
[server]
agent = false
speech_max_audio_s = 5.0
http_body_timeout_s = 1.0
max_connections_per_peer = 3
"""


def error(response: httpx.Response, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    found = response.json()["error"]
    assert found["code"] == code, found
    return found  # type: ignore[no-any-return]


async def test_speech_audio_is_bounded_before_any_is_made(tmp_path: Path) -> None:
    """The issue's batch (4 x 2048 characters at speed 0.25, 48 kHz WAV: 227 MB before)
    and a text over a 5 s ceiling are refused at once naming ``input``; one under it is
    made, and its audio is under the ceiling."""
    async with serving(tmp_path, SPEECH) as (url, _, _lines), httpx.AsyncClient(timeout=60) as http:
        text = "The quick brown fox jumps over the lazy dog. " * 46  # 2070 characters
        batch = {"input": [text[:2048]] * 4, "voice": "alloy", "speed": 0.25,
                 "response_format": "wav", "sample_rate": 48000}  # fmt: skip
        with trio.fail_after(2):
            answer = await http.post(url + "/v1/audio/speech/batch", json=batch)
        found = error(answer, 400, "audio_too_long")
        assert found["param"] == "input" and "speech.max_audio_s" in found["message"]
        long_one = {"input": text[:120], "voice": "alloy", "response_format": "wav"}
        error(await http.post(url + "/v1/audio/speech", json=long_one), 400, "audio_too_long")

        odd = {"input": "Hi.", "voice": "v" * 10_000}
        message = error(await http.post(url + "/v1/audio/speech", json=odd), 400, "invalid_value")
        assert len(message["message"]) < 1000 and "10002 characters" in message["message"]

        short = {"input": "Hello there, friend.", "voice": "alloy", "response_format": "wav"}
        made = await http.post(url + "/v1/audio/speech", json=short)
        assert made.status_code == 200, made.text
        with wave.open(io.BytesIO(made.content)) as clip:
            assert 0 < clip.getnframes() / clip.getframerate() <= 5.0


async def test_a_stalled_or_trickled_body_gets_408_and_the_server_serves_on(
    tmp_path: Path,
) -> None:
    """Before: no deadline (200 stalled bodies, none closed in 90 s). A body that stops
    after its headers, and one that trickles a byte a second, are answered 408 within the
    1 s deadline plus its rate allowance; a whole body still gets through."""
    async with serving(tmp_path, SPEECH) as (url, _, lines), httpx.AsyncClient(timeout=60) as http:
        port = int(url.rsplit(":", 1)[1])
        head = (
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
        ).encode()

        async def answered(trickle: bool) -> tuple[bytes, float]:
            """What the server answers a body that stops (or trickles), read to its close."""
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            started = trio.current_time()
            await stream.send_all(head + b'{"input": "')
            reply = b""
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:

                    async def drip() -> None:
                        with contextlib.suppress(trio.BrokenResourceError):
                            while True:
                                await trio.sleep(1.0)
                                await stream.send_all(b"a")

                    if trickle:
                        nursery.start_soon(drip)
                    while chunk := await stream.receive_some(65536):
                        reply += chunk
                    nursery.cancel_scope.cancel()
            await stream.aclose()
            return reply, trio.current_time() - started

        for trickle in (False, True):
            reply, took = await answered(trickle)
            assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
            assert b'"body_timeout"' in reply
            assert took < 4.0, took
        assert any('"request body timed out"' in line for line in lines)
        text = (await http.get(url + "/metrics")).text
        counted = re.search(r"^duplex_http_body_timeouts_total (\S+)$", text, re.M)
        assert counted is not None and float(counted[1]) == 2, text[-2000:]
        whole = {"input": "Hi.", "voice": "alloy", "response_format": "wav"}
        assert (await http.post(url + "/v1/audio/speech", json=whole)).status_code == 200


async def test_http_requests_in_flight_count_against_the_per_peer_cap(tmp_path: Path) -> None:
    """Before: the cap counted WebSockets only. Three stalled bodies of one peer hold its
    cap (3): a fourth request is refused 429 ``too_many_connections``; once the bodies'
    deadline has ended them, the peer is served again."""
    async with serving(tmp_path, SPEECH) as (url, _, _lines), httpx.AsyncClient(timeout=60) as http:
        port = int(url.rsplit(":", 1)[1])
        head = (
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{"
        ).encode()
        stalled = []
        for _ in range(3):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(head)
            stalled.append(stream)
        await trio.sleep(0.2)  # (each request has reached the app: its count is taken)
        refused = await http.get(url + "/health")
        error(refused, 429, "too_many_connections")
        for stream in stalled:  # each gets its 408 at its deadline
            with trio.fail_after(10):
                reply = b""
                while b"408" not in reply:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    reply += chunk
            await stream.aclose()
        with trio.fail_after(10):
            while (await http.get(url + "/health")).status_code == 429:
                await trio.sleep(0.05)
        assert json.loads((await http.get(url + "/health")).text)
