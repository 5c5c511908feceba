"""Whisper as the agent's ASR (`WhisperRunner`), with a tiny random-weight Whisper built
here (``tiny_whisper.py``) and loaded from its folder as a real checkpoint is.

Its transcripts are arbitrary words, so these tests check structure: one batched
``generate`` per batch over the streams that need an answer, partials only every
`PARTIAL_MS` of new audio, a final equal to a standalone transcription of the same audio,
aborts and evictions that free streams, and the 30 s window. Each ``generate`` call is
recorded (the real call runs; the record is its batch size)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.cli import main
from duplex.config import load_config
from duplex.exceptions import ConfigError
from duplex.models.agent import (
    ASR_SAMPLE_RATE,
    PARTIAL_MS,
    WINDOW_SAMPLES,
    AgentOptions,
    AsrChunk,
    WhisperRunner,
    build_asr,
)
from duplex.models.agent._asr import _NoGate
from duplex.models.agent._whisper import check_whisper_folder

from .test_asr_process import hello_16k
from .tiny_whisper import build

CHUNK = int(0.24 * ASR_SAMPLE_RATE)  # the agent link's 240 ms chunks
GATE = _NoGate()


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-whisper"))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """As the server runs torch (``limit_torch_threads``): 2 threads on a loaded 2-core
    machine made the tiny model's small products ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Recorded:
    """The runner's real ``generate``, with the batch size of each call written down."""

    def __init__(self, runner: WhisperRunner) -> None:
        self.calls: list[int] = []
        model = runner._model
        real = model.generate

        def generate(features: torch.Tensor, **options: Any) -> Any:
            self.calls.append(int(features.shape[0]))
            return real(features, **options)

        model.generate = generate


def whisper(folder: Path, **options: Any) -> tuple[WhisperRunner, Recorded]:
    runner = WhisperRunner(folder, **options)
    runner.prepare()
    return runner, Recorded(runner)


def tone(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(seconds * ASR_SAMPLE_RATE)) / ASR_SAMPLE_RATE
    return (np.sin(2 * np.pi * hz * t) * 8000).astype(np.int16)


def alone(folder: Path, pcm: np.ndarray) -> str:
    """``pcm`` transcribed by a fresh runner, in one final chunk, alone in its batch."""
    runner, _ = whisper(folder)
    [text] = runner.run_batch([AsrChunk("alone", pcm, final=True)], GATE)
    return text.text


