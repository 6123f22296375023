"""Spans: zero-cost when off, aggregates and log lines when on, step breakdowns in capture()."""

import io
import subprocess
import sys
import threading
import time
import types

import pytest

from perfkit.phases import PHASES, STEP, UNATTRIBUTED
from perfkit.probe import proflines, spans


@pytest.fixture
def log():
    buf = io.StringIO()
    old_stream, old_every = spans._stream, spans._log_every
    spans.set_enabled(False)
    spans.reset()
    spans.set_log_every(50, stream=buf)
    yield buf
    spans.set_enabled(False)
    spans.reset()
    spans._stream, spans._log_every = old_stream, old_every


def test_disabled_span_and_timed_cost_nothing(log):
    def f():
        return 42

    wrapped = spans.timed("f")(f)
    assert wrapped() == 42 and wrapped.__wrapped__ is f
    assert spans.span("a") is spans.span("b")  # one shared do-nothing object
    with spans.span("a"):
        pass
    assert spans.stats() == {}
    assert log.getvalue() == ""
    with spans.capture() as cap:  # decorated while off, yet timed inside a capture
        wrapped()
    assert len(cap.samples("f")) == 1


def test_enabled_timed_aggregates_and_logs_every_n(log):
    spans.set_log_every(4, stream=log)
    spans.set_enabled(True)
    calls = []
    g = spans.timed("g")(lambda: calls.append(1))
    for _ in range(9):
        g()
    lines = [line for line in log.getvalue().splitlines() if " g: " in line and line.startswith("[perfkit-prof pid=")]
    assert [line.split("] g: ")[1].split()[0] for line in lines] == ["n=4", "n=8"]
    st = spans.stats()["g"]
    assert st.n == 9 and len(calls) == 9
    assert st.total == pytest.approx(st.mean * 9)
    assert st.p50 <= st.p99


def test_fewer_calls_than_interval_still_print_on_flush(log):
    spans.set_enabled(True)
    for _ in range(3):
        with spans.span("prepare_for_verify"):
            time.sleep(0.001)
    assert log.getvalue() == ""  # below the interval: nothing yet
    spans.flush()
    line = log.getvalue().strip()
    assert line.startswith("[perfkit-prof pid=") and "] prepare_for_verify: n=3 mean=" in line
    assert "last=" in line and "p99=" in line


def test_env_profile_prints_summary_at_exit():
    code = "from perfkit.probe.spans import timed\nf = timed('once')(lambda: None)\nf(); f()\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PERFKIT_PROFILE": "1", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "] once: n=2 " in out.stderr and "[perfkit-prof pid=" in out.stderr


def test_capture_groups_phases_by_step_with_unattributed(log):
    with spans.capture() as cap:
        for _ in range(2):
            with spans.span(STEP):
                with spans.span("draft"):
                    time.sleep(0.002)
                for _ in range(2):  # a phase twice in one step is summed
                    with spans.span("verify_forward"):
                        time.sleep(0.001)
                time.sleep(0.003)  # nobody's phase
        with spans.span("outside"):
            pass
    assert not spans.enabled()  # capture restores the previous state
    steps = cap.steps()
    assert len(steps) == 2
    for row in steps:
        assert list(row) == [STEP, *PHASES, UNATTRIBUTED]  # the engine's declared phases, absent ones 0
        assert row["tree_build"] == 0.0
        assert row["verify_forward"] >= 0.002
        assert row[UNATTRIBUTED] >= 0.003
        assert row[STEP] == pytest.approx(row["draft"] + row["verify_forward"] + row[UNATTRIBUTED])
    assert len(cap.samples("verify_forward")) == 4
    assert len(cap.samples("outside")) == 1


