"""Images, videos and generated audio: ``/v1/images/generations``, ``/v1/images/edits``,
``/v1/videos``, ``/v1/videos/sync``, ``WS /v1/realtime/video``, ``/v1/audio/generate``."""

from ._audio import audio_routes
from ._edits import edit_routes
from ._protocol import MediaLimits
from ._serving import MediaService, media_routes
from ._video_sync import sync_routes

__all__ = [
    "MediaLimits",
    "MediaService",
    "audio_routes",
    "edit_routes",
    "media_routes",
    "sync_routes",
]
