"""/metrics of a running server: the latency histograms filled by real sessions, the whole
exposition read back by Prometheus's own parser, and every metric the Grafana dashboard
(docs/grafana/duplex.json) queries present."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus
from websockets.trio.client import connect as ws_connect

from .wsclient import Server, client, running_server, tone

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "duplex.json"
HISTOGRAMS = (
    "duplex_output_delay_seconds",
    "duplex_time_to_first_audio_seconds",
    "duplex_engine_tick_lateness_seconds",
    "duplex_engine_step_seconds",
)


async def scrape(server: Server) -> str:
    async with httpx.AsyncClient() as http:
        response = await http.get(server.http + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


def histograms(text: str) -> dict[str, list[tuple[dict[str, str], dict[str, float]]]]:
    """Each histogram family: per label set, its series (``le`` buckets, ``sum``, ``count``),
    checked as Prometheus requires (cumulative buckets ending in +Inf == count)."""
    out: dict[str, list[tuple[dict[str, str], dict[str, float]]]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        by_labels: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            series = by_labels.setdefault(tuple(sorted(labels.items())), {})
            suffix = sample.name.removeprefix(family.name)
            key = sample.labels["le"] if suffix == "_bucket" else suffix
            series[key] = sample.value
        for series in by_labels.values():
            bounds = sorted((float(k), v) for k, v in series.items() if not k.startswith("_"))
            assert bounds[-1][0] == math.inf and bounds[-1][1] == series["_count"]
            counts = [v for _, v in bounds]
            assert counts == sorted(counts), f"{family.name}: buckets are not cumulative"
            assert "_sum" in series
        out[family.name] = [(dict(k), v) for k, v in by_labels.items()]
    return out


def count(families: dict, name: str, **labels: str) -> float:
    return sum(
        series["_count"]
        for have, series in families[name]
        if all(have.get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "two-workers"])
async def test_latency_histograms_fill_from_real_sessions(workers: int) -> None:
    """And the HTTP boundary's figures come from every process that serves HTTP
    (`http_boundary`)."""
    async with running_server(
        **{"session.overlap_policy": "model", "server.connection_workers": workers}
    ) as server:
        before = histograms(await scrape(server))
        for name in HISTOGRAMS:  # every cell exported (at 0) before any traffic
            assert name in before
        assert count(before, "duplex_output_delay_seconds", endpoint="/v1/duplex") == 0
        async with client(server) as c:
            await c.send({"type": "session.create"})
            await c.until("session.created")
            await c.stream(tone(12))
            await c.until("response.audio.delta")
            for _ in range(5):
                await c.until("response.audio.delta")
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(server.url.rsplit("/", 1)[0] + "/v1/nowhere"):
                pass
        assert refused.value.response.status_code == 404
        text = await scrape(server)
        after = histograms(text)
    http_boundary(text, workers)
    delays = count(after, "duplex_output_delay_seconds", model="loopback", endpoint="/v1/duplex")
    assert delays >= 6
    assert count(after, "duplex_output_delay_seconds", endpoint="/v1/realtime") == 0
    assert count(after, "duplex_time_to_first_audio_seconds", endpoint="/v1/duplex") >= 1
    assert count(after, "duplex_engine_tick_lateness_seconds", model="loopback") >= 12
    assert count(after, "duplex_engine_step_seconds", model="loopback", batch="1") >= 12
    assert count(after, "duplex_engine_step_seconds", batch="2") == 0


def http_boundary(text: str, workers: int) -> None:
    """The connection cap and the access refusals are counted where HTTP is served: the
    server process, or each connection worker, whose families ``/metrics`` merges under a
    ``worker`` label. One WebSocket handshake on no route was refused (404)."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    limits = list(families["duplex_http_connections_limit"].samples)
    labels = sorted(s.labels.get("worker", "") for s in limits)
    assert labels == ([str(i) for i in range(workers)] if workers else [""])
    assert all(s.value >= 64 for s in limits)
    not_found = [
        s
        for s in families["duplex_access_refused"].samples
        if s.name == "duplex_access_refused_total" and s.labels["code"] == "not_found"
    ]
    assert sum(s.value for s in not_found) == 1
    assert all(("worker" in s.labels) == bool(workers) for s in not_found)


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {name for expr in exprs for name in re.findall(r"\bduplex_[a-z0-9_]+", expr)}


async def test_every_metric_the_grafana_dashboard_queries_is_exported() -> None:
    queried = dashboard_metrics()
    assert len(queried) >= 10
    async with running_server() as server:
        text = await scrape(server)
    list(text_string_to_metric_families(text))  # the whole exposition parses
    names = set(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    exported = {name for name, _ in names}
    exported |= {f"{n}{s}" for n, kind in names if kind == "histogram"
                 for s in ("_bucket", "_sum", "_count")}  # fmt: skip
    missing = sorted(queried - exported)
    assert not missing, f"the dashboard queries metrics /metrics lacks: {missing}"
