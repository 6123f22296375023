"""What a run says changed when it measured again: the part of the execution's key that differs, named."""

from dataclasses import replace

from records import result

from perfkit.experiment.records.results import Execution
from perfkit.experiment.run import judging


def _with_threads(run_id: str, threads: int, key: str):
    x = Execution(key=key, notebook="p.ipynb", params={}, status="ok", run_id=run_id, threads=threads)
    return replace(result("h", "confirmed", 1.0, run_id=run_id), executions=(x,))


def test_a_change_of_threads_is_named_not_called_unnameable():
    before, now = _with_threads("r1", 2, "k1"), _with_threads("r2", 1, "k2")
    said = judging.changed(now, before, "r1", [])
    assert said.startswith("threads 2 -> 1"), said
    assert "cannot be named" not in said and "neither" not in said


def test_a_change_nothing_records_says_so_without_blaming_missing_evidence():
    before, now = _with_threads("r1", 2, "k1"), _with_threads("r2", 2, "k2")
    said = judging.changed(now, before, "r1", [])
    assert "in a part that neither the stored results nor its manifest under runs/ name" in said, said
    gone = judging.changed(now, before, "r1", [], evidence_here=False)  # a fresh clone: runs/ is not committed
    assert "its evidence is not under runs/ here, so what changed cannot be named" in gone, gone
