"""Text to audio as a request-batched runner over a diffusers audio pipeline (Stable Audio).

A request asks for ``seconds`` of audio of one prompt from one seed; the runner takes
one request a call (``max_batch`` 1: Stable Audio pads every request to its pipeline's
full latent length, so requests gain little from sharing a call). As for images, one
diffusion step is one unit of preemption, through the pipeline's per-step ``callback``,
and the VAE decode the last unit; the noise is drawn on the CPU from the seed, so one
seed gives the same audio on every device. The pipeline's stereo output is mixed to
mono 16-bit PCM at its VAE's rate (the codecs encode mono).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

import numpy as np

from duplex.pcm import float_to_pcm16

from .._requests import UnitGate
from ._runners import DiffusionModel, _generator, _load, _on, _stream, _wait_for_device

__all__ = ["AudioRequest", "AudioResult", "AudioRunner", "load_audio_runner"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AudioRequest:
    """``seconds`` of audio of one prompt, noise from ``seed``."""

    prompt: str
    seconds: float
    seed: int = 0
    steps: int = 20
    guidance_scale: float = 7.0
    negative_prompt: str = ""


@final
@dataclass(frozen=True, slots=True)
class AudioResult:
    """Mono int16 samples at ``sample_rate``."""

    pcm: np.ndarray
    sample_rate: int


def _step_units(gate: UnitGate, steps: int, device: Any) -> Any:
    """Stable Audio's ``callback(step, timestep, latents)``: the step's unit ends when its
    kernels have run (as `_step_callback` for images); after the last comes the decode."""

    def on_step(step: int, timestep: Any, latents: Any) -> None:
        _wait_for_device(device)
        gate.next_unit("decode" if step + 1 >= steps else "step")

    return on_step


def _mono_pcm16(audio: Any, samples: int) -> np.ndarray:
    """One waveform ``channels x samples`` (floats in [-1, 1], any device) as mono int16."""
    mono = audio.float().mean(dim=0)[:samples].clamp(-1.0, 1.0)
    return float_to_pcm16(mono.cpu().numpy())


@final
class AudioRunner:
    """Text to audio over a Stable Audio pipeline (``audio_end_in_s``, ``.audios`` output).

    Args:
        stream: the CUDA stream its device work runs on (``None``: the current one), as
            `ImageRunner`'s.
    """

    name = "audio"
    max_batch = 1

    def __init__(self, pipeline: Any, model: DiffusionModel, stream: Any = None) -> None:
        self.pipeline = pipeline
        self.model = model
        vae = pipeline.vae
        self.sample_rate = int(vae.sampling_rate)
        max_seconds = pipeline.transformer.config.sample_size * vae.hop_length / self.sample_rate
        self.max_seconds = float(max_seconds)
        self.metadata = {
            "model": model.id,
            "sample_rate": self.sample_rate,
            "max_audio_length_s": self.max_seconds,
        }
        """What clients are told: the model id, its rate and the longest audio it makes."""
        self._stream = stream
        self.beside_realtime = stream is not None

    def run_batch(self, requests: Sequence[AudioRequest], gate: UnitGate) -> list[AudioResult]:
        with _on(self._stream):
            return [self._run(request, gate) for request in requests]

    def _run(self, request: AudioRequest, gate: UnitGate) -> AudioResult:
        output = self.pipeline(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt or None,
            audio_end_in_s=request.seconds,
            num_inference_steps=request.steps,
            guidance_scale=request.guidance_scale,
            generator=_generator(request.seed),
            output_type="pt",
            callback=_step_units(gate, request.steps, self.pipeline.device),
            callback_steps=1,
        )
        samples = round(request.seconds * self.sample_rate)
        return AudioResult(_mono_pcm16(output.audios[0], samples), self.sample_rate)


def load_audio_runner(
    model: DiffusionModel, device: str, *, beside_realtime: bool = False
) -> AudioRunner:
    """As `load_image_runner`."""
    pipeline = _load(model, device)
    return AudioRunner(pipeline, model, _stream(device, beside_realtime))
