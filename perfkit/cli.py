"""The `perfkit` command: validate, run, ledger, show, new, and the engine/env/gpu-check/roofline entry points.

User mistakes (perfkit.errors.UserError) print as one message without a traceback and exit 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import signal
import sys
import threading

import perfkit
from perfkit.errors import UserError
from perfkit.experiment.bisect import commands
from perfkit.text import Shown

# jsonschema (imported by nbformat, by papermill) compiles a grammar for the "iri" format when the
# rfc3987-syntax package is installed (JupyterLab's extras bring it): 1.6 s at the start of every
# command, for a format no notebook schema uses. perfkit's own processes do without it.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

NEEDS_TORCH = (
    "this needs torch (the bundled engine, its kernels and the machine's measured rates run on it), which "
    "`pip install perfkit` leaves to you so that it never replaces your own: pip install 'perfkit[engine]' "
    "(from PyPI on Linux that is the CUDA build, several GB; the CPU wheel: "
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)"
)

NEEDS_MODULE = (
    "this needs `{}`, which is not installed here (`pip install 'perfkit[review]'` alone brings only what validate, "
    "ledger, diff and report need): pip install perfkit"
)

# subcommand -> module whose main(argv) parses its own arguments (imported on use: `perfkit validate` stays fast)
_DELEGATED = {
    "engine": "perfkit.engine.cli",
    "env": "perfkit.machine.snapshot",
    "gpu-check": "perfkit.machine.gpucheck",
    "roofline": "perfkit.machine.roofline",
    "overhead": "perfkit.experiment.run.costs",
    "prof": "perfkit.probe.proflines",
    "init": "perfkit.experiment.repo.init",
    "kernel": "perfkit.experiment.run.kernel",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfkit", description="Performance hypotheses, probes, verdicts and a ledger."
    )
    parser.add_argument("--root", help="project directory (default: $PERFKIT_ROOT or the nearest one above cwd)")
    parser.add_argument("--version", action="version", version=f"perfkit {perfkit.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    val = sub.add_parser("validate", help="check every hypothesis record; exit 2 on any error; writes nothing")
    val.add_argument("--json", action="store_true", help="the records or the errors as JSON")

    from perfkit.experiment.run import options

    run = sub.add_parser("run", help="execute probes, judge hypotheses, write results, plots and the ledger")
    options.add_arguments(run)
    run.add_argument("--json", action="store_true", help="progress to stderr; the run's results as JSON on stdout")
    run.add_argument("--junit", metavar="FILE", help="also write the verdicts as JUnit XML (a test case each) to FILE")

    dif = sub.add_parser("diff", help="what changed in the verdicts and measurements since BASE (a PR's view)")
    dif.add_argument(
        "base", nargs="?", help="a git revision or a folder of results (default: the merge base with main)"
    )
    dif.add_argument("--md", action="store_true", help="markdown for a pull-request comment, with plot thumbnails")
    dif.add_argument("--json", action="store_true", help="the changes as JSON")
    from perfkit.experiment.records.compare import DEFAULT_FAIL_ON, FAIL_ON

    dif.add_argument(
        "--fail-on",
        default=",".join(DEFAULT_FAIL_ON),
        metavar="KINDS",
        help=f"exit 1 when any of these is present: {', '.join(FAIL_ON)}, or none (default: "
        f"{','.join(DEFAULT_FAIL_ON)}; refuted and error: a flip or new verdict to it)",
    )
    dif.add_argument(
        "--plots-url", default="hypotheses/ledger/", metavar="URL", help="prefix of the plot paths in --md"
    )
    dif.add_argument(
        "--base-plots-url",
        default=None,
        metavar="URL",
        help="prefix of the base's plot paths in --md, to show before and after side by side "
        "(e.g. https://github.com/OWNER/REPO/raw/BASE_SHA/hypotheses/ledger/)",
    )
    dif.add_argument("--junit", metavar="FILE", help="also write the changes as JUnit XML (a test case each) to FILE")
    _review_commands(sub, options)
    return parser


def _review_commands(sub, options) -> None:
    """The commands that read what runs stored, and `check` and `bisect`, which measure as a run does
    (their flags are `perfkit run`'s, declared once in options.py)."""
    jud = sub.add_parser("judge", help="verdicts from a probe notebook executed by hand (printed, never stored)")
    jud.add_argument("notebook", help="an executed notebook (papermill, nbconvert or a saved JupyterLab session)")
    jud.add_argument("--hypothesis", action="append", default=[], metavar="ID", help="judge against this one")

    rep = sub.add_parser("report", help="a static HTML page of the ledger: table, plots, history, changes")
    rep.add_argument("--out", default=None, metavar="DIR", help="where to write index.html (default runs/report)")
    rep.add_argument("--base", default="auto", help="compare against this git revision or results folder")
    rep.add_argument(
        "--single-file", action="store_true", help="the plots inside index.html: one file to attach or mail"
    )

    led = sub.add_parser("ledger", help="regenerate hypotheses/LEDGER.md from the stored results")
    led.add_argument("--check", action="store_true", help="exit 1 when the ledger or a verdict is out of date")

    show = sub.add_parser("show", help="one hypothesis: record, evidence and history")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="the record, the standing result and the history as JSON")

    his = sub.add_parser(
        "history", help="one hypothesis's measurements over runs, per machine kind, with change points"
    )
    his.add_argument("id")
    his.add_argument("--plot", default=None, metavar="FILE",
                     help="where to draw it (a .png; default runs/history/ID.png)")  # fmt: skip

    chg = sub.add_parser("changes", help="the change points across the ledger, the most severe first, one line each")
    chg.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only changes first seen at or after this run id, UTC date or time, commit or git revision",
    )
    chg.add_argument("--check", action="store_true", help="exit 1 when a confirmed change is listed (for CI)")

    chk = sub.add_parser(
        "check",
        help="measure the working tree against one hypothesis for `git bisect run`: exit 0 it holds, "
        "1 it does not, 125 undecided (skip); nothing is written to the ledger",
    )
    chk.add_argument("id", help="the hypothesis")
    options.add_arguments(chk, leave_out=("ids", "all"))  # it measures as `perfkit run ID` would
    chk.error = commands.stopping_git_bisect(chk)  # a usage error is the same at every commit: never "bad" (2)

    bis = sub.add_parser(
        "bisect",
        help="find the commit(s) where a hypothesis's measurement changed, each commit measured in a git "
        "worktree of its own; exit 0 found, 1 no change, 3 undecided",
    )
    bis.add_argument("id", help="the hypothesis")
    bis.add_argument("--good", default=None, help="where it held (default: the ledger's last run that confirmed it)")
    bis.add_argument("--bad", default="HEAD", help="where it no longer holds (default: HEAD)")
    flags = options.BISECT_FLAGS
    options.add_arguments(bis, only=tuple(flags), helps={k: v for k, v in flags.items() if v})
    bis.add_argument(
        "--probe-from",
        choices=["tree", "commit"],
        default="tree",
        help="the record and probe as they are now (tree, default) or each commit's own (commit)",
    )
    shown = bis.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the bisect's record as JSON")
    shown.add_argument("--md", action="store_true", help="print markdown for a pull-request comment")

    new = sub.add_parser("new", help="scaffold a working probe notebook to edit")
    new.add_argument("what", choices=["probe"])
    new.add_argument("name", help="notebook name: lowercase letters, digits, underscores")

    for name, module in _DELEGATED.items():
        sub.add_parser(name, help=f"see `perfkit {name} --help` ({module})", add_help=False)


