"""``WS /v1/video/chat/stream``: the live video chat protocol, sans I/O.

A client streams camera frames (and microphone audio) and asks questions about what it
showed; the server answers with text deltas (and speech). `VideoChat` takes each client
frame, already parsed into an event, and returns what to do, in order:

- `Send`: a server event to send now (errors, warnings, ``session.updated``).
- `Prefill`: the frames buffered so far, to run through the model now (nothing is
  generated: the prompt's KV blocks stay in vllm's prefix cache), so that a query pays
  only for its own suffix. At most one is in flight; frames that come meanwhile wait for
  the next one (frames faster than the engine are coalesced, never queued without bound).
- `Answer`: a query to answer over the frames buffered now.

The route runs `Prefill` and `Answer` and tells the machine when each ends
(`prefill_done`, `answer_done`); this module never touches a socket, a clock or a model.

Bounds: ``max_frames`` frames (1-256): past it, the oldest half goes at once, with a
``warning``; one frame's image at most `MAX_FRAME_BYTES`; `MAX_AUDIO_BYTES` of audio
buffered (past it: an ``error`` and the buffer cleared); one query at a time.
Near-duplicate frames (`similarity` to the last kept frame at least
``frame_filter_threshold``) are skipped when ``enable_frame_filter`` is on: the route
decodes each frame to a small grey thumbnail (`Frame.thumbnail`, off the event loop).

States::

    AWAIT_CONFIG --session.config--> READY --video.query--> ANSWERING --answer_done--> READY
        video.frame / audio.chunk: READY or ANSWERING (frames kept for the next query)
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final, final

from duplex.refusals import echo

__all__ = [
    "DEFAULT_MAX_FRAMES",
    "MAX_AUDIO_BYTES",
    "MAX_EVENT_BYTES",
    "MAX_FRAMES",
    "MAX_FRAME_BYTES",
    "Answer",
    "AudioChunk",
    "Frame",
    "Prefill",
    "Query",
    "Send",
    "State",
    "VideoChat",
    "VideoChatConfig",
    "error",
    "parse_event",
    "similarity",
]

DEFAULT_MAX_FRAMES: Final = 50
MAX_FRAMES: Final = 256
MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
"""The largest image of one ``video.frame`` (JPEG or PNG), decoded from its base64."""
MAX_AUDIO_BYTES: Final = 16_000 * 2 * 30
"""Audio buffered between queries: 30 s of 16 kHz PCM16."""
MAX_QUERY_CHARS: Final = 4096
MAX_SYSTEM_PROMPT_CHARS: Final = 16_384
MAX_EVENT_BYTES: Final = MAX_FRAME_BYTES * 4 // 3 + 64 * 1024
"""The largest client message (a frame's base64 and its fields)."""
MODALITIES: Final = ("text", "audio")
IMAGE_MAGIC: Final = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}


class State(enum.Enum):
    AWAIT_CONFIG = "await_config"
    READY = "ready"
    ANSWERING = "answering"


@final
@dataclass(frozen=True, slots=True)
class VideoChatConfig:
    """``session.config``, checked."""

    model: str = ""
    modalities: tuple[str, ...] = MODALITIES
    max_frames: int = DEFAULT_MAX_FRAMES
    system_prompt: str = ""
    use_audio_in_video: bool = True
    enable_frame_filter: bool = True
    frame_filter_threshold: float = 0.95


@final
@dataclass(frozen=True, slots=True)
class Frame:
    """One ``video.frame``: its image bytes, id, timestamp (ms), and its grey thumbnail
    (set by the route once decoded: ``THUMBNAIL`` bytes, one per pixel)."""

    image: bytes
    frame_id: str
    pts_ms: float | None = None
    thumbnail: bytes = b""


def similarity(a: bytes, b: bytes) -> float:
    """How alike two grey thumbnails are: 1 minus their mean absolute difference (0-1);
    0 when either is missing or they differ in size."""
    if not a or len(a) != len(b):
        return 0.0
    return 1.0 - sum(abs(x - y) for x, y in zip(a, b, strict=True)) / (255.0 * len(a))