def test_any_engines_spans_inside_a_step_are_its_phases_and_nested_ones_stay_in_their_parent(log):
    with spans.capture() as cap:
        for _ in range(3):
            with spans.span(STEP):
                with spans.span("schedule"):
                    with spans.span("pick_batch"):  # nested: part of schedule, not a phase of its own
                        time.sleep(0.001)
                with spans.span("forward"):
                    time.sleep(0.002)
    steps = cap.steps()
    assert [list(row) for row in steps] == [[STEP, "schedule", "forward", UNATTRIBUTED]] * 3
    for row in steps:
        assert row["schedule"] >= 0.001 and row["forward"] >= 0.002
        assert row[STEP] == pytest.approx(row["schedule"] + row["forward"] + row[UNATTRIBUTED])
    assert len(cap.samples("pick_batch")) == 3
    with spans.capture(phases=("forward", "schedule")) as ordered:
        with spans.span(STEP):
            with spans.span("schedule"):
                pass
            with spans.span("forward"):
                pass
    assert list(ordered.steps()[0]) == [STEP, "forward", "schedule", UNATTRIBUTED]  # the declared order


def test_absent_phase_reads_zero_in_steps_where_it_did_not_run(log):
    with spans.capture() as cap:
        with spans.span(STEP):
            with spans.span("tree_build"):
                pass
        with spans.span(STEP):
            pass
    first, second = cap.steps()
    assert second["tree_build"] == 0.0
    assert second[UNATTRIBUTED] == pytest.approx(second[STEP])


class _FakeEvent:
    clock = 0.0
    synced = 0
    done_until = float("inf")

    def __init__(self, enable_timing):
        assert enable_timing
        self.t = None

    def record(self):
        _FakeEvent.clock += 0.005  # 5 ms of "device time" between consecutive events
        self.t = _FakeEvent.clock

    def query(self):
        return True

    def synchronize(self):
        _FakeEvent.synced += 1

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _fake_torch(nvtx_calls):
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        Event=_FakeEvent,
        synchronize=lambda: None,
        nvtx=types.SimpleNamespace(
            range_push=lambda name: nvtx_calls.append(("push", name)),
            range_pop=lambda: nvtx_calls.append(("pop",)),
        ),
    )
    return types.SimpleNamespace(cuda=cuda)


def test_cuda_path_uses_events_and_nvtx_without_sync_per_call(log, monkeypatch):
    """The CUDA code path, exercised with a stand-in torch.cuda (no GPU here)."""
    nvtx = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(nvtx))
    monkeypatch.setattr(spans, "_cuda_available", None)  # ask the stand-in, not the cached answer
    _FakeEvent.synced = 0
    with spans.capture() as cap:
        with spans.span(STEP):
            with spans.span("verify_forward"):
                pass
            assert _FakeEvent.synced == 0  # nothing resolved while the step runs
    assert nvtx == [("push", STEP), ("push", "verify_forward"), ("pop",), ("pop",)]
    (row,) = cap.steps()
    assert row["verify_forward"] == pytest.approx(0.005)
    assert row[STEP] == pytest.approx(0.015)
    assert _FakeEvent.synced == 2  # resolved once each, when the capture closed


def test_bench_returns_samples_with_warmup_and_min_time():
    from perfkit.probe.timing import bench

    calls = []
    samples = bench(lambda: calls.append(1), warmup=2, repeat=5, inner=1)
    assert len(samples) == 5 and len(calls) == 7
    samples = bench(lambda: time.sleep(0.002), warmup=0, repeat=2, min_time_s=0.02, inner=1)
    # it goes on past `repeat` until 20 ms are measured: how many samples that takes depends on how
    # long a 2 ms sleep lasts on this machine (6 ms on a busy CI runner), the total does not
    assert len(samples) > 2 and sum(samples) >= 0.02 and sum(samples[:-1]) < 0.02
    assert min(samples) >= 0.002
    fast = bench(lambda: None, warmup=0, repeat=3, inner=100)
    assert len(fast) == 3 and max(fast) < 0.001
    with pytest.raises(ValueError):
        bench(lambda: None, sync="gpu")


def test_bench_caps_its_samples_whatever_min_time_asks():
    from perfkit.probe.timing import MAX_SAMPLES, bench

    calls = []
    capped = bench(lambda: calls.append(1), warmup=0, repeat=3, min_time_s=60.0, max_samples=500, inner=1)
    assert len(capped) == 500 == len(calls)  # it stopped at the cap, long before 60 s
    assert MAX_SAMPLES <= 100_000
    with pytest.raises(ValueError):
        bench(lambda: None, repeat=10, max_samples=5)


