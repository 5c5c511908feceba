"""``POST /v1/images/edits``: decoding and checking the uploads (hostile ones included)
and the route over a real request engine on the tiny Stable Diffusion, in process."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import trio
from PIL import Image
from starlette.applications import Starlette

from duplex.exceptions import ProtocolError
from duplex.models import ModelOptions, RequestEngine
from duplex.models.diffusion import load_image_runner, resolve_diffusion
from duplex.runtime import RequestEngines
from duplex.services.media import MediaLimits, MediaService, edit_routes
from duplex.services.media._edits import MAX_EDIT_BYTES, decode_edit

EDITS = "/v1/images/edits"
LIMITS = MediaLimits()


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models are all overhead: more torch threads only contend on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def png(width: int, height: int, mode: str = "RGB", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode=mode)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def claims(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims ``width x height`` (a decompression bomb's shape)."""
    data = bytearray(png(1, 1))
    ihdr = bytearray(data[12:29])  # b"IHDR" + 13 bytes
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    return bytes(data)


def refused(call: object, param: str) -> str:
    with pytest.raises(ProtocolError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.param == param, caught.value.message
    return caught.value.message


def test_uploads_are_checked_before_they_are_decoded() -> None:
    image = png(48, 32)
    source, mask = decode_edit(image, None, None, LIMITS)
    assert source.shape == (32, 48, 3) and mask is None
    assert "32x48" in refused(lambda: decode_edit(image, png(32, 48, "L"), None, LIMITS), "mask")
    refused(lambda: decode_edit(b"GIF89a" + b"\0" * 64, None, None, LIMITS), "image")
    refused(lambda: decode_edit(b"%PDF-1.4", None, None, LIMITS), "image")
    refused(lambda: decode_edit(image, b"not a mask", None, LIMITS), "mask")
    assert "5000x4000" in refused(
        lambda: decode_edit(claims(5000, 4000), None, None, LIMITS), "image"
    )
    refused(lambda: decode_edit(claims(100_000, 100_000), None, None, LIMITS), "image")  # a bomb
    refused(lambda: decode_edit(image[: len(image) // 2], None, None, LIMITS), "image")
    refused(lambda: decode_edit(png(30, 32), None, None, LIMITS), "image")  # not a size
    resized, _ = decode_edit(png(30, 32), None, (64, 64), LIMITS)  # with size: resized
    assert resized.shape == (64, 64, 3)


def test_a_transparent_mask_marks_what_is_repainted() -> None:
    rgba = np.full((32, 48, 4), 255, dtype=np.uint8)
    rgba[:, 24:, 3] = 0  # the right half transparent: OpenAI's "edit here"
    out = io.BytesIO()
    Image.fromarray(rgba, mode="RGBA").save(out, format="PNG")
    _, mask = decode_edit(png(48, 32), out.getvalue(), None, LIMITS)
    assert mask is not None
    assert (mask[:, 24:] == 255).all() and (mask[:, :24] == 0).all()
    white = np.zeros((32, 48), dtype=np.uint8)
    white[:8] = 255
    out = io.BytesIO()
    Image.fromarray(white, mode="L").save(out, format="PNG")
    _, plain = decode_edit(png(48, 32), out.getvalue(), (96, 64), LIMITS)
    assert plain is not None and plain.shape == (64, 96) and (plain[:16] == 255).all()


def decoded(item: dict[str, object]) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(str(item["b64_json"])))))


async def test_the_route_edits_and_inpaints_reproducibly_and_refuses_by_field(
    tmp_path: Path,
) -> None:
    engines = RequestEngines(["image"])
    app = Starlette(routes=edit_routes(MediaService(engines)))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://media", timeout=120
    ) as http:
        model = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=tmp_path))
        runner = await trio.to_thread.run_sync(load_image_runner, model, "cpu")
        engine = RequestEngine(runner, max_wait_s=0.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await engines.started(engine)
            fields = {"prompt": "a blue cat", "seed": "3", "num_inference_steps": "3", "n": "2"}
            files = {"image": ("cat.png", png(48, 32), "image/png")}
            first = await http.post(EDITS, data=fields, files=files)
            assert first.status_code == 200, first.text
            data = first.json()["data"]
            assert [item["seed"] for item in data] == [3, 4]
            assert [decoded(item).shape for item in data] == [(32, 48, 3)] * 2
            again = await http.post(EDITS, data=fields, files=files)
            assert again.json()["data"] == data  # the same seed and inputs: the same pictures
            mask = {"mask": ("m.png", png(48, 32, "RGBA", seed=2), "image/png")}
            inpainted = await http.post(EDITS, data=fields, files={**files, **mask})
            assert inpainted.status_code == 200 and inpainted.json()["data"] != data

            async def refuses(response: httpx.Response, status: int, param: str | None) -> None:
                assert response.status_code == status, response.text
                assert response.json()["error"]["param"] == param, response.json()

            other = {"mask": ("m.png", png(32, 32, "RGBA"), "image/png")}
            await refuses(await http.post(EDITS, data=fields, files={**files, **other}), 400,
                          "mask")  # fmt: skip
            await refuses(await http.post(EDITS, data=fields, files={"mask": mask["mask"]}),
                          400, "image")  # fmt: skip
            await refuses(await http.post(EDITS, data={**fields, "steps": "2"}, files=files),
                          400, "steps")  # fmt: skip
            await refuses(await http.post(EDITS, data={**fields, "size": "4096x4096"},
                                          files=files), 400, "size")  # fmt: skip
            await refuses(await http.post(EDITS, data={**fields, "n": "11"}, files=files), 400,
                          "n")  # fmt: skip
            await refuses(await http.post(EDITS, data={**fields, "strength": "0"}, files=files),
                          400, "strength")  # fmt: skip
            big = {"image": ("big.png", b"\x89PNG" + b"\0" * MAX_EDIT_BYTES, "image/png")}
            await refuses(await http.post(EDITS, data=fields, files=big), 413, None)
            await refuses(await http.post(EDITS, json={"prompt": "x"}), 400, "content-type")
            resized = await http.post(EDITS, data={**fields, "size": "64x64", "n": "1"},
                                      files=files)  # fmt: skip
            assert decoded(resized.json()["data"][0]).shape == (64, 64, 3)  # still serving
            nursery.cancel_scope.cancel()
