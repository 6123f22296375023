"""What a serving run sends: prompts of an exact length, no two alike, and when each is sent.

A prompt of `context` tokens on the bundled engine is `context` ASCII bytes (its vocabulary is the
256 byte values). Every prompt starts with a tag and its own index, so no prompt is a prefix of
another and a server's prefix cache can never serve one from another (a 46k-context request that
hits the cache measures the cache, not the prefill). Arrivals are all at once or a seeded Poisson
process, as in SGLang's bench_serving and vLLM's benchmark (`--request-rate`).
"""

from __future__ import annotations

import random
import zlib

from perfkit.errors import UserError

__all__ = ["arrival_times", "make_prompts"]

_WORDS = (
    "def return self import from class if else elif for while in not and or None True False value name "
    "result data key index items list dict args kwargs print len range open path file line text error try "
    "except raise with as lambda yield pass break continue object type int str float bytes"
).split()
_LINE_ENDS = (" ", " ", " ", " ", " ", ", ", ": ", "(", ")", ".", "\n", "\n    ", " = ")


def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """When each of `n` requests is sent, in seconds from the start: all at 0 without a rate, else a
    Poisson process of `rate` requests per second (exponential gaps, seeded), the first at 0."""
    if rate is None or rate == float("inf"):
        return [0.0] * n
    if not rate > 0:
        raise UserError(f"serving: rate must be a positive number of requests per second, got {rate!r}")
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _ascii(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return bytes(b if 32 <= b < 127 or b in (9, 10) else 63 for b in raw)  # one byte, one character


def make_prompts(n: int, context: int, *, seed: int = 0, text: str | bytes | None = None, tag: str = "") -> list[str]:
    """`n` ASCII prompts of exactly `context` bytes (tokens, on a byte-vocabulary engine), no two alike.

    Each starts with characters of its own (a hash of `tag` and its index, then the index), so no
    prompt is a prefix of another and a prefix cache shares no more than a first character or token
    between two of them (a run-wide tag in front would be a prefix every request shares: llama.cpp's
    cache reused it); the rest is cut from `text` (any characters outside printable ASCII become "?",
    one byte each) or, without it, seeded Python-like words.
    """
    head = [f"{zlib.crc32(f'{tag}|{i}'.encode()):08x}{i}|" for i in range(n)]
    if context < max((len(h) for h in head), default=0) + 1:
        raise UserError(f"serving: context {context} is too short for a unique prefix per request; use at least 16")
    source = _ascii(text) if text is not None else None
    prompts = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        need = context - len(head[i])
        if source is not None:
            if len(source) < need:
                raise UserError(f"serving: the prompt text has {len(source)} bytes, fewer than a {need}-byte prompt")
            start = rng.randrange(len(source) - need + 1)
            body = source[start : start + need].decode("ascii")
        else:
            parts, size = [], 0
            while size < need:
                parts.append(rng.choice(_WORDS) + rng.choice(_LINE_ENDS))
                size += len(parts[-1])
            body = "".join(parts)[:need]
        prompts.append(head[i] + body)
    return prompts
