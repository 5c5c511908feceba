"""The ASR pool: several pocketsphinx processes, each stream decoding in one of them, the
chunks of a batch answered in the batch's order. Real pocketsphinx children, decoding the
espeak-ng fixtures with the fixtures' grammar (deterministic)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from duplex.models.agent import ASR_SAMPLE_RATE
from duplex.models.agent._asr import AsrChunk, AsrPool
from duplex.sessions import StreamingResampler

from .agentkit import GRAMMAR, HELLO, INTERRUPT, wav_pcm16


def _16k(name: str) -> np.ndarray:
    pcm = np.frombuffer(wav_pcm16(name), "<i2").astype(np.float32) / 32768.0
    samples = StreamingResampler(24_000, ASR_SAMPLE_RATE).process(pcm)
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


@pytest.fixture(scope="module")
def pool() -> Iterator[AsrPool]:
    runner = AsrPool(2, grammar=GRAMMAR, warm=1)
    runner.prepare()
    yield runner
    runner.close()


def test_streams_spread_over_the_children_and_answers_keep_the_batch_order(
    pool: AsrPool,
) -> None:
    hello, interrupt = _16k("hello.wav"), _16k("interrupt.wav")
    step = ASR_SAMPLE_RATE // 4  # 250 ms chunks, interleaved as two sessions send them
    for start in range(0, max(hello.size, interrupt.size), step):
        batch = [
            AsrChunk("a/1", hello[start : start + step]),
            AsrChunk("b/1", interrupt[start : start + step]),
        ]
        answers = pool.run_batch(batch, gate=None)  # type: ignore[arg-type]
        assert [a.stream for a in answers] == ["a/1", "b/1"]
    assert pool.open_streams == 2
    assert sorted(pool._open) == [1, 1]  # one stream in each child
    empty = np.zeros(0, np.int16)
    done = pool.run_batch(
        [AsrChunk("b/1", empty, final=True), AsrChunk("a/1", empty, final=True)], None
    )  # type: ignore[arg-type]
    assert [(d.stream, d.text, d.final) for d in done] == [
        ("b/1", INTERRUPT, True),
        ("a/1", HELLO, True),
    ]
    assert pool.open_streams == 0 and pool._open == [0, 0]


def test_an_aborted_stream_frees_its_place_and_a_bad_pool_is_refused(pool: AsrPool) -> None:
    pool.run_batch([AsrChunk("c/1", _16k("hello.wav")[:4000])], None)  # type: ignore[arg-type]
    assert pool.open_streams == 1
    (aborted,) = pool.run_batch([AsrChunk("c/1", np.zeros(0, np.int16), abort=True)], None)  # type: ignore[arg-type]
    assert aborted.final and pool.open_streams == 0
    with pytest.raises(ValueError):
        AsrPool(0)
