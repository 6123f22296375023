"""A server's own Prometheus metrics over a window: read `/metrics` before and after, difference them.

    with perfkit.metrics_window(srv.url) as w:          # or serving.metrics_window; a Server works too
        results = serving.run(srv.url, context=512, gen=64)
    print(w.describe())
    w.histogram("vllm:time_to_first_token_seconds").quantile(0.5)   # (value, low, high) in seconds
    perfkit.record_metrics(w, {"ttft": "vllm:time_to_first_token_seconds"}, prefix="server_", at=...)

What a window holds, per metric family and label set (a rank, an engine, a model name):
- a counter: how much it grew inside the window;
- a histogram: the window's own histogram, each cumulative bucket's count after less its count
  before (and `_count`, `_sum` so): the requests, steps or tokens observed inside the window only;
- a gauge: its value at each edge (a level, not an amount: it is never differenced).
The text is read with `prometheus_client`'s parser (OpenMetrics or the Prometheus text format), the
same names for vLLM (`vllm:time_to_first_token_seconds`, ...), SGLang (`sglang:...`), llama.cpp
(`llamacpp:...`) or `perfkit engine serve` (`perfkit:...`).

A quantile from buckets is Prometheus' `histogram_quantile`: the bucket that holds the rank, linearly
interpolated inside it. Its *resolution* is that bucket: the true quantile of the observations lies
between the bucket's bounds, and nothing finer can be said, so every quantile comes with them (the
notes of its samples say which). Against a bound at one of the buckets' edges, each window's
quantile is on the right side of it (the bucket that holds the quantile says which side); a bound
inside a bucket is compared with an interpolation, so put it at an edge. A verdict over several
windows is then the usual interval over their values (one sample a window), no narrower than the
windows' spread. The mean is exact (`_sum` / `_count`).

A server that restarted inside the window (a counter or a bucket went down, or the start time a
server exports changed) has no difference to offer: `Restarted`, a UserError naming the metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfkit import prometheus, units
from perfkit.errors import UserError
from perfkit.prometheus import Snapshot, metrics_url, scrape

__all__ = ["Histogram", "MetricsWindow", "Restarted", "Snapshot", "metrics_window", "record_metrics", "scrape"]

TIMEOUT_S = prometheus.TIMEOUT_S
Labels = prometheus.Labels


class Restarted(UserError):
    """The server restarted inside the window: its counters started again."""


@dataclass(frozen=True)
class Histogram:
    """The observations a histogram gained in a window: cumulative `buckets` [(upper bound, count)]
    in increasing bound order (the last is +Inf), `count` and `sum`, in the metric's own unit."""

    name: str
    labels: Labels
    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> tuple[float, float, float] | None:
        """(estimate, low, high): Prometheus' histogram_quantile and the bounds of the bucket that holds
        it (the resolution). None without observations. In the +Inf bucket the estimate is the largest
        finite bound and `high` is inf: the buckets cannot say how far above it the quantile lies."""
        if not 0.0 <= q <= 1.0:
            raise UserError(f"a quantile is between 0 and 1, got {q}")
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        low, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if math.isinf(bound):
                    return low, low, math.inf
                if bound <= low:  # a first bucket at or below 0: nothing to interpolate from
                    return bound, bound, bound
                inside = (rank - below) / (cumulative - below)
                return low + (bound - low) * inside, low, bound
            low, below = bound, cumulative
        return None


