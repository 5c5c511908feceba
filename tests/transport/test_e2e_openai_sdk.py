"""The official ``openai`` SDK's realtime clients, unchanged, against ``/v1/realtime``.

The SDK is asyncio; it runs in a worker thread with its own loop while the
server runs on trio. Every event it receives is parsed into the SDK's own types.
"""

from __future__ import annotations

import asyncio
import base64
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from openai import AsyncOpenAI

from .wsclient import ENERGY_VAD, running_server, silence, tone


async def _conversation(base_url: str, *, beta: bool) -> list[Any]:
    client = AsyncOpenAI(api_key="unused", websocket_base_url=base_url)
    realtime = client.beta.realtime if beta else client.realtime
    events: list[Any] = []
    async with realtime.connect(model="gpt-realtime") as conn:
        events.append(await conn.recv())  # session.created
        fmt = {"input_audio_format": "pcm16"} if beta else {"type": "realtime"}
        await conn.session.update(session=fmt)  # type: ignore[arg-type]
        audio = tone(6) + silence(8)
        for i in range(0, len(audio), 3840):
            chunk = base64.b64encode(audio[i : i + 3840]).decode()
            await conn.input_audio_buffer.append(audio=chunk)
        async with asyncio.timeout(10):
            async for event in conn:
                events.append(event)
                if event.type == "response.done":
                    break
    return events


def _run(base_url: str, beta: bool) -> list[Any]:
    return asyncio.run(_conversation(base_url, beta=beta))


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_openai_sdk_streams_audio_and_gets_a_spoken_response(beta: bool) -> None:
    async with running_server(**ENERGY_VAD) as server:  # tones: silero ignores them
        base = server.http.replace("http://", "ws://") + "/v1"
        events = await trio.to_thread.run_sync(_run, base, beta)
    kinds = [e.type for e in events]
    assert kinds[0] == "session.created"
    assert "session.updated" in kinds
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    assert kinds.index("response.created") < kinds.index(delta)
    assert kinds[-1] == "response.done" and events[-1].response.status == "completed"
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == delta)
    assert audio == tone(6)  # the loopback answers with what it heard


def _connect_only(beta: bool, **urls: str) -> str:
    """Open a realtime connection with the SDK given ``urls`` alone; the first event's type,
    or the error's text."""

    async def run() -> str:
        client = AsyncOpenAI(api_key="unused", **urls)
        realtime = client.beta.realtime if beta else client.realtime
        try:
            async with asyncio.timeout(10), realtime.connect(model="gpt-realtime") as conn:
                return str((await conn.recv()).type)
        except Exception as exc:  # what the SDK raises is the finding
            return f"{type(exc).__name__}: {exc}"

    return asyncio.run(run())


async def test_which_url_each_realtime_client_takes() -> None:
    """The GA client derives ``ws://`` from an ``http://`` ``base_url``; the beta client
    derives ``wss://`` whatever the scheme (``openai/resources/beta/realtime/realtime.py``,
    ``_prepare_url``), so against a plain-HTTP server it needs ``websocket_base_url``
    (docs/protocol/realtime.md). The server logs and counts the TLS it was sent."""
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        async with running_server() as server:
            http_base, ws_base = server.http + "/v1", server.http.replace("http", "ws") + "/v1"
            ga = await trio.to_thread.run_sync(partial(_connect_only, False, base_url=http_base))
            beta_plain = await trio.to_thread.run_sync(
                partial(_connect_only, True, base_url=http_base)
            )
            beta_ws = await trio.to_thread.run_sync(
                partial(_connect_only, True, base_url=http_base, websocket_base_url=ws_base)
            )
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(server.http + "/metrics")).text
    assert ga == "session.created"
    assert "WRONG_VERSION_NUMBER" in beta_plain or "SSL" in beta_plain, beta_plain
    assert beta_ws == "session.created"
    (line,) = [e for e in logs if e.get("kind") == "tls_on_plain_port"]
    assert "websocket_base_url" in line["error"] and line["log_level"] == "warning"
    assert 'duplex_http_connection_errors_total{kind="tls_on_plain_port"} 1' in metrics
