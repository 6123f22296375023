"""`perfkit engine serve` as a real subprocess with two ranks, driven by the official OpenAI client
and by perfkit.serving, the client the probes use."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from perfkit.engine import data, load_engine  # noqa: E402
from perfkit.engine.serve.app import Reply, _stream  # noqa: E402
from perfkit.engine.serve.metrics import ServerMetrics  # noqa: E402
from perfkit.engine.serve.scheduler import Job  # noqa: E402
from perfkit.engineoptions import EngineOptions  # noqa: E402
from perfkit.probe import serving  # noqa: E402
from perfkit.probe.servers import Server, free_port, get_json  # noqa: E402

PROMPT = "def main():\n    return "
MODEL = "perfkit-shipped"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def engine():
    return load_engine("shipped", seed=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(
        EngineOptions(tp=2, preset="shipped"),
        args=("--batch-wait-ms", "50"),
        env={"PERFKIT_PROFILE": "1", "PERFKIT_PROFILE_INTERVAL": "0.5"},
        log_dir=tmp_path_factory.mktemp("serve"),
        startup_timeout=120,
    )
    with srv:
        yield srv


@pytest.fixture
def own_server(tmp_path):
    """A server of its own for a test that stops or breaks it: the module's stay up for the others,
    whatever order they run in (`-k`, a random order)."""
    srv = Server(
        EngineOptions(tp=2, preset="tiny-random"),
        env={"PERFKIT_PROFILE": "1", "PERFKIT_PROFILE_INTERVAL": "0.5"},
        log_dir=tmp_path,
        startup_timeout=120,
    )
    with srv:
        yield srv


def _clock():
    return ServerMetrics("m", running=lambda: 0, waiting=lambda: 0).arrived()


def _greedy(engine, prompt: str, n: int) -> str:
    return data.decode(engine.generate([data.encode(prompt)], max_new_tokens=n).tokens[0])


def test_the_model_and_the_engine_identity(server):
    model = _client(server.url).models.list().data[0]
    assert model.id == MODEL and model.root == "shipped"
    status, headers, body = get_json(server.url + "/v1/models")
    engine = body["data"][0]["perfkit"]
    assert engine["tp"] == 2 and engine["preset"] == "shipped" and engine["mode"] == "spec"
    assert engine["mask"] == "compact" and engine["tree"] == "vectorized" and engine["version"]
    assert engine["server_pid"] == server.pid and len(engine["pids"]) == 2
    assert all(_alive(pid) for pid in engine["pids"])
    assert "preset=shipped tp=2 mode=spec" in headers["x-perfkit-engine"]
    assert "ready at " + server.url + " (tp 2, ranks pid " in server.log_text()


def test_completions_streamed_and_not_give_the_engines_greedy_text(server, engine):
    client = _client(server.url)
    expected = _greedy(engine, PROMPT, 24)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(PROMPT), 24)
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, stream=True, stream_options=options)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24  # the usage-only chunk
    assert chunks[-2].choices[0].finish_reason == "length"
    running = [c.usage.completion_tokens for c in chunks if c.choices and c.choices[0].text]
    assert running[-1] == 24 and max(b - a for a, b in zip([0, *running], running)) > 1  # a step, several tokens
    plain = list(client.completions.create(model=MODEL, prompt=[data.encode(PROMPT)][0], max_tokens=24, stream=True))
    assert "".join(c.choices[0].text for c in plain if c.choices) == expected
    assert all(c.choices and c.usage is None for c in plain)  # no usage unless asked


def test_chat_completions(server, engine):
    client = _client(server.url)
    messages = [{"role": "user", "content": PROMPT}]
    expected = _greedy(engine, PROMPT, 16)  # one user message is its content as is
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"
    two = [{"role": "system", "content": "Be brief."}, *messages]
    expected = _greedy(engine, f"system: Be brief.\nuser: {PROMPT}\nassistant: ", 8)
    assert (
        client.chat.completions.create(model=MODEL, messages=two, max_tokens=8).choices[0].message.content == expected
    )


def test_concurrent_streams_share_a_batch(server):
    client = _client(server.url)
    before = get_json(server.url + "/stats")[2]

    def one(i: int) -> str:
        stream = client.completions.create(model=MODEL, prompt=f"{i} {PROMPT}", max_tokens=20, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(one, range(4)))
    assert all(len(t.encode()) == 20 for t in texts)
    after = get_json(server.url + "/stats")[2]
    assert after["requests"] - before["requests"] == 4 and after["batches"] - before["batches"] < 4
    assert after["largest_batch"] >= 2


def test_a_client_that_leaves_does_not_break_the_batch(server):
    client = _client(server.url)

    def leaver() -> None:
        stream = client.completions.create(model=MODEL, prompt="x" + PROMPT, max_tokens=200, stream=True)
        next(iter(stream))
        stream.close()

    def stayer() -> str:
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        left, stayed = pool.submit(leaver), pool.submit(stayer)
        left.result(30)
        assert len(stayed.result(30).encode()) == 200
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).usage.completion_tokens == 4


def test_errors_are_openai_shaped(server):
    client = _client(server.url)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="do not fit"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.completions.create(model=MODEL, prompt=PROMPT, n=2)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt=PROMPT)
    status, body = _post(server.url + "/v1/completions", {"max_tokens": 2})
    assert status == 400 and body["error"]["code"] == 400 and "prompt" in body["error"]["message"]
    request = urllib.request.Request(server.url + "/v1/completions", b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400 and "JSON" in json.loads(caught.value.read())["error"]["message"]
    deep = b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"  # a 500 and a traceback, once
    request = urllib.request.Request(server.url + "/v1/completions", deep, method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400 and "nested too deep" in json.loads(caught.value.read())["error"]["message"]
    status, headers, body = get_json(server.url + "/v2/nothing")
    assert status == 404 and body["error"]["type"] == "NotFoundError" and "x-perfkit-engine" in headers


def test_tokenize_counts_bytes(server):
    status, body = _post(server.url + "/tokenize", {"model": MODEL, "prompt": "héllo"})
    assert status == 200 and body["count"] == 6 and body["tokens"] == data.encode("héllo")
    assert body["max_model_len"] > 1000
    assert _post(server.url + "/tokenize", {"text": "ab"})[1]["count"] == 2


def test_the_probes_client_measures_it(server):
    results = serving.run(server.url, context=64, gen=16, concurrency=2)
    summary = serving.summary(results)
    assert summary.failed == 0, summary.errors
    assert all(r.prompt_tokens == 64 and r.output_tokens == 16 and r.prompt_mismatch is None for r in results)
    assert summary.token_sources == ("usage",)
    chat = serving.run(server.url, context=64, gen=8, concurrency=1, requests=2, chat=True)  # a role-only chunk first
    assert all(r.ok and r.prompt_tokens == 64 and r.chunks >= 1 and r.frames > r.chunks for r in chat)
    assert all(0 < r.ttft < r.e2e_latency and sum(r.chunk_tokens) == 8 and len(r.itl) == 7 for r in chat)


def test_its_metrics_say_what_a_window_of_requests_did_as_vllms_would(server):
    from perfkit.probe import metrics

    with metrics.metrics_window(server) as w:
        results = serving.run(server.url, context=64, gen=16, concurrency=2, requests=4, warmup=0)
    assert all(r.ok for r in results)
    labels = (("model_name", MODEL),)
    assert w.counter("perfkit:generation_tokens") == {labels: 64.0}
    assert w.counter("perfkit:prompt_tokens") == {labels: 256.0}
    assert w.counter("perfkit:request_success") == {labels: 4.0}
    assert w.gauge("perfkit:num_requests_running")[labels][1] == 0.0  # read after the last stream ended
    ttft, itl = w.histogram("perfkit:time_to_first_token_seconds"), w.histogram("perfkit:inter_token_latency_seconds")
    assert ttft.count == 4 and itl.count == 4 * 15  # a gap per token after the first, whatever a step carried
    client = sorted(r.ttft for r in results)
    assert ttft.mean < sum(client) / 4  # the server's clock starts later and stops earlier than the client's
    # the server's gaps lie inside each request as the client saw it; how they compare with the client's own gaps
    # depends on when each chunk reached the client, which a busy machine moves either way
    assert 0 < itl.sum <= sum(r.e2e_latency for r in results)
    steps = w.counter("perfkit:spec_decode_steps")[labels]
    phases = w.histograms("perfkit:step_phase_seconds", by=None)  # the server profiles: each rank's phases
    step_rows = {dict(k)["rank"]: h for k, h in phases.items() if dict(k)["phase"] == "step"}
    assert sorted(step_rows) == ["0", "1"] and all(h.count == steps for h in step_rows.values())
    assert {dict(k)["phase"] for k in phases} >= {"verify_forward", "prepare_for_verify", "unattributed"}
    assert w.before.start_time() == w.after.start_time() is not None  # a restart would change it


def test_a_profile_window_asks_the_ranks_for_reports_at_its_edges(server):
    from perfkit.errors import UserError
    from perfkit.probe import logsources, recording

    with logsources.profile_window(server) as window:
        (result,) = serving.run(server.url, context=64, gen=16, requests=1, warmup=0)
    assert window.settle == logsources.ASKED_S  # asked for by SIGUSR1, not waited for
    rows = window.figures()["step"]
    assert sorted(r.rank for r in rows) == [0, 1] and len({r.n for r in rows}) == 1  # every rank, the same steps
    assert 1 <= rows[0].n <= 16 and result.ok
    with logsources.profile_window(server) as idle:
        time.sleep(0.2)
    with pytest.raises(UserError, match="no profile lines for step"):
        recording.record_profile_lines(idle, names=["step"])  # nothing ran: not a call leaks in from before


def test_a_multibyte_character_is_never_split():
    async def frames() -> list[str]:
        job = Job([1], 3, 0.0, 0, _clock())
        for event in (("tokens", [0xC3]), ("tokens", [0xA9, 0x21]), ("done",)):
            job.events.put_nowait(event)
        first = await job.events.get()
        params = {"continuous": True, "include_usage": False}
        return [f async for f in _stream(Reply("m", False, 1), job, first, params, per_token=True)]

    out = asyncio.run(frames())
    texts = [json.loads(f[6:])["choices"][0]["text"] for f in out[:-1]]
    assert texts == ["é", "!", ""] and "\ufffd" not in "".join(texts) and out[-1] == "data: [DONE]\n\n"
    assert [json.loads(f[6:])["usage"]["completion_tokens"] for f in out[:-1]] == [2, 3, 3]


def test_an_error_once_streaming_is_an_error_frame_then_done():
    async def frames() -> list[str]:
        job = Job([1], 3, 0.0, 0, _clock())
        job.events.put_nowait(("error", 503, "rank 1 (pid 9) died: killed by SIGKILL"))
        params = {"continuous": False, "include_usage": True}
        return [f async for f in _stream(Reply("m", True, 1), job, ("tokens", [65]), params, per_token=False)]

    out = asyncio.run(frames())
    assert json.loads(out[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert json.loads(out[1][6:])["choices"][0]["delta"] == {"content": "A"}
    assert json.loads(out[2][6:])["error"] == {
        "message": "rank 1 (pid 9) died: killed by SIGKILL",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }
    assert out[3:] == ["data: [DONE]\n\n"]


def test_both_ranks_report_their_lines_within_seconds_while_it_keeps_running(server):
    """The case study's server never exited, so a profiler that printed at exit printed nothing."""
    pids = get_json(server.url + "/v1/models")[2]["data"][0]["perfkit"]["pids"]
    _client(server.url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)
    marked = len(server.log_text())
    wanted = {f"[perfkit-prof pid={pid} rank={rank}] step: n=" for rank, pid in enumerate(pids)}
    deadline = time.monotonic() + 5
    while not all(w in server.log_text()[marked:] for w in wanted) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(w in server.log_text()[marked:] for w in wanted), server.log_text()[-2000:]
    assert server.returncode is None  # still serving