@final
@dataclass(frozen=True, slots=True)
class AudioChunk:
    """One ``audio.chunk``: 16 kHz PCM16 mono."""

    pcm: bytes


@final
@dataclass(frozen=True, slots=True)
class Query:
    """One ``video.query``: its question, and any audio sent with it."""

    text: str
    audio: bytes = b""


@final
@dataclass(frozen=True, slots=True)
class Send:
    """A server event to send now."""

    event: dict[str, Any]

    def text(self) -> str:
        return json.dumps(self.event, separators=(",", ":"), ensure_ascii=False)


@final
@dataclass(frozen=True, slots=True)
class Prefill:
    """Run these frames (every frame buffered, oldest first) through the model now."""

    frames: tuple[Frame, ...]
    config: VideoChatConfig


@final
@dataclass(frozen=True, slots=True)
class Answer:
    """Answer ``query`` over ``frames`` (the audio buffered since the last query in
    ``audio``, when ``use_audio_in_video``)."""

    query: Query
    frames: tuple[Frame, ...]
    audio: bytes
    config: VideoChatConfig


Action = Send | Prefill | Answer


def error(code: str, message: str, param: str | None = None) -> Send:
    return Send({"type": "error", "error": {"code": code, "message": message, "param": param}})


def parse_event(frame: str | bytes) -> Config | Frame | AudioChunk | Query | Send:
    """One client message as its event, or the ``error`` that refuses it."""
    if len(frame) > MAX_EVENT_BYTES:
        return error("event_too_large", f"a message is at most {MAX_EVENT_BYTES} bytes")
    try:
        event = json.loads(frame)
    except (ValueError, RecursionError):
        return error("invalid_json", "each message must be one JSON object")
    if not isinstance(event, dict):
        return error("invalid_json", "each message must be one JSON object")
    kind = event.get("type")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        return error("unknown_event", f"unknown event type {echo(kind)}", "type")
    try:
        return parser(event)
    except _Bad as bad:
        return error(bad.code, bad.message, bad.param)


@final
@dataclass(frozen=True, slots=True)
class Config:
    """A parsed ``session.config`` (wrapping the config it sets)."""

    config: VideoChatConfig


class _Bad(Exception):
    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _only(event: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in event:
        if key not in keys:
            raise _Bad(f"unknown field {echo(key)}", key, "unknown_parameter")


def _config(event: dict[str, Any]) -> Config:
    _only(
        event,
        (
            "type",
            "model",
            "modalities",
            "max_frames",
            "system_prompt",
            "use_audio_in_video",
            "enable_frame_filter",
            "frame_filter_threshold",
        ),
    )
    model = event.get("model", "")
    if not isinstance(model, str):
        raise _Bad("model must be a string", "model", "invalid_type")
    modalities = event.get("modalities", list(MODALITIES))
    if (
        not isinstance(modalities, list)
        or not modalities
        or "text" not in modalities
        or any(m not in MODALITIES for m in modalities)
        or len(set(modalities)) != len(modalities)
    ):
        raise _Bad('modalities must be ["text"] or ["text", "audio"]', "modalities")
    max_frames = event.get("max_frames", DEFAULT_MAX_FRAMES)
    if isinstance(max_frames, bool) or not isinstance(max_frames, int):
        raise _Bad("max_frames must be an integer", "max_frames", "invalid_type")
    if not 1 <= max_frames <= MAX_FRAMES:
        raise _Bad(f"max_frames must be 1-{MAX_FRAMES}, not {max_frames}", "max_frames")
    prompt = event.get("system_prompt", "")
    if not isinstance(prompt, str) or len(prompt) > MAX_SYSTEM_PROMPT_CHARS:
        raise _Bad(f"system_prompt must be a string of at most {MAX_SYSTEM_PROMPT_CHARS} "
                   "characters", "system_prompt")  # fmt: skip
    flags = {}
    for name in ("use_audio_in_video", "enable_frame_filter"):
        value = event.get(name, True)
        if not isinstance(value, bool):
            raise _Bad(f"{name} must be a boolean", name, "invalid_type")
        flags[name] = value
    threshold = event.get("frame_filter_threshold", 0.95)
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not math.isfinite(threshold)
        or not 0.0 <= threshold <= 1.0
    ):
        raise _Bad("frame_filter_threshold must be a number from 0 to 1", "frame_filter_threshold")
    return Config(
        VideoChatConfig(
            model, tuple(modalities), max_frames, prompt, flags["use_audio_in_video"],
            flags["enable_frame_filter"], float(threshold),
        )
    )  # fmt: skip


