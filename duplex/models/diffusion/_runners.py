"""Image and video generation as request-batched runners over diffusers pipelines.

A pipeline is loaded from a local folder with ``DiffusionPipeline.from_pretrained``
(a real checkpoint, or a tiny one built by ``_tiny.py``: same path). A runner is a
`BatchRunner` for a `RequestEngine`: it takes a batch of requests and answers each
in order. The engine acquires the first unit before the call; after each diffusion
step the runner calls the gate's ``next_unit`` (from the pipeline's
``callback_on_step_end``), so one step is the unit of preemption: a realtime engine
sharing the device ticks in between, and a batch whose clients all left stops at its
next step (the gate raises ``RequestCancelled``). The VAE decode is the last unit.
Inside a large unit on the CPU every torch op asks ``gate.check()`` first and attention
runs in query slices (`_checked_inside`), so a withdrawn batch or a stopping engine ends
within about a second, not at the step's end.

torch and diffusers are imported when a pipeline is loaded, not with this module:
the request and result classes cross into the transport without them.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, final

import numpy as np

from duplex.exceptions import ConfigError
from duplex.progress import note

from .._batcher import Priority
from .._options import ModelOptions
from .._requests import UnitGate
from .._streams import priority_stream
from ._graphs import graph_pipeline
from ._tiny import tiny_pipeline

__all__ = [
    "DiffusionModel",
    "ImageEditRequest",
    "ImageRequest",
    "ImageResult",
    "ImageRunner",
    "VideoRequest",
    "VideoResult",
    "VideoRunner",
    "image_calls",
    "load_image_runner",
    "load_video_runner",
    "resolve_diffusion",
]

PipelineKind = Literal["image", "video", "audio"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ImageRequest:
    """``n`` images of one prompt; image ``i`` draws its noise from ``seed + i``."""

    prompt: str
    width: int
    height: int
    n: int = 1
    seed: int = 0
    steps: int = 20
    guidance_scale: float = 7.5
    negative_prompt: str = ""

    @property
    def batch_key(self) -> tuple[int, int, int, float]:
        """Requests that may share one pipeline call have equal keys."""
        return (self.width, self.height, self.steps, self.guidance_scale)


@final
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ImageEditRequest:
    """``n`` edits of one image: image-to-image, or inpainting where ``mask`` is set;
    edit ``i`` draws its noise from ``seed + i``.

    Args:
        image: ``height x width x 3`` uint8 RGB, already at the output size.
        mask: ``height x width`` uint8, 255 where the image is repainted (``None``: the
            whole image is redrawn, ``strength`` of the way from it).
        strength: how far from the image the edit goes (0: kept, 1: redrawn from noise).
    """

    prompt: str
    image: np.ndarray
    mask: np.ndarray | None = None
    n: int = 1
    seed: int = 0
    steps: int = 20
    guidance_scale: float = 7.5
    strength: float = 0.8
    negative_prompt: str = ""

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])


@final
@dataclass(frozen=True, slots=True)
class ImageResult:
    """The images, each ``height x width x 3`` uint8 RGB."""

    images: tuple[np.ndarray, ...]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class VideoRequest:
    """One chunk of a video: ``frames`` frames of one prompt, noise from ``seed``."""

    prompt: str
    width: int
    height: int
    frames: int
    seed: int = 0
    steps: int = 20
    guidance_scale: float = 7.5
    negative_prompt: str = ""

    @property
    def batch_key(self) -> tuple[int, int, int, int, float]:
        return (self.width, self.height, self.frames, self.steps, self.guidance_scale)


@final
@dataclass(frozen=True, slots=True)
class VideoResult:
    """The chunk's frames: ``frames x height x width x 3`` uint8 RGB."""

    frames: np.ndarray


@final
@dataclass(frozen=True, slots=True)
class DiffusionModel:
    """A configured pipeline: its id (``/v1/models``, responses) and local folder."""

    id: str
    kind: PipelineKind
    folder: Path


