"""A small metrics registry (counters, gauges, histograms) rendered as Prometheus text.

Hot paths keep plain integer counters in their own ``statistics()`` records; the
registry reads them through *collectors* at scrape time, so a message send never
touches a label dictionary.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import final

LabelValues = tuple[str, ...]

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sample:
    """One exported value: what a collector yields at scrape time."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Family:
    """One metric's samples at a scrape, with its type and help: what ``render`` prints."""

    name: str
    kind: str
    help: str
    samples: list[Sample]


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()):
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)

    def _key(self, labels: dict[str, str]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def samples(self) -> Iterable[Sample]:
        raise NotImplementedError


class _Scalar(_Metric):
    """One float per label set: what counters and gauges share."""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help, labelnames)
        self._values: dict[LabelValues, float] = {}

    def _add(self, amount: float, labels: dict[str, str]) -> None:
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> Iterable[Sample]:
        for key, v in sorted(self._values.items()):
            yield Sample(self.name, dict(zip(self.labelnames, key, strict=True)), v)


@final
class Counter(_Scalar):
    """A monotonically increasing count."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self._add(amount, labels)


@final
class Gauge(_Scalar):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._add(-amount, labels)


@final
class HistogramCell:
    """One label set's bucket counts and sum: what a hot path holds.

    An observation is a bisect, one list increment and one addition: no label
    lookup, no dictionary, no new object beyond the numbers themselves. Bucket
    ``i`` counts values ``<= buckets[i]`` (and above ``buckets[i - 1]``); the last
    counts the rest (``+Inf``). A scrape reads the counts without a lock; an
    observation made meanwhile lands in this scrape or the next, and ``_count`` is
    always the ``+Inf`` bucket.
    """

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


@final
class Histogram(_Metric):
    """Cumulative buckets, sum and count, as Prometheus expects.

    Hot paths take a `HistogramCell` per label set once (`labels`) and observe into it.
    """

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ):
        super().__init__(name, help, labelnames)
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"{name}: buckets must be a non-empty strictly ascending sequence")
        if not all(math.isfinite(b) for b in buckets):
            raise ValueError(f"{name}: buckets are finite (+Inf is always added)")
        self.buckets = tuple(float(b) for b in buckets)
        self._cells: dict[LabelValues, HistogramCell] = {}

    def labels(self, **labels: str) -> HistogramCell:
        """The cell of one label set (made on first use; exported from then on, even empty)."""
        key = self._key(labels)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = HistogramCell(self.buckets)
        return cell

    def observe(self, value: float, **labels: str) -> None:
        self.labels(**labels).observe(value)

    def count(self, **labels: str) -> int:
        cell = self._cells.get(self._key(labels))
        return 0 if cell is None else cell.count

    def samples(self) -> Iterable[Sample]:
        for key, cell in sorted(self._cells.items()):
            base = dict(zip(self.labelnames, key, strict=True))
            # one consistent read of the counts
            yield from histogram_samples(self.name, self.buckets, base, list(cell.counts), cell.sum)


def histogram_samples(
    name: str, buckets: Sequence[float], labels: dict[str, str], counts: Sequence[int], total: float
) -> Iterable[Sample]:
    """One label set's ``_bucket`` (cumulative), ``_sum`` and ``_count`` samples from its
    per-bucket ``counts`` (the last: above every bound): also for counts that come from
    another process."""
    running = 0
    for bound, c in zip((*buckets, math.inf), counts, strict=True):
        running += c
        le = "+Inf" if bound == math.inf else repr(bound)
        yield Sample(f"{name}_bucket", {**labels, "le": le}, running)
    yield Sample(f"{name}_sum", labels, total)
    yield Sample(f"{name}_count", labels, running)


Collector = Callable[[], Iterable[Sample]]


@final
class MetricsRegistry:
    """Named metrics plus scrape-time collectors; one per process (or per test)."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._collectors: dict[str, tuple[str, str, Collector]] = {}

    def _register(self, metric: _Metric) -> _Metric:
        existing = self._metrics.get(metric.name)
        if existing is not None:
            if type(existing) is not type(metric) or existing.labelnames != metric.labelnames:
                raise ValueError(f"metric {metric.name} already registered with another shape")
            return existing
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self._register(Counter(name, help, labelnames))  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self._register(Gauge(name, help, labelnames))  # type: ignore[return-value]

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        return self._register(Histogram(name, help, labelnames, buckets))  # type: ignore[return-value]

    def add_collector(self, name: str, kind: str, help: str, fn: Collector) -> None:
        """Register ``fn``, called at each scrape, yielding samples of metric ``name``.

        A later collector of the same name replaces the earlier one.
        """
        if name in self._metrics:
            raise ValueError(f"metric {name} is already registered as a {self._metrics[name].kind}")
        self._collectors[name] = (kind, help, fn)

    def families(self) -> list[Family]:
        """Every metric's samples now (a scrape; plain data, so it can cross processes)."""
        out = [Family(m.name, m.kind, m.help, list(m.samples())) for m in self._metrics.values()]
        out += [Family(n, k, h, list(fn())) for n, (k, h, fn) in self._collectors.items()]
        return out

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        return render(self.families())


def render(families: Iterable[Family]) -> str:
    """Families in the Prometheus text exposition format (version 0.0.4)."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        lines.extend(_format_sample(s) for s in family.samples)
    return "\n".join(lines) + "\n"


def merge_labelled(parts: Iterable[tuple[dict[str, str], list[Family]]]) -> list[Family]:
    """Several processes' scrapes as one: each sample gains its process's labels (which win
    over a sample's own label of the same name).

    A family appears once, in the order first seen, with every part's samples; a
    name that two parts give different types keeps the first type and drops the
    other's samples (both are our own processes, so it is never expected).
    """
    merged: dict[str, Family] = {}
    for labels, families in parts:
        for family in families:
            samples = [Sample(s.name, {**s.labels, **labels}, s.value) for s in family.samples]
            have = merged.get(family.name)
            if have is None:
                merged[family.name] = Family(family.name, family.kind, family.help, samples)
            elif have.kind == family.kind:
                have.samples.extend(samples)
    return list(merged.values())


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(int(v)) if float(v).is_integer() else repr(float(v))


def _format_sample(s: Sample) -> str:
    if not s.labels:
        return f"{s.name} {_format_value(s.value)}"
    body = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in s.labels.items())
    return f"{s.name}{{{body}}} {_format_value(s.value)}"


REGISTRY = MetricsRegistry()
"""The process-wide registry the server exposes at ``/metrics``."""
