"""perfkit.serving: drive an OpenAI-compatible server and time each request as serving benchmarks do.

    with serving.server(server_url, serving.EngineOptions(tp=2, preset="shipped")) as srv:
        results = serving.run(srv.url, context=512, gen=64, concurrency=4)
    serving.record(results, at={"ctx": 512})

What counts, defined here once (`ttft`, `tpot`, `itl`, `e2e_latency`, `output_throughput` and
`request_throughput` are SGLang's bench_serving names, vLLM's but for `e2el`; `itl_chunk`,
`prefill_tok_s` and `decode_tok_s` are perfkit's):

- A *text chunk* is a `data:` frame in which a choice carries generated text (the rule, in full, is
  `streams.Stream`'s): a role-only, an empty-text or a usage-only chunk is never the first token,
  never an ITL gap.
- `ttft`: from just before the POST to the first text chunk.
- `e2e_latency`: from just before the POST to the end of the stream (`data: [DONE]`).
- `itl_chunk`: the gaps between consecutive text chunks.
- `itl` (per token): each gap spread evenly over the tokens its chunk carried (a speculative step
  sends several tokens in one chunk; a gap per chunk would be a gap per verify step, not per token).
  Tokens per chunk come from the running `usage.completion_tokens` a server sends in every chunk
  when asked (`stream_options.continuous_usage_stats`, vLLM's name); from a server that does not,
  the final `usage.completion_tokens`: as many as there are text chunks is one token each (exact on
  any vocabulary, llama.cpp's llama-server), more is split over the text chunks in proportion to
  their UTF-8 bytes, exact for a byte vocabulary like the bundled engine's (`token_source` says
  which). With neither, `itl` is not recorded: a gap per chunk is never passed off as a gap per token.
- `output_tokens`: the server's `usage.completion_tokens` (`chunks` is the text chunk count);
  `prompt_tokens`: the server's `usage.prompt_tokens`, checked against the tokens meant.
- `tpot` = (e2e_latency - ttft) / (output_tokens - 1); `decode_tok_s` = its inverse;
  `prefill_tok_s` = prompt_tokens / ttft.
- `output_throughput`: the completed requests' output tokens / the wall time from the first POST to
  the last stream's end (less the time spent in `run(each=...)`); `request_throughput`: completed
  requests / the same wall time.

The server's own figures: `run(..., window=serving.metrics_window(url))` reads its Prometheus
`/metrics` after the warm-up and after the last measured request, and `serving.record_metrics(w,
{"ttft": "vllm:time_to_first_token_seconds"}, prefix="server_")` records that window's histograms
(perfkit.probe.metrics: vLLM's, SGLang's, llama.cpp's or `perfkit engine serve`'s, which names its
families as vLLM does with a `perfkit:` prefix). A server's TTFT runs from the request's arrival to
its first token leaving the engine; the client's adds the network and the first frame.

Prompts have exactly `context` tokens on a byte-vocabulary server (the bundled engine); on another
the server's counts are checked, and a mismatch is in every note. Requests ask for `ignore_eos`, so a
server that honours it (vLLM, SGLang) generates all `gen` tokens; a shorter answer is counted.

A failed request (an HTTP error, an error frame, a dropped connection, no `[DONE]`, a timeout) is kept
with its error text, never dropped. aiohttp is needed (`pip install 'perfkit[serve]'`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from perfkit import units
from perfkit.engineoptions import EngineOptions
from perfkit.errors import UserError
from perfkit.probe import recording
from perfkit.probe.clientcost import overhead
from perfkit.probe.metrics import metrics_window, record_metrics
from perfkit.probe.servers import Remote, Server, identity, server
from perfkit.probe.streams import (
    Stream,
    Target,
    chunk_tokens,
    load_aiohttp,
    request,
    run_sync,
    served_model,
    spread,
    tokenize,
)
from perfkit.probe.workload import arrival_times, make_prompts

__all__ = [
    "EngineOptions",
    "RequestResult",
    "Remote",
    "Server",
    "Summary",
    "arrival_times",
    "identity",
    "make_prompts",
    "metrics_window",
    "overhead",
    "record",
    "record_metrics",
    "run",
    "server",
    "summary",
]

TIMEOUT_S = 600.0  # per request, the whole stream


@dataclass(frozen=True)
class RequestResult:
    """One measured request (seconds; the definitions are this module's docstring). `error` None: completed."""

    index: int  # among the measured requests, in the order they were planned
    error: str | None
    context: int  # the prompt tokens meant
    max_tokens: int
    prompt_tokens: int | None  # the server's usage.prompt_tokens
    tokenized: int | None  # the server's /tokenize count, None without that route
    prompt_mismatch: str | None  # why the server's counts differ from `context`, None when they agree
    output_tokens: int | None  # the server's usage.completion_tokens
    chunks: int  # text chunks
    frames: int  # data: frames, [DONE] excluded
    chunk_tokens: tuple[int, ...]  # tokens each text chunk carried
    token_source: str  # where chunk_tokens come from: "usage" (per chunk), "chunks" (one each), "bytes" (by size), ""
    start: float  # just before the POST, in seconds since the measured requests began
    end: float
    ttft: float | None
    e2e_latency: float | None
    itl_chunk: tuple[float, ...]
    itl: tuple[float, ...]  # per token; () when the tokens per chunk are unknown (token_source "")
    waited: float = 0.0  # seconds spent in run(each=...)'s context manager around this request

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        if self.ttft is None or self.e2e_latency is None or n is None or n < 2:
            return None
        return (self.e2e_latency - self.ttft) / (n - 1)

    @property
    def decode_tok_s(self) -> float | None:
        tpot = self.tpot
        return 1.0 / tpot if tpot else None

    @property
    def prefill_tok_s(self) -> float | None:
        if self.ttft is None or not self.prompt_tokens or self.ttft <= 0:
            return None
        return self.prompt_tokens / self.ttft


def _result(index: int, stream: Stream, target: Target, tokenized: int | None, origin: float) -> RequestResult:
    usage = stream.usage or {}
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    output_tokens = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None
    counts, source = chunk_tokens(stream, output_tokens)
    problems = []
    if tokenized is not None and tokenized != target.context:
        problems.append(f"/tokenize counted {tokenized}")
    if prompt_tokens is None:
        problems.append("no usage.prompt_tokens in the response")
    elif prompt_tokens != target.context:
        problems.append(f"usage.prompt_tokens is {prompt_tokens}")
    times = [t for t, _, _ in stream.chunks]
    first = times[0] - stream.start if times and not stream.error else None
    return RequestResult(
        index=index,
        error=stream.error,
        context=target.context,
        max_tokens=target.gen,
        prompt_tokens=prompt_tokens,
        tokenized=tokenized,
        prompt_mismatch=f"meant {target.context} tokens; " + ", ".join(problems) if problems else None,
        output_tokens=output_tokens,
        chunks=len(times),
        frames=stream.frames,
        chunk_tokens=tuple(counts),
        token_source=source,
        start=stream.start - origin,
        end=stream.end - origin,
        ttft=first,
        e2e_latency=stream.end - stream.start if not stream.error else None,
        itl_chunk=tuple(b - a for a, b in zip(times, times[1:])) if not stream.error else (),
        itl=tuple(spread(times, counts)) if not stream.error and source else (),  # never a gap per chunk
    )


async def _measured(session, target: Target, prompts: list[str], plan: dict[str, Any], window) -> list[RequestResult]:
    """The warm-up requests (excluded), then the measured ones at their arrival times, `concurrency` at a
    time, inside `window` when one is given."""
    tokenized: list[int | None] = []
    for prompt in prompts:
        tokenized.append(await tokenize(session, target, prompt) if not tokenized or tokenized[0] is not None else None)
    warmup = plan["warmup"]
    for i in range(warmup):
        stream = await request(session, target, prompts[i])
        if stream.error:
            print(f"perfkit.serving: warm-up request {i} failed: {stream.error}")
    gate = asyncio.Semaphore(plan["concurrency"])
    arrivals = arrival_times(len(prompts) - warmup, plan["rate"], plan["seed"])
    if window is not None:
        await asyncio.to_thread(window.__enter__)
    origin = time.perf_counter()

    each = plan["each"]

    async def one(i: int, at: float) -> RequestResult:
        await asyncio.sleep(max(0.0, origin + at - time.perf_counter()))
        async with gate:
            if each is None:
                stream = await request(session, target, prompts[warmup + i])
                return _result(i, stream, target, tokenized[warmup + i], origin)
            t = time.perf_counter()
            around = each()
            await asyncio.to_thread(around.__enter__)
            waited = time.perf_counter() - t
            try:
                stream = await request(session, target, prompts[warmup + i])
            finally:
                t = time.perf_counter()
                await asyncio.to_thread(around.__exit__, None, None, None)
                waited += time.perf_counter() - t
        return replace(_result(i, stream, target, tokenized[warmup + i], origin), waited=waited)

    try:
        results = list(await asyncio.gather(*(one(i, at) for i, at in enumerate(arrivals))))
    except BaseException as exc:
        if window is not None:
            await asyncio.to_thread(window.__exit__, type(exc), exc, exc.__traceback__)
        raise
    if window is not None:
        await asyncio.to_thread(window.__exit__, None, None, None)
    return results


def run(
    url: str,
    *,
    context: int,
    gen: int,
    concurrency: int = 1,
    requests: int | None = None,
    rate: float | None = None,
    warmup: int = 1,
    chat: bool = False,
    model: str | None = None,
    timeout: float = TIMEOUT_S,
    seed: int = 0,
    text: str | bytes | None = None,
    each: Callable[[], AbstractContextManager] | None = None,
    window: AbstractContextManager | None = None,
) -> list[RequestResult]:
    """Send `requests` streamed requests (4 x `concurrency` when None) of exactly `context` prompt tokens,
    `gen` tokens each at temperature 0, at most `concurrency` at once, sent at once or as a Poisson
    process of `rate` requests/s (seeded); `warmup` requests run first and are not returned. Every
    prompt is different (see make_prompts; `text` is what they are cut from). The prompt length is
    checked with `POST /tokenize` when the server has it and always against usage.prompt_tokens.

    `each`: a function returning a context manager that every measured request runs inside (with
    concurrency 1), e.g. `lambda: perfkit.profile_window(server)` for the server's own lines per
    request; the time its entry and exit take is in `waited`, never in a request's figures.
    `window`: a context manager entered after the warm-up and left when the last measured request
    ended, e.g. `serving.metrics_window(url)`: the server's own metrics of the measured requests alone.
    """
    checks = {"context": context, "gen": gen, "concurrency": concurrency, "requests": requests, "warmup": warmup}
    for name, value in checks.items():
        least = 0 if name == "warmup" else 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise UserError(f"serving.run: {name} must be an integer of at least {least}, got {value!r}")
    if requests is None:
        requests = 4 * concurrency
    arrival_times(0, rate)  # checks the rate
    if each is not None and concurrency != 1:
        raise UserError(f"serving.run: each= brackets one request at a time; concurrency must be 1, got {concurrency}")
    url = url.rstrip("/")
    model = model or served_model(url)
    prompts = make_prompts(warmup + requests, context, seed=seed, text=text, tag=uuid.uuid4().hex[:6])
    http = load_aiohttp()

    async def go() -> list[RequestResult]:
        connector = http.TCPConnector(limit=concurrency + 1)
        async with http.ClientSession(connector=connector) as session:
            target = Target(url, model, chat, gen, timeout, context)
            plan = {"warmup": warmup, "concurrency": concurrency, "rate": rate, "seed": seed, "each": each}
            return await _measured(session, target, prompts, plan, window)

    return run_sync(go)


@dataclass(frozen=True)
class Summary:
    """A run in figures: what served, what failed and why, and the run-level throughputs."""

    requests: int
    completed: int
    errors: tuple[str, ...]  # one per failed request, in order
    mismatches: tuple[str, ...]  # one per request whose prompt the server did not count as meant
    short: int  # completed requests that generated fewer tokens than asked
    wall_s: float
    output_tokens: int
    output_throughput: float  # tok/s
    request_throughput: float  # req/s
    token_sources: tuple[str, ...] = field(default=())

    @property
    def failed(self) -> int:
        return self.requests - self.completed

    def __str__(self) -> str:
        text = (
            f"{self.completed} of {self.requests} requests completed in {self.wall_s:.3f} s: "
            f"{units.format_number(self.output_throughput)} output tok/s, "
            f"{units.format_number(self.request_throughput)} req/s"
        )
        if self.failed:
            text += f"; FAILED {self.failed}: " + "; ".join(sorted(set(self.errors))[:3])
        if self.mismatches:
            text += f"; PROMPT LENGTH MISMATCH in {len(self.mismatches)}: {self.mismatches[0]}"
        if self.short:
            text += f"; {self.short} stopped before max_tokens"
        return text


def summary(results: list[RequestResult]) -> Summary:
    """The figures of a run's results (the run-level throughputs are defined in this module's docstring)."""
    ok = [r for r in results if r.ok]
    wall = max((r.end for r in results), default=0.0) - min((r.start for r in results), default=0.0)
    wall -= sum(r.waited for r in results)  # run(each=...)'s windows are not serving time
    tokens = sum(r.output_tokens or 0 for r in ok)
    return Summary(
        requests=len(results),
        completed=len(ok),
        errors=tuple(f"request {r.index}: {r.error}" for r in results if not r.ok),
        mismatches=tuple(f"request {r.index}: {r.prompt_mismatch}" for r in ok if r.prompt_mismatch),
        short=sum(1 for r in ok if r.output_tokens is not None and r.output_tokens < r.max_tokens),
        wall_s=wall,
        output_tokens=tokens,
        output_throughput=tokens / wall if wall > 0 else float("nan"),
        request_throughput=len(ok) / wall if wall > 0 else float("nan"),
        token_sources=tuple(sorted({r.token_source for r in ok})),
    )


_NONE = {  # why a figure has no sample although requests completed
    "itl": "the server said neither how many tokens each chunk carried nor how many it generated in all",
    "tpot": "no request generated two tokens with a usage count",
    "decode_tok_s": "no request generated two tokens with a usage count",
}


def _per_request(ok: list[RequestResult]) -> dict[str, tuple[str, list[float]]]:
    """name -> (unit, samples): one sample per completed request, or per chunk / token for the ITLs."""
    ms = 1e3
    return {
        "ttft": ("ms", [r.ttft * ms for r in ok if r.ttft is not None]),
        "tpot": ("ms", [r.tpot * ms for r in ok if r.tpot is not None]),
        "e2e_latency": ("ms", [r.e2e_latency * ms for r in ok if r.e2e_latency is not None]),
        "itl": ("ms", [x * ms for r in ok for x in r.itl]),
        "itl_chunk": ("ms", [x * ms for r in ok for x in r.itl_chunk]),
        "prefill_tok_s": ("tok/s", [r.prefill_tok_s for r in ok if r.prefill_tok_s is not None]),
        "decode_tok_s": ("tok/s", [r.decode_tok_s for r in ok if r.decode_tok_s is not None]),
        "output_tokens": ("tok", [float(r.output_tokens) for r in ok if r.output_tokens is not None]),
    }


def record(results: list[RequestResult], *, at: dict[str, Any] | None = None, prefix: str = "") -> Summary:
    """Record a run as perfkit samples under `prefix` + the names of this module's docstring; its Summary.

    One sample per completed request (ttft, tpot, e2e_latency, prefill_tok_s, decode_tok_s,
    output_tokens), one per token (itl) and per text chunk (itl_chunk), one per run for
    output_throughput, request_throughput and failed_requests (recorded first, and always, with the
    errors in its note). Prompt length mismatches are in every note. When no request completed this
    raises, so the probe's cell fails: a run that measured nothing is never "fine".
    """
    if not results:
        raise UserError("serving.record: no results to record (run() sent no request?)")
    s = summary(results)
    warn = f"; PROMPT LENGTH MISMATCH in {len(s.mismatches)} requests: {s.mismatches[0]}" if s.mismatches else ""
    failures = "; ".join(s.errors[:3]) + (f" (and {s.failed - 3} more)" if s.failed > 3 else "")
    recording.record(
        f"{prefix}failed_requests",
        [s.failed],
        unit="count",
        at=at,
        note=f"{s.failed} of {s.requests} requests FAILED: {failures}" if s.failed else f"none of {s.requests} failed",
    )
    if not s.completed:
        raise UserError(f"serving: all {s.requests} requests failed; {s.errors[0]}")
    base = f"{s.completed} completed requests{warn}"
    for name, (unit, samples) in _per_request([r for r in results if r.ok]).items():
        if not samples:
            print(f"perfkit.serving: no {name} to record ({_NONE[name] if name in _NONE else 'no request gave it'})")
            continue
        note = base
        if name == "itl":
            sources = ", ".join(filter(None, s.token_sources))
            note += f"; each chunk's gap spread over its tokens (tokens per chunk from {sources})"
        recording.record(prefix + name, samples, unit=unit, at=at, note=note)
    note = f"{s.output_tokens} tokens of {s.completed} requests in {s.wall_s:.3f} s{warn}"
    recording.record(f"{prefix}output_throughput", [s.output_throughput], unit="tok/s", at=at, note=note)
    recording.record(f"{prefix}request_throughput", [s.request_throughput], unit="req/s", at=at, note=note)
    return s
