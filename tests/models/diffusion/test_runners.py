"""The tiny diffusers pipelines and the image/video runners, on the CPU."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.exceptions import ConfigError, RequestCancelled, RequestsOverloaded
from duplex.models import ModelOptions, RequestEngine
from duplex.models.diffusion import (
    AudioRequest,
    AudioRunner,
    DiffusionModel,
    ImageEditRequest,
    ImageRequest,
    ImageRunner,
    VideoRequest,
    VideoRunner,
    image_calls,
    load_audio_runner,
    load_image_runner,
    load_video_runner,
    resolve_diffusion,
    tiny_pipeline,
)


class Open:
    """A gate that always lets the next step run, counting them by kind."""

    def __init__(self) -> None:
        self.units = 0
        self.kinds: list[str] = []

    def next_unit(self, kind: str = "step") -> None:
        self.units += 1
        self.kinds.append(kind)

    def check(self) -> None:
        pass


class CancelAfter:
    """A gate that withdraws the request after ``units`` steps."""

    def __init__(self, units: int) -> None:
        self.left = units

    def next_unit(self, kind: str = "step") -> None:
        if self.left == 0:
            raise RequestCancelled("withdrawn")
        self.left -= 1

    def check(self) -> None:
        pass


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def image_runner(cache: Path) -> ImageRunner:
    model = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=cache))
    return load_image_runner(model, "cpu")


@pytest.fixture(scope="module")
def video_runner(cache: Path) -> VideoRunner:
    model = resolve_diffusion("tiny", "video", ModelOptions(cache_dir=cache))
    return load_video_runner(model, "cpu")


def request(**fields: object) -> ImageRequest:
    return ImageRequest(**{"prompt": "a red cat", "width": 32, "height": 24, "steps": 2, **fields})


def test_tiny_build_is_cached_and_rebuilt_when_damaged(cache: Path) -> None:
    folder = tiny_pipeline(cache, "image", 7)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == (
        "StableDiffusionPipeline"
    )
    tokenizer = json.loads((folder / "tokenizer" / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == 2 + 2 * 256  # each byte, alone and word-final
    stamp = (folder / "duplex-manifest.json").stat().st_mtime_ns
    assert tiny_pipeline(cache, "image", 7) == folder
    assert (folder / "duplex-manifest.json").stat().st_mtime_ns == stamp  # not rebuilt
    (folder / "unet" / "config.json").write_text("{}")  # damaged: rebuilt
    assert tiny_pipeline(cache, "image", 7) == folder
    assert json.loads((folder / "unet" / "config.json").read_text())["sample_size"] == 8


def test_a_folder_without_a_pipeline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model_index\.json"):
        resolve_diffusion(str(tmp_path), "image", ModelOptions())
    model = resolve_diffusion("tiny", "video", ModelOptions(cache_dir=tmp_path))
    assert (model.id, model.kind) == ("tiny-video", "video")


def test_same_seed_same_images_other_seed_other_images(image_runner: ImageRunner) -> None:
    gate = Open()
    (first,) = image_runner.run_batch([request(n=2, seed=11)], gate)
    (again,) = image_runner.run_batch([request(n=2, seed=11)], gate)
    (other,) = image_runner.run_batch([request(n=1, seed=12)], gate)
    assert [image.shape for image in first.images] == [(24, 32, 3)] * 2
    assert all(image.dtype == np.uint8 for image in first.images)
    assert all(np.array_equal(a, b) for a, b in zip(first.images, again.images, strict=True))
    assert not np.array_equal(first.images[0], first.images[1])  # image i: seed + i
    # seed 11 + 1 is seed 12: the same noise; run in a batch of 2 rather than alone, the
    # floats may differ in the last bits, so a pixel may round one step apart
    assert np.abs(first.images[1].astype(int) - other.images[0].astype(int)).max() <= 2
    assert gate.units == 3 * 2  # after each step: the engine holds the first unit
    # the unit after an image's last step is its VAE decode, estimated on its own
    assert gate.kinds == ["step", "decode"] * 3


def test_the_schedulers_keep_their_timesteps_on_the_host(
    image_runner: ImageRunner, video_runner: VideoRunner
) -> None:
    """Whatever device a pipeline names (on a GPU, read back with the GIL held each step)."""
    for runner in (image_runner, video_runner):
        scheduler = runner.pipeline.scheduler
        scheduler.set_timesteps(4, device="meta")
        assert scheduler.timesteps.device.type == "cpu" and len(scheduler.timesteps) == 4


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)  # slow on a busy host
@given(
    st.lists(st.tuples(st.sampled_from([(32, 24), (16, 16)]), st.sampled_from([2, 3]),
                       st.integers(1, 3)), max_size=12),
    st.integers(1, 6),
)  # fmt: skip
def test_calls_hold_one_key_in_order_within_the_image_bound(
    asked: list[tuple[tuple[int, int], int, int]], max_images: int
) -> None:
    requests = [request(width=w, height=h, steps=steps, n=n) for (w, h), steps, n in asked]
    calls = image_calls(requests, max_images)
    assert sorted(i for call in calls for i in call) == list(range(len(requests)))
    for call in calls:
        assert call == sorted(call) and len({requests[i].batch_key for i in call}) == 1
        images = sum(requests[i].n for i in call)
        assert images <= max_images or len(call) == 1
    for a, b in itertools.pairwise(calls):  # a key's next call only once it is full
        if requests[a[0]].batch_key == requests[b[0]].batch_key:
            assert sum(requests[i].n for i in a) + requests[b[0]].n > max_images


def test_requests_of_one_size_and_steps_share_one_call(cache: Path) -> None:
    """Three requests, two of one key: two pipeline calls (the steps say so), and each image
    is the one it is alone (up to a batched forward's rounding)."""
    model = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=cache))
    runner = load_image_runner(model, "cpu", max_batch=4)
    asked = [request(seed=1, n=2), request(seed=5, steps=3), request(seed=9, prompt="a dog")]
    gate = Open()
    batched = runner.run_batch(asked, gate)
    assert gate.units == 2 + 3  # one call of 2 steps (requests 0 and 2), one of 3
    for one, result in zip(asked, batched, strict=True):
        (alone,) = runner.run_batch([one], Open())
        assert len(result.images) == len(alone.images) == one.n
        for a, b in zip(result.images, alone.images, strict=True):
            assert np.abs(a.astype(int) - b.astype(int)).max() <= 2


