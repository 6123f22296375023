import json
import os
import sys
import types
from pathlib import Path

import nbformat
import pytest

from perfkit.cli import main
from perfkit.experiment.run import profiling
from perfkit.experiment.run.execute import ensure_kernelspec
from perfkit.experiment.run.options import parse_overrides

FIXTURE_NOTEBOOK = Path(__file__).parent / "fixtures" / "project" / "notebooks" / "fixture_probe.ipynb"


@pytest.mark.parametrize(
    "command, module",
    [("engine", "perfkit.engine.cli"), ("env", "perfkit.machine.snapshot"), ("gpu-check", "perfkit.machine.gpucheck")],
)
def test_delegated_commands_get_their_arguments_untouched(monkeypatch, command, module):
    seen = []
    fake = types.ModuleType(module)
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, module, fake)
    assert main([command, "bench", "--ctx", "32768", "--help"]) == 3
    assert seen == [["bench", "--ctx", "32768", "--help"]]
    fake.main = lambda argv: seen.append((argv, os.environ.get("PERFKIT_ROOT"))) or 3
    monkeypatch.delenv("PERFKIT_ROOT", raising=False)
    assert main(["--root", "/nowhere", command]) == 3
    assert seen[-1] == ([], "/nowhere") and "PERFKIT_ROOT" not in os.environ  # its project, for it alone


def test_user_errors_print_without_traceback(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "validate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfkit: ") and "no hypotheses/ directory" in err and "Traceback" not in err


def test_overrides_are_read_as_yaml():
    assert parse_overrides(["ctx=4096", "scale=0.5", "name=abc", "flag=true"]) == {
        "ctx": 4096,
        "scale": 0.5,
        "name": "abc",
        "flag": True,
    }
    with pytest.raises(Exception, match="NAME=VALUE"):
        parse_overrides(["ctx"])


