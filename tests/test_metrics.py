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
