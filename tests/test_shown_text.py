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


@pytest.mark.parametrize(
    "value, why",
    [
        ("bad\nfolder", "control characters"),
        ("x" * (environment.PATH_MAX + 1), f"more than {environment.PATH_MAX}"),
        ("caf\udce9", "not UTF-8"),
        ("\x1b[2Jcache", "control characters"),
    ],
)
def test_a_folder_from_the_environment_has_a_declared_form(monkeypatch, capsys, value, why):
    monkeypatch.setitem(os.environ, "PERFKIT_CACHE_DIR", value)
    with pytest.raises(UserError, match=r"^\$PERFKIT_CACHE_DIR: expected a folder, got '") as caught:
        environment.folder("PERFKIT_CACHE_DIR")
    assert why in str(caught.value) and len(str(caught.value)) < 200 and "\x1b" not in str(caught.value)
    assert environment.folder("PERFKIT_CACHE_DIR", strict=False) is None  # a kernel perfkit does not own
    assert "ignoring $PERFKIT_CACHE_DIR=" in capsys.readouterr().err


def test_a_folder_is_a_directory_or_absent_and_a_file_there_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "not yet"))
    assert environment.folder("PERFKIT_CACHE_DIR") == tmp_path / "not yet"
    monkeypatch.setenv("PERFKIT_CACHE_DIR", f"  {tmp_path}  ")
    assert environment.folder("PERFKIT_CACHE_DIR") == tmp_path
    monkeypatch.setenv("PERFKIT_CACHE_DIR", "")
    assert environment.folder("PERFKIT_CACHE_DIR") is None
    (tmp_path / "a file").write_text("mine")
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "a file"))
    with pytest.raises(UserError, match="it is not a directory"):
        environment.folder("PERFKIT_CACHE_DIR")
    assert (tmp_path / "a file").read_text() == "mine"


def test_the_readers_of_folders_and_counts_take_the_declared_forms(tmp_path, monkeypatch, capsys):
    from perfkit.machine import bandwidth
    from perfkit.paths import find_project

    (tmp_path / "f").write_text("")
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "f"))
    with pytest.raises(UserError, match=r"\$PERFKIT_CACHE_DIR"):
        bandwidth.cache_dir()
    monkeypatch.setenv("PERFKIT_ROOT", "two\nlines")
    with pytest.raises(UserError, match=r"\$PERFKIT_ROOT: expected a folder"):
        find_project()
    assert main(["validate"]) == 2  # the command says so in one line, no traceback
    err = capsys.readouterr().err
    assert "$PERFKIT_ROOT: expected a folder, got 'two\\nlines'" in err and "Traceback" not in err, err
    monkeypatch.setenv("PERFKIT_OUTPUT_CAP", "12k")
    assert environment.count_or_none("PERFKIT_OUTPUT_CAP") is None
    assert "ignoring $PERFKIT_OUTPUT_CAP='12k'" in capsys.readouterr().err
    monkeypatch.setenv("PERFKIT_OUTPUT_CAP", "4096")
    assert environment.count_or_none("PERFKIT_OUTPUT_CAP") == 4096
    monkeypatch.delenv("PERFKIT_OUTPUT_CAP")
    assert environment.count_or_none("PERFKIT_OUTPUT_CAP") is None
