"""The documentation: the site builds with every warning an error, the reference pages are what the code
says, and every fenced example of README.md and docs/ is run or checked by a named test, or says why not."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfkit import reference
from perfkit.experiment.records import config, hypothesis, probe
from perfkit.experiment.records.kinds import KINDS
from perfkit.experiment.records.kinds.base import COMMON_KEYS
from perfkit.experiment.run import scaffold

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^( *)```")
#: the line before a fenced block: `<!-- example[ NAME]: tests/test_X.py WHAT IT DOES -->` or
#: `<!-- example[ NAME]: exempt: WHY -->`
MARKER = re.compile(r"^\s*<!-- example(?: [a-z-]+)?: (?:(exempt): (.+)|(tests/test_\w+\.py) (.+)) -->$")


def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, the last non-blank line before the fence, the block's text) for each fenced block."""
    blocks, inside, before, start, indent, body = [], False, "", 0, "", []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            if inside:
                blocks.append((start, before, "\n".join(body)))
            else:
                start, indent, body = number, fence.group(1), []
            inside = not inside
        elif inside:
            body.append(line.removeprefix(indent))  # a block inside a list item is indented with it
        elif line.strip():
            before = line
    assert not inside, f"{path}: a fence opened at line {start} is never closed"
    return blocks


def block(path: Path, says: str) -> str:
    """The block whose marker holds `says`."""
    found = [text for _, before, text in fenced_blocks(path) if says in before]
    assert len(found) == 1, f"{path.relative_to(ROOT)}: {len(found)} blocks marked {says!r}"
    return found[0]


def test_every_fenced_example_is_run_or_checked_by_a_named_test_or_says_why_not():
    seen = 0
    for path in PAGES:
        if path.parent.name == "reference":
            continue  # generated, and checked against the code below
        for line, before, _ in fenced_blocks(path):
            seen += 1
            where = f"{path.relative_to(ROOT)}:{line}"
            marker = MARKER.match(before)
            assert marker, f"{where}: a fenced block needs `<!-- example: tests/test_X.py ... -->` or `exempt: why`"
            exempt, why, test, what = marker.groups()
            if exempt:
                assert len(why.split()) >= 4, f"{where}: say why the example is not run"
                continue
            assert (ROOT / test).is_file(), f"{where}: {test} does not exist"
            assert path.name in (ROOT / test).read_text(), f"{where}: {test} never names {path.name}"
    assert seen >= 15  # the parser found the blocks (README's two, the tutorial's four, ...)


def test_the_readme_record_is_the_shipped_one_with_its_rationale_elided():
    shown = yaml.safe_load(block(ROOT / "README.md", "tests/test_docs.py checks this block is the shipped record"))
    shipped = yaml.safe_load((ROOT / "hypotheses" / f"{shown['id']}.yaml").read_text())
    assert shown["rationale"].strip() == "..."
    assert {**shipped, "rationale": "..."} == {**shown, "rationale": "..."}
    found = hypothesis.load_hypotheses(hypothesis.find_project(str(ROOT)))
    assert shown["id"] in {h.id for h in found}  # and it validates, as every shipped record must


def _code(lines: str) -> list[str]:
    """The statements of some Python, without its comments."""
    return [ast.unparse(node) for node in ast.parse(lines).body]


def test_the_tutorial_measurement_is_the_scaffolded_probes_own():
    shown = block(ROOT / "docs" / "tutorial.md", "these lines are the scaffolded probe's own")
    measured = scaffold._MEASURE.format(metric="sort_speed")
    assert _code(shown) == _code(measured)


def test_every_path_the_layout_names_exists():
    listed = block(ROOT / "docs" / "engine.md", "every path in it exists")
    paths = [line.split()[0] for line in listed.splitlines() if line and not line.startswith(" ")]
    assert len(paths) >= 10, paths
    for path in paths:
        if "<" in path:  # runs/<run-id>/: a pattern
            path = path.split("<")[0]
        matches = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
        assert matches and all(m.exists() for m in matches), path


def test_the_reference_pages_are_what_the_code_says(tmp_path, capsys):
    assert reference.main(["--check", str(ROOT / "docs" / "reference")]) == 0, capsys.readouterr().err
    copy = tmp_path / "reference"
    shutil.copytree(ROOT / "docs" / "reference", copy)
    page = copy / "records.md"
    page.write_text(page.read_text().replace("| `claim` | yes |", "| `claim` | no |"))
    assert reference.main(["--check", str(copy)]) == 1
    assert str(page) in capsys.readouterr().err  # the page that drifted is named
    assert reference.main([str(copy)]) == 0 and reference.main(["--check", str(copy)]) == 0


def test_the_reference_covers_every_command_and_every_record_and_settings_key():
    commands = (ROOT / "docs" / "reference" / "commands.md").read_text()
    headings = set(re.findall(r"^## (perfkit.*)$", commands, re.M))
    assert {f"perfkit {' '.join(argv)}" for argv in reference.commands()} | {"perfkit"} == headings
    assert {"perfkit run", "perfkit init", "perfkit engine serve", "perfkit bisect"} <= headings
    assert "--quick" in commands and "--ci {github}" in commands  # the delegated commands' own options too
    records = (ROOT / "docs" / "reference" / "records.md").read_text()
    declared = [hypothesis.TOP_KEYS, probe.PROBE_KEYS, probe.SWEEP_KEYS, COMMON_KEYS]
    for keys in [*declared, *(cls.KEYS for cls in KINDS.values())]:
        for key, says in keys.items():
            assert f"| `{key}` | {'yes' if says.required else 'no'} |" in records, key
    assert all(f"### `kind: {kind}`" in records for kind in KINDS)
    settings = (ROOT / "docs" / "reference" / "settings.md").read_text()
    assert all(f"| `{key}` |" in settings for key in [*config.KEYS, *config.SLURM_KEYS, "foreign_share"])


def test_every_versioned_file_perfkit_writes_is_in_the_formats_page():
    declared = set()
    for path in sorted((ROOT / "perfkit").rglob("*.py")):
        for name in re.findall(r"^([A-Z_]*VERSION) = \d+", path.read_text(encoding="utf-8"), re.M):
            declared.add((path.relative_to(ROOT / "perfkit").as_posix(), name))
    listed = {(module, name) for _, module, name, _ in reference.FILES}
    assert declared == listed, declared ^ listed
    page = (ROOT / "docs" / "reference" / "formats.md").read_text()
    results = reference.version_of("experiment/records/results.py", "FORMAT_VERSION")
    assert f"Version {results}, written by `perfkit/experiment/records/results.py`" in page
    assert "12: an execution says the foreign CPU `load`" in page  # the history, read from the source


def test_the_site_builds_with_every_warning_an_error(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(entries):
        for entry in entries:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    for page in pages(nav):
        assert (site / page.replace(".md", ".html")).is_file(), page
    home = (site / "index.html").read_text()
    assert 'href="tutorial.html"' in home and 'src="ledger/plots/mask-build-200ms.png"' in home  # README, rewired
    assert (site / "ledger" / "plots" / "mask-build-200ms.png").is_file()
    ledger = (site / "ledger.html").read_text()
    assert ledger.count('src="ledger/plots/') >= 20  # every hypothesis's plot, copied beside the page
    executed = (site / "probe-example.html").read_text()  # a probe notebook with the outputs it ran with
    assert executed.count("data:image/png;base64,") == 1 and "perfkit record " in executed
    probe = (site / "reference" / "probe.html").read_text()
    assert "perfkit.probe.timing.bench" in probe and "perfkit.probe.recording.record" in probe  # from docstrings