class MetricsWindow:
    """What a server's metrics gained while the block ran (see the module's docstring)."""

    def __init__(self, target: Any, *, timeout: float = TIMEOUT_S) -> None:
        self.url, self.timeout = metrics_url(target), timeout
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None

    def __enter__(self) -> MetricsWindow:
        self.before = scrape(self.url, timeout=self.timeout)
        return self

    def __exit__(self, failed: type | None, *exc: object) -> None:
        if failed is None:  # the load failed: its error, not the metrics', is the one to see
            self.after = scrape(self.url, timeout=self.timeout)
            self._check_continuity()

    @property
    def seconds(self) -> float:
        return self._closed()[1].at - self._closed()[0].at

    def _closed(self) -> tuple[Snapshot, Snapshot]:
        if self.before is None or self.after is None:
            raise UserError("metrics_window: the window is still open; read it after the `with` block")
        return self.before, self.after

    def _check_continuity(self) -> None:
        before, after = self._closed()
        started = before.start_time(), after.start_time()
        if None not in started and started[0] != started[1]:
            raise Restarted(f"the server at {self.url} restarted inside the window (its start time changed)")
        for key, value in before.values.items():
            kind = before.types.get(key[0])
            if kind in ("counter", "histogram") and key in after.values and after.values[key] < value - 1e-9:
                raise Restarted(
                    f"the server at {self.url} restarted inside the window: {key[1]}{dict(key[2])} went from "
                    f"{value:g} to {after.values[key]:g}"
                )

    def families(self) -> dict[str, str]:
        """Every family the server exports after the window, with its type."""
        return dict(self._closed()[1].types)

    def _need(self, family: str, kind: str) -> None:
        types = self._closed()[1].types
        if types.get(family) != kind:
            have = sorted(n for n, t in types.items() if t == kind)
            said = f"a {types[family]}" if family in types else "not exported"
            raise UserError(f"{self.url}: {family} is {said}; its {kind}s are: {', '.join(have) or 'none'}")

    def counter(self, family: str) -> dict[Labels, float]:
        """How much each label set of counter `family` grew inside the window."""
        self._need(family, "counter")
        before, after = self._closed()
        return {
            labels: value - before.values.get((fam, name, labels), 0.0)
            for (fam, name, labels), value in after.values.items()
            if fam == family and name.endswith("_total")
        }

    def gauge(self, family: str) -> dict[Labels, tuple[float | None, float]]:
        """Each label set of gauge `family`: (its value before, its value after)."""
        self._need(family, "gauge")
        before, after = self._closed()
        return {
            labels: (before.values.get((fam, name, labels)), value)
            for (fam, name, labels), value in after.values.items()
            if fam == family
        }

    def histograms(self, family: str, *, by: str | None = None) -> dict[Labels, Histogram]:
        """The window's histogram of `family` per label set; `by=None` keeps every label set apart,
        `by=""` merges them all (their buckets must agree), `by="rank"` merges all but that label."""
        self._need(family, "histogram")
        before, after = self._closed()
        parts: dict[Labels, dict[str, Any]] = {}
        for (fam, name, labels), value in after.values.items():
            if fam != family:
                continue
            grown = value - before.values.get((fam, name, labels), 0.0)
            le = dict(labels).get("le")
            kept = prometheus.labels_without(labels, "le")
            if by is not None:
                kept = tuple((k, v) for k, v in kept if k == by)
            part = parts.setdefault(kept, {"buckets": {}, "count": None, "sum": None})
            if name.endswith("_bucket") and le is not None:
                bound = float(le)
                part["buckets"][bound] = part["buckets"].get(bound, 0.0) + grown
            elif name.endswith("_count"):
                part["count"] = (part["count"] or 0.0) + grown
            elif name.endswith("_sum"):
                part["sum"] = (part["sum"] or 0.0) + grown
        for labels, p in parts.items():  # what Prometheus promises of a histogram (a non-finite value was dropped)
            lacks = [
                what
                for what, missing in (
                    ("+Inf bucket", math.inf not in p["buckets"]),
                    ("finite _count", p["count"] is None),
                    ("finite _sum", p["sum"] is None),
                )
                if missing
            ]
            if lacks:
                raise UserError(f"{self.url}: histogram {family}{dict(labels)} has no {' and no '.join(lacks)}")
        return {
            labels: Histogram(family, labels, tuple(sorted(p["buckets"].items())), p["count"], p["sum"])
            for labels, p in sorted(parts.items())
        }

    def histogram(self, family: str) -> Histogram:
        """The window's histogram of `family`, every label set merged."""
        merged = self.histograms(family, by="")
        if not merged:
            raise UserError(f"{self.url}: {family} has no samples")
        return next(iter(merged.values()))

    def describe(self) -> str:
        return f"{len(self._closed()[1].types)} metric families of {self.url} over a {self.seconds:.1f} s window"


