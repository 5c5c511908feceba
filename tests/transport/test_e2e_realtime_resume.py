"""``/v1/realtime?duplex=1`` end to end: the audio formats a session negotiates.

The formats a ``session.update`` negotiates are session settings: a socket that
resumes the session (``?duplex=1&resume=1`` + ``session.resume``) keeps decoding
and encoding G.711, with no second ``session.update``. Appends sent right after an
update decode as the session answered it.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import trio
from websockets.trio.client import connect

from duplex.codecs._g711 import ulaw_encode
from duplex.runtime._actor import Inspect
from duplex.sessions import SessionMachine

from ..wire.test_realtime import check_wire
from .wsclient import Client, Server, running_server

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


async def _input_ms(
    server: Server, url: str, session: dict, audio: bytes, chunk: int
) -> tuple[Client, float]:
    """Send ``session.update`` and, without waiting for its answer, ``audio``: the wire, and
    how much input audio the session took, in ms at the model rate."""
    async with connect(url, max_queue=None) as ws:
        c = Client(ws)
        created = await c.until("session.created")
        frames = [{"type": "session.update", "event_id": "u1", "session": session}]
        for i in range(0, len(audio), chunk):
            frames.append(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(
                    audio[i : i + chunk]).decode()}
            )  # fmt: skip
        # a marker the session refuses, naming it: it answers in order, so by then every
        # append before it was taken
        frames.append({"type": "conversation.item.retrieve", "event_id": "last", "item_id": "x"})
        for frame in frames:  # back to back: the server reads them before it answers
            await c.send(json.dumps(frame))
        while not any(e["error"]["event_id"] == "last" for e in c.of("error")):
            await c.recv()
        ref = server.system.lookup(created["session"]["id"])
        assert ref is not None
        machine: SessionMachine = await ref.ask(Inspect(), timeout=10)
        return c, machine.input_ms


@pytest.mark.parametrize("workers", [0, 1])
async def test_appends_right_after_an_update_decode_as_the_session_answers(workers: int) -> None:
    """The appends that follow a ``session.update`` with no wait decode in the format the
    session took: μ-law when it accepts the update, still PCM16 when it refuses it. The
    session's input clock says how every append was read: 2 s of μ-law is 2000 ms, and
    any 80 ms frame read as PCM16 would be 13 ms."""
    overrides = {"session.overlap_policy": "model", "server.connection_workers": workers}
    async with running_server(**overrides) as server:
        url = server.http.replace("http://", "ws://") + "/v1/realtime?model=loopback&duplex=1"
        tone = _ulaw_tone(1.0) + ulaw_encode(np.zeros(8000, np.int16))
        c, taken = await _input_ms(server, url, G711, tone, 640)
        assert len(c.of("session.updated")) == 1 and taken == 2000.0
        refused = {**G711, "overlap_short_ack_ms": 5000}  # not below the barge-in threshold
        pcm = (0.3 * 32767 * np.sin(np.arange(24000) * 2 * np.pi * 440 / 24000)).astype("<i2")
        c, taken = await _input_ms(server, url, refused, pcm.tobytes() + bytes(48000), 3840)
        u1 = [e["error"] for e in c.of("error") if e["error"]["event_id"] == "u1"]
        assert [e["param"] for e in u1] == ["session.overlap_barge_in_ms"]  # must exceed it
        # still PCM16: 2 s at 24 kHz; read as μ-law, 96,000 bytes would be 12 s
        assert not c.of("session.updated") and taken == 2000.0
