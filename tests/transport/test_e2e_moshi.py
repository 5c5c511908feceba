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
        created = await c.recv(timeout=30.0)  # generous: a loaded CI machine, torch warm-up
        assert created["type"] == "session.created"
        assert created["session"]["capabilities"]["chunk_period_ms"] == 80
        await c.stream(tone(25), realtime=False)  # 2 s, queued ahead of real time
        audio = b""
        with_deltas = 0
        while len(audio) < 10 * FRAME * 2:  # the model speaks over much of those 2 s
            event = await c.recv(timeout=30.0)
            if event["type"] == "response.audio.delta":
                chunk = base64.b64decode(event["delta"])
                assert chunk and len(chunk) % (2 * FRAME) == 0  # whole 80 ms PCM16 frames
                audio += chunk
                with_deltas += 1
        assert with_deltas >= 1
        await c.send({"type": "session.close"})
        await c.until("session.closed", timeout=10.0)
    assert (tmp_path / "tiny-0" / "model.safetensors").is_file()


async def test_tiny_personaplex_takes_a_text_prompt(tmp_path: Path) -> None:
    from duplex.models.moshi._checkpoint import build_tiny_checkpoint

    folder = tmp_path / "plex"
    build_tiny_checkpoint(folder, seed=0, preset="tiny-personaplex")
    overrides = {
        "server.model": f"tiny-personaplex:{folder}",
        "server.model_cache_dir": str(tmp_path),
        "session.overlap_policy": "model",
    }
    async with running_server(**overrides) as server, client(server) as c:
        prompt = {"text": "You are a small robot."}
        await c.send({"type": "session.create", "session": {"prompt": {"voice": "x" * 3}}})
        refused = await c.recv()
        assert refused["type"] == "error" and refused["error"]["param"] == "session.prompt"
        await c.send({"type": "session.create", "session": {"prompt": prompt}})
        created = await c.recv()
        assert created["type"] == "session.created"
        assert created["session"]["capabilities"]["supports_prompts"] is True
        await c.send({"type": "session.update", "session": {"prompt": {"text": "other"}}})
        error = await c.until("error", timeout=10.0)
        assert error["error"]["param"] == "session.prompt"
        await c.stream(tone(25), realtime=False)  # 2 s, queued while the prompt replays
        audio = b""
        while len(audio) < 40 * FRAME * 2:  # replay (silence), then the model speaks
            event = await c.recv(timeout=10.0)
            if event["type"] == "response.audio.delta":
                audio += base64.b64decode(event["delta"])
        assert audio.strip(b"\x00")
        await c.send({"type": "session.close"})
        await c.until("session.closed", timeout=10.0)


async def test_tiny_moshi_refuses_a_prompt(tmp_path: Path) -> None:
    overrides = {"server.model": "tiny", "server.model_cache_dir": str(tmp_path)}
    async with running_server(**overrides) as server, client(server) as c:
        await c.send({"type": "session.create", "session": {"prompt": {"text": "hi"}}})
        refused = await c.recv()
        assert refused["type"] == "error"
        assert refused["error"]["code"] == "unsupported_parameter"
