"""Issue 45, class 3: a server perfkit did not start cannot crash, hang or balloon the process reading it.

A real HTTP server on 127.0.0.1, started here, answers each path in a hostile way (a byte every half
second, 64 MB, JSON nested 200,000 deep, NaN and Infinity, histograms without +Inf or with an infinite
sum); every read perfkit makes of a server (endpoints.fetch, identity, prometheus.scrape, the run's
served.identity and served.instance) ends within its deadline, under its byte limit, with one line
naming the URL, or with only finite numbers kept.
"""

from __future__ import annotations

import json
import random
import re
import resource
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from perfkit import endpoints, prometheus
from perfkit.errors import UserError
from perfkit.experiment.records import served
from perfkit.probe.metrics import MetricsWindow

MODELS = {"object": "list", "data": [{"id": "m", "root": "m"}]}
HISTOGRAM = """# TYPE ttft_seconds histogram
ttft_seconds_bucket{le="0.1"} %s
ttft_seconds_bucket{le="1.0"} %s
%sttft_seconds_count %s
ttft_seconds_sum %s
"""


def _histogram(count: str, total: str, *, inf: bool = True) -> str:
    return HISTOGRAM % (count, count, f'ttft_seconds_bucket{{le="+Inf"}} {count}\n' if inf else "", count, total)


