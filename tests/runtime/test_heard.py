"""The session's input at 16 kHz (`Hearing`): resampled once, on the input clock."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.resample import StreamingResampler
from duplex.runtime._heard import HEARD_RATE, Hearing

RATE = 24_000


def tone(n: int, start: int = 0) -> np.ndarray:
    t = np.arange(start, start + n) / RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4000), min_size=1, max_size=12))
def test_chunks_give_one_resampling_and_a_clock_that_follows_the_samples(
    sizes: list[int],
) -> None:
    """Any chunking: the same samples as one resampler over the whole input, and each
    chunk's start is where its first sample falls (undelayed) on the input clock."""
    hearing = Hearing(RATE)
    whole = StreamingResampler(RATE, HEARD_RATE).process(tone(sum(sizes)))
    got, at = [], 0
    for index, size in enumerate(sizes):
        heard = hearing.push(tone(size, at), 1000.0 + at * 1000 / RATE)
        assert heard.fresh == (index == 0)
        assert heard.start_ms == pytest.approx(1000.0 + sum(map(len, got)) / 16)
        assert heard.end_ms == pytest.approx(1000.0 + (at + size) * 1000 / RATE)
        got.append(heard.samples)
        at += size
    np.testing.assert_array_equal(np.concatenate(got), whole)
    assert heard.delay_ms == pytest.approx((32 * 2 - 1) / 2 / 3 / 16)


def test_a_gap_in_the_input_clock_or_a_restart_starts_a_new_run() -> None:
    hearing = Hearing(RATE)
    assert hearing.push(tone(1920), 0.0).fresh
    assert not hearing.push(tone(1920), 80.0).fresh
    later = hearing.push(tone(1920), 400.0)  # the clock jumped: a fresh resampler there
    assert later.fresh and later.start_ms == 400.0
    np.testing.assert_array_equal(
        later.samples, StreamingResampler(RATE, HEARD_RATE).process(tone(1920))
    )
    hearing.restart()  # the input was cleared: no stale filter history
    again = hearing.push(tone(1920), 480.0)
    assert again.fresh and again.start_ms == 480.0
    assert not hearing.push(tone(1920), 560.0).fresh
