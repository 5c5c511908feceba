"""A VITS checkpoint through `VitsRunner`: a tiny random one, saved and loaded like a real one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from duplex.exceptions import SpeechError, UnknownVoice
from duplex.models.tts import NO_GATE, SpeechRequest, SpeechRunner, VitsRunner, load_tts

from .tiny_vits import save_tiny_vits

DECODER_TAIL = 64
"""Samples at a sentence's end that padding may change in a batch: the decoder's convolutions
see the padded frames' bias there (a few frames of the hop, 16 samples in the tiny model)."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_vits(tmp_path_factory.mktemp("vits") / "tiny", seed=3, speakers=3)


@pytest.fixture(scope="module")
def runner(checkpoint: Path) -> VitsRunner:
    loaded = load_tts(str(checkpoint), max_batch=8)
    assert isinstance(loaded, VitsRunner) and isinstance(loaded, SpeechRunner)
    assert loaded.max_sentences == 1  # on the CPU: one sentence per forward
    return VitsRunner(checkpoint, max_batch=8, max_sentences=16)  # padded forwards


def _sentence_ends(runner: VitsRunner, request: SpeechRequest) -> list[int]:
    from duplex.models.tts import split_sentences

    ends, at = [], 0
    for sentence in split_sentences(request.text):
        one = SpeechRequest(sentence, voice=request.voice, speed=request.speed)
        at += runner.run_batch([one], NO_GATE)[0].pcm.size
        ends.append(at)
    return ends


def test_a_batch_equals_each_request_alone(runner: VitsRunner) -> None:
    requests = [
        SpeechRequest("Hello there. How are you today?", voice="alloy"),
        SpeechRequest("A much longer sentence, with many more words in it, to pad the rest."),
        SpeechRequest("Hi!", speed=2.0, voice="ash"),
        SpeechRequest("Quick one.", voice="speaker-2"),
    ]
    batch = runner.run_batch(requests, NO_GATE)
    assert len(batch) == len(requests)
    for request, audio in zip(requests, batch, strict=True):
        alone = runner.run_batch([request], NO_GATE)[0]
        assert audio.sample_rate == alone.sample_rate == 16000
        assert audio.pcm.dtype == np.int16 and audio.pcm.size == alone.pcm.size > 0
        assert np.abs(audio.pcm).max() > 1000  # random weights, but not silence
        keep = np.ones(audio.pcm.size, dtype=bool)
        for end in _sentence_ends(runner, request):
            keep[max(0, end - DECODER_TAIL) : end] = False
        diff = np.abs(audio.pcm.astype(np.int32) - alone.pcm.astype(np.int32))
        assert diff[keep].max() <= 2, request


def test_speed_and_voice_change_the_output(runner: VitsRunner) -> None:
    text = "The same words every time."
    normal, slow, other = runner.run_batch(
        [SpeechRequest(text), SpeechRequest(text, speed=0.25), SpeechRequest(text, voice="ash")],
        NO_GATE,
    )
    assert slow.pcm.size > normal.pcm.size
    assert not np.array_equal(normal.pcm, other.pcm)


def test_voices_and_unknown_voice(runner: VitsRunner) -> None:
    names = [v.name for v in runner.voices()]
    assert names[:3] == ["alloy", "ash", "ballad"] and "speaker-2" in names
    bad, good = runner.run_batch(
        [SpeechRequest("Hi.", voice="speaker-9"), SpeechRequest("Hi.")], NO_GATE
    )
    assert isinstance(bad, UnknownVoice) and "speaker-0" in str(bad)
    assert not isinstance(good, Exception) and good.pcm.size > 0


def test_one_unit_per_forward(runner: VitsRunner) -> None:
    class Gate:
        units = 0

        def next_unit(self, kind: str = "step") -> None:
            self.units += 1

    gate = Gate()
    runner.run_batch(
        [
            SpeechRequest("One. Two."),
            SpeechRequest("Three.", speed=1.5),
            SpeechRequest("Four. Five.", voice="speaker-0"),
        ],
        gate,
    )
    # the four sentences at speed 1.0 in one forward, speed 1.5's in another; the first unit
    # is granted before the call
    assert gate.units == 1


def test_a_folder_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpeechError, match="no VITS checkpoint"):
        VitsRunner(tmp_path)
