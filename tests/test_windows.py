"""Replicates on a server the run did not start are windows of requests on one process (run/windows.py).

End to end: a real `perfkit engine serve` started by the test, a probe given its URL, a real run of
three replicates; then judging against readings of known truth (a restart, a changed server, a
server that says nothing of its process), and the windows' spacing with a reader that records when
each edge was read."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import nbformat
import pytest
from records import execution, run, shared_machine

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from perfkit.engineoptions import EngineOptions  # noqa: E402
from perfkit.experiment.run import windows  # noqa: E402
from perfkit.paths import Project  # noqa: E402
from perfkit.probe.servers import Server  # noqa: E402

PROBE = """\
import perfkit
from perfkit import serving

results = serving.run(server_url, context=16, gen=4, requests=5, seed=replicate)
perfkit.record("ttft", [r.ttft * 1e3 for r in results if r.ok], unit="ms")
"""
HYPOTHESIS = """\
id: ttft-on-a-running-server
claim: the first token of a 16-token prompt comes within 10 min
rationale: a tiny model answers at once
expect: {kind: at_most, metric: ttft, value: 10, unit: min}
probe:
  notebook: window.ipynb
  params: {server_url: URL}
"""


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    srv = Server(EngineOptions(tp=1, preset="tiny-random"), log_dir=tmp_path_factory.mktemp("srv"), startup_timeout=120)
    with srv:
        yield srv


def _project(root: Path, url: str) -> Project:
    (root / "notebooks").mkdir()
    (root / "hypotheses").mkdir()
    params = 'server_url: str = ""\nreplicate: int = 0'
    cells = [nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}), nbformat.v4.new_code_cell(PROBE)]
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=kernel), str(root / "notebooks" / "window.ipynb"))
    (root / "hypotheses" / "ttft-on-a-running-server.yaml").write_text(HYPOTHESIS.replace("URL", url))
    return Project(root)


def test_a_run_on_a_running_server_measures_windows_of_one_process_and_says_so(tmp_path, running, monkeypatch):
    project = _project(tmp_path, running.url)
    shared_machine(monkeypatch)
    report = run(project, all=True, replicates=2, max_replicates=4, jobs=2, timeout_s=120, out=lambda line: None)
    (h,) = report.results.hypotheses
    assert h.verdict == "confirmed", h.reason
    instances = [x.server_instance for x in h.executions]
    pid = running.identity()["engine"]["server_pid"]
    assert all(i["before"]["pid"] == i["after"]["pid"] == pid for i in instances)
    starts = {i[side]["start_time"] for i in instances for side in ("before", "after")}
    assert len(starts) == 1  # one process, read at four edges
    for x in h.executions:  # the server's processes were watched as the measurement's own, not foreign load
        trace = json.loads((project.runs_dir / report.run_id / "executions" / x.id / "utilization.json").read_text())
        assert pid in trace["tree_pids"] and os.getpid() not in trace["tree_pids"]
    (said,) = [w for w in h.warnings if "windows of requests on one process" in w]
    assert running.url in said and "not processes of their own" in said
    assert "each replicate a window of requests on that running server" in project.ledger_path.read_text()


def _at(replicate: int, before: dict, after: dict | None = None, *, at: float | None = None, url: str = "http://s:1"):
    """Replicate `replicate`'s window, read at time `at` (its replicate index when None) and 0.5 s later."""
    server = {"url": url, "model": "m", "engine": {"tp": 2}}
    t = float(replicate if at is None else at)
    instance = {"before": {**before, "at": t}, "after": {**(after or before), "at": t + 0.5}}
    return execution(replicate=replicate, server=server, server_instance=instance)


ONE = {"model": "m", "engine": {"tp": 2}, "start_time": 1000.0, "pid": 7}
AGAIN = {**ONE, "start_time": 2000.0, "pid": 8}


def test_a_restart_between_or_inside_windows_is_named_with_where_it_happened():
    problem, said = windows.judged([_at(0, ONE), _at(1, ONE), _at(2, AGAIN)])
    assert problem is None
    assert said == [
        "the server at http://s:1 restarted between replicates 1 and 2 "
        "(started at 1970-01-01 00:16:40 UTC -> started at 1970-01-01 00:33:20 UTC)"
    ]
    _, said = windows.judged([_at(0, ONE), _at(1, ONE, AGAIN)])
    assert "restarted inside replicate 1" in said[0]
    _, said = windows.judged([_at(2, ONE, at=0), _at(0, AGAIN, at=1), _at(1, AGAIN, at=2)])  # run shuffled: 2, 0, 1
    assert said[0].startswith(
        "the server at http://s:1 restarted between replicates 2 and 0 (started at 1970-01-01 00:16"
    )
    no_start = {k: v for k, v in ONE.items() if k != "start_time"}  # one scrape of /metrics failed: the pids tell
    assert "on one process of the server at http://s:1 (pid 7)" in windows.judged([_at(0, ONE), _at(1, no_start)])[1][0]
    _, said = windows.judged([_at(0, {"model": "m", "engine": {}, "pid": 3}), _at(1, {"model": "m", "engine": {}})])
    assert "neither its start time" in said[0] and "cannot be told" in said[0]  # what it cannot tell it says


