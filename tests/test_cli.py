import json
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
    assert main(["--root", "/nowhere", command]) == 3


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
