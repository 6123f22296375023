"""`perfkit report`: one static page, checked in a real headless browser (Debian's chromium)."""

import re
import shutil
from pathlib import Path

import pytest
from browser import browser_dom

from perfkit.cli import main
from perfkit.experiment.outputs import report
from perfkit.experiment.records.results import load_all_results
from perfkit.paths import Project

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path) -> Project:
    shutil.copytree(ROOT / "hypotheses", tmp_path / "hypotheses")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    return Project(tmp_path)


def test_the_report_is_the_same_bytes_for_the_same_results(project, tmp_path):
    results = load_all_results(project)
    assert report.render(results, None, None) == report.render(results, None, None)
    page = report.write(project, tmp_path / "out", results, base=None)
    shipped = len(list((project.root / "hypotheses").glob("*.yaml")))  # every one has a standing verdict
    assert (tmp_path / "out" / "plots").is_dir() and page.read_text().count('<tr><td><a href="#') == shipped


def test_the_report_renders_its_table_and_every_image_in_a_real_browser(project, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["--root", str(project.root), "report", "--out", str(out)]) == 0
    shot = tmp_path / "report.png"
    dom = browser_dom(out / "index.html", shot)
    images = re.search(r'<body data-images="ok (\d+) broken (\d+)"', dom)
    assert images, "the page's load handler did not run"
    ok, broken = map(int, images.groups())
    hypotheses = len(list((project.hypotheses_dir).glob("*.yaml")))
    assert broken == 0 and ok == 2 * hypotheses  # a thumbnail in the table and the full plot in each section
    table = dom[dom.index('<table id="verdicts">') : dom.index("</table>")]
    assert table.count("<tr>") == hypotheses + 1  # the header and one row per hypothesis
    assert "no base" in dom  # no git here: the page says so instead of failing
    assert shot.stat().st_size > 10_000  # a screenshot with something on it


def test_the_trend_strip_tells_two_runs_of_one_day_apart(project):
    results = load_all_results(project)
    ids = sorted({r.run_id for r in results})
    same_day = [i for i in ids if i.startswith("20261201-")]
    assert len(same_day) >= 2  # the shipped ledger has two runs of 2026-12-01
    page = report.render(results, None, None)
    for run_id in same_day[:2]:
        clock = f"{run_id[9:11]}:{run_id[11:13]}"
        assert f"<title>run {run_id}</title>2026-12-01<tspan x=" in page and f'dy="10">{clock}</tspan>' in page


def test_a_single_file_report_holds_its_plots_and_a_table_of_contents(project, tmp_path, capsys):
    out = tmp_path / "single"
    assert main(["--root", str(project.root), "report", "--out", str(out), "--single-file"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]  # nothing beside it
    page = (out / "index.html").read_text()
    hypotheses = len(list(project.hypotheses_dir.glob("*.yaml")))
    assert page.count('src="data:image/png;base64,') == 2 * hypotheses and 'src="plots/' not in page
    contents = page[page.index('<nav id="contents">') : page.index("</nav>")]
    assert contents.count('<li><a href="#') == hypotheses + 2  # changes, verdicts, then each hypothesis
    dom = browser_dom(out / "index.html")
    images = re.search(r'<body data-images="ok (\d+) broken (\d+)"', dom)
    assert images and images.groups() == (str(2 * hypotheses), "0")  # every inlined plot decodes