def _delegated(argv: list[str]) -> tuple[str, list[str], str | None] | None:
    """(command, its arguments, the --root given before it) when argv names a delegated command, which
    parses its own arguments."""
    i, root = 0, None
    while i < len(argv):
        word = argv[i]
        if word == "--root":
            root = argv[i + 1] if i + 1 < len(argv) else None
            i += 2
        elif word.startswith("--root="):
            root = word.partition("=")[2]
            i += 1
        else:
            return (word, argv[i + 1 :], root) if word in _DELEGATED else None
    return None


def _delegate(name: str, rest: list[str], root: str | None) -> int:
    """A delegated command, with `--root DIR` meaning for it what it means for every command: the project
    is DIR (`init`'s folder; for the rest, $PERFKIT_ROOT)."""
    if root is not None and name == "init":
        rest = ["--root", root, *rest]
    before = os.environ.get("PERFKIT_ROOT")
    if root is not None and name != "init":
        os.environ["PERFKIT_ROOT"] = root
    try:
        return int(importlib.import_module(_DELEGATED[name]).main(rest) or 0)
    finally:
        if before is None:
            os.environ.pop("PERFKIT_ROOT", None)
        else:
            os.environ["PERFKIT_ROOT"] = before


def _validate(project, args) -> int:
    from perfkit.experiment.records.hypothesis import ValidationFailed, load_hypotheses

    try:
        hypotheses = load_hypotheses(project)
    except ValidationFailed as exc:
        if not args.json:
            raise
        errors = [{"path": e.path, "line": e.line, "field": e.field, "message": e.message} for e in exc.errors]
        print(json.dumps({"valid": False, "errors": errors}, indent=1))
        return 2
    if args.json:
        print(json.dumps({"valid": True, "hypotheses": [h.id for h in hypotheses]}, indent=1))
    else:
        print(f"{len(hypotheses)} hypotheses valid")
    return 0


