"""A server's Prometheus metrics, read: `GET /metrics` parsed by prometheus_client's own parser.

One reading for the probe's windows over a server's metrics (perfkit.probe.metrics) and for the run
that checks which process of a server it measured (its `process_start_time_seconds`, as vLLM and
prometheus_client export it). prometheus_client comes with `pip install 'perfkit[serve]'`.
"""

from __future__ import annotations

import math
import time
import urllib.error
from dataclasses import dataclass, field
from typing import Any

from perfkit import endpoints
from perfkit.errors import UserError

__all__ = ["Snapshot", "metrics_url", "parse", "scrape"]

TIMEOUT_S = 10.0
LIMIT = 32 << 20  # bytes of one /metrics answer (vLLM's is some hundreds of kB with every histogram)
START_TIME = ("process_start_time_seconds",)  # what a server exports as its own start (prometheus_client's)
Labels = tuple[tuple[str, str], ...]


def _parser():
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise UserError("reading a server's /metrics needs prometheus_client: pip install 'perfkit[serve]'") from None
    return text_string_to_metric_families


def labels_without(labels: dict[str, str] | Labels, drop: str = "") -> Labels:
    """A label set as sorted (name, value) pairs, less label `drop`."""
    pairs = labels.items() if isinstance(labels, dict) else labels
    return tuple(sorted((k, v) for k, v in pairs if k != drop))


def metrics_url(target: Any) -> str:
    """The /metrics URL of a server URL, a /metrics URL, or an object with `.url` (a started Server)."""
    url = str(getattr(target, "url", target) or "").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"expected a server's URL (http://host:port), got {target!r}")
    return url if url.endswith("/metrics") else f"{url}/metrics"


@dataclass
class Snapshot:
    """One reading of `/metrics`: each sample's value by (family, sample name, labels), each family's type."""

    url: str
    at: float
    types: dict[str, str] = field(default_factory=dict)
    values: dict[tuple[str, str, Labels], float] = field(default_factory=dict)

    def start_time(self) -> float | None:
        """When the server says it started (`process_start_time_seconds`), None when it does not say."""
        for (family, _name, _pairs), value in self.values.items():
            if family in START_TIME:
                return value
        return None


def parse(text: str, url: str = "", at: float | None = None) -> Snapshot:
    """A Snapshot of metrics text (what `scrape` reads; here for text already at hand)."""
    snap = Snapshot(url, time.time() if at is None else at)
    try:
        for family in _parser()(text):
            snap.types[family.name] = family.type
            for sample in family.samples:
                if sample.name.endswith("_created"):  # a creation time, not an amount
                    continue
                if not math.isfinite(value := float(sample.value)):  # NaN, +Inf: no amount to difference
                    continue
                snap.values[(family.name, sample.name, labels_without(sample.labels))] = value
    except ValueError as exc:
        raise UserError(f"{url or 'the metrics text'} is not Prometheus text: {exc}") from None
    return snap


def scrape(target: Any, *, timeout: float = TIMEOUT_S) -> Snapshot:
    """Read a server's `/metrics` now (a URL or a started Server), within `timeout` seconds in all and
    LIMIT bytes (endpoints.fetch); a UserError naming the URL otherwise."""
    url = metrics_url(target)
    try:
        status, _headers, raw = endpoints.fetch(url, timeout=timeout, limit=LIMIT)
    except (urllib.error.URLError, OSError) as exc:
        raise UserError(f"no metrics at {url}: {getattr(exc, 'reason', exc)}") from None
    if status != 200:
        raise UserError(f"{url} answered {status}: {raw[:200].decode('utf-8', 'replace')!r}")
    return parse(raw.decode("utf-8", "replace"), url)
