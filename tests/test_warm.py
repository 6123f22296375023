"""Warm replicates (perfkit/experiment/run/warm.py) against known truth: each replicate forked from its round's
template is still a process of its own, so state that differs between processes still differs, and the
interval still sees it; `--fresh-processes` starts them the old way. Real papermill executions of a
small probe, in a project made by the test."""

import json
import tempfile
import threading
from pathlib import Path

import nbformat
import pytest
from records import run, shared_machine

from perfkit.experiment.run import warm
from perfkit.experiment.run.scaffold import probe_notebook
from perfkit.paths import Project
from perfkit.processes import alive

PROBE = """import os, sys, threading
import numpy as np
import matplotlib.pyplot as plt
import perfkit

offset = float(np.random.normal())  # numpy's global state, seeded when numpy is imported: once per process
rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
perfkit.record("offset", [10 + offset + 0.01 * x for x in rng.standard_normal(20)], unit="ms")
perfkit.record("hash_seed", [abs(hash("perfkit warm")) % 1_000_003] * 5, unit="count")
perfkit.record("pid", [os.getpid()] * 5, unit="count")
perfkit.record("threads", [threading.active_count()] * 5, unit="count")
print(sorted(t.name for t in threading.enumerate()))
perfkit.record("address", [id(object()) % 1_000_003] * 5, unit="count")
fig = plt.figure(figsize=(2, 2))
plt.plot([1, 2, 3])
plt.show()
"""

HYPOTHESIS = """id: {id}
claim: The process offsets average near 10 ms.
rationale: Each process draws an offset with sd 1 ms around 10 ms.
expect:
  kind: cost
  metric: offset
  value: 10
  unit: ms
  factor: 3
probe:
  notebook: identity.ipynb
  params: {{n: {n}}}
"""


def _project(root: Path) -> Project:
    (root / "hypotheses").mkdir(parents=True)
    (root / "notebooks").mkdir()
    nbformat.write(probe_notebook("n: int = 1  # which execution", PROBE), str(root / "notebooks" / "identity.ipynb"))
    for i in (1, 2):
        (root / "hypotheses" / f"identity-{i}.yaml").write_text(HYPOTHESIS.format(id=f"identity-{i}", n=i))
    return Project(root)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = {}
    for how in ("warm", "fresh"):
        project = _project(tmp_path_factory.mktemp(how))
        lines: list[str] = []
        with pytest.MonkeyPatch.context() as mp:
            shared_machine(mp)
            report = run(
                project,
                all=True,
                quick=True,
                replicates=2,
                budget_s=0,
                fresh_processes=how == "fresh",
                out=lines.append,
            )
        out[how] = (project, report, lines)
    return out


def _samples(project: Project, report, name: str) -> dict[tuple[int, int], list[float]]:
    """(execution n, replicate) -> the samples of `name`, from the stored executions."""
    found = {}
    for path in sorted((project.runs_dir / report.run_id / "executions").glob("*/r*/execution.json")):
        x = json.loads(path.read_text())
        for record in x["records"]:
            if record["name"] == name:
                found[x["params"]["n"], x["replicate"]] = record["samples"]
    return found


def _values(project: Project, report, name: str) -> dict[tuple[int, int], float]:
    """(execution n, replicate) -> the first sample of `name`."""
    return {k: samples[0] for k, samples in _samples(project, report, name).items()}


