"""The server a probe drives is part of its execution's key and of the ledger's "measured by" (experiment/served.py)."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
from records import execution, hypothesis, result, run_results, shared_cores

from perfkit.experiment.outputs import ledger
from perfkit.experiment.records import formats, results, served
from perfkit.experiment.records.code import CodeState
from perfkit.experiment.records.kinds.value import AtMost
from perfkit.experiment.records.probe import Probe
from perfkit.experiment.run import plan
from perfkit.experiment.run.options import RunOptions
from perfkit.paths import Project


class _Models(BaseHTTPRequestHandler):
    """Answers GET /v1/models as `perfkit engine serve` does, with the identity the test sets."""

    engine: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path != "/v1/models":
            self.send_error(404)
            return
        body = json.dumps(
            {
                "object": "list",
                "data": [{"id": "shipped", "root": "shipped", "object": "model", "perfkit": self.engine}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def models_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _project(tmp_path: Path) -> Project:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "hypotheses").mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell('server_url: str = ""\nctx: int = 1', metadata={"tags": ["parameters"]})],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, str(tmp_path / "notebooks" / "p.ipynb"))
    return Project(tmp_path)


def _plan(project: Project, url: str | None):
    h = hypothesis(AtMost(kind="at_most", metric="m", unit="ms", value=1.0))
    params = {} if url is None else {"server_url": url}
    h = replace(h, probe=Probe(notebook="p.ipynb", params=params))
    basis = plan.Basis(source_hash="s", environment={}, code=lambda extra: CodeState(digest="d", how="test"))
    return plan.plan(project, [h], RunOptions(ids=("h",), threads=1), basis, note=lambda line: None)


def test_the_served_identity_is_in_the_key_and_the_execution(tmp_path, models_server):
    server, url = models_server
    project = _project(tmp_path)
    _Models.engine = {"tp": 1, "mode": "spec", "preset": "shipped", "version": "0.1.0", "pids": [11]}
    first = _plan(project, url).executions[0]
    assert first.server["engine"]["tp"] == 1 and first.server["model"] == "shipped"
    assert "pids" not in first.server["engine"]  # a restart of the same server is the same server
    _Models.engine = {"tp": 1, "mode": "spec", "preset": "shipped", "version": "0.1.0", "pids": [12]}
    assert _plan(project, url).executions[0].key == first.key
    _Models.engine = {"tp": 2, "mode": "spec", "preset": "shipped", "version": "0.1.0", "pids": [13, 14]}
    second = _plan(project, url).executions[0]
    assert second.key != first.key and second.server["engine"]["tp"] == 2
    assert "tp 2" in served.describe(second.server) and url in served.describe(second.server)


def test_an_empty_url_is_a_server_the_probe_starts_and_a_dead_one_is_said(tmp_path):
    project = _project(tmp_path)
    started = _plan(project, None).executions[0]  # the notebook's default, ""
    assert started.server == served.STARTED
    assert served.describe(started.server) == "a server each replicate started itself"
    dead = served.identity("http://127.0.0.1:9", timeout=2)  # the discard port: nothing listens
    assert dead["url"] == "http://127.0.0.1:9" and "unreachable" in dead
    assert "unreachable" in served.describe(dead)
    assert _plan(project, "http://127.0.0.1:9").executions[0].key != started.key


def test_the_server_is_stored_upgraded_and_shown_in_the_ledger(tmp_path):
    project = Project(tmp_path)
    (tmp_path / "hypotheses").mkdir()
    identity = {
        "url": "http://127.0.0.1:8000",
        "model": "shipped",
        "root": "shipped",
        "engine": {"tp": 2, "mode": "ar"},
    }
    r = result("h", "confirmed", executions=(execution(server=identity),))
    results.write_results(project, run_results("20260101-000000", r))
    loaded = results.load_all_results(project)[0]
    assert loaded.hypotheses[0].executions[0].server == identity
    text = ledger.render([loaded])
    assert "served by shipped at http://127.0.0.1:8000 (tp 2, mode ar)" in text
    old = execution().to_json()
    del old["server"]
    upgraded = formats._7_to_8({"hypotheses": [{"executions": [old]}]})
    assert upgraded["hypotheses"][0]["executions"][0]["server"] is None


SERVING = (
    "served-prepare-for-verify-under-1ms",
    "served-ttft-linear-in-context",
    "served-concurrency-4-doubles-throughput",
)


def _servers() -> set[int]:
    """Pids of `perfkit engine serve` processes and their ranks on this machine."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = stat.read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"serve" in words
            and any(w.endswith(b"perfkit.engine.cli") for w in words)
            or any(b"perfkit.engine.serve.rank" in w for w in words)
        ):
            found.add(int(stat.parent.name))
    return found


