"""Profile lines read over a window (a file, a journal, a container's log) and recorded per rank."""

import json
import os
import select
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from perfkit.errors import UserError
from perfkit.probe import logsources, proflines, recording, reports
from perfkit.probe.spans import SpanStats
from perfkit.samples import decode_samples

NAME = "prepare_for_verify"


def line(pid, n, total, rank=None, name=NAME):
    """A line as spans print it (total in ms)."""
    st = SpanStats(name=name, n=n, mean=total / n / 1e3, p50=0.0001, p99=0.0002, last=0.0001, total=total / 1e3)
    return proflines.format_line(pid, rank, st)


@pytest.fixture
def shown(monkeypatch):
    got = []
    monkeypatch.setattr(recording, "_emit", lambda records, text: got.extend(records))
    return got


def samples(records, name):
    (rec,) = [r for r in records if r["name"] == name]
    return decode_samples(rec["samples"])


def by_pid(window):
    return {r.pid: (r.rank, r.n, round(r.total, 6)) for r in window.figures()[NAME]}


# --- files ----------------------------------------------------------------------------------------


def test_a_file_window_is_what_was_appended_less_each_process_last_line_before(tmp_path, shown):
    log = tmp_path / "serve.log"
    partial = line(11, 30, 9.0, rank=0)
    before = f"{line(11, 10, 2.0, rank=0)}\nnoise\n{line(12, 50, 5.0)}\n{line(14, 9, 1.0, rank=3)}\n"
    log.write_text(before + partial[:25])
    with logsources.profile_window(log) as w:
        with open(log, "a") as fh:  # the line being written when the window opened belongs to the window
            fh.write(f"{partial[25:]}\n{line(12, 50, 5.0, rank=1)}\n{line(12, 80, 8.5, rank=1)}\n")
            fh.write(line(13, 4, 1.0, rank=2) + "\n" + line(14, 9, 1.0, rank=3) + "\n")
            fh.write(line(11, 99, 99.0, rank=0)[:30])  # unfinished: left out
    assert by_pid(w) == {11: (0, 20, 7.0), 12: (1, 30, 3.5), 13: (2, 4, 1.0)}
    names = recording.record_profile_lines(w, names=[NAME], prefix="server_", at={"ctx": 46000})
    assert names == [
        "server_prepare_for_verify",
        "server_prepare_for_verify_slowest_rank",
        "server_prepare_for_verify_calls",
    ]
    assert samples(shown, "server_prepare_for_verify") == pytest.approx([7.0 / 20, 3.5 / 30, 1.0 / 4])  # rank order
    assert samples(shown, "server_prepare_for_verify_slowest_rank") == pytest.approx([0.35])
    assert samples(shown, "server_prepare_for_verify_calls") == [54]
    assert all(r["at"] == {"ctx": 46000} for r in shown)
    assert "54 calls in the window: pid 11 rank 0 20, pid 12 rank 1 30, pid 13 rank 2 4" in shown[0]["note"]
    assert "cumulative" in shown[0]["note"] and "no call in the window from pid 14 rank 3" in shown[0]["note"]


def test_windows_one_after_another_give_a_sample_each(tmp_path, shown):
    """One window per request: the slowest rank of each window is one sample, the calls add up."""
    log = tmp_path / "serve.log"
    log.write_text(f"{line(11, 10, 1.0, rank=0)}\n{line(12, 10, 2.0, rank=1)}\n")
    windows = []
    for step, (a, b) in enumerate([(1.0, 4.0), (6.0, 2.0)], start=1):
        with logsources.profile_window(log) as w:
            with open(log, "a") as fh:
                fh.write(f"{line(11, 10 + 5 * step, 1.0 + a * step, rank=0)}\n")
                fh.write(f"{line(12, 10 + 5 * step, 2.0 + b * step, rank=1)}\n")
        windows.append(w)
    recording.record_profile_lines(windows, names=[NAME])
    # window 1: rank 0 1 ms / 5 calls, rank 1 4 ms / 5; window 2: rank 0 (13 - 2) / 5, rank 1 (6 - 6) / 5
    assert samples(shown, NAME) == pytest.approx([0.2, 0.8, 2.2, 0.0])
    assert samples(shown, f"{NAME}_slowest_rank") == pytest.approx([0.8, 2.2])
    assert samples(shown, f"{NAME}_calls") == [20]
    assert shown[0]["note"].startswith("2 windows, one sample each")
    with pytest.raises(UserError, match="expected log text or profile_windows"):
        recording.record_profile_lines([windows[0], "text"])


