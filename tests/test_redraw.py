"""`perfkit ledger` redraws a plot that older drawing code drew, from its run's own samples
(perfkit/experiment/run/redraw.py), and keeps it as it is where those samples are not here."""

from __future__ import annotations

import io
import shutil

import pytest
from records import fixture_project, run, shared_machine

from perfkit.experiment.outputs import ledger
from perfkit.experiment.records import plots
from perfkit.experiment.records.results import load_all_results, stamp
from perfkit.experiment.run import commit
from perfkit.paths import Project

HID = "fx-cost-confirmed"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    project = fixture_project(tmp_path_factory.mktemp("measured") / "p", HID)
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        run(project, ids=[HID], replicates=2, budget_s=0, out=lambda line: None)
    return project


def _as_older_code_drew_it(path) -> bytes:
    """The plot as a perfkit whose drawing code differed left it: the same result's stamp, another drawing."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    with Image.open(path) as image:
        info = PngInfo()
        info.add_text(plots.STAMP_KEY, image.text[plots.STAMP_KEY])
        info.add_text(plots.DRAWING_KEY, "0123456789ab")
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", pnginfo=info)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_a_plot_older_code_drew_is_drawn_again_from_the_runs_samples(measured):
    project = measured
    (result,) = [h for r in load_all_results(project) for h in r.hypotheses]
    path = project.ledger_dir / result.plot
    assert plots.drawn_with(path) == plots.drawing()  # a run stamps the code that drew it
    old = _as_older_code_drew_it(path)
    said: list[str] = []
    commit.rewrite(project, say=said.append)
    assert any(line.startswith(f"redrew hypotheses/ledger/plots/{HID}.png from run ") for line in said), said
    assert path.read_bytes() != old and plots.drawn_with(path) == plots.drawing()
    assert plots.stamp_of(path) == stamp(result)  # the same result's plot: the row and the plot still match
    assert ledger.check(project)[0] == []
    drawn = path.read_bytes()
    again: list[str] = []
    commit.rewrite(project, say=again.append)
    assert not any("redrew" in line for line in again) and path.read_bytes() == drawn  # nothing left to redraw


def test_without_the_runs_samples_the_plot_stays_and_that_is_said(measured, tmp_path):
    clone = tmp_path / "clone"  # another clone: the ledger is committed, runs/ is not
    shutil.copytree(measured.root, clone, ignore=shutil.ignore_patterns("runs"))
    project = Project(clone)
    (result,) = [h for r in load_all_results(project) for h in r.hypotheses]
    path = project.ledger_dir / result.plot
    old = _as_older_code_drew_it(path)
    said: list[str] = []
    commit.rewrite(project, say=said.append)
    assert f"hypotheses/ledger/plots/{HID}.png was drawn by older code; its samples are not under runs/ here" in said
    assert path.read_bytes() == old and ledger.check(project)[0] == []