def test_perfkit_run_judges_the_serving_hypotheses_against_a_server_it_starts(tmp_path, monkeypatch):
    """The shipped probe starts `perfkit engine serve --tp 2`, drives it over HTTP, reads its ranks'
    profile lines over the long phase, and stops it; each serving hypothesis gets a verdict from it."""
    import shutil

    from records import run

    shared_cores(monkeypatch)
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "hypotheses").mkdir()
    for name in SERVING:
        shutil.copy(root / "hypotheses" / f"{name}.yaml", tmp_path / "hypotheses")
    shutil.copytree(root / "notebooks", tmp_path / "notebooks")
    before = _servers()
    small = {"ttft_contexts": [256, 512, 1024], "ttft_gen": 4, "concurrency_ctx": 64, "concurrency_gen": 8}
    small |= {"long_gen": 8}  # five requests, waves and windows: the fewest samples a verdict takes
    lines: list[str] = []
    report = run(
        Project(tmp_path), ids=list(SERVING), replicates=1, max_replicates=1, overrides=small, out=lines.append
    )
    got = {h.id: h for h in report.results.hypotheses}
    assert set(got) == set(SERVING)
    for h in got.values():
        assert h.verdict in ("confirmed", "refuted", "inconclusive"), (h.id, h.verdict, h.reason, lines[-20:])
    executions = {e.key: e for h in got.values() for e in h.executions}.values()
    # each hypothesis asks for the one phase it reads: three executions, each starting a server of its own
    assert sorted(tuple(e.params["phases"]) for e in executions) == [("concurrency",), ("long",), ("ttft",)]
    engine = {"tp": 2, "preset": "shipped", "mode": "spec", "mask": "naive", "tree": "heap"}  # the notebook's
    assert all(e.server == {**served.STARTED, "engine": engine} for e in executions)
    floor = got["served-prepare-for-verify-under-1ms"]
    assert floor.measured is not None and floor.measured.value > 0, floor.reason  # the ranks' lines, long phase
    assert _servers() - before == set()  # the server and its ranks are gone


def test_a_change_the_words_do_not_show_is_named_field_by_field():
    before = {"url": "http://h:1", "model": "m", "root": "m", "engine": {"tp": 2, "commit": "abc", "threads": 1}}
    after = {**before, "engine": {"tp": 2, "commit": "abc", "threads": 2}}
    assert served.describe(before) == served.describe(after)
    assert served.change(before, after) == "threads 1 -> 2"
    assert served.change(before, {**before, "engine": {"tp": 4}}).endswith("(tp 4)")
    assert "(tp 2, commit abc)" in served.describe(before)


def test_a_server_the_probe_starts_is_described_by_the_parameters_it_starts_it_with():
    chosen = served.started({"tp": 2, "preset": "shipped", "mode": "spec", "mask": None})
    assert chosen == {"started_by_probe": True, "engine": {"tp": 2, "preset": "shipped", "mode": "spec"}}
    assert served.describe(chosen) == "a server each replicate started itself (tp 2, preset shipped, mode spec)"
    assert served.started({}) == served.STARTED