def test_public_bench_stays_the_function_after_its_module_is_imported():
    import perfkit
    import perfkit.probe.timing  # noqa: F401  (a submodule import must not shadow the function)

    assert callable(perfkit.bench) and perfkit.bench is perfkit.probe.timing.bench
    assert len(perfkit.bench(lambda: None, warmup=0, repeat=2)) == 2


def test_capture_alone_collects_quietly_until_flush(log):
    spans.set_log_every(2, stream=log)
    with spans.capture() as cap:
        for _ in range(5):
            with spans.span("draft"):
                pass
    assert len(cap.samples("draft")) == 5
    assert log.getvalue() == ""  # no periodic lines: profiling was not switched on
    spans.flush()
    assert "] draft: n=5 " in log.getvalue()


# --- a process that never exits: periodic reports, SIGUSR1, one write per report, ranks ------------


class _Writes(io.StringIO):
    """A stream that counts its write calls."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


@pytest.fixture
def writes(log):
    stream = _Writes()
    spans.set_log_every(50, stream=stream)
    yield stream
    spans.set_interval(None)


def test_a_report_is_every_name_in_one_write_and_a_log_line_is_one_write(writes):
    spans.set_log_every(3, stream=writes)
    spans.set_enabled(True)
    for name in ("draft", "verify", "commit"):
        for _ in range(4):
            with spans.span(name):
                pass
    assert len(writes.writes) == 3 and all(w.count("\n") == 1 for w in writes.writes)  # n=3 of each
    printed = spans.report()
    assert sorted(printed) == ["commit", "draft", "verify"]
    last = writes.writes[-1]
    assert len(writes.writes) == 4 and last.count("\n") == 3 and "] verify: n=4 " in last
    spans.flush()
    assert len(writes.writes) == 5 and writes.writes[-1].count("\n") == 3


def test_a_name_with_control_characters_stays_on_one_line(writes):
    spans.set_enabled(True)
    with spans.span("evil\nname\r\x1b[2J"):
        pass
    spans.flush()
    (text,) = writes.writes
    assert text.count("\n") == 1 and "evil\\nname\\r\\x1b[2J: n=1 " in text


def test_the_periodic_thread_prints_cumulative_lines_while_profiling_is_on(writes):
    spans.set_enabled(True)
    with spans.span("draft"):
        pass
    spans.set_interval(0.05)
    deadline = time.monotonic() + 5
    while len(writes.writes) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(writes.writes) >= 2 and all("] draft: n=1 " in w for w in writes.writes)
    spans.set_enabled(False)  # off: the thread keeps quiet
    time.sleep(0.15)
    quiet = len(writes.writes)
    time.sleep(0.15)
    assert len(writes.writes) == quiet
    with pytest.raises(ValueError):
        spans.set_interval(float("nan"))


def test_reports_from_another_thread_read_consistent_aggregates(writes, monkeypatch):
    spans.set_log_every(10**9, stream=writes)  # the reporting thread is the only writer: its lines are in order
    spans.set_enabled(True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: inside a span's add(), too
    stop = threading.Event()

    def reporting():
        while not stop.is_set():
            spans.report()

    thread = threading.Thread(target=reporting)
    thread.start()
    calls = 0
    try:
        while len(writes.writes) < 50 and calls < 10**6:
            with spans.span("hot"):
                calls += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
    from perfkit.probe import proflines

    lines = proflines.parse("".join(writes.writes))
    assert len(lines) >= 50 and all(line.p99 == line.p99 and line.p50 == line.p50 for line in lines)  # no NaN
    counts = [line.n for line in lines]
    assert counts == sorted(counts) and counts[-1] <= calls == spans.stats()["hot"].n


def test_a_report_resolves_only_events_already_complete(writes, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch([]))
    monkeypatch.setattr(spans, "_cuda_available", None)
    monkeypatch.setattr(_FakeEvent, "query", lambda self: self.t <= _FakeEvent.done_until)
    spans.set_enabled(True)
    _FakeEvent.synced = 0
    for _ in range(3):
        with spans.span("verify_forward"):
            pass
    _FakeEvent.done_until = _FakeEvent.clock - 0.005  # the last span's end event is still running
    assert spans.report()["verify_forward"].n == 2 and _FakeEvent.synced == 2  # synchronize() on a done event
    assert spans.stats()["verify_forward"].n == 3  # stats() waits for the rest


def test_the_rank_is_kept_once_seen_so_the_exit_summary_carries_it(writes, monkeypatch):
    """Why the exit summary had no rank: it ran after destroy_process_group, with no RANK set."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(proflines, "_rank", None)
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(distributed=dist))
    spans.set_log_every(2, stream=writes)
    spans.set_enabled(True)
    for _ in range(2):
        with spans.span("draft"):
            pass
    assert "[perfkit-prof pid=" in writes.writes[0] and " rank=3] draft: n=2 " in writes.writes[0]
    dist.is_initialized = lambda: False  # destroy_process_group()
    spans.flush()
    assert " rank=3] draft: n=2 " in writes.writes[-1]
    monkeypatch.setattr(proflines, "_rank", None)
    assert proflines.rank() is None
    monkeypatch.setenv("RANK", "5")
    assert proflines.rank() == 5


