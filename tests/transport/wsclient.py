"""A real server on loopback and a small websockets (trio) client for end-to-end tests."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import trio
from websockets.trio.client import ClientConnection, connect

from duplex.actors import ActorSystem, open_actor_system
from duplex.config import load_config
from duplex.metrics import MetricsRegistry
from duplex.topology import serve_duplex
from duplex.topology._server import SERVER_DEAD_LETTERS

FRAME = 1920  # 80 ms at 24 kHz
ENERGY_VAD = {"server.realtime_vad": "energy"}
"""Realtime turn-based sessions on the energy VAD: for tests that speak in `tone`s, which
silero (the default) rightly takes for no speech."""


@dataclass
class Server:
    url: str
    http: str
    system: ActorSystem
    registry: MetricsRegistry


@asynccontextmanager
async def running_server(
    *, dead_letters: int = SERVER_DEAD_LETTERS, **overrides: Any
) -> AsyncIterator[Server]:
    """``duplex`` on 127.0.0.1 with a free port; ``overrides`` are ``section.key`` values;
    ``dead_letters``: how many the actor system keeps (by default as ``duplex serve``)."""
    registry = MetricsRegistry()
    config = load_config(
        env={},
        overrides={
            "server.port": 0,
            "server.shutdown_grace_s": 0.5,
            "server.agent": False,  # the session surface's tests: the replaying responder
            **overrides,
        },
    )
    async with (
        open_actor_system(registry=registry, dead_letter_capacity=dead_letters) as system,
        trio.open_nursery() as nursery,
    ):
        binds = await nursery.start(partial(serve_duplex, config, system, registry=registry))
        http = binds[0]
        yield Server(http.replace("http://", "ws://") + "/v1/duplex", http, system, registry)
        system.request_shutdown()


def tone(frames: int, *, amplitude: float = 0.3, start: int = 0) -> bytes:
    """PCM16 of a 440 Hz tone, loud enough to count as speech."""
    n = np.arange(start * FRAME, (start + frames) * FRAME)
    pcm = amplitude * np.sin(2 * np.pi * 440 * n / 24000)
    return (pcm * 32767).astype("<i2").tobytes()


def silence(frames: int) -> bytes:
    return bytes(2 * FRAME * frames)


def append(pcm: bytes, **extra: Any) -> str:
    return json.dumps(
        {
            "type": "input_audio_buffer.append",
            "audio": base64.b64encode(pcm).decode(),
            "sample_rate": 24000,
            **extra,
        }
    )


class Client:
    """Sends JSON events, collects every server event (in order) for assertions."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(event if isinstance(event, str | bytes) else json.dumps(event))

    async def stream(self, pcm: bytes, *, realtime: bool = True) -> None:
        """Send ``pcm`` in 80 ms frames, paced like a microphone when ``realtime``."""
        for i in range(0, len(pcm), 2 * FRAME):
            await self.send(append(pcm[i : i + 2 * FRAME]))
            if realtime:
                await trio.sleep(0.08)

    async def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            event = json.loads(await self.ws.recv())
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 5.0) -> dict[str, Any]:
        """Receive until an event of type ``kind`` arrives; returns it."""
        with trio.fail_after(timeout):
            while True:
                event = await self.recv(timeout)
                if event["type"] == kind:
                    return event

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


@asynccontextmanager
async def client(server: Server) -> AsyncIterator[Client]:
    async with connect(server.url, max_queue=None) as ws:  # never pause reading in tests
        yield Client(ws)
