"""`perfkit diff`: what a change did, flips first, moves only beyond the intervals, a CI gate."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import records
from records import fixture_project, of
from repos import git

from perfkit.cli import main
from perfkit.experiment.records import compare as diff
from perfkit.experiment.records.hypothesis import load_hypotheses
from perfkit.paths import Project


def result(h, verdict, value, run_id, width=0.1):
    return of(h, verdict, value, run_id, width=width)


def store(project, run_id, entries):
    records.store(project, run_id, *entries)


@pytest.fixture
def project(tmp_path) -> Project:
    root = fixture_project(tmp_path / "repo").root
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    return Project(root)


def test_compare_orders_flips_first_and_moves_only_beyond_both_intervals(project):
    hs = {h.id: h for h in load_hypotheses(project)}
    base = [
        records.run_results(
            "1",
            *(
                result(hs[i], "confirmed", 1.0, "1")
                for i in ("fx-cost-confirmed", "fx-floor", "fx-share", "fx-scaling")
            ),
        )
    ]
    current = base + [
        records.run_results(
            "2",
            result(hs["fx-cost-confirmed"], "refuted", 3.0, "2"),  # flip
            result(hs["fx-floor"], "confirmed", 1.15, "2"),  # inside the noise: unchanged
            result(hs["fx-share"], "confirmed", 2.0, "2"),  # beyond both intervals: moved 2x
            result(hs["fx-speedup"], "confirmed", 1.0, "2"),  # new
        )
    ]
    changes = diff.compare(base, current)
    assert [(c.kind, c.id) for c in changes] == [
        ("flip", "fx-cost-confirmed"),
        ("added", "fx-speedup"),
        ("moved", "fx-share"),
        ("unchanged", "fx-floor"),
        ("unchanged", "fx-scaling"),
    ]
    assert changes[0].factor == pytest.approx(3.0) and changes[2].factor == pytest.approx(2.0)
    assert [c.id for c in diff.failing(changes, diff.DEFAULT_FAIL_ON)] == ["fx-cost-confirmed"]
    assert diff.failing(changes, ("moved",))[0].id == "fx-share"
    assert diff.failing(changes, ()) == []


def test_diff_md_against_the_last_commit_shows_the_rejudged_hypothesis_first(project, capsys):
    hs = {h.id: h for h in load_hypotheses(project)}
    store(project, "20250101-000001", [result(h, "confirmed", 1.0, "1") for h in hs.values()])
    git(project.root, "add", ".")
    git(project.root, "commit", "-qm", "base")
    store(project, "20250102-000001", [result(hs["fx-cost-confirmed"], "refuted", 5.0, "2")])
    code = main(["--root", str(project.root), "diff", "--md"])
    out = capsys.readouterr().out
    assert code == 1  # a flip to refuted fails the default gate
    lines = out.splitlines()
    assert len(lines) < 36  # short: the unchanged are collapsed
    table = [line for line in lines if line.startswith("| ")]
    assert table[0] == "| change | hypothesis | verdict | before → after | moved |"
    assert (
        table[1]
        == "| flip | `fx-cost-confirmed` | confirmed → refuted | 1 ms [0.9, 1.1] → 5 ms [4.5, 5.5] | 5x higher |"
    )
    assert "<img" not in "\n".join(table)  # plots are shown below the table, at a readable width
    section = out[out.index("#### `fx-cost-confirmed`: confirmed → refuted") :]
    assert 'after:\n\n<img src="hypotheses/ledger/plots/fx-cost-confirmed.png" width="380" alt="after">' in section
    assert out.startswith("### perfkit: 1 flip, ") and f"{len(hs) - 1} unchanged" in out
    both = main(
        ["--root", str(project.root), "diff", "--md", "--base-plots-url", "https://x/raw/b1/hypotheses/ledger/"]
    )
    out = capsys.readouterr().out
    assert both == 1 and "before and after:\n\n" in out
    assert (
        '<img src="https://x/raw/b1/hypotheses/ledger/plots/fx-cost-confirmed.png" width="380" alt="before (HEAD)"> '
        '<img src="hypotheses/ledger/plots/fx-cost-confirmed.png" width="380" alt="after">'
    ) in out
    assert main(["--root", str(project.root), "diff", "--fail-on", "none"]) == 0
    assert "1 flip" in capsys.readouterr().out
    assert main(["--root", str(project.root), "diff", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["base"] == "HEAD" and data["changes"][0]["kind"] == "flip"


def test_diff_against_a_folder_and_bad_bases_are_clear(project, tmp_path, capsys):
    hs = {h.id: h for h in load_hypotheses(project)}
    other = tmp_path / "other"
    store(Project(other), "20250101-000001", [result(hs["fx-share"], "confirmed", 1.0, "1")])
    store(project, "20250101-000001", [replace(result(hs["fx-share"], "confirmed", 1.0, "1"))])
    assert main(["--root", str(project.root), "diff", str(other / "hypotheses" / "ledger" / "results")]) == 0
    assert "1 unchanged" in capsys.readouterr().out
    git(project.root, "add", ".")
    git(project.root, "commit", "-qm", "x")
    assert main(["--root", str(project.root), "diff", "no-such-revision"]) == 2
    assert "perfkit: git rev-parse" in capsys.readouterr().err
    assert main(["--root", str(project.root), "diff", "--fail-on", "vibes"]) == 2


def _floored(h, verdict, ratio, floor_ms, run_id, *, t_ms=30.0):
    """A floor-judged result: the metric measured at `t_ms` and its floor at `floor_ms` (±5%)."""
    from perfkit.experiment.records.results import Floor, Measured, MetricSummary

    low, high = floor_ms * 0.95, floor_ms * 1.05
    return replace(
        of(h, verdict, None, run_id),
        measured=Measured(label="ratio to roof", unit="x", value=ratio, low=ratio * 0.9, high=ratio * 1.1),
        floor=Floor(metric="roof", value=floor_ms, unit="ms", note="memory-bound", low=low, high=high, replicates=3),
        metrics=(
            MetricSummary(name="t", unit="ms", at=None, n=90, mean=t_ms, low=t_ms * 0.92, high=t_ms * 1.08, std=1.0),
            MetricSummary(name="roof", unit="ms", at=None, n=15, mean=floor_ms, low=low, high=high, std=0.1),
        ),
    )


def test_a_verdict_that_changed_because_its_floor_moved_is_said_so_and_is_not_a_flip(project):
    """The issue's case: the same code, 30 ms both times, a floor of 27 ms then 9.6 ms: confirmed →
    refuted is `expectation-moved`, named with the floor's move, and fails only the gate that asks."""
    h = next(h for h in load_hypotheses(project) if h.id == "fx-floor")
    base = [records.run_results("1", _floored(h, "confirmed", 1.1, 27.0, "1"))]
    current = base + [records.run_results("2", _floored(h, "refuted", 3.1, 9.6, "2", t_ms=30.5))]
    (change,) = diff.compare(base, current)
    assert change.kind == "expectation-moved" and change.verdict_words == "confirmed → refuted"
    assert change.expectation == "floor roof 27 ms [25.6, 28.4] → 9.6 ms [9.12, 10.1]"
    assert diff.failing([change], diff.DEFAULT_FAIL_ON) == []
    assert diff.failing([change], ("expectation-moved",)) == [change]
    # the measurement moved as well (30 → 60 ms, beyond both intervals): a flip, with the floor's move said
    moved = base + [records.run_results("2", _floored(h, "refuted", 6.2, 9.6, "2", t_ms=60.0))]
    (flip,) = diff.compare(base, moved)
    assert flip.kind == "flip" and flip.expectation and diff.failing([flip], diff.DEFAULT_FAIL_ON) == [flip]
    # and everywhere a reviewer reads it: the diff's text and markdown, the ledger's History
    from perfkit.experiment.outputs import diff as shown
    from perfkit.experiment.outputs import ledger

    assert "the expectation moved: floor roof 27 ms" in shown.text([change], "base")
    assert "| expectation-moved | `fx-floor` |" in shown.markdown([change], "base")
    history = ledger.render(current)
    assert "**flip** (was confirmed); the expectation moved: floor roof 27 ms [25.6, 28.4] → 9.6 ms" in history
    assert "`fx-floor`: roof = 9.6 ms [9.12, 10.1] over 3 replicates: memory-bound" in history


@pytest.mark.parametrize("which", ["this repository's", "perfkit init --ci github's"])
def test_the_pull_request_workflows_are_valid_yaml_with_plots_that_render_in_private_repositories_and_forks(which):
    import yaml

    from perfkit.experiment.repo import init

    root = Path(__file__).resolve().parents[1]
    text = (root / ".github" / "workflows" / "perfkit.yml").read_text() if which.startswith("this") else init.WORKFLOW
    steps = yaml.safe_load(text)["jobs"]["review"]["steps"]  # a plain scalar with ': ' in it would not load
    runs = "\n".join(s.get("run", "") for s in steps)
    assert (
        'head="${{ github.event.pull_request.head.repo.full_name }}/raw/${{ github.event.pull_request.head.sha }}"'
        in runs
    )
    assert '--plots-url "https://github.com/$head/hypotheses/ledger/"' in runs
    assert '--base-plots-url "https://github.com/${{ github.repository }}/raw/$base/' in runs
    assert "raw.githubusercontent.com" not in text  # needs a token in a private repository
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in steps)  # the report, kept
    comment = next(s["run"] for s in steps if "gh pr comment" in s.get("run", ""))
    assert "|| echo" in comment  # from a fork the token may not comment: the job summary has the diff, no failure
