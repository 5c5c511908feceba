"""The image and video generation requests: parsed and checked, sans-I/O.

``POST /v1/images/generations`` takes JSON, ``POST /v1/videos`` JSON or a form
(``multipart/form-data`` or urlencoded: every value a string), ``WS
/v1/realtime/video`` a ``session.start`` event. Each parser returns a frozen
request or raises a `ProtocolError` naming the field (``param``); the route answers
it as OpenAI's error envelope (``duplex.refusals.Refusal.of``, with the error's ``status_hint``).
Unknown fields are refused, never ignored: a misspelt ``num_inference_step`` would
otherwise run with the default.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, final

from duplex.exceptions import InvalidJson, ProtocolError, UnsupportedParameter
from duplex.refusals import echo

from .._models import IMAGES, VIDEOS, ModelFamily

__all__ = [
    "ImageGeneration",
    "MediaLimits",
    "RealtimeVideoStart",
    "VideoGeneration",
    "parse_image_request",
    "parse_realtime_video_start",
    "parse_video_request",
]


class InvalidValue(ProtocolError):
    code: ClassVar[str] = "invalid_value"


class InvalidType(ProtocolError):
    code: ClassVar[str] = "invalid_type"


class UnknownParameter(ProtocolError):
    code: ClassVar[str] = "unknown_parameter"


class MissingParameter(ProtocolError):
    code: ClassVar[str] = "missing_required_parameter"


class ModelNotLoaded(ProtocolError):
    """The endpoint's pipeline is not configured (``--image-model`` / ``--video-model``)."""

    code: ClassVar[str] = "model_not_loaded"
    status_hint: ClassVar[int] = 404


@final
@dataclass(frozen=True, slots=True)
class MediaLimits:
    """What one request may ask for (sizes in pixels, ``seed`` below ``2**63``)."""

    min_side: int = 8
    max_side: int = 2048
    side_multiple: int = 8
    max_images: int = 10
    max_steps: int = 500
    max_guidance: float = 100.0
    max_prompt_chars: int = 32_000
    max_seconds: float = 60.0
    max_fps: int = 60
    max_frames: int = 1024


MAX_SEED: Final = 2**63 - 1
_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


@final
@dataclass(frozen=True, slots=True)
class ImageGeneration:
    """A checked ``POST /v1/images/generations`` body; ``seed`` ``None``: the server draws one."""

    prompt: str
    n: int
    width: int
    height: int
    seed: int | None
    steps: int
    guidance_scale: float
    negative_prompt: str


@final
@dataclass(frozen=True, slots=True)
class VideoGeneration:
    """A checked ``POST /v1/videos`` request; ``seconds`` as the client wrote it."""

    prompt: str
    width: int
    height: int
    seconds: str
    fps: int
    frames: int
    seed: int | None
    steps: int
    guidance_scale: float
    negative_prompt: str


@final
@dataclass(frozen=True, slots=True)
class RealtimeVideoStart:
    """A checked ``session.start`` of ``WS /v1/realtime/video``."""

    prompt: str
    width: int
    height: int
    fps: int
    frames: int
    seed: int | None
    steps: int
    guidance_scale: float
    negative_prompt: str

    def config(self) -> dict[str, Any]:
        """The accepted config, echoed by ``video.start``."""
        return {
            "format": "m4s",
            "width": self.width,
            "height": self.height,
            "fps": self.fps,
            "num_frames": self.frames,
            "seed": self.seed,
            "num_inference_steps": self.steps,
            "guidance_scale": self.guidance_scale,
        }


