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
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, final
from urllib.parse import parse_qsl

import numpy as np
import trio
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.codecs import FragmentedMp4, encode_mp4, encode_png
from duplex.config import MediaConfig
from duplex.exceptions import EngineUnavailable, ProtocolError, RequestFailed, RequestsOverloaded
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry, Sample
from duplex.models import Completed
from duplex.models.diffusion import ImageRequest, ImageResult, VideoRequest, VideoResult
from duplex.refusals import Refusal, echo
from duplex.runtime import RequestEngines, RequestService
from duplex.transport import refusal_response

from .._cost import (
    DIFFUSION_SECONDS_PER_UNIT,
    Cost,
    CostBudget,
    CostLease,
    DiffusionCost,
    DiffusionShape,
)
from ._protocol import (
    MediaLimits,
    ModelNotLoaded,
    RealtimeVideoStart,
    VideoGeneration,
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

__all__ = ["MediaService", "media_routes"]

MAX_BODY_BYTES: Final = 1024 * 1024
"""Largest image or video request body (a prompt and a few numbers)."""
RETRY_AFTER_S: Final = 1
"""``Retry-After`` of a full job store and of a pipeline still starting."""


def _json(content: Any, status: int = 200) -> Response:
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(text, status_code=status, media_type="application/json")


def _images_body(images: Sequence[np.ndarray], seed: int, created: int) -> bytes:
    """``/v1/images/generations``' answer, made in a worker thread, as bytes joined round
    the base64 (its alphabet needs no JSON escape): a 512x512 image is about a megabyte of
    base64, and ``json.dumps`` over it held the GIL 10 ms an image on a 2-core host
    (the event loop's realtime sessions wait that long), the join 4 ms (base64 itself)."""
    items = [
        b'{"b64_json":"%s","seed":%d}' % (base64.b64encode(encode_png(image)), seed + index)
        for index, image in enumerate(images)
    ]
    return b'{"created":%d,"data":[%s]}' % (created, b",".join(items))


def _refused(exc: ProtocolError) -> Response:
    return refusal_response(Refusal.of(exc))


def _overloaded(message: str, retry_after_s: float = RETRY_AFTER_S) -> Response:
    return refusal_response(Refusal(429, message, "rate_limited", retry_after_s=retry_after_s))


ENGINE_LOST = (
    "The video model's engine process exited during the generation and is being restarted; "
    "start the generation again."
)
"""A video job's or stream's error when its engine process died under it (a crash, a
stall the watchdog ended): code ``engine_unavailable``, not ``generation_failed``."""


def _starting(kind: str) -> Refusal:
    message = f"The {kind} model is starting; retry shortly."
    return Refusal(503, message, "model_starting", retry_after_s=RETRY_AFTER_S, close_code=1013)


def _failed(message: str) -> Response:
    return refusal_response(Refusal(500, message, "generation_failed"))


def _not_found(what: str) -> Response:
    return refusal_response(Refusal(404, what, "not_found"))


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


def _replayed(request: Request, body: bytes) -> Request:
    """``request`` whose body, already read, is ``body``."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


def _too_large() -> Response:
    message = f"The body is larger than {MAX_BODY_BYTES} bytes."
    return refusal_response(Refusal(413, message, "body_too_large"))


async def _until_disconnect(request: Request) -> None:
    """Returns when the client has gone (its body was read: nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _new_seed() -> int:
    return secrets.randbelow(2**31)


@final
class MediaService:
    """The routes' view of the ``image`` and ``video`` request engines, the video jobs and
    their tasks.

    Args:
        requests: the process's request engines (``None``: no pipeline is served here).
        config: the ``[media]`` section: chunking, the job store's bounds, the stream's
            timeouts, the time ceiling of one request.
        registry: where the job counts go.
        wall_clock: Unix time, for job timestamps and retention.
        memory_budget_bytes: what every image and video request in progress may hold
            together (`CostBudget`).
        seconds_per_unit: the pipelines' prior rate until a request has been measured
            (`DiffusionCost`; 0: none is refused for time before one is measured).
    """

    def __init__(
        self,
        requests: RequestEngines | None,
        *,
        config: MediaConfig | None = None,
        limits: MediaLimits | None = None,
        registry: MetricsRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
        memory_budget_bytes: int = 4 * 2**30,
        seconds_per_unit: float = DIFFUSION_SECONDS_PER_UNIT,
    ) -> None:
        self.requests = requests
        self.config = config or MediaConfig()
        """The ``[media]`` section: chunk frames, the job store's bounds, the stream timeouts."""
        self.limits = limits or MediaLimits()
        self.jobs = JobStore(
            max_jobs=self.config.video_max_jobs,
            max_active=self.config.video_max_active_jobs,
            retention_s=self.config.video_job_retention_s,
        )
        self.wall_clock = wall_clock
        self._job_scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self.log = get_logger(component="media")
        self.budget = CostBudget(
            memory_bytes=memory_budget_bytes, max_seconds=self.config.max_request_s
        )
        self.costs = {
            kind: DiffusionCost(seconds_per_unit=seconds_per_unit) for kind in ("image", "video")
        }
        self._outcomes: dict[tuple[str, str], int] = {}
        if registry is not None:
            registry.add_collector(
                "duplex_video_jobs", "gauge", "video jobs kept, by status", self._job_samples
            )
            registry.add_collector(
                "duplex_media_requests_total",
                "counter",
                "image and video requests by outcome (refused_memory, refused_time, "
                "refused_busy, abandoned, slow, answered)",
                self._outcome_samples,
            )
            registry.add_collector(
                "duplex_media_memory_held_bytes",
                "gauge",
                "estimated memory the image and video requests in progress hold",
                self._held_samples,
            )

    def _held_samples(self) -> list[Sample]:
        held = float(self.budget.statistics().held_bytes)
        return [Sample("duplex_media_memory_held_bytes", {}, held)]

    def _outcome_samples(self) -> list[Sample]:
        return [
            Sample("duplex_media_requests_total", {"kind": kind, "outcome": outcome}, float(n))
            for (kind, outcome), n in sorted(self._outcomes.items())
        ]

    def _count(self, kind: str, outcome: str) -> None:
        self._outcomes[kind, outcome] = self._outcomes.get((kind, outcome), 0) + 1

    def admit(self, kind: str, shape: DiffusionShape, extra_bytes: int = 0) -> CostLease | Refusal:
        """``shape``'s estimate (plus ``extra_bytes`` held beside it) checked against the
        budget: a lease to release when the work ends, or the refusal (counted, logged)."""
        estimate = self.costs[kind].estimate(shape)
        cost = Cost(estimate.memory_bytes + extra_bytes, estimate.seconds)
        lease = self.budget.admit(cost, shape)
        if isinstance(lease, Refusal):
            reason = {413: "refused_memory", 400: "refused_time"}.get(lease.status, "refused_busy")
            self._count(kind, reason)
            self.log.info(
                "media request refused", kind=kind, reason=reason, shape=shape.describe(),
                memory_bytes=cost.memory_bytes, estimated_s=round(cost.seconds, 1),
            )  # fmt: skip
        return lease

    def _finished(self, kind: str, lease: CostLease, started: float, outcome: str) -> None:
        """A request's end: its memory back to the budget; a slow one (twice its estimate and
        over a second) or an abandoned one logged; each counted."""
        self.budget.release(lease)
        took = trio.current_time() - started
        estimated = lease.cost.seconds
        if outcome != "answered":
            self.log.warning(
                "media request " + outcome, kind=kind, took_s=round(took, 2),
                estimated_s=round(estimated, 2),
            )  # fmt: skip
        elif took > max(1.0, 2.0 * estimated):
            outcome = "slow"
            self.log.warning(
                "media request slow", kind=kind, took_s=round(took, 2),
                estimated_s=round(estimated, 2),
            )  # fmt: skip
        self._count(kind, outcome)

    def _learn(self, kind: str, shape: DiffusionShape, completed: Completed[Any]) -> None:
        if completed.batch_size == 1:  # a batch's time is not one request's
            self.costs[kind].observe(shape, completed.run_ms / 1000.0)

    def _job_samples(self) -> list[Sample]:
        counts = dict.fromkeys(JobStatus, 0)
        for job in self.jobs.list(self.wall_clock(), limit=self.config.video_max_jobs):
            counts[job.status] += 1
        return [
            Sample("duplex_video_jobs", {"status": s.value}, float(n)) for s, n in counts.items()
        ]

    def configured(self, kind: str) -> bool:
        return self.requests is not None and kind in self.requests.configured

    def _engine(self, kind: str) -> RequestService | Refusal:
        """The engine serving ``kind``, or the refusal: not loaded (404), starting (503)."""
        if self.requests is None or kind not in self.requests.configured:
            return Refusal.of(_not_loaded(kind))
        service = self.requests.get(kind)
        return service if service is not None else _starting(kind)

    @staticmethod
    def _model(service: RequestService, kind: str) -> str:
        return str(service.metadata.get("model", kind))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery the video jobs run in, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- images -------------------------------------------------------------------------------

    async def generate_images(self, request: Request) -> Response | None:
        """``POST /v1/images/generations``; ``None``: the client left before the answer."""
        engine = self._engine("image")
        if isinstance(engine, Refusal):
            return refusal_response(engine)
        try:
            body = await _read_body(request)
            asked = parse_image_request(body, self._model(engine, "image"), self.limits)
        except _BodyTooLarge:
            return _too_large()
        except ProtocolError as exc:
            return _refused(exc)
        shape = DiffusionShape(asked.width, asked.height, asked.steps, n=asked.n)
        lease = self.admit("image", shape)
        if isinstance(lease, Refusal):
            return refusal_response(lease)
        started = trio.current_time()
        try:
            result = await self._generate_images(request, engine, asked, shape)
        except BaseException:
            self._finished("image", lease, started, "abandoned")
            raise
        self._finished("image", lease, started, "abandoned" if result is None else "answered")
        return result

    async def _generate_images(
        self, request: Request, engine: RequestService, asked: Any, shape: DiffusionShape
    ) -> Response | None:
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
        )
        result = await self._until_client_leaves(request, engine, work, shape)
        if not isinstance(result, ImageResult):
            return result
        created = int(self.wall_clock())
        body = await trio.to_thread.run_sync(_images_body, result.images, seed, created)
        return Response(body, media_type="application/json")

    async def _until_client_leaves(
        self, request: Request, engine: RequestService, work: ImageRequest, shape: DiffusionShape
    ) -> ImageResult | Response | None:
        """``engine.submit(work)``, withdrawn if the client disconnects first (``None``)."""
        outcome: list[ImageResult | Response] = []
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await _until_disconnect(request)
                nursery.cancel_scope.cancel()

            async def generate() -> None:
                try:
                    completed = await engine.submit_timed(work)
                    self._learn("image", shape, completed)
                    outcome.append(completed.result)
                except RequestsOverloaded as exc:
                    outcome.append(
                        _overloaded(f"Too many requests queued: {exc}", exc.retry_after_s)
                    )
                except EngineUnavailable as exc:  # its engine process is being restarted
                    self.log.warning("generation failed", error=str(exc))
                    outcome.append(refusal_response(_starting("image")))
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
        engine = self._engine("video")
        if isinstance(engine, Refusal):
            return refusal_response(engine)
        model = self._model(engine, "video")
        try:
            if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
                raise _BodyTooLarge
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            raw: bytes | dict[str, str]
            if kind == "multipart/form-data":  # parts of at most 1 MiB, at most 32 of them
                raw = {}
                # the whole body within its bound first: the form parser reads a chunked
                # body's epilogue (bytes after the closing boundary) without any limit
                whole = await _read_body(request)
                async with _replayed(request, whole).form(
                    max_files=0, max_fields=32, max_part_size=MAX_BODY_BYTES
                ) as form:
                    for key, value in form.multi_items():
                        if not isinstance(value, str) or key in raw:
                            raise _BadForm(key)
                        raw[key] = value
            elif kind == "application/x-www-form-urlencoded":  # read within the body's bound
                raw = {}
                text = (await _read_body(request)).decode("utf-8", "replace")
                for key, value in parse_qsl(text, keep_blank_values=True, max_num_fields=32):
                    if key in raw:
                        raise _BadForm(key)
                    raw[key] = value
            else:
                raw = await _read_body(request)
            asked = parse_video_request(raw, model, self.limits)
        except _BodyTooLarge:
            return _too_large()
        except _BadForm as bad:
            message = f"Form field {bad.key[:100]!r} must be one text value."
            return _refused(ProtocolError(message, param=bad.key[:100]))
        except ProtocolError as exc:
            return _refused(exc)
        except HTTPException as exc:  # the form parser's refusals (too many fields, bad parts)
            return _refused(ProtocolError(f"The form could not be read: {exc.detail}"))
        except ValueError:  # parse_qsl: more than 32 fields
            return _refused(ProtocolError("The form has more than 32 fields."))
        lease = self._admit_video(asked)
        if isinstance(lease, Refusal):
            return refusal_response(lease)
        now = self.wall_clock()
        job = VideoJob(
            id=f"video_{secrets.token_hex(12)}",
            model=model,
            prompt=asked.prompt,
            size=f"{asked.width}x{asked.height}",
            seconds=asked.seconds,
            created_at=now,
        )
        try:
            self.jobs.create(job, now)
        except JobStoreFull as exc:
            self.budget.release(lease)
            return _overloaded(f"Too many video jobs: {exc}")
        scope = trio.CancelScope()
        self._job_scopes[job.id] = scope
        assert self._nursery is not None, "MediaService.run is not running"
        self._nursery.start_soon(self._run_job, job.id, asked, scope, lease)
        return _json(job.as_dict(self.jobs.retention_s))

    def _admit_video(
        self, asked: VideoGeneration | RealtimeVideoStart, *, stream: bool = False
    ) -> CostLease | Refusal:
        """A video's lease: its time is every chunk's, its memory one chunk's working memory
        plus, for a job, every frame kept for the MP4 (3 bytes a pixel)."""
        chunk = min(self.config.video_chunk_frames, asked.frames)
        chunks = -(-asked.frames // chunk)
        shape = DiffusionShape(
            asked.width, asked.height, asked.steps, frames=chunk,
            param="width" if stream else "size",
        )  # fmt: skip
        kept = 0 if stream else asked.frames * asked.width * asked.height * 3
        whole = DiffusionShape(
            asked.width, asked.height, asked.steps, frames=asked.frames, param=shape.param
        )
        estimate = self.costs["video"].estimate(shape)
        cost = Cost(estimate.memory_bytes + kept, estimate.seconds * chunks)
        lease = self.budget.admit(cost, whole)
        if isinstance(lease, Refusal):
            reason = {413: "refused_memory", 400: "refused_time"}.get(lease.status, "refused_busy")
            self._count("video", reason)
            self.log.info(
                "media request refused", kind="video", reason=reason, shape=whole.describe(),
                memory_bytes=cost.memory_bytes, estimated_s=round(cost.seconds, 1),
            )  # fmt: skip
        return lease

    def _chunks(self, asked: VideoGeneration | RealtimeVideoStart, seed: int) -> list[VideoRequest]:
        """The requests of a video, one a chunk; chunk ``k`` draws its noise from ``seed + k``."""
        size = self.config.video_chunk_frames
        return [
            VideoRequest(
                prompt=asked.prompt,
                width=asked.width,
                height=asked.height,
                frames=min(size, asked.frames - start),
                seed=seed + index,
                steps=asked.steps,
                guidance_scale=asked.guidance_scale,
                negative_prompt=asked.negative_prompt,
            )
            for index, start in enumerate(range(0, asked.frames, size))
        ]

    async def _run_job(
        self, job_id: str, asked: VideoGeneration, scope: trio.CancelScope, lease: CostLease
    ) -> None:
        """Generate the job's chunks in order, then its MP4; ``scope``: ``DELETE``'s handle."""
        seed = asked.seed if asked.seed is not None else _new_seed()
        chunks = self._chunks(asked, seed)
        frames: list[np.ndarray] = []
        started = trio.current_time()
        outcome = "abandoned"
        try:
            with scope:
                for index, work in enumerate(chunks):
                    result = await self._submit_chunk(work, lambda: self._started(job_id))
                    frames.extend(result.frames)
                    self.jobs.set_progress(job_id, 100 * (index + 1) // len(chunks))
                mp4 = await trio.to_thread.run_sync(
                    partial(
                        encode_mp4, frames, width=asked.width, height=asked.height, fps=asked.fps
                    )
                )
                self.jobs.complete(job_id, mp4, self.wall_clock())
                outcome = "answered"
        except EngineUnavailable as exc:  # not the job's fault: its engine process died
            self.log.warning("video job failed", job=job_id, reason="engine_unavailable",
                             error=str(exc))  # fmt: skip
            self.jobs.fail(job_id, ENGINE_LOST, self.wall_clock(), code="engine_unavailable")
        except RequestFailed as exc:
            self.log.error("video job failed", job=job_id, exc_info=exc)
            self.jobs.fail(job_id, "The generation failed.", self.wall_clock())
        finally:
            self._job_scopes.pop(job_id, None)
            frames.clear()
            self._finished("video", lease, started, outcome)

    def _started(self, job_id: str) -> None:
        self.jobs.start(job_id, self.wall_clock())

    async def _submit_chunk(
        self, work: VideoRequest, on_queued: Callable[[], None] = lambda: None
    ) -> VideoResult:
        """Submit one chunk (``on_queued`` first); while the engine's queue is full or the
        engine is starting, wait and try again (an admitted job waits its turn, never fails
        for it).

        Raises:
            RequestFailed: the runner raised, or the engine is no longer configured.
        """
        while True:
            engine = self._engine("video")
            if not isinstance(engine, Refusal):
                on_queued()
                try:
                    completed = await engine.submit_timed(work)
                    shape = DiffusionShape(work.width, work.height, work.steps, frames=work.frames)
                    self._learn("video", shape, completed)
                    return completed.result  # type: ignore[no-any-return]
                except RequestsOverloaded as exc:
                    await trio.sleep(exc.retry_after_s)
                    continue
            if not self.configured("video"):
                raise RequestFailed("the video model is not loaded")
            await trio.sleep(RETRY_AFTER_S)

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
            message = f"Video job {echo(job_id)} is {job.status.value}: no content."
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
        engine = self._engine("video")
        if isinstance(engine, Refusal):
            frame = {"type": "error", "message": engine.message, "code": engine.code}
            await websocket.send_text(json.dumps(frame))
            await websocket.close(1000 if engine.code == "model_not_loaded" else 1013, engine.code)
            return
        machine = RealtimeVideo(
            model=self._model(engine, "video"),
            request_id=f"video_stream-{secrets.token_hex(8)}",
            limits=self.limits,
            now=trio.current_time(),
            start_timeout_s=self.config.video_start_timeout_s,
            stall_timeout_s=self.config.video_stall_timeout_s,
        )
        lock = trio.Lock()
        generation = trio.CancelScope()
        async with trio.open_nursery() as nursery:

            async def perform(effects: Sequence[Effect]) -> None:
                async with lock:  # a chunk's metadata and its bytes go out together
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

            async def generate(start: RealtimeVideoStart) -> None:
                lease = self._admit_video(start, stream=True)
                if isinstance(lease, Refusal):
                    now = trio.current_time()
                    await perform(machine.failed(lease.message, now, code=lease.code))
                    return
                started = trio.current_time()
                outcome = "abandoned"
                try:
                    await generate_within(start)
                    outcome = "answered"
                finally:
                    self._finished("video", lease, started, outcome)

            async def generate_within(start: RealtimeVideoStart) -> None:
                writer = FragmentedMp4(width=start.width, height=start.height, fps=start.fps)
                seed = start.seed if start.seed is not None else _new_seed()
                with generation:
                    try:
                        for work in self._chunks(start, seed):
                            result = await self._submit_chunk(work)
                            encoded = await trio.to_thread.run_sync(writer.write, result.frames)
                            await perform(machine.chunk(*encoded, trio.current_time()))
                        encoded = await trio.to_thread.run_sync(writer.close)
                        await perform(machine.finished(*encoded, trio.current_time()))
                    except EngineUnavailable as exc:
                        self.log.warning("video stream failed", reason="engine_unavailable",
                                         error=str(exc))  # fmt: skip
                        now = trio.current_time()
                        await perform(machine.failed(ENGINE_LOST, now, code="engine_unavailable"))
                    except RequestFailed as exc:
                        self.log.error("video stream failed", exc_info=exc)
                        await perform(machine.failed("The generation failed.", trio.current_time()))
                    finally:
                        writer.close()

            nursery.start_soon(read)
            nursery.start_soon(clock)


class _BadForm(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def media_routes(media: MediaService | None) -> list[BaseRoute]:
    """The generation routes; with no service (``None``) each answers ``model_not_loaded``."""
    service = media or MediaService(None)

    async def images(request: Request) -> Response:
        answer = await service.generate_images(request)
        return answer if answer is not None else Response(status_code=499)

    async def create(request: Request) -> Response:
        return await service.create_video(request)

    async def listed(request: Request) -> Response:
        if not service.configured("video"):
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
