"""Helpers for the agent's tests: the speech fixtures, a JSGF grammar of what they say,
and a Realtime socket that streams a WAV like a microphone."""

from __future__ import annotations

import base64
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import trio
from websockets.trio.client import ClientConnection

SPEECH = Path(__file__).resolve().parents[1] / "fixtures" / "speech"
FRAME_BYTES = 3840  # 80 ms of PCM16 at 24 kHz
HELLO = "hello could you tell me the weather for tomorrow"
INTERRUPT = "wait stop i have another question"
GRAMMAR = f"""#JSGF V1.0;
grammar fixtures;
public <utterance> = {HELLO} | {INTERRUPT};
"""
"""What the fixtures say: pocketsphinx decodes with it, so what it hears is deterministic."""


def grammar_file(folder: Path) -> str:
    path = folder / "fixtures.gram"
    path.write_text(GRAMMAR)
    return str(path)


def wav_pcm16(name: str) -> bytes:
    """A fixture's PCM16 at 24 kHz, mono."""
    with wave.open(str(SPEECH / name)) as w:
        assert w.getframerate() == 24_000 and w.getnchannels() == 1
        return w.readframes(w.getnframes())


def silence(ms: int) -> bytes:
    return bytes(2 * 24 * ms)


def rms(pcm16: bytes) -> float:
    samples = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


class RealtimeSocket:
    """A raw Realtime socket: sends events, records every server event with its arrival."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.arrivals: list[float] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def stream(self, pcm: bytes, *, realtime: bool = True) -> None:
        for i in range(0, len(pcm), FRAME_BYTES):
            chunk = base64.b64encode(pcm[i : i + FRAME_BYTES]).decode()
            await self.send({"type": "input_audio_buffer.append", "audio": chunk})
            if realtime:
                await trio.sleep(0.08)

    async def pump(self) -> None:
        """Record events until the socket closes (run it in a nursery)."""
        async for text in self.ws:
            self.events.append(json.loads(text))
            self.arrivals.append(trio.current_time())

    async def until(self, kind: str, *, after: int = 0, timeout: float = 30.0) -> dict[str, Any]:
        """The first event of ``kind`` at index ``after`` or later, waiting for it."""
        with trio.fail_after(timeout):
            while True:
                for event in self.events[after:]:
                    if event["type"] == kind:
                        return event
                await trio.sleep(0.01)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]