def test_a_withdrawn_request_stops_at_its_next_step(image_runner: ImageRunner) -> None:
    gate = CancelAfter(3)
    with pytest.raises(RequestCancelled):
        image_runner.run_batch([request(steps=50)], gate)
    assert gate.left == 0  # three steps ran, the fourth's gate raised
    assert image_runner.metadata == {"model": "tiny-image"}


def test_video_chunk_frames_and_seed(video_runner: VideoRunner) -> None:
    chunk = VideoRequest(prompt="waves", width=32, height=16, frames=3, seed=4, steps=2)
    (first,) = video_runner.run_batch([chunk], Open())
    (again,) = video_runner.run_batch([chunk], Open())
    assert first.frames.shape == (3, 16, 32, 3)
    assert first.frames.dtype == np.uint8
    assert np.array_equal(first.frames, again.frames)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_video_runner_with_host_timesteps_paints_the_plain_pipelines_frames(
    cache: Path,
) -> None:
    """As served (batch stream, timesteps on the host) against the pipeline as diffusers
    loads it (timesteps on the device): the same frames, up to a rounding."""
    from diffusers import DiffusionPipeline

    model = resolve_diffusion("tiny", "video", ModelOptions(cache_dir=cache))
    served = load_video_runner(model, "cuda", beside_realtime=True)
    plain = DiffusionPipeline.from_pretrained(model.folder, dtype=torch.float16).to("cuda")
    plain.set_progress_bar_config(disable=True)
    chunk = VideoRequest(prompt="waves", width=32, height=16, frames=3, seed=4, steps=2)
    (ours,) = served.run_batch([chunk], Open())
    (theirs,) = VideoRunner(plain, model).run_batch([chunk], Open())
    assert served.pipeline.scheduler.timesteps.device.type == "cpu"
    assert plain.scheduler.timesteps.device.type == "cuda"
    assert ours.frames.shape == theirs.frames.shape == (3, 16, 32, 3)
    assert np.abs(ours.frames.astype(int) - theirs.frames.astype(int)).max() <= 2