def test_sigterm_stops_it_and_every_rank(own_server):
    server = own_server
    pids = get_json(server.url + "/v1/models")[2]["data"][0]["perfkit"]["pids"]
    _client(server.url).completions.create(model="perfkit-tiny-random", prompt=PROMPT, max_tokens=4)  # spans ran
    start = time.monotonic()
    assert server.stop() == 0  # SIGTERM, then a wait
    assert time.monotonic() - start < 10
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
    log = server.log_text()
    assert "[perfkit-prof pid=" in log and " rank=0]" in log and " rank=1]" in log


# --- a second server: loading, one token per chunk, a killed rank ---------------------------------------


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    """Started by hand to watch /health while the ranks load; {"url", "process", "seen"}."""
    port = free_port()
    command = Server(EngineOptions(tp=2, preset="shipped"), args=("--chunk", "token")).command(port)
    log = open(tmp_path_factory.mktemp("serve") / "token.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url, seen = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + 120
        while not seen or seen[-1] != 200:
            assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                seen.append(get_json(url + "/health", timeout=2)[0])
            except OSError:
                time.sleep(0.02)
        yield {"url": url, "process": process, "seen": seen}
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def test_health_is_503_while_the_ranks_load(token_server):
    assert 503 in token_server["seen"] and token_server["seen"][-1] == 200


def test_chunk_token_sends_one_token_per_chunk(token_server, engine):
    client = _client(token_server["url"])
    options = {"include_usage": True, "continuous_usage_stats": True}  # vLLM's: the running usage needs both
    chunks = list(
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, stream=True, stream_options=options)
    )
    text = [c for c in chunks if c.choices and c.choices[0].text]
    assert [c.usage.completion_tokens for c in text] == list(range(1, 17))
    assert "".join(c.choices[0].text for c in text) == _greedy(engine, PROMPT, 16)


