"""The README tutorial, followed as written: scaffold a probe, save the hypothesis, get a verdict."""

import re
from pathlib import Path

from perfkit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def tutorial_hypothesis() -> tuple[str, str]:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- tutorial-hypothesis -->\n```yaml\n(.*?)```", readme, re.S)
    assert match, "README lost its tutorial hypothesis block"
    text = match.group(1)
    return re.search(r"^id: (\S+)$", text, re.M).group(1), text


def test_readme_tutorial_gives_a_verdict(tmp_path, capsys):
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "notebooks").mkdir()
    root = ["--root", str(tmp_path)]
    assert main(root + ["new", "probe", "sort_speed"]) == 0
    hid, text = tutorial_hypothesis()
    (tmp_path / "hypotheses" / f"{hid}.yaml").write_text(text)
    assert main(root + ["validate"]) == 0
    code = main(root + ["run", hid])
    out = capsys.readouterr().out
    assert code == 0, out
    verdict_line = next(line for line in out.splitlines() if line.startswith(hid))
    assert re.search(r"\b(confirmed|refuted)\b", verdict_line), verdict_line
    assert "measured" in verdict_line and "ms" in verdict_line
    ledger = (tmp_path / "hypotheses" / "LEDGER.md").read_text()
    assert f"| [`{hid}`](#{hid}) |" in ledger
    assert (tmp_path / "hypotheses" / "ledger" / "plots" / f"{hid}.png").is_file()
    assert main(root + ["show", hid]) == 0
    assert main(root + ["new", "probe", "sort_speed"]) == 2  # never overwrites
