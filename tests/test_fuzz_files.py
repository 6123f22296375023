"""What perfkit reads besides records, mutated: a results file, an executed notebook, profile lines.

Each mutation is seeded. Whatever the bytes, the reader answers with a verdict, a table or one
line of error (exit 2), never a traceback, and writes nothing it was not asked to: the results
file through `perfkit ledger --check` and `perfkit show`, the notebook through `perfkit judge`
and the git clean filter, the lines through `perfkit prof` and `record_profile_lines`.
"""

from __future__ import annotations

import copy
import io
import json
import random
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from perfkit.cli import main
from perfkit.errors import UserError
from perfkit.experiment.repo import strip
from perfkit.probe import proflines, recording
from perfkit.samples import MIMETYPE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "hypotheses" / "ledger" / "results" / "20261129-110536.json"  # one hypothesis, 2.5 kB
STRANGE = [None, True, -1, 0, 10**400, 1e308, "", "x" * 5000, "a\n| `b` | **confirmed** |", [], {}, [[[[1]]]], {"a": 1}]


def paths(data, at=()):
    """Every path in a JSON value, containers included."""
    yield at
    if isinstance(data, dict):
        for k, v in data.items():
            yield from paths(v, at + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from paths(v, at + (i,))


def mutated(data, rng: random.Random, count: int) -> list[tuple[str, object]]:
    """`count` copies of `data`, each with one path deleted or given a strange value."""
    every = [p for p in paths(data) if p]
    out = []
    for _ in range(count):
        path = rng.choice(every)
        copied = copy.deepcopy(data)
        node = copied
        for key in path[:-1]:
            node = node[key]
        if rng.random() < 0.25 and isinstance(node, dict):
            del node[path[-1]]
            out.append((f"no {'.'.join(map(str, path))}", copied))
        else:
            value = copy.deepcopy(rng.choice(STRANGE))
            node[path[-1]] = value
            out.append((f"{'.'.join(map(str, path))} = {str(value)[:30]!r}", copied))
    return out


def one_line_or_fine(code: int, err: str, what: str) -> None:
    assert code in (0, 1, 2), what
    assert "Traceback" not in err, what
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (what, err[:500])


def test_a_mutated_results_file_is_read_or_refused_in_one_line(tmp_path, capsys):
    project = tmp_path / "project"
    shutil.copytree(ROOT / "hypotheses", project / "hypotheses", ignore=shutil.ignore_patterns("ledger", "LEDGER.md"))
    shutil.copytree(ROOT / "notebooks", project / "notebooks")
    results = project / "hypotheses" / "ledger" / "results"
    results.mkdir(parents=True)
    data = json.loads(RESULTS.read_text())
    cases = mutated(data, random.Random(24), 60)
    cases.append(("not JSON", "{"))
    cases.append(("nested deep", "[" * 50_000 + "]" * 50_000))
    for what, value in cases:
        target = results / RESULTS.name
        target.write_text(value if isinstance(value, str) else json.dumps(value))
        before = sorted(p.relative_to(project) for p in project.rglob("*"))
        for command in (["ledger", "--check"], ["show", "vectorized-tree-build-3x-at-batch-128"]):
            code = main(["--root", str(project), *command])
            one_line_or_fine(code, capsys.readouterr().err, f"{what}: {command}")
        assert sorted(p.relative_to(project) for p in project.rglob("*")) == before, what  # nothing written


def executed_notebook() -> dict:
    """A notebook as papermill leaves it: parameters, a record displayed, papermill's metadata."""
    record = {"name": "work", "unit": "ms", "samples": [1.0, 1.1, 0.9], "at": {}, "note": None}
    cell = nbformat.v4.new_code_cell("perfkit.record('work', ...)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={MIMETYPE: {"format_version": 1, "records": [record]}})]
    cell.metadata["papermill"] = {"start_time": "2026-01-01T00:00:00.0", "end_time": "2026-01-01T00:00:01.0"}
    params = nbformat.v4.new_code_cell("n = 1", metadata={"tags": ["parameters"]})
    nb = nbformat.v4.new_notebook(cells=[params, cell])
    nb.metadata["papermill"] = {"parameters": {"n": 1}, "input_path": "fixture_probe.ipynb"}
    return json.loads(nbformat.writes(nb))


def test_a_mutated_executed_notebook_is_judged_or_refused_in_one_line(tmp_path, capsys, monkeypatch):
    project = tmp_path / "project"
    shutil.copytree(ROOT / "tests" / "fixtures" / "project", project)
    cases = mutated(executed_notebook(), random.Random(7), 60)
    path = tmp_path / "hand.ipynb"
    for what, nb in cases:
        text = json.dumps(nb)
        path.write_text(text)
        code = main(["--root", str(project), "judge", str(path), "--hypothesis", "fx-share"])
        one_line_or_fine(code, capsys.readouterr().err, f"judge: {what}")
        monkeypatch.setattr(sys, "stdin", io.StringIO(text))  # the clean filter, as git runs it
        out = io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        assert strip.main() == 0, what
        monkeypatch.undo()
        said = capsys.readouterr().err  # the filter's own one line, when it stores the file as it is
        assert "Traceback" not in said and len(said.splitlines()) <= 1, (what, said)
        stored = out.getvalue()
        assert stored == text or "outputs" not in stored or '"outputs": []' in stored, what  # cleaned, or as it was


@pytest.mark.parametrize("seed", range(3))
def test_mutated_profile_lines_are_read_or_skipped_never_a_traceback(seed, monkeypatch):
    rng = random.Random(seed)
    good = "2026-01-01T00:00:00Z host [perfkit-prof pid=12 rank=0] step: n=50 mean=1.20ms p50=1.10ms p99=2.00ms "
    good += "last=1.30ms total=60.000000ms"
    alphabet = "0123456789.=:[]| \t\x1b\x07\n-eEinfnamspk" + "é"
    lines = []
    for _ in range(300):
        chars = list(good)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(chars))
            chars[i : i + rng.randint(0, 3)] = rng.choice(alphabet) * rng.randint(0, 40)
        lines.append("".join(chars))
    text = "\n".join(lines)
    assert isinstance(proflines.table(text), str)
    monkeypatch.setattr(recording, "_emit", lambda records, summary: None)
    try:
        recording.record_profile_lines(text)
    except UserError:
        pass  # no line survived: said in one line
