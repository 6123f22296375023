"""A run's options are declared once (perfkit/experiment/run/options.py): the CLI, run() and the manifest agree."""

import argparse
import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from perfkit.cli import _parser
from perfkit.errors import UserError
from perfkit.experiment.run import options
from perfkit.experiment.run.options import RunOptions

FIXTURES = Path(__file__).parent / "fixtures" / "project"
FLAGGED = [f for f in fields(RunOptions) if "flag" in f.metadata]


def parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["run", *argv])


def test_every_declared_option_is_a_flag_of_perfkit_run_with_its_help():
    run = next(a for a in _parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith(" run"))
    by_dest = {a.dest: a for a in run._actions}
    assert len(FLAGGED) >= 10
    for f in FLAGGED:
        assert f.name in by_dest, f.name
        assert by_dest[f.name].help == f.metadata["help"]
        if f.metadata["flag"].startswith("--"):
            assert f.metadata["flag"] in by_dest[f.name].option_strings


def test_flags_not_given_keep_the_declared_defaults():
    chosen = options.from_args(parse("h1"), command="perfkit run h1")
    assert chosen == RunOptions(ids=("h1",), command="perfkit run h1")


def test_every_flag_reaches_its_field():
    args = parse(
        "a", "b", "--quick", "--jobs", "2", "--param", "n=8", "--param", "xs=[1, 2]", "--timeout", "30",
        "--force", "--cluster", "local:2", "--replicates", "4", "--max-replicates", "9",
    )  # fmt: skip
    chosen = options.from_args(args, command="c")
    assert chosen == RunOptions(
        ids=("a", "b"),
        quick=True,
        jobs=2,
        overrides={"n": 8, "xs": [1, 2]},
        timeout_s=30.0,
        force=True,
        cluster="local:2",
        replicates=4,
        max_replicates=9,
        command="c",
    )
    assert set(chosen.recorded()) == {f.name for f in FLAGGED}  # the manifest names every option


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "name the hypotheses to run, or pass --all"),
        ({"ids": ("a",), "all": True}, "not both"),
        ({"all": True, "jobs": -1}, "--jobs must be at least 1, or auto, got -1"),
        ({"all": True, "timeout_s": 0}, r"--timeout \(seconds\) must be a number above 0 to 2.592e\+06, got 0"),
        ({"all": True, "timeout_s": float("nan")}, r"--timeout \(seconds\) must be a number above 0 .*, got nan"),
        ({"all": True, "timeout_s": float("inf")}, r"--timeout \(seconds\) must be .*, got inf"),
        ({"all": True, "timeout_s": 1e300}, r"--timeout \(seconds\) must be .*, got 1e\+300"),
        ({"all": True, "budget_s": -1.0}, r"--budget \(seconds\) must be a number from 0 to 2.592e\+06, got -1"),
        ({"all": True, "budget_s": float("nan")}, r"--budget \(seconds\) must be .*, got nan"),
        ({"all": True, "budget_s": float("1e400")}, r"--budget \(seconds\) must be .*, got inf"),
        ({"all": True, "budget_s": float("-inf")}, r"--budget \(seconds\) must be .*, got -inf"),
        ({"all": True, "replicates": 0}, "--replicates must be from 1"),
        ({"all": True, "replicates": 3, "max_replicates": 1}, "--max-replicates 1 is fewer than --replicates 3"),
        ({"all": True, "profile": "perf"}, "--profile: expected one of torch, nsys"),
        ({"all": True, "profile": "torch", "cluster": "local:1"}, "--profile with --cluster"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(given, message):
    with pytest.raises(UserError, match=message):
        RunOptions(**given).check()


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "-1", "1e9", "NaN", "Infinity"])
@pytest.mark.parametrize("flag", ["--budget", "--timeout"])
def test_a_number_that_means_nothing_is_refused_in_one_line_before_the_run_folder_exists(tmp_path, capsys, flag, text):
    from perfkit.cli import main

    shutil.copytree(FIXTURES, tmp_path / "p")
    code = main(["--root", str(tmp_path / "p"), "run", "fx-cost-confirmed", f"{flag}={text}"])  # -1: not an option
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"perfkit: {flag} (seconds) must be a number") and err.count("\n") == 1, err
    assert not (tmp_path / "p" / "runs").exists()


def test_perfkit_check_never_blames_a_commit_for_perfkit_itself(tmp_path, capsys, monkeypatch):
    """git bisect run reads 1-127 (but 125) as "bad": a refused option (the same at every commit) or a
    crash of perfkit's own exits 128, which stops the bisect; a commit without the project is skipped."""
    from perfkit.cli import main
    from perfkit.experiment.run import runner

    shutil.copytree(FIXTURES, tmp_path / "p")
    root = ["--root", str(tmp_path / "p")]
    assert main([*root, "check", "fx-cost-confirmed", "--budget", "nan"]) == 128
    assert "--budget (seconds) must be" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, 2 elsewhere
        main([*root, "check", "fx-cost-confirmed", "--replicates", "many"])
    assert exited.value.code == 128 and "git bisect run stops" in capsys.readouterr().err

    def crash(*args, **kwargs):
        raise KeyError("a bug of perfkit's")

    monkeypatch.setattr(runner, "run", crash)
    assert main([*root, "check", "fx-cost-confirmed"]) == 128
    err = capsys.readouterr().err
    assert "KeyError" in err and "perfkit itself failed" in err
    monkeypatch.undo()
    (tmp_path / "empty").mkdir()
    assert main(["--root", str(tmp_path / "empty"), "check", "fx-cost-confirmed"]) == 125