def test_a_server_that_changed_between_windows_leaves_the_verdict_inconclusive():
    other = {**ONE, "engine": {"tp": 4}}
    problem, _ = windows.judged([_at(0, ONE), _at(1, other)])
    assert problem.startswith("the server at http://s:1 changed between its windows (") and "tp 4" in problem
    assert windows.judged([_at(0, ONE), _at(1, ONE)])[0] is None
    started = execution(server={"started_by_probe": True}, server_instance=None)
    assert windows.judged([started]) == (None, [])  # a server each replicate starts is a process of its own


def test_a_local_server_is_found_by_its_port_and_a_remote_one_is_not_ours(running):
    pid = running.identity()["engine"]["server_pid"]
    assert pid in windows.local_processes(running.url, {})  # found listening on its port, said or not
    assert windows.local_processes(running.url.replace("127.0.0.1", "gpu-node-7"), {"pid": pid}) == ()


def test_windows_on_one_server_never_overlap_and_are_cooled_down_while_others_run_alongside():
    edges: list[tuple[str, str, float]] = []
    lock = threading.Lock()

    def read(url, timeout):
        with lock:
            edges.append((url, "read", time.monotonic()))
        return {"model": "m"}

    w = windows.Windows(cooldown_s=0.3, read=read)
    spans: dict[str, list[tuple[float, float]]] = {"http://a:1": [], "http://b:1": []}

    def replicate(url: str) -> None:
        planned = execution(server={"url": url, "model": "m"})
        with w.window(planned) as reading:
            start = time.monotonic()
            time.sleep(0.1)
            spans[url].append((start, time.monotonic()))
        assert set(reading) == {"before", "after"}

    threads = [threading.Thread(target=replicate, args=(url,)) for url in ["http://a:1"] * 3 + ["http://b:1"] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for url, got in spans.items():
        got.sort()
        assert all(later[0] - earlier[1] >= 0.3 - 0.02 for earlier, later in zip(got, got[1:])), (url, got)
    first_a, first_b = spans["http://a:1"][0], spans["http://b:1"][0]
    assert abs(first_a[0] - first_b[0]) < 0.1  # another server's window does not wait for this one's
    with w.window(execution(server={"started_by_probe": True})) as none:
        assert none is None


def test_a_server_that_never_answers_takes_one_allowance_of_the_run_not_a_deadline_per_edge():
    """Issue 45, class 3: a server that drips held every window's two edges for the full deadline (a 3
    replicate run of 1 s probes took 58 s with --timeout 30), and was then said to have 'restarted'."""
    asked: list[float] = []

    def read(url, timeout):
        asked.append(timeout)
        time.sleep(timeout)  # it drips until the deadline
        return {"unreachable": f"{url}/v1/models did not finish its answer within {timeout:g} s"}

    w = windows.Windows(cooldown_s=0.0, read=read, failing_s=0.6)
    planned = execution(server={"url": "http://drip:1", "model": "m"})
    t0 = time.monotonic()
    replicates = []
    for r in range(5):
        with w.window(planned) as reading:
            pass
        replicates.append(
            execution(replicate=r, server={"url": "http://drip:1", "model": "m"}, server_instance=reading)
        )
    assert time.monotonic() - t0 < 0.6 + 0.3  # ten edges, one allowance
    assert asked == [0.6]  # the first read took the allowance; none was asked again
    said = replicates[-1].server_instance["after"]["unreachable"]
    assert said == "not read: it gave no answer in 0.6 s of this run's reads"
    problem, warnings = windows.judged(replicates)
    assert problem is None and len(warnings) == 1, warnings
    assert warnings[0].startswith("the server at http://drip:1 did not answer at the edge of replicate 0: ")
    assert not any("restarted" in w for w in warnings)


def test_a_server_that_answers_again_is_read_again_within_what_is_left():
    answers = iter([None, "m", "m", "m"])

    def read(url, timeout):
        got = next(answers)
        if got is None:
            time.sleep(0.1)
            return {"unreachable": "busy"}
        return {"model": got, "pid": 7}

    w = windows.Windows(cooldown_s=0.0, read=read, failing_s=5.0)
    planned = execution(server={"url": "http://a:1", "model": "m"})
    with w.window(planned) as first:
        pass
    with w.window(planned) as second:
        pass
    assert "unreachable" in first["before"] and first["after"]["model"] == "m"
    assert second["before"]["pid"] == second["after"]["pid"] == 7
