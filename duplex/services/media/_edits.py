"""``POST /v1/images/edits``: image-to-image, and inpainting with a mask, on the image engine.

The body is OpenAI's multipart form (the SDK's ``images.edit``): the file ``image`` (or
one ``image[]``), an optional file ``mask``, and the text fields ``prompt``, ``n``,
``size``, ``seed``, ``num_inference_steps``, ``guidance_scale``, ``strength``,
``negative_prompt``, ``response_format`` (``b64_json``), ``output_format`` (``png``),
``model``, ``user``. The image runs through the pipeline diffusers makes from the served
one's modules (``from_pipe``), in the slack like a generation, one step a unit.

The mask follows OpenAI: where it is fully transparent (alpha 0) the image is repainted;
a mask without alpha is read as diffusers reads one (white: repaint). It must have the
image's size. With ``size`` the image (and its mask) are resized to it; without, the
image's own size is kept and must be a valid size. Images are decoded (Pillow, PNG, JPEG or
WebP only) in a worker thread after their header's size is checked, so a small file that
claims a huge image is refused before it is decoded.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final, final

import numpy as np
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from duplex.exceptions import ProtocolError
from duplex.models.diffusion import ImageEditRequest, ImageResult
from duplex.refusals import Refusal
from duplex.transport import refusal_response

from .._cost import DiffusionShape
from .._forms import read_upload_form
from .._models import IMAGES
from ._protocol import (
    InvalidValue,
    MediaLimits,
    MissingParameter,
    UnknownParameter,
    _Fields,
    _sampling,
    check_side,
    parse_size,
)
from ._serving import MediaService, _images_body, _new_seed

__all__ = ["MAX_EDIT_BYTES", "ImageEdit", "decode_edit", "edit_routes", "parse_edit_fields"]

MAX_EDIT_BYTES: Final = 16 * 1024 * 1024
"""Largest ``/v1/images/edits`` body: the image, its mask and the fields."""
_EDIT_FIELDS: Final = frozenset(
    {
        "prompt", "model", "n", "size", "seed", "num_inference_steps", "guidance_scale",
        "negative_prompt", "response_format", "output_format", "strength", "user",
    }
)  # fmt: skip
_FILES: Final = frozenset({"image", "image[]", "mask"})
_FORMATS: Final = ("PNG", "JPEG", "WEBP")
DEFAULT_STRENGTH: Final = 0.8


@final
@dataclass(frozen=True, slots=True)
class ImageEdit:
    """The checked text fields of an edit; ``size`` ``None``: the image's own."""

    prompt: str
    n: int
    size: tuple[int, int] | None
    seed: int | None
    steps: int
    guidance_scale: float
    strength: float
    negative_prompt: str


def parse_edit_fields(fields: dict[str, str], model: str, limits: MediaLimits) -> ImageEdit:
    """The form's text fields (every value a string), each checked.

    Raises:
        ProtocolError: the first field refused (``param`` names it).
    """
    read = _Fields(fields, _EDIT_FIELDS, strings=True)
    prompt = read.text("prompt", limit=limits.max_prompt_chars, required=True)
    read.model(IMAGES, model)
    read.text("user", limit=256)
    read.choice("response_format", "b64_json", ("b64_json",))
    read.choice("output_format", "png", ("png",))
    size = parse_size(fields["size"], limits) if fields.get("size") else None
    n = read.integer("n", 1, 1, limits.max_images)
    strength = read.number("strength", DEFAULT_STRENGTH, 0.0, 1.0)
    if strength == 0.0:
        message = "'strength' must be above 0 (0 keeps the image as it is)."
        raise InvalidValue(message, param="strength")
    return ImageEdit(
        prompt=prompt, n=n, size=size, strength=strength, **_sampling(read, limits)
    )  # fmt: skip


