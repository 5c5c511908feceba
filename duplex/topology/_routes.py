"""The service routes a server serves, as the topology hands them to the app.

The app (``duplex.transport``) imports no service: the process that runs the
engines builds the services and passes their routes; a connection worker
passes the same routes' shapes, relayed whole to that process. Every family is
always routed: a service that is not loaded answers its own ``*_not_loaded``.
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from duplex.metrics import MetricsRegistry
from duplex.services.chat import ChatService, chat_routes
from duplex.services.media import (
    MediaService,
    audio_routes,
    edit_routes,
    media_routes,
    sync_routes,
)
from duplex.services.omni import OmniService, gated_while_asleep, omni_routes
from duplex.services.robots import ROBOT_PATH, ROOT_PATH, RobotService, robot_routes
from duplex.services.speech import SpeechService, speech_routes
from duplex.services.videochat import VideoChatService, video_chat_routes
from duplex.services.voices import VoiceService, voice_routes

__all__ = ["robot_limits", "service_routes"]


def service_routes(
    media: MediaService | None,
    speech: SpeechService | None,
    robots: RobotService | None,
    *,
    registry: MetricsRegistry | None = None,
    chat: ChatService | None = None,
    video_chat: VideoChatService | None = None,
    voices: VoiceService | None = None,
    omni: OmniService | None = None,
) -> list[BaseRoute]:
    """Every service family's routes, over the services this process runs (``None``: not
    loaded here, or only the shapes, for a worker that relays them); ``registry``: where
    a refusal of a service that is not loaded is counted. With ``omni`` the operator routes
    can put the engine to sleep, and every other route then answers ``engine_sleeping``."""
    families = [
        *robot_routes(robots, registry),
        *media_routes(media),
        *edit_routes(media),
        *sync_routes(media),
        *audio_routes(media),
        *speech_routes(speech),
        *voice_routes(voices),
        *chat_routes(chat),
        *video_chat_routes(video_chat),
    ]
    return [*omni_routes(omni), *gated_while_asleep(families, omni and omni.sleep)]


def robot_limits(robot_payload_bytes: int) -> dict[str, int]:
    """The robot endpoint's own frame limit, by path (both of its paths), when a policy is
    served (0: none)."""
    if not robot_payload_bytes:
        return {}
    return {ROBOT_PATH: robot_payload_bytes, ROOT_PATH: robot_payload_bytes}
