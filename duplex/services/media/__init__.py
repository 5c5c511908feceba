"""Images and videos: ``/v1/images/generations``, ``/v1/videos``, ``WS /v1/realtime/video``."""

from ._protocol import MediaLimits
from ._serving import MediaService, media_routes

__all__ = ["MediaLimits", "MediaService", "media_routes"]