def resolve_diffusion(name: str, kind: PipelineKind, options: ModelOptions) -> DiffusionModel:
    """``--image-model`` / ``--video-model`` / ``--audio-model``: ``tiny`` (built into the model
    cache, seeded by ``options.seed``) or a folder holding a diffusers ``model_index.json``.

    Raises:
        ConfigError: the folder is missing or is no diffusers pipeline.
    """
    if name == "tiny":
        folder = tiny_pipeline(options.cache_folder, kind, options.seed)
        return DiffusionModel(f"tiny-{kind}", kind, folder)
    folder = Path(name).expanduser()
    if not (folder / "model_index.json").is_file():
        raise ConfigError(
            f"{kind}_model: {name!r} is not a diffusers pipeline folder (no model_index.json); "
            "weights are never downloaded: name a local folder, or tiny"
        )
    return DiffusionModel(folder.resolve().name, kind, folder)


def _load(model: DiffusionModel, device: str) -> Any:
    """The pipeline on ``device`` (float16 on a GPU), checked for a per-step callback."""
    import torch
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()  # its bars would write to stderr, past the logs
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    note(f"loading the {model.kind} pipeline {model.id} on {device}")
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    with warnings.catch_warnings():  # Stable Audio's VAE: weight_norm, deprecated in torch
        warnings.filterwarnings("ignore", ".*weight_norm.*", FutureWarning)
        pipeline = DiffusionPipeline.from_pretrained(model.folder, dtype=dtype)
    parameters = inspect.signature(pipeline.__call__).parameters
    needed = {"num_inference_steps", "guidance_scale", "generator"}
    if model.kind == "audio":  # Stable Audio's signature: a per-step callback of the old form
        needed |= {"audio_end_in_s", "callback", "callback_steps"}
    else:
        needed.add("callback_on_step_end")
    if model.kind == "video":
        needed.add("num_frames")
    missing = needed - set(parameters)
    if missing:  # checked once, at startup: a pipeline we cannot preempt is refused
        raise ConfigError(
            f"{model.kind}_model: {type(pipeline).__name__} takes no {', '.join(sorted(missing))}"
        )
    pipeline.set_progress_bar_config(disable=True)
    pipeline = pipeline.to(device)
    if model.kind != "audio":  # Stable Audio's DiT takes its timestep where its latents are
        _timesteps_on_host(pipeline.scheduler)
    if device.startswith("cuda") and model.kind == "image" and graph_pipeline(pipeline):
        note(f"capturing the {model.id} pipeline's CUDA graphs at the default size")
        pipeline(prompt="", num_inference_steps=2, output_type="pt")
    return pipeline