def test_warm_replicates_are_forked_from_a_template_per_round_and_say_so(measured):
    project, report, lines = measured["warm"]
    assert sum("[warm]    replicate" in line and "a template with" in line for line in lines) == 2  # a round each
    executions = [x for h in report.results.hypotheses for x in h.executions]
    assert executions and all(x.warm is True and x.status == "ok" for x in executions)
    fresh = [x for h in measured["fresh"][1].results.hypotheses for x in h.executions]
    assert fresh and all(x.warm is False for x in fresh)
    # what a replicate costs before its first measuring cell: warm, the imports were paid by the template
    warm_setup = sorted(x.setup_s for x in executions)
    fresh_setup = sorted(x.setup_s for x in fresh)
    assert warm_setup[len(warm_setup) // 2] < fresh_setup[len(fresh_setup) // 2]


@pytest.mark.parametrize("how", ["warm", "fresh"])
def test_every_replicate_is_a_process_of_its_own_with_its_own_state(measured, how):
    project, report, _ = measured[how]
    pids = _values(project, report, "pid")
    assert len(set(pids.values())) == len(pids) == 4  # 2 executions x 2 replicates, each its own process
    offsets = _values(project, report, "offset")
    assert len(set(offsets.values())) == 4  # numpy's global state is seeded anew in each (a fork would copy it)
    # a warm kernel runs the threads a fresh one does (ipykernel's own), none more from the template
    fresh_threads = set(_values(*measured["fresh"][:2], "threads").values())
    assert set(_values(project, report, "threads").values()) == fresh_threads and len(fresh_threads) == 1
    seeds = _values(project, report, "hash_seed")
    for n in (1, 2):  # the replicates of one execution never share a hash seed: one template per round
        assert len({seeds[n, r] for r in range(2)}) == 2, seeds


def test_the_interval_still_sees_the_spread_between_processes(measured):
    """Known truth: offsets of sd 1 ms between processes, 0.01 ms within one. The interval of 2 processes
    must be as wide as the two processes' offsets make it, warm as fresh, not as narrow as the noise within
    one: t(1 df) = 12.7 times the standard error |a - b| / 2 on each side, a width of 12.7 |a - b|. Two offsets
    that drew alike (within 0.1 ms: about one hypothesis in twenty) leave nothing between processes to see."""
    import statistics

    for how in ("warm", "fresh"):
        project, report, _ = measured[how]
        samples = _samples(project, report, "offset")
        for h in report.results.hypotheses:
            m = h.measured
            a, b = (statistics.fmean(samples[h.executions[0].params["n"], r]) for r in (0, 1))
            assert m.replicates == 2 and m.between is not None, (how, m)
            assert m.high - m.low > 0.8 * 12.7 * abs(a - b), (how, m, a, b)
            if abs(a - b) > 0.1:  # ten times the noise within a process: the spread is the processes'
                assert m.between > 0.9, (how, m, a, b)


def test_a_warm_kernel_shows_its_figures_inline(measured):
    project, report, _ = measured["warm"]
    notebooks = list((project.runs_dir / report.run_id / "executions").glob("*/r*/executed.ipynb"))
    assert notebooks
    for path in notebooks:
        nb = nbformat.read(str(path), as_version=4)
        shown = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert shown, path


def test_what_a_template_imports_comes_from_the_probes_and_never_the_code_under_test(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import numpy as np\nfrom matplotlib import pyplot\nimport ownlib.fast\n%matplotlib inline"
        ),
        nbformat.v4.new_markdown_cell("import not_code"),
    ]
    source = nbformat.writes(nb).encode()
    assert warm.probe_imports(source) == ["numpy", "matplotlib", "ownlib.fast"]
    assert set(warm.BASE) <= set(warm.preloads([source]))
    (tmp_path / "ownlib").mkdir()
    (tmp_path / "ownlib" / "__init__.py").write_text("")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        assert not warm._outside("ownlib", tmp_path)  # the code under test is imported by each replicate itself
        assert warm._outside("numpy", tmp_path)
        assert not warm._outside("no_such_module_here", tmp_path)
    finally:
        sys.path.remove(str(tmp_path))


def test_a_template_with_a_thread_running_refuses_to_fork():
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="someones-pool", daemon=True)
    worker.start()
    try:
        assert "someones-pool" in warm._ready_to_fork()
    finally:
        stop.set()
        worker.join()


KILLS_ITS_TEMPLATE = """import os, signal, time
from pathlib import Path
import psutil
import perfkit

executor = psutil.Process(os.getppid())  # the kernel's parent; the executor's is the round's template
template = executor.parent()
marker = Path("killed-a-template")
if not marker.exists() and any("--template" in part for part in template.cmdline()):
    marker.write_text(str(template.pid))
    template.send_signal(signal.SIGKILL)  # mid-round: this replicate and the next still measure
    time.sleep(0.5)
perfkit.record("offset", [10.0 + 0.01 * i for i in range(10)], unit="ms")
"""


