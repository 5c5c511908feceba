"""The speech, image and video endpoints' part of ``bench/fuzz_endpoints.py``.

``speech`` and ``media`` fuzz HTTP routes (hostile JSON bodies, wrong content types,
multipart garbage, oversize bodies, bad path ids); ``speech_stream`` and ``video_stream``
fuzz their WebSocket's own messages. After each frame a barrier asks for a normal answer
(HTTP: a cheap valid GET answered 200; WS: an event whose answer names it). Valid requests
are tiny (8x8 pixels, one step, one frame, a few words) so the run stays cheap on a CPU.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import trio

# the generator kinds and counting of fuzz_endpoints (imported lazily there: no cycle)
from fuzz_endpoints import (
    AUTH,
    NUMBERS,
    Step,
    Tally,
    _at,
    _deep,
    _garbage,
    _is_number,
    _show,
    _wrong_type,
    classify,
    frame_lane,
)
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from tests.wire.test_field_fuzz import HOSTILE, _mutated, _paths

HTTP_KINDS = (
    "mutated",
    "wrong_type",
    "numbers",
    "deep",
    "garbage",
    "binary",
    "size",
    "content_type",
    "multipart",
    "bad_id",
)
WS_KINDS = ("mutated", "wrong_type", "numbers", "deep", "binary", "size", "garbage")

SPEECH = {"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "pcm",
          "speed": 1.0, "sample_rate": 8000, "stream": False, "stream_format": "audio",
          "instructions": ""}  # fmt: skip
SPEECH_BATCH = {k: v for k, v in SPEECH.items() if k not in ("stream", "stream_format")}
SPEECH_BATCH["input"] = ["Hi.", "Yo."]
IMAGE = {"prompt": "a cat", "model": "tiny-image", "n": 1, "size": "8x8", "seed": 1,
         "num_inference_steps": 1, "guidance_scale": 1.0, "negative_prompt": "dog",
         "response_format": "b64_json", "output_format": "png", "user": "u"}  # fmt: skip
VIDEO = {"prompt": "waves", "model": "tiny-video", "size": "8x8", "seconds": "1", "fps": 1,
         "seed": 1, "num_inference_steps": 1, "guidance_scale": 1.0, "negative_prompt": "x",
         "user": "u"}  # fmt: skip

# route name: (method, path, valid body, barrier path)
SPEECH_ROUTES: dict[str, tuple[str, str, Any]] = {
    "POST /v1/audio/speech": ("POST", "/v1/audio/speech", SPEECH),
    "POST /v1/audio/speech/batch": ("POST", "/v1/audio/speech/batch", SPEECH_BATCH),
    "GET /v1/audio/voices": ("GET", "/v1/audio/voices", None),
}
MEDIA_ROUTES: dict[str, tuple[str, str, Any]] = {
    "POST /v1/images/generations": ("POST", "/v1/images/generations", IMAGE),
    "POST /v1/videos": ("POST", "/v1/videos", VIDEO),
    "GET /v1/videos": ("GET", "/v1/videos", None),
    "GET /v1/videos/{id}": ("GET", "/v1/videos/{id}", None),
    "DELETE /v1/videos/{id}": ("DELETE", "/v1/videos/{id}", None),
    "GET /v1/videos/{id}/content": ("GET", "/v1/videos/{id}/content", None),
}
BARRIER = {"speech": "/v1/audio/voices", "media": "/v1/videos?limit=1",
           "video_ids": "/v1/videos?limit=1"}  # fmt: skip
BAD_IDS = ("x", "video_", "video_" + "0" * 24, "video_zz", "%00", "..", "%2e%2e", "a" * 5000,
           "video_%ff", "é", "video_dec62da196d66238d8d2435f%20", "-1", "null", "%0d%0aX:%20y",
           "%252e", "video_" + "f" * 200)  # fmt: skip
CONTENT_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                 "multipart/form-data; boundary=", "application/json; charset=utf-16",
                 "application/octet-stream", "\x7f", "application/json; boundary=x",
                 "multipart/form-data; boundary=" + "b" * 200, "")  # fmt: skip


def _mutate(rng: random.Random, example: dict[str, Any]) -> str:
    paths = list(_paths(example))
    changes = [(rng.choice(paths), rng.choice(HOSTILE)) for _ in range(rng.randint(1, 3))]
    return _mutated(example, changes)


def _numbers(rng: random.Random, example: dict[str, Any]) -> str:
    numeric = [p for p in _paths(example) if _is_number(_at(example, p))] or list(_paths(example))
    changes = [(rng.choice(numeric), rng.choice(NUMBERS)) for _ in range(rng.randint(1, 2))]
    return _mutated(example, changes)


def _multipart(rng: random.Random, valid: dict[str, Any] | None) -> tuple[bytes, str]:
    """A form body, well made or broken (boundary missing, truncated, binary parts)."""
    boundary = "fz" + str(rng.randrange(10**6))
    fields = dict(valid or {"prompt": "x"})
    for _ in range(rng.randint(0, 3)):
        key = rng.choice([*fields, "x", "", "prompt", "a" * 300])
        fields[key] = rng.choice(["", "1e999", "NaN", "-1", "x" * 40_000, "\x00", "64x64x64",
                                  "8x8", "9999999999999999999999", "é"])  # fmt: skip
    parts = []
    for key, value in fields.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"'
        if rng.random() < 0.1:
            head += '; filename="f.bin"\r\nContent-Type: application/octet-stream'
            value = rng.randbytes(rng.randrange(1, 2000))
        body = value if isinstance(value, bytes) else str(value).encode()
        parts.append(head.encode() + b"\r\n\r\n" + body + b"\r\n")
    data = b"".join(parts) + f"--{boundary}--\r\n".encode()
    choice = rng.randrange(6)
    if choice == 0:
        data = data[: rng.randrange(len(data))]
    elif choice == 1:
        data = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data)
    elif choice == 2:
        boundary = rng.choice(["", "other", '"' + boundary])
    ctype = f"multipart/form-data; boundary={boundary}" if rng.random() < 0.9 else (
        "application/x-www-form-urlencoded")  # fmt: skip
    if ctype.startswith("application/x-www"):
        data = "&".join(f"{k}={v}" for k, v in fields.items()).encode(errors="replace")
    return data, ctype


def http_request(route: tuple[str, str, Any], kind: str, rng: random.Random, limit: int,
                 job: str) -> dict[str, Any]:  # fmt: skip
    """One generated request of ``kind`` for ``route`` (``job``: a real video id)."""
    method, path, valid = route
    headers = dict(AUTH)
    if "{id}" in path:
        path = path.replace("{id}", rng.choice(BAD_IDS) if kind == "bad_id" or
                            rng.random() < 0.5 else job)  # fmt: skip
    elif kind == "bad_id":
        path += rng.choice(
            [
                "/x",
                "/",
                "//",
                "/%00",
                "?limit=-1",
                "?limit=1e999",
                "?after=x",
                "?limit=" + "9" * 30,
                "?limit=NaN",
                "?after=" + "a" * 5000,
            ]
        )
    body: bytes = b""
    example = valid or {"limit": 1}
    if kind == "mutated":
        body = _mutate(rng, example).encode()
    elif kind == "wrong_type":
        body = _wrong_type(rng, [{"type": "x", **example}]).encode()
    elif kind == "numbers":
        body = _numbers(rng, example).encode()
    elif kind == "deep":
        body = _deep(rng).encode()
    elif kind == "garbage":
        body = _garbage(rng, [example]).encode(errors="replace")
    elif kind == "binary":
        body = rng.randbytes(rng.choice([1, 100, 10_000]))
    elif kind == "size":
        size = rng.choice([limit - 1, limit, limit + 1, 2 * limit + 7])
        event = dict(example, user="u" * 1)
        text = json.dumps(event)
        event["user"] = "u" * max(1, size - len(text.encode()))
        body = json.dumps(event).encode()
    elif kind == "content_type":
        body = json.dumps(example).encode()
        headers["Content-Type"] = rng.choice(CONTENT_TYPES)
    elif kind == "multipart":
        body, headers["Content-Type"] = _multipart(rng, valid)
    elif kind == "bad_id":
        body = json.dumps(example).encode() if valid else b""
    if body and "Content-Type" not in headers and rng.random() < 0.8:
        headers["Content-Type"] = "application/json"
    if rng.random() < 0.05:
        method = rng.choice(["PUT", "PATCH", "DELETE", "GET", "POST"])
    return {"method": method, "url": path, "headers": headers, "body": body}


def _typed(reply: httpx.Response) -> str | None:
    """OpenAI's error shape: its ``code``, or ``None`` if the body is not that shape."""
    try:
        error = reply.json()["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        assert "param" in error and isinstance(error["code"], str)
        return error["code"]
    except (ValueError, KeyError, TypeError, AssertionError):
        return None


LIVE_VIDEO = {**VIDEO, "seconds": "4", "fps": 8, "num_inference_steps": 50}
"""A job long enough to be queued or in progress while requests name it."""
ACTIVE = ("queued", "in_progress")


class LiveJob:
    """The ``{id}`` routes' valid target: a video job kept queued or in progress (a new one
    once the last finished, or the fuzz's own ``DELETE`` cancelled it), so that ``GET``,
    ``DELETE`` and ``content`` meet a job while it runs. Where ``video_max_active_jobs``
    refuses it (429: jobs the ``POST`` fuzz left running), those jobs are cancelled."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.id = ""
        self.made = 0
        self.cancelled_others = 0
        self.sent_while: Counter[str] = Counter()

    async def ensure(self) -> str:
        """The job's status now (a new job's, if the last one had ended)."""
        if self.id:
            reply = await self.client.get(f"/v1/videos/{self.id}", headers=AUTH)
            if reply.status_code == 200 and reply.json().get("status") in ACTIVE:
                return str(reply.json()["status"])
        with trio.fail_after(120):
            while True:
                reply = await self.client.post("/v1/videos", json=LIVE_VIDEO, headers=AUTH)
                if reply.status_code == 200:
                    self.id = reply.json()["id"]
                    self.made += 1
                    return str(reply.json()["status"])
                if reply.status_code != 429:
                    raise RuntimeError(f"no live job: {reply.status_code} {reply.text[:200]}")
                listed = await self.client.get("/v1/videos?limit=100", headers=AUTH)
                for job in listed.json()["data"]:
                    if job["status"] in ACTIVE:
                        await self.client.delete(f"/v1/videos/{job['id']}", headers=AUTH)
                        self.cancelled_others += 1
                await trio.sleep(0.2)


async def fuzz_http_routes(http: str, group: str, frames: int, seed: str,
                           results: dict[str, Any]) -> None:  # fmt: skip
    """Each route of ``group`` (``speech`` or ``media``): ``frames`` requests, a barrier each."""
    routes = SPEECH_ROUTES if group == "speech" else MEDIA_ROUTES
    if group == "video_ids":  # the {id} routes alone
        routes = {name: route for name, route in MEDIA_ROUTES.items() if "{id}" in name}
    limit = 2 * 2**20 if group == "speech" else 2**20
    async with httpx.AsyncClient(base_url=http, timeout=60) as client:
        for name, route in routes.items():
            tally = Tally()
            rng = random.Random(f"{seed}-{name}")
            live = LiveJob(client) if "{id}" in route[1] else None
            t = trio.current_time()
            for _ in range(frames):
                kind = HTTP_KINDS[rng.randrange(len(HTTP_KINDS))]
                if live is not None:  # the job the request may name: its status when sent
                    live.sent_while[await live.ensure()] += 1
                request = http_request(route, kind, rng, limit, live.id if live else "")
                tally.frames += 1
                tally.by_kind[kind] += 1
                await _one_http(client, request, tally)
                await _barrier(client, http, BARRIER[group], kind, tally)
            status = (await client.get("/health", headers=AUTH)).status_code
            tally.final_check = f"/health {status}"
            results[name] = {**tally.report(), "seconds": round(trio.current_time() - t, 1)}
            if live is not None:
                results[name]["live_jobs"] = {
                    "requests_sent_while_the_job_was": dict(live.sent_while),
                    "made": live.made,
                    "cancelled_others_to_make_room": live.cancelled_others,
                }


async def _barrier(
    client: httpx.AsyncClient, http: str, path: str, kind: str, tally: Tally
) -> None:
    """A cheap valid GET must answer 200. A pooled connection the server closed after a
    refused body (it left the body unread) is retried once on a new connection."""
    try:
        try:
            reply = await client.get(path, headers=AUTH, timeout=30)
        except httpx.RemoteProtocolError:
            tally.answers["barrier retried on a new connection"] += 1
            async with httpx.AsyncClient(base_url=http, timeout=30) as fresh:
                reply = await fresh.get(path, headers=AUTH)
        if reply.status_code != 200:
            tally.unusable.append(f"barrier {reply.status_code} after {kind}")
    except httpx.TransportError as exc:
        tally.unusable.append(f"barrier {exc!r} after {kind}")


async def _one_http(client: httpx.AsyncClient, request: dict[str, Any], tally: Tally) -> None:
    described = (
        f"{request['method']} {request['url'][:80]} "
        f"{request['headers'].get('Content-Type')!r} body {request['body'][:80]!r}"
    )
    try:
        reply = await client.request(
            request["method"], request["url"], headers=request["headers"], content=request["body"]
        )
    except httpx.RemoteProtocolError:  # the server closed the connection (a refused body)
        tally.answers["connection closed"] += 1
        return
    except httpx.TransportError as exc:
        tally.hung.append(f"{described}: {exc!r}")
        return
    if reply.status_code >= 400:
        code = _typed(reply) if request["method"] != "HEAD" else "head"
        if code is None or (reply.status_code >= 500 and reply.status_code != 503):
            tally.untyped.append(f"{reply.status_code} {reply.text[:160]!r} for {described}")
            return
        tally.answers[f"{reply.status_code}:{code}"] += 1
    else:
        tally.answers[str(reply.status_code)] += 1


# -- WebSocket endpoints -----------------------------------------------------------------------

TEXT_LIMIT = 128 * 1024
"""The speech stream's ``input.text`` limit (``text_too_large`` past it); a frame that
carries it is reached only with ``--max-frame-bytes`` above half of it (hypercorn closes
a frame over twice ``max_frame_bytes`` with 1009 first)."""
STREAM_CONFIG = {"type": "session.config", "voice": "alloy", "response_format": "pcm",
                 "speed": 1.0, "sample_rate": 8000, "model": "tts-1",
                 "split_granularity": "sentence", "instructions": ""}  # fmt: skip
VIDEO_START = {"type": "session.start", "prompt": "waves", "model": "tiny-video",
               "format": "m4s", "width": 8, "height": 8, "fps": 1, "num_frames": 1, "seed": 1,
               "num_inference_steps": 1, "guidance_scale": 1.0, "negative_prompt": "x"}  # fmt: skip


class SpeechStreamEndpoint:
    """``/v1/audio/speech/stream``: config, then frame and barrier (an unknown event named
    for the frame, whose ``unknown_event`` error names it)."""

    closes = {1000, 1008, 1009}  # session.close or idle; config_timeout; over the size limit

    def __init__(self, url: str, limit: int) -> None:
        self.url = url
        self.limit = limit
        self.examples = [STREAM_CONFIG, {"type": "input.text", "text": "Hi there."},
                         {"type": "input.done"}, {"type": "session.close"}]  # fmt: skip

    def frame(self, kind: str, rng: random.Random) -> str | bytes:
        examples = self.examples[:3] if rng.random() < 0.95 else self.examples
        if kind == "mutated":
            return _mutate(rng, rng.choice(examples))
        if kind == "wrong_type":
            return _wrong_type(rng, examples)
        if kind == "numbers":
            return _numbers(rng, STREAM_CONFIG)
        if kind == "deep":
            return _deep(rng)
        if kind == "binary":
            return rng.randbytes(rng.choice([0, 1, 100, 4096]))
        if kind == "size":  # the stream's own text limit, and over the frame limit
            size = rng.choice([TEXT_LIMIT - 1, TEXT_LIMIT, TEXT_LIMIT + 1, 2 * self.limit + 1])
            return json.dumps({"type": "input.text", "text": " " * size})  # (nothing to say)
        return _garbage(rng, examples)

    async def lane(self, frames: int, rng: random.Random, tally: Tally, lane: int) -> None:
        async def opened(ws: ClientConnection) -> Step:
            await ws.send(json.dumps(STREAM_CONFIG))

            async def step(kind: str, n: int) -> bool:
                barrier, answered = self.barrier(lane * 100_000 + n)
                frame = self.frame(kind, rng)
                return await _one_ws(ws, frame, barrier, answered, tally, self.closes)

            return step

        await frame_lane(self.url, frames, rng, tally, WS_KINDS, opened)

    def barrier(self, n: int) -> tuple[str, Callable[[dict[str, Any]], bool]]:
        name = f"barrier-{n}"

        def answered(event: dict[str, Any]) -> bool:
            return event["type"] == "error" and name in str(event.get("message"))

        return json.dumps({"type": name}), answered

    async def usable(self) -> str:
        async with connect(self.url, additional_headers=AUTH, max_size=None) as ws:
            await ws.send(json.dumps(STREAM_CONFIG))
            await ws.send(json.dumps({"type": "input.text", "text": "Hello there."}))
            await ws.send(json.dumps({"type": "input.done"}))
            heard = 0
            with trio.fail_after(30):
                while True:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        heard += len(message)
                    elif json.loads(message)["type"] == "session.done":
                        break
            return "speech ok" if heard > 1000 else f"speech short: {heard} bytes"


class VideoStreamEndpoint:
    """``/v1/realtime/video``: half the sockets get the frame first (fuzzing the start),
    half a valid tiny start first; the barrier is ``session.ping`` (answer:
    ``session.pong``). A generation that ends closes with 1000: a new socket."""

    closes = {1000, 1008, 1009, 1011}

    def __init__(self, url: str, limit: int) -> None:
        self.url = url
        self.limit = limit
        self.examples = [VIDEO_START, {"type": "session.ping"}, {"type": "session.interaction",
                         "prompt": "x"}, {"type": "session.stop"}]  # fmt: skip

    def frame(self, kind: str, rng: random.Random, started: bool) -> str | bytes:
        examples = self.examples[1:3] if started else self.examples[:1]
        if kind == "mutated":
            return _mutate(rng, rng.choice(examples))
        if kind == "wrong_type":
            return _wrong_type(rng, examples)
        if kind == "numbers":
            return _numbers(rng, VIDEO_START)
        if kind == "deep":
            return _deep(rng)
        if kind == "binary":
            return rng.randbytes(rng.choice([0, 1, 100, 4096]))
        if kind == "size":
            size = rng.choice([128 * 1024 - 1, 128 * 1024 + 1, 4 * 2**20 + 1, self.limit + 1])
            return json.dumps({**rng.choice(examples), "negative_prompt": "a" * size})
        return _garbage(rng, examples)

    async def lane(self, frames: int, rng: random.Random, tally: Tally, lane: int) -> None:
        async def opened(ws: ClientConnection) -> Step:
            started = rng.random() < 0.5
            if started:
                start = dict(VIDEO_START, num_frames=rng.choice([1, 8, 32]))
                await ws.send(json.dumps(start))

            async def step(kind: str, n: int) -> bool:
                nonlocal started
                frame = self.frame(kind, rng, started)
                barrier = json.dumps({"type": "session.ping"})
                if not await _one_ws(ws, frame, barrier, _pong, tally, self.closes):
                    return False
                started = True  # a socket still open after its first frame started
                return True

            return step

        await frame_lane(self.url, frames, rng, tally, WS_KINDS, opened)

    async def usable(self) -> str:
        async with connect(self.url, additional_headers=AUTH, max_size=None) as ws:
            await ws.send(json.dumps(dict(VIDEO_START, num_frames=2)))
            data = 0
            with trio.fail_after(60):
                while True:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        data += len(message)
                    elif json.loads(message)["type"] == "session.done":
                        break
            return "video ok" if data > 0 else "video: no bytes"


def _pong(event: dict[str, Any]) -> bool:
    return event["type"] == "session.pong"


async def _one_ws(ws: ClientConnection, frame: str | bytes, barrier: str,
                  answered: Callable[[dict[str, Any]], bool], tally: Tally,
                  closes: set[int]) -> bool:  # fmt: skip
    """One frame and its barrier; ``False`` once the socket is closed."""
    try:
        await ws.send(frame)
        await ws.send(barrier)
        with trio.fail_after(30):
            while True:
                event = classify(
                    tally, await ws.recv(), frame, binary="<binary media>", flat_errors=True
                )
                if event is None:
                    continue
                if answered(event):
                    if event["type"] == "error":  # the barrier's own
                        tally.answers["error:" + str(event.get("code"))] -= 1
                    return True
                if event["type"] != "error":
                    tally.answers[event["type"]] += 1
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else None
        tally.closes[code] += 1
        if code not in closes:
            tally.undocumented_closes.append(f"close {code} after {_show(frame)}")
        return False
    except trio.TooSlowError:
        tally.hung.append(_show(frame))
        return False
