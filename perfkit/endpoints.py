"""Who answers at a URL: what an OpenAI-compatible server says about itself in `GET /v1/models`;
and a free loopback port for a server to come.

One reading for the probe that drives a server (`perfkit.serving`) and for the plan that keys its
executions on the server (`perfkit.experiment.records.served`): the first model's `id` and `root`, every
model's id, and the `perfkit` identity that `perfkit engine serve` adds to its model (tp, mode,
preset, version, pids, ...) or, from another server, an `x-perfkit-engine` response header.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from perfkit.errors import UserError

__all__ = ["Unreachable", "free_port", "get_json", "identity"]

TIMEOUT_S = 10.0
ENGINE_HEADER = "x-perfkit-engine"


class Unreachable(UserError):
    """Nothing answers at the URL, or what answers is not a model list."""


def get_json(url: str, *, timeout: float = TIMEOUT_S) -> tuple[int, dict[str, str], Any]:
    """GET `url`: (status, headers with lower-case names, decoded JSON body or None). Raises
    urllib.error.URLError or OSError when nothing answers; an HTTP error status is returned."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, headers, raw = response.status, dict(response.headers), response.read(1 << 20)
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers or {}), exc.read(1 << 20)
    try:
        body = json.loads(raw.decode("utf-8", "replace")) if raw else None
    except ValueError:
        body = None
    return status, {k.lower(): v for k, v in headers.items()}, body


def identity(url: str, *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """{"url", "model", "root", "models", "engine"} of the server at `url`; `engine` is {} for a
    server that says nothing about its engine. Unreachable (a UserError naming the URL) otherwise."""
    url = url.rstrip("/")
    try:
        status, headers, body = get_json(f"{url}/v1/models", timeout=timeout)
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(f"no server answers at {url}: {getattr(exc, 'reason', exc)}") from None
    models = body.get("data") if isinstance(body, dict) else None
    if status != 200 or not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise Unreachable(f"{url}/v1/models answered {status} without a model list: {str(body)[:200]!r}")
    first = models[0]
    engine = first.get("perfkit") if isinstance(first.get("perfkit"), dict) else {}
    if not engine and headers.get(ENGINE_HEADER):
        engine = {"header": headers[ENGINE_HEADER]}
    return {
        "url": url,
        "model": first.get("id"),
        "root": first.get("root"),
        "models": [m.get("id") for m in models if isinstance(m, dict)],
        "engine": engine,
    }


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's choice), for a server or a process group about to bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
