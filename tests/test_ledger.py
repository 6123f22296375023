import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import records
from records import fixture_project, of

from perfkit.cli import main
from perfkit.experiment.outputs import ledger
from perfkit.experiment.records import history, results
from perfkit.experiment.records.hypothesis import load_hypotheses
from perfkit.paths import Project

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path) -> Project:
    return fixture_project(tmp_path, "fx-cost-confirmed", "fx-share")


def result(h, verdict, value, run_id):
    return of(h, verdict, value, run_id, off_by=f"{value}x off", executions=())


def store(project, run_id, entries, profile=None):
    records.store(project, run_id, *entries, profile=profile)
    for e in entries:
        (project.plots_dir).mkdir(parents=True, exist_ok=True)
        (project.ledger_dir / e.plot).write_bytes(b"png")


def test_ledger_is_sorted_deterministic_and_marks_flips(project, capsys):
    by_id = {h.id: h for h in load_hypotheses(project)}
    store(
        project,
        "20250102-000000",
        [result(by_id["fx-share"], "confirmed", 1.0, "2"), result(by_id["fx-cost-confirmed"], "refuted", 9.0, "2")],
    )
    store(project, "20250101-000000", [result(by_id["fx-cost-confirmed"], "confirmed", 1.0, "1")])
    assert main(["--root", str(project.root), "ledger"]) == 0
    first = project.ledger_path.read_bytes()
    assert main(["--root", str(project.root), "ledger"]) == 0
    assert project.ledger_path.read_bytes() == first
    text = first.decode()
    rows = [line for line in text.splitlines() if line.startswith("| [`")]
    assert [r.split("`")[1] for r in rows] == ["fx-cost-confirmed", "fx-share"]
    assert rows[0].startswith("| [`fx-cost-confirmed`](#fx-cost-confirmed) | ❌ refuted | ")
    assert rows[0].endswith(" | 9 ms [8.1, 9.9] vs ≈ 1 ms (×2) | 9.0x off |") and rows[0].count(" | ") == 4  # 5 columns
    assert rows[1].split(" | ")[1] == "✅ confirmed"
    section = text[text.index("### `fx-cost-confirmed`") :]
    plot = '<a href="ledger/plots/fx-cost-confirmed.png"><img src="ledger/plots/fx-cost-confirmed.png" width="480"'
    assert plot in section and "<img" not in "\n".join(rows)  # the plot in its section, at a readable width
    assert section.index(plot) < section.index("| run | how |") and "run 20250102-000000." in section
    assert "| 20250102-000000 | quick | refuted | 9 ms [8.1, 9.9] | **flip** (was confirmed) |" in text
    assert "| 20250101-000000 | quick | confirmed | 1 ms [0.9, 1.1] |  |" in text
    assert "- 20250102-000000: 2025-01-01T00:00:00Z, quick; machine not recorded" in text  # who measured it


def test_history_shows_the_last_measurements_and_every_flip_and_collapses_the_rest(project):
    from perfkit.experiment.outputs.ledger import SHOWN_HISTORY

    h = next(h for h in load_hypotheses(project) if h.id == "fx-cost-confirmed")
    verdicts = ["refuted"] + ["confirmed"] * (SHOWN_HISTORY + 3)
    for i, verdict in enumerate(verdicts):
        store(project, f"2025010{i // 10}-00000{i % 10}", [result(h, verdict, 1.0 + i, str(i))])
    text = ledger.render(results.load_all_results(project))
    section = text[text.index("### `fx-cost-confirmed`") :]
    assert section.count("| 2025") == SHOWN_HISTORY + 1  # the last five and the old flip
    assert "**flip** (was refuted)" in section
    assert "3 earlier measurements: `perfkit show fx-cost-confirmed`" in section  # 9 less 5 less the flip


