"""perfkit.probe.metrics: a server's Prometheus metrics over a window, against a real exporter.

Each test serves a registry of its own with prometheus_client's own HTTP exporter on 127.0.0.1
(what vLLM, SGLang and `perfkit engine serve` export is read the same way), observes values whose
truth the test knows, and checks what the window says about them."""

from __future__ import annotations

import math
import random

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from perfkit.errors import UserError  # noqa: E402
from perfkit.probe import metrics, recording  # noqa: E402

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Exporter:
    """A registry served on a free loopback port, as a server exports its metrics."""

    def __init__(self):
        self.registry = prometheus_client.CollectorRegistry()
        self.server, self.thread = prometheus_client.start_http_server(0, "127.0.0.1", registry=self.registry)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def exporter():
    e = Exporter()
    yield e
    e.close()


def _vllm_like(registry):
    """vLLM's names and labels: a TTFT histogram per engine, a token counter, a running gauge."""
    ttft = prometheus_client.Histogram(
        "vllm:time_to_first_token_seconds", "ttft", ["model_name", "engine"], buckets=BUCKETS, registry=registry
    )
    tokens = prometheus_client.Counter("vllm:generation_tokens", "tokens", ["model_name"], registry=registry)
    running = prometheus_client.Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry)
    return ttft, tokens, running


def test_a_window_holds_what_happened_inside_it_and_nothing_before(exporter):
    ttft, tokens, running = _vllm_like(exporter.registry)
    for _ in range(50):  # before the window: must not count
        ttft.labels("m", "0").observe(0.9)
    tokens.labels("m").inc(1000)
    running.labels("m").set(3)
    with metrics.metrics_window(exporter.url) as w:
        for i in range(40):
            ttft.labels("m", str(i % 2)).observe(0.02)
        tokens.labels("m").inc(256)
        running.labels("m").set(1)
    assert w.counter("vllm:generation_tokens") == {(("model_name", "m"),): 256.0}
    assert w.gauge("vllm:num_requests_running") == {(("model_name", "m"),): (3.0, 1.0)}
    whole = w.histogram("vllm:time_to_first_token_seconds")
    assert whole.count == 40 and whole.mean == pytest.approx(0.02)
    assert whole.quantile(0.99)[1:] == (0.01, 0.025)  # not 0.9: that was before the window
    per_engine = w.histograms("vllm:time_to_first_token_seconds", by="engine")
    assert [(dict(k), h.count) for k, h in per_engine.items()] == [({"engine": "0"}, 20), ({"engine": "1"}, 20)]
    assert len(w.histograms("vllm:time_to_first_token_seconds")) == 2  # every label set apart


@pytest.mark.parametrize("shape", ["lognormal", "bimodal", "heavy"])
def test_a_quantile_from_buckets_lies_in_the_bucket_it_names_and_the_mean_is_exact(exporter, shape):
    """Known truth: the window's quantile is within the bounds it gives of the observations' own quantile."""
    rng = random.Random(shape)
    draw = {
        "lognormal": lambda: rng.lognormvariate(math.log(0.03), 0.6),
        "bimodal": lambda: rng.gauss(0.012, 0.001) if rng.random() < 0.7 else rng.gauss(0.3, 0.02),
        "heavy": lambda: 0.004 * rng.paretovariate(1.3),
    }[shape]
    h = prometheus_client.Histogram("x_seconds", "x", buckets=BUCKETS, registry=exporter.registry)
    with metrics.metrics_window(exporter) as w:
        values = [max(1e-6, draw()) for _ in range(2000)]
        for v in values:
            h.observe(v)
    got = w.histogram("x_seconds")
    assert got.count == len(values) and got.mean == pytest.approx(sum(values) / len(values))
    ordered = sorted(values)
    for q in (0.1, 0.5, 0.9, 0.99):
        estimate, low, high = got.quantile(q)
        truth = ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
        assert low <= truth <= high, (q, truth, low, high)
        assert low <= estimate <= high
    if shape == "heavy":  # a tail beyond the last bound: the buckets say only that it is above 1 s
        assert ordered[-1] > 1.0 and got.quantile(1.0) == (1.0, 1.0, math.inf)


def test_a_restart_inside_the_window_is_named_not_differenced(exporter):
    tokens = prometheus_client.Counter("served_tokens", "t", registry=exporter.registry)
    tokens.inc(500)
    with pytest.raises(metrics.Restarted, match="restarted inside the window: served_tokens_total.*500 to 7"):
        with metrics.metrics_window(exporter.url):
            exporter.registry.unregister(tokens)  # the process came back: its counters start again
            prometheus_client.Counter("served_tokens", "t", registry=exporter.registry).inc(7)


def test_a_changed_start_time_is_a_restart(exporter):
    start = prometheus_client.Gauge("process_start_time_seconds", "start", registry=exporter.registry)
    start.set(1000.0)
    with pytest.raises(metrics.Restarted, match="start time changed"):
        with metrics.metrics_window(exporter.url):
            start.set(2000.0)


def test_what_is_not_there_is_said_with_what_is(exporter):
    _vllm_like(exporter.registry)
    with metrics.metrics_window(exporter.url) as w:
        pass
    with pytest.raises(UserError, match="vllm:inter_token_latency_seconds is not exported; its histograms are: "):
        w.histogram("vllm:inter_token_latency_seconds")
    with pytest.raises(UserError, match="vllm:generation_tokens is a counter"):
        w.histogram("vllm:generation_tokens")
    with pytest.raises(UserError, match="no metrics at http://127.0.0.1:1/metrics"):
        metrics.scrape("http://127.0.0.1:1")
    with pytest.raises(UserError, match="expected a server's URL"):
        metrics.metrics_window("localhost:8000")
    open_window = metrics.metrics_window(exporter.url)
    with pytest.raises(UserError, match="still open"):
        open_window.histogram("x")


def test_record_metrics_gives_one_sample_per_window_in_ms_with_the_buckets_it_rests_on(exporter, monkeypatch):
    ttft, _, _ = _vllm_like(exporter.registry)
    shown = []
    monkeypatch.setattr(recording, "_emit", lambda records, text: shown.extend(records))
    windows = []
    for value in (0.02, 0.04, 0.2):
        with metrics.metrics_window(exporter.url) as w:
            for _ in range(10):
                ttft.labels("m", "0").observe(value)
        windows.append(w)
    names = metrics.record_metrics(windows, {"ttft": "vllm:time_to_first_token_seconds"}, prefix="server_")
    assert names == ["server_ttft_mean", "server_ttft_p50", "server_ttft_p99"]
    by_name = {r["name"]: r for r in shown}
    assert by_name["server_ttft_mean"]["samples"] == pytest.approx([20.0, 40.0, 200.0])
    assert by_name["server_ttft_mean"]["unit"] == "ms"
    p50 = by_name["server_ttft_p50"]
    assert all(lo <= v <= hi for v, (lo, hi) in zip(p50["samples"], [(10, 25), (25, 50), (100, 250)]))
    assert "between 10-25, 25-50, 100-250 ms" in p50["note"]
    with metrics.metrics_window(exporter.url) as idle:
        pass
    with pytest.raises(UserError, match="observed nothing in window 1"):
        metrics.record_metrics([idle], {"ttft": "vllm:time_to_first_token_seconds"})
