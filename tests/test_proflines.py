"""Profile lines of many worker processes: each names its process and rank; `perfkit prof` merges them."""

import re
import subprocess
import sys

import pytest

from perfkit.cli import main
from perfkit.errors import UserError
from perfkit.probe import proflines, recording
from perfkit.probe.spans import SpanStats
from perfkit.samples import decode_samples

WORKER = """
import time
from perfkit.probe import spans
spans.set_log_every(10)
for _ in range(30):
    with spans.span("step"):
        time.sleep({sleep})
"""


def workers(n: int) -> str:
    """The interleaved stderr of n worker processes, as a journal would hold it (prefixed lines)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER.format(sleep=0.001 * (rank + 1))],
            env={"PERFKIT_PROFILE": "1", "RANK": str(rank), "PATH": "/usr/bin:/bin"},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(n)
    ]
    outs = [(rank, p.communicate(timeout=60)[1]) for rank, p in enumerate(procs)]
    lines = [f"Dec 01 12:00:00 host engine[{rank}]: {line}" for rank, err in outs for line in err.splitlines()]
    lines.insert(1, "Dec 01 12:00:00 host engine[9]: something else entirely")
    return "\n".join(sorted(lines, key=lambda line: line.split(": ", 1)[1]))  # mixed, not grouped by worker


def test_the_merged_table_has_every_process_and_adds_counts_exactly(tmp_path, capsys):
    text = workers(3)
    by_name = proflines.latest(proflines.parse(text))
    rows = by_name["step"]
    assert sorted(r.rank for r in rows) == [0, 1, 2] and len({r.pid for r in rows}) == 3
    assert all(r.n == 30 for r in rows)  # the latest line of each process: the summary at exit
    merged = proflines.merge(rows)
    assert merged.n == 90 and merged.total == pytest.approx(sum(r.total for r in rows))
    assert merged.slowest.endswith("rank 2")  # it slept longest
    log = tmp_path / "journal.txt"
    log.write_text(text)
    assert main(["prof", str(log)]) == 0
    out = capsys.readouterr().out
    assert "step  (3 processes)" in out and "<- slowest" in out and "all (merged)" in out
    assert out.count(" rank ") == 3


def test_a_probe_records_what_the_workers_logged(monkeypatch):
    shown = []
    monkeypatch.setattr(recording, "_emit", lambda records, text: shown.append(records))
    text = workers(2)
    assert recording.record_profile_lines(text, names=["step"]) == ["step", "step_slowest_rank", "step_calls"]
    ((record, slowest, calls),) = shown
    assert record["name"] == "step" and record["unit"] == "ms" and len(record["samples"]) == 2
    assert "means of 2 processes' profile lines (60 calls since each process started" in record["note"]
    assert decode_samples(slowest["samples"]) == [max(decode_samples(record["samples"]))]
    assert decode_samples(calls["samples"]) == [60] and calls["unit"] == "count"
    with pytest.raises(UserError, match="no profile lines for verify .*PERFKIT_PROFILE_INTERVAL"):
        recording.record_profile_lines(text, names=["verify"])


def line(pid, name="step", n=10, total=5.0, rank=None, prefix=""):
    """A line as spans print it (durations in ms here)."""
    st = SpanStats(name=name, n=n, mean=total / n / 1e3, p50=0.0004, p99=0.0009, last=0.0005, total=total / 1e3)
    return prefix + proflines.format_line(pid, rank, st)


def test_an_exit_summary_without_rank_is_the_same_process_as_its_ranked_lines():
    """The issue's '220 calls where 120 ran': two ranks' periodic lines plus rank-less exit summaries."""
    text = "\n".join(
        [
            line(101, n=50, total=25.0, rank=0),
            line(202, n=50, total=30.0, rank=1),
            line(101, n=60, total=30.0),  # the exit summary, printed after the process group was destroyed
            line(202, n=60, total=36.0),
        ]
    )
    rows = proflines.latest(proflines.parse(text))["step"]
    assert [(r.pid, r.rank, r.n) for r in rows] == [(202, 1, 60), (101, 0, 60)]
    merged = proflines.merge(rows)
    assert merged.n == 120 and merged.processes == 2 and merged.total == pytest.approx(66.0)
    assert re.search(r"all \(merged\) +120 ", proflines.table(text))
    old_key = {(r.name, r.pid, r.rank): r.n for r in proflines.parse(text)}  # how it was keyed before
    assert sum(old_key.values()) == 220


def test_one_pid_in_two_containers_or_hosts_is_two_processes():
    text = "\n".join(
        [
            line(1, n=10, total=10.0, prefix="2024-05-01T10:00:00.123456789Z engine-a | "),
            line(1, n=20, total=40.0, prefix="2024-05-01T10:00:01.5+02:00 engine-b | "),
            line(1, n=30, total=30.0, prefix="2024-05-01T10:00:02Z engine-a | "),  # same process, later stamp
            line(7, n=5, total=5.0, rank=0, prefix="Dec  1 12:00:00 host-1 sglang[900]: "),
            line(7, n=6, total=12.0, rank=0, prefix="Dec 01 12:00:05.123 host-2 sglang[900]: "),
            line(7, n=9, total=9.0, prefix="Dec  1 12:00:09 host-1 sglang[900]: "),  # host-1's, rank-less
        ]
    )
    rows = proflines.latest(proflines.parse(text))["step"]
    got = sorted((r.origin, r.pid, r.rank, r.n) for r in rows)
    assert got == [
        ("engine-a |", 1, None, 30),
        ("engine-b |", 1, None, 20),
        ("host-1 sglang[900]:", 7, 0, 9),
        ("host-2 sglang[900]:", 7, 0, 6),
    ]
    out = proflines.table(text)
    assert "host-2 sglang[900]: pid 7 rank 0" in out and "note: pid 1 appears under 2 origins" in out
    merged = proflines.merge(rows)
    assert merged.n == 65 and merged.slowest == "engine-b | pid 1"
    one = proflines.latest(proflines.parse(text, by_pid=True))["step"]  # --by-pid: origins ignored
    assert sorted((r.pid, r.n) for r in one) == [(1, 30), (7, 9)]


@pytest.mark.parametrize(
    "prefix, origin",
    [
        ("", ""),
        ("2024-05-01 10:00:00,123 ", ""),
        ("[2024-05-01T10:00:00Z] ", ""),
        ("1714557600.123 ", ""),
        ("[  12.345] ", ""),
        ("10:00:00.5 [rank0]:", "[rank0]:"),
        ("May 01 10:00:00 gpu-node-3 python3[4411]: ", "gpu-node-3 python3[4411]:"),
        ("2024-05-01T10:00:00+0000 gpu-node-3 engine[12]: ", "gpu-node-3 engine[12]:"),
        ("engine-1  | 2024-05-01T10:00:00.123456789Z ", "engine-1 |"),  # docker compose logs -t
        ("[pod/engine-0/engine] 2024-05-01T10:00:01Z ", "[pod/engine-0/engine]"),  # kubectl logs --prefix --timestamps
        ("engine-1.2 ", "engine-1.2"),  # a version in a name is not a timestamp
    ],
)
def test_the_origin_is_the_prefix_without_its_timestamps(prefix, origin):
    (parsed,) = proflines.parse(line(5, prefix=prefix))
    assert parsed.origin == origin and parsed.pid == 5 and parsed.n == 10


@pytest.mark.parametrize("name", ["prepare for verify", "a: n=3 b", "tab\there", "two\nlines", "ünïcode ✓", "x]y"])
def test_names_with_spaces_colons_and_control_characters_round_trip_on_one_line(name):
    text = line(3, name=name, n=7, total=1.25)
    assert len(text.splitlines()) == 1
    (parsed,) = proflines.parse(text + "\n" + "unrelated: n=5 text")
    assert parsed.name == proflines.printable(name) and parsed.n == 7 and parsed.total == pytest.approx(1.25)
    assert (parsed.name == name) == name.isprintable()


def test_a_difference_counts_the_calls_between_two_lines_exactly():
    before = proflines.parse("\n".join([line(1, n=40, total=4.0, rank=0), line(2, n=10, total=3.0, rank=1)]))
    inside = proflines.parse(
        "\n".join(
            [
                line(1, n=45, total=4.5),  # rank-less: still rank 0's process
                line(1, n=70, total=7.25, rank=0),
                line(2, n=10, total=3.0, rank=1),  # no call in the window: left out
                line(3, n=8, total=2.0, rank=2),  # started during the window: counts from zero
                line(4, name="other", n=5, total=1.0),
            ]
        )
    )
    got = proflines.difference(before, inside)
    assert sorted(got) == ["other", "step"]
    rows = {r.pid: r for r in got["step"]}
    assert sorted(rows) == [1, 3]
    assert (rows[1].rank, rows[1].n, rows[1].total, rows[1].mean) == (
        0,
        30,
        pytest.approx(3.25),
        pytest.approx(3.25 / 30),
    )
    assert (rows[3].n, rows[3].total) == (8, pytest.approx(2.0))
    restarted = proflines.difference(proflines.parse(line(1, n=500, total=50.0)), proflines.parse(line(1, n=20)))
    assert restarted["step"][0].n == 20  # pid 1 again, counting from zero: a new process


def test_several_files_are_several_origins(tmp_path, capsys):
    a, b = tmp_path / "worker-a.log", tmp_path / "worker-b.log"
    a.write_text(line(1, n=10, total=10.0) + "\n")
    b.write_text(line(1, n=30, total=60.0) + "\n")
    assert main(["prof", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "step  (2 processes)" in out and "worker-b.log pid 1" in out and "   40 " in out
    assert main(["prof", "--by-pid", str(a)]) == 0
    assert "step  (1 process)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text",
    [
        "[perfkit-prof pid=1] step: n=5 mean=1.2.3ms p50=1ms p99=1ms last=1ms total=5ms",
        "[perfkit-prof pid=1] step: n=" + "9" * 5000 + " mean=1ms p50=1ms p99=1ms last=1ms total=" + "9" * 5000 + "ms",
        "[perfkit-prof pid=" + "9" * 5000 + "] step: n=5 mean=1ms p50=1ms p99=1ms last=1ms total=5ms",
    ],
)
def test_a_malformed_number_is_not_a_line_and_never_a_traceback(tmp_path, capsys, text):
    log = tmp_path / "bad.log"
    log.write_text(text + "\n" + line(5) + "\n")
    assert proflines.main([str(log)]) == 0
    out = capsys.readouterr().out
    assert "pid 5" in out and "pid 1 " not in out


def test_terminal_escapes_in_a_name_or_origin_never_reach_the_terminal_raw():
    figures = "n=2 mean=1ms p50=1ms p99=1ms last=1ms total=2ms"
    text = f"\x1b]0;pwned\x07host [perfkit-prof pid=3] \x1b[31mred\x1b[0m: {figures}\n"
    text += f"other [perfkit-prof pid=4] plain: {figures}\n"
    out = proflines.table(text)
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[31mred\\x1b[0m" in out and "\\x1b]0;pwned\\x07host pid 3" in out
