"""Who answers at a URL: what an OpenAI-compatible server says about itself in `GET /v1/models`;
and a free loopback port for a server to come.

One reading for the probe that drives a server (`perfkit.serving`) and for the plan that keys its
executions on the server (`perfkit.experiment.records.served`): the first model's `id` and `root`, every
model's id, and the `perfkit` identity that `perfkit engine serve` adds to its model (tp, mode,
preset, version, pids, ...) or, from another server, an `x-perfkit-engine` response header.

Every read from a server, by the probe or by the run itself, goes through `fetch`: bounded in bytes
(`limit`), in total time (one deadline for the whole answer, not one per read: a server sending a byte
every few seconds is cut off at it) and, for JSON, in depth, with only finite numbers kept.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import time
import urllib.error
import urllib.parse
from typing import Any

from perfkit.errors import UserError

__all__ = ["Unreachable", "TooMuch", "fetch", "free_port", "get_json", "identity"]

TIMEOUT_S = 10.0
JSON_LIMIT = 1 << 20  # bytes of a JSON answer (a model list is a few hundred)
JSON_DEPTH = 64  # nesting of a JSON answer: a model list needs 4
ENGINE_HEADER = "x-perfkit-engine"


class Unreachable(UserError):
    """Nothing answers at the URL, or what answers is not a model list."""


class TooMuch(Unreachable):
    """A server's answer went past its limit in bytes or its deadline (nothing usable answers)."""


def fetch(url: str, *, timeout: float = TIMEOUT_S, limit: int = JSON_LIMIT) -> tuple[int, dict[str, str], bytes]:
    """GET `url` within `timeout` seconds in all: (status, headers with lower-case names, body). Raises
    urllib.error.URLError or OSError when nothing answers, TooMuch past `limit` bytes or the deadline."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise urllib.error.URLError(f"not an http(s) URL: {url!r}")
    deadline = time.monotonic() + timeout
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")))
        sock = conn.sock  # the response reads from it (and the connection forgets it once it will close)
        response = conn.getresponse()
        body = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TooMuch(f"{url} did not finish its answer within {timeout:g} s")
            sock.settimeout(left)
            try:
                chunk = response.read1(65536)
            except TimeoutError:
                raise TooMuch(f"{url} did not finish its answer within {timeout:g} s") from None
            if not chunk:
                break
            body += chunk
            if len(body) > limit:
                raise TooMuch(f"{url} answered more than {limit:,} bytes")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, bytes(body)
    except (http.client.HTTPException, ValueError) as exc:  # not HTTP at all, or a malformed answer
        raise urllib.error.URLError(f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()


def _not_finite(constant: str):
    raise ValueError(f"{constant} is not a number JSON allows")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999
        raise ValueError(f"{text} is beyond a float")
    return number


def _depth(value: Any, limit: int) -> bool:
    """Whether `value` nests no deeper than `limit` (lists and objects), walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return True


def decode_json(raw: bytes) -> Any:
    """A JSON answer, or None: not JSON, NaN or Infinity in it, or nested deeper than JSON_DEPTH (a body
    nested 200,000 deep stops json.loads with a RecursionError, caught here)."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text, parse_constant=_not_finite, parse_float=_finite) if text.strip() else None
    except (ValueError, RecursionError):
        return None
    return body if _depth(body, JSON_DEPTH) else None


def get_json(url: str, *, timeout: float = TIMEOUT_S) -> tuple[int, dict[str, str], Any]:
    """GET `url`: (status, headers with lower-case names, decoded JSON body or None: see decode_json).
    Raises urllib.error.URLError or OSError when nothing answers, TooMuch past JSON_LIMIT bytes or the
    deadline; an HTTP error status is returned."""
    status, headers, raw = fetch(url, timeout=timeout, limit=JSON_LIMIT)
    return status, headers, decode_json(raw)


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
