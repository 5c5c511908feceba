"""End to end over a real socket on the ``tiny`` Moshi model (seeded random weights, CPU)."""

from __future__ import annotations

import base64
from pathlib import Path

from .wsclient import FRAME, client, running_server, tone


async def test_tiny_moshi_answers_a_duplex_session(tmp_path: Path) -> None:
    overrides = {
        "server.model": "tiny",
        "server.model_cache_dir": str(tmp_path),
        "session.overlap_policy": "model",
    }
    async with running_server(**overrides) as server, client(server) as c:
        await c.send({"type": "session.create", "event_id": "create-1", "session": {}})
        created = await c.recv()
        assert created["type"] == "session.created"
        assert created["session"]["capabilities"]["chunk_period_ms"] == 80
        await c.stream(tone(25), realtime=False)  # 2 s, queued ahead of real time
        audio = b""
        with_deltas = 0
        while len(audio) < 20 * FRAME * 2:  # the model speaks over most of those 2 s
            event = await c.recv(timeout=10.0)
            if event["type"] == "response.audio.delta":
                chunk = base64.b64decode(event["delta"])
                assert chunk and len(chunk) % (2 * FRAME) == 0  # whole 80 ms PCM16 frames
                audio += chunk
                with_deltas += 1
        assert with_deltas >= 1
        await c.send({"type": "session.close"})
        await c.until("session.closed", timeout=10.0)
    assert (tmp_path / "tiny-0" / "model.safetensors").is_file()
