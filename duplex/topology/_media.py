"""Image and video generation in the server process: pipelines, their engines, the service.

``--image-model`` and ``--video-model`` each load a diffusers pipeline (off the event
loop) behind its own request engine; the `MediaService` answers the routes. With
connection workers the routes are not relayed yet: they answer ``model_not_loaded``
(a warning says so at startup).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from duplex.config import Config
from duplex.logs import get_logger
from duplex.metrics import MetricsRegistry
from duplex.models import ModelOptions
from duplex.models.diffusion import (
    RequestEngine,
    load_image_runner,
    load_video_runner,
    resolve_diffusion,
)
from duplex.progress import Startup
from duplex.transport import MediaService, MediaSettings, Pipeline

__all__ = ["media_options", "open_media", "resolve_media"]


def media_options(config: Config) -> ModelOptions:
    server = config.server
    return ModelOptions(
        device=server.devices[0],
        seed=server.model_seed,
        cache_dir=Path(server.model_cache_dir).expanduser() if server.model_cache_dir else None,
    )


def resolve_media(config: Config) -> None:
    """Check ``--image-model`` / ``--video-model`` before serving (``tiny`` is built later).

    Raises:
        ConfigError: a named folder is no diffusers pipeline.
    """
    server = config.server
    for kind, name in (("image", server.image_model), ("video", server.video_model)):
        if name and name != "tiny":
            resolve_diffusion(name, kind, media_options(config))  # type: ignore[arg-type]


def media_settings(config: Config) -> MediaSettings:
    server = config.server
    return MediaSettings(
        chunk_frames=server.video_chunk_frames,
        max_jobs=server.video_max_jobs,
        max_active_jobs=server.video_max_active_jobs,
        job_retention_s=server.video_job_retention_s,
        start_timeout_s=server.video_start_timeout_s,
        stall_timeout_s=server.video_stall_timeout_s,
    )


@asynccontextmanager
async def open_media(
    config: Config, registry: MetricsRegistry, startup: Startup | None = None
) -> AsyncIterator[MediaService | None]:
    """The generation service, its pipelines loaded; ``None`` when none is configured here."""
    server = config.server
    if not (server.image_model or server.video_model):
        yield None
        return
    if server.connection_workers:
        get_logger(component="server").warning(
            "image and video routes not served: they need connection_workers = 0"
        )
        yield None
        return
    options = media_options(config)
    startup = startup or Startup()
    async with trio.open_nursery() as nursery:
        image = video = None
        if server.image_model:
            with startup.step("image", f"loading image pipeline {server.image_model}"):
                model = await trio.to_thread.run_sync(
                    resolve_diffusion, server.image_model, "image", options
                )
                runner = await trio.to_thread.run_sync(load_image_runner, model, options.device)
            engine = RequestEngine(runner, max_queue=server.media_max_queue)
            await nursery.start(engine.run)
            image = Pipeline(model.id, engine)
        if server.video_model:
            with startup.step("video", f"loading video pipeline {server.video_model}"):
                model = await trio.to_thread.run_sync(
                    resolve_diffusion, server.video_model, "video", options
                )
                video_runner = await trio.to_thread.run_sync(
                    load_video_runner, model, options.device
                )
            video_engine = RequestEngine(video_runner, max_queue=server.media_max_queue)
            await nursery.start(video_engine.run)
            video = Pipeline(model.id, video_engine)
        service = MediaService(
            image=image, video=video, settings=media_settings(config), registry=registry
        )
        await nursery.start(service.run)
        get_logger(component="server").info(
            "media pipelines loaded",
            image=image.model if image else None,
            video=video.model if video else None,
        )
        yield service
        nursery.cancel_scope.cancel()