def _open(data: bytes, param: str, limits: MediaLimits) -> Any:
    """The image's header, checked: a format we decode and sides within the limits."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=_FORMATS)
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError):
        raise InvalidValue(
            f"'{param}' is not a PNG, JPEG or WebP image.", param=param
        ) from None  # fmt: skip
    width, height = image.size
    most = limits.max_side
    if not (1 <= width <= most and 1 <= height <= most):
        raise InvalidValue(
            f"'{param}' is {width}x{height}; each side must be at most {most}.", param=param
        )
    return image


def decode_edit(
    image_data: bytes, mask_data: bytes | None, size: tuple[int, int] | None, limits: MediaLimits
) -> tuple[np.ndarray, np.ndarray | None]:
    """The image as RGB and the mask as 255-where-repainted, at the output size.

    Raises:
        ProtocolError: not an image, too large, unreadable, a mask of another size, or no
            ``size`` and an image whose sides are not a valid size.
    """
    from PIL import Image

    image = _open(image_data, "image", limits)
    mask = _open(mask_data, "mask", limits) if mask_data is not None else None
    if mask is not None and mask.size != image.size:
        raise InvalidValue(
            f"'mask' is {mask.size[0]}x{mask.size[1]}; it must be the image's size, "
            f"{image.size[0]}x{image.size[1]}.",
            param="mask",
        )
    if size is None:
        for side in image.size:
            check_side(side, limits, "image")
        size = image.size
    try:
        rgb = image.convert("RGB")
        repaint = None
        if mask is not None:
            bands = mask.getbands()
            if "A" in bands:  # OpenAI's: transparent is where the image is edited
                alpha = np.asarray(mask.getchannel("A"))
                repaint = Image.fromarray(np.where(alpha == 0, 255, 0).astype(np.uint8))
            else:
                repaint = mask.convert("L")
    except (OSError, ValueError) as exc:  # a truncated or corrupt body behind a good header
        raise InvalidValue(f"The image could not be decoded: {exc}", param="image") from None
    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.LANCZOS)
        if repaint is not None:
            repaint = repaint.resize(size, Image.Resampling.NEAREST)
    return np.asarray(rgb, dtype=np.uint8), (
        None if repaint is None else np.asarray(repaint, dtype=np.uint8)
    )


async def edit_images(service: MediaService, request: Request) -> Response | None:
    """``POST /v1/images/edits``; ``None``: the client left before the answer."""
    engine = service._engine("image")
    if isinstance(engine, Refusal):
        return refusal_response(engine)
    limits = service.limits
    try:
        form = await read_upload_form(
            request, max_bytes=MAX_EDIT_BYTES, files=_FILES, max_fields=len(_EDIT_FIELDS) + 3
        )
        unknown = sorted(set(form.fields) - _EDIT_FIELDS)
        if unknown:
            name = unknown[0][:100]
            raise UnknownParameter(f"Unknown parameter: '{name}'.", param=name)
        images = [form.files[key] for key in ("image", "image[]") if key in form.files]
        if not images:
            raise MissingParameter("Missing required parameter: 'image'.", param="image")
        if len(images) > 1:
            message = "Give one image: this server edits one at a time."
            raise InvalidValue(message, param="image")
        asked = parse_edit_fields(form.fields, service._model(engine, "image"), limits)
        source, mask = await trio.to_thread.run_sync(
            decode_edit, images[0], form.files.get("mask"), asked.size, limits
        )
    except ProtocolError as exc:
        return refusal_response(Refusal.of(exc))
    seed = asked.seed if asked.seed is not None else _new_seed()
    work = ImageEditRequest(
        prompt=asked.prompt,
        image=source,
        mask=mask,
        n=asked.n,
        seed=seed,
        steps=asked.steps,
        guidance_scale=asked.guidance_scale,
        strength=asked.strength,
        negative_prompt=asked.negative_prompt,
    )
    height, width = source.shape[:2]
    shape = DiffusionShape(width, height, asked.steps, n=asked.n)  # admitted by its cost
    lease = service.admit("image", shape)
    if isinstance(lease, Refusal):
        return refusal_response(lease)
    started = trio.current_time()
    try:
        result = await service._until_client_leaves(
            request,
            engine,
            work,
            shape,  # type: ignore[arg-type]
        )
    except BaseException:
        service._finished("image", lease, started, "abandoned")
        raise
    service._finished("image", lease, started, "abandoned" if result is None else "answered")
    if not isinstance(result, ImageResult):
        return result
    created = int(service.wall_clock())
    body = await trio.to_thread.run_sync(_images_body, result.images, seed, created)
    return Response(body, media_type="application/json")


def edit_routes(media: MediaService | None) -> list[BaseRoute]:
    """``POST /v1/images/edits``; with no service (``None``) it answers ``model_not_loaded``."""
    service = media or MediaService(None)

    async def edits(request: Request) -> Response:
        answer = await edit_images(service, request)
        return answer if answer is not None else Response(status_code=499)

    return [Route("/v1/images/edits", edits, methods=["POST"])]
