"""The two commands of a bisect over commits: `perfkit check ID` (one commit, for `git bisect run`: its exit
codes are git's) and `perfkit bisect ID` (perfkit's own search: measure.py, its report in report.py).
perfkit/cli.py parses their arguments and calls these."""

from __future__ import annotations

import argparse
import shlex
import sys
import traceback

from perfkit.errors import UserError

BISECT = {"confirmed": 0, "refuted": 1}  # git bisect run: 0 good ("holds"), 1 bad ("broken"), 125 skip
CHECK_CRASHED = 128  # git bisect run aborts on an exit code above 127: perfkit's own crash or usage error


def stopping_git_bisect(parser: argparse.ArgumentParser):
    """`perfkit check`'s usage errors exit CHECK_CRASHED, which stops `git bisect run` (argparse's 2 marks
    the commit bad)."""

    def error(message: str):
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"{parser.prog}: error: {message}; exit {CHECK_CRASHED}: git bisect run stops\n")
        sys.exit(CHECK_CRASHED)

    return error


def check(args, argv) -> int:
    """`perfkit check ID`: the working tree measured against one hypothesis, for `git bisect run`.

        git bisect start --term-old=holds --term-new=broken BAD GOOD
        git bisect run perfkit check ID

    Exit 0 when the claim holds (confirmed), 1 when it does not (refuted), 125 (git bisect's
    "skip") when it cannot say: inconclusive, a busy machine, a probe that failed, or a project,
    record or probe that this commit does not have. 128, which stops `git bisect run`, when perfkit
    was called wrongly (an option it refuses: the same at every commit) or itself failed: a commit
    is never blamed for either. The run's evidence is under runs/; the ledger is never written, so
    the work tree git bisect checks out stays as it was."""
    from perfkit.experiment.run import options as run_options
    from perfkit.experiment.run import runner
    from perfkit.paths import find_project

    def stop(why: str) -> int:
        print(f"perfkit check: {why}; exit {CHECK_CRASHED}: git bisect run stops", file=sys.stderr)
        return CHECK_CRASHED

    try:
        options = run_options.from_args(args, command="perfkit " + shlex.join(argv), ids=(args.id,), ledger=False)
        options.check()
    except UserError as exc:
        return stop(str(exc))
    try:
        report = runner.run(find_project(args.root), options, out=lambda line: print(line, file=sys.stderr))
    except UserError as exc:
        print(f"perfkit check: cannot measure {args.id} here ({exc}); 125: skip this commit", file=sys.stderr)
        return 125
    except Exception:  # perfkit's own failure says nothing of the commit
        traceback.print_exc()
        return stop("perfkit itself failed (above)")
    (result,) = report.results.hypotheses
    code = BISECT.get(result.verdict, 125)
    words = {0: "it holds", 1: "it does not hold"}.get(code, f"undecided ({result.reason or result.verdict})")
    print(f"{args.id}: {result.verdict}: {words}; exit {code}")
    return code


def bisect(project, args) -> int:
    """`perfkit bisect ID`: the table, culprits and plot; progress on stderr so --json and --md stay clean."""
    from perfkit.experiment.bisect import measure, report
    from perfkit.experiment.records.plots import write_plot
    from perfkit.files import dumps

    options = measure.BisectOptions.from_args(args)

    def say(line: str) -> None:  # one write a line: commits measured at once speak from threads of their own
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    found = measure.run(project, options, say=say)
    write_plot(found.folder / "bisect.png", report.plot(found))
    if args.json:
        print(dumps({**found.to_json(), "folder": project.relative(found.folder)}), end="")
    else:
        print(report.markdown(found) if args.md else report.text(found), end="")
    return found.exit_code()
