"""Image and video generation in the server process: the routes' service and its jobs.

The pipelines themselves are request engines named ``image`` and ``video``
(`runner_specs` in ``_requests.py``), built here or in the engine processes like
every request-batched model; the `MediaService` submits to them through the
process's `RequestEngines` and runs the video jobs' tasks. With connection workers
the routes run here too: the workers relay them whole (``_relay.py``), so one job
store serves every worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from duplex.config import Config
from duplex.metrics import MetricsRegistry
from duplex.models import ModelOptions
from duplex.models.diffusion import resolve_diffusion
from duplex.runtime import RequestEngines
from duplex.services.media import MediaService, MediaSettings

__all__ = ["media_settings", "open_media", "resolve_media"]


def resolve_media(config: Config) -> None:
    """Check ``--image-model`` / ``--video-model`` before serving (``tiny`` is built later).

    Raises:
        ConfigError: a named folder is no diffusers pipeline.
    """
    server = config.server
    options = ModelOptions(
        cache_dir=Path(server.model_cache_dir).expanduser() if server.model_cache_dir else None
    )
    named = (("image", server.image_model), ("video", server.video_model),
             ("audio", server.audio_model))  # fmt: skip
    for kind, name in named:
        if name and name != "tiny":
            resolve_diffusion(name, kind, options)  # type: ignore[arg-type]


def media_settings(config: Config) -> MediaSettings:
    server = config.server
    return MediaSettings(
        chunk_frames=server.video_chunk_frames,
        max_jobs=server.video_max_jobs,
        max_active_jobs=server.video_max_active_jobs,
        job_retention_s=server.video_job_retention_s,
        start_timeout_s=server.video_start_timeout_s,
        stall_timeout_s=server.video_stall_timeout_s,
        audio_max_length_s=server.audio_max_length_s,
    )


@asynccontextmanager
async def open_media(
    config: Config, registry: MetricsRegistry, requests: RequestEngines
) -> AsyncIterator[MediaService | None]:
    """The generation routes' service with its jobs' nursery; ``None``: nothing served here."""
    server = config.server
    if not (server.image_model or server.video_model or server.audio_model):
        yield None
        return
    service = MediaService(requests, settings=media_settings(config), registry=registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield service
        nursery.cancel_scope.cancel()
