"""Image and video generation over HTTP and WebSocket: the routes' one service.

Each request is a short-lived task that submits work to its pipeline's request
engine (one diffusion step a unit of preemption) and answers from the result:

- ``POST /v1/images/generations``: the request's task waits for its images; a client
  that disconnects meanwhile withdraws the request (the engine stops it at its next
  step).
- ``POST /v1/videos``: a job (`JobStore`) whose task, in this service's nursery,
  generates the video chunk by chunk and keeps the MP4; ``DELETE`` cancels it.
- ``WS /v1/realtime/video``: `RealtimeVideo` decides, this adapter performs: it
  generates chunk by chunk and sends each as fragmented MP4.

A full engine queue or job store answers 429 with ``Retry-After``; an endpoint whose
pipeline is not loaded answers 404 ``model_not_loaded``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar, final

import numpy as np
import trio
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.exceptions import ProtocolError
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry, Sample
from duplex.models.diffusion import (
    ImageRequest,
    ImageResult,
    RequestFailed,
    RequestsOverloaded,
    StepProgress,
    VideoRequest,
    VideoResult,
)

from ._media_encode import FragmentedMp4, encode_mp4, encode_png
from ._media_wire import (
    MediaLimits,
    ModelNotLoaded,
    error_body,
    error_status,
    parse_image_request,
    parse_video_request,
)
from ._video_jobs import JobStatus, JobStore, JobStoreFull, VideoJob
from ._video_stream import (
    Close,
    Effect,
    RealtimeVideo,
    SendBinary,
    SendText,
    StartGeneration,
    StopGeneration,
)

__all__ = ["MediaService", "MediaSettings", "Pipeline", "media_routes"]

Req = TypeVar("Req")
Res = TypeVar("Res")

MAX_BODY_BYTES: Final = 1024 * 1024
"""Largest image or video request body (a prompt and a few numbers)."""
PROGRESS_POLL_S: Final = 0.25
"""How often a job or a stream reads its running request's step count."""
RETRY_AFTER_S: Final = 1


class Engine(Protocol[Req, Res]):
    """What a route needs of a request engine (``duplex.models``)."""

    async def submit(self, request: Req) -> Res: ...

    def statistics(self) -> Any: ...


@final
@dataclass(frozen=True, slots=True)
class Pipeline(Generic[Req, Res]):
    """A loaded pipeline: the model id clients name, and the engine that runs it."""

    model: str
    engine: Engine[Req, Res]


@final
@dataclass(frozen=True, slots=True)
class MediaSettings:
    limits: MediaLimits = field(default_factory=MediaLimits)
    chunk_frames: int = 16
    """Frames generated per video request (a job's chunk, a stream's chunk)."""
    max_jobs: int = 64
    max_active_jobs: int = 8
    job_retention_s: float = 3600.0
    start_timeout_s: float = 10.0
    stall_timeout_s: float = 60.0


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(text, status_code=status, media_type="application/json", headers=headers)


def _refused(exc: ProtocolError) -> Response:
    return _json(error_body(exc), error_status(exc))


def _overloaded(message: str) -> Response:
    error = {"message": message, "type": "rate_limit_error", "param": None, "code": "rate_limited"}
    return _json({"error": error}, 429, {"Retry-After": str(RETRY_AFTER_S)})


def _failed(message: str) -> Response:
    error = {"message": message, "type": "server_error", "param": None, "code": "generation_failed"}
    return _json({"error": error}, 500)


def _not_found(what: str) -> Response:
    error = {"message": what, "type": "invalid_request_error", "param": None, "code": "not_found"}
    return _json({"error": error}, 404)


def _not_loaded(kind: str) -> ModelNotLoaded:
    return ModelNotLoaded(
        f"The {kind} model is not loaded: start the server with --{kind}-model PATH "
        f"(or --{kind}-model tiny).",
        param="model",
    )


class _BodyTooLarge(Exception):
    pass


async def _read_body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _BodyTooLarge
    return body