def test_every_stream_of_a_batch_in_one_generate(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    audio = [hello_16k(), tone(1.5, 300), tone(2.0, 1200), hello_16k()[:ASR_SAMPLE_RATE]]
    batch = [AsrChunk(f"s{i}", pcm, final=True) for i, pcm in enumerate(audio)]
    texts = runner.run_batch(batch, GATE)
    assert generate.calls == [4]
    assert [t.stream for t in texts] == ["s0", "s1", "s2", "s3"]
    assert all(t.final and t.text for t in texts)
    assert len({t.text for t in texts}) > 1  # what it says depends on the audio
    assert [t.text for t in texts] == [alone(tiny_whisper, pcm) for pcm in audio]
    assert runner.statistics().largest == 4 and runner.open_streams == 0


def test_partials_every_partial_ms_then_the_final(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    audio = np.concatenate([hello_16k(), tone(1.0, 440)])
    chunks = [audio[i : i + CHUNK] for i in range(0, audio.size, CHUNK)]
    answers = [runner.run_batch([AsrChunk("s", c)], GATE)[0] for c in chunks[:-1]]
    every = round(PARTIAL_MS / 240)  # chunks per decoded partial
    decoded = len(chunks[:-1]) // every
    assert generate.calls == [1] * decoded
    assert runner.statistics().skipped == len(chunks[:-1]) - decoded
    assert [a.text for a in answers[: every - 1]] == [""] * (every - 1)  # nothing decoded yet
    for i, answer in enumerate(answers):  # between decodes: the last partial again
        assert not answer.final
        if (i + 1) % every:
            assert answer.text == (answers[i - 1].text if i else "")
        else:
            assert answer.text
    [final] = runner.run_batch([AsrChunk("s", chunks[-1], final=True)], GATE)
    assert final.final and generate.calls[-1] == 1 and len(generate.calls) == decoded + 1
    assert final.text == alone(tiny_whisper, audio)
    assert runner.open_streams == 0


def test_a_provisional_chunk_is_always_decoded(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    audio = hello_16k()
    [skipped] = runner.run_batch([AsrChunk("s", audio[:CHUNK])], GATE)
    [peek] = runner.run_batch([AsrChunk("s", audio[CHUNK : 2 * CHUNK], provisional=True)], GATE)
    assert skipped.text == "" and generate.calls == [1]
    assert peek.text == alone(tiny_whisper, audio[: 2 * CHUNK]) and not peek.final
    assert runner.open_streams == 1


def test_no_new_audio_since_the_last_transcription_needs_no_decode(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    audio, nothing = hello_16k(), np.zeros(0, np.int16)
    [peek] = runner.run_batch([AsrChunk("s", audio, provisional=True)], GATE)
    [again] = runner.run_batch([AsrChunk("s", nothing, provisional=True)], GATE)
    [final] = runner.run_batch([AsrChunk("s", nothing, final=True)], GATE)
    assert generate.calls == [1] and runner.statistics().skipped == 2
    assert peek.text == again.text == final.text == alone(tiny_whisper, audio)
    assert final.final and not again.final and runner.open_streams == 0
    # one sample more, and the final is transcribed again
    runner.run_batch([AsrChunk("t", audio, provisional=True)], GATE)
    [final] = runner.run_batch([AsrChunk("t", audio[:1], final=True)], GATE)
    assert generate.calls == [1, 1, 1]
    assert final.text == alone(tiny_whisper, np.concatenate([audio, audio[:1]]))
    # a stream never transcribed is transcribed at its final, even with no new audio
    runner.run_batch([AsrChunk("u", audio[:CHUNK])], GATE)
    [final] = runner.run_batch([AsrChunk("u", nothing, final=True)], GATE)
    assert generate.calls[-1] == 1 and len(generate.calls) == 4
    assert final.text == alone(tiny_whisper, audio[:CHUNK])


def test_only_the_streams_that_need_an_answer_are_decoded(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    runner.run_batch([AsrChunk("a", tone(1.0, 300)), AsrChunk("b", tone(0.2, 500))], GATE)
    assert generate.calls == [1]  # "a" has 1 s of new audio, "b" 200 ms
    texts = runner.run_batch(
        [AsrChunk("a", tone(0.2, 300)), AsrChunk("b", tone(0.2, 500), final=True)], GATE
    )
    assert generate.calls == [1, 1]  # only "b": it closed
    assert not texts[0].final and texts[0].text  # "a": its last partial, not decoded again
    assert texts[1].final and runner.open_streams == 1


def test_abort_frees_the_stream(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    runner.run_batch([AsrChunk("s", tone(2.0, 300))], GATE)
    assert runner.open_streams == 1
    [aborted] = runner.run_batch([AsrChunk("s", np.zeros(0, np.int16), abort=True)], GATE)
    assert aborted.final and aborted.text == "" and runner.open_streams == 0
    assert generate.calls == [1]  # the abort decoded nothing
    again = hello_16k()  # the same key opens a new stream: the old audio is gone
    [final] = runner.run_batch([AsrChunk("s", again, final=True)], GATE)
    assert final.text == alone(tiny_whisper, again)
    [unknown] = runner.run_batch([AsrChunk("nope", again[:10], abort=True)], GATE)
    assert unknown.final and unknown.text == "" and runner.open_streams == 0


def test_streams_beyond_the_bound_evict_the_oldest(tiny_whisper: Path) -> None:
    runner, _ = whisper(tiny_whisper, max_streams=2)
    for key in ("a", "b", "c"):
        runner.run_batch([AsrChunk(key, tone(0.2, 300))], GATE)
    assert runner.open_streams == 2 and runner.statistics().evicted == 1
    [a] = runner.run_batch([AsrChunk("a", tone(0.5, 300), final=True)], GATE)
    assert a.text == alone(tiny_whisper, tone(0.5, 300))  # "a" was evicted: a new stream
    [b] = runner.run_batch([AsrChunk("b", tone(0.5, 300), final=True)], GATE)
    assert b.text == alone(tiny_whisper, np.concatenate([tone(0.2, 300), tone(0.5, 300)]))
    assert runner.open_streams == 1  # "c"; and nothing beyond the bound was kept


def test_beyond_30_s_a_full_window_becomes_a_fixed_prefix(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    speech = np.tile(hello_16k(), 13)[: 31 * ASR_SAMPLE_RATE]  # 31 s
    first, rest = speech[:WINDOW_SAMPLES], speech[WINDOW_SAMPLES:]
    runner.run_batch([AsrChunk("s", speech[: 20 * ASR_SAMPLE_RATE])], GATE)
    [partial] = runner.run_batch([AsrChunk("s", speech[20 * ASR_SAMPLE_RATE :])], GATE)
    assert generate.calls == [1, 2]  # the full window and the new one, in one generate
    assert runner.statistics().windows_sealed == 1
    prefix = alone(tiny_whisper, first)
    assert partial.text == f"{prefix} {alone(tiny_whisper, rest)}"
    assert runner._open["s"].window.size == rest.size  # at most one window is kept
    [final] = runner.run_batch([AsrChunk("s", np.zeros(0, np.int16), final=True)], GATE)
    assert final.text == partial.text
    # one chunk of 65 s: two full windows and 5 s, all in one generate
    long = np.tile(speech, 3)[: 65 * ASR_SAMPLE_RATE]
    [whole] = runner.run_batch([AsrChunk("t", long, final=True)], GATE)
    assert generate.calls[-1] == 3 and runner.statistics().windows_sealed == 3
    w = WINDOW_SAMPLES
    parts = [alone(tiny_whisper, long[i : i + w]) for i in (0, w, 2 * w)]
    assert whole.text == " ".join(parts)
    # ending exactly at a window's edge: the final needs no decode of its own
    [edge] = runner.run_batch([AsrChunk("u", first, final=True)], GATE)
    assert edge.text == prefix and generate.calls[-1] == 1


@pytest.mark.parametrize("seconds", [0.0, 0.01, 2.7, 29.97, 30.0])
def test_features_over_the_audio_alone_equal_the_30_s_ones(
    tiny_whisper: Path, seconds: float
) -> None:
    runner, _ = whisper(tiny_whisper)
    speech = np.tile(hello_16k(), 12)
    windows = [speech[: int(seconds * ASR_SAMPLE_RATE)], tone(min(seconds, 1.0), 300)]
    extractor = runner._processor.feature_extractor
    audio = [w.astype(np.float32) / 32768.0 for w in windows]
    full = extractor(audio, sampling_rate=ASR_SAMPLE_RATE, return_tensors="pt").input_features
    ours = runner.features(windows)
    assert ours.shape == full.shape == (2, 80, 3000)
    torch.testing.assert_close(ours, full, rtol=0, atol=2e-5)


LONG = 33 * ASR_SAMPLE_RATE


@pytest.fixture(scope="module")
def long_turn(tiny_whisper: Path) -> tuple[np.ndarray, str]:
    """33 s of speech and its transcript: the first window's text, then the rest's."""
    speech = np.tile(hello_16k(), 13)[:LONG]
    first = alone(tiny_whisper, speech[:WINDOW_SAMPLES])
    return speech, f"{first} {alone(tiny_whisper, speech[WINDOW_SAMPLES:])}"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(0, LONG), max_size=5),
    provisional=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_the_final_does_not_depend_on_how_the_turn_was_cut(
    tiny_whisper: Path, long_turn: tuple[np.ndarray, str], cuts: list[int], provisional: list[bool]
) -> None:
    speech, expected = long_turn
    runner, _ = whisper(tiny_whisper)
    bounds = [0, *sorted(cuts), LONG]
    pieces = [speech[a:b] for a, b in itertools.pairwise(bounds)]
    for piece, peek in zip(pieces[:-1], provisional, strict=False):
        [partial] = runner.run_batch([AsrChunk("s", piece, provisional=peek)], GATE)
        assert not partial.final
    [final] = runner.run_batch([AsrChunk("s", pieces[-1], final=True)], GATE)
    assert final.final and final.text == expected
    assert runner.statistics().windows_sealed == 1 and runner.open_streams == 0


def test_a_failed_generate_fails_its_batch_and_the_streams_go_on(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    real = runner._model.generate

    def broken(features: torch.Tensor, **options: Any) -> Any:
        raise RuntimeError("CUDA out of memory (as if)")

    runner._model.generate = broken
    first = tone(1.0, 300)
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.run_batch([AsrChunk("a", first), AsrChunk("b", tone(1.0, 500), final=True)], GATE)
    assert runner.open_streams == 1  # "a" goes on; "b" was closed by its final
    runner._model.generate = real
    rest = tone(0.5, 300)
    [a] = runner.run_batch([AsrChunk("a", rest, final=True)], GATE)
    assert a.text == alone(tiny_whisper, np.concatenate([first, rest]))
    assert runner.open_streams == 0 and generate.calls == [1]  # the one that ran


def test_a_final_with_no_audio_is_empty(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper)
    [text] = runner.run_batch([AsrChunk("s", np.zeros(0, np.int16), final=True)], GATE)
    assert text.final and text.text == "" and generate.calls == []


def test_build_asr_loads_a_whisper_folder(tiny_whisper: Path) -> None:
    runner = build_asr(AgentOptions(asr=str(tiny_whisper)), max_batch=8)
    assert isinstance(runner, WhisperRunner) and runner.max_batch == 8
    assert runner.metadata == {"model": tiny_whisper.name}
    [text] = runner.run_batch([AsrChunk("s", hello_16k(), final=True)], GATE)
    assert text.text == alone(tiny_whisper, hello_16k())


def not_whisper(folder: Path) -> list[tuple[str, str]]:
    """Folders that are not Whisper checkpoints, each with what the refusal says."""
    (folder / "empty").mkdir()
    (folder / "llama").mkdir()
    (folder / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "broken").mkdir()
    (folder / "broken" / "config.json").write_text("{not json")
    return [
        (str(folder / "missing"), "no config.json"),
        (str(folder / "empty"), "no config.json"),
        (str(folder / "llama"), "'llama' checkpoint"),
        (str(folder / "broken"), "unreadable config.json"),
    ]


def test_a_folder_that_is_not_whisper_is_refused(tmp_path: Path, tiny_whisper: Path) -> None:
    for path, says in not_whisper(tmp_path):
        with pytest.raises(ConfigError, match=says):
            check_whisper_folder(path)
        with pytest.raises(ConfigError, match="agent_asr: must be pocketsphinx or a Whisper"):
            load_config(env={}, overrides={"server.agent_asr": path})
    assert check_whisper_folder(str(tiny_whisper)) == tiny_whisper
    config = load_config(env={}, overrides={"server.agent_asr": str(tiny_whisper)})
    assert config.agent.asr == str(tiny_whisper)


def test_serve_refuses_a_folder_that_is_not_whisper(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (path, _), *_ = not_whisper(tmp_path)
    assert main(["serve", "--asr", path, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "agent.asr" in err and path in err and "Whisper" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_on_a_gpu_every_stream_in_one_generate(tiny_whisper: Path) -> None:
    runner, generate = whisper(tiny_whisper, device="cuda")
    audio = [hello_16k(), tone(1.5, 300), tone(2.0, 1200)]
    texts = runner.run_batch([AsrChunk(f"s{i}", a, final=True) for i, a in enumerate(audio)], GATE)
    assert generate.calls == [3] and all(t.final and t.text for t in texts)
    assert next(runner._model.parameters()).device.type == "cuda"