def test_kernelspec_points_at_this_interpreter(tmp_path):
    ensure_kernelspec(tmp_path)
    spec = json.loads((tmp_path / "kernels" / "perfkit" / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable and "{connection_file}" in spec["argv"]
    assert "--HistoryManager.enabled=False" in spec["argv"]  # probe cells never land in ~/.ipython


def test_profile_cells_are_injected_after_parameters_and_at_the_end(tmp_path):
    out = profiling.profiled_notebook(FIXTURE_NOTEBOOK, tmp_path / "input.ipynb", "/x/torch_trace.json")
    nb = nbformat.read(str(out), as_version=4)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    index = next(i for i, t in enumerate(tags) if "parameters" in t)
    assert (
        tags[index + 1] == [profiling.INJECTED_TAG]
        and "perfkit.probe.profiler.start('/x/torch_trace.json')" in nb.cells[index + 1].source
    )
    assert tags[-1] == [profiling.INJECTED_TAG] and nb.cells[-1].source == "perfkit.probe.profiler.stop()"


def test_import_perfkit_is_cheap_and_public_names_resolve():
    import subprocess

    code = (
        "import sys, perfkit, perfkit.probe.recording\n"
        "assert callable(perfkit.record) and callable(perfkit.record_breakdown) and perfkit.load_hypotheses\n"
        "assert perfkit.Verdict.REFUTED.value == 'refuted'\n"
        "heavy = [m for m in ('torch', 'matplotlib', 'papermill') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`perfkit ... | head`: a closed pipe is exit status 141 and no traceback."""
    import subprocess

    code = "import sys; from perfkit.cli import main; sys.exit(main(['env', '--no-bandwidth']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command prints anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


@pytest.mark.parametrize("payload", ["{}", "[]", '{"cells": 5}', "not json"])
def test_judge_on_json_that_is_no_notebook_is_one_line(tmp_path, capsys, payload):
    (tmp_path / "hypotheses").mkdir()
    path = tmp_path / "hand.ipynb"
    path.write_text(payload)
    assert main(["--root", str(tmp_path), "judge", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a readable notebook" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_version_and_the_roofline_help_name_the_command_people_type(capsys):
    import perfkit

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"perfkit {perfkit.__version__}"
    with pytest.raises(SystemExit) as done:
        main(["roofline", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: perfkit roofline") and "comma-separated" in out


def test_every_command_prints_its_help(capsys):
    """Each sub-command's --help renders (argparse expands %-formats in help text: a stray `%` breaks it)."""
    import argparse

    from perfkit.cli import _parser

    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"run", "check", "bisect", "ledger", "validate"} <= set(commands)
    for sub in commands.values():
        sub.format_help()  # raises on a bad %-format, whatever the command does with --help
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0 and "--budget" in capsys.readouterr().out


def test_root_before_init_sets_up_that_folder_and_two_folders_are_refused(tmp_path, monkeypatch, capsys):
    """`perfkit --root DIR init` set up the current folder, not DIR, and said nothing."""
    import subprocess

    target, elsewhere = tmp_path / "theirs", tmp_path / "here"
    for folder in (target, elsewhere):
        folder.mkdir()
        subprocess.run(["git", "init", "-q", str(folder)], check=True)
    monkeypatch.chdir(elsewhere)
    assert main(["--root", str(target), "init"]) == 0
    assert (target / "hypotheses").is_dir() and not (elsewhere / "hypotheses").exists()
    capsys.readouterr()
    assert main(["--root", str(target), "init", str(elsewhere)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "two different folders" in err, err
    assert not (elsewhere / "hypotheses").exists()


def _git_repo(folder):
    import subprocess

    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    return folder


def test_init_where_it_cannot_write_is_one_line_naming_the_file(tmp_path, capsys):
    """Issue 45: `init` with .gitattributes a folder, or in a folder it cannot write, gave a traceback."""
    import stat

    folder = _git_repo(tmp_path / "attrs")
    (folder / ".gitattributes").mkdir()
    assert main(["--root", str(folder), "init"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".gitattributes: expected a file perfkit init can add lines to" in err, err
    locked = _git_repo(tmp_path / "locked")
    (locked / "hypotheses").mkdir()
    (locked / "hypotheses").chmod(stat.S_IRUSR | stat.S_IXUSR)  # read-only: its files cannot be made
    try:
        if os.access(locked / "hypotheses", os.W_OK):  # root writes anywhere: nothing to refuse here
            pytest.skip("running as root: a read-only folder is writable")
        assert main(["--root", str(locked), "init"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot write hypotheses/" in err and "Permission denied" in err, err
    finally:
        (locked / "hypotheses").chmod(stat.S_IRWXU)


def test_init_keeps_a_notebook_filter_of_the_users_own_and_says_so(tmp_path, capsys):
    """Issue 45: init appended perfkit's notebook filter after the user's (git takes the last line), quietly
    replacing nbstripout."""
    folder = _git_repo(tmp_path / "theirs")
    (folder / ".gitattributes").write_text("*.ipynb filter=nbstripout\n*.ipynb diff=ipynb\n")
    assert main(["--root", str(folder), "init"]) == 0
    attributes = (folder / ".gitattributes").read_text()
    assert "filter=perfkit-notebook" not in attributes and attributes.startswith("*.ipynb filter=nbstripout\n")
    assert "hypotheses/LEDGER.md merge=perfkit-ledger" in attributes  # the ledger's merge driver still
    assert "kept your notebook filter ('*.ipynb filter=nbstripout' in .gitattributes)" in capsys.readouterr().out
    plain = _git_repo(tmp_path / "plain")
    assert main(["--root", str(plain), "init"]) == 0
    assert "notebooks/*.ipynb filter=perfkit-notebook" in (plain / ".gitattributes").read_text()


@pytest.mark.parametrize("name", ["x" * 300, "ok\n", "a" * 61, "Bad", "1x"])
def test_a_probe_name_a_notebook_cannot_carry_is_one_line(tmp_path, capsys, name):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "hypotheses").mkdir()
    assert main(["--root", str(tmp_path), "new", "probe", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use at most 60 lowercase letters" in err and len(err) < 300, err
    assert not list((tmp_path / "notebooks").iterdir())


def test_a_new_probe_says_how_this_project_opens_it(tmp_path, capsys):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "hypotheses").mkdir()
    assert main(["--root", str(tmp_path), "new", "probe", "first"]) == 0
    said = capsys.readouterr().out
    assert "`jupyter lab notebooks/` (kernel perfkit)" in said and "make lab" not in said, said  # no Makefile here
    (tmp_path / "Makefile").write_text("lab:\n\tjupyter lab notebooks/\n")
    assert main(["--root", str(tmp_path), "new", "probe", "second"]) == 0
    assert "open it with `make lab`" in capsys.readouterr().out
