"""ConnectionLatency: what the writer times, from the events it sends (no sockets)."""

from __future__ import annotations

import pytest

from duplex.metrics import MetricsRegistry
from duplex.sessions import AudioDelta, InputSpeechStopped, ResponseCreated
from duplex.transport._latency import LatencyMetrics

DELTA = AudioDelta("resp_1", "item_1", 0, b"\0\0", 24000, 0.0)


def test_output_delay_from_the_push_and_ttfa_from_the_end_of_speech() -> None:
    metrics = LatencyMetrics(MetricsRegistry(), "m")
    conn = metrics.connection("/v1/realtime")
    assert conn is not None
    conn.written(InputSpeechStopped(item_id="item_0", audio_end_ms=900.0), None, 10.0)
    conn.written(ResponseCreated("resp_1", "item_1", 0), None, 10.2)
    conn.written(DELTA, 10.3, 10.5)  # the first delta: 0.5 s after the speech stopped
    conn.written(DELTA, 10.4, 10.52)
    cells = metrics._by_endpoint["/v1/realtime"]
    assert cells.first_audio.count == 1 and cells.first_audio.sum == pytest.approx(0.5)
    assert cells.output_delay.count == 2
    assert cells.output_delay.sum == pytest.approx(0.2 + 0.12)
    assert metrics._by_endpoint["/v1/duplex"].output_delay.count == 0


def test_ttfa_without_speech_runs_from_response_created_once_per_response() -> None:
    metrics = LatencyMetrics(MetricsRegistry(), "m")
    conn = metrics.connection("/v1/duplex")
    assert conn is not None
    conn.written(DELTA, None, 1.0)  # audio outside a response we saw open: not timed
    conn.written(ResponseCreated("resp_1", "item_1", 0), None, 2.0)
    conn.written(DELTA, None, 2.25)
    conn.written(DELTA, None, 2.5)
    cells = metrics._by_endpoint["/v1/duplex"]
    assert cells.first_audio.count == 1 and cells.first_audio.sum == pytest.approx(0.25)
    assert cells.output_delay.count == 0  # no input time: an underrun's frame


def test_unknown_endpoint_is_not_timed() -> None:
    assert LatencyMetrics(MetricsRegistry(), "m").connection(None) is None
