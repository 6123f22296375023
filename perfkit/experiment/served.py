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

import json
import urllib.error
import urllib.request
from typing import Any

SERVER_PARAM = "server_url"  # the probe parameter naming the server; empty: the probe starts its own
STARTED = {"started_by_probe": True}  # the identity of a server each replicate starts itself
TIMEOUT_S = 5.0
_SHOWN = ("tp", "mode", "preset", "budget", "device", "dtype", "version")


def identity(url: str, *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Who answers at `url`: {"url", "model", "root", "engine": {...}} or {"url", "unreachable": why}."""
    url = url.rstrip("/")
    if not url:
        return dict(STARTED)
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=timeout) as response:
            header = response.headers.get("x-perfkit-engine")
            body = json.loads(response.read(1 << 20).decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"url": url, "unreachable": f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"}
    models = body.get("data") if isinstance(body, dict) else None
    first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
    engine = first.get("perfkit") if isinstance(first.get("perfkit"), dict) else {}
    found = {"url": url, "model": first.get("id"), "root": first.get("root")}
    if engine:
        found["engine"] = {k: engine[k] for k in sorted(engine) if k != "pids"}  # pids change on every restart
    elif header:
        found["engine"] = {"header": header}
    return found


def describe(server: dict[str, Any] | None) -> str:
    """The server in words, for the ledger and `perfkit show`."""
    if not server:
        return ""
    if server.get("started_by_probe"):
        return "a server each replicate started itself"
    if "unreachable" in server:
        return f"{server.get('url')} (unreachable: {server['unreachable']})"
    engine = server.get("engine") or {}
    shown = ", ".join(f"{k} {engine[k]}" for k in _SHOWN if engine.get(k) not in (None, ""))
    model = server.get("model") or "an unnamed model"
    return f"{model} at {server.get('url')}" + (f" ({shown})" if shown else "")
