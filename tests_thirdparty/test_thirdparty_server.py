"""perfkit.serving against a server perfkit did not write: llama.cpp's llama-server (`make test-thirdparty`).

The server runs the tiny Llama of tinymodel.py: a byte-level BPE vocabulary (a prompt of N ASCII
bytes is fewer than N tokens, BOS added), and an output head that only ever emits printable ASCII
tokens, so each generated token is one streamed chunk. What is checked is what perfkit.serving
reads from a real third-party server: every request completes, `ignore_eos` gives all `gen` tokens,
the prompt counts are the server's (usage and /tokenize agree), TTFT < end-to-end latency, a per-token
ITL, and the server's own Prometheus counters over the measured window match what the client saw.
"""

from __future__ import annotations

import json
import urllib.request

from llamaserver import MODEL_NAME, completed, group_alive, llama_server, stop

from perfkit import serving
from perfkit.probe.metrics import metrics_window
from perfkit.prometheus import scrape

CONTEXT, GEN = 200, 24


def test_a_run_reads_what_the_server_did(server):
    with serving.server(server.url) as srv:  # a URL: used as is, never stopped
        assert srv.identity()["model"] == MODEL_NAME
        results = completed(serving.run(srv.url, context=CONTEXT, gen=GEN, concurrency=2, requests=4))
    s = serving.summary(results)
    assert (s.completed, s.failed, s.short) == (4, 0, 0)  # ignore_eos honoured: no request stopped early
    assert s.output_tokens == 4 * GEN
    for r in results:
        assert r.output_tokens == GEN and r.max_tokens == GEN
        # the server's counts: a BPE vocabulary makes fewer tokens than bytes, and /tokenize (llama.cpp's
        # form, BOS counted as a completion counts it) agrees with usage.prompt_tokens
        assert r.prompt_tokens is not None and 1 < r.prompt_tokens < CONTEXT
        assert r.tokenized == r.prompt_tokens, r.prompt_mismatch
        assert r.prompt_mismatch == f"meant {CONTEXT} tokens; /tokenize counted {r.tokenized}, " + (
            f"usage.prompt_tokens is {r.prompt_tokens}"
        )
        assert 0 < r.ttft < r.e2e_latency
        # llama-server sends usage only in its last frame; one text chunk per generated token (an ASCII-only
        # model) is what perfkit then knows each chunk carried, so every gap is a gap per token
        assert r.chunks == GEN and r.frames >= GEN
        assert r.chunk_tokens == (1,) * GEN and r.token_source == "chunks"
        assert len(r.itl) == GEN - 1 and r.itl == r.itl_chunk and all(x >= 0 for x in r.itl)
        assert r.tpot is not None and r.tpot > 0


def _stream(url: str, body: dict) -> list[dict]:
    request = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    frames = []
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                frames.append(json.loads(line[5:]))
    return frames


def test_each_text_chunk_carries_one_token(server):
    """The ground truth for the chunk counts above: llama.cpp's running count in every chunk
    (`timings_per_token`: `timings.predicted_n`, its own name for what vLLM's continuous usage gives)."""
    body = {"model": MODEL_NAME, "prompt": "def f(x):\n    return", "max_tokens": GEN, "temperature": 0}
    frames = _stream(server.url, body | {"stream": True, "ignore_eos": True, "timings_per_token": True})
    texts = [f for f in frames if f["choices"] and f["choices"][0].get("text")]
    assert [f["timings"]["predicted_n"] for f in texts] == list(range(1, GEN + 1))
    assert all(c.isascii() for f in texts for c in f["choices"][0]["text"])
    assert frames[-1]["usage"]["completion_tokens"] == GEN


def test_the_servers_counters_over_the_window_match_the_run(server):
    families = scrape(f"{server.url}/metrics").types
    for name in ("llamacpp:tokens_predicted", "llamacpp:prompt_tokens", "llamacpp:n_decode"):
        assert families.get(name) == "counter", sorted(families)
    with metrics_window(server.url) as window:
        results = completed(serving.run(server.url, context=CONTEXT, gen=GEN, concurrency=2, requests=4, window=window))
    predicted = window.counter("llamacpp:tokens_predicted")
    prompt = window.counter("llamacpp:prompt_tokens")
    cached = window.counter("llamacpp:prompt_tokens_cached")
    # exactly the measured requests' tokens: the warm-up request ran before the window opened
    assert sum(predicted.values()) == sum(r.output_tokens for r in results) == 4 * GEN
    # each prompt's tokens were either computed or taken from the server's prefix cache
    assert sum(prompt.values()) + sum(cached.values()) == sum(r.prompt_tokens for r in results)
    assert all(after == 0 for _, after in window.gauge("llamacpp:requests_processing").values())


def test_the_server_stops_and_leaves_no_process(tiny_model):
    with llama_server(tiny_model) as other:
        pid = other.process.pid
        assert group_alive(pid)
        results = completed(serving.run(other.url, context=CONTEXT, gen=4, requests=1, warmup=0))
        assert results[0].output_tokens == 4
    assert not group_alive(pid) and other.process.returncode is not None
    assert stop(other) == other.process.returncode  # stopping twice is harmless
