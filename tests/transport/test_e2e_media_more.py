"""The newer media routes end to end: ``duplex serve`` in a subprocess with the tiny
pipelines, one connection worker in front (so every route goes through the access layer
and is relayed to the server process), driven with httpx and the official SDK.

``POST /v1/audio/generate``: formats, seeds, a ten-hour ``audio_length`` refused, a full
queue refused 429 then recovering, clients that leave withdrawing their work.
``POST /v1/images/edits`` with the SDK's ``images.edit``: reproducible edits, inpainting
with a mask, a mask of another size refused. ``POST /v1/videos/sync``: the MP4 itself, a
full queue refused 429, clients that leave stopping their generation. Waits poll
``/metrics``, never a clock.
"""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
from PIL import Image

from ..helpers import served
from .test_e2e_media import full_then_left, refused

CONFIG = """
[server]
image_model = "tiny"
video_model = "tiny"
audio_model = "tiny"
media_max_queue = 1
video_chunk_frames = 4
connection_workers = 1
agent = false
tts = "none"
api_keys = ["sk-media-0123456789"]
"""
AUDIO = "/v1/audio/generate"
SYNC = "/v1/videos/sync"
KEY = "sk-media-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}


@asynccontextmanager
async def media_server(tmp_path: Path) -> AsyncIterator[str]:
    config = tmp_path / "media.toml"
    config.write_text(CONFIG + f'model_cache_dir = "{tmp_path / "models"}"\n')
    async with served("--config", str(config), headers=AUTH) as url:
        yield url


async def test_audio_generation_through_a_worker(tmp_path: Path) -> None:
    async with (
        media_server(tmp_path) as url,
        httpx.AsyncClient(timeout=120, headers=AUTH) as http,
    ):
        ask = {"input": "birds at dawn", "audio_length": 2.0, "num_inference_steps": 2, "seed": 4}
        assert (await httpx.AsyncClient().post(url + AUDIO, json=ask)).status_code == 401
        first = await http.post(url + AUDIO, json=ask)
        assert first.status_code == 200, first.text
        with wave.open(io.BytesIO(first.content)) as w:
            assert (w.getframerate(), w.getnframes()) == (8000, 16_000)
        assert (await http.post(url + AUDIO, json=ask)).content == first.content
        models = (await http.get(url + "/v1/models")).json()["data"]
        assert {"id": "tiny-audio", "kind": "audio", "ready": True}.items() <= next(
            card for card in models if card["kind"] == "audio"
        ).items()
        await refused(
            await http.post(url + AUDIO, json={**ask, "audio_length": 36_000}),
            400,
            "audio_length",
            "invalid_value",
        )

        # a full queue: one running, one queued, the next refused 429; then it recovers
        long = {**ask, "num_inference_steps": 500}

        async def hold_audio(client: httpx.AsyncClient) -> object:
            return await client.post(url + AUDIO, json=long)

        full = await full_then_left(
            http, url, "audio", hold_audio, lambda: http.post(url + AUDIO, json=ask)
        )
        await refused(full, 429, None, "rate_limited")
        assert int(full.headers["retry-after"]) >= 1
        recovered = await http.post(url + AUDIO, json=ask)
        assert recovered.content == first.content


def png_bytes(width: int, height: int, mode: str = "RGB") -> bytes:
    pixels = np.random.default_rng(width).integers(0, 256, (height, width, len(mode)), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(out, format="PNG")
    return out.getvalue()


async def test_the_sdk_edits_and_inpaints_through_a_worker(tmp_path: Path) -> None:
    from openai import AsyncOpenAI, BadRequestError

    async with media_server(tmp_path) as url:
        client = AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        image = ("cat.png", png_bytes(48, 32), "image/png")
        options = {"seed": 3, "num_inference_steps": 3}
        first = await client.images.edit(
            image=image, prompt="a blue cat", n=2, response_format="b64_json", extra_body=options
        )
        assert first.data is not None and len(first.data) == 2
        pictures = [base64.b64decode(item.b64_json or "") for item in first.data]
        assert [Image.open(io.BytesIO(p)).size for p in pictures] == [(48, 32)] * 2
        again = await client.images.edit(
            image=image, prompt="a blue cat", n=2, response_format="b64_json", extra_body=options
        )
        assert again.data is not None
        assert [item.b64_json for item in again.data] == [item.b64_json for item in first.data]
        inpainted = await client.images.edit(
            image=image,
            mask=("mask.png", png_bytes(48, 32, "RGBA"), "image/png"),
            prompt="a blue cat",
            size="64x64",
            extra_body=options,
        )
        assert inpainted.data is not None
        (only,) = inpainted.data
        assert Image.open(io.BytesIO(base64.b64decode(only.b64_json or ""))).size == (64, 64)
        with pytest.raises(BadRequestError) as other_size:
            await client.images.edit(
                image=image, mask=("m.png", png_bytes(32, 32, "RGBA"), "image/png"), prompt="x"
            )
        assert other_size.value.body["param"] == "mask"  # type: ignore[index]
        await client.close()


async def test_sync_video_answers_its_mp4_refuses_a_full_queue_and_stops_when_left(
    tmp_path: Path,
) -> None:
    async with (
        media_server(tmp_path) as url,
        httpx.AsyncClient(timeout=120, headers=AUTH) as http,
    ):
        form = {"prompt": "waves", "size": "32x16", "seconds": "1", "fps": "8", "seed": "2",
                "num_inference_steps": "2"}  # fmt: skip
        first = await http.post(url + SYNC, files={k: (None, v) for k, v in form.items()})
        assert first.status_code == 200, first.text
        assert first.headers["content-type"] == "video/mp4"
        with av.open(io.BytesIO(first.content)) as container:
            assert sum(1 for _ in container.decode(video=0)) == 8  # two chunks of 4
        long = {**form, "num_inference_steps": "500", "seconds": "0.5"}

        async def hold_video(client: httpx.AsyncClient) -> object:
            return await client.post(url + SYNC, data=long)

        full = await full_then_left(
            http, url, "video", hold_video, lambda: http.post(url + SYNC, data=form)
        )
        await refused(full, 429, None, "rate_limited")  # both clients then left: work stopped
        again = await http.post(url + SYNC, data=form)
        assert again.content == first.content
