"""The generation routes over a `RequestEngines` registry, in process (httpx's ASGI transport):
not configured, configured but not running yet (503, then served once the engine runs)."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio
from starlette.applications import Starlette

from duplex.models import ModelOptions, RequestEngine
from duplex.models.diffusion import load_image_runner, resolve_diffusion
from duplex.runtime import RequestEngines
from duplex.services.media._serving import MediaService, media_routes

ASK = {"prompt": "a cat", "size": "16x16", "num_inference_steps": 1, "seed": 1}


def client(service: MediaService) -> httpx.AsyncClient:
    app = Starlette(routes=media_routes(service))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://media")


async def test_not_configured_then_starting_then_served(tmp_path: Path) -> None:
    async with client(MediaService(RequestEngines([]))) as http:
        answer = await http.post("/v1/images/generations", json=ASK)
        assert (answer.status_code, answer.json()["error"]["code"]) == (404, "model_not_loaded")
    engines = RequestEngines(["image"])
    async with client(MediaService(engines)) as http:
        starting = await http.post("/v1/images/generations", json=ASK)
        assert (starting.status_code, starting.json()["error"]["code"]) == (503, "model_starting")
        assert starting.headers["retry-after"] == "1"
        video = await http.post("/v1/videos", json={"prompt": "waves"})
        assert video.json()["error"]["code"] == "model_not_loaded"  # only image is configured
        model = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=tmp_path))
        runner = await trio.to_thread.run_sync(load_image_runner, model, "cpu")
        engine = RequestEngine(runner, max_wait_s=0.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await engines.started(engine)
            served = await http.post("/v1/images/generations", json={**ASK, "model": "tiny-image"})
            assert served.status_code == 200, served.text
            assert served.json()["data"][0]["seed"] == 1
            # the official SDK's own model names run on the served model (docs/operations.md)
            alias = await http.post("/v1/images/generations", json={**ASK, "model": "dall-e-2"})
            assert alias.status_code == 200, alias.text
            assert alias.json()["data"][0]["b64_json"] == served.json()["data"][0]["b64_json"]
            other = await http.post("/v1/images/generations", json={**ASK, "model": "flux"})
            error = other.json()["error"]
            assert (other.status_code, error["code"], error["param"]) == (
                404, "model_not_found", "model"
            )  # fmt: skip
            assert "this server serves 'tiny-image' (OpenAI's names dall-e-2" in error["message"]
            nursery.cancel_scope.cancel()
