"""Our Moshi LM against Kyutai's reference (``moshi==0.2.13``) on a recorded fixture.

``tests/fixtures/moshi_tiny`` was written by ``tools/moshi_parity.py``: random
``tiny`` weights under the official names, and the reference ``LMGen``'s greedy
output for two sessions of 80 frames of random user codes (the 64-frame KV
ring wraps). The reference is not imported here; regenerate the fixture with
the tool. PersonaPlex (``tiny-personaplex``) has no fixture: ``moshi==0.2.13``'s
``LMGen`` does not model its user lag or its 16-weight / 8-sampled depth steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from duplex.models.moshi import GREEDY, MoshiLM, MoshiRunner, load_lm, moshi_preset

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "moshi_tiny"
SESSIONS = ("a", "b")
TRACE_KEYS = ("user_codes", "text", "audio", "returned", "sampled_text", "sampled_audio")


@pytest.fixture(scope="module")
def meta() -> dict[str, object]:
    return json.loads((FIXTURE / "meta.json").read_text())


@pytest.fixture(scope="module")
def model(meta: dict[str, object]) -> MoshiLM:
    """The reference's weights, read by our loader (official names, bf16 -> float32)."""
    return load_lm(FIXTURE / "lm.safetensors", moshi_preset(str(meta["preset"])))


@pytest.fixture(scope="module")
def trace() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "trace.npz") as data:
        return {key: data[key] for key in data.files}


def session(trace: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    return {key: trace[f"{key}_{name}"] for key in TRACE_KEYS}


def teacher_forced_depth(
    model: MoshiLM, hidden: torch.Tensor, text: torch.Tensor, audio: torch.Tensor
) -> torch.Tensor:
    """``[T, agent_q, card]`` depth logits when each step is fed the reference's token."""
    logits: list[torch.Tensor] = []

    def forced(step: int, step_logits: torch.Tensor) -> torch.Tensor:
        logits.append(step_logits)
        return audio[:, step]

    model.depth_step(hidden, text, forced)
    return torch.stack(logits, dim=1)


def test_fixture_is_the_reference_tiny_loop(
    meta: dict[str, object], trace: dict[str, np.ndarray]
) -> None:
    config = moshi_preset("tiny")
    assert meta["moshi_version"] == "0.2.13"
    assert meta["preset"] == "tiny"
    kwargs = meta["reference_kwargs"]
    assert isinstance(kwargs, dict)
    assert kwargs["delays"] == list(config.delays) and kwargs["dep_q"] == config.agent_q
    frames = int(str(meta["frames"]))
    assert frames > config.context  # the ring wraps inside the trace
    for name in SESSIONS:
        s = session(trace, name)
        assert s["user_codes"].shape == (frames, config.user_q)
        assert s["audio"].shape == s["sampled_audio"].shape == (frames, config.agent_q)
        # LMGen.step returns None for its first max_delay frames, tokens afterwards.
        assert s["returned"].tolist() == [n >= config.max_delay for n in range(frames)]
        assert len(set(s["sampled_text"].tolist())) > 10  # greedy output is not degenerate
    assert float(str(meta["min_greedy_margin"])) > 1e-3


def test_logits_match_the_reference_teacher_forced(
    model: MoshiLM, trace: dict[str, np.ndarray]
) -> None:
    """Same numbers, not just the same argmax: our oracle pass on the reference's tokens."""
    config = model.config
    for name in SESSIONS:
        s = session(trace, name)
        codes = torch.from_numpy(s["user_codes"])
        text = torch.from_numpy(s["sampled_text"])
        audio = torch.from_numpy(s["sampled_audio"])
        frames = len(codes)
        # Temporal input at frame t: start tokens while t <= delay, then the model's own
        # (column-layout) tokens chosen at frame t - 1 and the user's codes of frame t - delay.
        columns = torch.tensor(model.initial_tokens).repeat(frames, 1)
        for k, delay in enumerate(config.delays):
            if k == 0:
                source = torch.cat([text[:1], text[:-1]])
            elif k <= config.agent_q:
                source = torch.cat([audio[:1, k - 1], audio[:-1, k - 1]])
            else:
                source = codes[:, k - 1 - config.agent_q].roll(delay)
            columns[delay + 1 :, k] = source[delay + 1 :]
        hidden, text_logits = model.forward_sequence(columns[None])
        expected_text = torch.from_numpy(trace[f"text_logits_{name}"])
        torch.testing.assert_close(text_logits[0], expected_text, atol=1e-4, rtol=1e-4)
        depth_logits = teacher_forced_depth(model, hidden[0], text, audio)
        expected_depth = torch.from_numpy(trace[f"depth_logits_{name}"])
        torch.testing.assert_close(depth_logits, expected_depth, atol=1e-4, rtol=1e-4)


def test_runner_tokens_equal_the_reference_in_shared_slots(
    model: MoshiLM, trace: dict[str, np.ndarray]
) -> None:
    """Both sessions at once: ``a`` in slot 2 from tick 0, ``b`` in slot 0 from tick 3.

    Every frame's de-delayed output, valid flag and undelayed choice equal
    ``LMGen.step``'s, so parity holds per slot while another slot runs other
    input at another frame index (slot 1 stays idle with garbage in its ring).
    """
    placement = {"a": (2, 0), "b": (0, 3)}  # session -> (slot, first tick)
    sessions = {name: session(trace, name) for name in SESSIONS}
    frames = len(sessions["a"]["user_codes"])
    runner = MoshiRunner(model, max_slots=3)
    runner.kv_ring.keys[:, 1] = float("nan")
    for slot, _start in placement.values():
        runner.reset_slot(slot, GREEDY)
    got: dict[str, dict[str, list[object]]] = {
        name: {"text": [], "audio": [], "valid": [], "sampled_text": [], "sampled_audio": []}
        for name in SESSIONS
    }
    for tick in range(frames + max(start for _slot, start in placement.values())):
        live = [n for n, (_slot, start) in placement.items() if start <= tick < start + frames]
        live.sort(key=lambda n: -placement[n][0])  # rows out of slot order
        batch = torch.stack(
            [torch.from_numpy(sessions[n]["user_codes"][tick - placement[n][1]]) for n in live]
        )
        out = runner.step([placement[n][0] for n in live], batch)
        for row, name in enumerate(live):
            got[name]["text"].append(int(out.text[row]))
            got[name]["audio"].append(out.audio[row].tolist())
            got[name]["valid"].append(bool(out.valid[row]))
            got[name]["sampled_text"].append(int(out.sampled_text[row]))
            got[name]["sampled_audio"].append(out.sampled_audio[row].tolist())
    for name in SESSIONS:
        ref, mine = sessions[name], got[name]
        for frame in range(frames):
            expected = (
                int(ref["text"][frame]),
                ref["audio"][frame].tolist(),
                bool(ref["returned"][frame]),
                int(ref["sampled_text"][frame]),
                ref["sampled_audio"][frame].tolist(),
            )
            actual = tuple(mine[key][frame] for key in mine)
            assert actual == expected, f"session {name}, frame {frame}"
