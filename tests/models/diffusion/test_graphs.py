"""The CUDA-graphed pipeline (denoiser, text encoder, VAE decode): the same pictures as the
eager pipeline, replayed per shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from duplex.models import ModelOptions
from duplex.models.diffusion import ImageRequest, load_image_runner, resolve_diffusion
from duplex.models.diffusion._graphs import GraphedDenoiser, graph_pipeline


def _pipeline(cache: Path, device: str) -> Any:  # a diffusers pipeline
    from diffusers import DiffusionPipeline

    model = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=cache))
    dtype = torch.float16 if device == "cuda" else torch.float32
    pipeline = DiffusionPipeline.from_pretrained(model.folder, dtype=dtype)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


def _image(pipeline: Any, seed: int, size: int = 32) -> np.ndarray:
    generator = torch.Generator("cpu").manual_seed(seed)
    out = pipeline(
        prompt="a red cat",
        width=size,
        height=size,
        num_inference_steps=4,
        generator=generator,
        output_type="np",
    )
    return np.asarray(out.images[0])


def test_on_the_cpu_every_call_runs_eagerly_with_the_same_result(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "cpu")
    eager = _image(pipeline, seed=3)
    graphed = GraphedDenoiser(pipeline.unet).table
    assert np.array_equal(_image(pipeline, seed=3), eager)
    assert graphed.captures == 0 and graphed.replays == 0
    assert graphed.eager_calls == 4  # one per step: CPU tensors are never captured


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_steps_replay_graphs_keyed_by_shape_and_match_eager(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "cuda")
    eager = [_image(pipeline, seed=3), _image(pipeline, seed=4, size=48)]
    graphed = GraphedDenoiser(pipeline.unet, max_graphs=1).table
    first = _image(pipeline, seed=3)
    assert graphed.captures == 1 and graphed.replays == 4
    np.testing.assert_allclose(first, eager[0], atol=2e-2)
    assert np.array_equal(_image(pipeline, seed=3), first)  # a replay is deterministic
    assert graphed.replays == 8
    # a second shape finds the table full: eager, the same picture as before
    np.testing.assert_allclose(_image(pipeline, seed=4, size=48), eager[1], atol=2e-2)
    assert graphed.captures == 1 and graphed.eager_calls == 4


def test_on_the_cpu_the_whole_pipeline_graphed_runs_eagerly_with_the_same_result(
    tmp_path: Path,
) -> None:
    pipeline = _pipeline(tmp_path, "cpu")
    eager = _image(pipeline, seed=5)
    unet, text, vae = graph_pipeline(pipeline)
    assert np.array_equal(_image(pipeline, seed=5), eager)
    assert [t.captures for t in (unet, text, vae)] == [0, 0, 0]
    # 4 steps; the prompt and the (empty) negative prompt each encoded once; one decode
    assert [t.eager_calls for t in (unet, text, vae)] == [4, 2, 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_text_encoder_and_the_decoder_replay_too_and_match_eager(
    tmp_path: Path,
) -> None:
    pipeline = _pipeline(tmp_path, "cuda")
    eager = _image(pipeline, seed=6)
    embeds = pipeline.text_encoder(torch.arange(77, device="cuda")[None] % 50)[0].clone()
    unet, text, vae = graph_pipeline(pipeline)
    first = _image(pipeline, seed=6)
    assert [t.captures for t in (unet, text, vae)] == [1, 1, 1]  # prompt and negative: one shape
    assert [t.replays for t in (unet, text, vae)] == [4, 2, 1]
    np.testing.assert_allclose(first, eager, atol=2e-2)
    assert np.array_equal(_image(pipeline, seed=6), first)
    replayed = pipeline.text_encoder(torch.arange(77, device="cuda")[None] % 50)
    torch.testing.assert_close(replayed[0], embeds, atol=1e-2, rtol=0)
    # what the graphs do not cover runs eagerly: a mask, a dict from the decoder
    ids = torch.arange(77, device="cuda")[None] % 50
    pipeline.text_encoder(ids, attention_mask=torch.ones_like(ids))
    latents = torch.zeros(1, 4, 4, 4, device="cuda", dtype=torch.float16)
    assert pipeline.vae.decode(latents).sample.shape[0] == 1
    assert text.eager_calls == 1 and vae.eager_calls == 1


class _Open:
    def next_unit(self, kind: str = "step") -> None:
        pass

    def check(self) -> None:
        pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_served_runner_on_cuda_paints_the_plain_pipelines_picture(tmp_path: Path) -> None:
    """Graphed networks, timesteps on the host, uint8 made on the device, the batch stream:
    the picture of the pipeline as diffusers runs it."""
    plain = _image(_pipeline(tmp_path, "cuda"), seed=7)
    model = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=tmp_path))
    runner = load_image_runner(model, "cuda", beside_realtime=True)
    asked = ImageRequest(prompt="a red cat", width=32, height=32, steps=4, seed=7)
    (result,) = runner.run_batch([asked], _Open())
    assert runner.pipeline.scheduler.timesteps.device.type == "cpu"
    (image,) = result.images
    assert image.dtype == np.uint8 and image.shape == (32, 32, 3)
    assert np.abs(image.astype(np.float64) - plain * 255.0).max() <= 6.0
