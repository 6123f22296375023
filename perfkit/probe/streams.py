"""One streamed request to an OpenAI-compatible server, and the one rule of which chunk carries text.

`request` sends a completion (or chat completion) with `stream: true` and reads its server-sent
events line by line into a `Stream`; every outcome, errors included, ends in the Stream. `Stream`
says which frames are text chunks (its docstring holds the rule, here and nowhere else);
`chunk_tokens` and `spread` turn its chunks into tokens per chunk and per-token gaps. aiohttp is
needed (`pip install 'perfkit[serve]'`), imported on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from perfkit.endpoints import identity
from perfkit.errors import UserError

__all__ = [
    "Stream",
    "Target",
    "chunk_tokens",
    "load_aiohttp",
    "request",
    "run_sync",
    "served_model",
    "spread",
    "tokenize",
]


STALE_RETRIES = 2  # a request whose pooled connection the server had closed is sent again this many times at most


def load_aiohttp():
    """The aiohttp module, or a UserError that says how to install it."""
    try:
        import aiohttp
    except ImportError:
        raise UserError("perfkit.serving needs aiohttp: pip install 'perfkit[serve]'") from None
    return aiohttp


def served_model(url: str) -> str:
    """The first model the server at `url` names (`GET /v1/models`); a UserError when it names none."""
    model = identity(url)["model"]
    if not model:
        raise UserError(f"serving: {url}/v1/models named no model; pass model=")
    return str(model)


def run_sync(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine to its end, also from a notebook, whose thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


@dataclass(frozen=True)
class Target:
    """What every request of a run shares."""

    url: str
    model: str
    chat: bool
    gen: int
    timeout: float
    context: int

    def body(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.gen, "temperature": 0, "stream": True}
        body["ignore_eos"] = True  # vLLM's and SGLang's: generate all `gen` tokens (the bundled engine always does)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1/chat/completions" if self.chat else f"{self.url}/v1/completions"


async def tokenize(session, target: Target, prompt: str) -> int | None:
    """The server's count of `prompt`'s tokens through `POST /tokenize`, None when it has no such route.

    Asked in vLLM's form (`{"model", "prompt"}`, special tokens counted as a completion counts them); a
    server that counts no token of a non-empty prompt so is asked again in llama.cpp's form
    (`{"content", "add_special": true}`): llama-server answers `{"tokens": []}` to a body without "content".
    """
    count = await _tokenize(session, target, {"model": target.model, "prompt": prompt})
    if count == 0 and prompt:
        count = await _tokenize(session, target, {"content": prompt, "add_special": True})
    return count


async def _tokenize(session, target: Target, body: dict[str, Any]) -> int | None:
    try:
        async with session.post(f"{target.url}/tokenize", json=body) as response:
            if response.status != 200:
                return None
            answer = await response.json(content_type=None)
    except (load_aiohttp().ClientError, OSError, ValueError):  # the requests themselves will say what is wrong
        return None
    if isinstance(answer, dict) and isinstance(answer.get("count"), int):
        return answer["count"]
    if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
        return len(answer["tokens"])
    return None


async def request(session, target: Target, prompt: str, *, meter: dict[str, float] | None = None) -> Stream:
    """One streamed request, read line by line; every outcome ends in the returned Stream, errors included.

    With `meter`, the time this client spends on its lines ("handling") and the thread's CPU time are added to it.
    A request whose pooled connection the server had already closed (llama.cpp's server closes a keep-alive
    connection after a few requests) fails before any answer: it is sent again on a new connection, up to
    STALE_RETRIES times, its clock restarted (the server never saw the first attempt).
    """
    client = load_aiohttp()
    stream = Stream(chat=target.chat)
    cpu = time.thread_time()
    for attempt in range(1 + STALE_RETRIES):
        stream.start = time.perf_counter()
        answered = False
        try:
            async with session.post(
                target.endpoint, json=target.body(prompt), timeout=client.ClientTimeout(total=target.timeout)
            ) as response:
                answered = True
                if response.status != 200:
                    text = (await response.text(errors="replace"))[:300]
                    stream.fail(f"HTTP {response.status}: {' '.join(text.split())}")
                else:
                    async for line in response.content:
                        t = time.perf_counter()
                        stream.feed(line, t)
                        if meter is not None:
                            meter["handling"] += time.perf_counter() - t
                        if stream.done or stream.error:
                            break
        except TimeoutError:
            stream.fail(f"timed out after {target.timeout:g} s")
        except (client.ClientError, OSError) as exc:
            stale = (client.ServerDisconnectedError, client.ClientOSError)  # before any answer: a closed keep-alive
            if not answered and attempt < STALE_RETRIES and isinstance(exc, stale):
                continue  # a pooled connection the server had closed: the request never reached it; again, afresh
            stream.fail(f"{type(exc).__name__}: {exc}")
        break
    stream.end = time.perf_counter()
    if not stream.done and not stream.error:
        stream.fail("the stream ended before data: [DONE] (connection dropped?)")
    if meter is not None:
        meter["cpu"] += time.thread_time() - cpu
    return stream


def _choice_text(choice: Any, chat: bool) -> str:
    if not isinstance(choice, dict):
        return ""
    part = choice.get("delta") if chat else choice
    text = part.get("content" if chat else "text") if isinstance(part, dict) else None
    return text if isinstance(text, str) else ""


@dataclass
class Stream:
    """One streamed response read line by line: its frames, its text chunks, its usage, its end.

    The rule of which frame is a text chunk lives here and nowhere else: a text
    chunk is a `data:` frame in which a choice carries a non-empty string of generated text
    (`choices[i].text` for completions, `choices[i].delta.content` for chat). A role-only chunk, an
    empty-text chunk (a finish reason alone) and a usage-only chunk (`choices: []`) are frames: read
    for their `usage`, never a text chunk. An error frame (`{"error": ...}`, `{"object": "error"}`, or
    any frame after `event: error`) ends the stream as a failure; `data: [DONE]` ends it well.
    """

    chat: bool
    start: float = 0.0
    end: float = 0.0
    frames: int = 0  # data: frames, [DONE] excluded
    chunks: list[tuple[float, int, int | None]] = field(default_factory=list)  # (time, UTF-8 bytes, running tokens)
    usage: dict[str, Any] | None = None  # the last usage any frame carried
    done: bool = False
    error: str | None = None
    _event: str = ""

    def fail(self, error: str) -> None:
        if self.error is None:
            self.error = error

    def feed(self, line: bytes, t: float) -> None:
        """One line of the SSE stream, received at `t` (time.perf_counter)."""
        line = line.strip()
        if line.startswith(b"event:"):
            self._event = line[6:].strip().decode("utf-8", "replace")
            return
        if not line.startswith(b"data:"):
            return  # blank lines end frames; ":" lines are comments; id: and retry: mean nothing here
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        self.frames += 1
        try:
            frame = json.loads(payload)
        except ValueError:
            self.fail(f"a frame that is not JSON: {payload[:200].decode('utf-8', 'replace')!r}")
            return
        if not isinstance(frame, dict) or self._event == "error" or "error" in frame or frame.get("object") == "error":
            error = frame.get("error", frame) if isinstance(frame, dict) else frame
            message = error.get("message", error) if isinstance(error, dict) else error
            self.fail(f"error frame: {str(message)[:300]}")
            return
        if isinstance(frame.get("usage"), dict):
            self.usage = frame["usage"]
        choices = frame.get("choices") if isinstance(frame.get("choices"), list) else []
        text = "".join(_choice_text(c, self.chat) for c in choices)
        if text:
            running = self.usage.get("completion_tokens") if isinstance(frame.get("usage"), dict) else None
            self.chunks.append((t, len(text.encode("utf-8")), running if isinstance(running, int) else None))


def chunk_tokens(stream: Stream, output_tokens: int | None) -> tuple[list[int], str]:
    """Tokens each text chunk carried and where the counts come from ("usage", "chunks", "bytes" or "").

    "usage": the running counts the chunks carried. Without them, the final count: as many tokens as
    text chunks is one each ("chunks", exact on any vocabulary: a text chunk carries at least one
    token; llama.cpp's llama-server streams so); more is split by the chunks' UTF-8 bytes ("bytes",
    exact only for a byte vocabulary).
    """
    running = [r for _, _, r in stream.chunks]
    if running and all(r is not None for r in running):
        return [b - a for a, b in zip([0, *running], running)], "usage"
    sizes = [b for _, b, _ in stream.chunks]
    if not sizes or output_tokens is None or output_tokens < len(sizes):
        return [1] * len(sizes), ""
    if output_tokens == len(sizes):
        return [1] * len(sizes), "chunks"
    # the largest-remainder split of output_tokens over the chunks by their bytes: the counts sum exactly
    shares = [output_tokens * b / sum(sizes) for b in sizes]
    counts = [int(x) for x in shares]
    order = sorted(range(len(sizes)), key=lambda i: counts[i] - shares[i])
    for i in order[: output_tokens - sum(counts)]:
        counts[i] += 1
    return counts, "bytes"


def spread(times: list[float], counts: list[int]) -> list[float]:
    """Per-token gaps: each text chunk's gap to the one before, split evenly over the tokens it carried.

    A chunk that carried no token (its running count did not move) passes its gap on to the next one.
    """
    out: list[float] = []
    carried = 0.0
    for (before, now), n in zip(zip(times, times[1:]), counts[1:]):
        carried += now - before
        if n > 0:
            out += [carried / n] * n
            carried = 0.0
    return out
