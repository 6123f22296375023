"""perfkit.serving against a real HTTP server on 127.0.0.1 that streams scripted chunks.

The scripts are the shapes real servers send and serving benchmarks miscount: a role-only first
chunk, several tokens in one chunk (a speculative step), an empty finish chunk, a usage-only
chunk, an error frame mid-stream, a dropped connection, a wrong prompt count. Timings are set by
the server's sleeps, so what the client measures is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest

from perfkit.errors import UserError
from perfkit.probe import serving
from perfkit.probe.streams import Stream, chunk_tokens, spread

web = pytest.importorskip("aiohttp.web")

GAP_S = 0.15  # between the role-only chunk and the first text, and between text chunks
#: a gap as the client sees it: the server sleeps GAP_S between writes, but the earlier chunk can reach the
#: client a little later than the next one does after it (0.1498 s was seen for 0.15 s)
SEEN_GAP_S = GAP_S - 0.01


def _frame(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Scripted:
    """An OpenAI-style server whose /v1/completions stream follows `self.script` (settable per test)."""

    def __init__(self):
        self.script = "speculative"
        self.prompt_offset = 0  # added to usage.prompt_tokens (a server that counts differently)
        self.seen_prompts: list[str] = []

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "scripted", "root": "scripted"}]})

    async def completions(self, request):
        body = await request.json()
        prompt = body["prompt"]
        self.seen_prompts.append(prompt)
        if self.script == "http-error":
            return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        continuous = body.get("stream_options", {}).get("continuous_usage_stats") and self.script != "no-running"
        usage = {"prompt_tokens": len(prompt) + self.prompt_offset}
        await response.write(_frame({"choices": [{"index": 0, "text": ""}]}))  # an empty first chunk
        await asyncio.sleep(GAP_S)
        done = 0
        for piece in ("abc", "de"):  # a speculative step sends 3 tokens, the next 2
            done += len(piece)
            frame = {"choices": [{"index": 0, "text": piece}]}
            if continuous:
                frame["usage"] = {**usage, "completion_tokens": done, "total_tokens": usage["prompt_tokens"] + done}
            await response.write(_frame(frame))
            if self.script == "error-frame":
                await response.write(_frame({"error": {"message": "rank 1 (pid 9) died: killed by SIGKILL"}}))
                return response
            if self.script == "dropped":
                return response  # ends without [DONE]
            await asyncio.sleep(GAP_S)
        await response.write(_frame({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))
        total = {**usage, "completion_tokens": done, "total_tokens": usage["prompt_tokens"] + done}
        await response.write(_frame({"choices": [], "usage": total}))  # the usage-only chunk
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture(scope="module")
def scripted():
    state = Scripted()
    app = web.Application()
    app.router.add_get("/v1/models", state.models)
    app.router.add_post("/v1/completions", state.completions)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _one(url: str, **kw) -> serving.RequestResult:
    (result,) = serving.run(url, context=32, gen=5, concurrency=1, requests=1, warmup=0, **kw)
    return result


def test_the_first_token_is_the_first_chunk_with_text_and_itl_is_per_token(scripted):
    state, url = scripted
    state.script = "speculative"
    r = _one(url)
    assert r.ok, r.error
    assert SEEN_GAP_S <= r.ttft < GAP_S + 0.1  # the empty first chunk, sent at once, is not the first token
    assert (r.chunks, r.frames, r.output_tokens, r.prompt_tokens) == (2, 5, 5, 32)
    assert r.chunk_tokens == (3, 2) and r.token_source == "usage"
    assert len(r.itl_chunk) == 1 and SEEN_GAP_S <= r.itl_chunk[0] < GAP_S + 0.1
    assert len(r.itl) == 2 and r.itl[0] == pytest.approx(r.itl_chunk[0] / 2)  # the gap spread over its 2 tokens
    assert r.e2e_latency >= 3 * GAP_S and r.tpot == pytest.approx((r.e2e_latency - r.ttft) / 4)
    assert r.prompt_mismatch is None


def test_without_running_usage_tokens_per_chunk_come_from_their_bytes(scripted):
    state, url = scripted
    state.script = "no-running"
    r = _one(url)
    assert r.ok and r.chunk_tokens == (3, 2) and r.token_source == "bytes"


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("error-frame", "error frame: rank 1 (pid 9) died"),
        ("dropped", "before data: [DONE]"),
        ("http-error", "HTTP 503"),
    ],
)
def test_a_failed_request_is_kept_with_its_reason(scripted, script, words):
    state, url = scripted
    state.script = script
    results = serving.run(url, context=32, gen=5, concurrency=2, requests=2, warmup=0)
    assert [r.ok for r in results] == [False, False]
    assert all(words in r.error and r.ttft is None and r.itl == () for r in results)
    s = serving.summary(results)
    assert s.failed == 2 and "FAILED 2" in str(s)
    with pytest.raises(UserError, match="all 2 requests failed"):
        serving.record(results)


def test_a_prompt_the_server_counts_differently_is_flagged(scripted, capsys):
    state, url = scripted
    state.script, state.prompt_offset = "speculative", 3
    try:
        results = serving.run(url, context=40, gen=5, concurrency=2, requests=3, warmup=1)
    finally:
        state.prompt_offset = 0
    assert len(results) == 3 and all(r.ok for r in results)
    assert all(r.prompt_mismatch == "meant 40 tokens; usage.prompt_tokens is 43" for r in results)
    s = serving.record(results, at={"ctx": 40})
    printed = capsys.readouterr().out
    assert "PROMPT LENGTH MISMATCH in 3" in str(s) and "PROMPT LENGTH MISMATCH" in printed


def test_every_prompt_differs_from_its_first_byte_on_and_has_the_length_asked(scripted):
    state, url = scripted
    state.script = "speculative"
    state.seen_prompts.clear()
    serving.run(url, context=64, gen=5, concurrency=3, requests=6, warmup=2)
    seen = state.seen_prompts
    assert len(seen) == 8 and len(set(seen)) == 8 and {len(p) for p in seen} == {64}
    assert all(not b.startswith(a[:16]) for a in seen for b in seen if a is not b)  # no shared prefix


def test_concurrency_bounds_requests_in_flight(scripted):
    state, url = scripted
    state.script = "speculative"
    results = serving.run(url, context=32, gen=5, concurrency=2, requests=4, warmup=0)
    starts = sorted(r.start for r in results)
    assert starts[2] >= min(r.end for r in results) - 0.01  # the third waits for one of the first two
    s = serving.summary(results)
    assert s.completed == 4 and s.output_tokens == 20
    assert s.output_throughput == pytest.approx(20 / s.wall_s)


def test_stream_rules_on_chat_frames():
    s = Stream(chat=True)
    s.feed(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}', 1.0)
    s.feed(b": keep-alive comment", 1.1)
    s.feed(b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":{"completion_tokens":2}}', 2.0)
    s.feed(b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}', 2.5)
    s.feed(b"data: [DONE]", 3.0)
    assert s.done and s.error is None and s.frames == 3
    assert s.chunks == [(2.0, 2, 2)] and s.usage == {"prompt_tokens": 4, "completion_tokens": 2}
    assert chunk_tokens(s, 2) == ([2], "usage")
    bad = Stream(chat=True)
    bad.feed(b"event: error", 0.0)
    bad.feed(b'data: {"message": "boom"}', 0.1)
    assert bad.error == "error frame: boom"


def test_spread_and_byte_split_keep_every_token():
    assert spread([0.0, 0.3, 0.4], [1, 3, 1]) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert spread([0.0, 0.2, 0.5], [1, 0, 2]) == pytest.approx([0.25, 0.25])  # a chunk with no token passes its gap on
    s = Stream(chat=False)
    for t, text in enumerate(("aaaa", "bb", "c")):
        s.feed(b'data: {"choices":[{"text":"' + text.encode() + b'"}]}', float(t))
    counts, source = chunk_tokens(s, 10)
    assert source == "bytes" and sum(counts) == 10 and counts[0] > counts[1] >= counts[2]


def test_arrivals_and_bad_arguments():
    times = serving.arrival_times(2000, 50.0, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0 and sum(gaps) / len(gaps) == pytest.approx(1 / 50, rel=0.1)
    assert serving.arrival_times(3, None) == [0.0, 0.0, 0.0]
    for bad in (dict(context=0), dict(gen=-1), dict(concurrency=True), dict(requests=1.5)):
        with pytest.raises(UserError, match="must be an integer of at least 1"):
            serving.run("http://127.0.0.1:9", **{"context": 32, "gen": 4, **bad})
    with pytest.raises(UserError, match="rate"):
        serving.run("http://127.0.0.1:9", context=32, gen=4, rate=0)
    with pytest.raises(UserError, match="too short"):
        serving.make_prompts(3, 2)


def test_the_overhead_benchmark_reads_the_same_streams_both_ways(scripted):
    state, url = scripted
    state.script = "speculative"
    out = serving.overhead(url, requests=2, gen=5, context=32)
    client, bare = out["client"], out["bare"]
    assert client["frames"] == bare["frames"] == 2 * 5  # empty, 2 texts, finish, usage-only per request
    assert client["text_chunks"] == 4
    assert client["cpu_us_per_frame"] > 0 and bare["cpu_us_per_frame"] > 0
    assert "us of CPU" in out["text"] and out["overhead_us_per_frame"] == pytest.approx(
        client["cpu_us_per_frame"] - bare["cpu_us_per_frame"]
    )


def test_each_request_can_run_inside_its_own_window(scripted):
    state, url = scripted
    state.script = "speculative"
    entered: list[str] = []

    @contextlib.contextmanager
    def window():
        entered.append("in")
        time.sleep(0.2)  # a profile window settling at its edge
        yield
        time.sleep(0.2)
        entered.append("out")

    results = serving.run(url, context=32, gen=5, concurrency=1, requests=3, warmup=1, each=window)
    assert entered == ["in", "out"] * 3  # the measured requests only, one at a time
    assert all(r.ok and r.waited >= 0.4 and r.ttft < GAP_S + 0.1 for r in results)
    s = serving.summary(results)
    assert s.wall_s < sum(r.e2e_latency for r in results) + 0.1  # the windows' edges are not serving time
    with pytest.raises(UserError, match="concurrency must be 1"):
        serving.run(url, context=32, gen=5, concurrency=2, each=window)


def test_a_request_on_a_connection_the_server_had_closed_is_sent_again_and_a_dead_server_still_fails():
    """A server that drops a connection before answering (a keep-alive connection it had closed, as
    llama.cpp's does after a few requests): the request goes again on a new connection; a server that
    drops every one is still a failure, said, after the retries."""
    import socket

    from perfkit.probe import streams

    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        b'data: {"choices":[{"index":0,"text":"ab","finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
    )

    def serve(listener, drops: int, served: list[int]):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                served.append(1)
                if len(served) > drops:
                    conn.sendall(answer)

    async def one(url: str):
        client = streams.load_aiohttp()
        async with client.ClientSession() as session:
            target = streams.Target(url, "m", False, 2, 10.0, 3)
            return await streams.request(session, target, "abc")

    for drops, ok in ((1, True), (streams.STALE_RETRIES + 1, False)):
        listener = socket.create_server(("127.0.0.1", 0))
        served: list[int] = []
        thread = threading.Thread(target=serve, args=(listener, drops, served), daemon=True)
        thread.start()
        try:
            stream = asyncio.run(one(f"http://127.0.0.1:{listener.getsockname()[1]}"))
        finally:
            listener.close()
        assert (stream.error is None and stream.done) is ok, stream.error
        assert len(served) == min(drops + 1, streams.STALE_RETRIES + 1)
        if not ok:
            assert "ServerDisconnectedError" in stream.error
