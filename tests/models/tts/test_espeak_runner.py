"""espeak-ng through its runner: real speech, distinct voices, speed, units, errors."""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np
import pytest

from duplex.exceptions import UnknownVoice
from duplex.models.tts import (
    NO_GATE,
    OPENAI_TO_ESPEAK,
    OPENAI_VOICES,
    EspeakRunner,
    SpeechRequest,
    SpeechRunner,
    load_tts,
    voice_problem,
)
from duplex.sessions import VOICES

TEXT = "Hello there. This is a test of the speech engine, with a few more words."


@pytest.fixture(scope="module")
def runner() -> EspeakRunner:
    return EspeakRunner()


def _speak(runner: EspeakRunner, **kwargs: object) -> np.ndarray:
    (audio,) = runner.run_batch([SpeechRequest(**kwargs)], NO_GATE)  # type: ignore[arg-type]
    assert not isinstance(audio, Exception)
    assert audio.sample_rate == runner.sample_rate == 22050
    assert audio.pcm.dtype == np.int16 and audio.pcm.ndim == 1
    return audio.pcm


def test_speech_is_loud_and_about_as_long_as_the_text(runner: EspeakRunner) -> None:
    assert isinstance(runner, SpeechRunner) and runner.name == "tts"
    pcm = _speak(runner, text=TEXT)
    assert 2.0 < pcm.size / 22050 < 6.0  # 15 words at 175 words a minute
    rms = np.sqrt(np.mean(pcm.astype(np.float64) ** 2))
    assert rms > 1000 and np.abs(pcm).max() > 8000


def test_openai_names_are_the_sessions_and_map_to_distinct_voices(runner: EspeakRunner) -> None:
    # the Realtime sessions' names first, then the speech endpoint's three more
    assert (*VOICES, "fable", "onyx", "nova") == OPENAI_VOICES
    assert len(set(OPENAI_TO_ESPEAK.values())) == len(OPENAI_VOICES)
    spoken = {
        name: _speak(runner, text="Hello there, how are you?", voice=name) for name in OPENAI_VOICES
    }
    for a, b in itertools.combinations(OPENAI_VOICES, 2):
        x, y = spoken[a], spoken[b]
        assert x.size != y.size or not np.array_equal(x, y), (a, b)
    names = [v.name for v in runner.voices()]
    assert names[: len(OPENAI_VOICES)] == list(OPENAI_VOICES)
    assert {"en-us", "en-gb", "de", "fr-fr"} <= set(names)


def test_the_metadata_accepts_exactly_the_voices_the_runner_speaks(runner: EspeakRunner) -> None:
    import pickle

    metadata = pickle.loads(pickle.dumps(runner.metadata))  # it crosses the engine link
    assert metadata["sample_rate"] == 22050 and "Andy" in metadata["variants"]
    names = ["alloy", "cedar", "nova", "en-us", "de", "en-gb+m3", "fr-fr+Andy", "nova2",
             "en-us+x", "x+Andy", "alloy+Andy", "", "+", "en-us+"]  # fmt: skip
    for voice in names:
        speaks = True
        try:
            runner.check_voice(voice)
        except UnknownVoice:
            speaks = False
        problem = voice_problem(metadata, voice)
        assert (problem is None) == speaks, voice
        if problem is not None:
            assert "alloy, ash, ballad" in problem


def test_installed_voices_and_variants_speak(runner: EspeakRunner) -> None:
    assert "Andy" in runner.variants
    german = _speak(runner, text="Guten Tag.", voice="de")
    assert german.size > 5000
    andy = _speak(runner, text="Good day.", voice="en-us+Andy")
    assert andy.size > 5000


@pytest.mark.parametrize("voice", ["orion", "nova2", "klingon", "en-us+nobody", ""])
def test_an_unknown_voice_is_refused_with_the_valid_names(runner: EspeakRunner, voice: str) -> None:
    with pytest.raises(UnknownVoice, match="alloy, ash, ballad") as info:
        runner.check_voice(voice)
    assert isinstance(info.value, ValueError)
    bad, good = runner.run_batch(
        [SpeechRequest("Hi.", voice=voice), SpeechRequest("Still here.")], NO_GATE
    )
    assert isinstance(bad, UnknownVoice)  # fails alone: the batch's other request speaks
    assert not isinstance(good, Exception) and good.pcm.size > 0


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_scales_the_duration(runner: EspeakRunner, speed: float) -> None:
    normal = _speak(runner, text=TEXT).size
    scaled = _speak(runner, text=TEXT, speed=speed).size
    assert scaled / normal == pytest.approx(1 / speed, rel=0.15)


