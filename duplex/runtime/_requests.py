"""`RequestEngines`: this process's request-batched models, looked up by name.

An endpoint (robots, speech, images, videos) holds this registry, never an
engine: a supervised engine is replaced when it crashes, and when engines run
in engine processes the engine is a remote one over the link to the process
that hosts it. A name is in one of three states, and an endpoint answers each
differently:

- not configured (``name not in engines.configured``): "not loaded";
- configured, not running (starting, or its engine process restarting): retry;
- running (``engines.get(name)`` is a `RequestService`).

The registry also exports every engine's counters once, labelled ``runner``,
whichever engine (local or remote, first or restarted) serves the name now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, final

import trio

from duplex.metrics import MetricsRegistry, Sample
from duplex.models import REQUEST_METRICS, Completed, Priority, RequestEngineStatistics

__all__ = ["RequestEngines", "RequestService"]


class RequestService(Protocol):
    """What an endpoint calls: a `duplex.models.RequestEngine`, or a remote one."""

    @property
    def name(self) -> str: ...

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    async def submit(self, request: Any, *, priority: Priority = Priority.BATCH) -> Any: ...

    async def submit_timed(
        self, request: Any, *, priority: Priority = Priority.BATCH
    ) -> Completed[Any]: ...

    def retry_after_s(self) -> float: ...

    def statistics(self) -> RequestEngineStatistics | None: ...


@final
class RequestEngines:
    """The request engines that serve each configured name in this process.

    Args:
        configured: the names this server serves (the others are "not loaded").
        registry: where their metrics go (``None``: nowhere).
    """

    def __init__(self, configured: Iterable[str], registry: MetricsRegistry | None = None) -> None:
        self.configured = frozenset(configured)
        self._services: dict[str, list[RequestService]] = {}
        """name -> the engines serving it, oldest first (several engine processes may host
        one; the oldest takes the requests, so they batch together)."""
        self._changed = trio.Event()
        if registry is not None:
            for metric, kind, help_text in REQUEST_METRICS:
                registry.add_collector(metric, kind, help_text, self._sampler(metric))

    def get(self, name: str) -> RequestService | None:
        """The engine serving ``name`` now (``None``: not configured, or not running)."""
        services = self._services.get(name)
        return services[0] if services else None

    async def started(self, service: RequestService, *, replaces: bool = True) -> None:
        """A (new) engine serves its name: requests use it from their next submit.

        ``replaces``: it takes over from the one it restarts (a supervised engine's fresh
        instance); ``False``: it joins the others (one more engine process hosting it).
        """
        services = self._services.setdefault(service.name, [])
        if replaces:
            services.clear()
        services.append(service)
        self._changed.set()
        self._changed = trio.Event()

    def stopped(self, service: RequestService) -> None:
        """``service`` no longer runs (its engine process went away); the others stay."""
        services = self._services.get(service.name, [])
        if service in services:
            services.remove(service)

    async def wait(self, name: str) -> RequestService:
        """The engine serving ``name``, once one runs."""
        while (service := self.get(name)) is None:
            await self._changed.wait()
        return service

    def _sampler(self, metric: str) -> Callable[[], list[Sample]]:
        def collect() -> list[Sample]:
            samples = []
            for name, services in sorted(self._services.items()):
                if not services:
                    continue
                statistics = services[0].statistics()
                value = None if statistics is None else statistics.metric(metric)
                if value is not None:
                    samples.append(Sample(metric, {"runner": name}, value))
            return samples

        return collect