def test_the_ledger_does_not_grow_with_the_number_of_runs(project):
    """LEDGER.md was 312 kB after a few weeks: every section kept a collapsed copy of its whole history.
    Now a section holds its last measurements and its latest flips; `perfkit show ID` has the rest."""
    h = next(h for h in load_hypotheses(project) if h.id == "fx-cost-confirmed")
    sizes = {}
    for i in range(60):  # a flip every fourth run
        store(
            project,
            f"202501{i // 30 + 1:02d}-0000{i % 30:02d}",
            [result(h, "refuted" if i % 4 else "confirmed", 1.0, str(i))],
        )
        if i + 1 in (20, 60):
            sizes[i + 1] = len(ledger.render(results.load_all_results(project)))
    assert sizes[60] < sizes[20] * 1.05, sizes


def test_a_run_that_reused_everything_adds_no_history_row_and_profiled_runs_never_stand(project):
    h = next(h for h in load_hypotheses(project) if h.id == "fx-cost-confirmed")
    execution = results.Execution(key="k", notebook="fixture_probe.ipynb", params={}, status="ok", run_id="1")
    measured = replace(result(h, "confirmed", 1.0, "1"), executions=(execution,))
    again = replace(measured, executions=(replace(execution, reused=True),))
    store(project, "20250101-000001", [measured])
    store(project, "20250101-000002", [again])  # every execution reused, the same verdict: no new row
    entries = history.history(results.load_all_results(project))["fx-cost-confirmed"]
    assert [e.run_id for e in entries] == ["20250101-000001"]
    profiled = replace(result(h, "refuted", 5.0, "3"), executions=(replace(execution, key="p", run_id="3"),))
    store(project, "20250101-000003", [profiled], profile="torch")
    text = ledger.render(results.load_all_results(project))
    row = next(line for line in text.splitlines() if line.startswith("| [`fx-cost-confirmed`]"))
    assert "✅ confirmed" in row and "run 20250101-000001." in text  # the unprofiled measurement stands
    assert "profiled (torch): not the standing measurement" in text


def test_check_passes_then_fails_when_a_hypothesis_changes(project, capsys):
    by_id = {h.id: h for h in load_hypotheses(project)}
    store(project, "20250101-000000", [result(h, "confirmed", 1.0, "1") for h in by_id.values()])
    ledger.write(project)
    assert main(["--root", str(project.root), "ledger", "--check"]) == 0
    path = project.hypotheses_dir / "fx-share.yaml"
    path.write_text(path.read_text().replace("at_least: 0.5", "at_least: 0.6"))
    capsys.readouterr()
    assert main(["--root", str(project.root), "ledger", "--check"]) == 1
    out = capsys.readouterr().out
    assert "fx-share: stale: hypotheses/fx-share.yaml changed since its last verdict (run 20250101-000000)" in out
    assert "fx-cost-confirmed" not in out


def test_check_fails_when_the_ledger_is_edited_or_a_hypothesis_was_never_judged(project, capsys):
    by_id = {h.id: h for h in load_hypotheses(project)}
    store(project, "20250101-000000", [result(by_id["fx-share"], "confirmed", 1.0, "1")])
    ledger.write(project)
    problems, _ = ledger.check(project)
    assert problems == ["fx-cost-confirmed: never judged; run `perfkit run fx-cost-confirmed`"]
    project.ledger_path.write_text(project.ledger_path.read_text() + "edited\n")
    problems, _ = ledger.check(project)
    assert any("LEDGER.md is out of date" in p for p in problems)


def test_show_prints_record_evidence_and_history(project, capsys):
    by_id = {h.id: h for h in load_hypotheses(project)}
    h = by_id["fx-share"]
    store(project, "20250101-000000", [result(h, "confirmed", 1.0, "1")])
    store(project, "20250102-000000", [replace(result(h, "refuted", 3.0, "2"), hash="changed")])
    assert main(["--root", str(project.root), "show", "fx-share"]) == 0
    out = capsys.readouterr().out
    assert "claim: The verify forward is at least half of the step." in out
    assert "standing verdict (run 20250102-000000)  [STALE" in out
    assert "20250102-000000  refuted" in out and "flip (was confirmed)" in out
    assert main(["--root", str(project.root), "show", "nope"]) == 2


