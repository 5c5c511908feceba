"""Latency histograms timed where an event leaves for its socket: the connection's writer.

Two, labelled by model and endpoint (the route's path):

- ``duplex_output_delay_seconds``: per audio frame, from the push of the input
  frame its engine tick consumed (`Outbound.input_at`, stamped by the session
  actor) to the write of the ``response.audio.delta`` that tick produced: the
  wait in the engine's input queue, the step, the session and the write. The
  model's own algorithmic delay (the loopback's echo delay, Moshi's acoustic
  delay) is not in it: that is which frame answers, not how late it is sent.
- ``duplex_time_to_first_audio_seconds``: per response, from the end of the
  user's speech (the last ``input_audio_buffer.speech_stopped`` written before
  the response began; without one, ``response.created``) to the response's
  first audio delta.

With connection workers the write is the hand-off to the worker's link, so the
worker's own send is not in these figures.
"""

from __future__ import annotations

from typing import final

from duplex.metrics import HistogramCell, MetricsRegistry
from duplex.sessions import AudioDelta, InputSpeechStopped, ResponseCreated, ServerEvent

__all__ = ["LATENCY_HISTOGRAMS", "ConnectionLatency", "EndpointLatency", "LatencyMetrics"]

OUTPUT_DELAY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.0, 5.0,
)  # fmt: skip
TTFA_BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip

ENDPOINTS = ("/v1/duplex", "/v1/realtime")

LATENCY_HISTOGRAMS: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    (
        "duplex_output_delay_seconds",
        "Per audio frame: input frame pushed to the engine until the audio of its tick is "
        "written to the socket",
        OUTPUT_DELAY_BUCKETS,
    ),
    (
        "duplex_time_to_first_audio_seconds",
        "Per response: end of the user's speech (else response.created) until its first "
        "audio delta is written",
        TTFA_BUCKETS,
    ),
)
"""(name, help, buckets); labels ``model`` and ``endpoint``."""


@final
class EndpointLatency:
    """The two histogram cells of one endpoint, shared by its connections."""

    __slots__ = ("first_audio", "output_delay")

    def __init__(self, output_delay: HistogramCell, first_audio: HistogramCell) -> None:
        self.output_delay = output_delay
        self.first_audio = first_audio


@final
class LatencyMetrics:
    """The histograms, with a cell per endpoint made up front (so a scrape shows them at 0)."""

    def __init__(self, registry: MetricsRegistry, model: str) -> None:
        (delay_name, delay_help, delay_b), (ttfa_name, ttfa_help, ttfa_b) = LATENCY_HISTOGRAMS
        delay = registry.histogram(delay_name, delay_help, ["model", "endpoint"], delay_b)
        ttfa = registry.histogram(ttfa_name, ttfa_help, ["model", "endpoint"], ttfa_b)
        self.model = model
        self._by_endpoint = {
            path: EndpointLatency(
                delay.labels(model=model, endpoint=path), ttfa.labels(model=model, endpoint=path)
            )
            for path in ENDPOINTS
        }

    def connection(self, endpoint: str | None) -> ConnectionLatency | None:
        """A new socket's timer (``None`` for a path with no histograms)."""
        cells = self._by_endpoint.get(endpoint or "")
        return None if cells is None else ConnectionLatency(cells)


@final
class ConnectionLatency:
    """One socket's response timing: the writer calls `written` after each event it sent."""

    __slots__ = ("_awaiting_audio", "_cells", "_response_from", "_speech_stopped_at")

    def __init__(self, cells: EndpointLatency) -> None:
        self._cells = cells
        self._speech_stopped_at: float | None = None
        self._response_from: float | None = None
        self._awaiting_audio = False

    def written(self, event: ServerEvent, input_at: float | None, now: float) -> None:
        if isinstance(event, AudioDelta):
            if input_at is not None:
                self._cells.output_delay.observe(now - input_at)
            if self._awaiting_audio:
                self._awaiting_audio = False
                assert self._response_from is not None
                self._cells.first_audio.observe(now - self._response_from)
        elif isinstance(event, InputSpeechStopped):
            self._speech_stopped_at = now
        elif isinstance(event, ResponseCreated):
            stopped, self._speech_stopped_at = self._speech_stopped_at, None
            self._response_from = now if stopped is None else stopped
            self._awaiting_audio = True