def test_a_killed_template_loses_no_replicate_and_the_round_goes_on_fresh(tmp_path):
    """Issue 45: SIGKILL to the warm template mid-round turned the rest of the round into a
    ConnectionRefusedError traceback and called a healthy kernel dead. Now the replicate running when it
    died finishes (its executor is adopted and lives while the run does), the round's later replicates
    start as fresh processes, and the run says so once."""
    root = tmp_path / "p"
    (root / "hypotheses").mkdir(parents=True)
    (root / "notebooks").mkdir()
    nbformat.write(probe_notebook("n: int = 1", KILLS_ITS_TEMPLATE), str(root / "notebooks" / "identity.ipynb"))
    for i in (1, 2):
        (root / "hypotheses" / f"identity-{i}.yaml").write_text(HYPOTHESIS.format(id=f"identity-{i}", n=i))
    project = Project(root)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        report = run(project, all=True, quick=True, replicates=2, budget_s=0, out=lines.append)
    assert (root / "notebooks" / "killed-a-template").exists()
    executions = sorted((x for h in report.results.hypotheses for x in h.executions), key=lambda x: x.replicate)
    assert len(executions) == 4 and all(x.status == "ok" for x in executions), [x.reason for x in executions]
    said = [line for line in lines if "the round's remaining replicates start as fresh processes" in line]
    assert len(said) == 1 and "the template exited (-9)" in said[0], lines
    assert sorted(x.warm for x in executions) == [False, True, True, True]  # one fresh, after the kill
    assert not any("Traceback" in line or "CRASHED" in line or "ConnectionRefused" in line for line in lines)


def test_the_socket_folder_of_a_template_killed_with_its_run_is_removed_by_the_next(tmp_path):
    """Issue 45: a run and its template killed with SIGKILL left a perfkit-warm-* folder under the temporary
    directory each time. A template that outlives its run removes its own; one killed too is swept when
    the next template starts (its socket has no listener), and a live template's folder is kept."""
    import os
    import subprocess
    import sys
    import time

    code = (
        "import os\nfrom perfkit.experiment.run import warm\n"
        "t = warm.Template(env=dict(os.environ), preload=[], root=None)\n"
        "print(t.folder, t.proc.pid, flush=True)\nos.kill(t.proc.pid, 9)\nos._exit(0)  # both, as SIGKILL would\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    killed = Path(shown.stdout.split()[0])
    assert killed.name.startswith(warm.FOLDER_PREFIX) and (killed / "template.sock").is_socket()
    deadline = time.monotonic() + 10
    while _listening(killed / "template.sock") and time.monotonic() < deadline:  # a killed process's socket
        time.sleep(0.05)  # closes a moment after it is a zombie
    being_made = Path(tempfile.mkdtemp(prefix=warm.FOLDER_PREFIX))  # no socket yet: its template is importing
    live = warm.Template(env=dict(os.environ), preload=[], root=None)
    try:
        assert not killed.exists() and being_made.exists()
        assert warm.sweep(Path(tempfile.gettempdir())) == [] and live.folder.exists()  # a live one is kept
    finally:
        live.close()
        being_made.rmdir()
    assert not live.folder.exists()


def _listening(path: Path) -> bool:
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def test_a_template_whose_run_died_right_after_it_was_ready_stops_and_removes_its_folder():
    """A template read which process was its run only after it said it was ready: a run killed in between
    (as here, at once) left a template running for ever, adopted by init, and its socket folder."""
    import os
    import subprocess
    import sys
    import time

    code = (
        "import os\nfrom perfkit.experiment.run import warm\n"
        "t = warm.Template(env=dict(os.environ), preload=[], root=None)\n"
        "print(t.folder, t.proc.pid, flush=True)\nos._exit(0)  # the run gone, its template not told\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    folder, pid = Path(shown.stdout.split()[0]), int(shown.stdout.split()[1])
    deadline = time.monotonic() + 20
    while (folder.exists() or alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    still = alive(pid)
    if still:
        os.kill(pid, 9)
    assert not still and not folder.exists(), f"template {pid} still running: {still}; folder left: {folder.exists()}"
