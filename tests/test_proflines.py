"""Profile lines of many worker processes: each names its process and rank; `perfkit prof` merges them."""

import subprocess
import sys

import pytest

from perfkit.cli import main
from perfkit.probe import proflines, recording

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
    assert recording.record_profile_lines(text, names=["step"]) == ["step"]
    ((record,),) = shown
    assert record["name"] == "step" and record["unit"] == "ms" and len(record["samples"]) == 2
    assert "means of 2 processes' profile lines (60 calls)" in record["note"]
    with pytest.raises(Exception, match="no profile lines for verify"):
        recording.record_profile_lines(text, names=["verify"])
