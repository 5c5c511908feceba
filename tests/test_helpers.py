"""The test helpers read what they claim to: label-subset sums and exact samples of a
scrape, a malformed exposition refused, a wait that ends on its condition or fails
naming it, a free port that is free."""

from __future__ import annotations

import os
import socket

import pytest
import trio
import trio.testing

from duplex.metrics import MetricsRegistry

from .helpers import HOST, free_port, parse_metrics, process_tree, wait_until

TEXT = """\
# HELP duplex_requests_total Requests
# TYPE duplex_requests_total counter
duplex_requests_total{runner="tts",priority="batch"} 3
duplex_requests_total{runner="tts",priority="realtime"} 4
duplex_requests_total{runner="image",priority="batch"} 5
# HELP duplex_sessions_live Live sessions
# TYPE duplex_sessions_live gauge
duplex_sessions_live 2
# HELP duplex_step_seconds Step time
# TYPE duplex_step_seconds histogram
duplex_step_seconds_bucket{le="0.1"} 1
duplex_step_seconds_bucket{le="+Inf"} 2
duplex_step_seconds_sum 0.3
duplex_step_seconds_count 2
"""


def test_sum_adds_the_samples_whose_labels_include_the_asked_ones() -> None:
    metrics = parse_metrics(TEXT)
    assert metrics.sum("duplex_requests_total") == 12
    assert metrics.sum("duplex_requests_total", runner="tts") == 7
    assert metrics.sum("duplex_requests_total", runner="tts", priority="batch") == 3
    assert metrics.sum("duplex_requests_total", runner="video") == 0.0  # none yet
    assert metrics.sum("duplex_sessions_live") == 2
    assert metrics.sum("duplex_step_seconds_count") == 2


def test_one_is_the_sample_with_exactly_those_labels() -> None:
    metrics = parse_metrics(TEXT)
    assert metrics.one("duplex_sessions_live") == 2
    assert metrics.one("duplex_requests_total", priority="realtime", runner="tts") == 4
    assert metrics.one("duplex_requests_total", runner="tts") is None  # a subset: not one
    assert metrics.one("duplex_sessions_live", shard="0") is None
    assert "duplex_step_seconds_bucket" in metrics.names()


def test_a_malformed_exposition_fails_the_read() -> None:
    with pytest.raises(ValueError):
        parse_metrics("duplex_sessions_live{runner=tts} 2\n")


def test_the_servers_own_exposition_parses() -> None:
    registry = MetricsRegistry()
    registry.counter("duplex_things_total", "Things", ["kind"]).inc(3, kind="a")
    assert parse_metrics(registry.render()).one("duplex_things_total", kind="a") == 3


async def test_wait_until_returns_once_the_condition_holds() -> None:
    seen: list[float] = []

    async def later() -> None:
        await trio.sleep(0.5)
        seen.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        await wait_until(lambda: bool(seen), timeout_s=5)
    assert seen


async def test_wait_until_takes_an_async_condition() -> None:
    calls = 0

    async def third_time() -> bool:
        nonlocal calls
        calls += 1
        return calls == 3

    await wait_until(third_time, timeout_s=5, poll_s=0.001)
    assert calls == 3


async def test_wait_until_fails_naming_what_it_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(AssertionError, match="the door opens"):
        await wait_until(lambda: False, timeout_s=3, what="the door opens")
    assert trio.current_time() == pytest.approx(3, abs=0.05)


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind((HOST, port))


def test_the_process_tree_starts_at_its_root() -> None:
    assert process_tree(os.getpid())[0] == os.getpid()
