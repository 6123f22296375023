"""`GET /metrics` of `perfkit engine serve`: Prometheus metrics named as vLLM names its own.

A probe reads them as it reads vLLM's or SGLang's (`perfkit.probe.metrics`), so one probe measures
either server. Every family is `perfkit:`-prefixed and labelled `model_name` (as vLLM's):

- `perfkit:time_to_first_token_seconds` (histogram): from the request's arrival to its first token
  leaving the engine (server-side: the client's TTFT adds the network and the first frame);
- `perfkit:inter_token_latency_seconds` (histogram): the gap between two decode steps of a request,
  observed once per token the later step brought, each time the gap over those tokens (a speculative
  step commits several tokens at once; this is vLLM's per-token definition);
- `perfkit:e2e_request_latency_seconds` (histogram): from arrival to the last token;
- `perfkit:request_success_total`, `perfkit:request_failure_total`, `perfkit:prompt_tokens_total`,
  `perfkit:generation_tokens_total` (counters); `perfkit:num_requests_running` and
  `perfkit:num_requests_waiting` (gauges, read when scraped);
- `perfkit:spec_decode_steps_total` (counter): decode steps; with `generation_tokens_total` it gives
  the tokens committed per step;
- `perfkit:step_phase_seconds` (histogram, labels `phase`, `rank`): each decode step's phases as the
  ranks' spans timed them (`step`, `prepare_for_verify`, `verify_forward`, ..., `unattributed`), only
  while the server profiles (PERFKIT_PROFILE=1: spans cost nothing otherwise, and are not run for this);
- `process_start_time_seconds` and the other `process_*` families of this process: a probe that sees
  the start time change between two windows knows the server restarted.
Each server has a registry of its own (never prometheus_client's global one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ServerMetrics", "RequestClock", "CONTENT_TYPE"]

PREFIX = "perfkit:"
# finer than vLLM's buckets at the low end: the bundled engine's steps take milliseconds on a CPU
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75)
TTFT_BUCKETS += (1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1)
ITL_BUCKETS += (0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
PHASE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestClock:
    """One request's times, from its arrival: `tokens(n)` at each step that brought n, `finished(ok)`."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics, self.arrived = metrics, time.perf_counter()
        self.last: float | None = None
        self.count = 0
        self.done = False

    def tokens(self, n: int) -> None:
        now, m = time.perf_counter(), self.metrics
        if self.last is None:
            m.ttft.observe(now - self.arrived)
        elif n > 0:
            for _ in range(n):
                m.itl.observe((now - self.last) / n)
        self.last, self.count = now, self.count + n

    def finished(self, ok: bool, prompt_tokens: int) -> None:
        if self.done:
            return
        self.done, m = True, self.metrics
        if ok:
            m.e2e.observe(time.perf_counter() - self.arrived)
            m.success.inc()
            m.prompt_tokens.inc(prompt_tokens)
            m.generation_tokens.inc(self.count)
        else:
            m.failure.inc()


class ServerMetrics:
    """The registry of one server and its families (see the module's docstring)."""

    def __init__(self, model: str, *, running: Callable[[], float], waiting: Callable[[], float]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        labels = {"labelnames": ["model_name"], "registry": registry}

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, buckets=buckets, **labels).labels(model)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, **labels).labels(model)

        self.ttft = histogram("time_to_first_token_seconds", "Arrival to the first token.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Gap between steps, per token.", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to the last token.", E2E_BUCKETS)
        self.success = counter("request_success", "Requests that generated all their tokens.")
        self.failure = counter("request_failure", "Queued requests that ended in an error.")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of successful requests.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated for successful requests.")
        self.steps = counter("spec_decode_steps", "Decode steps run (a batch's step counts once).")
        Gauge(PREFIX + "num_requests_running", "Requests in the batch being generated.", **labels).labels(
            model
        ).set_function(running)
        Gauge(PREFIX + "num_requests_waiting", "Requests queued.", **labels).labels(model).set_function(waiting)
        self._phases = Histogram(
            PREFIX + "step_phase_seconds",
            "Each decode step's phases, as the ranks' spans timed them (while the server profiles).",
            labelnames=["model_name", "phase", "rank"],
            buckets=PHASE_BUCKETS,
            registry=registry,
        )
        self.model = model

    def arrived(self) -> RequestClock:
        return RequestClock(self)

    def generated(self, summary: dict) -> None:
        """After a batch's generate: its steps, and each rank's per-step phases when it profiled."""
        self.steps.inc(int(summary.get("steps") or 0))
        for rank, steps in sorted((summary.get("rank_steps") or {}).items()):
            for step in steps:
                for phase, seconds in step.items():
                    self._phases.labels(self.model, phase, str(rank)).observe(max(0.0, seconds))

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
