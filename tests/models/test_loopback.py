from __future__ import annotations

import numpy as np
import pytest

from duplex.exceptions import ConfigError
from duplex.models import LoopbackRunner, ModelSpec, SlotInput, StepPlan, VideoFrame

from .models_support import FRAME, SPEC, tone


def _plan(tick: int, inputs: list[SlotInput], new: tuple[int, ...] = ()) -> StepPlan:
    live = tuple(i.slot for i in inputs)
    continuing = tuple(s for s in live if s not in new)
    return StepPlan(tick, FRAME, new, continuing, (), tuple(inputs))


def _run(runner: LoopbackRunner, frames: dict[int, list[np.ndarray | None]]) -> dict[int, list]:
    """Step every slot through its frames in lockstep; returns outputs per slot."""
    ticks = max(len(v) for v in frames.values())
    outs: dict[int, list] = {s: [] for s in frames}
    for k in range(ticks):
        inputs = [SlotInput(s, frames[s][k], k * FRAME) for s in sorted(frames)]
        for out in runner.execute(_plan(k, inputs)).outputs:
            outs[out.slot].append(out)
    return outs


@pytest.mark.parametrize("delay_ms", [0, 80, 240, 400])
def test_output_is_input_delayed_exactly_per_slot(delay_ms: int) -> None:
    runner = LoopbackRunner(SPEC, delay_ms=delay_ms)
    delay = delay_ms // 80
    frames = {s: [tone(s, k) for k in range(12)] for s in (0, 3, 5)}
    outs = _run(runner, frames)
    for s, out in outs.items():
        for k, o in enumerate(out):
            expected = frames[s][k - delay] if k >= delay else np.zeros(FRAME, np.float32)
            np.testing.assert_array_equal(o.pcm, expected)
            assert o.pcm.dtype == np.float32


def test_text_marks_speaking_and_end_of_turn() -> None:
    runner = LoopbackRunner(SPEC)  # 3 frames of delay
    outs = _run(runner, {0: [tone(0, k) for k in range(16)]})[0]
    # input frames 0-4 speak, 5-9 are silent, 10-14 speak; echoed 3 frames later
    speaking = [o.speaking for o in outs]
    assert speaking == [False] * 3 + [True] * 5 + [False] * 5 + [True] * 3
    # a mark opens each run of speech, then one every 400 ms of the stream
    assert [o.text for o in outs[3:8]] == ["[0]", "", "", "", ""]
    assert [o.text for o in outs[13:16]] == ["[800]", "", ""]
    assert all(o.text == "" for o in outs if not o.speaking)
    assert [k for k, o in enumerate(outs) if o.end_of_turn] == [8]
    dense = _run(LoopbackRunner(SPEC, mark_every_ms=160), {0: [tone(0, k) for k in range(8)]})
    assert [o.text for o in dense[0][3:8]] == ["[0]", "", "[160]", "", "[320]"]


def test_speech_threshold_is_rms() -> None:
    runner = LoopbackRunner(SPEC, delay_ms=0)
    quiet = np.full(FRAME, 0.002, np.float32)
    loud = np.full(FRAME, 0.004, np.float32)
    outs = _run(runner, {0: [quiet, loud, None]})[0]
    assert [o.speaking for o in outs] == [False, True, False]
    assert [o.end_of_turn for o in outs] == [False, False, True]


def test_underrun_is_silence() -> None:
    runner = LoopbackRunner(SPEC, delay_ms=80)
    outs = _run(runner, {0: [None, tone(0, 1), None]})[0]
    assert not outs[1].pcm.any() and not outs[1].speaking
    np.testing.assert_array_equal(outs[2].pcm, tone(0, 1))


def test_video_frames_consumed_and_reported() -> None:
    runner = LoopbackRunner(SPEC)
    video = (VideoFrame("a", 40, b"x"), VideoFrame("b", 120, b"y"))
    out = runner.execute(_plan(0, [SlotInput(1, None, 0, video), SlotInput(2, None, 0)]))
    assert out.outputs[0].video_frame_ids == ("a", "b")
    assert out.outputs[0].latest_video_pts_ms == 120
    assert out.outputs[1].video_frame_ids == () and out.outputs[1].latest_video_pts_ms is None


def test_reset_slot_touches_only_that_slot() -> None:
    runner = LoopbackRunner(SPEC, delay_ms=160)
    for k in range(2):
        runner.execute(_plan(k, [SlotInput(s, tone(s, k), k * FRAME) for s in (0, 1)]))
    runner.reset_slot(0)
    out = runner.execute(_plan(2, [SlotInput(s, None, 2 * FRAME) for s in (0, 1)])).outputs
    assert not out[0].pcm.any()
    np.testing.assert_array_equal(out[1].pcm, tone(1, 0))


@pytest.mark.parametrize("delay_ms", [-80, 100, 250])
def test_delay_must_be_whole_frames(delay_ms: int) -> None:
    with pytest.raises(ConfigError):
        LoopbackRunner(ModelSpec(name="loopback"), delay_ms=delay_ms)


@pytest.mark.parametrize("every", [0, -80, 100])
def test_mark_spacing_must_be_whole_frames(every: int) -> None:
    with pytest.raises(ConfigError, match="mark_every_ms"):
        LoopbackRunner(SPEC, mark_every_ms=every)