def _timesteps_on_host(scheduler: Any) -> None:
    """Make ``scheduler.set_timesteps`` keep its timesteps on the host, whatever device the
    pipeline names.

    On the device, each diffusion step indexes the scheduler's host tables with a device
    scalar (DDIM's ``alphas_cumprod[t]``): a read back that waits for the step's kernels
    inside tensor indexing, with the GIL held. Measured on one H200 (an SD-1.5-sized
    pipeline, ``bench/pipeline_stalls.py``), another thread of the process woke every
    ~11.6 ms instead of every 1 ms while images ran: each UNet step kept the engine
    process's tick loop out for its whole length. On the host the tables are read at once,
    and the denoiser's call copies ``t`` to the device.
    """
    set_timesteps = scheduler.set_timesteps
    signature = inspect.signature(set_timesteps)
    if "device" not in signature.parameters:
        return

    @functools.wraps(set_timesteps)  # diffusers inspects its parameters
    def on_host(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["device"] = None
        return set_timesteps(*bound.args, **bound.kwargs)

    scheduler.set_timesteps = on_host


def _uint8(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float32)
    return (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _uint8_images(images: Any) -> np.ndarray:
    """A pipeline's ``output_type="pt"`` images (``n x 3 x h x w`` in [0, 1], on its device)
    as ``n x h x w x 3`` uint8, converted where they are: one small copy to the host, no
    float arrays for the engine process's CPU to scale (the same float32 arithmetic as
    `_uint8`, so the same bytes)."""
    import torch

    scaled = images.float().clamp(0.0, 1.0).mul(255.0).add(0.5).to(torch.uint8)
    return scaled.permute(0, 2, 3, 1).contiguous().cpu().numpy()


def _generator(seed: int) -> Any:
    import torch

    return torch.Generator("cpu").manual_seed(seed)  # CPU noise: the same on every device


def _step_callback(gate: UnitGate) -> Any:
    """The pipeline's ``callback_on_step_end``: the step's unit ends when its kernels have run.

    On a GPU the pipeline's thread only queues a step's kernels; without waiting for them
    it would queue step after step, each in the next window, and the device would run them
    all at once beside the realtime steps (measured on one H200 beside 64 Moshi-7B
    sessions: step p99 from 40 to 152 ms). Waiting on the stream (the GIL released) keeps
    one step on the device at a time and makes a unit's measured time its device time.
    """

    def on_step_end(pipeline: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> Any:
        _wait_for_device(pipeline.device)
        # after the last step comes the VAE decode: its own kind of unit, wider than a step
        last = step + 1 >= getattr(pipeline, "num_timesteps", math.inf)
        gate.next_unit("decode" if last else "step")
        return tensors

    return on_step_end


CHECKED_PIXELS = 256 * 256
"""From this many pixels per frame a CPU call's ops are checked one by one (below, a step is
short enough to end at its callback)."""
SPLIT_QUERIES = 1024
"""A checked call's attention runs in slices of this many queries, the gate asked between
them: one attention over a 512x512 image's latent ran for tens of seconds on a CPU."""


@contextmanager
def _checked_inside(pipeline: Any, gate: UnitGate, pixels: int) -> Iterator[None]:
    """While a large call runs on the CPU, every torch op first asks ``gate.check()``, and
    each attention runs in query slices with a check between them: a step at a large size
    runs for minutes, one attention call for tens of seconds, and a client that leaves (or a
    shutdown) must not wait for either. A raise there unwinds the call and frees its
    tensors. The mode is this thread's only (torch function modes are per thread)."""
    if pixels < CHECKED_PIXELS or pipeline.device.type != "cpu":
        yield
        return
    with _checked_ops(gate):
        yield


def _checked_ops(gate: UnitGate) -> Any:
    import torch
    import torch.nn.functional as functional
    from torch.overrides import TorchFunctionMode

    attention = functional.scaled_dot_product_attention

    class Checked(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            gate.check()
            if func is attention and len(args) == 3 and not kwargs.get("is_causal", False):
                return sliced(func, *args, **kwargs)
            return func(*args, **kwargs)

    def sliced(func: Any, query: Any, key: Any, value: Any, **kwargs: Any) -> Any:
        length = query.shape[-2]
        mask = kwargs.pop("attn_mask", None)
        if length <= SPLIT_QUERIES:
            return func(query, key, value, attn_mask=mask, **kwargs)
        parts = []
        for start in range(0, length, SPLIT_QUERIES):
            gate.check()
            rows = slice(start, start + SPLIT_QUERIES)
            part_mask = mask
            if mask is not None and mask.dim() >= 2 and mask.shape[-2] == length:
                part_mask = mask[..., rows, :]
            parts.append(func(query[..., rows, :], key, value, attn_mask=part_mask, **kwargs))
        return torch.cat(parts, dim=-2)

    return Checked()


def _wait_for_device(device: Any) -> None:
    """Until this thread's current stream on ``device`` has run its kernels (no-op off CUDA)."""
    if device.type == "cuda":
        import torch

        torch.cuda.current_stream(device).synchronize()  # releases the GIL while it waits


def image_calls(requests: Sequence[ImageRequest], max_images: int) -> list[list[int]]:
    """Which requests share a pipeline call: the indexes of each call, in order.

    Requests of one `ImageRequest.batch_key` (size, steps, guidance) go together, oldest
    first, up to ``max_images`` images a call (a request of more images runs alone).
    """
    calls: list[list[int]] = []
    open_calls: dict[tuple[int, int, int, float], tuple[list[int], int]] = {}
    for index, request in enumerate(requests):
        key = request.batch_key
        call, images = open_calls.get(key, ([], 0))
        if call and images + request.n > max_images:
            call, images = [], 0
        if not call:
            calls.append(call)
        call.append(index)
        open_calls[key] = (call, images + request.n)
    return calls


@final
class ImageRunner:
    """Text to image over a diffusers pipeline (``.images`` output).

    A batch of requests runs as few pipeline calls as their sizes, steps and guidance
    allow (`image_calls`): one call denoises every image of its requests together, each
    image from its own seed's noise, so an image is the one it would be alone (up to the
    rounding of a batched forward). One step of a call is one unit. An edit
    (`ImageEditRequest`, ``/v1/images/edits``) runs in a call of its own, on the
    image-to-image or inpainting pipeline diffusers makes from this one's modules.

    Args:
        max_batch: the most requests, and images, one call takes.
        stream: the CUDA stream its device work runs on (``None``: the current one); a
            batch-priority stream (`priority_stream`) lets its units run on into realtime
            steps (`beside_realtime`).
    """

    name = "image"

    def __init__(
        self, pipeline: Any, model: DiffusionModel, max_batch: int = 1, stream: Any = None
    ) -> None:
        self.pipeline = pipeline
        self.model = model
        self.max_batch = max_batch
        self.metadata = {"model": model.id}
        """What clients are told: the model id they may name."""
        self._stream = stream
        self.beside_realtime = stream is not None
        """Its units start in any window between realtime steps and may run on into the next
        (`Slack.acquire`)."""
        self._edits: dict[str, Any] = {}

    def run_batch(
        self, requests: Sequence[ImageRequest | ImageEditRequest], gate: UnitGate
    ) -> list[ImageResult]:
        results: list[ImageResult | None] = [None] * len(requests)
        plain = [i for i, request in enumerate(requests) if isinstance(request, ImageRequest)]
        generations = [requests[i] for i in plain]
        for call in image_calls(generations, self.max_batch):  # type: ignore[arg-type]
            first = generations[call[0]]
            pixels = first.width * first.height
            with _on(self._stream), _checked_inside(self.pipeline, gate, pixels):
                done = self._run([generations[i] for i in call], gate)  # type: ignore[misc]
            for index, result in zip(call, done, strict=True):
                results[plain[index]] = result
        for index, request in enumerate(requests):
            if isinstance(request, ImageEditRequest):  # one call each: its own image
                pixels = request.image.shape[0] * request.image.shape[1]
                with _on(self._stream), _checked_inside(self.pipeline, gate, pixels):
                    results[index] = self._edit(request, gate)
        assert all(result is not None for result in results)
        return results  # type: ignore[return-value]

    def _edit_pipeline(self, inpaint: bool) -> Any:
        """The image-to-image (or inpainting) pipeline over this pipeline's own modules
        (``from_pipe``: no second copy of the weights), made on first use."""
        key = "inpaint" if inpaint else "image2image"
        made = self._edits.get(key)
        if made is None:
            from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

            kind = AutoPipelineForInpainting if inpaint else AutoPipelineForImage2Image
            made = kind.from_pipe(self.pipeline)
            made.set_progress_bar_config(disable=True)
            self._edits[key] = made
        return made

    def _edit(self, request: ImageEditRequest, gate: UnitGate) -> ImageResult:
        """One pipeline call for an edit's ``n`` images, each from ``seed + i``."""
        from PIL import Image

        pipeline = self._edit_pipeline(request.mask is not None)
        n = request.n
        extra: dict[str, Any] = {}
        if request.mask is not None:
            extra = {
                "mask_image": Image.fromarray(request.mask, mode="L"),
                "width": request.width,
                "height": request.height,
            }
        output = pipeline(
            prompt=[request.prompt] * n,
            negative_prompt=[request.negative_prompt] * n if request.negative_prompt else None,
            image=Image.fromarray(request.image, mode="RGB"),
            strength=request.strength,
            num_images_per_prompt=1,
            num_inference_steps=request.steps,
            guidance_scale=request.guidance_scale,
            generator=[_generator(request.seed + i) for i in range(n)],
            output_type="pt",
            callback_on_step_end=_step_callback(gate),
            **extra,
        )
        return ImageResult(tuple(_uint8_images(output.images)))

    def _run(self, requests: Sequence[ImageRequest], gate: UnitGate) -> list[ImageResult]:
        """One pipeline call for ``requests`` (one batch key): their images, each request's
        in order, each from ``seed + i``."""
        first = requests[0]
        prompts, negatives, generators = [], [], []
        for request in requests:
            prompts += [request.prompt] * request.n
            negatives += [request.negative_prompt] * request.n
            generators += [_generator(request.seed + i) for i in range(request.n)]
        output = self.pipeline(
            prompt=prompts,
            negative_prompt=negatives if any(negatives) else None,
            width=first.width,
            height=first.height,
            num_images_per_prompt=1,
            num_inference_steps=first.steps,
            guidance_scale=first.guidance_scale,
            generator=generators,
            output_type="pt",
            callback_on_step_end=_step_callback(gate),
        )
        images = iter(_uint8_images(output.images))
        return [ImageResult(tuple(next(images) for _ in range(r.n))) for r in requests]


@final
class VideoRunner:
    """Text to video over a diffusers pipeline (``.frames`` output); one chunk a request."""

    name = "video"
    max_batch = 1

    def __init__(self, pipeline: Any, model: DiffusionModel, stream: Any = None) -> None:
        self.pipeline = pipeline
        self.model = model
        self.metadata = {"model": model.id}
        """What clients are told: the model id they may name."""
        self._stream = stream
        self.beside_realtime = stream is not None
        """As `ImageRunner`'s."""

    def run_batch(self, requests: Sequence[VideoRequest], gate: UnitGate) -> list[VideoResult]:
        with _on(self._stream):
            results = []
            for request in requests:
                pixels = request.width * request.height * request.frames
                with _checked_inside(self.pipeline, gate, pixels):
                    results.append(self._run(request, gate))
            return results

    def _run(self, request: VideoRequest, gate: UnitGate) -> VideoResult:
        output = self.pipeline(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt or None,
            width=request.width,
            height=request.height,
            num_frames=request.frames,
            num_inference_steps=request.steps,
            guidance_scale=request.guidance_scale,
            generator=_generator(request.seed),
            output_type="np",
            callback_on_step_end=_step_callback(gate),
        )
        frames = _uint8(output.frames)
        return VideoResult(frames.reshape(-1, *frames.shape[-3:])[: request.frames])


def _on(stream: Any) -> AbstractContextManager[Any]:
    """``stream`` current in this thread while the context lasts (``None``: as it is)."""
    if stream is None:
        return nullcontext()
    import torch

    return torch.cuda.stream(stream)


def _stream(device: str, beside_realtime: bool) -> Any:
    return priority_stream(device, Priority.BATCH) if beside_realtime else None


def load_image_runner(
    model: DiffusionModel, device: str, max_batch: int = 1, *, beside_realtime: bool = False
) -> ImageRunner:
    """Load ``model`` (seconds for a real checkpoint): call off the event loop.
    ``beside_realtime``: on a CUDA device, its units run on a batch-priority stream and may
    run on into a realtime step (off CUDA it has no effect)."""
    pipeline = _load(model, device)
    return ImageRunner(pipeline, model, max_batch, _stream(device, beside_realtime))


def load_video_runner(
    model: DiffusionModel, device: str, *, beside_realtime: bool = False
) -> VideoRunner:
    """As `load_image_runner`."""
    pipeline = _load(model, device)
    return VideoRunner(pipeline, model, _stream(device, beside_realtime))