def metrics_window(target: Any, *, timeout: float = TIMEOUT_S) -> MetricsWindow:
    """A window over a server's `/metrics` (a URL, or a started `serving.Server`): `with metrics_window(url) as w:`."""
    return MetricsWindow(target, timeout=timeout)


def _unit(family: str, unit: str | None) -> tuple[str, float]:
    """(recorded unit, factor from the metric's own): seconds are recorded in ms; else `unit` as given."""
    if family.endswith("_seconds"):
        return (unit or "ms"), units.factor("s", unit or "ms")
    if unit is None:
        raise UserError(f"record_metrics: {family} is not in seconds; say its unit (unit=...)")
    return unit, 1.0


def record_metrics(
    windows: Any,
    names: dict[str, str],
    *,
    quantiles: tuple[float, ...] = (0.5, 0.99),
    by: str | None = "",
    unit: str | None = None,
    at: dict[str, Any] | None = None,
    prefix: str = "",
) -> list[str]:
    """Record histograms of a server's metrics, one sample per window; returns the names recorded.

    `names` maps a short name to a histogram family ({"ttft": "vllm:time_to_first_token_seconds"}).
    For each: `{prefix}{short}_mean` (exact: sum / count) and `{prefix}{short}_p50`, `_p99`, ... (from
    the buckets; each note gives the bucket bounds the quantile lies between), in ms for a family in
    seconds, else in `unit`. `by=""` merges every label set (the server as a whole); `by="rank"` or
    `by="engine"` records one sample per value of that label and window, in label order. A window in
    which the histogram observed nothing is a UserError (there is no value to record).
    """
    from perfkit.probe.recording import record

    windows = list(windows) if isinstance(windows, list | tuple) else [windows]
    if not windows or not all(isinstance(w, MetricsWindow) for w in windows):
        raise UserError("record_metrics: expected a metrics_window or a list of them")
    recorded = []
    for short, family in names.items():
        out_unit, scale = _unit(family, unit)
        columns: dict[str, list[float]] = {"mean": [], **{_q(q): [] for q in quantiles}}
        bounds: dict[str, list[str]] = {_q(q): [] for q in quantiles}
        observed = 0.0
        for i, w in enumerate(windows):
            for labels, h in w.histograms(family, by=by).items():
                if h.count <= 0:
                    raise UserError(f"record_metrics: {family}{dict(labels)} observed nothing in window {i + 1}")
                observed += h.count
                columns["mean"].append(h.mean * scale)
                for q in quantiles:
                    value, low, high = h.quantile(q)
                    columns[_q(q)].append(value * scale)
                    bounds[_q(q)].append(f"{units.format_number(low * scale)}-{units.format_number(high * scale)}")
        where = f"{family} over {len(windows)} window(s) of {windows[0].url}, {observed:g} observations"
        for column, values in columns.items():
            note = where + (
                " (sum / count)" if column == "mean" else f"; from buckets, between {_span(bounds[column])} {out_unit}"
            )
            record(f"{prefix}{short}_{column}", values, unit=out_unit, at=at, note=note)
            recorded.append(f"{prefix}{short}_{column}")
    return recorded


def _q(q: float) -> str:
    return f"p{q * 100:g}".replace(".", "_")


def _span(bounds: list[str]) -> str:
    """The bucket bounds of a quantile's samples, once each: "0.5-1 ms (x3), 1-2.5 ms"."""
    counts: dict[str, int] = {}
    for b in bounds:
        counts[b] = counts.get(b, 0) + 1
    return ", ".join(b + (f" (x{n})" if n > 1 else "") for b, n in counts.items())
