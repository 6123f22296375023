"""perfkit against vLLM (its CPU build, `make thirdparty-vllm`), a server perfkit did not write.

One vLLM server for the module, on tinyhf.py's tiny Llama (a byte-level BPE, printable ASCII output
only, so each generated token is one streamed chunk). Checked: what perfkit.serving reads from it
(every request completes, `ignore_eos` gives all `gen` tokens, the tokens of each chunk from vLLM's
running usage, TTFT < end-to-end), vLLM's own Prometheus families over a window that holds the
measured requests alone, and a hypothesis on vLLM's own TTFT histogram judged by `perfkit run`, each
replicate a window of requests on this one server process.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from llamaserver import completed
from vllmserver import MODEL_NAME, ROOT, VllmServer, vllm_server, write_model

from perfkit import serving
from perfkit.probe.metrics import metrics_window
from perfkit.prometheus import scrape

CONTEXT, GEN, REQUESTS = 200, 16, 4
TTFT = "vllm:time_to_first_token_seconds"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory) -> Iterator[VllmServer]:
    folder = write_model(tmp_path_factory.mktemp("vllm") / "tiny-hf")
    with vllm_server(folder) as running:
        yield running


def test_a_run_reads_what_vllm_did(vllm):
    with serving.server(vllm.url) as srv:  # a URL: used as is, never stopped
        assert srv.identity()["model"] == MODEL_NAME
        results = completed(serving.run(srv.url, context=CONTEXT, gen=GEN, concurrency=2, requests=REQUESTS))
    s = serving.summary(results)
    assert (s.completed, s.failed, s.short) == (REQUESTS, 0, 0)  # ignore_eos honoured
    assert s.output_tokens == REQUESTS * GEN and s.token_sources == ("usage",)
    for r in results:
        assert r.output_tokens == r.max_tokens == GEN
        # the server's counts: a BPE vocabulary makes fewer tokens than bytes; vLLM's /tokenize and usage agree
        assert r.prompt_tokens is not None and 1 < r.prompt_tokens < CONTEXT
        assert r.tokenized == r.prompt_tokens, r.prompt_mismatch
        # vLLM sends the running usage in every chunk (continuous_usage_stats): the tokens of each chunk are
        # read, not inferred; printable ASCII tokens are one chunk each
        assert r.token_source == "usage" and r.chunk_tokens == (1,) * GEN and r.chunks == GEN
        assert r.frames >= GEN
        assert 0 < r.ttft < r.e2e_latency
        assert len(r.itl) == GEN - 1 and r.itl == r.itl_chunk and all(x >= 0 for x in r.itl)
        assert r.tpot is not None and r.tpot > 0


def test_vllms_own_metrics_over_the_window_are_the_measured_requests(vllm):
    families = scrape(f"{vllm.url}/metrics").types
    for name, kind in {
        TTFT: "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:generation_tokens": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:request_success": "counter",
        "process_start_time_seconds": "gauge",
    }.items():
        assert families.get(name) == kind, (name, families.get(name))
    with metrics_window(vllm.url) as w:  # the warm-up request runs before the window opens
        results = completed(serving.run(vllm.url, context=CONTEXT, gen=GEN, concurrency=2, requests=REQUESTS, window=w))
    ttft = w.histogram(TTFT)
    assert ttft.count == REQUESTS
    # vLLM's clock starts when the request reached it and stops when its first token left the engine:
    # inside the client's, which adds the HTTP round trip and the first frame
    assert 0 < ttft.sum <= sum(r.ttft for r in results)
    assert w.histogram("vllm:inter_token_latency_seconds").count == REQUESTS * (GEN - 1)
    assert w.histogram("vllm:e2e_request_latency_seconds").count == REQUESTS
    assert sum(w.counter("vllm:generation_tokens").values()) == REQUESTS * GEN
    assert sum(w.counter("vllm:prompt_tokens").values()) == sum(r.prompt_tokens for r in results)
    success = w.counter("vllm:request_success")
    assert {dict(labels)["finished_reason"]: n for labels, n in success.items() if n} == {"length": REQUESTS}
    # the start time of the API server's process (prometheus_client's process collector): the process the
    # test started, the same at both edges
    started = w.before.start_time()
    assert started is not None and started == w.after.start_time()
    assert abs(started - vllm.started_at) < 5.0


HYPOTHESIS = {
    "id": "vllm-server-ttft-p50-under-2-5s",
    "claim": "vLLM's own time to first token of a 512-token prompt has a median under 2.5 s, as its /metrics "
    "histogram says.",
    "rationale": "A tiny Llama on vLLM's CPU backend prefills a few hundred tokens in tens of milliseconds, on "
    "one thread of a busy machine too. perfkit's 512 tokens are meant for a byte vocabulary; this BPE makes "
    "about 280 of them. 2.5 s is an edge of vLLM's TTFT buckets, so the bucket that holds a window's median "
    "says which side of it that median is on.",
    "expect": {
        "kind": "at_most",
        "metric": "server_ttft_p50",
        "value": 2.5,
        "unit": "s",
        "at": {"phase": "ttft", "ctx": 512},
        "min_samples": 1,  # one p50 per window: the probe's five requests at 512 tokens are one histogram
    },
    "probe": {
        "notebook": "serve_context_decode.ipynb",
        "params": {
            "server_url": "URL",
            "metrics_prefix": "vllm:",
            "phases": ["ttft"],
            "ttft_contexts": [256, 512],
            "ttft_requests": 5,
        },
    },
}


def _project(root: Path, url: str):
    from perfkit.paths import Project

    (root / "notebooks").mkdir()
    (root / "hypotheses").mkdir()
    shutil.copy(ROOT / "notebooks" / "serve_context_decode.ipynb", root / "notebooks")
    record = json.loads(json.dumps(HYPOTHESIS).replace('"URL"', json.dumps(url)))
    (root / "hypotheses" / f"{record['id']}.yaml").write_text(json.dumps(record, indent=2))  # JSON is YAML
    return Project(root)


def test_a_hypothesis_on_vllms_own_ttft_is_judged_over_windows_of_one_process(vllm, tmp_path, monkeypatch):
    from perfkit.experiment.run import runner, schedule
    from perfkit.experiment.run.options import RunOptions

    project = _project(tmp_path, vllm.url)
    monkeypatch.setattr(runner, "source_tree_hash", lambda: "fixed-source")
    # the server's own load is the measurement's (run/windows.py watches it with the probe's tree); other work on
    # this machine (another test's, another session's) is not, and would make the verdict "not fit" here
    monkeypatch.setattr(schedule.fitness, "unfit", lambda trace, window=None, limits=None: None)
    t = time.monotonic()
    options = RunOptions(ids=(HYPOTHESIS["id"],), replicates=2, jobs=1, timeout_s=300)
    report = runner.run(project, options, out=print)  # `perfkit run --replicates 2` in this process
    (h,) = report.results.hypotheses
    m = h.measured
    said = f"{m.label} {m.value:.3g} {m.unit} ({m.low:.3g}-{m.high:.3g}, {m.replicates} replicates)" if m else h.reason
    print(f"{h.id}: {h.verdict} in {time.monotonic() - t:.0f} s: {said}")
    for line in h.warnings:
        print("warning:", line)
    assert h.verdict in ("confirmed", "refuted"), h.reason
    assert all(x.status == "ok" and x.server["model"] == MODEL_NAME for x in h.executions)
    starts = {x.server_instance[side]["start_time"] for x in h.executions for side in ("before", "after")}
    (start,) = starts  # one process, read at four edges: the one the fixture started
    assert abs(start - vllm.started_at) < 5.0
    (said,) = [w for w in h.warnings if "windows of requests on one process" in w]
    assert vllm.url in said and "not processes of their own" in said
    ledger = project.ledger_path.read_text()
    assert f"served by {MODEL_NAME} at {vllm.url}" in ledger
    assert "each replicate a window of requests on that running server" in ledger


TEXTS = (
    "def f(x):\n    return x + 1",
    "Hello, world!  Two  spaces\tand a tab",
    "ünïcödé € 日本",
    " a leading space",
    "",
)


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def test_the_tokenizer_folder_gives_llama_servers_ids(vllm, server):
    """tinymodel.write_tokenizer's folder (what vLLM loads with AutoTokenizer, and AIPerf would) against the
    GGUF's vocabulary as llama-server reads it: the same ids, BOS first, for ASCII, whitespace and UTF-8."""
    for text in TEXTS:
        ours = _post(f"{vllm.url}/tokenize", {"model": MODEL_NAME, "prompt": text})["tokens"]
        theirs = _post(f"{server.url}/tokenize", {"content": text, "add_special": True})["tokens"]
        assert ours == theirs, text
        assert ours[0] == 0 and len(ours) <= len(text.encode()) + 1  # BOS (id 0), then at most a token a byte