class _Hostile(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's name)
        mode, _, rest = self.path.strip("/").partition("/")
        try:
            if mode == "drip":  # a byte every half second, never done
                self.send_response(200)
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                for _ in range(120):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.5)
            elif mode == "huge":  # 64 MB of metrics text
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                line = b"# HELP x a comment line that never ends the answer\n" * 1000
                for _ in range((64 << 20) // len(line)):
                    self.wfile.write(line)
            elif mode == "nested":
                self._send(b'{"data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
            elif mode == "nan":
                self._send(b'{"object": "list", "data": [{"id": "m", "root": "m", "perfkit": {"tp": NaN}}]}')
            elif mode == "infinity":
                self._send(b'{"object": "list", "data": [{"id": "m", "created": Infinity}]}')
            elif mode == "notjson":
                self._send(b"\x1f\x8b\x08\x00 gzip bytes \x00\x00", "application/octet-stream")
            elif mode == "metrics":  # /metrics/<count>/<sum>/<inf or noinf>
                count, total, inf = rest.split("/")[1:4]
                self._send(_histogram(count, total, inf=inf == "inf").encode(), "text/plain")
            else:
                self._send(json.dumps(MODELS).encode())
        except (BrokenPipeError, ConnectionResetError):  # the reader gave up, as it should
            pass


@pytest.fixture(scope="module")
def hostile():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_server_that_drips_is_cut_off_at_one_deadline_not_one_per_read(hostile):
    started = time.monotonic()
    with pytest.raises(endpoints.TooMuch, match=r"drip/v1/models did not finish its answer within 2 s"):
        endpoints.identity(f"{hostile}/drip", timeout=2.0)
    assert time.monotonic() - started < 3.5
    started = time.monotonic()
    gone = served.identity(f"{hostile}/drip", timeout=2.0)  # the run's own read: recorded, not raised
    assert "did not finish" in gone["unreachable"] and time.monotonic() - started < 3.5
    with pytest.raises(UserError, match="did not finish its answer within 1 s"):
        prometheus.scrape(f"{hostile}/drip", timeout=1.0)


def test_a_huge_answer_is_refused_at_its_limit_without_growing_the_reader(hostile):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    started = time.monotonic()
    with pytest.raises(UserError, match=r"huge/metrics answered more than 33,554,432 bytes"):
        prometheus.scrape(f"{hostile}/huge", timeout=30.0)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200 and time.monotonic() - started < 30, grown_mib
    said = served.instance(f"{hostile}/huge")["unreachable"]  # its model list streams 64 MB too
    assert said.endswith("huge/v1/models answered more than 1,048,576 bytes"), said


@pytest.mark.parametrize("mode", ["nested", "nan", "infinity", "notjson"])
def test_json_nested_too_deep_not_finite_or_not_json_is_no_model_list(hostile, mode):
    with pytest.raises(endpoints.Unreachable, match=rf"{mode}/v1/models answered 200 without a model list"):
        endpoints.identity(f"{hostile}/{mode}")
    said = served.identity(f"{hostile}/{mode}")["unreachable"]
    assert "without a model list" in said and len(said) < 400


@pytest.mark.parametrize(
    "count, total, inf, lacks",
    [
        ("NaN", "1.5", "inf", "no +Inf bucket and no finite _count"),  # its buckets are NaN too
        ("4", "+Inf", "inf", "no finite _sum"),
        ("4", "1.5", "noinf", "no +Inf bucket"),
        ("NaN", "NaN", "noinf", None),  # not one finite sample: no histogram at all
    ],
)
def test_a_histogram_prometheus_could_not_have_exported_is_one_line(hostile, count, total, inf, lacks):
    url = f"{hostile}/metrics/x/{count}/{total}/{inf}"
    snap = prometheus.scrape(url)
    assert all(v == v and abs(v) != float("inf") for v in snap.values.values())  # only finite numbers kept
    window = MetricsWindow(url)
    with window:
        pass
    if lacks is None:
        assert window.histograms("ttft_seconds", by="") == {}
        with pytest.raises(UserError, match=r"ttft_seconds has no samples$"):
            window.histogram("ttft_seconds")
        return
    with pytest.raises(UserError, match=re.escape(f"histogram ttft_seconds{{}} has {lacks}") + "$"):
        window.histograms("ttft_seconds", by="")


def test_a_sound_histogram_still_reads(hostile):
    window = MetricsWindow(f"{hostile}/metrics/x/4/1.5/inf")
    with window:
        pass
    (h,) = window.histograms("ttft_seconds", by="").values()
    assert h.count == 0 and h.buckets[-1][0] == float("inf")  # the same text before and after: nothing grew


def test_decoding_random_hostile_json_never_raises_and_keeps_only_finite_numbers():
    rng = random.Random(3)
    atoms = ["1", "-2.5e3", "NaN", "Infinity", "-Infinity", '"a"', "true", "null", "1e999", '"\\ud800"']

    def value(depth: int) -> str:
        if depth > 80 or rng.random() < 0.3:
            return rng.choice(atoms)
        if rng.random() < 0.5:
            return "[" + ",".join(value(depth + 1) for _ in range(rng.randint(0, 3))) + "]"
        return "{" + ",".join(f'"k{i}":{value(depth + 1)}' for i in range(rng.randint(0, 3))) + "}"

    def finite(item) -> bool:
        if isinstance(item, float):
            return item == item and abs(item) != float("inf")
        if isinstance(item, dict):
            return all(finite(v) for v in item.values())
        if isinstance(item, list):
            return all(finite(v) for v in item)
        return True

    for _ in range(400):
        text = value(0)
        if rng.random() < 0.2:
            text = text[: rng.randint(0, len(text))]  # cut short
        body = endpoints.decode_json(text.encode())
        assert body is None or finite(body), text[:200]
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    assert endpoints.decode_json(deep) is None and endpoints.decode_json(b"[[[[1]]]]") == [[[[1]]]]


@pytest.mark.parametrize("mode", ["drip", "huge", "nested"])
def test_a_run_against_a_hostile_server_ends_within_its_timeout_small_and_in_one_line(hostile, tmp_path, mode):
    """The whole of `perfkit run` (planning, the probe, the run's own reads at each window's edges) against
    a server that drips, floods or nests: within --timeout plus a few seconds, under 500 MB resident, an
    error naming the URL and no traceback, and the ledger still a text file."""
    import subprocess
    import sys

    import nbformat

    from perfkit.cli import main

    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "notebooks").mkdir()
    assert main(["--root", str(tmp_path), "new", "probe", "served_read"]) == 0
    path = tmp_path / "notebooks" / "served_read.ipynb"
    nb = nbformat.read(path, as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    cell.source = 'server_url: str = ""\nn: int = 1000\nrepeat: int = 5\nwarmup: int = 0'
    nbformat.write(nb, path)
    (tmp_path / "hypotheses" / "read-under-1s.yaml").write_text(
        "id: read-under-1s\nclaim: The probe beside a server takes under a second.\n"
        "rationale: a thousand floats sort in microseconds.\n"
        "expect: {kind: at_most, metric: served_read, value: 1000, unit: ms, at: {n: 1000}}\n"
        f"probe: {{notebook: served_read.ipynb, params: {{n: 1000, server_url: '{hostile}/{mode}'}}}}\n"
    )
    timeout_s = 30
    script = (  # the run's own peak resident memory (VmHWM), said last: getrusage's ru_maxrss would count this
        # test process's too (RUSAGE_CHILDREN: every child of the worker; RUSAGE_SELF: kept across exec on Linux)
        "import re, sys; from perfkit.cli import main; code = main(sys.argv[1:]); "
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
        "print('peak-kib', hwm, file=sys.stderr); sys.exit(code)"
    )
    argv = [sys.executable, "-c", script, "--root", str(tmp_path), "run", "--quick", "--timeout", str(timeout_s)]
    t0 = time.monotonic()
    done = subprocess.run([*argv, "read-under-1s"], capture_output=True, text=True, timeout=timeout_s + 60)
    took = time.monotonic() - t0
    said = done.stdout + done.stderr
    peak = re.search(r"^peak-kib (\d+)$", done.stderr, re.M)
    assert peak, said[-2000:]
    grown_mib = int(peak.group(1)) / 1024
    print(f"{mode}: {took:.1f} s, {grown_mib:.0f} MiB at most")
    assert "Traceback" not in said, said[-3000:]
    assert took < timeout_s + 15, f"{took:.0f} s: {said[-2000:]}"
    assert grown_mib < 500, f"{grown_mib:.0f} MiB resident"
    assert done.returncode in (0, 1), said[-2000:]  # a verdict of error is a run that ended, not a crash
    assert f"127.0.0.1:{hostile.rsplit(':', 1)[1]}/{mode}" in said  # the URL is named
    assert b"\x00" not in (tmp_path / "hypotheses" / "LEDGER.md").read_bytes()
