"""The metrics registry renders valid Prometheus text."""

from __future__ import annotations

import pytest

from duplex.metrics import MetricsRegistry, Sample


def test_render_counters_gauges_histograms_and_collectors() -> None:
    reg = MetricsRegistry()
    c = reg.counter("x_total", "things", ["kind"])
    c.inc(kind="a")
    c.inc(2, kind='b"q')
    g = reg.gauge("y", "level")
    g.set(3)
    g.dec(0.5)
    h = reg.histogram("z_seconds", "time", buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    reg.add_collector("w", "gauge", "live", lambda: [Sample("w", {"m": "x"}, 7)])
    text = reg.render()
    assert 'x_total{kind="a"} 1' in text
    assert 'x_total{kind="b\\"q"} 2' in text
    assert "y 2.5" in text
    assert 'z_seconds_bucket{le="0.1"} 1' in text
    assert 'z_seconds_bucket{le="1.0"} 2' in text
    assert 'z_seconds_bucket{le="+Inf"} 3' in text
    assert "z_seconds_count 3" in text and "z_seconds_sum 5.55" in text
    assert 'w{m="x"} 7' in text
    assert text.count("# TYPE") == 4 and text.endswith("\n")


def test_registry_rules() -> None:
    reg = MetricsRegistry()
    c = reg.counter("n_total", "n")
    assert reg.counter("n_total", "n") is c  # same shape: the same metric
    with pytest.raises(ValueError, match="another shape"):
        reg.gauge("n_total", "n")
    with pytest.raises(ValueError, match="only go up"):
        c.inc(-1)
    with pytest.raises(ValueError, match="labels"):
        c.inc(kind="x")
    with pytest.raises(ValueError, match="already registered"):
        reg.add_collector("n_total", "gauge", "n", list)


def test_histogram_exposition_read_back_by_the_prometheus_parser() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    reg = MetricsRegistry()
    h = reg.histogram("lat_seconds", "a\nhelp", ["model", "endpoint"], buckets=(0.01, 0.1, 1.0))
    cell = h.labels(model='m"1', endpoint="/v1/duplex")
    for v in (0.01, 0.05, 0.1, 0.5, 7.0):  # a value on a bound counts in that bucket (le)
        cell.observe(v)
    h.labels(model="idle", endpoint="/v1/realtime")  # made, never observed: exported at 0
    (family,) = list(text_string_to_metric_families(reg.render()))
    assert (family.name, family.type) == ("lat_seconds", "histogram")
    assert family.documentation == "a\nhelp"
    got = {(s.name, s.labels["model"], s.labels.get("le")): s.value for s in family.samples}
    assert [got["lat_seconds_bucket", 'm"1', le] for le in ("0.01", "0.1", "1.0", "+Inf")] == [
        1, 3, 4, 5,
    ]  # fmt: skip
    assert got["lat_seconds_count", 'm"1', None] == 5
    assert got["lat_seconds_sum", 'm"1', None] == pytest.approx(7.66)
    assert got["lat_seconds_bucket", "idle", "+Inf"] == 0 == got["lat_seconds_count", "idle", None]


def test_histogram_buckets_must_be_finite_and_strictly_ascending() -> None:
    reg = MetricsRegistry()
    for bad in ((), (1.0, 0.5), (0.1, 0.1), (0.1, float("inf"))):
        with pytest.raises(ValueError, match="buckets"):
            reg.histogram("h", "h", buckets=bad)
    cell = reg.histogram("ok", "ok", buckets=(1.0,)).labels()
    cell.observe(2.0)
    assert cell.counts == [0, 1] and cell.count == 1
