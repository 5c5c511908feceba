"""duplex.models.diffusion: image and video generation runners over diffusers pipelines.

`ImageRunner` and `VideoRunner` are `BatchRunner`s for a `RequestEngine` (one
diffusion step is one unit of preemption); `resolve_diffusion` maps ``--image-model`` /
``--video-model`` (``tiny`` or a local folder) to a `DiffusionModel`, and
`load_image_runner` / `load_video_runner` load it; `AudioRunner` (``--audio-model``,
text to audio on Stable Audio) is the same over an audio pipeline. `tiny_pipeline` builds and caches
the seeded random-weight pipelines tests and demos serve.
"""

from ._audio import AudioRequest, AudioResult, AudioRunner, load_audio_runner
from ._runners import (
    DiffusionModel,
    ImageEditRequest,
    ImageRequest,
    ImageResult,
    ImageRunner,
    VideoRequest,
    VideoResult,
    VideoRunner,
    image_calls,
    load_image_runner,
    load_video_runner,
    resolve_diffusion,
)
from ._tiny import TINY_KINDS, build_tiny_pipeline, tiny_pipeline

__all__ = [
    "TINY_KINDS",
    "AudioRequest",
    "AudioResult",
    "AudioRunner",
    "DiffusionModel",
    "ImageEditRequest",
    "ImageRequest",
    "ImageResult",
    "ImageRunner",
    "VideoRequest",
    "VideoResult",
    "VideoRunner",
    "build_tiny_pipeline",
    "image_calls",
    "load_audio_runner",
    "load_image_runner",
    "load_video_runner",
    "resolve_diffusion",
    "tiny_pipeline",
]
