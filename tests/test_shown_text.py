"""Issue 45, classes 2 and 9: what a probe, a server, a stored file or the environment says reaches the
terminal and LEDGER.md as text (perfkit.text), and the environment variables perfkit reads have their
declared forms (perfkit.environment)."""

from __future__ import annotations

import os
import random
import re
import subprocess

import pytest
from records import result, store

from perfkit import environment
from perfkit.cli import main
from perfkit.errors import UserError
from perfkit.experiment.outputs import ledger
from perfkit.experiment.records import results
from perfkit.machine import devices
from perfkit.paths import Project
from perfkit.text import one_line, printable

CONTROLS = [chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]]
HOSTILE = "gzip\x1f\x8b\x00\x00 body \x1b]0;pwned\x07\x1b[2J \u202egnp.exe ![x](http://e/x.png) [a](b) \udcff end"


@pytest.mark.parametrize(
    "text, shown",
    [
        ("plain ascii: 1.5 ms [1.2, 1.9]", "plain ascii: 1.5 ms [1.2, 1.9]"),
        ("é 中文 ü \t tab\nline", "é 中文 ü \t tab\nline"),  # any script, tab and newline: as written
        ("\x00", "\\x00"),
        ("\x1b[2J", "\\x1b[2J"),
        ("\x7f\x85\x9f", "\\x7f\\x85\\x9f"),
        ("\udcff\udc80", "\\xff\\x80"),  # bytes that were not UTF-8, read with surrogateescape
        ("\ud800", "\\ud800"),  # a lone surrogate from JSON: no file or terminal can encode it
        ("\u202e\u2066\u200f", "\\u202e\\u2066\\u200f"),  # what reorders what a reader sees
    ],
)
def test_printable_writes_out_what_could_steer_a_terminal_and_keeps_the_rest(text, shown):
    assert printable(text) == shown
    assert printable(shown) == shown  # once shown, shown again as it is
    printable(text).encode("utf-8")  # always encodable


def test_printable_of_random_text_leaves_nothing_hidden_and_changes_only_what_is():
    rng = random.Random(45)
    alphabet = [*CONTROLS, "\t", "\n", "a", "é", "\u202e", "\udcfe", "\ud834", " ", "中", "|", "\\"]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        shown = printable(text)
        shown.encode("utf-8")
        assert not any(c in shown for c in CONTROLS) and "\u202e" not in shown
        kept = "".join(c for c in text if c not in CONTROLS and c not in "\u202e\udcfe\ud834")
        assert re.sub(r"\\x[0-9a-f]{2}|\\u[0-9a-f]{4}", "", shown) == kept  # the alphabet has no x or digit
        assert "\n" not in one_line(text) and "\t" not in one_line(text)


def test_the_ledger_stays_a_text_file_for_git_whatever_a_probe_said(tmp_path):
    (tmp_path / "hypotheses").mkdir()
    project = Project(tmp_path)
    store(project, "r1", result("h", "error", None, claim="a claim", reason="a first error"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    path = tmp_path / "hypotheses" / "LEDGER.md"
    path.write_text(ledger.render(results.load_all_results(project)), encoding="utf-8")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "ledger"], check=True)
    every_control = "".join(CONTROLS)
    store(project, "r2", result("h", "error", None, claim=f"claim {HOSTILE}", reason=f"{every_control} {HOSTILE}"))
    path.write_text(ledger.render(results.load_all_results(project)), encoding="utf-8")
    data = path.read_bytes()
    assert not any(b < 0x20 and b != 0x0A for b in data), "a control byte reached LEDGER.md"
    text = data.decode("utf-8")
    assert "\u202e" not in text and "](http" not in text and "![x]" not in text and "\\x1b]0;pwned" in text
    numstat = subprocess.run([*git, "diff", "--numstat"], check=True, capture_output=True, text=True).stdout
    added, removed, name = numstat.split("\t")
    assert added.isdigit() and removed.isdigit() and name.strip() == "hypotheses/LEDGER.md", numstat  # "-": binary


def test_no_escape_sequence_from_a_record_reaches_the_terminal(tmp_path, capfd):
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "hypotheses" / "x.yaml").write_text('id: "bad\\e]0;pwned\\a\\e[2J"\nclaim: c\n', encoding="utf-8")
    assert main(["--root", str(tmp_path), "validate"]) == 2
    out, err = capfd.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err and "\\x1b]0;pwned" in err, err


@pytest.mark.parametrize(
    "value, words",
    [
        ("lab-box-3", None),
        ("ci.runner:42@eu+1", None),
        ("bad\nrow", "'bad\\\\nrow'"),  # a newline would forge a table row
        ("| `x` | confirmed |", "expected an id"),
        ("x" * 129, "(129 characters given)"),
        ("x" * 100_000, "(100000 characters given)"),
        ("caf\udce9", "expected an id"),  # not UTF-8 in the environment (os.environ keeps it as surrogates)
        ("\x1b]0;t\x07", "\\\\x1b"),
    ],
)
def test_the_machine_id_from_the_environment_has_a_declared_form(monkeypatch, value, words):
    monkeypatch.setitem(os.environ, devices.MACHINE_ID, value)  # setitem: setenv cannot hold a surrogate
    if words is None:
        assert devices.machine_id() == value
        return
    with pytest.raises(UserError, match=r"^\$PERFKIT_MACHINE_ID: expected an id") as caught:
        devices.machine_id()
    assert words.replace("\\\\", "\\") in str(caught.value) and len(str(caught.value)) < 200


def test_a_run_with_a_malformed_machine_id_stops_before_it_creates_anything(tmp_path, monkeypatch, capsys):
    (tmp_path / "hypotheses").mkdir()
    monkeypatch.setenv(devices.MACHINE_ID, "two\nlines")
    assert main(["--root", str(tmp_path), "run", "--all", "--quick"]) == 2
    assert "$PERFKIT_MACHINE_ID" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value, got", [("", 50), ("7", 7), ("x", 50), ("0", 50), ("-3", 50), ("1e9", 50), ("٣", 50)])
def test_a_count_from_the_environment_is_a_whole_number_or_the_default_said_once(monkeypatch, capsys, value, got):
    monkeypatch.setenv("PERFKIT_PROFILE_EVERY", value)
    assert environment.count_or_default("PERFKIT_PROFILE_EVERY", 50) == got
    err = capsys.readouterr().err
    assert ("ignoring $PERFKIT_PROFILE_EVERY" in err) == (value not in ("", "7"))
