"""InputTimes: the push time of the input an engine output consumed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from duplex.runtime._input_times import MAX_CHUNKS, InputTimes

FRAME = 1920


def test_each_output_gets_the_push_time_of_its_last_sample() -> None:
    times = InputTimes()
    times.push(FRAME, 1.0)
    times.push(FRAME // 2, 2.0)  # half frames: the second frame ends in the 3rd push
    times.push(FRAME // 2, 3.0)
    times.push(2 * FRAME, 4.0)
    assert times.consume(FRAME) == 1.0
    assert times.consume(FRAME) == 3.0
    assert times.consume(0) is None  # an underrun consumed nothing
    assert times.consume(FRAME) == 4.0
    assert times.consume(FRAME) == 4.0
    assert times.consume(FRAME) is None  # nothing was pushed for it


def test_clear_forgets_queued_input() -> None:
    times = InputTimes()
    times.push(3 * FRAME, 1.0)
    assert times.consume(FRAME) == 1.0
    times.clear()  # a reset dropped the two queued frames
    assert times.consume(FRAME) is None
    times.push(FRAME, 5.0)
    assert times.consume(FRAME) == 5.0


def test_memory_is_bounded() -> None:
    times = InputTimes()
    for k in range(10 * MAX_CHUNKS):
        times.push(FRAME, float(k))
    assert len(times._chunks) == MAX_CHUNKS


@given(st.lists(st.integers(1, 3 * FRAME), min_size=1, max_size=40))
def test_times_never_go_back_and_never_precede_the_push(sizes: list[int]) -> None:
    times = InputTimes()
    ends = []
    for k, size in enumerate(sizes):
        times.push(size, float(k))
        ends.append((times.pushed, float(k)))
    seen = -1.0
    consumed = 0
    while consumed + FRAME <= times.pushed:
        at = times.consume(FRAME)
        consumed += FRAME
        assert at is not None and at >= seen
        assert at == next(t for end, t in ends if end >= consumed)
        seen = at
