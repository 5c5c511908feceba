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
from duplex.services.media import MediaService

__all__ = ["open_media", "resolve_media"]


def resolve_media(config: Config) -> None:
    """Check ``--image-model`` / ``--video-model`` before serving (``tiny`` is built later).

    Raises:
        ConfigError: a named folder is no diffusers pipeline.
    """
    cache_dir = config.engine.model_cache_dir
    options = ModelOptions(cache_dir=Path(cache_dir).expanduser() if cache_dir else None)
    media = config.media
    named = (("image", media.image_model), ("video", media.video_model),
             ("audio", media.audio_model))  # fmt: skip
    for kind, name in named:
        if name and name != "tiny":
            resolve_diffusion(name, kind, options)  # type: ignore[arg-type]


def _machine_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def media_budget_bytes(config: Config) -> int:
    """``media.memory_budget_mb``, or a quarter of the machine's memory when it is 0."""
    budget_mb = config.media.memory_budget_mb
    return budget_mb * 2**20 if budget_mb else default_media_memory_bytes(_machine_memory_bytes())


@asynccontextmanager
async def open_media(
    config: Config, registry: MetricsRegistry, requests: RequestEngines
) -> AsyncIterator[MediaService | None]:
    """The generation routes' service with its jobs' nursery; ``None``: nothing served here."""
    media = config.media
    if not (media.image_model or media.video_model or media.audio_model):
        yield None
        return
    on_cpu = all(device == "cpu" for device in config.engine.devices)
    service = MediaService(
        requests,
        config=config.media,
        registry=registry,
        memory_budget_bytes=media_budget_bytes(config),
        # the prior is the tiny pipeline's on this project's CPU; a GPU's is learned from its
        # first request (none is refused for time before one has been measured)
        seconds_per_unit=DIFFUSION_SECONDS_PER_UNIT if on_cpu else 0.0,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield service
        nursery.cancel_scope.cancel()
