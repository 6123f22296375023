"""A git merge driver for LEDGER.md: two pull requests that re-judged different hypotheses never conflict.

Results files are named by run id, so merging two branches never conflicts on them: the merge
holds both. LEDGER.md is generated from them, so instead of merging its text the driver renders
it again from the union of the results on both sides (this side's working tree, and the commits
being merged in, which git names in GITHEAD_<sha> while the driver runs). `make` registers it
(.gitattributes: `hypotheses/LEDGER.md merge=perfkit-ledger`):

    git config merge.perfkit-ledger.driver "python -m perfkit.experiment.repo.merge %A %P"
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from perfkit.errors import UserError
from perfkit.experiment.outputs import ledger
from perfkit.experiment.records.compare import results_at
from perfkit.experiment.records.results import RunResults, load_all_results
from perfkit.files import write_atomic
from perfkit.paths import Project, git

_OTHER_SIDE = ("MERGE_HEAD", "REBASE_HEAD", "CHERRY_PICK_HEAD")


def other_sides(root: Path) -> list[str]:
    """The commits being merged in: git names them in GITHEAD_<sha> while a merge driver runs."""
    head = git(root, "rev-parse", "HEAD").strip()
    found = [key[len("GITHEAD_") :] for key in sorted(os.environ) if key.startswith("GITHEAD_")]
    for ref in _OTHER_SIDE:
        try:
            git(root, "rev-parse", "-q", "--verify", ref)
            found.append(ref)
        except UserError:
            continue
    return [ref for ref in dict.fromkeys(found) if ref != head]


def results_of_both_sides(project: Project) -> list[RunResults]:
    """This side's results (the working tree) and the other side's, one per run id."""
    mine = {r.run_id: r for r in load_all_results(project)}
    for ref in other_sides(project.root):
        mine.update((r.run_id, r) for r in results_at(project, ref, skip=set(mine)))
    return [mine[k] for k in sorted(mine)]


def main(argv: list[str]) -> int:
    """`%A %P`: write the merged ledger into %A (git's temporary file for this side's version)."""
    if len(argv) != 2:
        print("usage: python -m perfkit.experiment.repo.merge CURRENT PATH  (git gives %A %P)", file=sys.stderr)
        return 2
    current = Path(argv[0])
    project = Project(Path(argv[1]).resolve().parent.parent)  # %P is <project>/hypotheses/LEDGER.md
    try:
        text = ledger.render(results_of_both_sides(project))
    except Exception as exc:  # leave git's conflict to the user rather than write a wrong ledger
        print(f"perfkit ledger merge: {exc}; merge LEDGER.md by hand, then run `perfkit ledger`", file=sys.stderr)
        return 1
    try:
        write_atomic(current, text)
    except OSError as exc:  # a read-only folder, a full disk: git then reports the conflict
        print(f"perfkit ledger merge: cannot write {current}: {exc.strerror}; merge LEDGER.md by hand", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
