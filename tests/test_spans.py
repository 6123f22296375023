"""Spans: zero-cost when off, aggregates and log lines when on, step breakdowns in capture()."""

import io
import subprocess
import sys
import time
import types

import pytest

from perfkit.phases import PHASES, STEP, UNATTRIBUTED
from perfkit.probe import spans


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
    samples = bench(lambda: calls.append(1), warmup=2, repeat=5)
    assert len(samples) == 5 and len(calls) == 7
    samples = bench(lambda: time.sleep(0.002), warmup=0, repeat=2, min_time_s=0.02)
    assert len(samples) >= 8
    assert min(samples) >= 0.002
    fast = bench(lambda: None, warmup=0, repeat=3, inner=100)
    assert len(fast) == 3 and max(fast) < 0.001
    with pytest.raises(ValueError):
        bench(lambda: None, sync="gpu")


def test_bench_caps_its_samples_whatever_min_time_asks():
    from perfkit.probe.timing import MAX_SAMPLES, bench

    calls = []
    capped = bench(lambda: calls.append(1), warmup=0, repeat=3, min_time_s=60.0, max_samples=500)
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
