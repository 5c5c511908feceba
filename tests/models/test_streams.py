"""Priority streams: realtime steps ahead of batch units on one GPU, no effect elsewhere."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from duplex.models import ModelOptions, Priority
from duplex.models._streams import priority_stream
from duplex.models.diffusion import ImageRequest, load_image_runner, resolve_diffusion

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class NoGate:
    def next_unit(self, kind: str = "step") -> None:
        pass

    def check(self) -> None:
        pass


def _runner(cache: Path, device: str, *, beside: bool):  # type: ignore[no-untyped-def]
    model = resolve_diffusion("tiny", "image", ModelOptions(cache_dir=cache))
    return load_image_runner(model, device, beside_realtime=beside)


REQUEST = ImageRequest(prompt="a red cat", width=32, height=32, steps=4, seed=5)


def test_off_cuda_there_is_no_stream_and_units_keep_to_the_windows(tmp_path: Path) -> None:
    assert priority_stream("cpu", Priority.REALTIME) is None
    runner = _runner(tmp_path, "cpu", beside=True)
    assert runner.beside_realtime is False  # the setting has no effect off CUDA
    assert runner.run_batch([REQUEST], NoGate())[0].images[0].shape == (32, 32, 3)


@CUDA
def test_realtime_streams_outrank_batch_streams() -> None:
    realtime = priority_stream("cuda", Priority.REALTIME)
    batch = priority_stream("cuda", Priority.BATCH)
    assert realtime is not None and batch is not None
    assert realtime.priority < batch.priority  # lower is more urgent in CUDA
    assert batch.priority == torch.cuda.default_stream().priority


@CUDA
def test_images_on_the_batch_stream_beside_realtime_work_equal_the_plain_runners(
    tmp_path: Path,
) -> None:
    """The same picture from a runner on its batch stream while another thread keeps a
    realtime-priority stream busy, as from the runner on the default stream."""
    plain = _runner(tmp_path, "cuda", beside=False).run_batch([REQUEST], NoGate())[0]
    runner = _runner(tmp_path, "cuda", beside=True)
    assert runner.beside_realtime
    realtime = priority_stream("cuda", Priority.REALTIME)
    stop = threading.Event()
    steps = [0]

    def realtime_steps() -> None:
        x = torch.randn(512, 512, device="cuda")
        with torch.cuda.stream(realtime):
            while not stop.is_set():
                (x @ x).sum().item()
                steps[0] += 1

    thread = threading.Thread(target=realtime_steps)
    thread.start()
    try:
        beside = runner.run_batch([REQUEST], NoGate())[0]
    finally:
        stop.set()
        thread.join()
    assert steps[0] > 0
    np.testing.assert_array_equal(beside.images[0], plain.images[0])
