"""Live video chat: ``WS /v1/video/chat/stream``, camera frames and audio in, text (and
speech) out, on the agent's vision-language engine."""

from ._protocol import (
    DEFAULT_MAX_FRAMES,
    MAX_AUDIO_BYTES,
    MAX_EVENT_BYTES,
    MAX_FRAME_BYTES,
    MAX_FRAMES,
    Answer,
    AudioChunk,
    Frame,
    Prefill,
    Query,
    Send,
    State,
    VideoChat,
    VideoChatConfig,
    error,
    parse_event,
    similarity,
)
from ._serving import VIDEO_CHAT_PATH, VideoChatService, video_chat_routes

__all__ = [
    "DEFAULT_MAX_FRAMES",
    "MAX_AUDIO_BYTES",
    "MAX_EVENT_BYTES",
    "MAX_FRAMES",
    "MAX_FRAME_BYTES",
    "VIDEO_CHAT_PATH",
    "Answer",
    "AudioChunk",
    "Frame",
    "Prefill",
    "Query",
    "Send",
    "State",
    "VideoChat",
    "VideoChatConfig",
    "VideoChatService",
    "error",
    "parse_event",
    "similarity",
    "video_chat_routes",
]
