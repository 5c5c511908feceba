"""The official ``openai`` SDK against a real server, turn-based (no ``?duplex=1``).

Server VAD ends the user's turn, the turn responder answers with the user's own
audio, speech over the answer cancels it (``turn_detected``), the client
truncates what it did not play and reads the history back. Every event received
is validated strictly against the SDK's own pydantic models.

Needs the connection actor to open Realtime sessions with
``projection.initial_options`` (turn-based); until then it skips.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI

from ..wire.test_realtime import check_wire
from .wsclient import ENERGY_VAD, running_server, silence, tone

CHUNK = 3840  # 80 ms of PCM16 at 24 kHz


async def _recv(conn: Any, schema: str, events: list[dict]) -> dict:
    event = json.loads(await conn.recv_bytes())
    check_wire(event, schema=schema, duplex=False)
    events.append(event)
    return event


async def _until(conn: Any, schema: str, events: list[dict], kind: str) -> dict:
    while True:
        event = await _recv(conn, schema, events)
        if event["type"] == kind:
            return event


async def _send_audio(conn: Any, pcm: bytes) -> None:
    for i in range(0, len(pcm), CHUNK):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + CHUNK]).decode())


async def _conversation(base_url: str, *, beta: bool) -> list[dict] | None:
    schema = "beta" if beta else "ga"
    client = AsyncOpenAI(api_key="unused", websocket_base_url=base_url)
    realtime = client.beta.realtime if beta else client.realtime
    events: list[dict] = []
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    async with realtime.connect(model="gpt-realtime") as conn:
        created = await _recv(conn, schema, events)
        session = created["session"]
        audio_input = session if beta else session["audio"]["input"]
        detection = audio_input["turn_detection"]
        if not detection or not detection["create_response"]:
            return None  # the connection does not open turn-based sessions yet
        async with asyncio.timeout(20):
            # 1. a turn: speech, then silence; server VAD commits it and the responder answers
            await _send_audio(conn, tone(6) + silence(8))
            committed = await _until(conn, schema, events, "input_audio_buffer.committed")
            first = await _until(conn, schema, events, "response.done")
            assert first["response"]["status"] == "completed"
            # 2. a longer turn, and speech over its answer
            await _send_audio(conn, tone(12, start=6) + silence(8))
            await _until(conn, schema, events, delta)
            await _send_audio(conn, tone(4, start=20))
            cancelled = await _until(conn, schema, events, "response.done")
            item_id = cancelled["response"]["output"][0]["id"]
            # 3. the client heard 80 ms of it
            await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=80)
            await _until(conn, schema, events, "conversation.item.truncated")
            await conn.conversation.item.retrieve(item_id=committed["item_id"])
            await _until(conn, schema, events, "conversation.item.retrieved")
            await conn.send({"type": "conversation.item.retrieve", "item_id": item_id})
            events.append({"retrieved_assistant": await _until(
                conn, schema, events, "conversation.item.retrieved")})  # fmt: skip
    return events


def _run(base_url: str, beta: bool) -> list[dict] | None:
    return asyncio.run(_conversation(base_url, beta=beta))


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_openai_sdk_turn_based_vad_barge_in_truncate_history(beta: bool) -> None:
    async with running_server(**ENERGY_VAD) as server:  # tones: silero ignores them
        base = server.http.replace("http://", "ws://") + "/v1"
        events = await trio.to_thread.run_sync(_run, base, beta)
    if events is None:
        pytest.skip("the connection actor does not pass projection.initial_options to hub.open")
    kinds = [e.get("type") for e in events]
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    started = [e for e in events if e.get("type") == "input_audio_buffer.speech_started"]
    assert started[0]["audio_start_ms"] == 0 and started[0]["item_id"].startswith("item_")
    first_done = kinds.index("response.done")
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events[:first_done] if e.get("type") == delta
    )
    assert audio == tone(6)  # the responder answers with the committed speech
    dones = [e for e in events if e.get("type") == "response.done"]
    assert dones[1]["response"]["status"] == "cancelled"
    assert dones[1]["response"]["status_details"]["reason"] == "turn_detected"
    assert "rate_limits.updated" in kinds
    truncated = next(e for e in events if e.get("type") == "conversation.item.truncated")
    assert truncated["audio_end_ms"] == 80
    assistant = events[-1]["retrieved_assistant"]["item"]
    assert assistant["role"] == "assistant"
    # the second answer echoes input from 820 ms (1120 ms speech start - 300 ms padding)
    assert assistant["content"][0]["transcript"] == "[820]"  # only what was heard