def test_the_manifest_records_the_options_the_run_was_given(tmp_path, monkeypatch):
    from records import run, shared_machine

    from perfkit.paths import Project

    shutil.copytree(FIXTURES, tmp_path / "p")
    shared_machine(monkeypatch)
    report = run(Project(tmp_path / "p"), ids=["fx-cost-confirmed"], quick=True, replicates=1, out=lambda s: None)
    manifest = json.loads((tmp_path / "p" / "runs" / report.run_id / "manifest.json").read_text())
    assert manifest["options"]["ids"] == ["fx-cost-confirmed"] and manifest["options"]["quick"] is True
    assert manifest["options"]["replicates"] == 1 and manifest["confidence"] == pytest.approx(0.955)  # may look again
    assert manifest["budget_s"] == 285.0  # --quick's default budget
    assert set(manifest["options"]) == {f.name for f in FLAGGED} | {"hypotheses"}


def test_a_param_value_no_reader_can_hold_is_one_line():
    with pytest.raises(UserError, match=r"--param x: cannot read value '9{80}'\.\.\."):
        options.parse_overrides(["x=" + "9" * 5001])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("local:1000", "local:N"),
        ("local:0", "local:N"),
        ("local:" + "9" * 5000, "local:N"),
        ("local:two", "local:N"),
        ("tcp://host", "expected local:N, local:MxN, slurm:"),
        ("host:99999", "or a scheduler address like tcp://host:8786"),
        ("http://host:8786", "unknown scheme http://"),
        ("tls://host:8786", "tls:// needs Dask's TLS settings"),
    ],
)
def test_a_cluster_address_that_cannot_work_is_one_line_before_anything_starts(spec, message):
    with pytest.raises(UserError, match=message):
        RunOptions(all=True, cluster=spec).check()


def test_a_good_cluster_address_passes():
    for spec in ("local:1", "tcp://127.0.0.1:8786", "10.0.0.5:8786", "scheduler-0.svc:8786", "tcp://[::1]:8786"):
        RunOptions(all=True, cluster=spec).check()


def _subcommand(name: str) -> argparse.ArgumentParser:
    return _parser()._subparsers._group_actions[0].choices[name]


def test_check_and_bisect_take_the_runs_flags_from_its_one_declaration():
    """`perfkit check` measures as `perfkit run ID` does, so it takes every run flag but the selection;
    `perfkit bisect` takes the measuring ones it means, with the help saying what they mean per commit.
    Each flag's spelling, type and choices come from RunOptions, never written again."""
    check = {a.dest: a for a in _subcommand("check")._actions}
    for f in FLAGGED:
        assert (f.name in check) == (f.name not in ("ids", "all")), f.name
    args = _parser().parse_args(
        ["check", "h1", "--quick", "--jobs", "2", "--budget", "30", "--threads", "1", "--param", "n=8"]
    )
    from perfkit.experiment.run.options import from_args

    chosen = from_args(args, command="c", ids=(args.id,), ledger=False)
    assert chosen == RunOptions(
        ids=("h1",), quick=True, jobs=2, budget_s=30.0, threads=1, overrides={"n": 8}, command="c", ledger=False
    )
    bisect = {a.dest: a for a in _subcommand("bisect")._actions}
    declared = {f.name: f for f in FLAGGED}
    for name, help_there in options.BISECT_FLAGS.items():
        assert bisect[name].option_strings == [declared[name].metadata["flag"]]
        assert bisect[name].help == (help_there or declared[name].metadata["help"])
    assert "--budget" not in {s for a in bisect.values() for s in a.option_strings}

    from perfkit.experiment.bisect.measure import BisectOptions

    found = BisectOptions.from_args(_parser().parse_args(["bisect", "h1", "--jobs", "2", "--quick"]))
    assert found == BisectOptions(id="h1", jobs=2, quick=True)  # what was not given keeps its default


def test_diff_fail_on_help_names_every_kind_it_accepts():
    from perfkit.experiment.records.compare import DEFAULT_FAIL_ON, FAIL_ON

    fail_on = next(a for a in _subcommand("diff")._actions if a.dest == "fail_on")
    assert all(kind in fail_on.help for kind in FAIL_ON) and fail_on.default == ",".join(DEFAULT_FAIL_ON)


def test_jobs_auto_is_one_execution_per_core_free_as_the_run_starts(monkeypatch):
    from perfkit.experiment.run import runner
    from perfkit.machine import fitness

    chosen = options.from_args(parse("--all", "--jobs", "auto"), command="c")
    assert chosen.jobs == options.AUTO_JOBS and chosen.at_once() == 1
    chosen.check()  # auto is a value of its own, not a count below 1
    said: list[str] = []
    monkeypatch.setattr(fitness, "cpus", lambda: (0, 1))
    monkeypatch.setattr(fitness, "free_cores", lambda on=None, seconds=0.2: 1)  # another job has one of two
    assert runner._jobs(chosen, said.append).jobs == 1
    assert said == ["--jobs auto: 1 at a time, one per core free as the run starts (1 of 2 CPUs)"]
    monkeypatch.setattr(fitness, "free_cores", lambda on=None, seconds=0.2: 0)  # none free: still one at a time
    assert runner._jobs(chosen, said.append).jobs == 1
    assert runner._jobs(RunOptions(all=True, jobs=3), said.append).jobs == 3  # a count is kept as given
