"""``auto`` connection workers and session shards: chosen from cores, slots and device."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.cli import main
from duplex.config import load_config
from duplex.exceptions import ConfigError
from duplex.topology._layout import Layout, layout, resolve_layout


def test_one_h200_of_146_slots_on_16_cores_gets_the_layout_that_held_128() -> None:
    chosen = layout(16, 146, "cuda")
    assert (chosen.connection_workers, chosen.session_shards) == (4, 2)


@pytest.mark.parametrize(
    ("cores", "slots", "device", "expected"),
    [
        (2, 256, "cpu", (0, 1)),  # a CPU model: one process, however many slots
        (64, 10_000, "cpu", (0, 1)),
        (16, 64, "cuda", (0, 1)),  # the session process carries 64 alone
        (16, 65, "cuda:0", (2, 1)),
        (16, 300, "cuda", (8, 4)),
        (3, 146, "cuda", (0, 1)),  # 2 spare cores: no room for a worker and a shard
        (4, 146, "cuda", (2, 1)),  # 3 spare: one shard (the server process) and 2 workers
        (32, 292, "cuda:0,cuda:1", (8, 4)),  # two engines of 146
        (128, 100_000, "cuda", (16, 8)),  # the caps
    ],
)
def test_layout_by_cores_slots_and_device(
    cores: int, slots: int, device: str, expected: tuple[int, int]
) -> None:
    chosen = layout(cores, slots, device)
    assert (chosen.connection_workers, chosen.session_shards) == expected
    assert chosen.reason


DEVICES = st.sampled_from(["cpu", "cuda", "cuda:0,cuda:1"])


@given(st.integers(1, 256), st.integers(0, 5000), DEVICES)
def test_a_layout_is_always_servable_and_fits_the_cores(
    cores: int, slots: int, device: str
) -> None:
    chosen = layout(cores, slots, device)
    engines = 0 if device == "cpu" else len(device.split(","))
    assert 1 <= chosen.session_shards <= 8 and 0 <= chosen.connection_workers <= 16
    if chosen.session_shards > 1:
        assert chosen.connection_workers >= 1  # the workers route to the shards
    if chosen.connection_workers or chosen.session_shards > 1:
        assert chosen.connection_workers + chosen.session_shards + engines <= cores
    more = layout(cores, slots + 75, device)  # more slots never means fewer processes
    assert more.session_shards >= chosen.session_shards


def resolve(slots: int, cores: int, **overrides: object) -> tuple[int | str, int | str, Layout]:
    config = load_config(env={}, overrides=overrides)
    resolved, chosen = resolve_layout(config, slots=slots, cores=cores)
    server = resolved.server
    return server.connection_workers, server.session_shards, chosen


def test_auto_is_resolved_and_numbers_given_are_kept() -> None:
    gpu = {"server.model_device": "cuda"}  # loaded, never served: no GPU is needed
    assert resolve(146, 16, **gpu)[:2] == (4, 2)
    assert resolve(146, 16)[:2] == (0, 1)  # the CPU default: one process
    assert resolve(146, 16, **gpu, **{"server.connection_workers": 6})[:2] == (6, 2)
    assert resolve(146, 16, **gpu, **{"server.session_shards": 1})[:2] == (4, 1)
    # no workers asked for: auto shards stay at one (shards need workers)
    assert resolve(146, 16, **gpu, **{"server.connection_workers": 0})[:2] == (0, 1)
    # shards asked for on the CPU: auto workers give them one
    assert resolve(0, 2, **{"server.session_shards": 2})[:2] == (1, 2)
    # the engine inside the session process cannot be split
    off = {**gpu, "server.engine_process": "off"}
    workers, shards, chosen = resolve(146, 16, **off)
    assert (workers, shards) == (0, 1) and "session process" in chosen.reason
    both = {"server.connection_workers": 3, "server.session_shards": 2}
    assert resolve(146, 16, **gpu, **both) == (3, 2, Layout(3, 2, "as configured"))


def test_explicit_shards_that_cannot_run_are_still_refused() -> None:
    overrides = {"server.model_device": "cuda", "server.engine_process": "off"}
    with pytest.raises(ConfigError, match="each shard runs its own engine"):
        load_config(env={}, overrides={**overrides, "server.session_shards": 2})


def test_serve_help_says_auto(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--connection-workers N|auto" in text and "--session-shards K|auto" in text
    assert "default auto" in text
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--connection-workers", "some", "--port", "0"])
    assert refused.value.code == 2
    assert "must be a number or auto, got 'some'" in capsys.readouterr().err