def test_a_file_truncated_or_rotated_during_the_window_is_read_from_its_start(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text(line(1, 10, 1.0, rank=0) + "\n" + line(2, 10, 1.0, rank=1) + "\n")
    with logsources.profile_window(log) as w:
        log.write_text(line(1, 15, 2.0, rank=0) + "\n")  # truncated, then written again (copytruncate)
    assert by_pid(w) == {1: (0, 5, 1.0)} and "truncated" in w.lines.notes[0]
    with open(log, "a") as fh:
        fh.write(line(2, 10, 1.0, rank=1) + "\n")
    with logsources.profile_window(log) as w:
        with open(log, "a") as old:
            os.rename(log, tmp_path / "serve.log.1")
            old.write(line(2, 12, 1.5, rank=1) + "\n")  # the writer still holds the renamed file
            log.write_text(line(1, 20, 3.0, rank=0) + "\n")  # and a new one begins
    assert by_pid(w) == {1: (0, 5, 1.0), 2: (1, 2, 0.5)} and "rotated" in w.lines.notes[0]


def test_a_server_is_read_through_its_log_path_and_a_missing_file_counts_from_zero(tmp_path, shown):
    server = types.SimpleNamespace(log_path=tmp_path / "serve-1234.log")
    with logsources.profile_window(server) as w:
        server.log_path.write_text(line(5, 3, 0.6) + "\n")
    assert by_pid(w) == {5: (None, 3, 0.6)} and "did not exist" in w.lines.notes[0]
    with pytest.raises(UserError, match="has no log here"):
        logsources.profile_window(types.SimpleNamespace(log_path=None))
    with pytest.raises(UserError, match="cannot read profile lines from 42"):
        logsources.profile_window(42)


def test_a_window_is_read_once_closed_and_a_failed_load_keeps_its_own_error(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text(line(1, 10, 1.0) + "\n")
    with logsources.profile_window(log) as w:
        with pytest.raises(UserError, match="still open"):
            w.figures()
    with pytest.raises(ConnectionError, match="server went away"):
        with logsources.profile_window(log) as w:
            raise ConnectionError("server went away")
    assert w.lines.inside == [] and w.sources[0]._fh.closed


def test_a_window_without_lines_for_a_name_says_what_it_saw(tmp_path, shown):
    log = tmp_path / "serve.log"
    log.write_text(line(1, 10, 1.0) + "\n")
    with logsources.profile_window(log) as w:
        with open(log, "a") as fh:
            fh.write(line(1, 10, 1.0) + "\n" + line(1, 3, 1.0, name="other") + "\n")  # no new call of NAME
    with pytest.raises(UserError) as err:
        recording.record_profile_lines(w, names=[NAME])
    message = str(err.value)
    assert "no profile lines for prepare_for_verify in 2 profile lines in a" in message
    assert "names with calls: other" in message and "PERFKIT_PROFILE_INTERVAL=1" in message
    assert not shown


# --- journal and docker, through stand-in commands on PATH -----------------------------------------

FAKE = """#!/bin/sh
printf '%s\\n' "$@" > "{dir}/argv"
cat "{dir}/out"
cat "{dir}/err" >&2
exit $(cat "{dir}/status")
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Write a stand-in `journalctl`/`docker` that prints given text and records its arguments."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")

    def install(binary, out="", err="", status=0):
        script = folder / binary
        script.write_text(FAKE.format(dir=folder))
        script.chmod(0o755)
        (folder / "out").write_text(out)
        (folder / "err").write_text(err)
        (folder / "status").write_text(str(status))
        return folder

    return install


def entry(when, message, host="gpu-1", pid=900):
    us = str(int(when * 1e6))
    return json.dumps({"__REALTIME_TIMESTAMP": us, "_HOSTNAME": host, "_PID": str(pid), "MESSAGE": message})


def test_a_journal_window_reads_journalctl_json_with_hosts_as_origins(fake, shown):
    folder = fake("journalctl")
    with logsources.profile_window("journal:sglang", lookback=60) as w:
        t = w.start
        raw = list(line(7, 40, 12.0, rank=1).encode())  # journald keeps a message with odd bytes as a list
        out = [
            entry(t - 5, line(7, 10, 2.0, rank=0)),
            entry(t - 4, line(7, 20, 4.0, rank=1), host="gpu-2"),  # pid 7 of another host: another process
            "not json",
            entry(t + 0.1, "INFO request done"),
            entry(t + 0.2, line(7, 25, 6.5)),  # rank-less, but gpu-1's pid 7 is rank 0
            entry(t + 0.3, raw, host="gpu-2"),
        ]
        (folder / "out").write_text("\n".join(out) + "\n")
    figures = {(r.origin, r.pid): (r.rank, r.n, round(r.total, 6)) for r in w.figures()[NAME]}
    assert figures == {("gpu-1 sglang[900]:", 7): (0, 15, 4.5), ("gpu-2 sglang[900]:", 7): (1, 20, 8.0)}
    argv = (folder / "argv").read_text().split()
    assert argv[:2] == ["-u", "sglang"] and "json" in argv and argv[argv.index("-o") + 1] == "json"
    since, until = float(argv[argv.index("--since") + 1][1:]), float(argv[argv.index("--until") + 1][1:])
    assert since == pytest.approx(w.start - 60, abs=1e-3) and until == pytest.approx(w.end, abs=1e-3)
    recording.record_profile_lines(w, names=[NAME], prefix="server_")
    assert samples(shown, "server_prepare_for_verify") == pytest.approx([4.5 / 15, 8.0 / 20])
    assert samples(shown, "server_prepare_for_verify_slowest_rank") == pytest.approx([0.4])
    assert samples(shown, "server_prepare_for_verify_calls") == [35]


def test_a_docker_window_reads_both_streams_by_their_timestamps(fake):
    folder = fake("docker")
    with logsources.profile_window({"docker": "engine-a"}) as w:
        stamp = lambda dt: logsources._rfc3339(w.start + dt).replace("Z", "123Z")  # noqa: E731 - nanoseconds
        (folder / "out").write_text(f"{stamp(-3)} {line(1, 10, 1.0, rank=0)}\n{stamp(0.2)} served a request\n")
        (folder / "err").write_text(f"{stamp(-2)} {line(1, 20, 2.0, rank=0)}\n{stamp(0.3)} {line(1, 50, 8.0)}\n")
    assert by_pid(w) == {1: (0, 30, 6.0)}
    assert {r.origin for r in w.lines.inside} == {"engine-a"}
    argv = (folder / "argv").read_text().split()
    assert argv[:2] == ["logs", "--timestamps"] and argv[-1] == "engine-a"
    assert argv[argv.index("--until") + 1].endswith("Z") and "--since" in argv


def test_several_sources_keep_their_processes_apart(tmp_path):
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    for log in logs:
        log.write_text(line(1, 10, 1.0) + "\n")  # pid 1 in two containers
    with logsources.profile_window(logs) as w:
        for i, log in enumerate(logs):
            with open(log, "a") as fh:
                fh.write(line(1, 20 + i, 3.0) + "\n")
    assert sorted((r.origin, r.n) for r in w.figures()[NAME]) == [(str(logs[0]), 10), (str(logs[1]), 11)]


def test_a_missing_or_failing_command_is_a_user_error_naming_it(fake, tmp_path, monkeypatch):
    fake("journalctl", err="No journal files were found.", status=1)
    with pytest.raises(UserError, match="failed with status 1 reading journal:engine: No journal files were found"):
        with logsources.profile_window("journal:engine"):
            pass
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    for source, binary in [("journal:engine", "journalctl"), ("docker:engine-a", "docker")]:
        with pytest.raises(UserError, match=f"{binary} not found on PATH: it is needed to read {source}"):
            with logsources.profile_window(source):
                raise AssertionError("the window must not open")
    with pytest.raises(UserError, match="names no container"):
        logsources.profile_window("docker:")


# --- the writing side: periodic reports ------------------------------------------------------------


def test_a_reporter_reports_every_interval_and_when_asked():
    ticks = []
    active = threading.Event()
    active.set()
    reporter = reports.Reporter(lambda: ticks.append(time.monotonic()), active.is_set, 0.05)
    deadline = time.monotonic() + 5
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ticks) >= 3
    reporter.set_interval(None)
    time.sleep(0.1)
    stopped = len(ticks)
    time.sleep(0.2)
    assert len(ticks) == stopped  # no interval: it waits to be asked
    reporter.ask()
    while len(ticks) == stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ticks) == stopped + 1
    active.clear()
    reporter.ask()
    time.sleep(0.1)
    assert len(ticks) == stopped + 1  # profiling off: nothing printed
    with pytest.raises(ValueError):
        reporter.set_interval(-1)


CHILD = """
import sys
from perfkit.probe import spans
for request in sys.stdin:  # a server: never exits on its own
    for _ in range(int(request)):
        with spans.span("prepare_for_verify"):
            pass
    print("done", flush=True)
"""


def test_a_window_over_a_live_process_counts_exactly_the_calls_made_in_it(tmp_path, shown):
    log = tmp_path / "serve.log"
    env = dict(os.environ, PERFKIT_PROFILE="1", PERFKIT_PROFILE_INTERVAL="0.2", RANK="1")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    with open(log, "wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, text=True
        )
    try:

        def drive(calls):
            child.stdin.write(f"{calls}\n")
            child.stdin.flush()
            assert select.select([child.stdout], [], [], 10)[0], "the child did not answer"
            assert child.stdout.readline() == "done\n"

        drive(20)
        server = types.SimpleNamespace(log_path=log, env={"PERFKIT_PROFILE_INTERVAL": "0.2"})
        with logsources.profile_window(server) as w:  # settles 1.5 intervals at each edge: a report lands there
            assert w.settle == pytest.approx(0.4)
            drive(37)
            drive(5)
        drive(100)  # after the window: not counted
        assert [(r.rank, r.n) for r in w.figures()[NAME]] == [(1, 42)]
        assert w.record([NAME], prefix="server_") == [
            f"server_{NAME}",
            f"server_{NAME}_slowest_rank",
            f"server_{NAME}_calls",
        ]
        assert samples(shown, f"server_{NAME}_calls") == [42]
    finally:
        child.kill()
        child.wait()


def test_a_whole_log_is_read_by_source_and_a_file_name_is_not_taken_for_text(tmp_path, shown):
    log = tmp_path / "serve.log"
    log.write_text(f"{line(11, 10, 2.0, rank=0)}\n{line(12, 20, 8.0, rank=1)}\n")
    recording.record_profile_lines(source=log, names=[NAME])
    assert samples(shown, NAME) == pytest.approx([0.2, 0.4]) and samples(shown, f"{NAME}_calls") == [30]
    server = types.SimpleNamespace(log_path=log)
    assert recording.record_profile_lines(source=server, names=[NAME], prefix="s_")[0] == f"s_{NAME}"
    with pytest.raises(UserError, match="is a file's name, not its text: pass source="):
        recording.record_profile_lines(str(log), names=[NAME])
    with pytest.raises(UserError, match="read over a window"):
        recording.record_profile_lines(source="journal:engine", names=[NAME])
    with pytest.raises(UserError, match="cannot read"):
        recording.record_profile_lines(source=tmp_path / "missing.log")
