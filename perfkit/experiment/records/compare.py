"""`perfkit diff`'s comparison: what a change did to the ledger, as `asv compare` does for benchmarks.

Compares the standing verdict of every hypothesis (the latest unprofiled measurement, as the
ledger's table shows it) in the working tree's results with those at a git revision (default:
the merge base with the main branch) or in another results folder. Changes come first, in this
order: verdict flips, verdicts that changed because their expectation moved (a floor measured on
the machine moved beyond both its intervals while the measurement itself did not), measurements
that could not be reproduced, hypotheses added, removed or edited, then measurements that moved
beyond both intervals (with the factor); the unchanged come last, collapsed. A measurement "moved"
only when the two 95% intervals are disjoint: a move inside the noise is not news.

The exit status is a CI gate: 1 when a change of a kind named in `fail_on` is present. The changes are
written out by perfkit/experiment/outputs/diff.py (text, markdown) and outputs/junit.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit import units
from perfkit.errors import UserError
from perfkit.experiment.records.history import Entry, attempt, history, standing
from perfkit.experiment.records.results import HypothesisResult, Measured, RunResults, load_all_results
from perfkit.experiment.records.verdict import NOT_MEASURED, UNFIT_REASON
from perfkit.files import read_json
from perfkit.paths import Project, git

#: Kinds of change, in the order a reviewer reads them.
KINDS = (
    "flip",
    "expectation-moved",
    "not-reproduced",
    "added",
    "removed",
    "edited",
    "moved",
    "not-measured",
    "unchanged",
)
#: What `--fail-on` can name: a kind of change, or `refuted` / `error` for a flip to that verdict. A
#: verdict that changed only because its expectation moved is `expectation-moved`, not a flip: the
#: code measured did not change what was measured, the machine changed the floor it is judged against.
FAIL_ON = ("flip", "refuted", "error") + tuple(k for k in KINDS if k not in ("flip", "unchanged"))
DEFAULT_FAIL_ON = ("refuted", "error", "not-reproduced")
MAIN_BRANCHES = ("main", "master")


@dataclass(frozen=True)
class Change:
    id: str
    kind: str  # one of KINDS
    base: HypothesisResult | None
    current: HypothesisResult | None
    base_run: str | None
    current_run: str | None
    factor: float | None = None  # current / base value when the intervals are disjoint (positive quantities)
    shift: float | None = None  # current - base when disjoint and a ratio means nothing (exponents, signs)
    attempt: str | None = None  # a later run that did not measure it: "not measured: machine busy (run X)"
    expectation: str | None = None  # how the floor it is judged against moved: "floor f 27 ms → 9.6 ms [9.1, 10]"

    @property
    def verdict_words(self) -> str:
        before = self.base.verdict if self.base else "—"
        after = self.current.verdict if self.current else "—"
        return after if before == after else f"{before} → {after}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "verdict": {
                "base": self.base.verdict if self.base else None,
                "current": self.current.verdict if self.current else None,
            },
            "measured": {
                "base": self.base.measured.text() if self.base and self.base.measured else None,
                "current": self.current.measured.text() if self.current and self.current.measured else None,
            },
            "runs": {"base": self.base_run, "current": self.current_run},
            "factor": self.factor,
            "shift": self.shift,
            "attempt": self.attempt,
            "expectation": self.expectation,
        }


# ---------------------------------------------------------------- reading the base


def default_base(project: Project) -> str:
    """The merge base with the main branch; on the main branch itself, HEAD (the last commit)."""
    head = git(project.root, "rev-parse", "HEAD").strip()
    for branch in MAIN_BRANCHES:
        for ref in (f"origin/{branch}", branch):
            try:
                base = git(project.root, "merge-base", "HEAD", ref).strip()
            except UserError:
                continue
            return "HEAD" if base == head else base
    return "HEAD"


def results_at(project: Project, revision: str, *, skip: set[str] = frozenset()) -> list[RunResults]:
    """Every results file as committed at `revision` (but those of the run ids in `skip`)."""
    folder = project.relative(project.results_dir)
    prefix = git(project.root, "rev-parse", "--show-prefix").strip()
    git(
        project.root, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"
    )  # a bad revision is the user's error
    try:
        listing = git(project.root, "ls-tree", "--name-only", f"{revision}:{prefix}{folder}")
    except UserError:
        return []  # the revision has no results yet
    out = []
    for name in sorted(n for n in listing.splitlines() if n.endswith(".json") and n[: -len(".json")] not in skip):
        shown = f"{revision}:{folder}/{name}"
        try:
            data = json.loads(git(project.root, "show", f"{revision}:{prefix}{folder}/{name}"))
        except ValueError:
            raise UserError(f"{shown}: not JSON") from None
        out.append(RunResults.from_json(data, shown))
    return out


def results_in(folder: Path) -> list[RunResults]:
    """Every results file in a folder (another checkout's hypotheses/ledger/results)."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder of results")
    return [RunResults.from_json(read_json(p, str(p)), str(p)) for p in sorted(folder.glob("*.json"))]


def load_base(project: Project, base: str | None) -> tuple[str, list[RunResults]]:
    """(how the base is named, its results): a folder path, or a git revision (default: the merge base)."""
    if base is not None and Path(base).is_dir():
        return base, results_in(Path(base))
    revision = base or default_base(project)
    return revision, results_at(project, revision)


# ---------------------------------------------------------------- comparing


def move(base: HypothesisResult, current: HypothesisResult) -> tuple[float | None, float | None]:
    """(factor, shift) of current against base when both intervals exist and do not overlap, else (None, None).

    A factor (current / base) for positive quantities in compatible units; a shift (current - base)
    for exponents and values that can be zero or negative, where a ratio means nothing.
    """
    a, b = base.measured, current.measured
    if a is None or b is None or not comparable(a, b) or identical(a, b):
        return None, None
    value, low, high = in_unit_of(a, b)
    if low <= a.high and high >= a.low:
        return None, None  # the intervals overlap: no move beyond the noise
    if a.label == "exponent" or a.value <= 0 or value <= 0:
        return None, value - a.value
    return value / a.value, None


def alike(base: HypothesisResult, current: HypothesisResult) -> bool:
    """Whether two measurements look the same, not merely not told apart: each one's value lies inside
    the other's interval. Two intervals that overlap only at their edges, or one too wide to tell
    anything, say too little either way (a bisection measures those again before it lets them go)."""
    a, b = base.measured, current.measured
    if a is None or b is None or not comparable(a, b):
        return False
    if identical(a, b):
        return True
    value, low, high = in_unit_of(a, b)
    return a.low <= value <= a.high and low <= a.value <= high


#: two values closer than this, relative to their size, are one value: the rounding of the arithmetic that
#: computed them (a mean of whole tokens summed in another order), far below any measurement's resolution
RESOLUTION = 1e-9


def identical(a: Measured, b: Measured) -> bool:
    """Whether two measured quantities are the same number, down to the rounding of the arithmetic: the
    same tokens accepted per step in both runs is no change, whatever the last bit of a float says."""
    if not comparable(a, b):
        return False
    value, _, _ = in_unit_of(a, b)
    return abs(value - a.value) <= RESOLUTION * max(abs(value), abs(a.value))


def in_unit_of(a: Measured, b: Measured) -> tuple[float, float, float]:
    """b's value, low and high in a's unit (the two comparable)."""
    scale = units.factor(b.unit, a.unit) if a.unit != b.unit else 1.0
    return b.value * scale, b.low * scale, b.high * scale


def comparable(a: Measured, b: Measured) -> bool:
    """Whether two measured quantities are the same quantity (a ratio to a floor is not its milliseconds)."""
    if a.label != b.label:
        return False
    return a.unit == b.unit or bool(a.unit and b.unit and units.dimension(a.unit) == units.dimension(b.unit))


def floor_move(base: HypothesisResult, current: HypothesisResult) -> str | None:
    """How the floor the verdict is judged against moved, when the two floors disagree beyond their intervals.

    'floor verify_floor 27 ms → 9.6 ms [9.1, 10.1] (compute-bound at 0.127 → ...)': the notes follow
    when they differ (they say which bound and, for older records, the rate behind it).
    """
    a, b = base.floor, current.floor
    if a is None or b is None or a.metric != b.metric:
        return None
    if units.dimension(a.unit) != units.dimension(b.unit) or a.overlaps(b):
        return None
    notes = f" ({a.note} → {b.note})" if a.note and b.note and a.note != b.note else ""
    return f"floor {a.metric} {a.text()} → {b.text()}{notes}"


def measurement_moved(base: HypothesisResult, current: HypothesisResult) -> bool:
    """Whether any metric the verdict read (its floor aside) moved beyond both intervals of its summary."""
    floor = base.floor.metric if base.floor else None
    before = {(m.name, repr(m.at)): m for m in base.metrics if m.name != floor}
    for m in current.metrics:
        old = before.get((m.name, repr(m.at)))
        if old is None or None in (old.low, old.high, m.low, m.high) or old.unit != m.unit:
            continue
        if m.low > old.high or m.high < old.low:
            return True
    return False


def move_words(factor: float | None, shift: float | None) -> str:
    """'12% higher', '3.0x lower', '+0.41': how far a measurement moved ('' when within the noise, or when
    it did not move beyond the arithmetic's rounding: never '2.22e-14% higher')."""
    if factor is not None and abs(factor - 1) > RESOLUTION:
        if 0.5 < factor < 2:
            return f"{units.format_number(abs(factor - 1) * 100)}% {'higher' if factor >= 1 else 'lower'}"
        return f"{units.format_factor(factor)} higher" if factor >= 1 else f"{units.format_factor(1 / factor)} lower"
    if shift is not None and factor is None:
        return f"{'+' if shift >= 0 else '-'}{units.format_number(abs(shift))}"
    return ""


def moved_from(base: HypothesisResult, current: HypothesisResult) -> str:
    """How the current measurement stands against the base one, in words: '2.2x higher than 0.258 ms
    [0.226, 0.29]', 'within the noise of 4 ms [3.9, 4.1]', or 'unchanged (8.88 tok, identical)'."""
    a, b = base.measured, current.measured
    if a is not None and b is not None and identical(a, b):
        return f"unchanged ({units.format_quantity(a.value, a.unit)}, identical)"
    moved = move_words(*move(base, current))
    then = a.text() if a is not None else "nothing measured"
    return f"{moved} than {then}" if moved else f"within the noise of {then}"


def _attempt(runs: list[Entry], shown: Entry, base_runs: set[str]) -> str | None:
    """A newer run than the standing measurement that did not measure it (busy, failed, profiled)."""
    latest = runs[-1]
    if latest is shown or latest.run_id in base_runs:
        return None
    why = attempt(latest)
    said = (latest.result.reason or "").removeprefix(f"{UNFIT_REASON}: ").removeprefix(f"{why}: ")
    said = said.removeprefix(f"{NOT_MEASURED}: ")  # the budget's reason says it: it is said once, before `why`
    reason = f": {said}" if said and said != why else ""
    return f"not measured: {why}{reason} (run {latest.run_id}); the standing measurement is kept" if why else None


def compare(base: list[RunResults], current: list[RunResults]) -> list[Change]:
    """Every hypothesis in either, as one Change each, in reading order (KINDS, then id).

    Both sides are their standing (fit) measurements; a later run on the current side that did not
    measure a hypothesis (a busy machine, a failed probe, a profiler) is said as `attempt`, never a flip.
    """
    before = {hid: standing(runs) for hid, runs in history(base).items()}
    current_history = history(current)
    after = {hid: standing(runs) for hid, runs in current_history.items()}
    base_runs = {r.run_id for r in base}
    changes = []
    for hid in sorted(set(before) | set(after)):
        b, a = before.get(hid), after.get(hid)
        br, ar = (b.result if b else None), (a.result if a else None)
        shifted: tuple[float | None, float | None] = (None, None)
        floor = floor_move(br, ar) if br is not None and ar is not None else None
        if br is None:
            kind = "added"
        elif ar is None:
            kind = "removed"
        elif br.verdict != ar.verdict:
            kind = "flip"
            if br.hash == ar.hash and floor and not measurement_moved(br, ar):
                kind = "expectation-moved"
        elif ar.not_reproduced and a.run_id != b.run_id:
            kind = "not-reproduced"
        elif br.hash != ar.hash:
            kind = "edited"
        elif a.run_id != b.run_id and move(br, ar) != (None, None):
            kind = "moved"
        else:
            kind = "unchanged"
        tried = _attempt(current_history[hid], a, base_runs) if a is not None else None
        if kind == "unchanged" and tried:
            kind = "not-measured"
        if br is not None and ar is not None and kind not in ("unchanged", "not-measured"):
            shifted = move(br, ar)
        runs = (b.run_id if b else None, a.run_id if a else None)
        changes.append(Change(hid, kind, br, ar, *runs, *shifted, attempt=tried, expectation=floor))
    return sorted(changes, key=lambda c: (KINDS.index(c.kind), c.id))


def failing(changes: list[Change], fail_on: tuple[str, ...]) -> list[Change]:
    """The changes that make the gate fail."""
    out = []
    for c in changes:
        to = c.current.verdict if c.current else None
        failed_probe = bool(c.attempt and "the probe failed" in c.attempt)  # a broken probe fails `error`
        if (
            c.kind in fail_on
            or (c.kind in ("flip", "added") and to in ("refuted", "error") and to in fail_on)
            or (failed_probe and "error" in fail_on)
        ):
            out.append(c)
    return out


def parse_fail_on(text: str) -> tuple[str, ...]:
    if text.strip() in ("", "none"):
        return ()
    words = tuple(w.strip() for w in text.split(",") if w.strip())
    unknown = [w for w in words if w not in FAIL_ON]
    if unknown:
        raise UserError(f"--fail-on: unknown {', '.join(unknown)}; choose from {', '.join(FAIL_ON)} or none")
    return words


def diff(project: Project, base: str | None) -> tuple[str, list[Change]]:
    """(the base's name, the changes from it to the working tree's results)."""
    name, before = load_base(project, base)
    return name, compare(before, load_all_results(project))