def _too_large() -> Response:
    error = {
        "message": f"The body is larger than {MAX_BODY_BYTES} bytes.",
        "type": "invalid_request_error",
        "param": None,
        "code": "body_too_large",
    }
    return _json({"error": error}, 413)


async def _until_disconnect(request: Request) -> None:
    """Returns when the client has gone (its body was read: nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _new_seed() -> int:
    return secrets.randbelow(2**31)


@final
class MediaService:
    """The image and video pipelines, the video jobs and their tasks."""

    def __init__(
        self,
        *,
        image: Pipeline[ImageRequest, ImageResult] | None,
        video: Pipeline[VideoRequest, VideoResult] | None,
        settings: MediaSettings | None = None,
        registry: MetricsRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.image = image
        self.video = video
        self.settings = settings or MediaSettings()
        self.jobs = JobStore(
            max_jobs=self.settings.max_jobs,
            max_active=self.settings.max_active_jobs,
            retention_s=self.settings.job_retention_s,
        )
        self.wall_clock = wall_clock
        self._job_scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self.streams_cancelled = 0
        self.log = get_logger(component="media")
        if registry is not None:
            self._export(registry)

    def _export(self, registry: MetricsRegistry) -> None:
        fields = ("submitted", "refused", "cancelled", "completed", "failed", "units")
        for stat in fields:
            name = "duplex_media_steps_total" if stat == "units" else f"duplex_media_{stat}_total"

            def collect(name: str = name, stat: str = stat) -> list[Sample]:
                return [
                    Sample(name, {"runner": kind}, float(getattr(p.engine.statistics(), stat)))
                    for kind, p in (("image", self.image), ("video", self.video))
                    if p is not None
                ]

            what = "diffusion steps run" if stat == "units" else f"generation requests {stat}"
            registry.add_collector(name, "counter", f"{what}, by pipeline", collect)

        def queued() -> list[Sample]:
            return [
                Sample("duplex_media_queued", {"runner": kind}, float(p.engine.statistics().queued))
                for kind, p in (("image", self.image), ("video", self.video))
                if p is not None
            ]

        registry.add_collector("duplex_media_queued", "gauge", "requests waiting", queued)

        def jobs() -> list[Sample]:
            now = self.wall_clock()
            counts = dict.fromkeys(JobStatus, 0)
            for job in self.jobs.list(now, limit=self.settings.max_jobs):
                counts[job.status] += 1
            return [
                Sample("duplex_video_jobs", {"status": s.value}, float(n))
                for s, n in counts.items()
            ]

        registry.add_collector("duplex_video_jobs", "gauge", "video jobs kept, by status", jobs)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery the video jobs run in, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- images -------------------------------------------------------------------------------

    async def generate_images(self, request: Request) -> Response | None:
        """``POST /v1/images/generations``; ``None``: the client left before the answer."""
        if self.image is None:
            return _refused(_not_loaded("image"))
        try:
            body = await _read_body(request)
            asked = parse_image_request(body, self.image.model, self.settings.limits)
        except _BodyTooLarge:
            return _too_large()
        except ProtocolError as exc:
            return _refused(exc)
        seed = asked.seed if asked.seed is not None else _new_seed()
        work = ImageRequest(
            prompt=asked.prompt,
            width=asked.width,
            height=asked.height,
            n=asked.n,
            seed=seed,
            steps=asked.steps,
            guidance_scale=asked.guidance_scale,
            negative_prompt=asked.negative_prompt,
            progress=StepProgress(asked.steps),
        )
        result = await self._until_client_leaves(request, self.image.engine.submit, work)
        if isinstance(result, Response) or result is None:
            return result
        images = await trio.to_thread.run_sync(lambda: [encode_png(i) for i in result.images])
        data = [
            {"b64_json": base64.b64encode(png).decode(), "seed": seed + index}
            for index, png in enumerate(images)
        ]
        return _json({"created": int(self.wall_clock()), "data": data})

    async def _until_client_leaves(
        self, request: Request, submit: Callable[[Req], Awaitable[Res]], work: Req
    ) -> Res | Response | None:
        """``submit(work)``, withdrawn if the client disconnects first (then ``None``)."""
        outcome: list[Res | Response] = []
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await _until_disconnect(request)
                nursery.cancel_scope.cancel()

            async def generate() -> None:
                try:
                    outcome.append(await submit(work))
                except RequestsOverloaded as exc:
                    outcome.append(_overloaded(f"Too many requests queued: {exc}"))
                except RequestFailed as exc:
                    self.log.error("generation failed", exc_info=exc)
                    outcome.append(_failed("The generation failed."))
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(generate)
        return outcome[0] if outcome else None

    # -- video jobs ---------------------------------------------------------------------------

    async def create_video(self, request: Request) -> Response:
        """``POST /v1/videos``: JSON, or a form (multipart or urlencoded)."""
        if self.video is None:
            return _refused(_not_loaded("video"))
        limits = self.settings.limits
        try:
            if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
                raise _BodyTooLarge
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
                async with request.form(
                    max_files=0, max_fields=32, max_part_size=MAX_BODY_BYTES
                ) as form:
                    raw: bytes | dict[str, str] = {}
                    for key, value in form.multi_items():
                        if not isinstance(value, str) or key in raw:
                            raise _BadForm(key)
                        raw[key] = value
            else:
                raw = await _read_body(request)
            asked = parse_video_request(raw, self.video.model, limits)
        except _BodyTooLarge:
            return _too_large()
        except _BadForm as bad:
            return _refused(
                ProtocolError(f"Form field {bad.key!r} must be one text value.", param=bad.key)
            )
        except ProtocolError as exc:
            return _refused(exc)
        except HTTPException as exc:  # the form parser's refusals (too many fields, bad parts)
            return _refused(ProtocolError(f"The form could not be read: {exc.detail}"))
        now = self.wall_clock()
        job = VideoJob(
            id=f"video_{secrets.token_hex(12)}",
            model=self.video.model,
            prompt=asked.prompt,
            size=f"{asked.width}x{asked.height}",
            seconds=asked.seconds,
            created_at=now,
        )
        try:
            self.jobs.create(job, now)
        except JobStoreFull as exc:
            return _overloaded(f"Too many video jobs: {exc}")
        scope = trio.CancelScope()
        self._job_scopes[job.id] = scope
        assert self._nursery is not None, "MediaService.run is not running"
        self._nursery.start_soon(self._run_job, job.id, asked, scope)
        return _json(job.as_dict(self.jobs.retention_s))

    def _chunks(self, frames: int) -> list[int]:
        size = self.settings.chunk_frames
        return [min(size, frames - start) for start in range(0, frames, size)]

    async def _run_job(self, job_id: str, asked: Any, scope: trio.CancelScope) -> None:
        assert self.video is not None
        seed = asked.seed if asked.seed is not None else _new_seed()
        chunks = self._chunks(asked.frames)
        total_steps = len(chunks) * asked.steps
        done_steps = 0
        frames: list[np.ndarray] = []
        try:
            with scope:
                for index, count in enumerate(chunks):
                    progress = StepProgress(asked.steps)
                    work = VideoRequest(
                        prompt=asked.prompt,
                        width=asked.width,
                        height=asked.height,
                        frames=count,
                        seed=seed + index,
                        steps=asked.steps,
                        guidance_scale=asked.guidance_scale,
                        negative_prompt=asked.negative_prompt,
                        progress=progress,
                    )

                    def report(done: int = done_steps, progress: StepProgress = progress) -> None:
                        steps = done + progress.done
                        if steps and self.jobs.start(job_id, self.wall_clock()):
                            pass
                        self.jobs.set_progress(job_id, 100 * steps // total_steps)

                    result = await self._submit_watched(work, report)
                    done_steps += asked.steps
                    frames.extend(result.frames)
                self.jobs.start(job_id, self.wall_clock())
                mp4 = await trio.to_thread.run_sync(
                    lambda: encode_mp4(
                        frames, width=asked.width, height=asked.height, fps=asked.fps
                    )
                )
                self.jobs.complete(job_id, mp4, self.wall_clock())
        except RequestFailed as exc:
            self.log.error("video job failed", job=job_id, exc_info=exc)
            self.jobs.fail(job_id, "The generation failed.", self.wall_clock())
        finally:
            self._job_scopes.pop(job_id, None)

    async def _submit_watched(self, work: VideoRequest, report: Callable[[], None]) -> VideoResult:
        """Submit ``work`` (retrying while the engine's queue is full), calling ``report``
        every `PROGRESS_POLL_S` until it is done."""
        assert self.video is not None
        result: list[VideoResult] = []
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                while True:
                    report()
                    await trio.sleep(PROGRESS_POLL_S)

            nursery.start_soon(poll)
            while not result:
                try:
                    result.append(await self.video.engine.submit(work))
                except RequestsOverloaded:
                    await trio.sleep(RETRY_AFTER_S)
            nursery.cancel_scope.cancel()
        report()
        return result[0]

    def get_video(self, job_id: str) -> Response:
        job = self.jobs.get(job_id, self.wall_clock())
        if job is None:
            return _not_found(f"No video job {job_id[:100]!r}.")
        return _json(job.as_dict(self.jobs.retention_s))

    def list_videos(self, request: Request) -> Response:
        params = request.query_params
        try:
            limit = int(params.get("limit", "20"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= 100:
            return _refused(ProtocolError("'limit' must be from 1 to 100.", param="limit"))
        jobs = self.jobs.list(self.wall_clock(), limit=limit + 1, after=params.get("after"))
        page = [job.as_dict(self.jobs.retention_s) for job in jobs[:limit]]
        return _json(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(jobs) > limit,
            }
        )

    def video_content(self, job_id: str) -> Response:
        job = self.jobs.get(job_id, self.wall_clock())
        if job is None:
            return _not_found(f"No video job {job_id[:100]!r}.")
        if job.status is not JobStatus.COMPLETED or job.content is None:
            message = f"Video job {job_id!r} is {job.status.value}: no content."
            return _refused(ProtocolError(message, param="video_id"))
        return Response(job.content, media_type="video/mp4")

    def delete_video(self, job_id: str) -> Response:
        """An active job is cancelled (its work withdrawn); a finished one is removed."""
        now = self.wall_clock()
        job = self.jobs.get(job_id, now)
        if job is None:
            return _not_found(f"No video job {job_id[:100]!r}.")
        if self.jobs.cancel(job_id, now):
            scope = self._job_scopes.get(job_id)
            if scope is not None:
                scope.cancel()
            return _json(job.as_dict(self.jobs.retention_s))
        self.jobs.remove(job_id)
        return _json({"id": job_id, "object": "video.deleted", "deleted": True})

    # -- streaming video ----------------------------------------------------------------------

    async def stream_video(self, websocket: WebSocket) -> None:
        """``WS /v1/realtime/video``: run one socket's `RealtimeVideo` until it finishes."""
        await websocket.accept()
        if self.video is None:
            exc = _not_loaded("video")
            error = {"type": "error", "message": exc.message, "code": exc.code}
            await websocket.send_text(json.dumps(error))
            await websocket.close(1000, "model_not_loaded")
            return
        settings = self.settings
        machine = RealtimeVideo(
            model=self.video.model,
            request_id=f"video_stream-{secrets.token_hex(8)}",
            limits=settings.limits,
            now=trio.current_time(),
            start_timeout_s=settings.start_timeout_s,
            stall_timeout_s=settings.stall_timeout_s,
        )
        lock = trio.Lock()
        generation = trio.CancelScope()
        async with trio.open_nursery() as nursery:

            async def perform(effects: Sequence[Effect]) -> None:
                async with lock:  # a chunk's metadata and bytes go out together
                    for effect in effects:
                        if isinstance(effect, SendText):
                            await websocket.send_text(effect.text)
                        elif isinstance(effect, SendBinary):
                            await websocket.send_bytes(effect.data)
                        elif isinstance(effect, StartGeneration):
                            nursery.start_soon(generate, effect.start)
                        elif isinstance(effect, StopGeneration):
                            generation.cancel()
                        elif isinstance(effect, Close):
                            await websocket.close(effect.code, effect.reason)
                            nursery.cancel_scope.cancel()

            async def read() -> None:
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        if machine.phase.value == "streaming":
                            self.streams_cancelled += 1
                        nursery.cancel_scope.cancel()  # the running chunk is withdrawn
                        return
                    now = trio.current_time()
                    if message.get("text") is not None:
                        await perform(machine.receive_text(message["text"], now))
                    else:
                        await perform(machine.receive_binary(message.get("bytes") or b"", now))

            async def clock() -> None:
                while (deadline := machine.deadline) is not None:
                    await trio.sleep_until(deadline)
                    await perform(machine.tick(trio.current_time()))

            async def generate(start: Any) -> None:
                assert self.video is not None
                writer = FragmentedMp4(width=start.width, height=start.height, fps=start.fps)
                seed = start.seed if start.seed is not None else _new_seed()
                with generation:
                    try:
                        for index, count in enumerate(self._chunks(start.frames)):
                            progress = StepProgress(start.steps)
                            seen = [0]

                            def report(
                                progress: StepProgress = progress, seen: list[int] = seen
                            ) -> None:
                                if progress.done != seen[0]:
                                    seen[0] = progress.done
                                    machine.progress(trio.current_time())

                            work = VideoRequest(
                                prompt=start.prompt,
                                width=start.width,
                                height=start.height,
                                frames=count,
                                seed=seed + index,
                                steps=start.steps,
                                guidance_scale=start.guidance_scale,
                                negative_prompt=start.negative_prompt,
                                progress=progress,
                            )
                            result = await self._submit_watched(work, report)
                            data, frames = await trio.to_thread.run_sync(
                                writer.write, result.frames
                            )
                            await perform(machine.chunk(data, frames, trio.current_time()))
                        data, frames = await trio.to_thread.run_sync(writer.close)
                        await perform(machine.finished(data, frames, trio.current_time()))
                    except RequestFailed as exc:
                        self.log.error("video stream failed", exc_info=exc)
                        await perform(machine.failed("The generation failed.", trio.current_time()))
                    finally:
                        if not writer.closed:
                            writer.close()

            nursery.start_soon(read)
            nursery.start_soon(clock)


class _BadForm(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def media_routes(media: MediaService | None) -> list[BaseRoute]:
    """The generation routes; with no service (``None``) each answers ``model_not_loaded``."""
    service = media or MediaService(image=None, video=None)

    async def images(request: Request) -> Response:
        answer = await service.generate_images(request)
        return answer if answer is not None else Response(status_code=499)

    async def create(request: Request) -> Response:
        return await service.create_video(request)

    async def listed(request: Request) -> Response:
        if service.video is None:
            return _refused(_not_loaded("video"))
        return service.list_videos(request)

    async def one(request: Request) -> Response:
        job_id = request.path_params["video_id"]
        if request.method == "DELETE":
            return service.delete_video(job_id)
        return service.get_video(job_id)

    async def content(request: Request) -> Response:
        return service.video_content(request.path_params["video_id"])

    async def stream(websocket: WebSocket) -> None:
        with contextlib.suppress(WebSocketDisconnect):  # the client left: nothing to answer
            await service.stream_video(websocket)

    return [
        Route("/v1/images/generations", images, methods=["POST"]),
        Route("/v1/videos", create, methods=["POST"]),
        Route("/v1/videos", listed, methods=["GET"]),
        Route("/v1/videos/{video_id}", one, methods=["GET", "DELETE"]),
        Route("/v1/videos/{video_id}/content", content, methods=["GET"]),
        WebSocketRoute("/v1/realtime/video", stream),
    ]
