"""The event loop's lag: a sleeper observes how much later than asked it woke."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from duplex.metrics import MetricsRegistry
from duplex.topology._loop_lag import LAG_PERIOD_S, export_loop_lag, watch_loop_lag


async def test_a_loop_on_time_shows_no_lag_and_a_held_one_shows_how_long(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MetricsRegistry()
    cell = export_loop_lag(registry)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_loop_lag, cell)
        await trio.sleep(10 * LAG_PERIOD_S + LAG_PERIOD_S / 2)
        assert cell.count == 10 and cell.sum == 0.0  # woken each time as asked
        autojump_clock.jump(0.05)  # the loop held 50 ms (no task ran meanwhile)
        await trio.sleep(LAG_PERIOD_S / 2)  # (half-way between the sleeper's wake-ups)
        assert cell.count == 11 and cell.sum == pytest.approx(0.05 - LAG_PERIOD_S / 2)
        await trio.sleep(3 * LAG_PERIOD_S)
        assert cell.count == 14 and cell.sum == pytest.approx(0.05 - LAG_PERIOD_S / 2)  # back
        nursery.cancel_scope.cancel()
    text = registry.render()
    assert 'duplex_event_loop_lag_seconds_count{process="session"} 14' in text
