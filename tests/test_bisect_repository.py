"""`perfkit bisect` in a user's repository, from a fresh clone, with perfkit pip-installed (not this checkout).

Known truth: twelve commits. The 4th makes ownlib.work() noisy (each call 0.8x to 1.2x) without
changing its mean; the 6th breaks the import (its probe fails) and the 7th mends it; the 8th makes
work() 3x slower (4 ms -> 12 ms) and the 11th 3x slower again (36 ms); every other commit only adds
a comment. The bisect must name the 8th and the 11th, never the noisy one, skip the 6th with its
reason, exit 0, and leave HEAD, the index and the work tree as they were. Interrupted, it keeps
what it measured; run again, it reuses it.

The steps that build on each other (interrupted, then whole, then again) are module fixtures, each
run once, so every test runs alone (`-k`) or in any order. The probe only sleeps, so the project
sets fitness limits no foreign load reaches: on a loaded machine these tests still assert.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from repos import add_probe, own_repository, perfkit, sh

HID = "ownlib-work-under-8ms"
FEW = ("--replicates", "2")  # 4 ms against 12 ms of sleep: two processes a commit tell them apart (4 to name one)


@pytest.fixture(scope="module")
def history(tmp_path_factory, installed) -> tuple[Path, list[str]]:
    """A fresh clone of a twelve-commit repository, and its commits' shas, oldest first."""
    origin = own_repository(tmp_path_factory.mktemp("origin") / "ownproject", delay_s=0.004)
    perfkit(origin, installed, "init")
    add_probe(origin)
    sh(origin, "git", "add", "-A")
    sh(origin, "git", "commit", "-q", "--amend", "-m", "ownlib, and a probe of it")
    source = origin / "ownlib" / "__init__.py"
    for n in range(2, 13):
        text = source.read_text()
        if n == 4:  # noisy, the same mean
            text = "import random\n" + text.replace("sleep(0.004)", "sleep(0.004 * random.uniform(0.8, 1.2))")
        elif n == 6:
            text = "raise ImportError('broken on purpose')\n" + text
        elif n == 7:
            text = text.replace("raise ImportError('broken on purpose')\n", "")
        elif n == 8:
            text = text.replace("sleep(0.004 *", "sleep(0.012 *")
        elif n == 11:
            text = text.replace("sleep(0.012 *", "sleep(0.036 *")
        source.write_text(text + f"# comment {n}\n")
        sh(origin, "git", "commit", "-q", "-am", f"commit {n}")
    shas = sh(origin, "git", "log", "--reverse", "--format=%H").stdout.split()
    assert len(shas) == 12
    clone = tmp_path_factory.mktemp("clone") / "ownproject"
    sh(origin.parent, "git", "clone", "-q", str(origin), str(clone))
    return clone, shas


def state(repo: Path) -> tuple[str, str, str, str]:
    return (
        sh(repo, "git", "rev-parse", "HEAD").stdout,
        sh(repo, "git", "status", "--porcelain", "--untracked-files=all", "--ignored=no").stdout,
        sh(repo, "git", "worktree", "list", "--porcelain").stdout,
        sh(repo, "git", "diff", "--cached", "--stat").stdout,
    )