def _junit_path(path: str | None):
    """`--junit FILE`, checked before the command measures or compares anything."""
    from perfkit.files import output_file

    return output_file(path, "--junit") if path else None


def _write_junit(path, xml: str) -> None:
    from perfkit.files import write_atomic

    if path is not None:
        write_atomic(path, xml)


def _diff(project, args) -> int:
    from perfkit.experiment.outputs import diff, junit
    from perfkit.experiment.records import compare

    fail_on = compare.parse_fail_on(args.fail_on)
    junit_path = _junit_path(args.junit)
    name, changes = compare.diff(project, args.base)
    if args.json:
        print(json.dumps({"base": name, "changes": [c.to_json() for c in changes]}, indent=1))
    elif args.md:
        sys.stdout.write(diff.markdown(changes, name, plots_url=args.plots_url, base_plots_url=args.base_plots_url))
    else:
        sys.stdout.write(diff.text(changes, name))
    _write_junit(junit_path, junit.diff_junit(changes, name, fail_on))
    bad = compare.failing(changes, fail_on)
    if bad and not (args.json or args.md):
        print(f"failing: {', '.join(f'{c.id} ({c.kind})' for c in bad)} (--fail-on {args.fail_on})")
    return 1 if bad else 0


def _judge(project, args) -> int:
    from pathlib import Path

    from perfkit.experiment.run.manual import judge_notebook

    name, judged, machine = judge_notebook(project, Path(args.notebook), args.hypothesis)
    print(
        f"judged from {args.notebook} (probe {name}), executed by hand: not a run, one process, not stored; {machine}"
    )
    for item in judged:
        j = item.judgement
        print(f"{item.hypothesis.id:<32} {j.verdict.value:<13} {j.line()}")
        for warning in j.warnings:
            print(f"{'':<32}   warning: {warning}")
    return 1 if any(item.judgement.verdict.value == "error" for item in judged) else 0


def _run(project, args, argv) -> int:
    from perfkit.experiment.outputs import junit
    from perfkit.experiment.run import options, runner

    chosen = options.from_args(args, command="perfkit " + shlex.join(argv))
    junit_path = _junit_path(args.junit)
    out = (lambda line: print(line, file=sys.stderr)) if args.json else print
    report = runner.run(project, chosen, out=out)
    _write_junit(junit_path, junit.run_junit(report.results))
    if args.json:
        from perfkit.experiment.records.results import FORMAT_VERSION

        payload = report.results.to_json() | {"exit_code": report.exit_code, "format_version": FORMAT_VERSION}
        print(json.dumps(payload, indent=1))  # the results file's own shape and version, and the exit code
    return report.exit_code


def _ledger(project, args) -> int:
    from perfkit.experiment.run import commit

    if args.check:
        problems, warnings = commit.check(project)
        for w in warnings:
            print(f"warning: {w}")
        for p in problems:
            print(p)
        if problems:
            return 1
        print(f"{project.relative(project.ledger_path)} is up to date")
        return 0
    for run_id in commit.rewrite(project):
        print(f"finished committing run {run_id}, which was stopped part-way")
    print(f"wrote {project.relative(project.ledger_path)}")
    return 0


