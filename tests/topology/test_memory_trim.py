"""Freed heap memory goes back to the system (`malloc_trim`), and the setting's bounds.

Real glibc, real allocations: memory freed in the middle of the heap (a live block after
it, as a session's leftovers sit after closed ones) stays in RSS until trimmed.
"""

from __future__ import annotations

import re

import pytest
import trio
import trio.testing

from duplex.config import load_config
from duplex.exceptions import ConfigError
from duplex.models import Slack
from duplex.topology._memory import TRIMS, _glibc, malloc_trim, trim_memory_every

from ..transport.test_e2e_workers import BASE, metrics_over_http
from ..transport.wsclient import running_server
from .test_e2e_engine_process import ON, sample

pytestmark = pytest.mark.skipif(_glibc() is None, reason="malloc_trim is glibc's")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        found = re.search(r"^VmRSS:\s*(\d+) kB", f.read(), re.M)
    assert found is not None
    return int(found.group(1)) / 1024


def fragment(mb: int) -> list[bytearray]:
    """``mb`` MB of heap blocks (over pymalloc's 512 bytes, under mmap's threshold), then
    nine in ten freed: what is left pins the heap's top, so none of it shrinks by itself."""
    blocks = [bytearray(4000) for _ in range(mb * 256)]
    kept = blocks[::10]
    blocks.clear()
    return kept


def test_a_trim_gives_back_what_the_heap_kept() -> None:
    malloc_trim()
    kept = fragment(64)
    held = rss_mb()
    assert malloc_trim() is True
    assert rss_mb() < held - 30  # most of the 57 MB freed
    assert malloc_trim() is False or rss_mb() < held - 30  # nothing more to give
    del kept


def test_the_server_trims_every_interval() -> None:
    """Nothing before the interval; given back once it has passed (trio's MockClock)."""
    malloc_trim()
    kept = fragment(64)
    held = rss_mb()
    seen: list[float] = []

    async def main() -> None:
        with trio.move_on_after(59.0):
            await trim_memory_every(60.0)
        seen.append(rss_mb())  # 59 s: not yet
        with trio.move_on_after(61.0):
            await trim_memory_every(60.0)
        seen.append(rss_mb())  # 61 s: trimmed once

    trims = TRIMS.count
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert TRIMS.count == trims + 1  # its duration, in duplex_malloc_trim_seconds
    assert seen[0] > held - 10
    assert seen[1] < held - 30
    del kept


async def test_beside_realtime_ticks_a_trim_waits_for_a_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """It holds malloc's lock, which a step's allocations would wait on: with the process's
    slack it runs between ticks, never during a step."""
    slack = Slack()
    slack.step_started()  # a realtime step runs from 0 s to 61 s
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trim_memory_every, 60.0, slack)
        await trio.sleep(61.0)
        assert slack.statistics().units == 0  # due at 60 s, it waited for the step
        slack.step_ended(trio.current_time() + 0.080)
        await trio.sleep(0.010)
        assert slack.statistics().units == 1  # and ran in the window after it
        nursery.cancel_scope.cancel()


async def test_zero_turns_it_off() -> None:
    with trio.fail_after(1):
        await trim_memory_every(0)


def test_the_interval_is_bounded() -> None:
    assert load_config(env={}, overrides={"server.malloc_trim_interval_s": 0}).server
    with pytest.raises(ConfigError, match="malloc_trim_interval_s"):
        load_config(env={}, overrides={"server.malloc_trim_interval_s": -1})
    with pytest.raises(ConfigError, match="malloc_trim_interval_s"):
        load_config(env={"DUPLEX_MALLOC_TRIM_INTERVAL_S": "1e9"})
    assert load_config(env={}).server.malloc_trim_interval_s == 60.0


async def test_each_process_exports_how_long_its_trims_take() -> None:
    """``duplex_malloc_trim_seconds``: the server's own trims (``process="session"``) and
    the engine process's (``process="engine"``), which reach it in the engine's status."""
    every_s = {"server.malloc_trim_interval_s": 1.0}
    async with running_server(**BASE, **ON, **every_s) as server:
        name = "duplex_malloc_trim_seconds_count"
        with trio.fail_after(30):
            while True:
                text = await metrics_over_http(server)
                session = sample(text, name, process="session")
                engine = sample(text, name, process="engine", engine="0")
                if session and engine and session >= 2 and engine >= 2:
                    break
                await trio.sleep(0.5)
        assert "# TYPE duplex_malloc_trim_seconds histogram" in text
        inf = sample(text, "duplex_malloc_trim_seconds_bucket", process="engine", engine="0",
                     le="+Inf")  # fmt: skip
        assert inf == sample(text, name, process="engine", engine="0")
        assert sample(text, "duplex_malloc_trim_seconds_sum", process="session") > 0
