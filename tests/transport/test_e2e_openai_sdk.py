"""The official ``openai`` SDK's realtime clients, unchanged, against ``/v1/realtime``.

The SDK is asyncio; it runs in a worker thread with its own loop while the
server runs on trio. Every event it receives is parsed into the SDK's own types.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

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