async def test_on_a_request_engine_a_full_queue_refuses_a_leaving_client_frees_it(
    image_runner: ImageRunner,
) -> None:
    engine: RequestEngine[ImageRequest, object] = RequestEngine(image_runner, max_queue=1)

    async def wait_for(check: object) -> None:
        while not check():  # type: ignore[operator]
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        long = trio.CancelScope()
        queued = trio.CancelScope()

        async def submit(scope: trio.CancelScope) -> None:
            with scope:
                await engine.submit(request(steps=500))

        nursery.start_soon(submit, long)
        await wait_for(lambda: engine.statistics().batcher.batches == 1)  # running
        nursery.start_soon(submit, queued)
        await wait_for(lambda: engine.statistics().batcher.queued == 1)
        with pytest.raises(RequestsOverloaded) as refused:
            await engine.submit(request())
        assert refused.value.retry_after_s >= 1.0
        queued.cancel()
        long.cancel()  # its batch stops at its next step, and the engine is free again
        await wait_for(lambda: engine.statistics().batcher.queued == 0)
        with trio.fail_after(60):
            (image,) = (await engine.submit(request(seed=11))).images
        (alone,) = image_runner.run_batch([request(seed=11)], Open())[0].images
        assert np.array_equal(image, alone)
        stats = engine.statistics()
        assert (stats.stopped_batches, stats.batcher.refused) == (1, 1)
        assert (stats.batcher.cancelled, stats.orphaned) == (1, 1)  # queued; running (stopped)
        nursery.cancel_scope.cancel()


def test_models_are_values() -> None:
    model = DiffusionModel("x", "image", Path("."))
    assert model == DiffusionModel("x", "image", Path("."))


@pytest.fixture(scope="module")
def audio_runner(cache: Path) -> AudioRunner:
    model = resolve_diffusion("tiny", "audio", ModelOptions(cache_dir=cache))
    return load_audio_runner(model, "cpu")


def test_audio_runs_a_step_a_unit_and_a_seed_is_its_audio(audio_runner: AudioRunner) -> None:
    """Stable Audio from its folder through diffusers' loader: mono int16 at the VAE's rate,
    as long as asked; the same seed the same samples, another seed others; a withdrawn
    request stops at its next step."""
    assert audio_runner.metadata == {
        "model": "tiny-audio", "sample_rate": 8000, "max_audio_length_s": 16.384,
    }  # fmt: skip
    ask = AudioRequest(prompt="rain on a roof", seconds=1.5, seed=3, steps=3)
    gate = Open()
    (first,) = audio_runner.run_batch([ask], gate)
    assert gate.kinds == ["step", "step", "decode"]
    assert (first.pcm.dtype, first.pcm.shape, first.sample_rate) == (np.int16, (12_000,), 8000)
    assert np.abs(first.pcm).max() > 100  # not silence
    (again,) = audio_runner.run_batch([ask], Open())
    assert np.array_equal(first.pcm, again.pcm)
    (other,) = audio_runner.run_batch([AudioRequest(prompt="rain on a roof", seconds=1.5,
                                                    seed=4, steps=3)], Open())  # fmt: skip
    assert not np.array_equal(first.pcm, other.pcm)
    cancel = CancelAfter(2)
    with pytest.raises(RequestCancelled):
        audio_runner.run_batch([AudioRequest(prompt="x", seconds=1.0, steps=40)], cancel)
    assert cancel.left == 0


