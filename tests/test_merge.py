"""Two pull requests that re-judged different hypotheses merge without a conflict in LEDGER.md."""

import shutil
import sys
from pathlib import Path

import records
from records import of
from repos import ROOT, git, sh

from perfkit.experiment.outputs import ledger
from perfkit.experiment.records.hypothesis import load_hypotheses
from perfkit.experiment.records.results import load_all_results
from perfkit.paths import Project

FIXTURES = Path(__file__).parent / "fixtures" / "project"


def judged(project, run_id, verdicts):
    hs = {h.id: h for h in load_hypotheses(project)}
    entries = [of(hs[hid], verdict, value, plot=None, executions=()) for hid, (verdict, value) in verdicts.items()]
    records.store(project, run_id, *entries)
    ledger.write(project)


def test_two_branches_rejudging_different_hypotheses_merge_cleanly(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES, repo)
    shutil.copy(ROOT / ".gitattributes", repo)
    project = Project(repo)
    git(repo, "init", "-q", "-b", "main")
    for key, value in (("user.email", "t@example.com"), ("user.name", "t")):
        git(repo, "config", key, value)
    git(repo, "config", "merge.perfkit-ledger.driver", f"{sys.executable} -m perfkit.experiment.repo.merge %A %P")
    everything = {h.id: ("confirmed", 1.0) for h in load_hypotheses(project)}
    judged(project, "20250101-000001", everything)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    git(repo, "checkout", "-qb", "pr-one")
    judged(project, "20250102-000001", {"fx-share": ("refuted", 3.0)})
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-qb", "pr-two")
    judged(project, "20250103-000001", {"fx-floor": ("refuted", 4.0)})
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "two")
    merged = sh(repo, "git", "merge", "-q", "--no-edit", "pr-one", check=False)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    text = project.ledger_path.read_text()
    assert text == ledger.render(load_all_results(project))  # as if regenerated after the merge
    assert "| 20250102-000001 |" in text and "| 20250103-000001 |" in text
    assert "<<<<<<<" not in text


def test_a_merge_driver_that_cannot_write_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from perfkit.experiment.repo import merge

    monkeypatch.setattr(merge, "results_of_both_sides", lambda project: [])
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert merge.main([str(blocked / "LEDGER.md"), str(tmp_path / "hypotheses" / "LEDGER.md")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("perfkit ledger merge: cannot write") and len(err.splitlines()) == 1