def test_sigusr1_without_profiling_is_ignored_not_fatal(token_server):
    """`systemctl kill -s USR1` signals every process of a unit: a server that does not profile shrugs."""
    process = token_server["process"]
    pids = get_json(token_server["url"] + "/v1/models")[2]["data"][0]["perfkit"]["pids"]
    os.kill(process.pid, signal.SIGUSR1)
    time.sleep(0.3)
    assert process.poll() is None and all(_alive(pid) for pid in pids)
    assert _client(token_server["url"]).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).choices


def test_a_killed_rank_fails_requests_at_once_and_health_says_why(own_server):
    url = own_server.url
    pids = get_json(url + "/v1/models")[2]["data"][0]["perfkit"]["pids"]
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        _client(url).completions.create(model="perfkit-tiny-random", prompt=PROMPT, max_tokens=8)
    assert time.monotonic() - start < 10
    assert caught.value.status_code == 503
    assert f"rank 1 (pid {pids[1]})" in str(caught.value) and "SIGKILL" in str(caught.value)
    status, _, body = get_json(url + "/health")
    assert status == 503 and "SIGKILL" in body["reason"]
    assert not any(_alive(pid) for pid in pids)
    assert own_server.returncode is None  # the server stays up to say why


def test_a_server_stops_when_the_probe_that_started_it_is_killed(tmp_path):
    """A probe's kernel killed outright runs no cleanup: the server (in a session of its own) sees
    its parent go and stops itself and its ranks."""
    code = (
        "import sys, time\nfrom perfkit.engineoptions import EngineOptions\nfrom perfkit.probe.servers import Server\n"
        "s = Server(EngineOptions(tp=2, preset='tiny-random'), log_dir=sys.argv[1]).start()\n"
        "print(s.pid, *s.identity()['engine']['pids'], flush=True)\ntime.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
    finally:
        child.kill()
        child.wait()
    assert len(pids) == 3 and all(_alive(p) for p in pids[1:])
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in pids if _alive(p)] == []