def test_the_shipped_results_render_the_committed_ledger_byte_for_byte():
    """A golden test on committed fixtures: the renderer (moved to perfkit/experiment/outputs/) still
    writes exactly the LEDGER.md that the stored results produced when they were committed."""
    root = Path(__file__).resolve().parents[1]
    stored = results.load_all_results(Project(root))
    assert len(stored) >= 3
    assert ledger.render(stored) == (root / "hypotheses" / "LEDGER.md").read_text(encoding="utf-8")


def test_a_verdict_judged_at_another_level_says_so_in_every_view(project):
    from perfkit.experiment.outputs import diff as diff_view
    from perfkit.experiment.outputs import show

    h = load_hypotheses(project)[0]
    wide = of(h, "confirmed", 1.0, "1", executions=())
    wide = replace(wide, measured=replace(wide.measured, confidence=1 - 0.05 / 3))
    store(project, "1", [wide])
    text = ledger.render(results.load_all_results(project))
    assert "1 ms [0.9, 1.1] (98.3% interval)" in text and "could look at the evidence" in text
    assert "(98.3% interval)" in show.describe(project, h.id)
    from perfkit.experiment.records.compare import compare

    changes = compare([], results.load_all_results(project))
    assert "95% unless marked" in diff_view.markdown(changes, "base")


# What GitHub's stylesheet does to a rendered Markdown file (github-markdown-css): the article is at most
# 1012 px wide with 32 px padding; an image is at most 100% of what holds it; a table is a block as wide
# as its content, at most 100%, scrolling beyond. Facts of GitHub's renderer, restated here.
GITHUB_CSS = """
body { margin: 0; width: 1012px; }
.markdown-body { box-sizing: border-box; max-width: 1012px; padding: 32px; font-size: 16px; line-height: 1.5;
  font-family: -apple-system, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; }
.markdown-body img { max-width: 100%; box-sizing: content-box; }
.markdown-body table { display: block; width: max-content; max-width: 100%; overflow: auto; border-spacing: 0;
  border-collapse: collapse; }
.markdown-body table th, .markdown-body table td { padding: 6px 13px; border: 1px solid #d1d9e0; }
"""
MEASURE = """
window.addEventListener('load', () => {
  const px = e => Math.round(e.getBoundingClientRect().width);
  const table = document.querySelector('table');
  document.body.dataset.plots = [...document.querySelectorAll('img')].map(px).join(' ');
  document.body.dataset.columns = table.querySelectorAll('thead th').length;
  document.body.dataset.tableImages = table.querySelectorAll('img').length;
});
"""


def test_github_renders_every_plot_of_the_ledger_readable_and_the_standing_table_narrow(tmp_path):
    """The committed LEDGER.md through GitHub's renderer (cmark-gfm) and its stylesheet, in headless Chromium."""
    import cmarkgfm
    from browser import browser_dom
    from cmarkgfm.cmark import Options

    text = (ROOT / "hypotheses" / "LEDGER.md").read_text(encoding="utf-8")
    body = cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE)  # GitHub keeps <img>
    page = tmp_path / "hypotheses" / "LEDGER.html"
    page.parent.mkdir()
    shutil.copytree(ROOT / "hypotheses" / "ledger" / "plots", page.parent / "ledger" / "plots")
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><style>{GITHUB_CSS}</style><script>{MEASURE}</script>"
        f"</head><body><article class='markdown-body'>{body}</article></body></html>",
        encoding="utf-8",
    )
    dom = browser_dom(page)
    found = dict(re.findall(r'data-(plots|columns|table-images)="([^"]*)"', dom))
    plots = [int(w) for w in found["plots"].split()]
    assert len(plots) == text.count("<img ") and plots  # every plot of the ledger was laid out
    assert min(plots) >= 320, plots  # readable: not a 26-px thumbnail in a table cell
    assert int(found["columns"]) <= 7 and found["table-images"] == "0"  # the standing table: words only


