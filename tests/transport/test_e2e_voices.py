"""Uploaded voices end to end: the official SDK's ``audio.voices`` against ``duplex serve``
(through a connection worker, so the routes are relayed), a restart that keeps them,
PersonaPlex's ``/api/chat?voice_prompt=`` speaking with one, and the TTS refusing one
it cannot condition on (``voice_not_supported``), never using another voice."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from ..services.test_voices import wav
from .chatclient import chat, tone_f32
from .test_e2e_openpi import served
from .wsclient import FRAME, running_server

VOICES = "/v1/audio/voices"


async def test_the_sdk_uploads_lists_and_deletes_and_a_restart_keeps_them(tmp_path: Path) -> None:
    from openai import AsyncOpenAI, BadRequestError, ConflictError, NotFoundError

    config = tmp_path / "voices.toml"
    config.write_text(
        f'[server]\nvoice_dir = "{tmp_path / "voices"}"\nvoice_max_count = 2\n'
        "connection_workers = 1\nagent = false\n"
    )
    async with served("--config", str(config)) as url, httpx.AsyncClient(base_url=url) as http:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        made = await client.audio.voices.create(
            name="narrator", audio_sample=("n.wav", wav(1.5, rate=16_000)), consent="cons_1"
        )
        assert (made.id, made.name, made.object, made.type) == (
            "narrator", "narrator", "audio.voice", "audio_sample"
        )  # fmt: skip
        listed = (await http.get(VOICES)).json()
        assert "alloy" in listed["voices"] and "narrator" in listed["voices"]
        with pytest.raises(BadRequestError) as bad:  # not audio: 400 naming the field
            await client.audio.voices.create(
                name="pdf", audio_sample=("x.pdf", b"%PDF-1.4" * 64), consent="cons_1"
            )
        assert bad.value.body["param"] == "audio_sample"  # type: ignore[index]
        with pytest.raises(ConflictError):  # a built-in voice's name
            await client.audio.voices.create(
                name="alloy", audio_sample=("a.wav", wav()), consent="cons_1"
            )
        with pytest.raises(BadRequestError) as unsupported:  # espeak cannot take a sample
            await client.audio.speech.create(model="tts-1", voice="narrator", input="Hello.")
        assert unsupported.value.code == "voice_not_supported"
        assert (await http.post("/v1/audio/speech", json={"input": "Hi."})).status_code == 200
        await client.close()
    config.write_text(
        f'[server]\nvoice_dir = "{tmp_path / "voices"}"\ntts = "none"\nagent = false\n'
    )
    async with served("--config", str(config)) as url:  # a restart: the folder is the state
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        async with httpx.AsyncClient(base_url=url) as http:
            assert "narrator" in (await http.get(VOICES)).json()["voices"]
        deleted = await client.audio.voices.delete("narrator")
        assert (deleted.id, deleted.deleted, deleted.object) == (
            "narrator", True, "audio.voice.deleted"
        )  # fmt: skip
        with pytest.raises(NotFoundError):
            await client.audio.voices.delete("narrator")
        await client.close()


async def test_personaplex_speaks_with_an_uploaded_voice_and_refuses_it_once_deleted(
    tmp_path: Path,
) -> None:
    from duplex.models.moshi._checkpoint import build_tiny_checkpoint

    folder = tmp_path / "plex"
    build_tiny_checkpoint(folder, seed=0, preset="tiny-personaplex")
    overrides = {
        "server.model": f"tiny-personaplex:{folder}",
        "server.model_cache_dir": str(tmp_path),
        "server.voice_dir": str(tmp_path / "voices"),
    }
    async with running_server(**overrides) as server, httpx.AsyncClient() as http:
        sample = {"audio_sample": ("v.wav", wav(0.6), "audio/wav")}
        made = await http.post(server.http + VOICES, data={"name": "mine"}, files=sample)
        assert made.status_code == 200, made.text
        async with chat(server, "voice_prompt=mine") as c:
            await c.until(0, timeout=60.0)  # the handshake comes after the voice's replay
            for frame in range(4):
                await c.send_pcm(tone_f32(1, 440.0, start=frame))
            while c.samples < 2 * FRAME:
                await c.recv(timeout=30.0)
            assert not c.errors
        assert (await http.delete(server.http + VOICES + "/mine")).status_code == 200
        async with chat(server, "voice_prompt=mine") as c:
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await c.recv(timeout=30.0)
            assert c.kinds == [5] and "no voice 'mine'" in c.errors[0]
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