@pytest.fixture(scope="module")
def interrupted(history, installed) -> dict:
    """A first bisect, interrupted (SIGINT) once its two ends were measured and the middle started."""
    repo, shas = history
    before = state(repo)
    earlier = set((repo / "runs" / "bisect").glob("*/bisect.json"))  # another test's bisect may have run first
    env = {k: v for k, v in installed.items() if not k.startswith("_")}
    proc = subprocess.Popen(
        ["perfkit", "bisect", HID, "--good", shas[0], *FEW],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    for line in proc.stderr:  # the two ends measured, the middle started: interrupt it there
        if b"(6 of 12)" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    (record,) = set((repo / "runs" / "bisect").glob("*/bisect.json")) - earlier  # this one's
    return {
        "before": before,
        "after": state(repo),
        "returncode": proc.returncode,
        "stderr": err.decode(),
        "kept": json.loads(record.read_text()),
        "worktrees left": (record.parent / "worktrees").exists(),
    }


@pytest.fixture(scope="module")
def bisected(history, installed, interrupted) -> tuple:
    """The whole bisect after the interrupted one (whose two ends it reuses): (the repository's state
    before it, what it printed)."""
    repo, shas = history
    before = state(repo)
    return before, perfkit(repo, installed, "bisect", HID, "--good", shas[0], *FEW, "--json", check=False)


def test_an_interrupted_bisect_keeps_its_measurements_and_removes_its_worktrees(history, interrupted):
    repo, _ = history
    assert interrupted["returncode"] == 130, interrupted["stderr"][-2000:]
    assert interrupted["after"] == interrupted["before"]  # no worktree left, HEAD, index and work tree as they were
    kept = interrupted["kept"]
    assert kept["verdict"] == "interrupted"
    assert [c["replicates"] for c in kept["commits"] if c["measured"]] == [2, 2]  # the two ends
    assert not interrupted["worktrees left"]


def test_bisect_names_the_8th_and_11th_not_the_noisy_one_skips_the_broken_one_and_leaves_the_repo_alone(
    history, bisected
):
    repo, shas = history
    before, done = bisected
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["verdict"] == "found"
    eighth, eleventh = found["changes"]
    assert (eighth["before"], eighth["after"]) == (shas[6], shas[7])  # the 8th commit, after the 7th
    assert (eleventh["before"], eleventh["after"]) == (shas[9], shas[10])  # and the 11th: two culprits
    assert all(c["decided"] and c["moved"].endswith("x higher") for c in (eighth, eleventh))
    assert shas[3] not in {c[k] for c in found["changes"] for k in ("before", "after")}  # noisy, not blamed
    commits = {c["sha"]: c for c in found["commits"]}
    assert commits[shas[5]]["skipped"].startswith("error: ") and "broken on purpose" in commits[shas[5]]["skipped"]
    assert commits[shas[7]]["verdict"] == "refuted" and commits[shas[6]]["verdict"] == "confirmed"
    assert "[execute]" in done.stderr and "reused" in done.stderr  # the ends, measured before the interrupt
    assert state(repo) == before
    assert (repo / found["folder"] / "bisect.png").stat().st_size > 10_000


def test_a_second_bisect_reuses_every_measurement_and_writes_markdown_for_a_pull_request(history, installed, bisected):
    repo, shas = history
    done = perfkit(repo, installed, "bisect", HID, "--good", shas[0], *FEW, "--md", check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = [line for line in done.stderr.splitlines() if " finished in " in line]
    assert len(ran) >= 6 and all(" 0 executed" in line for line in ran if "1 error" not in line)  # all reused
    assert sum("1 error" in line for line in ran) == 1  # but the broken commit: a failure is tried again
    assert "the ledger is left as it was" in done.stderr and "nothing new was measured" not in done.stderr
    md = done.stdout
    assert md.startswith(f"### perfkit bisect `{HID}`: found where it changed")
    assert f"- {shas[7][:10]} 'commit 8' (after {shas[6][:10]}): " in md
    assert f"- {shas[10][:10]} 'commit 11' (after {shas[9][:10]}): " in md
    assert "| commit | subject | verdict | measured [interval] | replicates |" in md
    assert f"| `{shas[5][:10]}` | commit 6 | skipped | error: " in md


def test_bisect_refuses_what_it_cannot_bisect_before_measuring(history, installed):
    repo, shas = history
    said = perfkit(repo, installed, "bisect", HID, "--good", shas[5], "--bad", shas[2], check=False)
    assert said.returncode == 2 and "is not an ancestor of --bad" in said.stderr
    said = perfkit(repo, installed, "bisect", "no-such-hypothesis", "--good", shas[0], check=False)
    assert said.returncode == 2 and "no-such-hypothesis" in said.stderr
    said = perfkit(repo, installed, "bisect", HID, "--good", "nonsense~3", check=False)
    assert said.returncode == 2 and "'nonsense~3' names no commit" in said.stderr
    said = perfkit(repo, installed, "bisect", HID, check=False)  # the ledger never confirmed it here
    assert said.returncode == 2 and "give --good REV" in said.stderr


def test_probe_from_commit_reads_each_commits_own_record_and_probe(history, installed, bisected):
    repo, shas = history  # the whole bisect measured the 7th and 8th commits with these probe bytes
    done = perfkit(
        repo, installed, "bisect", HID, "--good", shas[6], "--bad", shas[7], "--probe-from", "commit", *FEW, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"culprit: {shas[7][:10]} 'commit 8' (after {shas[6][:10]}): " in done.stdout
    ran = [line for line in done.stderr.splitlines() if " finished in " in line]
    assert len(ran) >= 2 and all(" 0 executed" in line for line in ran)  # the same probe bytes: the same keys


def test_on_a_cluster_several_commits_are_measured_at_once(history, installed):
    repo, shas = history
    done = perfkit(
        repo,
        installed,
        "bisect",
        HID,
        "--good",
        shas[6],
        "--bad",
        shas[9],
        "--cluster",
        "local:2",
        "--jobs",
        "2",
        *FEW,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"culprit: {shas[7][:10]} 'commit 8' (after {shas[6][:10]}): " in done.stdout
    said = [line for line in done.stderr.splitlines() if line.startswith("bisect: ")]
    # the two commits inside the range are asked for together, before either has an answer
    started = [i for i, line in enumerate(said) if line.endswith(", 2 replicates")]
    together = said[started[2]] + said[started[3]]  # two jobs: which of them says so first is a race
    assert "(2 of 4)" in together and "(3 of 4)" in together and started[3] == started[2] + 1
    assert state(repo)[2].count("worktree ") == 1  # the cluster's runs left no worktree behind
