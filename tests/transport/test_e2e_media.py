"""Image and video generation end to end: ``duplex serve`` in a subprocess with the tiny
diffusers pipelines, driven over HTTP (httpx) and WebSocket (websockets).

Each endpoint's success path and its refusals; PNGs and MP4s decoded (Pillow, PyAV);
seeds; the video job lifecycle with ``DELETE``; fragmented MP4 chunks that PyAV
demuxes frame by frame; a full queue refused 429 and then recovering; a client that
disconnects withdrawing its work. Waits poll ``/metrics`` and the job, never a clock.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import trio
from PIL import Image
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from ..helpers import parse_metrics, served

CONFIG = """
[server]
image_model = "tiny"
video_model = "tiny"
media_max_queue = 1
video_chunk_frames = 4
video_max_active_jobs = 2
video_start_timeout_s = 2.0
media_max_request_s = 86400.0
"""
IMAGES = "/v1/images/generations"
LONG = 500
"""Steps of a request that runs until it is withdrawn (tens of seconds on this CPU)."""


@asynccontextmanager
async def media_server(tmp_path: Path) -> AsyncIterator[str]:
    config = tmp_path / "media.toml"
    config.write_text(CONFIG)
    async with served("--config", str(config)) as url:
        yield url


async def metric(http: httpx.AsyncClient, url: str, name: str, runner: str) -> float:
    """Through ``http``: its headers (an API key) go with the scrape."""
    reply = await http.get(url + "/metrics")
    assert reply.status_code == 200, (reply.status_code, reply.text[:500])
    return parse_metrics(reply.text).sum(name, runner=runner)


async def polled(value: Callable[[], Awaitable[float]], done: Callable[[float], bool]) -> float:
    """``value()`` every 0.1 s until ``done`` says so (120 s at most); its last value."""
    with trio.fail_after(120):
        while not done(last := await value()):
            await trio.sleep(0.1)
    return last


async def wait_metric(
    http: httpx.AsyncClient, url: str, name: str, runner: str, at_least: float
) -> float:
    return await polled(lambda: metric(http, url, name, runner), lambda v: v >= at_least)


async def full_then_left(
    http: httpx.AsyncClient,
    url: str,
    runner: str,
    hold: Callable[[httpx.AsyncClient], Awaitable[object]],
    probe: Callable[[], Awaitable[httpx.Response]],
) -> httpx.Response:
    """``runner``'s queue full (one request of ``hold`` running, one queued): ``probe``'s
    answer (a 429 expected); then the queued request's client leaves, then the running one's,
    and each request ends early: withdrawn from the queue, or its batch stopped. Which of the
    two the queued one meets depends on timing (the running one may have finished, or have
    been stopped, before its client is seen gone: the tiny models' longest requests take
    about 2.5 s on the CPU), so the counters are checked together; the queue ends empty."""
    names = ("duplex_requests_cancelled_total", "duplex_request_batches_stopped_total")

    async def ended_early() -> float:
        return sum([await metric(http, url, name, runner) for name in names])

    before = await ended_early()
    batches = await metric(http, url, "duplex_request_batches_total", runner)
    clients = [httpx.AsyncClient(timeout=300, headers=http.headers) for _ in range(2)]
    scopes = [trio.CancelScope(), trio.CancelScope()]

    async def held(index: int) -> None:
        with scopes[index]:
            await hold(clients[index])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(held, 0)
        await wait_metric(http, url, "duplex_request_batches_total", runner, batches + 1)
        nursery.start_soon(held, 1)
        await wait_metric(http, url, "duplex_requests_queued", runner, 1)
        answer = await probe()
        for index in (1, 0):  # the queued one's client first
            scopes[index].cancel()
            await clients[index].aclose()
    # the queued request cannot have finished (it needs seconds and its client left at once)
    await polled(ended_early, lambda v: v >= before + 1)
    await polled(lambda: metric(http, url, "duplex_requests_queued", runner), lambda v: v < 1)
    return answer


def png(item: dict[str, Any]) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item["b64_json"]))))


def frames_of(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


async def refused(response: httpx.Response, status: int, param: str | None, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code), error


async def test_images(tmp_path: Path) -> None:
    async with media_server(tmp_path) as url, httpx.AsyncClient(timeout=120) as http:
        ask: dict[str, Any] = {"prompt": "a red cat", "size": "64x48", "num_inference_steps": 2}
        first = await http.post(url + IMAGES, json={**ask, "n": 2, "seed": 5})
        assert first.status_code == 200, first.text
        data = first.json()["data"]
        assert [png(item).shape for item in data] == [(48, 64, 3)] * 2
        assert [item["seed"] for item in data] == [5, 6]
        again = (await http.post(url + IMAGES, json={**ask, "n": 2, "seed": 5})).json()["data"]
        assert [item["b64_json"] for item in again] == [item["b64_json"] for item in data]
        # image i draws seed + i: the image of that seed alone, up to the rounding of a
        # batched forward (docs/images-video.md: a level or two of a pixel)
        alone_of: dict[int, str] = {}
        for i, seed in enumerate((5, 6)):
            (alone,) = (await http.post(url + IMAGES, json={**ask, "seed": seed})).json()["data"]
            alone_of[seed] = alone["b64_json"]
            diff = np.abs(png(alone).astype(int) - png(data[i]).astype(int))
            assert diff.max() <= 2 and (diff > 0).mean() < 0.01, (i, diff.max())
        assert np.abs(png(data[0]).astype(int) - png(data[1]).astype(int)).max() > 2

        for body, param, code in (
            ({**ask, "prompt": ""}, "prompt", "invalid_value"),
            ({**ask, "steps": 2}, "steps", "unknown_parameter"),
            ({**ask, "size": "4096x64"}, "size", "invalid_value"),
            ({**ask, "num_inference_steps": 0}, "num_inference_steps", "invalid_value"),
            ({**ask, "n": 11}, "n", "invalid_value"),
            ({**ask, "response_format": "url"}, "response_format", "unsupported_parameter"),
        ):
            await refused(await http.post(url + IMAGES, json=body), 400, param, code)
        unknown = await http.post(url + IMAGES, json={**ask, "model": "x"})
        await refused(unknown, 404, "model", "model_not_found")
        assert "serves 'tiny-image' (OpenAI's names dall-e-2" in unknown.json()["error"]["message"]
        await refused(await http.post(url + IMAGES, content=b"{"), 400, None, "invalid_json")
        async with httpx.AsyncClient() as once:  # answered before the body is read: not reused
            huge = await once.post(url + IMAGES, content=b" " * (2 << 20))
        assert huge.status_code == 413
        assert (await http.get(url + IMAGES)).status_code == 405

        # a full queue: one running, one queued, the next refused 429; then it recovers
        long = {**ask, "num_inference_steps": LONG}

        async def hold_image(client: httpx.AsyncClient) -> object:
            return await client.post(url + IMAGES, json=long)

        full = await full_then_left(
            http, url, "image", hold_image, lambda: http.post(url + IMAGES, json=ask)
        )
        await refused(full, 429, None, "rate_limited")
        assert full.headers["retry-after"] == "1"
        # the engine is free; OpenAI's model name runs on the served model
        recovered = await http.post(url + IMAGES, json={**ask, "seed": 5, "model": "gpt-image-1"})
        assert recovered.json()["data"][0]["b64_json"] == alone_of[5]

        # the official SDK, as a newcomer calls it: OpenAI's model name is served, any other
        # is a 404 that names what is
        import openai

        sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        options: dict[str, Any] = {"prompt": ask["prompt"], "size": ask["size"]}
        extra = {"seed": 5, "num_inference_steps": 2}
        image = await sdk.images.generate(model="dall-e-2", extra_body=extra, **options)
        assert image.data is not None and image.data[0].b64_json == alone_of[5]
        try:
            await sdk.images.generate(model="gpt-5-image", extra_body=extra, **options)
        except openai.NotFoundError as exc:
            assert exc.status_code == 404 and "serves 'tiny-image'" in str(exc)
        else:
            raise AssertionError("an unknown model was served")
        await sdk.close()


async def wait_job(http: httpx.AsyncClient, url: str, job_id: str, *states: str) -> dict[str, Any]:
    with trio.fail_after(120):
        while (job := (await http.get(f"{url}/v1/videos/{job_id}")).json())["status"] not in states:
            assert 0 <= job["progress"] <= 100
            await trio.sleep(0.1)
    return job


async def test_video_jobs(tmp_path: Path) -> None:
    async with media_server(tmp_path) as url, httpx.AsyncClient(timeout=120) as http:
        form = {"prompt": "waves", "size": "32x16", "seconds": "1.25", "fps": "8", "seed": "3"}
        created = await http.post(url + "/v1/videos", data={**form, "num_inference_steps": "2"})
        assert created.status_code == 200, created.text
        job = created.json()
        assert (job["object"], job["status"], job["size"], job["seconds"]) == (
            "video",
            "queued",
            "32x16",
            "1.25",
        )
        done = await wait_job(http, url, job["id"], "completed", "failed")
        assert (done["status"], done["progress"]) == ("completed", 100)
        assert (
            done["completed_at"] >= done["created_at"] and done["expires_at"] > done["completed_at"]
        )
        content = await http.get(f"{url}/v1/videos/{job['id']}/content")
        assert content.headers["content-type"] == "video/mp4"
        frames = frames_of(content.content)
        assert len(frames) == 10 and {(f.width, f.height) for f in frames} == {(32, 16)}

        as_json = {"prompt": "waves", "size": "32x16", "seconds": 0.5, "fps": 8, "seed": 3}
        second = (  # OpenAI's model name runs on the served model, which the job names
            await http.post(
                url + "/v1/videos", json={**as_json, "model": "sora-2", "num_inference_steps": 2}
            )
        ).json()
        assert second["model"] == job["model"] == "tiny-video"
        await wait_job(http, url, second["id"], "completed")
        listed = (await http.get(url + "/v1/videos?limit=1")).json()
        assert [j["id"] for j in listed["data"]] == [second["id"]] and listed["has_more"]

        for body, param in (
            ({**form, "seconds": "0"}, "seconds"),
            ({**form, "fps": "99"}, "fps"),
            ({**form, "size": "33x16"}, "size"),
            ({**form, "prompt": ""}, "prompt"),
            ({**form, "length": "4"}, "length"),
        ):
            answer = await http.post(url + "/v1/videos", data=body)
            assert (answer.status_code, answer.json()["error"]["param"]) == (400, param)
        unknown = await http.post(url + "/v1/videos", data={**form, "model": "veo-3"})
        await refused(unknown, 404, "model", "model_not_found")
        assert "serves 'tiny-video' (OpenAI's names sora-2" in unknown.json()["error"]["message"]
        missing = await http.get(url + "/v1/videos/video_nope")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")

        # two long jobs fill the store's active bound: the third is refused 429
        long = {**form, "seconds": "10", "num_inference_steps": str(LONG)}
        jobs = [(await http.post(url + "/v1/videos", data=long)).json() for _ in range(2)]
        await wait_job(http, url, jobs[0]["id"], "in_progress")
        full = await http.post(url + "/v1/videos", data=long)
        await refused(full, 429, None, "rate_limited")
        assert full.headers["retry-after"] == "1"
        busy = await http.get(f"{url}/v1/videos/{jobs[0]['id']}/content")
        assert busy.status_code == 400
        stopped = await metric(http, url, "duplex_request_batches_stopped_total", "video")
        for running in jobs:  # DELETE cancels an active job
            answer = (await http.delete(f"{url}/v1/videos/{running['id']}")).json()
            assert answer["status"] == "cancelled" and answer["completed_at"] is not None
        # the running chunk stops at its next step
        await wait_metric(http, url, "duplex_request_batches_stopped_total", "video", stopped + 1)
        multipart = {key: (None, value) for key, value in form.items()}  # multipart/form-data
        third = await http.post(
            url + "/v1/videos", files={**multipart, "num_inference_steps": (None, "2")}
        )
        assert third.request.headers["content-type"].startswith("multipart/form-data")
        await wait_job(http, url, third.json()["id"], "completed")  # the engine is free again
        repeated = await http.post(url + "/v1/videos", content=b"prompt=a&prompt=b")
        assert repeated.status_code == 400  # (no content type: read as JSON, which it is not)
        twice = await http.post(
            url + "/v1/videos",
            content=b"prompt=a&prompt=b",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert (twice.status_code, twice.json()["error"]["param"]) == (400, "prompt")
        deleted = (await http.delete(f"{url}/v1/videos/{job['id']}")).json()
        assert deleted == {"id": job["id"], "object": "video.deleted", "deleted": True}
        assert (await http.get(f"{url}/v1/videos/{job['id']}")).status_code == 404


async def receive_stream(ws: ClientConnection) -> tuple[list[dict[str, Any]], bytes]:
    """Every event until the close; checks each binary frame follows its metadata."""
    events: list[dict[str, Any]] = []
    stream = b""
    while True:
        try:
            message = await ws.recv()
        except ConnectionClosed:
            return events, stream
        if isinstance(message, bytes):
            meta = events[-1]
            assert meta["type"] == "video.chunk_metadata" and meta["byte_length"] == len(message)
            stream += message
            told = sum(e["num_frames"] for e in events if e["type"] == "video.chunk_metadata")
            assert len(frames_of(stream)) == told  # every prefix demuxes, frame by frame
        else:
            events.append(json.loads(message))


async def test_realtime_video(tmp_path: Path) -> None:
    async with media_server(tmp_path) as url, httpx.AsyncClient(timeout=120) as http:
        ws_url = url.replace("http://", "ws://") + "/v1/realtime/video"
        start = {
            "type": "session.start",
            "prompt": "waves",
            "format": "m4s",
            "width": 32,
            "height": 16,
            "fps": 8,
            "num_frames": 10,
            "num_inference_steps": 2,
            "seed": 1,
        }
        async with connect(ws_url) as ws:
            await ws.send(json.dumps({"type": "session.ping"}))
            assert json.loads(await ws.recv())["type"] == "session.pong"
            await ws.send(json.dumps(start))
            events, stream = await receive_stream(ws)
        kinds = [e["type"] for e in events]
        assert kinds == ["video.start", *["video.chunk_metadata"] * 4, "session.done"]
        chunks = [e for e in events if e["type"] == "video.chunk_metadata"]
        assert [c["kind"] for c in chunks] == ["media"] * 3 + ["trailer"]
        assert [c["transport_chunk_index"] for c in chunks] == [0, 1, 2, 3]
        assert sum(c["num_frames"] for c in chunks) == 10
        frames = frames_of(stream)
        assert len(frames) == 10 and {(f.width, f.height) for f in frames} == {(32, 16)}
        assert events[-1]["chunks"] == 4 and events[-1]["stopped"] is False
        assert ws.close_code == 1000

        async with connect(ws_url) as ws:  # a bad start: an error, then the close
            await ws.send(json.dumps({**start, "format": "mp4"}))
            events, _ = await receive_stream(ws)
        assert events[0]["type"] == "error" and ws.close_code == 1008
        async with connect(ws_url) as ws:  # no start at all: the start timeout (2 s here)
            events, _ = await receive_stream(ws)
        assert events[0]["code"] == "start_timeout" and ws.close_code == 1008

        long = {**start, "num_frames": 400, "num_inference_steps": LONG}
        async with connect(ws_url) as ws:  # stop mid-generation
            await ws.send(json.dumps(long))
            assert json.loads(await ws.recv())["type"] == "video.start"
            await ws.send(json.dumps({"type": "session.stop"}))
            events, _ = await receive_stream(ws)
        assert events[-1]["type"] == "session.done" and events[-1]["stopped"] is True

        stopped = await metric(http, url, "duplex_request_batches_stopped_total", "video")
        batches = await metric(http, url, "duplex_request_batches_total", "video")
        async with connect(ws_url) as ws:  # the client leaves: its running chunk stops
            await ws.send(json.dumps(long))
            assert json.loads(await ws.recv())["type"] == "video.start"
            await wait_metric(http, url, "duplex_request_batches_total", "video", batches + 1)
        await wait_metric(http, url, "duplex_request_batches_stopped_total", "video", stopped + 1)
        async with connect(ws_url) as ws:  # and the engine serves the next one
            await ws.send(json.dumps(start))
            events, stream = await receive_stream(ws)
        assert len(frames_of(stream)) == 10


async def test_routes_without_models_say_not_loaded() -> None:
    async with served() as url, httpx.AsyncClient() as http:
        for method, path in (
            ("POST", IMAGES),
            ("POST", "/v1/videos"),
            ("GET", "/v1/videos"),
        ):
            answer = await http.request(method, url + path, json={"prompt": "x"})
            await refused(answer, 404, "model", "model_not_loaded")
            assert "--" in answer.json()["error"]["message"]  # names the flag
        async with connect(url.replace("http://", "ws://") + "/v1/realtime/video") as ws:
            event = json.loads(await ws.recv())
        assert (event["type"], event["code"]) == ("error", "model_not_loaded")


async def test_pipelines_in_an_engine_process() -> None:
    """With engine processes the pipelines run there: requests and results cross the link."""
    flags = ("--engine-process", "on", "--image-model", "tiny", "--video-model", "tiny")
    async with served(*flags) as url, httpx.AsyncClient(timeout=120) as http:
        ask = {"prompt": "a cat", "size": "32x24", "num_inference_steps": 2, "seed": 9}
        first = await http.post(url + IMAGES, json={**ask, "model": "tiny-image"})
        again = await http.post(url + IMAGES, json=ask)
        assert first.json()["data"][0]["b64_json"] == again.json()["data"][0]["b64_json"]
        assert png(first.json()["data"][0]).shape == (24, 32, 3)
        form = {"prompt": "waves", "size": "32x16", "seconds": "0.5", "fps": "8"}
        job = (
            await http.post(url + "/v1/videos", data={**form, "num_inference_steps": "2"})
        ).json()
        await wait_job(http, url, job["id"], "completed")
        content = await http.get(f"{url}/v1/videos/{job['id']}/content")
        assert len(frames_of(content.content)) == 4
