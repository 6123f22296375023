"""The server a probe drives: its identity, part of the execution's key and of the ledger's "measured by".

A probe that declares a `server_url` parameter measures a live server. When the URL is given, the
plan asks the server who it is (`GET /v1/models`: the model's `id` and `root`, and the `perfkit`
identity a `perfkit engine serve` adds: tp, mode, preset, version) before anything runs, so a
measurement of one server is never reused for another and the ledger names what was measured. An
empty URL means the probe starts its own server from the code under test, which the key already
holds. A server that does not answer is recorded as unreachable: the probe then fails loudly, and
an error is never reused.
"""

from __future__ import annotations

import time
from typing import Any

from perfkit import endpoints, prometheus
from perfkit.errors import UserError

SERVER_PARAM = "server_url"  # the probe parameter naming the server; empty: the probe starts its own
STARTED = {"started_by_probe": True}  # the identity of a server each replicate starts itself
STARTED_WITH = ("tp", "preset", "mode", "mask", "tree")  # the probe's parameters that say which server it starts
TIMEOUT_S = 5.0
VOLATILE = ("pids", "server_pid", "max_model_len")  # change on a restart, or once loaded: not its identity
_SHOWN = ("tp", "mode", "preset", "budget", "device", "dtype", "version")


def identity(url: str, *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Who answers at `url` (a server the probe does not start: see `started`): {"url", "model", "root",
    "engine": {...}} or {"url", "unreachable": why}."""
    url = url.rstrip("/")
    try:
        found = endpoints.identity(url, timeout=timeout)
    except endpoints.Unreachable as exc:
        return {"url": url, "unreachable": str(exc)}
    engine = {k: v for k, v in sorted(found["engine"].items()) if k not in VOLATILE}
    return {"url": url, "model": found["model"], "root": found["root"], **({"engine": engine} if engine else {})}


def instance(url: str, *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Which process of the server at `url` answers now: its identity (as `identity`), and what it says of
    its process: `pid` and rank `pids` (`perfkit engine serve`'s GET /v1/models) and `start_time`
    (`process_start_time_seconds` in GET /metrics, as vLLM and prometheus_client export); a field it
    does not say is left out, and `unreachable` says why nothing answered."""
    url = url.rstrip("/")
    deadline = time.monotonic() + timeout  # one deadline for both reads, not one each
    try:
        found = endpoints.identity(url, timeout=timeout)
    except endpoints.Unreachable as exc:
        return {"unreachable": str(exc)}
    engine = found["engine"]
    out: dict[str, Any] = {"model": found["model"]}
    out["engine"] = {k: v for k, v in sorted(engine.items()) if k not in VOLATILE}
    if isinstance(engine.get("server_pid"), int):
        out["pid"] = engine["server_pid"]
    if isinstance(engine.get("pids"), list):
        out["pids"] = engine["pids"]
    left = deadline - time.monotonic()
    try:
        start = prometheus.scrape(url, timeout=left).start_time() if left > 0.05 else None
    except UserError:  # no /metrics, or no prometheus_client here: the start time is not known
        start = None
    if start is not None:
        out["start_time"] = start
    return out


def started(chosen: dict[str, Any]) -> dict[str, Any]:
    """The identity of a server each replicate starts itself, with the parameters it starts it with."""
    engine = {k: v for k, v in chosen.items() if v not in (None, "")}
    return {**STARTED, **({"engine": engine} if engine else {})}


def describe(server: dict[str, Any] | None) -> str:
    """The server in words, for the ledger and `perfkit show`."""
    if not server:
        return ""
    engine = server.get("engine") or {}
    if server.get("started_by_probe"):
        shown = ", ".join(f"{k} {engine[k]}" for k in STARTED_WITH if k in engine)
        return "a server each replicate started itself" + (f" ({shown})" if shown else "")
    if "unreachable" in server:
        return f"{server.get('url')} (unreachable: {server['unreachable']})"
    shown = ", ".join(f"{k} {engine[k]}" for k in _SHOWN if engine.get(k) not in (None, ""))
    if engine.get("commit"):
        shown += f"{', ' if shown else ''}commit {str(engine['commit'])[:12]}"
    model = server.get("model") or "an unnamed model"
    return f"{model} at {server.get('url')}" + (f" ({shown})" if shown else "")


def measured_by(server: dict[str, Any] | None) -> str:
    """The server in the ledger's "Measured by": its description, and for one the run did not start,
    what a replicate was (a window of requests on it, not a process: run/windows.py)."""
    said = describe(server)
    if said and server and not server.get("started_by_probe") and "unreachable" not in server:
        said += ", each replicate a window of requests on that running server"
    return said


def change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """How the server changed, in words: the two descriptions, or, when those read alike, the fields
    that differ (a commit, a thread count), so a change is never "A -> A"."""
    said_before, said_after = describe(before), describe(after)
    if said_before != said_after:
        return f"{said_before or 'none'} -> {said_after or 'none'}"

    def fields(server: dict[str, Any] | None) -> dict[str, Any]:
        server = server or {}
        return {**{k: v for k, v in server.items() if k != "engine"}, **(server.get("engine") or {})}

    x, y = fields(before), fields(after)
    return ", ".join(f"{k} {x.get(k)} -> {y.get(k)}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k))
