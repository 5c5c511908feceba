"""Startup progress: steps, notes from inside them (threads too), and the periodic line."""

from __future__ import annotations

import io
import os
import pty
import select
import sys
from functools import partial

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from duplex.logs import configure_logging, get_logger
from duplex.progress import Startup, TerminalBar, active_bar, note, render_line
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
            nursery.start_soon(partial(log_startup_progress, startup, 5.0, bar=False))
            with startup.step("engine", "loading model moshi-7b"):
                await trio.sleep(12.0)
    lines = [line for line in logs if line["event"] == "still starting"]
    assert [line["elapsed_s"] for line in lines] == [5.0, 10.0]
    assert lines[0]["waiting_for"] == {"engine": "loading model moshi-7b"}


def test_a_status_line_names_each_step_and_draws_a_bar_where_it_can() -> None:
    now = [0.0]
    startup = Startup(clock=lambda: now[0])
    with startup.step("engine", "building model tiny"):
        note("capturing Mimi's CUDA graphs: bucket 4 (3 of 8)", done=2, total=8)
        now[0] = 12.4
        with startup.step("vad", "loading"):  # a second step, without a fraction
            line = render_line(startup, width=200, frame=1)
            assert line == (
                "/ starting 12s  engine: [#####---------------] 2/8 capturing Mimi's CUDA "
                "graphs: bucket 4 (3 of 8) | vad: loading"
            )
            assert render_line(startup, width=30) == "| starting 12s  engine: [####~"
        note("model loaded")  # no fraction: no bar
        assert startup.fractions() == {}
        with pytest.raises(ValueError, match="both"):
            note("half", done=1)


def test_lines_written_meanwhile_go_above_the_bar() -> None:
    out = io.StringIO()
    with TerminalBar(out) as bar:
        assert active_bar() is bar
        bar.write_above("before any bar\n")  # nothing drawn yet: as is
        bar.draw("| starting 1s")
        bar.write_above("a log line")  # print writes the line, then its newline
        bar.draw("/ starting 2s")  # (from another thread mid-line: kept for later)
        bar.write_above("\n")
    assert active_bar() is None
    clear = TerminalBar.CLEAR
    assert out.getvalue() == (
        f"before any bar\n{clear}| starting 1s{clear}a log line\n/ starting 2s{clear}"
    )


async def test_a_terminal_gets_a_bar_and_log_lines_above_it(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a pseudo-terminal: the bar is redrawn in place, a log line written meanwhile
    stays whole on its own line, and the bar is erased when the startup is done; no
    ``still starting`` lines."""
    main, side = pty.openpty()
    terminal = open(side, "w", buffering=1, closefd=True)  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stderr", terminal)
    configure_logging("console", "info")
    startup = Startup(clock=trio.current_time)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log_startup_progress, startup, 5.0)
            with startup.step("engine", "loading model moshi-7b"):
                await trio.sleep(1.0)
                get_logger(component="model").info("weights read", files=3)
                for i in range(1, 5):
                    note(f"capturing bucket {i}", done=i - 1, total=4)
                    await trio.sleep(1.0)
            await trio.sleep(1.0)
        terminal.flush()
        seen = _read_all(main)
    finally:
        terminal.close()
        os.close(main)
    clear = "\r\x1b[K"
    assert "still starting" not in seen
    assert f"{clear}| starting 0s  engine: loading model moshi-7b" in seen
    assert "[###############-----] 3/4 capturing bucket 4" in seen
    # the log line replaced the bar on its line, then the bar came back below it
    (log_line,) = [line for line in seen.split("\n") if "weights read" in line]
    assert log_line.startswith(clear) and "starting" not in log_line.split(clear)[-1]
    assert seen.endswith(clear)  # erased: what follows starts on a clean line


def _read_all(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode().replace("\r\n", "\n")  # the terminal's newline
