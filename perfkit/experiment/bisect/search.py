"""Where a measurement changed between two commits: a bisection over noisy measurements.

In the spirit of Chromium's Pinpoint, not of a plain binary search (asv find): every commit is
measured in whole processes (replicates), and two commits are told apart only when their
between-replicate intervals do not overlap (perfkit.experiment.records.compare.move). The search keeps
segments whose two ends differ; a commit inside one is measured and compared with both ends:

- it differs from the newer end only: the change lies after it;
- it differs from the older end only: the change lies before it (up to it);
- it differs from both: a change on each side, and both halves are searched (several culprits);
- it differs from neither: it and the ends get more replicates, up to the most allowed, and a
  commit still between the two is reported honestly: "undecided between A and B".

Two adjacent commits that differ name the newer one a culprit, but only once both sides have
twice the replicates the difference was first seen with (at least twice the first) and still
differ: with three processes an interval is itself noisy, and one drawn narrow by chance would
otherwise blame a commit that changed nothing.

The same holds the other way round: where a segment is cut, a neighbouring pair that is not told
apart is let go as "no change" only once each one's value lies inside the other's interval, or
both have twice the first replicates. Otherwise one interval drawn wide by chance, or by a
neighbour's load, would hide a second culprit behind the first (Pinpoint's "unknown": more
attempts, not "the same").

A commit that cannot be measured (its probe fails, its record is missing, the machine was busy)
is skipped with its reason, and a neighbour is measured instead. Nothing here does I/O: the caller's
`measure(index, replicates)` does, and is asked again with more replicates (its cache keeps the
earlier ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from perfkit.experiment.records.compare import alike, move, move_words
from perfkit.experiment.records.results import HypothesisResult
from perfkit.experiment.records.verdict import UNFIT_REASON


@dataclass(frozen=True)
class Point:
    """One commit measured: its result, or why it could not be."""

    replicates: int
    result: HypothesisResult | None = None
    skipped: str | None = None  # why this commit says nothing (an error, a busy machine, no record)
    run_id: str | None = None

    @property
    def usable(self) -> bool:
        return self.skipped is None and self.result is not None and self.result.measured is not None


def point(replicates: int, result: HypothesisResult | None, run_id: str | None = None) -> Point:
    """A measured commit, skipped when its verdict is no evidence (an error, nothing measured, a busy machine)."""
    if result is None:
        return Point(replicates, None, "nothing measured", run_id)
    if result.verdict == "error":
        return Point(replicates, result, f"error: {result.reason}", run_id)
    if result.measured is None:
        return Point(replicates, result, f"{result.verdict}: {result.reason or 'nothing measured'}", run_id)
    if (result.reason or "").startswith(UNFIT_REASON):
        return Point(replicates, result, result.reason, run_id)
    return Point(replicates, result, None, run_id)


@dataclass(frozen=True)
class Change:
    """Where the measurement moved: between `before` and `after` (indices into the commits)."""

    before: int
    after: int
    moved: str  # '3.0x higher', or why it is not one commit
    decided: bool  # True: adjacent commits that differ; False: "undecided between" them


@dataclass
class Outcome:
    points: dict[int, Point] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    verdict: str = "running"  # then "found", "no change", "undecided" or "unmeasured" ("interrupted": stopped)
    words: str = ""


Measure = Callable[[int, int], Point]


def differ(a: Point, b: Point) -> bool:
    """Two commits told apart: both measured, in comparable quantities, with intervals that do not overlap."""
    if not (a.usable and b.usable):
        return False
    factor, shift = move(a.result, b.result)
    return factor is not None or shift is not None


def let_go(a: Point, b: Point, confirm: int) -> bool:
    """Two neighbours in a chain, not told apart, that need no more replicates: alike (each value inside
    the other's interval), or both already measured with the replicates a culprit is confirmed with."""
    if min(a.replicates, b.replicates) >= confirm:
        return True
    return a.usable and b.usable and alike(a.result, b.result)


def moved_words(a: Point, b: Point) -> str:
    """How far the measurement moved from a to b: '3.0x higher', '+0.41'."""
    factor, shift = move(a.result, b.result)
    return move_words(factor, shift) or "within the noise"


class Search:
    """The bisection: `run()` measures the ends, then splits segments whose ends differ.

    `at_once` commits are measured together (`many`, on a cluster): the two ends, then up
    to `at_once` commits spread evenly inside a segment, which is cut where neighbours differ.
    """

    def __init__(self, count: int, measure: Measure, *, first: int, most: int, at_once: int = 1, many=None):
        if count < 2:
            raise ValueError("a bisection needs two commits")
        self.count, self.measure, self.first, self.most = count, measure, first, max(first, most)
        self.confirm = min(self.most, 2 * first)  # replicates each side of a culprit has before it is named
        self.at_once, self.many = max(1, at_once), many
        self.out = Outcome()

    def ensure(self, wanted: dict[int, int]) -> None:
        """Each commit measured with at least its wanted replicates; those missing measured together."""
        todo = []
        for index, replicates in wanted.items():
            have = self.out.points.get(index)
            if have is None or (have.usable and have.replicates < replicates):
                todo.append((index, replicates))
        if len(todo) > 1 and self.many is not None:
            found = self.many(todo)
        else:
            found = [self.measure(i, r) for i, r in todo]
        self.out.points.update({i: p for (i, _), p in zip(todo, found)})

    def at(self, index: int, replicates: int | None = None) -> Point:
        """Commit `index` measured with at least `replicates` (the first count by default)."""
        self.ensure({index: replicates or self.first})
        return self.out.points[index]

    def grow(self, *indices: int, upto: int | None = None) -> bool:
        """More replicates for each commit below `upto` (the most by default): double, capped; False when
        none could grow."""
        upto = upto or self.most
        wanted = {}
        for i in indices:
            have = self.out.points[i]
            if have.usable and have.replicates < upto:
                wanted[i] = min(upto, have.replicates * 2)
        self.ensure(wanted)
        return bool(wanted)

    def run(self) -> Outcome:
        last = self.count - 1
        self.ensure({0: self.first, last: self.first})
        old, new = self.at(0), self.at(last)
        if not (old.usable and new.usable):
            which = "good" if not old.usable else "bad"
            self.out.verdict = "unmeasured"
            self.out.words = f"the {which} end could not be measured: {(old if not old.usable else new).skipped}"
            return self.out
        while not differ(self.at(0), self.at(last)):
            if not self.grow(0, last):
                self.out.verdict = "no change"
                ends = (self.at(i).result.measured.text(level=True) for i in (0, last))
                self.out.words = (
                    f"the two ends cannot be told apart with {self.most} replicates each ({' and '.join(ends)})"
                )
                return self.out
        segments = [(0, last)]
        while segments:
            segments = self.split(*segments.pop()) + segments
        self.out.changes.sort(key=lambda c: c.before)
        decided = bool(self.out.changes) and all(c.decided for c in self.out.changes)
        self.out.verdict = "found" if decided else "undecided"
        self.out.words = _summary(self.out.changes) or (
            "the ends differ, yet no two adjacent commits could be told apart: a change spread over several commits?"
        )
        return self.out

    def split(self, a: int, b: int) -> list[tuple[int, int]]:
        """The segments of (a, b) still to search, b's measurement differing from a's."""
        if b == a + 1:  # a culprit is named only if the two still differ with twice the replicates it was seen with
            seen = min(self.at(a).replicates, self.at(b).replicates)
            enough = min(self.most, max(self.confirm, 2 * seen))
            while min(self.at(a).replicates, self.at(b).replicates) < enough or not differ(self.at(a), self.at(b)):
                if not self.grow(a, b):
                    return []  # the difference that led here did not hold up: not a change after all
            self.out.changes.append(Change(a, b, moved_words(self.at(a), self.at(b)), True))
            return []
        inside = self.pick(a, b)
        if not inside:  # every commit between could not be measured
            self.out.changes.append(Change(a, b, _skipped_words(self.out.points, a, b), False))
            return []
        chain = [a, *inside, b]
        while True:
            pairs = list(zip(chain, chain[1:]))
            cut = [(x, y) for x, y in pairs if differ(self.at(x), self.at(y))]
            if cut:  # a pair not told apart is let go only once it looks alike, or has the confirming replicates
                unsure = {
                    i
                    for x, y in pairs
                    if (x, y) not in cut and not let_go(self.at(x), self.at(y), self.confirm)
                    for i in (x, y)
                }
                if unsure and self.grow(*sorted(unsure), upto=self.confirm):
                    continue
                return cut
            if not self.grow(*chain):
                shown = ", ".join(self.at(i).result.measured.text(level=True) for i in inside)
                words = f"{shown} cannot be told from either end with {self.most} replicates"
                self.out.changes.append(Change(a, b, words, False))
                return []

    def pick(self, a: int, b: int) -> list[int]:
        """Up to `at_once` measurable commits strictly between a and b, spread evenly (one: nearest the
        middle); a commit that cannot be measured gives way to its nearest neighbour. [] when none can."""
        k = min(self.at_once, b - a - 1)
        targets = sorted({a + (b - a) * j // (k + 1) if k > 1 else int((a + b) / 2) for j in range(1, k + 1)})
        targets = [t for t in targets if a < t < b]
        self.ensure({t: self.first for t in targets})
        chosen = [t for t in targets if self.at(t).usable]
        if chosen:
            return chosen
        middle = (a + b) / 2
        for i in sorted(range(a + 1, b), key=lambda i: (abs(i - middle), i)):
            if self.at(i).usable:
                return [i]
        return []


def _skipped_words(points: dict[int, Point], a: int, b: int) -> str:
    skipped = [f"#{i}: {points[i].skipped}" for i in range(a + 1, b) if i in points]
    return "the commits between could not be measured (" + "; ".join(skipped) + ")"


def _summary(changes: list[Change]) -> str:
    found = sum(c.decided for c in changes)
    open_ = len(changes) - found
    parts = []
    if found:
        parts.append(f"{found} change{'s' if found != 1 else ''} found")
    if open_:
        parts.append(f"{open_} undecided")
    return ", ".join(parts)


def search(count: int, measure: Measure, *, first: int, most: int, at_once: int = 1, many=None) -> Outcome:
    """Bisect `count` commits (0: the good end, count - 1: the bad end) with `measure(index, replicates)`
    (or `many([(index, replicates), ...])` for several at once)."""
    return Search(count, measure, first=first, most=most, at_once=at_once, many=many).run()
