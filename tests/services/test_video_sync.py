"""``POST /v1/videos/sync`` over a real request engine on the tiny AnimateDiff, in process:
the MP4 itself, its seed, each body form, the active limit and the engine's queue refusing
429 and recovering, and admission by cost."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import pytest
import torch
import trio
from starlette.applications import Starlette

from duplex.config import MediaConfig
from duplex.models import ModelOptions, RequestEngine
from duplex.models.diffusion import load_video_runner, resolve_diffusion
from duplex.runtime import RequestEngines
from duplex.services.media import MediaService, media_routes, sync_routes

SYNC = "/v1/videos/sync"
ASK = {"prompt": "waves", "size": "32x16", "seconds": "1", "fps": "6", "seed": "3",
       "num_inference_steps": "2"}  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models are all overhead: more torch threads only contend on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def frames_of(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


async def test_the_mp4_is_the_answer_and_limits_refuse_then_recover(tmp_path: Path) -> None:
    engines = RequestEngines(["video"])
    config = MediaConfig(video_chunk_frames=4, video_max_active_jobs=1)
    service = MediaService(engines, config=config)
    app = Starlette(routes=[*sync_routes(service), *media_routes(service)])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://media", timeout=120
    ) as http:
        starting = await http.post(SYNC, data=ASK)
        assert (starting.status_code, starting.json()["error"]["code"]) == (503, "model_starting")
        model = resolve_diffusion("tiny", "video", ModelOptions(cache_dir=tmp_path))
        runner = await trio.to_thread.run_sync(load_video_runner, model, "cpu")
        engine = RequestEngine(runner, max_wait_s=0.0, max_queue=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await engines.started(engine)
            first = await http.post(SYNC, data=ASK)  # urlencoded
            assert first.status_code == 200, first.text
            assert (first.headers["content-type"], first.headers["x-seed"]) == ("video/mp4", "3")
            assert len(first.content) > 0 and frames_of(first.content) == 6  # two chunks
            as_json = await http.post(
                SYNC, json={**ASK, "seed": 3, "num_inference_steps": 2, "fps": 6}
            )
            multipart = await http.post(SYNC, files={k: (None, v) for k, v in ASK.items()})
            assert as_json.content == first.content == multipart.content
            assert (await http.get("/v1/videos?limit=5")).json()["data"] == []  # no job kept

            for body, param in (({**ASK, "size": "4096x16"}, "size"),
                                ({**ASK, "seconds": "600"}, "seconds"),
                                ({**ASK, "frames": "3"}, "frames")):  # fmt: skip
                bad = await http.post(SYNC, data=body)
                assert (bad.status_code, bad.json()["error"]["param"]) == (400, param)
            upload = await http.post(SYNC, files={"prompt": ("p.txt", b"waves", "text/plain")})
            assert upload.status_code == 400 and upload.json()["error"]["code"] == "invalid_form"
            huge = await http.post(SYNC, content=b" " * (2 << 20))
            assert huge.status_code == 413

            # one generation at a time (max_active_jobs 1): the next is refused, then served
            held = trio.Event()
            long = {**ASK, "num_inference_steps": "400", "seconds": "0.5"}

            async def hold() -> None:
                held.set()
                await http.post(SYNC, data=long)

            before = engine.statistics().batcher.batches
            async with trio.open_nursery() as inner:
                inner.start_soon(hold)
                await held.wait()
                while engine.statistics().batcher.batches <= before:  # the long one runs
                    await trio.sleep(0.01)
                busy = await http.post(SYNC, data=ASK)
                assert (busy.status_code, busy.json()["error"]["code"]) == (429, "rate_limited")
                assert busy.headers["retry-after"] == "1"
                inner.cancel_scope.cancel()
            while engine.statistics().stopped_batches < 1:  # the abandoned chunk stops
                await trio.sleep(0.01)
            recovered = await http.post(SYNC, data=ASK)
            assert recovered.content == first.content

            # admitted by its cost, as a job is: a video over the memory budget alone is
            # refused 413 before any work; one within it is served, and its lease ends
            config = MediaConfig(video_chunk_frames=4)
            tight = MediaService(engines, config=config, memory_budget_bytes=1 << 20)
            tight_app = Starlette(routes=sync_routes(tight))
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=tight_app), base_url="http://media", timeout=120
            ) as small:
                before = engine.statistics().batcher.batches
                big = await small.post(SYNC, data={**ASK, "size": "256x256"})
                assert (big.status_code, big.json()["error"]["param"]) == (413, "size")
                assert "media.memory_budget_mb" in big.json()["error"]["message"]
                assert engine.statistics().batcher.batches == before  # nothing ran
                fits = await small.post(SYNC, data=ASK)
                assert fits.content == first.content
                held = tight.budget.statistics()
                assert (held.held_bytes, held.leases, held.refused_memory) == (0, 0, 1)
            nursery.cancel_scope.cancel()