def test_an_audio_folder_whose_pipeline_cannot_be_preempted_is_refused(cache: Path) -> None:
    """An image pipeline named as the audio model lacks Stable Audio's call: refused at load."""
    image = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=cache))
    with pytest.raises(ConfigError, match="audio_model: StableDiffusionPipeline takes no"):
        load_audio_runner(DiffusionModel("x", "audio", image.folder), "cpu")


def test_edits_redraw_the_image_and_inpaint_only_under_the_mask(image_runner: ImageRunner) -> None:
    """Image-to-image and inpainting on the served pipeline's own modules: the same seed and
    inputs give the same pixels; a mask keeps what it does not cover close to the source."""
    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)
    edit = ImageEditRequest(prompt="a blue cat", image=source, n=2, seed=5, steps=4)
    gate = Open()
    (first,) = image_runner.run_batch([edit], gate)
    assert [image.shape for image in first.images] == [(32, 48, 3)] * 2
    assert gate.kinds[-1] == "decode" and len(gate.kinds) == 3  # strength 0.8 of 4 steps
    (again,) = image_runner.run_batch([edit], Open())
    assert all(np.array_equal(a, b) for a, b in zip(first.images, again.images, strict=True))
    assert not np.array_equal(first.images[0], first.images[1])  # seed + i
    mask = np.zeros((32, 48), dtype=np.uint8)
    mask[:, 24:] = 255  # repaint the right half only
    masked = ImageEditRequest(prompt="a blue cat", image=source, mask=mask, seed=5, steps=4,
                              strength=1.0)  # fmt: skip
    generation = request(seed=1)
    inpainted, generated = image_runner.run_batch([masked, generation], Open())  # one batch
    (picture,) = inpainted.images
    kept = np.abs(picture[:, :16].astype(int) - source[:, :16].astype(int)).mean()
    redrawn = np.abs(picture[:, 32:].astype(int) - source[:, 32:].astype(int)).mean()
    assert kept < redrawn
    (alone,) = image_runner.run_batch([generation], Open())
    assert np.array_equal(generated.images[0], alone.images[0])


class StopAfterChecks:
    """A gate whose batch is withdrawn after ``checks`` checks inside a step; counts them."""

    def __init__(self, checks: int) -> None:
        self.left = checks
        self.checks = 0
        self.steps = 0

    def next_unit(self, kind: str = "step") -> None:
        self.steps += 1
        self.check()

    def check(self) -> None:
        self.checks += 1
        if self.checks > self.left:
            raise RequestCancelled("withdrawn")


def test_a_large_call_is_checked_inside_its_step_with_the_same_bytes(
    image_runner: ImageRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked op by op with attention in query slices, a call paints the same PNG bytes
    as unchecked; and a withdrawal lands inside the first step, not at its end (a 512x512
    step runs a minute or more on this CPU; the check is why its client's leaving stops it:
    tests/transport/test_e2e_bounded_media.py)."""
    from duplex.models.diffusion import _runners

    request = ImageRequest(prompt="a lighthouse", width=64, height=64, steps=2, seed=5)
    plain = image_runner.run_batch([request], Open())[0].images[0]
    monkeypatch.setattr(_runners, "CHECKED_PIXELS", 64 * 64)
    monkeypatch.setattr(_runners, "SPLIT_QUERIES", 48)  # the 16x16 attention in 6 slices
    gate = StopAfterChecks(10**9)
    checked = image_runner.run_batch([request], gate)[0].images[0]
    assert checked.tobytes() == plain.tobytes()
    assert gate.checks > 100 * gate.steps  # every op, not only each step's end

    stopped = StopAfterChecks(50)
    with pytest.raises(RequestCancelled):
        image_runner.run_batch([request], stopped)
    assert stopped.steps == 0  # inside the first step
