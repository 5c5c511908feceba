"""``POST /v1/audio/generate``: text to audio (sound, music) on the ``audio`` request engine.

The body is JSON: ``input`` (the prompt), ``audio_length`` (seconds), ``seed``,
``response_format`` (the speech formats: wav, pcm, flac, mp3, aac, opus),
``num_inference_steps``, ``guidance_scale``, ``negative_prompt``, ``model``. The
request runs in the realtime slack like an image (one diffusion step a unit), and the
answer is the audio file itself, with the seed it used in ``X-Seed``: the same seed and
fields give the same bytes. A client that leaves withdraws its request.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, final

import numpy as np
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from duplex.codecs import AUDIO_FORMATS, MEDIA_TYPES, OPUS_RATE, encode_audio, resample_pcm16
from duplex.exceptions import EngineUnavailable, ProtocolError, RequestFailed, RequestsOverloaded
from duplex.logs import get_logger
from duplex.models.diffusion import AudioRequest, AudioResult
from duplex.refusals import Refusal
from duplex.runtime import RequestService
from duplex.transport import refusal_response

from .._models import AUDIO
from ._protocol import MAX_SEED, MediaLimits, _Fields, _json_object
from ._serving import (
    MediaService,
    _BodyTooLarge,
    _read_body,
    _starting,
    _too_large,
    _until_disconnect,
)

__all__ = ["AudioGeneration", "audio_routes", "parse_audio_request"]

_AUDIO_FIELDS: Final = frozenset(
    {
        "input", "model", "audio_length", "seed", "response_format", "num_inference_steps",
        "guidance_scale", "negative_prompt", "user",
    }
)  # fmt: skip
DEFAULT_AUDIO_LENGTH_S: Final = 5.0
DEFAULT_AUDIO_STEPS: Final = 50
DEFAULT_AUDIO_GUIDANCE: Final = 7.0
MIN_AUDIO_LENGTH_S: Final = 0.1
log = get_logger(component="media")


@final
@dataclass(frozen=True, slots=True)
class AudioGeneration:
    """A checked ``POST /v1/audio/generate`` body; ``seed`` ``None``: the server draws one."""

    prompt: str
    seconds: float
    seed: int | None
    steps: int
    guidance_scale: float
    negative_prompt: str
    response_format: str


def parse_audio_request(
    body: bytes, model: str, max_seconds: float, limits: MediaLimits
) -> AudioGeneration:
    """A ``POST /v1/audio/generate`` JSON body for the served ``model``; ``max_seconds``: the
    longest audio served (the config's cap and the pipeline's own, the smaller).

    Raises:
        ProtocolError: the first field refused (``param`` names it).
    """
    fields = _Fields(_json_object(body), _AUDIO_FIELDS, strings=False)
    prompt = fields.text("input", limit=limits.max_prompt_chars, required=True)
    fields.model(AUDIO, model)
    fields.text("user", limit=256)
    seconds = fields.number("audio_length", DEFAULT_AUDIO_LENGTH_S, MIN_AUDIO_LENGTH_S,
                            max_seconds)  # fmt: skip
    response_format = fields.choice("response_format", "wav", AUDIO_FORMATS)
    return AudioGeneration(
        prompt=prompt,
        seconds=seconds,
        seed=fields.integer("seed", 0, 0, MAX_SEED) if fields.has("seed") else None,
        steps=fields.integer("num_inference_steps", DEFAULT_AUDIO_STEPS, 1, limits.max_steps),
        guidance_scale=fields.number(
            "guidance_scale", DEFAULT_AUDIO_GUIDANCE, 0.0, limits.max_guidance
        ),
        negative_prompt=fields.text("negative_prompt", limit=limits.max_prompt_chars),
        response_format=response_format,
    )


def _encoded(pcm: np.ndarray, rate: int, fmt: str) -> bytes:
    """The audio as ``fmt`` (Opus at its 24 kHz), made in a worker thread."""
    if fmt == "opus" and rate != OPUS_RATE:
        pcm, rate = resample_pcm16(pcm, rate, OPUS_RATE), OPUS_RATE
    return encode_audio(pcm, rate, fmt)


async def _submit_until_gone(
    request: Request, engine: RequestService, work: AudioRequest
) -> AudioResult | Response | None:
    """``engine.submit(work)``, withdrawn if the client disconnects first (``None``)."""
    outcome: list[AudioResult | Response] = []
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await _until_disconnect(request)
            nursery.cancel_scope.cancel()

        async def generate() -> None:
            try:
                outcome.append(await engine.submit(work))
            except RequestsOverloaded as exc:
                message = f"Too many requests queued: {exc}"
                refused = Refusal(429, message, "rate_limited", retry_after_s=exc.retry_after_s)
                outcome.append(refusal_response(refused))
            except EngineUnavailable as exc:  # its engine process is being restarted
                log.warning("audio generation failed", error=str(exc))
                outcome.append(refusal_response(_starting("audio")))
            except RequestFailed as exc:
                log.error("audio generation failed", exc_info=exc)
                failed = Refusal(500, "The generation failed.", "generation_failed")
                outcome.append(refusal_response(failed))
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        nursery.start_soon(generate)
    return outcome[0] if outcome else None


async def generate_audio(service: MediaService, request: Request) -> Response | None:
    """``POST /v1/audio/generate``; ``None``: the client left before the answer."""
    engine = service._engine("audio")
    if isinstance(engine, Refusal):
        return refusal_response(engine)
    metadata: dict[str, Any] = dict(engine.metadata)
    max_seconds = min(
        service.config.audio_max_length_s, float(metadata.get("max_audio_length_s", 0.0))
    )
    try:
        body = await _read_body(request)
        asked = parse_audio_request(
            body, service._model(engine, "audio"), max_seconds, service.limits
        )
    except _BodyTooLarge:
        return _too_large()
    except ProtocolError as exc:
        return refusal_response(Refusal.of(exc))
    seed = asked.seed if asked.seed is not None else secrets.randbelow(2**31)
    work = AudioRequest(
        prompt=asked.prompt,
        seconds=asked.seconds,
        seed=seed,
        steps=asked.steps,
        guidance_scale=asked.guidance_scale,
        negative_prompt=asked.negative_prompt,
    )
    result = await _submit_until_gone(request, engine, work)
    if not isinstance(result, AudioResult):
        return result
    fmt = asked.response_format
    data = await trio.to_thread.run_sync(partial(_encoded, result.pcm, result.sample_rate, fmt))
    return Response(data, media_type=MEDIA_TYPES[fmt], headers={"x-seed": str(seed)})


def audio_routes(media: MediaService | None) -> list[BaseRoute]:
    """``POST /v1/audio/generate``; with no service (``None``) it answers ``model_not_loaded``."""
    service = media or MediaService(None)

    async def generate(request: Request) -> Response:
        answer = await generate_audio(service, request)
        return answer if answer is not None else Response(status_code=499)

    return [Route("/v1/audio/generate", generate, methods=["POST"])]
