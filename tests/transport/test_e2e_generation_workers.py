"""The generation and robot routes through connection workers and session shards, end to end.

``duplex serve`` with two connection workers and two session shards: the speech, image,
video and robot routes are relayed whole by the worker that accepted the request to the server
process (``topology/_relay.py``), which runs them beside its request engines and its one
video job store. Each route answers as single-process: audio and images decoded, a job
created through one connection and followed through others, the streaming sockets, a full
queue refused 429 and recovering, clients that leave withdrawing their work.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
from websockets.trio.client import connect

from duplex.models import PolicyOptions, PolicyRequest, ReferencePolicy
from duplex.wire._openpi import pack, unpack

from .test_e2e_media import IMAGES, frames_of, png, receive_stream, refused, wait_job, wait_metric
from .test_e2e_media import metric as runner_metric
from .test_e2e_openpi import (
    PATH,
    check_openpi_report,
    deterministic_observation,
    openpi_python,
    run_openpi_client,
    served,
)
from .test_e2e_speech import LONG, SPEECH, loud, metric, wav_of
from .wsclient import running_server

CONFIG = """
[server]
connection_workers = 2
session_shards = 2
image_model = "tiny"
video_model = "tiny"
media_max_queue = 1
video_chunk_frames = 4
tts_max_batch = 1
tts_max_queue = 2
media_max_request_s = 86400.0
speech_max_audio_s = 3600.0
"""


@asynccontextmanager
async def worker_server(tmp_path: Path) -> AsyncIterator[str]:
    config = tmp_path / "workers.toml"
    config.write_text(CONFIG)
    async with served("--config", str(config), "--no-agent") as url:
        yield url


def fresh(url: str) -> httpx.AsyncClient:
    """A client of its own connection (so requests spread over the workers)."""
    return httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=1))


async def test_speech_through_workers(tmp_path: Path) -> None:
    async with worker_server(tmp_path) as url, fresh(url) as http:
        answer = await http.post(SPEECH, json={"input": "Hello there.", "sample_rate": 16000})
        assert answer.status_code == 200, answer.text
        rate, pcm = wav_of(answer.content)
        assert rate == 16000 and loud(pcm)
        batch = await http.post(SPEECH + "/batch", json={"input": ["One.", "Two two."]})
        assert [item["index"] for item in batch.json()["data"]] == [0, 1]
        assert "alloy" in (await http.get("/v1/audio/voices")).json()["voices"]
        bad = await http.post(SPEECH, json={"input": "x", "voice": "nobody"})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "voice")
        assert (await http.get(SPEECH)).status_code == 405  # answered in the worker

        body = {"input": "One. Two. Three.", "stream": True, "response_format": "pcm"}
        async with http.stream("POST", SPEECH, json=body) as streamed:
            assert streamed.status_code == 200
            audio = b"".join([part async for part in streamed.aiter_raw()])
        assert len(audio) > 0 and len(audio) % 2 == 0

        async with connect(url.replace("http://", "ws://") + SPEECH + "/stream") as ws:
            await ws.send(json.dumps({"type": "session.config", "response_format": "wav"}))
            await ws.send(json.dumps({"type": "input.text", "text": "Hi there. Bye."}))
            await ws.send(json.dumps({"type": "input.done"}))
            for index in range(2):
                start = json.loads(await ws.recv())
                assert (start["type"], start["sentence_index"]) == ("audio.start", index)
                assert loud(wav_of(await ws.recv())[1])
                assert json.loads(await ws.recv())["type"] == "audio.done"
            assert json.loads(await ws.recv())["type"] == "session.done"

        # one runs, one waits, the rest are refused 429; then it recovers
        statuses: list[int] = []

        async def one() -> None:
            async with fresh(url) as client:
                r = await client.post(
                    SPEECH, json={"input": LONG, "speed": 0.25, "response_format": "pcm"}
                )
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        assert statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
        assert (await http.post(SPEECH, json={"input": "Recovered."})).status_code == 200

        # a streaming client that leaves after its first sentence stops the rest
        long_stream = {**body, "input": LONG, "speed": 0.25}
        async with fresh(url) as leaving, leaving.stream("POST", SPEECH, json=long_stream) as r:
            assert r.status_code == 200
            async for _ in r.aiter_raw():
                break
        with trio.fail_after(60):
            while await metric(http, url, "duplex_speech_requests_total",
                               endpoint="speech_stream", outcome="cancelled") < 1:  # fmt: skip
                await trio.sleep(0.1)
        assert await metric(http, url, "duplex_requests_total", runner="tts") < 8 + LONG.count(".")
        assert (await http.post(SPEECH, json={"input": "Still serving."})).status_code == 200


async def test_images_and_videos_through_workers(tmp_path: Path) -> None:
    async with worker_server(tmp_path) as url, fresh(url) as http:
        ask: dict[str, Any] = {"prompt": "a cat", "size": "32x24", "num_inference_steps": 2}
        first = await http.post(IMAGES, json={**ask, "seed": 4})
        assert first.status_code == 200, first.text
        assert png(first.json()["data"][0]).shape == (24, 32, 3)
        async with fresh(url) as other:
            again = (await other.post(IMAGES, json={**ask, "seed": 4})).json()
        assert again["data"][0]["b64_json"] == first.json()["data"][0]["b64_json"]
        await refused(await http.post(IMAGES, json={**ask, "n": 11}), 400, "n", "invalid_value")

        # a full queue (one running, one queued) refuses 429; clients that leave free it
        long = {**ask, "num_inference_steps": 500}
        clients = [fresh(url) for _ in range(2)]
        async with trio.open_nursery() as nursery:
            batches = await runner_metric(http, url, "duplex_request_batches_total", "image")
            nursery.start_soon(partial(clients[0].post, IMAGES, json=long))
            await wait_metric(http, url, "duplex_request_batches_total", "image", batches + 1)
            nursery.start_soon(partial(clients[1].post, IMAGES, json=long))
            await wait_metric(http, url, "duplex_requests_queued", "image", 1)
            full = await http.post(IMAGES, json=ask)
            await refused(full, 429, None, "rate_limited")
            assert full.headers["retry-after"] == "1"
            stopped = await runner_metric(
                http, url, "duplex_request_batches_stopped_total", "image"
            )
            nursery.cancel_scope.cancel()  # both clients leave
        for client in clients:
            await client.aclose()
        await wait_metric(http, url, "duplex_request_batches_stopped_total", "image", stopped + 1)
        recovered = await http.post(IMAGES, json={**ask, "seed": 4})
        assert recovered.json()["data"][0]["b64_json"] == first.json()["data"][0]["b64_json"]

        # a job made through one connection is followed, fetched and deleted through others
        form = {"prompt": "waves", "size": "32x16", "seconds": "0.5", "fps": "8", "seed": "3"}
        job = (await http.post("/v1/videos", data={**form, "num_inference_steps": "2"})).json()
        async with fresh(url) as second:
            await wait_job(second, url, job["id"], "completed")
        async with fresh(url) as third:
            content = await third.get(f"/v1/videos/{job['id']}/content")
            assert len(frames_of(content.content)) == 4
            assert [j["id"] for j in (await third.get("/v1/videos")).json()["data"]] == [job["id"]]
            deleted = (await third.delete(f"/v1/videos/{job['id']}")).json()
        assert deleted["deleted"] is True
        assert (await http.get(f"/v1/videos/{job['id']}")).status_code == 404

        ws_url = url.replace("http://", "ws://") + "/v1/realtime/video"
        start = {"type": "session.start", "prompt": "waves", "format": "m4s", "width": 32,
                 "height": 16, "fps": 8, "num_frames": 6, "num_inference_steps": 2}  # fmt: skip
        async with connect(ws_url) as ws:
            await ws.send(json.dumps({"type": "session.ping"}))
            assert json.loads(await ws.recv())["type"] == "session.pong"
            await ws.send(json.dumps(start))
            events, stream = await receive_stream(ws)
        assert events[-1]["type"] == "session.done" and len(frames_of(stream)) == 6
        stopped = await runner_metric(http, url, "duplex_request_batches_stopped_total", "video")
        batches = await runner_metric(http, url, "duplex_request_batches_total", "video")
        async with connect(ws_url) as ws:  # the client leaves: its running chunk stops
            await ws.send(json.dumps({**start, "num_frames": 400, "num_inference_steps": 500}))
            assert json.loads(await ws.recv())["type"] == "video.start"
            await wait_metric(http, url, "duplex_request_batches_total", "video", batches + 1)
        await wait_metric(http, url, "duplex_request_batches_stopped_total", "video", stopped + 1)


async def test_robots_through_workers(tmp_path: Path) -> None:
    """openpi-client (given the robot path's URL, and as OpenPI's examples build it, from
    host and port: ``ws://host:port/``) and several robots at once through the workers,
    answered by the one reference policy in the server process; a frame over the sessions'
    16 MiB limit still reaches the robot endpoint on both of its paths (its own 64 MiB
    limit holds in the workers too)."""
    openpi_python()
    async with worker_server(tmp_path) as url:
        check_openpi_report(await run_openpi_client(url))
        check_openpi_report(await run_openpi_client(url, host_port=True))
        reference = ReferencePolicy(PolicyOptions())
        answers: dict[int, Any] = {}

        async def one_robot(k: int) -> None:
            path = "/" if k % 2 else PATH
            async with connect(url.replace("http://", "ws://") + path, max_size=None) as ws:
                assert unpack(await ws.recv())["policy"] == "duplex-reference"
                await ws.send(pack(deterministic_observation(k)))
                answers[k] = unpack(await ws.recv())
                if k < 2:  # 20 MiB: over max_frame_bytes, under the robot limit
                    big = {**deterministic_observation(k), "blob": bytes(20 * 1024 * 1024)}
                    await ws.send(pack(big))
                    assert unpack(await ws.recv())["actions"].shape == (10, 8)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for k in range(4):
                    nursery.start_soon(one_robot, k)
        for k, answer in answers.items():
            (expected,) = reference.infer_batch([PolicyRequest(deterministic_observation(k))])
            np.testing.assert_allclose(answer["actions"], expected["actions"], rtol=1e-5, atol=1e-6)
        assert len(answers) == 4
        async with httpx.AsyncClient(base_url=url) as http:
            text = (await http.get("/metrics")).text
        opened = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("duplex_robot_connections_total")
        ]
        assert opened == [6.0], opened  # 2 + 4, all counted in the server process


async def test_models_lists_every_loaded_model() -> None:
    """``GET /v1/models``: the realtime model, then each request engine's and the agent's
    reply model, in OpenAI's list shape (through a worker, from the server process)."""
    overrides = {
        "server.connection_workers": 1,
        "server.image_model": "tiny",
        "server.video_model": "tiny",
        "server.agent": True,
    }
    async with running_server(**overrides) as server, httpx.AsyncClient() as http:
        with trio.fail_after(120):
            while True:
                listed = (await http.get(server.http + "/v1/models")).json()
                if all(card.get("ready", True) for card in listed["data"]):
                    break
                await trio.sleep(0.2)
    assert listed["object"] == "list"
    cards = listed["data"]
    assert [(card["id"], card["kind"]) for card in cards] == [
        ("loopback", "realtime"),
        ("tiny-image", "image"),
        ("tiny-video", "video"),
        ("espeak", "speech"),
        ("pocketsphinx", "transcription"),
        ("reference", "policy"),
        ("echo", "chat"),
    ]
    for card in cards:
        assert {"id", "object", "owned_by", "created"} <= set(card) and card["object"] == "model"
    assert "capabilities" in cards[0]
