"""Real speech through the official ``openai`` SDK (GA and beta) on ``/v1/realtime``.

The server runs its default turn detection: ``server_vad`` on the shared silero
VAD. The client streams an espeak-ng recording (``tests/fixtures/speech``, made by
``tools/make_speech_fixtures.py``), gets ``speech_started`` / ``speech_stopped``
near the speech's true boundaries (measured here from the WAV's energy), the
committed turn and the turn responder's answer (the committed audio, played
back). Over that answer it speaks a second recording: the answer is cancelled
(``turn_detected``) and the new turn answered. It then truncates the cancelled
item to what it "played" and reads the history back. Every server event is
validated strictly against the SDK's pydantic types.

Audio goes out in 40 ms appends at `SPEEDUP` times real time: the VAD scores up
to 8 windows per 32 ms tick, so it keeps up, and every time asserted is on the
session's input clock, not the wall clock. Waits are on events, with timeouts.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio
from openai import AsyncOpenAI

from ..wire.test_realtime import check_wire
from .wsclient import running_server

SPEECH = Path(__file__).resolve().parent.parent / "fixtures" / "speech"
RATE = 24_000
BYTES_PER_MS = 2 * RATE // 1000  # PCM16 mono
CHUNK_MS = 40
SPEEDUP = 4.0
LEAD_MS = 400  # silence before the first sentence
TAIL_MS = 1000  # silence after each sentence: twice silence_duration_ms
PREFIX_MS = 300  # server_vad's default prefix_padding_ms
START_TOLERANCE_MS = 100
END_TOLERANCE_MS = 150
PLAYED_MS = 100  # what the client "played" of the cancelled answer: its first 2 frames


def load(name: str) -> bytes:
    """PCM16 bytes of a 24 kHz mono fixture."""
    with wave.open(str(SPEECH / name), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
        return w.readframes(w.getnframes())


def speech_bounds(pcm: bytes, *, floor_dbfs: float = -45.0) -> tuple[int, int]:
    """First and last ms of 10 ms frames louder than ``floor_dbfs``: the true speech."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768.0
    frames = x[: len(x) // 240 * 240].reshape(-1, 240)
    loud = np.flatnonzero(20 * np.log10(np.sqrt((frames**2).mean(axis=1)) + 1e-12) > floor_dbfs)
    return int(loud[0]) * 10, (int(loud[-1]) + 1) * 10


def silence(ms: int) -> bytes:
    return bytes(BYTES_PER_MS * ms)


HELLO = load("hello.wav")
INTERRUPT = load("interrupt.wav")


@dataclass
class Wire:
    """One SDK connection's raw event log, each event checked against the SDK's types."""

    conn: Any
    schema: str
    events: list[dict[str, Any]] = field(default_factory=list)
    sent: bytearray = field(default_factory=bytearray)
    """Every byte of input audio appended: the session's input clock."""

    async def recv(self) -> dict[str, Any]:
        event = json.loads(await self.conn.recv_bytes())
        check_wire(event, schema=self.schema, duplex=False)
        self.events.append(event)
        return event

    async def until(self, kind: str) -> dict[str, Any]:
        while True:
            event = await self.recv()
            if event["type"] == kind:
                return event

    async def speak(self, pcm: bytes) -> None:
        """Append ``pcm`` in `CHUNK_MS` pieces, `SPEEDUP` times faster than a microphone."""
        step = CHUNK_MS * BYTES_PER_MS
        for i in range(0, len(pcm), step):
            chunk = pcm[i : i + step]
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            self.sent += chunk
            await asyncio.sleep(CHUNK_MS / 1000 / SPEEDUP)


@dataclass
class Story:
    """What the test asserts on, gathered in the SDK's thread."""

    events: list[dict[str, Any]]
    sent: bytes
    turn1_at_ms: int  # input-clock ms where each sentence starts
    turn2_at_ms: int
    retrieved: dict[str, dict[str, Any]]


async def _conversation(base_url: str, *, beta: bool) -> Story:
    schema = "beta" if beta else "ga"
    client = AsyncOpenAI(api_key="unused", websocket_base_url=base_url)
    realtime = client.beta.realtime if beta else client.realtime
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    async with realtime.connect(model="gpt-realtime") as conn:
        wire = Wire(conn, schema)
        async with asyncio.timeout(30):
            created = await wire.until("session.created")
            await wire.until("conversation.created")
            session = created["session"]
            detection = (session if beta else session["audio"]["input"])["turn_detection"]
            assert detection["type"] == "server_vad" and detection["interrupt_response"]
            assert detection["prefix_padding_ms"] == PREFIX_MS
            # 1. a turn of real speech; the VAD ends it, the responder plays it back
            turn1_at = LEAD_MS
            await wire.speak(silence(LEAD_MS) + HELLO + silence(TAIL_MS))
            await wire.until("input_audio_buffer.committed")
            for _ in range(3):  # the answer is playing
                await wire.until(delta)
            # 2. the user speaks over it: barge-in, then the new turn is answered
            turn2_at = len(wire.sent) // BYTES_PER_MS
            await wire.speak(INTERRUPT + silence(TAIL_MS))
            cancelled = await wire.until("response.done")
            assert cancelled["response"]["status"] == "cancelled", cancelled
            second = await wire.until("response.done")
            assert second["response"]["status"] == "completed", second
            # 3. the client had played PLAYED_MS of the cancelled answer
            item_id = cancelled["response"]["output"][0]["id"]
            await conn.conversation.item.truncate(
                item_id=item_id, content_index=0, audio_end_ms=PLAYED_MS
            )
            await wire.until("conversation.item.truncated")
            # 4. the history, item by item
            retrieved: dict[str, dict[str, Any]] = {}
            ids = [e["item_id"] for e in wire.events if e["type"] == "input_audio_buffer.committed"]
            ids += [e["response"]["output"][0]["id"] for e in (cancelled, second)]
            for each in ids:
                await conn.conversation.item.retrieve(item_id=each)
                retrieved[each] = (await wire.until("conversation.item.retrieved"))["item"]
    return Story(wire.events, bytes(wire.sent), turn1_at, turn2_at, retrieved)


def _run(base_url: str, beta: bool) -> Story:
    return asyncio.run(_conversation(base_url, beta=beta))


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def _played_from(sent: bytes, audio: bytes, start_ms: int) -> float | None:
    """Input-clock ms where ``audio`` is an exact copy of the input, the nearest to
    ``start_ms`` within 1 ms (event times are whole ms; the committed audio starts on a
    sample)."""
    at = start_ms * RATE // 1000
    for sample in sorted(
        range(at - RATE // 1000, at + RATE // 1000 + 1), key=lambda s: abs(s - at)
    ):
        if sent[2 * sample : 2 * sample + len(audio)] == audio:
            return sample * 1000 / RATE
    return None


def _marks(start_ms: int, audio_ms: float) -> str:
    """The responder's transcript: one ``[ms]`` per started 80 ms frame."""
    return "".join(f"[{start_ms + 80 * i}]" for i in range(math.ceil(audio_ms / 80)))


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_real_speech_turns_barge_in_truncate_and_history(beta: bool) -> None:
    async with running_server() as server:  # server_vad on silero: the defaults
        base = server.http.replace("http://", "ws://") + "/v1"
        story = await trio.to_thread.run_sync(_run, base, beta)
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(server.http + "/metrics")).text
    events = story.events
    kinds = [e["type"] for e in events]
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    transcript_delta = (
        "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"
    )

    assert "error" not in kinds, [e for e in events if e["type"] == "error"]

    # speech events: one turn per sentence, near the true boundaries
    started = _of(events, "input_audio_buffer.speech_started")
    stopped = _of(events, "input_audio_buffer.speech_stopped")
    committed = _of(events, "input_audio_buffer.committed")
    assert len(started) == len(stopped) == len(committed) == 2, kinds
    for n, (at, pcm) in enumerate([(story.turn1_at_ms, HELLO), (story.turn2_at_ms, INTERRUPT)]):
        true_start, true_end = speech_bounds(pcm)
        start, end = started[n]["audio_start_ms"], stopped[n]["audio_end_ms"]
        assert abs(start + PREFIX_MS - (at + true_start)) <= START_TOLERANCE_MS, (n, start)
        assert abs(end - (at + true_end)) <= END_TOLERANCE_MS, (n, end)
        assert started[n]["item_id"] == stopped[n]["item_id"] == committed[n]["item_id"]
    assert started[1]["audio_start_ms"] >= stopped[0]["audio_end_ms"]

    # turn 1 answered; turn 2's speech start cancels that answer before its own turn
    created = _of(events, "response.created")
    dones = _of(events, "response.done")
    assert len(created) == len(dones) == 2
    first, second = dones
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    assert events.index(started[1]) < events.index(first) < events.index(committed[1])
    assert first["response"]["status"] == "cancelled"
    assert first["response"]["status_details"]["reason"] == "turn_detected"
    assert first["response"]["output"][0]["status"] == "incomplete"
    assert second["response"]["status"] == "completed"
    assert events.index(committed[1]) < events.index(created[1])
    cancelled_id = first["response"]["output"][0]["id"]
    answer_id = second["response"]["output"][0]["id"]
    assert committed[1]["previous_item_id"] == cancelled_id
    assert kinds.count("rate_limits.updated") == 2

    # each answer is the committed user audio, played back; transcript marks its frames
    for n, done in enumerate(dones):
        rid = done["response"]["id"]
        audio = b"".join(
            base64.b64decode(e["delta"]) for e in _of(events, delta) if e["response_id"] == rid
        )
        start, end = started[n]["audio_start_ms"], stopped[n]["audio_end_ms"]
        assert len(audio) % 2 == 0 and len(audio) > 0
        played_from = _played_from(story.sent, audio, start)
        assert played_from is not None and abs(played_from - start) <= 1, (n, played_from)
        marks = "".join(
            e["delta"] for e in _of(events, transcript_delta) if e["response_id"] == rid
        )
        assert marks == _marks(start, len(audio) / BYTES_PER_MS)
        assert done["response"]["output"][0]["content"][0]["transcript"] == marks
        if n == 1:  # completed: all of [audio_start_ms, audio_end_ms)
            assert abs(len(audio) / BYTES_PER_MS - (end - start)) <= 1
        else:  # cancelled after at least the 3 deltas the client waited for
            assert 3 * 80 <= len(audio) / BYTES_PER_MS < end - start

    # truncate and history
    (truncated,) = _of(events, "conversation.item.truncated")
    assert truncated["item_id"] == cancelled_id and truncated["audio_end_ms"] == PLAYED_MS
    user1, user2 = (story.retrieved[c["item_id"]] for c in committed)
    for user in (user1, user2):
        assert user["role"] == "user" and user["type"] == "message"
        assert user["content"] == [{"type": "input_audio", "transcript": None}]
    part = "audio" if beta else "output_audio"
    heard = story.retrieved[cancelled_id]
    assert heard["role"] == "assistant"
    assert heard["content"] == [
        {"type": part, "transcript": _marks(started[0]["audio_start_ms"], PLAYED_MS)}
    ]
    answer = story.retrieved[answer_id]
    assert answer["status"] == "completed"
    assert (
        answer["content"][0]["transcript"]
        == second["response"]["output"][0]["content"][0]["transcript"]
    )

    # nothing was skipped by the VAD: the appends were not too fast for it
    dropped = [
        line for line in metrics.splitlines() if line.startswith("duplex_vad_windows_dropped_total")
    ]
    assert dropped and all(float(line.split()[-1]) == 0 for line in dropped), dropped