def test_requests_are_checked_when_built() -> None:
    for bad in ({"text": " "}, {"text": "x", "speed": 0.1}, {"text": "x", "speed": float("nan")}):
        with pytest.raises(ValueError):
            SpeechRequest(**bad)  # type: ignore[arg-type]


class CountingGate:
    """``until``: when the window closes (``inf``: never; ``-inf``: always closing)."""

    def __init__(self, cancel_after: int | None = None, until: float = math.inf) -> None:
        self.units = 0
        self.cancel_after = cancel_after
        self.until = until

    def next_unit(self, kind: str = "step") -> None:
        if self.cancel_after is not None and self.units >= self.cancel_after:
            raise RuntimeError("withdrawn")
        self.units += 1


def test_one_unit_per_sentence_and_a_raising_gate_stops_the_batch(runner: EspeakRunner) -> None:
    gate = CountingGate()
    out = runner.run_batch([SpeechRequest("One. Two. Three."), SpeechRequest("Four!")], gate)
    assert gate.units == 3 and len(out) == 2  # the first unit is granted before the call
    stopping = CountingGate(cancel_after=1)
    with pytest.raises(RuntimeError, match="withdrawn"):
        runner.run_batch([SpeechRequest("One. Two. Three. Four.")], stopping)
    assert stopping.units == 1


def test_a_unit_ends_at_a_block_when_its_window_closes_and_the_audio_is_the_same(
    runner: EspeakRunner,
) -> None:
    """Elastic units: at every block once the window is closing, the synthesis paused
    there and resumed (blocks of about 60 ms of audio), the same audio as without pauses."""
    whole = runner.run_batch([SpeechRequest(TEXT)], CountingGate())[0].pcm
    closing = CountingGate(until=-math.inf)
    paused = runner.run_batch([SpeechRequest(TEXT)], closing)[0].pcm
    assert closing.units >= whole.size / runner.sample_rate / 0.1  # a unit a block (~60 ms)
    assert paused.size == pytest.approx(whole.size, abs=100)
    # a withdrawal at a block stops the synthesis mid-sentence, and is raised
    stopping = CountingGate(cancel_after=3, until=-math.inf)
    with pytest.raises(RuntimeError, match="withdrawn"):
        runner.run_batch([SpeechRequest(TEXT)], stopping)
    assert stopping.units == 3
    after = runner.run_batch([SpeechRequest(TEXT)], CountingGate())[0].pcm  # still usable
    assert after.size == pytest.approx(whole.size, abs=100)


def test_batch_results_are_in_request_order(runner: EspeakRunner) -> None:
    requests = [SpeechRequest("Short."), SpeechRequest(TEXT), SpeechRequest("Mid length here.")]
    out = runner.run_batch(requests, NO_GATE)
    alone = [runner.run_batch([r], NO_GATE)[0] for r in requests]
    # espeak carries a little state between calls: lengths agree to a few milliseconds.
    for a, b in zip(out, alone, strict=True):
        assert a.pcm.size == pytest.approx(b.pcm.size, abs=100)
    assert out[0].pcm.size < out[2].pcm.size < out[1].pcm.size


def test_concurrent_callers_are_serialized(runner: EspeakRunner) -> None:
    expected = _speak(runner, text="Parallel speech.").size
    sizes: list[int] = []

    def speak() -> None:
        sizes.append(runner.run_batch([SpeechRequest("Parallel speech.")], NO_GATE)[0].pcm.size)

    threads = [threading.Thread(target=speak) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sizes == pytest.approx([expected] * 4, abs=100)


def test_load_tts_names() -> None:
    assert load_tts("none") is None
    assert isinstance(load_tts("espeak"), EspeakRunner)
    with pytest.raises(ValueError, match="must be espeak, none or a VITS checkpoint"):
        load_tts("/no/such/folder")
