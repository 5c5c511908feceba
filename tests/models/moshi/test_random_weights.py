"""``--random-weights``: a preset built from the seed on the device, through the runner the
checkpoints use; refused where it makes no sense; named when 7B weights are missing.

Only the tiny presets are built here: a 7B preset is resolved (spec, factory) but never
built on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from duplex.exceptions import ConfigError, PromptUnsupported
from duplex.models import Engine, ModelOptions, SlotPrompt, get_model
from duplex.models.moshi._checkpoint import build_tiny_checkpoint, random_moshi
from duplex.models.moshi._engine_runner import MoshiEngineRunner
from duplex.models.moshi._models import moshi_spec

from ..models_support import FakeTimer, tone


def _outputs(seed: int, frames: int = 4, *, prepared: bool = False) -> list[tuple[bytes, str]]:
    loaded = random_moshi("tiny", seed)
    runner = MoshiEngineRunner(loaded, moshi_spec("tiny"), seed=0)
    if prepared:
        runner.prepare_graphs()
    engine = Engine(runner, timer=FakeTimer())
    handle = engine.acquire_slot("a")
    assert handle is not None
    out = []
    for k in range(frames):
        engine.push_input(handle, tone(1, k))
        step = engine.step(float(k))[handle]
        out.append((step.pcm16, step.frame.text))
    return out


def test_random_weights_are_seeded_and_run_through_the_engine_runner() -> None:
    first, again, other = _outputs(5), _outputs(5), _outputs(6)
    assert first == again
    assert first != other
    assert any(np.frombuffer(pcm, "<i2").any() for pcm, _ in first[1:])


def test_random_lm_on_a_device_keeps_the_law() -> None:
    loaded = random_moshi("tiny", 3, device="cpu", lm_dtype=torch.float32)
    assert loaded.checkpoint is None and loaded.lm.text_emb.weight.device.type == "cpu"
    weight = loaded.lm.text_emb.weight
    assert abs(float(weight.std()) * weight.shape[-1] ** 0.5 - 1.0) < 0.1


def test_tiny_with_random_weights_writes_nothing(tmp_path: Path) -> None:
    options = ModelOptions(cache_dir=tmp_path, random_weights=True, seed=4)
    spec, factory = get_model("tiny", options)
    runner = factory(spec)
    assert spec.name == "tiny" and runner.spec == spec
    assert list(tmp_path.iterdir()) == []  # the tiny cache was neither read nor written


def test_a_prompted_random_preset_encodes_text_and_has_no_voices() -> None:
    loaded = random_moshi("tiny-personaplex", 2)
    runner = MoshiEngineRunner(loaded, moshi_spec("tiny-personaplex"), seed=0)
    engine = Engine(runner, timer=FakeTimer())
    handle = engine.acquire_slot("a", SlotPrompt(text="hello there"))
    assert handle is not None
    engine.step(0.0)
    replay = runner.replay(handle.slot)
    assert replay is not None and replay.held > 0
    with pytest.raises(PromptUnsupported, match="random weights"):
        runner.check_prompt(SlotPrompt(voice="alice"))


def test_7b_presets_resolve_without_weights_and_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match="--random-weights"):
        get_model("moshi-7b")
    for name in ("moshi-7b", "personaplex-7b"):
        spec, _factory = get_model(name, ModelOptions(random_weights=True))  # not called
        assert spec.name == name and spec.max_slots == 32


def test_random_weights_are_refused_for_loopback_and_folders(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'loopback' has no weights"):
        get_model("loopback", ModelOptions(random_weights=True))
    folder = build_tiny_checkpoint(tmp_path / "ckpt", seed=1).folder
    for name in (str(folder), f"tiny:{folder}"):
        with pytest.raises(ConfigError, match="checkpoint folder"):
            get_model(name, ModelOptions(random_weights=True))


def test_preparing_every_bucket_up_front_changes_no_output() -> None:
    """`prepare_graphs` (CUDA graph capture at engine start; on the CPU the buckets'
    buffers) steps no slot: a session's output is the same as with lazy buckets."""
    assert _outputs(5, prepared=True) == _outputs(5)