def test_an_old_row_whose_note_reads_flip_is_not_shown_as_one(project):
    from perfkit.experiment.outputs.ledger import SHOWN_HISTORY

    h = next(h for h in load_hypotheses(project) if h.id == "fx-cost-confirmed")
    forged = replace(result(h, "inconclusive", None, "0"), reason="**flip** (was refuted)", measured=None)
    store(project, "20250101-000000", [forged])  # its note says flip; its verdict flipped from nothing
    for i in range(1, SHOWN_HISTORY + 3):
        store(project, f"20250101-00000{i}", [result(h, "inconclusive", None, str(i))])
    text = ledger.render(results.load_all_results(project))
    shown = text[text.index("### `fx-cost-confirmed`") :].split("<details>")[0]
    assert "| 20250101-000000 |" not in shown and shown.count("| 2025") == SHOWN_HISTORY


def test_check_warns_of_verdicts_whose_hypothesis_file_is_gone(project, capsys):
    by_id = {h.id: h for h in load_hypotheses(project)}
    store(project, "20250101-000000", [result(h, "confirmed", 1.0, "1") for h in by_id.values()])
    ledger.write(project)
    (project.hypotheses_dir / "fx-share.yaml").unlink()
    capsys.readouterr()
    assert main(["--root", str(project.root), "ledger", "--check"]) == 0  # a warning, not a failure
    assert "warning: fx-share: has verdicts but no hypothesis file any more" in capsys.readouterr().out


def _on(h, verdict, run_id, host):
    x = results.Execution(
        key=f"{run_id}{host}",
        notebook="p.ipynb",
        params={},
        status="ok",
        run_id=run_id,
        machine={"id": host, "host": host},
    )
    return of(h, verdict, 1.0, run_id, executions=(x,))


def test_rows_that_stand_on_other_runs_or_machines_say_which(project):
    by_id = {h.id: h for h in load_hypotheses(project)}
    cost, share = by_id["fx-cost-confirmed"], by_id["fx-share"]
    one_run = [
        records.run_results("20250101-000000", _on(cost, "confirmed", "r", "box1"), _on(share, "refuted", "r", "box1"))
    ]
    text = ledger.render(one_run)
    assert "measured in" not in text  # one run on one machine: nothing to tell apart
    two_runs = [
        records.run_results("20250101-000000", _on(cost, "confirmed", "r", "box1"), _on(share, "refuted", "r", "box1")),
        records.run_results("20250102-000000", _on(cost, "refuted", "s", "box1")),
    ]
    rows = [line for line in ledger.render(two_runs).splitlines() if line.startswith("| [`")]
    assert rows[0].endswith(" | 20250102-000000 |") and rows[1].endswith(" | 20250101-000000 |"), rows
    elsewhere = [*two_runs[:1], records.run_results("20250102-000000", _on(cost, "refuted", "s", "box2"))]
    text = ledger.render(elsewhere)
    assert (
        "| measured in |" in text and " | 20250102-000000 on box2 |" in text and " | 20250101-000000 on box1 |" in text
    )


def test_a_plot_says_the_run_and_machine_it_stands_on():
    from perfkit.experiment.records import plots
    from perfkit.experiment.records.verdict import Judgement, Verdict

    j = Judgement(verdict=Verdict.INCONCLUSIVE, reason="no samples", expected="≤ 1 ms")
    bare = plots.render("h", j, [], lambda *a: None)
    said = plots.render("h", j, [], lambda *a: None, source=results.source_of("r1", [_x("box1")]))
    assert said != bare  # the corner says it
    assert results.source_of("r1", [_x("box1"), _x("box2")]) == "run r1 on box1, box2"
    assert results.source_of("r1", [results.Execution(key="k", notebook="p.ipynb", params={})]) == "run r1"


def _x(host):
    return results.Execution(key=host, notebook="p.ipynb", params={}, machine={"id": host, "host": host})
