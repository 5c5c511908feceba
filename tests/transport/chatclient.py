"""A Moshi ``/api/chat`` client for end-to-end tests: Kyutai's own Ogg/Opus (``sphn``) on
a websockets (trio) connection, speaking the tags as ``moshi.client`` does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sphn
import trio
from websockets.trio.client import ClientConnection, connect

from .wsclient import FRAME, Server


def tone_f32(frames: int, hz: float, *, amplitude: float = 0.3, start: int = 0) -> np.ndarray:
    n = np.arange(start * FRAME, (start + frames) * FRAME)
    return (amplitude * np.sin(2 * np.pi * hz * n / 24000)).astype(np.float32)


def chat_url(server: Server, path: str = "/api/chat", query: str = "") -> str:
    url = server.url.replace("/v1/duplex", path)
    return f"{url}?{query}" if query else url


@dataclass
class ChatClient:
    """Sends mic frames through ``sphn``'s writer; decodes what comes back with its reader."""

    ws: ClientConnection
    writer: Any = field(default_factory=lambda: sphn.OpusStreamWriter(24000))
    reader: Any = field(default_factory=lambda: sphn.OpusStreamReader(24000))
    kinds: list[int] = field(default_factory=list)
    pcm: list[np.ndarray] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def send_pcm(self, pcm: np.ndarray) -> None:
        """One or more 80 ms frames, as ``moshi.client`` sends its 1,920-sample blocks."""
        for i in range(0, len(pcm), FRAME):
            data = self.writer.append_pcm(pcm[i : i + FRAME])
            if data:
                await self.ws.send(b"\x01" + data)

    async def recv(self, timeout: float = 10.0) -> int:
        """One message; returns its kind (audio decoded, text and errors kept)."""
        with trio.fail_after(timeout):
            message = await self.ws.recv()
        assert isinstance(message, bytes), "the server sent a text frame"
        kind = message[0]
        self.kinds.append(kind)
        if kind == 1:
            self.pcm.append(self.reader.append_bytes(message[1:]))
        elif kind == 2:
            self.text.append(message[1:].decode())
        elif kind == 5:
            self.errors.append(message[1:].decode())
        return kind

    async def until(self, kind: int, timeout: float = 10.0) -> None:
        with trio.fail_after(timeout):
            while await self.recv(timeout) != kind:
                pass

    @property
    def samples(self) -> int:
        return sum(len(p) for p in self.pcm)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.pcm) if self.pcm else np.zeros(0, np.float32)


@asynccontextmanager
async def chat(server: Server, query: str = "") -> AsyncIterator[ChatClient]:
    async with connect(chat_url(server, query=query), max_queue=None) as ws:
        yield ChatClient(ws)


def dominant_hz(pcm: np.ndarray) -> float:
    """The strongest frequency of ``pcm`` at 24 kHz."""
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.fft.rfftfreq(len(pcm), 1 / 24000)[int(np.argmax(spectrum))])


def loud_frames_hz(pcm: np.ndarray, *, rms: float = 0.1) -> list[float]:
    """`dominant_hz` of each 80 ms frame of ``pcm`` louder than ``rms``."""
    frames = pcm[: len(pcm) // FRAME * FRAME].reshape(-1, FRAME)
    return [dominant_hz(f) for f in frames if np.sqrt(np.mean(f * f)) > rms]
