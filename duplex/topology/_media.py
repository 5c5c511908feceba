"""Image and video generation in the server process: the routes' service and its jobs.

The pipelines themselves are request engines named ``image`` and ``video``
(`runner_specs` in ``_requests.py``), built here or in the engine processes like
every request-batched model; the `MediaService` submits to them through the
process's `RequestEngines` and runs the video jobs' tasks. With connection workers
the routes run here too: the workers relay them whole (``_relay.py``), so one job
store serves every worker.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from duplex.config import Config
from duplex.metrics import MetricsRegistry
from duplex.models import ModelOptions
from duplex.models.diffusion import resolve_diffusion
from duplex.runtime import RequestEngines
from duplex.services import DIFFUSION_SECONDS_PER_UNIT, default_media_memory_bytes
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
    for kind, name in (("image", server.image_model), ("video", server.video_model)):
        if name and name != "tiny":
            resolve_diffusion(name, kind, options)  # type: ignore[arg-type]


def _machine_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def media_settings(config: Config) -> MediaSettings:
    server = config.server
    budget_mb = server.media_memory_budget_mb
    on_cpu = all(device == "cpu" for device in server.devices)
    return MediaSettings(
        memory_budget_bytes=(
            budget_mb * 2**20 if budget_mb else default_media_memory_bytes(_machine_memory_bytes())
        ),
        max_request_s=server.media_max_request_s,
        # the prior is the tiny pipeline's on this project's CPU; a GPU's is learned from its
        # first request (none is refused for time before one has been measured)
        seconds_per_unit=DIFFUSION_SECONDS_PER_UNIT if on_cpu else 0.0,
        chunk_frames=server.video_chunk_frames,
        max_jobs=server.video_max_jobs,
        max_active_jobs=server.video_max_active_jobs,
        job_retention_s=server.video_job_retention_s,
        start_timeout_s=server.video_start_timeout_s,
        stall_timeout_s=server.video_stall_timeout_s,
    )


@asynccontextmanager
async def open_media(
    config: Config, registry: MetricsRegistry, requests: RequestEngines
) -> AsyncIterator[MediaService | None]:
    """The generation routes' service with its jobs' nursery; ``None``: nothing served here."""
    server = config.server
    if not (server.image_model or server.video_model):
        yield None
        return
    service = MediaService(requests, settings=media_settings(config), registry=registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield service
        nursery.cancel_scope.cancel()
