"""Startup progress: steps, notes from inside them (threads too), and the periodic line."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from duplex.progress import Startup, note
from duplex.topology._server import log_startup_progress


def test_steps_and_notes() -> None:
    startup = Startup(clock=iter([0.0, 1.0, 3.5, 4.0]).__next__)
    note("outside any step")  # ignored
    assert startup.done
    with startup.step("engine", "building model tiny"):
        assert startup.waiting_for() == {"engine": "building model tiny"}
        note("capturing the LM step's CUDA graphs: bucket 4 (3 of 8)")
        assert startup.waiting_for() == {
            "engine": "capturing the LM step's CUDA graphs: bucket 4 (3 of 8)"
        }
        assert not startup.done
    assert startup.done and startup.finished == {"engine": 2.5}
    note("after the step")  # an engine rebuilt later does not reopen the step
    assert startup.waiting_for() == {}


def test_a_failed_step_ends_too() -> None:
    startup = Startup()
    with pytest.raises(RuntimeError), startup.step("engine", "loading"):
        raise RuntimeError("no such file")
    assert startup.done
    with (
        startup.step("engine", "again"),
        pytest.raises(ValueError, match="already running"),
        startup.step("engine", "twice"),
    ):
        pass


async def test_a_note_from_a_worker_thread_reaches_the_step() -> None:
    startup = Startup()
    with startup.step("engine", "building"):
        await trio.to_thread.run_sync(note, "loading weights")  # the context goes along
        assert startup.waiting_for() == {"engine": "loading weights"}


async def test_a_line_each_interval_while_waiting(autojump_clock: trio.testing.MockClock) -> None:
    startup = Startup(clock=trio.current_time)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log_startup_progress, startup, 5.0)
            with startup.step("engine", "loading model moshi-7b"):
                await trio.sleep(12.0)
    lines = [line for line in logs if line["event"] == "still starting"]
    assert [line["elapsed_s"] for line in lines] == [5.0, 10.0]
    assert lines[0]["waiting_for"] == {"engine": "loading model moshi-7b"}
