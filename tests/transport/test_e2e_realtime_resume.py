"""``/v1/realtime?duplex=1`` end to end: the audio formats survive a resume.

The formats a ``session.update`` negotiates are session settings: a socket that
resumes the session (``?duplex=1&resume=1`` + ``session.resume``) keeps decoding
and encoding G.711, with no second ``session.update``.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import trio
from websockets.trio.client import connect

from duplex.transport._g711 import ulaw_encode

from .test_realtime_wire import check_wire
from .wsclient import Client, running_server

G711 = {"input_audio_format": "g711_ulaw", "output_audio_format": "g711_ulaw"}


def _ulaw_tone(seconds: float) -> bytes:
    n = np.arange(int(8000 * seconds))
    return ulaw_encode((0.3 * 32767 * np.sin(2 * np.pi * 440 * n / 8000)).astype(np.int16))


async def test_a_resumed_realtime_socket_keeps_g711() -> None:
    async with running_server(**{"session.overlap_policy": "model"}) as server:
        base = server.http.replace("http://", "ws://") + "/v1/realtime?model=loopback&duplex=1"
        async with connect(base, max_queue=None) as ws:
            c = Client(ws)
            created = await c.until("session.created")
            await c.send({"type": "session.update", "session": G711})
            updated = await c.until("session.updated")
            assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu"}
        async with connect(base + "&resume=1", max_queue=None) as ws:
            c = Client(ws)
            await c.send({
                "type": "session.resume", "session_id": created["session"]["id"],
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": updated["server_event_seq"],
            })  # fmt: skip
            await c.until("session.resumed")
            tone = _ulaw_tone(1.0) + ulaw_encode(np.zeros(8000, np.int16))
            for i in range(0, len(tone), 640):  # 80 ms of μ-law
                audio = base64.b64encode(tone[i : i + 640]).decode()
                await c.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            with trio.move_on_after(3):
                while sum(len(base64.b64decode(d["delta"])) for d in c.of(
                        "response.output_audio.delta")) < 4000:  # fmt: skip
                    await c.recv()
    for event in c.events:
        check_wire(event, schema="ga", duplex=True)
    deltas = c.of("response.output_audio.delta")
    assert deltas and {(d["format"], d["sample_rate_hz"]) for d in deltas} == {("g711_ulaw", 8000)}
    # decoded as μ-law at 8 kHz, 1 s of input is echoed as ~1 s; read as PCM16 it was 1/6 of it
    assert sum(len(base64.b64decode(d["delta"])) for d in deltas) >= 4000
