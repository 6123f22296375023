"""The tutorial (docs/tutorial.md), followed as written: scaffold a probe, save the hypothesis, get a verdict."""

import re
from pathlib import Path

from perfkit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def tutorial_hypothesis() -> tuple[str, str]:
    readme = (ROOT / "docs" / "tutorial.md").read_text()
    match = re.search(r"<!-- example tutorial-hypothesis[^>]*-->\n```yaml\n(.*?)```", readme, re.S)
    assert match, "docs/tutorial.md lost its tutorial hypothesis block"
    text = match.group(1)
    return re.search(r"^id: (\S+)$", text, re.M).group(1), text


def tutorial_steps() -> list[list[str]]:
    """The commands of the tutorial's blocks marked `tutorial-steps`, in order, as argv after `perfkit`."""
    text = (ROOT / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"<!-- example tutorial-steps[^>]*-->\n```sh\n(.*?)```", text, re.S)
    assert len(blocks) == 2, "docs/tutorial.md lost a block of its steps"
    steps = [line.split() for b in blocks for line in b.splitlines() if line.strip()]
    assert all(s[0] == ".venv/bin/perfkit" for s in steps), steps
    return [s[1:] for s in steps]


def test_readme_tutorial_gives_a_verdict(tmp_path, capsys):
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "notebooks").mkdir()
    root = ["--root", str(tmp_path)]
    scaffold, *check_run_show = tutorial_steps()
    assert scaffold == ["new", "probe", "sort_speed"]
    assert main(root + scaffold) == 0
    hid, text = tutorial_hypothesis()
    (tmp_path / "hypotheses" / f"{hid}.yaml").write_text(text)
    assert [argv[0] for argv in check_run_show] == ["validate", "run", "show"]
    validate, run, show = check_run_show
    assert main(root + validate) == 0
    code = main(root + run)
    out = capsys.readouterr().out
    assert code == 0, out
    verdict_line = next(line for line in out.splitlines() if line.startswith(hid))
    assert re.search(r"\b(confirmed|refuted)\b", verdict_line), verdict_line
    assert "measured" in verdict_line and "ms" in verdict_line
    ledger = (tmp_path / "hypotheses" / "LEDGER.md").read_text()
    assert f"| [`{hid}`](#{hid}) |" in ledger
    assert (tmp_path / "hypotheses" / "ledger" / "plots" / f"{hid}.png").is_file()
    assert main(root + show) == 0
    assert main(root + scaffold) == 2  # never overwrites