def _report(project, args) -> int:
    from pathlib import Path

    from perfkit.experiment.outputs import report
    from perfkit.experiment.records.results import load_all_results
    from perfkit.files import output_file

    out = Path(args.out) if args.out else project.runs_dir / "report"
    if out.exists() and not out.is_dir():
        raise UserError(f"report --out {out}: a file is there; name a folder (it is created)")
    linked = [p for p in (out / "plots", out / "index.html") if p.is_symlink()]
    linked += [p for p in (out / "plots").glob("*") if p.is_symlink()] if (out / "plots").is_dir() else []
    if linked:  # the report would write through it, to wherever it points
        raise UserError(f"report --out {out}: {linked[0]} is a symbolic link; the report writes only its own files")
    if out.is_dir():  # the page itself: a regular file or none, as every file a user names for output
        output_file(out / "index.html", "report --out")
    results = load_all_results(project)
    try:
        page = report.write(project, out, results, base=args.base, single_file=args.single_file)
    except OSError as exc:
        raise UserError(f"report --out {out}: cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    print(f"wrote {page}")
    return 0


def _history(project, args) -> int:
    from pathlib import Path

    from perfkit.experiment.outputs import changes
    from perfkit.experiment.records.results import load_all_results
    from perfkit.files import output_file

    results = load_all_results(project)
    sys.stdout.write(changes.history_text(project, results, args.id))
    out = Path(args.plot) if args.plot else project.runs_dir / "history" / f"{args.id}.png"
    if args.plot is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    output_file(out, "history --plot")
    print(f"drawn: {project.relative(changes.write_history_plot(project, results, args.id, out))}")
    return 0


def _changes(project, args) -> int:
    from perfkit.experiment.outputs import changes
    from perfkit.experiment.records.results import load_all_results
    from perfkit.experiment.records.series import since_run

    results = load_all_results(project)
    since = None
    if args.since is not None:
        since = since_run(results, args.since)
        if since is None:  # a branch, a tag, HEAD~20: the first run at the commit it names, else its time
            from perfkit.paths import git_try

            named = git_try(project.root, "show", "-s", "--format=%H %cI", f"{args.since}^{{commit}}", "--")
            if named is not None and named.returncode == 0 and named.stdout.strip():
                sha, _, when = named.stdout.strip().partition(" ")
                since = since_run(results, sha) or since_run(results, when)
        if since is None:
            raise UserError(
                f"--since {args.since!r}: expected a run id, a UTC date or time, a commit or a git revision"
            )
    text, confirmed = changes.changes_text(results, since)
    sys.stdout.write(text)
    return 1 if args.check and confirmed else 0


def _show(project, args) -> int:
    from perfkit.experiment.outputs import show

    if args.json:
        print(json.dumps(show.describe_json(project, args.id), indent=1, ensure_ascii=False))
    else:
        sys.stdout.write(show.describe(project, args.id))
    return 0


def _main(argv: list[str]) -> int:
    delegated = _delegated(argv)
    if delegated is not None:
        return _delegate(*delegated)
    args = _parser().parse_args(argv)
    from perfkit.paths import find_project

    if args.command == "check":  # for git bisect run: even finding the project is the commit's to fail
        return commands.check(args, argv)
    project = find_project(args.root)
    if args.command == "validate":
        return _validate(project, args)
    if args.command == "run":
        return _run(project, args, argv)
    if args.command == "ledger":
        return _ledger(project, args)
    if args.command == "diff":
        return _diff(project, args)
    if args.command == "judge":
        return _judge(project, args)
    if args.command == "report":
        return _report(project, args)
    if args.command == "show":
        return _show(project, args)
    if args.command == "history":
        return _history(project, args)
    if args.command == "changes":
        return _changes(project, args)
    if args.command == "bisect":
        return commands.bisect(project, args)
    if args.command == "new":
        from perfkit.experiment.run.scaffold import new_probe

        print(
            f"wrote {new_probe(project, args.name)}: open it with {_lab(project)}, replace work(), "
            "then name it in a hypothesis"
        )
        return 0
    raise AssertionError(f"unhandled command {args.command}")


def _lab(project) -> str:
    """How this project opens a notebook in JupyterLab: its Makefile's `lab` target, or `jupyter lab` itself."""
    import importlib.util
    import re

    makefile = project.root / "Makefile"
    if makefile.is_file() and re.search(r"^lab:", makefile.read_text(encoding="utf-8", errors="replace"), re.M):
        return "`make lab`"
    notebooks = project.relative(project.notebooks_dir)
    if importlib.util.find_spec("jupyterlab") is None:
        return f"JupyterLab (`pip install jupyterlab`, then `jupyter lab {notebooks}/`, kernel perfkit)"
    return f"`jupyter lab {notebooks}/` (kernel perfkit)"


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run the way Ctrl-C does: probes killed, evidence kept


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Shown(sys.stdout), Shown(sys.stderr)  # no control byte from outside reaches the terminal
    try:
        return _main(argv)
    except UserError as exc:
        from perfkit.errors import RecordError
        from perfkit.experiment.records.hypothesis import ValidationFailed

        # record errors are already `path:line: field: message`, one per line
        plain = isinstance(exc, (RecordError, ValidationFailed))
        print(str(exc) if plain else f"perfkit: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an installation with less than this command needs (an extra left out)
        top = (exc.name or "").partition(".")[0]
        if top in ("", "perfkit"):
            raise
        print(f"perfkit: {NEEDS_TORCH if top == 'torch' else NEEDS_MODULE.format(top)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: say what was kept, no traceback
        print(f"perfkit: {exc}" if str(exc) else "perfkit: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT
    except BrokenPipeError:  # `perfkit ... | head`: the reader left; stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # 128 + SIGPIPE
    finally:
        sys.stdout, sys.stderr = streams
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