def _b64(value: object, param: str, limit: int) -> bytes:
    if not isinstance(value, str) or not value:
        raise _Bad(f"{param} must be a non-empty base64 string", param, "invalid_type")
    if len(value) > (limit + 2) // 3 * 4:
        raise _Bad(f"{param} is over {limit} bytes", param, "too_large")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Bad(f"{param} is not valid base64", param, "invalid_base64") from None


def _frame(event: dict[str, Any]) -> Frame:
    _only(event, ("type", "image", "frame_id", "pts_ms", "timestamp_ms"))
    image = _b64(event.get("image"), "image", MAX_FRAME_BYTES)
    if not any(image.startswith(magic) for magic in IMAGE_MAGIC.values()):
        raise _Bad("image must be a JPEG or PNG", "image", "invalid_image")
    frame_id = event.get("frame_id", "")
    if (
        not isinstance(frame_id, (str, int))
        or isinstance(frame_id, bool)
        or len(str(frame_id)) > 128
    ):
        raise _Bad("frame_id must be a string or integer (at most 128 characters)", "frame_id")
    pts = event.get("pts_ms", event.get("timestamp_ms"))
    if pts is not None and (
        isinstance(pts, bool) or not isinstance(pts, (int, float)) or not math.isfinite(pts)
    ):
        raise _Bad("pts_ms must be a number", "pts_ms", "invalid_type")
    return Frame(image, str(frame_id), None if pts is None else float(pts))


def _audio(event: dict[str, Any]) -> AudioChunk:
    _only(event, ("type", "audio"))
    pcm = _b64(event.get("audio"), "audio", MAX_AUDIO_BYTES)
    if len(pcm) % 2:
        raise _Bad("audio must be PCM16 (an even number of bytes)", "audio")
    return AudioChunk(pcm)


def _query(event: dict[str, Any]) -> Query:
    _only(event, ("type", "text", "audio"))
    text = event.get("text", "")
    if not isinstance(text, str) or len(text) > MAX_QUERY_CHARS:
        raise _Bad(f"text must be a string of at most {MAX_QUERY_CHARS} characters", "text")
    audio = b""
    if event.get("audio") is not None:
        audio = _b64(event.get("audio"), "audio", MAX_AUDIO_BYTES)
    if not text and not audio:
        raise _Bad("a query needs text or audio", "text", "missing_required_parameter")
    return Query(text, audio)


_PARSERS: Final = {
    "session.config": _config,
    "video.frame": _frame,
    "audio.chunk": _audio,
    "video.query": _query,
}