SERVER = """
import signal, sys
{before}
from perfkit.probe import proflines, spans
print(signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None), flush=True)
for request in sys.stdin:  # never exits on its own
    for _ in range(int(request)):
        with spans.span("prepare_for_verify"):
            pass
    print("done", flush=True)
"""


def _serve(env, before=""):
    return subprocess.Popen(
        [sys.executable, "-c", SERVER.format(before=before)],
        env={"PATH": "", **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _readline(stream, timeout=10.0):
    """A line of a child's output, failing (not hanging) when none comes."""
    import select

    assert select.select([stream], [], [], timeout)[0], f"nothing within {timeout} s"
    return stream.readline()


def _ask(child, calls):
    child.stdin.write(f"{calls}\n")
    child.stdin.flush()
    assert _readline(child.stdout) == "done\n"


def test_a_server_prints_its_lines_every_interval_and_at_once_on_sigusr1():
    import os
    import select
    import signal

    periodic = _serve({"PERFKIT_PROFILE": "1", "PERFKIT_PROFILE_INTERVAL": "0.2", "RANK": "1"})
    on_demand = _serve(
        {"PERFKIT_PROFILE": "1"}, before="signal.signal(signal.SIGUSR1, lambda *a: print('chained', flush=True))"
    )
    quiet = _serve({})
    try:
        assert [_readline(c.stdout) for c in (periodic, on_demand, quiet)] == ["True\n", "True\n", "False\n"]
        _ask(periodic, 7)
        started = time.monotonic()
        ready, _, _ = select.select([periodic.stderr], [], [], 1.0)
        assert ready, "no periodic line within a second"
        first = periodic.stderr.readline()
        assert "rank=1] prepare_for_verify: n=7 " in first and time.monotonic() - started < 1.0
        _ask(on_demand, 3)
        assert not select.select([on_demand.stderr], [], [], 0.3)[0]  # no interval: nothing yet
        os.kill(on_demand.pid, signal.SIGUSR1)
        assert select.select([on_demand.stderr], [], [], 1.0)[0], "no report after SIGUSR1"
        assert "] prepare_for_verify: n=3 " in on_demand.stderr.readline()
        assert _readline(on_demand.stdout) == "chained\n"  # the handler there was still runs
        _ask(on_demand, 1)
    finally:
        for child in (periodic, on_demand, quiet):
            child.kill()
            child.wait()


def test_the_outer_span_of_a_step_may_have_another_name(log):
    with spans.capture(phases=("forward",), step="decode_step") as cap:
        for _ in range(3):
            with spans.span("decode_step"):
                with spans.span("forward"):
                    time.sleep(0.001)
        with spans.span(STEP):  # a span called `step` is no step here
            with spans.span("forward"):
                pass
    steps = cap.steps()
    assert len(steps) == 3 and all(list(row) == [STEP, "forward", UNATTRIBUTED] for row in steps)
    assert all(row["forward"] >= 0.001 and row[STEP] >= row["forward"] for row in steps)
    with pytest.raises(ValueError, match="names a span"):
        spans.capture(step="")
