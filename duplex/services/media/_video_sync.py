"""``POST /v1/videos/sync``: a video generated while the client waits, answered as its MP4.

The body is ``POST /v1/videos``' (JSON, multipart or urlencoded; the same fields and
checks). Nothing is kept: no job, no stored MP4. The answer is ``video/mp4`` with the
whole file (with the seed in ``X-Seed``), or an error envelope: never a 200 with an
empty body. Its limits are the jobs': admission by its cost (memory and time, as a job's:
``MediaService._admit_video``, so 413 for a video that alone is over the memory budget,
400 for one over ``media.max_request_s``, 429 while others hold the budget), at most
``max_active_jobs`` sync generations at once and the video engine's queue
(``media_max_queue``); past either of the last two, ``429`` with ``Retry-After``. Once
its first chunk is admitted, a later chunk that finds the queue full waits its turn (as a
job's does). A client that leaves cancels the generation: its queued chunk is withdrawn,
its running one stops at its next step.
"""

from __future__ import annotations

from functools import partial
from typing import Final, final
from urllib.parse import parse_qsl

import numpy as np
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from duplex.codecs import encode_mp4
from duplex.exceptions import EngineUnavailable, ProtocolError, RequestFailed, RequestsOverloaded
from duplex.logs import get_logger
from duplex.refusals import Refusal
from duplex.runtime import RequestService
from duplex.transport import refusal_response

from .._forms import read_upload_form
from ._protocol import InvalidValue, VideoGeneration, parse_video_request
from ._serving import (
    ENGINE_LOST,
    MAX_BODY_BYTES,
    MediaService,
    _BodyTooLarge,
    _new_seed,
    _read_body,
    _until_disconnect,
)

__all__ = ["SyncVideos", "sync_routes"]

log = get_logger(component="media")
MAX_FORM_FIELDS: Final = 32


async def _read_video_request(
    request: Request, model: str, service: MediaService
) -> VideoGeneration:
    """The body as ``POST /v1/videos`` takes it: JSON, a multipart form (text fields only)
    or an urlencoded one, within `MAX_BODY_BYTES`.

    Raises:
        ProtocolError: a field refused, a form that cannot be read, a body too large (413).
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw: bytes | dict[str, str]
    if kind == "multipart/form-data":
        form = await read_upload_form(
            request, max_bytes=MAX_BODY_BYTES, files=frozenset(), max_fields=MAX_FORM_FIELDS
        )
        raw = form.fields
    elif kind == "application/x-www-form-urlencoded":
        text = (await _read_body(request)).decode("utf-8", "replace")
        raw = {}
        try:
            pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
        except ValueError:
            raise InvalidValue(f"The form has more than {MAX_FORM_FIELDS} fields.") from None
        for key, value in pairs:
            if key in raw:
                raise InvalidValue(f"Form field {key[:100]!r} is given twice.", param=key[:100])
            raw[key] = value
    else:
        raw = await _read_body(request)
    return parse_video_request(raw, model, service.limits)


@final
class SyncVideos:
    """The sync route's state: how many generations run now (at most ``max_active_jobs``).

    Args:
        service: the media service whose video engine, chunking and limits it uses.
    """

    def __init__(self, service: MediaService) -> None:
        self.service = service
        self.active = 0

    async def generate(self, request: Request) -> Response | None:
        """``POST /v1/videos/sync``; ``None``: the client left before the answer."""
        service = self.service
        engine = service._engine("video")
        if isinstance(engine, Refusal):
            return refusal_response(engine)
        try:
            asked = await _read_video_request(request, service._model(engine, "video"), service)
        except _BodyTooLarge:
            message = f"The body is larger than {MAX_BODY_BYTES} bytes."
            return refusal_response(Refusal(413, message, "body_too_large"))
        except ProtocolError as exc:
            return refusal_response(Refusal.of(exc))
        most = service.config.video_max_active_jobs
        if self.active >= most:
            message = f"Too many video generations at once (the most is {most}); retry later."
            return refusal_response(Refusal(429, message, "rate_limited", retry_after_s=1))
        lease = service._admit_video(asked)
        if isinstance(lease, Refusal):
            return refusal_response(lease)
        self.active += 1
        started, outcome = trio.current_time(), "abandoned"
        try:
            answer = await self._until_client_leaves(request, engine, asked)
            if answer is not None:
                outcome = "answered" if answer.status_code == 200 else "failed"
            return answer
        finally:
            self.active -= 1
            service._finished("video", lease, started, outcome)

    async def _until_client_leaves(
        self, request: Request, engine: RequestService, asked: VideoGeneration
    ) -> Response | None:
        outcome: list[Response] = []
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await _until_disconnect(request)
                nursery.cancel_scope.cancel()  # the chunk in flight is withdrawn

            async def generate() -> None:
                outcome.append(await self._generate(engine, asked))
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(generate)
        return outcome[0] if outcome else None

    async def _generate(self, engine: RequestService, asked: VideoGeneration) -> Response:
        """The MP4, or the refusal: the first chunk's full queue (429), a lost engine (503),
        a failed generation (500)."""
        service = self.service
        seed = asked.seed if asked.seed is not None else _new_seed()
        chunks = service._chunks(asked, seed)
        frames: list[np.ndarray] = []
        try:
            try:
                first = await engine.submit(chunks[0])
            except RequestsOverloaded as exc:
                message = f"Too many requests queued: {exc}"
                refused = Refusal(429, message, "rate_limited", retry_after_s=exc.retry_after_s)
                return refusal_response(refused)
            frames.extend(first.frames)
            for work in chunks[1:]:
                frames.extend((await service._submit_chunk(work)).frames)
        except EngineUnavailable as exc:
            log.warning("sync video failed", reason="engine_unavailable", error=str(exc))
            lost = Refusal(503, ENGINE_LOST, "engine_unavailable", retry_after_s=1)
            return refusal_response(lost)
        except RequestFailed as exc:
            log.error("sync video failed", exc_info=exc)
            return refusal_response(Refusal(500, "The generation failed.", "generation_failed"))
        encode = partial(encode_mp4, frames, width=asked.width, height=asked.height, fps=asked.fps)
        mp4 = await trio.to_thread.run_sync(encode)
        return Response(mp4, media_type="video/mp4", headers={"x-seed": str(seed)})


def sync_routes(media: MediaService | None) -> list[BaseRoute]:
    """``POST /v1/videos/sync``; with no service (``None``) it answers ``model_not_loaded``."""
    videos = SyncVideos(media or MediaService(None))

    async def sync(request: Request) -> Response:
        answer = await videos.generate(request)
        return answer if answer is not None else Response(status_code=499)

    return [Route("/v1/videos/sync", sync, methods=["POST"])]