class _Fields:
    """Reads one request's fields, each once; ``strings``: values came from a form."""

    def __init__(self, raw: Mapping[str, Any], allowed: frozenset[str], *, strings: bool) -> None:
        for name in raw:
            if name not in allowed:
                raise UnknownParameter(f"Unknown parameter: '{name}'.", param=name)
        self.raw = raw
        self.strings = strings

    def has(self, name: str) -> bool:
        return self.raw.get(name) is not None

    def text(self, name: str, *, limit: int, required: bool = False) -> str:
        value = self.raw.get(name)
        if value is None:
            if required:
                raise MissingParameter(f"Missing required parameter: '{name}'.", param=name)
            return ""
        if not isinstance(value, str):
            raise InvalidType(f"'{name}' must be a string.", param=name)
        if required and not value.strip():
            raise InvalidValue(f"'{name}' must not be empty.", param=name)
        if len(value) > limit:
            raise InvalidValue(f"'{name}' is longer than {limit} characters.", param=name)
        return value

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        value = self.raw.get(name)
        if value is None:
            return default
        if self.strings and isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidType(f"'{name}' must be an integer.", param=name)
        if not low <= value <= high:
            raise InvalidValue(f"'{name}' must be from {low} to {high}, got {value}.", param=name)
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self.raw.get(name)
        if value is None:
            return default
        if isinstance(value, str) and (self.strings or name == "seconds"):  # OpenAI: "4"
            try:
                value = float(value)
            except ValueError:
                raise InvalidType(f"'{name}' must be a number.", param=name) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidType(f"'{name}' must be a number.", param=name)
        # an int is compared exactly (math.isfinite overflows on one past a float's range)
        if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
            raise InvalidValue(f"'{name}' must be from {low:g} to {high:g}.", param=name)
        return float(value)

    def seed(self) -> int | None:
        if not self.has("seed"):
            return None
        return self.integer("seed", 0, 0, MAX_SEED)

    def choice(self, name: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.raw.get(name, default)
        if value is None:
            return default
        if value not in allowed:
            raise UnsupportedParameter(
                f"'{name}' {echo(value)} is not supported; supported: {', '.join(allowed)}.",
                param=name,
            )
        return str(value)

    def model(self, family: ModelFamily, served: str) -> None:
        """``model``: ``served``, or an alias of ``family`` (``duplex.services._models``)."""
        family.accepted(self.raw.get("model"), served)


def parse_size(text: Any, limits: MediaLimits, *, param: str = "size") -> tuple[int, int]:
    """``WIDTHxHEIGHT``, each side in range and a multiple of ``side_multiple``."""
    match = _SIZE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidValue(f"'{param}' must be WIDTHxHEIGHT, like 512x512.", param=param)
    width, height = int(match[1]), int(match[2])
    check_side(width, limits, param)
    check_side(height, limits, param)
    return width, height


def check_side(side: int, limits: MediaLimits, param: str) -> None:
    low, high, multiple = limits.min_side, limits.max_side, limits.side_multiple
    if not low <= side <= high or side % multiple:
        raise InvalidValue(
            f"'{param}': each side must be a multiple of {multiple} from {low} to {high}, "
            f"got {side}.",
            param=param,
        )


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidJson("The body is not valid JSON.") from None
    if not isinstance(parsed, dict):
        raise InvalidJson("The body must be a JSON object.")
    return parsed


_SAMPLING_FIELDS: Final = frozenset(
    {"prompt", "model", "seed", "num_inference_steps", "guidance_scale", "negative_prompt"}
)
"""The fields of every generation request (images, video jobs, streamed video)."""
_HTTP_FIELDS: Final = _SAMPLING_FIELDS | {"size", "user"}
"""... and of the HTTP ones."""
DEFAULT_STEPS: Final = 20
DEFAULT_GUIDANCE: Final = 7.5


def _opened(
    source: Mapping[str, Any], allowed: frozenset[str], family: ModelFamily, model: str,
    limits: MediaLimits, *, strings: bool = False,
) -> tuple[_Fields, str]:  # fmt: skip
    """A request's fields (unknown ones refused) and its prompt, its ``model`` checked (the
    served ``model``, or one of ``family``'s aliases)."""
    fields = _Fields(source, allowed, strings=strings)
    prompt = fields.text("prompt", limit=limits.max_prompt_chars, required=True)
    fields.model(family, model)
    return fields, prompt


def _sampling(fields: _Fields, limits: MediaLimits) -> dict[str, Any]:
    """The sampling fields every generation request shares, read last, in this order."""
    return {
        "seed": fields.seed(),
        "steps": fields.integer("num_inference_steps", DEFAULT_STEPS, 1, limits.max_steps),
        "guidance_scale": fields.number(
            "guidance_scale", DEFAULT_GUIDANCE, 0.0, limits.max_guidance
        ),
        "negative_prompt": fields.text("negative_prompt", limit=limits.max_prompt_chars),
    }


def _http_size(fields: _Fields, default: str, limits: MediaLimits) -> tuple[int, int]:
    """The HTTP requests' ``user`` (checked, unused) and ``size``."""
    fields.text("user", limit=256)
    return parse_size(fields.raw.get("size") or default, limits)


_IMAGE_FIELDS: Final = _HTTP_FIELDS | {"n", "response_format", "output_format"}
DEFAULT_IMAGE_SIZE: Final = "512x512"


def parse_image_request(body: bytes, model: str, limits: MediaLimits) -> ImageGeneration:
    """A ``POST /v1/images/generations`` JSON body for the served ``model`` (or an alias).

    Raises:
        ProtocolError: the first field refused (``param`` names it).
    """
    fields, prompt = _opened(_json_object(body), _IMAGE_FIELDS, IMAGES, model, limits)
    fields.choice("response_format", "b64_json", ("b64_json",))
    fields.choice("output_format", "png", ("png",))
    width, height = _http_size(fields, DEFAULT_IMAGE_SIZE, limits)
    return ImageGeneration(
        prompt=prompt,
        n=fields.integer("n", 1, 1, limits.max_images),
        width=width,
        height=height,
        **_sampling(fields, limits),
    )


_VIDEO_FIELDS: Final = _HTTP_FIELDS | {"seconds", "fps"}
DEFAULT_VIDEO_SIZE: Final = "512x512"
DEFAULT_SECONDS: Final = "4"
DEFAULT_FPS: Final = 8


def parse_video_request(
    raw: bytes | Mapping[str, str], model: str, limits: MediaLimits
) -> VideoGeneration:
    """A ``POST /v1/videos`` request: a JSON body, or a form's fields (all strings).

    Raises:
        ProtocolError: the first field refused (``param`` names it).
    """
    form = not isinstance(raw, bytes)
    source = raw if not isinstance(raw, bytes) else _json_object(raw)
    fields, prompt = _opened(source, _VIDEO_FIELDS, VIDEOS, model, limits, strings=form)
    width, height = _http_size(fields, DEFAULT_VIDEO_SIZE, limits)
    seconds_raw = fields.raw.get("seconds")
    seconds = fields.number("seconds", float(DEFAULT_SECONDS), 0.0, limits.max_seconds)
    fps = fields.integer("fps", DEFAULT_FPS, 1, limits.max_fps)
    frames = round(seconds * fps)
    if not 1 <= frames <= limits.max_frames:
        raise InvalidValue(
            f"'seconds' x 'fps' must make 1 to {limits.max_frames} frames, got {frames}.",
            param="seconds",
        )
    return VideoGeneration(
        prompt=prompt,
        width=width,
        height=height,
        seconds=DEFAULT_SECONDS if seconds_raw is None else f"{seconds:g}",
        fps=fps,
        frames=frames,
        **_sampling(fields, limits),
    )


_START_FIELDS: Final = _SAMPLING_FIELDS | {"type", "format", "width", "height", "fps", "num_frames"}
DEFAULT_STREAM_FRAMES: Final = 32


def parse_realtime_video_start(
    event: Mapping[str, Any], model: str, limits: MediaLimits
) -> RealtimeVideoStart:
    """A ``session.start`` event (already decoded from JSON).

    Raises:
        ProtocolError: the first field refused (``param`` names it).
    """
    fields, prompt = _opened(event, _START_FIELDS, VIDEOS, model, limits)
    fields.choice("format", "m4s", ("m4s",))
    width = fields.integer("width", 512, limits.min_side, limits.max_side)
    height = fields.integer("height", 512, limits.min_side, limits.max_side)
    check_side(width, limits, "width")
    check_side(height, limits, "height")
    return RealtimeVideoStart(
        prompt=prompt,
        width=width,
        height=height,
        fps=fields.integer("fps", DEFAULT_FPS, 1, limits.max_fps),
        frames=fields.integer("num_frames", DEFAULT_STREAM_FRAMES, 1, limits.max_frames),
        **_sampling(fields, limits),
    )