@dataclass(slots=True)
class VideoChat:
    """One connection's state: its config, frames, audio and the query in flight."""

    state: State = State.AWAIT_CONFIG
    config: VideoChatConfig = VideoChatConfig()
    frames: deque[Frame] = field(default_factory=deque)
    audio: bytearray = field(default_factory=bytearray)
    prefilling: bool = False
    unprefilled: int = 0
    """Frames kept since the last prefill began."""
    skipped: int = 0
    """Frames the filter dropped as near-duplicates."""
    evicted: int = 0
    """Frames dropped past ``max_frames``."""
    _numbered: int = 0

    def receive(self, event: Config | Frame | AudioChunk | Query | Send) -> list[Action]:
        """What to do about one parsed client event."""
        if isinstance(event, Send):
            return [event]
        if isinstance(event, Config):
            if self.state is not State.AWAIT_CONFIG:
                return [error("already_configured", "session.config comes once, first")]
            self.config = event.config
            self.state = State.READY
            return [Send({"type": "session.updated", "session": _config_body(self.config)})]
        if self.state is State.AWAIT_CONFIG:
            return [error("not_configured", "send session.config first")]
        if isinstance(event, Frame):
            return self._frame(event)
        if isinstance(event, AudioChunk):
            if len(self.audio) + len(event.pcm) > MAX_AUDIO_BYTES:
                self.audio.clear()
                return [
                    error(
                        "audio_buffer_overflow",
                        f"over {MAX_AUDIO_BYTES} bytes of audio buffered: cleared",
                    )
                ]
            self.audio += event.pcm
            return []
        if self.state is State.ANSWERING:
            return [error("query_in_progress", "one query at a time: wait for response.done")]
        if not self.frames:
            return [error("no_frames", "send a video.frame before a query")]
        self.state = State.ANSWERING
        audio = bytes(self.audio) if self.config.use_audio_in_video else b""
        self.audio.clear()
        return [Answer(event, tuple(self.frames), audio, self.config)]

    def _frame(self, frame: Frame) -> list[Action]:
        config = self.config
        if not frame.frame_id:
            frame = Frame(frame.image, str(self._numbered), frame.pts_ms, frame.thumbnail)
        self._numbered += 1
        if (
            config.enable_frame_filter
            and self.frames
            and similarity(frame.thumbnail, self.frames[-1].thumbnail)
            >= config.frame_filter_threshold
        ):
            self.skipped += 1
            return []
        out: list[Action] = []
        self.frames.append(frame)
        self.unprefilled += 1
        if len(self.frames) > config.max_frames:
            gone = len(self.frames) // 2
            for _ in range(gone):
                self.frames.popleft()
            self.evicted += gone
            out.append(
                Send({"type": "warning", "warning": {
                    "code": "frames_evicted",
                    "message": f"over max_frames ({config.max_frames}): the oldest {gone} "
                               "frames were dropped",
                    "frames": gone,
                }})
            )  # fmt: skip
        out.extend(self._maybe_prefill())
        return out

    def _maybe_prefill(self) -> list[Action]:
        if self.prefilling or not self.unprefilled or self.state is State.ANSWERING:
            return []
        self.prefilling = True
        self.unprefilled = 0
        return [Prefill(tuple(self.frames), self.config)]

    def prefill_done(self) -> list[Action]:
        """The prefill in flight ended; another begins if frames came meanwhile."""
        self.prefilling = False
        return self._maybe_prefill()

    def answer_done(self, answer: Answer) -> list[Action]:
        """The query's answer ended (``response.done`` sent); frames that came meanwhile
        are prefilled."""
        self.state = State.READY
        return self._maybe_prefill()

    def consumed(self, answer: Answer) -> Send:
        """``video.frames.consumed``: which frames the answer was made over (sent after
        its first output)."""
        times = [f.pts_ms for f in answer.frames if f.pts_ms is not None]
        return Send({
            "type": "video.frames.consumed",
            "frame_ids": [f.frame_id for f in answer.frames],
            "frames": len(answer.frames),
            "latest_pts_ms": max(times) if times else None,
        })  # fmt: skip


def _config_body(config: VideoChatConfig) -> dict[str, Any]:
    return {
        "model": config.model,
        "modalities": list(config.modalities),
        "max_frames": config.max_frames,
        "system_prompt": config.system_prompt,
        "use_audio_in_video": config.use_audio_in_video,
        "enable_frame_filter": config.enable_frame_filter,
        "frame_filter_threshold": config.frame_filter_threshold,
    }
