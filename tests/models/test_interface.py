from __future__ import annotations

import numpy as np
import pytest

from duplex.exceptions import ConfigError, UnknownModel
from duplex.models import (
    LOOPBACK_SPEC,
    FrameOutput,
    LoopbackRunner,
    ModelOptions,
    ModelSpec,
    SlotInput,
    StepOutput,
    StepPlan,
    VideoFrame,
    get_model,
    model_names,
    register_model,
)

FRAME = 1920


def _frame(value: float = 0.5) -> np.ndarray:
    return np.full(FRAME, value, dtype=np.float32)


def test_spec_defaults_are_80ms_at_24khz() -> None:
    spec = ModelSpec(name="x")
    assert (spec.sample_rate, spec.frame_samples, spec.frame_ms) == (24_000, 1_920, 80)
    assert spec.frame_period_s == pytest.approx(0.08)


@pytest.mark.parametrize(
    "kwargs", [{"name": ""}, {"name": "x", "max_slots": 0}, {"name": "x", "frame_samples": 1}]
)
def test_spec_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ModelSpec(**kwargs)  # type: ignore[arg-type]


def test_plan_requires_one_input_per_live_slot_in_order() -> None:
    inputs = (SlotInput(0, _frame(), 0), SlotInput(2, None, 0))
    plan = StepPlan(0, FRAME, (2,), (0,), (1,), inputs)
    assert plan.live_slots == (0, 2)
    with pytest.raises(ValueError):
        StepPlan(0, FRAME, (0, 2), (), (), inputs[::-1])
    with pytest.raises(ValueError):
        StepPlan(0, FRAME, (0,), (2,), (2,), inputs)
    with pytest.raises(ValueError):
        StepPlan(0, FRAME, (0,), (), (), (SlotInput(0, _frame()[:10], 0),))
    with pytest.raises(TypeError):
        StepPlan(0, FRAME, (0,), (), (), (SlotInput(0, np.zeros(FRAME), 0),))


def test_output_check_matches_plan() -> None:
    plan = StepPlan(0, FRAME, (1,), (), (), (SlotInput(1, None, 0),))
    StepOutput((FrameOutput(1, _frame()),)).check(plan)
    with pytest.raises(ValueError):
        StepOutput((FrameOutput(2, _frame()),)).check(plan)
    with pytest.raises(ValueError):
        StepOutput((FrameOutput(1, _frame()[:5]),)).check(plan)


def test_reprs_carry_no_audio_text_or_image_bytes() -> None:
    video = VideoFrame("f1", 40, b"SECRET-IMAGE")
    plan = StepPlan(0, FRAME, (0,), (), (), (SlotInput(0, _frame(0.123), 0, (video,)),))
    out = FrameOutput(0, _frame(0.123), text="secret words", speaking=True)
    for text in (repr(plan), repr(out)):
        assert "0.123" not in text and "SECRET" not in text and "secret" not in text
    assert "f1" in repr(plan)


def test_registry_has_loopback_and_rejects_unknown_and_duplicates() -> None:
    spec, factory = get_model("loopback")
    assert spec == LOOPBACK_SPEC and spec.supports_video_input
    assert isinstance(factory(spec), LoopbackRunner)
    assert "loopback" in model_names()
    with pytest.raises(UnknownModel, match="loopback"):
        get_model("nope")
    with pytest.raises(LookupError):
        get_model("nope")
    with pytest.raises(ValueError):
        register_model(LOOPBACK_SPEC, factory)


def test_loopback_delay_comes_from_the_options_and_is_checked_when_resolved() -> None:
    spec, factory = get_model("loopback", ModelOptions(loopback_delay_ms=80))
    runner = factory(spec)
    assert isinstance(runner, LoopbackRunner) and runner.delay_frames == 1
    with pytest.raises(ConfigError, match="delay_ms"):
        get_model("loopback", ModelOptions(loopback_delay_ms=100))
