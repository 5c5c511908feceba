"""The tiny diffusers pipelines and the image/video runners, on the CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from duplex.exceptions import ConfigError
from duplex.models import ModelOptions
from duplex.models.diffusion import (
    DiffusionModel,
    ImageRequest,
    ImageRunner,
    RequestCancelled,
    RequestEngine,
    RequestFailed,
    RequestsOverloaded,
    StepProgress,
    VideoRequest,
    VideoRunner,
    load_image_runner,
    load_video_runner,
    resolve_diffusion,
    tiny_pipeline,
)


class Open:
    """A gate that always lets the next step run, counting them."""

    def __init__(self) -> None:
        self.units = 0

    def next_unit(self) -> None:
        self.units += 1


class CancelAfter:
    """A gate that withdraws the request after ``units`` steps."""

    def __init__(self, units: int) -> None:
        self.left = units

    def next_unit(self) -> None:
        if self.left == 0:
            raise RequestCancelled("withdrawn")
        self.left -= 1


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
    assert np.array_equal(first.images[1], other.images[0])  # seed 11 + 1 is seed 12
    assert gate.units == 3 * (1 + 2)  # one before the first step, one after each


def test_steps_are_counted_and_a_withdrawn_request_stops_at_its_next_step(
    image_runner: ImageRunner,
) -> None:
    progress = StepProgress(50)
    with pytest.raises(RequestCancelled):
        image_runner.run_batch([request(steps=50, progress=progress)], CancelAfter(3))
    assert progress.done == 3  # units: before step 0, after steps 0 and 1; step 2 ends it


def test_video_chunk_frames_and_seed(video_runner: VideoRunner) -> None:
    chunk = VideoRequest(prompt="waves", width=32, height=16, frames=3, seed=4, steps=2)
    (first,) = video_runner.run_batch([chunk], Open())
    (again,) = video_runner.run_batch([chunk], Open())
    assert first.frames.shape == (3, 16, 32, 3)
    assert first.frames.dtype == np.uint8
    assert np.array_equal(first.frames, again.frames)


class Scripted:
    """A runner whose requests say what to do: a number of steps, or raise."""

    name = "scripted"
    max_batch = 1

    def __init__(self) -> None:
        self.started = trio.Event()
        self.release = False

    def run_batch(self, requests: list[object], gate: object) -> list[object]:
        (what,) = requests
        if what == "fail":
            raise ValueError("broken")
        if what == "hold":  # steps until withdrawn
            trio.from_thread.run_sync(self.started.set)
            while True:
                gate.next_unit()  # type: ignore[attr-defined]
                time.sleep(0.001)
        return [f"done {what}"]


async def test_engine_bounds_its_queue_withdraws_and_recovers() -> None:
    runner = Scripted()
    engine: RequestEngine[object, object] = RequestEngine(runner, max_queue=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        holding = trio.CancelScope()

        async def hold() -> None:
            with holding:
                await engine.submit("hold")

        nursery.start_soon(hold)
        await runner.started.wait()
        queued = trio.CancelScope()

        async def wait_queued() -> None:
            with queued:
                await engine.submit("queued")

        nursery.start_soon(wait_queued)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RequestsOverloaded):
            await engine.submit("refused")
        queued.cancel()
        holding.cancel()  # withdrawn: the runner's next step raises, the engine is free
        assert await engine.submit("again") == "done again"
        with pytest.raises(RequestFailed) as failed:
            await engine.submit("fail")
        assert isinstance(failed.value.__cause__, ValueError)
        stats = engine.statistics()
        assert (stats.refused, stats.cancelled, stats.completed, stats.failed) == (1, 2, 1, 1)
        assert (stats.queued, stats.running) == (0, 0)
        nursery.cancel_scope.cancel()


def test_models_are_values() -> None:
    model = DiffusionModel("x", "image", Path("."))
    assert model == DiffusionModel("x", "image", Path("."))
