"""The replicate policy: how many processes a run measures, with how many samples each, when it adds
more, and at what confidence.

Everything that decides "how many replicates, and when more?" is here:
- the first round is planned from what the ledger knows (`plan`): a hypothesis whose standing fit
  measurement (its record unchanged since) decided far from its bound gets the minimum, `first`
  replicates; one near its bound gets up front the replicates its forecast asks for (the stored spread
  of its unit estimates, at the first look's level, `MARGIN` to spare), up to `most`; one too close to
  its bound to decide within `most` gets the minimum (it is said so); with nothing known, a pilot of
  `first`. A record may let perfkit choose sample counts (`probe.samples: {repeat: [10, 80]}`): the
  plan then picks the split of processes and samples that decides soonest for the seconds it costs,
  from the measured share of the variance that lies between processes and the set-up cost of a
  process against the cost of a sample (the nested design's optimum, searched over the range);
- a time budget (`--budget`, QUICK_BUDGET_S by default with --quick) bounds the whole run's
  measuring, the first round included (`afford`): what it cannot pay for is left out, cheapest
  decisions first in, and says what it would have needed;
- after judging, an inconclusive verdict whose interval straddles an edge gets a forecast (`forecast`,
  from perfkit.stats.replicates_to_decide); the run grows those executions toward it (`grow`), up to
  `most`, within the budget left, and looks again, at most MORE_LOOKS more times;
- the 5% a verdict may be wrong is spent over its looks by a spending function fixed before any data
  (`confidence`): FIRST_SHARE of it at the first look, the rest in proportion to the replicates added
  towards `most`, each later look's level computed from the correlation of the looks
  (stats.sequential_levels, Lan-DeMets) rather than split as if they were independent;
- `stopped` says, per hypothesis, why the run added no more.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from perfkit import stats, units
from perfkit.experiment.records.verdict import UNFIT_REASON, Judgement, Verdict

#: independent kernel processes per execution when neither the command nor the record says
DEFAULT_REPLICATES = {"quick": 3, "full": 5}
GROWTH = 3  # --max-replicates by default: this many times the first count
MORE_LOOKS = 2  # times a run may add replicates to verdicts the first look left undecided
FIRST_SHARE = 0.9  # of the 5% error rate, what the first look spends when the run may look again
QUICK_BUDGET_S = 285.0  # --quick's default --budget: the whole run within 5 minutes, with 15 s to spare
#: how likely a plan decides a hypothesis, as the budget weighs a decision: one decided last time far from
#: its bound at the minimum, one whose forecast asks more (its interval straddled), a pilot of one never
#: measured, one too close to its bound to decide at all
ODDS = {"decided": 1.0, "forecast": 0.5, "pilot": 0.5, "on its bound": 0.0}
MARGIN = 0.8  # a plan asks for an interval this share of the distance to the edge: the stored spread is itself noisy


@dataclass(frozen=True)
class Ask:
    """What a planned first round asks, per execution key and hypothesis (`Policy.fit` fits it in the budget)."""

    wanted: dict[str, int]  # replicates the forecasts ask for
    have: dict[str, int]  # the fewest planned (or already measured by an earlier run)
    needs: dict[str, tuple[str, ...]]  # hypothesis id -> the execution keys it reads
    seconds: dict[str, float]  # a replicate of each, forecast (0: reused)
    decides: dict[str, float]  # hypothesis id -> the odds the plan decides it (Choice.odds)


class _Round:
    """A first round being fitted in a budget (`Policy.fit`): what is kept, left out, and what it costs."""

    def __init__(self, ask: Ask, budget_s: float):
        self.ask, self.budget_s = ask, budget_s
        self.counts = dict(ask.have)
        self.kept = dict(ask.needs)
        self.left_out: dict[str, float] = {}

    def total(self) -> float:
        return sum(n * self.ask.seconds[k] for k, n in self.counts.items())

    def drop(self, dropped: str) -> None:
        """Leave out an execution, every hypothesis that reads it, and what only they read."""
        ask = self.ask
        for hid in [h for h, keys in self.kept.items() if dropped in keys]:
            self.left_out[hid] = sum(ask.have[k] * ask.seconds[k] for k in ask.needs[hid])
            del self.kept[hid]
        for k in list(self.counts):
            if self.counts[k] and not any(k in keys for keys in self.kept.values()):
                self.counts[k] = 0

    def worth(self, k: str) -> tuple[float, float]:
        """(decisions per second of what deciding costs, minus seconds): the first to leave out sorts first.
        A decision whose replicates alone would not fit in the budget counts for none."""
        ask = self.ask
        spend = ask.wanted[k] * ask.seconds[k]
        decisions = sum(ask.decides.get(h, 0.0) for h, keys in self.kept.items() if k in keys)
        return (decisions if spend <= self.budget_s else 0) / max(spend, 1e-9), -self.counts[k] * ask.seconds[k]

    def deciding(self) -> float:
        """The minimum of every execution kept, and what deciding asks where it can decide."""
        ask = self.ask
        return sum((ask.wanted[k] if self.worth(k)[0] > 0 else n) * ask.seconds[k] for k, n in self.counts.items())

    def leave_out_what_decides_nothing(self) -> None:
        """While the round and its growth do not fit: executions none of whose readers decide, dearest first."""
        seconds = self.ask.seconds
        for k in sorted(self.counts, key=lambda k: (-self.counts[k] * seconds[k], k)):
            if self.deciding() <= self.budget_s:
                return
            if self.counts[k] and seconds[k] > 0 and self.worth(k)[0] == 0:
                self.drop(k)

    def leave_out_until_the_minimum_fits(self) -> None:
        """While the minimum does not fit: the fewest decisions per second first."""
        seconds = self.ask.seconds
        while self.total() > self.budget_s and self.kept:
            live = {k for keys in self.kept.values() for k in keys if self.counts[k] and seconds[k] > 0}
            if not live:
                return
            self.drop(min(live, key=lambda k: (*self.worth(k), k)))

    def take_back_what_fits(self) -> None:
        """What was left out early and fits once dearer ones left: measured after all, cheapest first."""
        ask = self.ask
        for hid in sorted(self.left_out, key=lambda h: (self.left_out[h], h)):
            more = sum(ask.have[k] * ask.seconds[k] for k in ask.needs[hid] if not self.counts[k])
            if self.total() + more <= self.budget_s:
                self.kept[hid] = ask.needs[hid]
                for k in ask.needs[hid]:
                    self.counts[k] = ask.have[k]
                del self.left_out[hid]


@dataclass(frozen=True)
class Policy:
    first: int  # the fewest replicates planned per execution
    most: int  # the most a run may grow an execution to
    budget_s: float | None = None  # the run's wall-clock seconds for all of its measuring

    @property
    def looks(self) -> int:
        """How many times the run may judge the evidence (each look after the first adds replicates)."""
        return 1 + (MORE_LOOKS if self.most > self.first and self.budget_s != 0 else 0)

    def spent(self, fractions: Sequence[float]) -> list[float]:
        """The error spent by each look, at these shares of `most` replicates: FIRST_SHARE of the 5% at
        the first, then the rest in proportion to the replicates added; all of it at `most`."""
        alpha = 1.0 - stats.CONFIDENCE
        t1 = fractions[0]
        if self.looks == 1 or t1 >= 1.0:
            return [alpha for _ in fractions]
        return [alpha * (FIRST_SHARE + (1.0 - FIRST_SHARE) * min(1.0, (t - t1) / (1.0 - t1))) for t in fractions]

    def confidence(self, counts: Sequence[int] = ()) -> float:
        """The level a verdict is judged at when its replicates at each look so far were `counts` (the
        last: now); with none given, the first look's. Fixed by the spending function before any data."""
        if self.looks == 1:
            return stats.CONFIDENCE
        if len(counts) < 2:
            return 1.0 - self.spent([min(1.0, (counts[0] if counts else self.first) / self.most)])[0]
        fractions = tuple(min(1.0, n / self.most) for n in counts)
        return _levels(fractions, tuple(self.spent(fractions)))[-1]

    def fit(self, ask: Ask, budget_s: float | None) -> tuple[dict[str, int], dict[str, float], dict[str, float]]:
        """The first round that fits in `budget_s`: (replicates per execution key, hypotheses left out with
        the seconds their minimum would have needed, hypotheses measured at the minimum for want of the
        seconds their forecast asked for).

        The minimum (`ask.have`) of every execution is measured if it fits, and what the forecasts ask
        beyond it where they say it decides. When that does not fit, executions none of whose readers
        would decide are left out first, the dearest first; when the minimum still does not fit, the rest
        by the fewest decisions per second, executions left out whole with every hypothesis that reads
        them. One left out early comes back if it fits once a dearer one left. What is left pays for the
        replicates the forecasts ask for, the cheapest decision first (`afford`).
        """
        if budget_s is None:
            return dict(ask.wanted), {}, {}
        round_ = _Round(ask, budget_s)
        round_.leave_out_what_decides_nothing()
        round_.leave_out_until_the_minimum_fits()
        round_.take_back_what_fits()
        if not round_.kept:
            return round_.counts, round_.left_out, {}
        live = {k for keys in round_.kept.values() for k in keys}
        grown = {k: (ask.wanted[k] if k in live else n) for k, n in round_.counts.items()}
        afforded, short = self.afford(grown, round_.counts, round_.kept, ask.seconds, budget_s - round_.total())
        return afforded, round_.left_out, short

    def afford(
        self,
        grown: dict[str, int],
        have: dict[str, int],
        needs: dict[str, tuple[str, ...]],
        seconds: dict[str, float],
        left_s: float,
        free: dict[str, int] | None = None,
    ) -> tuple[dict[str, int], dict[str, float]]:
        """The part of `grown` that fits in `left_s`: hypothesis by hypothesis, cheapest first.

        `seconds` is each execution key's forecast wall seconds per replicate (as executions run at
        once, already divided). `free`: per key, the replicates an earlier run measured with this very
        key, which are reused and cost nothing (a second run of unchanged code looks again as the first
        did, never cut short by a budget its reused replicates do not spend). Returns the counts to run
        and, for each hypothesis whose replicates do not fit, the seconds they would have needed.
        """
        counts, spent, left_out = dict(have), 0.0, {}
        free = free or {}

        def cost(hid: str) -> float:
            return sum(max(0, grown[k] - max(counts[k], free.get(k, 0))) * seconds.get(k, 0.0) for k in needs[hid])

        wanting = [hid for hid, keys in needs.items() if any(grown[k] > have[k] for k in keys)]
        for hid in sorted(wanting, key=lambda h: (cost(h), h)):
            more = cost(hid)
            if spent + more > left_s:
                left_out[hid] = more
                continue
            spent += more
            for k in needs[hid]:
                counts[k] = max(counts[k], grown[k])
        return counts, left_out

    def grow(
        self, replicates: dict[str, int], needs: dict[str, tuple[str, ...]], judged: dict[str, Judgement]
    ) -> dict[str, int] | None:
        """More replicates (execution key -> count) where more would likely decide a hypothesis's verdict.

        `needs` maps each hypothesis id to the execution keys it reads; None: nothing to add.
        """
        counts = dict(replicates)
        for hid, judgement in judged.items():
            needed = judgement.needed
            if judgement.verdict is not Verdict.INCONCLUSIVE or needed is None:
                continue
            for key in needs[hid]:
                counts[key] = max(counts[key], min(self.most, max(needed, counts[key] + 1)))
        return None if counts == replicates else counts

    def stopped(self, judgement: Judgement, ran_counts: list[int], out_of_time: float | None = None) -> str:
        """Why no more replicates were run for a hypothesis whose executions ran `ran_counts` replicates.

        `out_of_time`: the seconds its next replicates would have needed when the budget left too few.
        """
        counts = sorted(set(ran_counts))
        ran = "/".join(str(n) for n in counts)
        j = judgement
        if j.verdict in (Verdict.CONFIRMED, Verdict.REFUTED):
            return f"decided at {ran} replicates"
        if j.verdict is Verdict.ERROR:
            return f"the probe failed; {ran} ran"
        if j.reason and j.reason.startswith(UNFIT_REASON):
            return f"the machine was busy; {ran} ran"
        if j.needed is None:
            return f"more replicates would not decide it; {ran} ran"
        if out_of_time is not None:
            return (
                f"the time budget ran out (--budget {self.budget_s:g} s; its next replicates needed about "
                f"{out_of_time:.0f} s); {ran} ran"
            )
        if self.budget_s == 0 and self.most > self.first:
            return f"{ran} replicates planned; --budget 0 adds none"
        if max(counts) < self.most:
            return f"{ran} replicates after {MORE_LOOKS} looks added more; --max-replicates allows {self.most}"
        if self.most <= self.first:
            return f"{ran} replicates planned; --max-replicates would let the run add more"
        return f"reached --max-replicates ({self.most})"


@functools.lru_cache(maxsize=256)
def _levels(fractions: tuple[float, ...], spent: tuple[float, ...]) -> list[float]:
    """stats.sequential_levels, once per design: a run judges many hypotheses at the same looks."""
    return stats.sequential_levels(fractions, spent)


def policy(*, quick: bool, replicates: int | None, max_replicates: int | None, budget_s: float | None = None) -> Policy:
    """The run's policy from its options (`--quick`, `--replicates`, `--max-replicates`, `--budget`)."""
    first = replicates or DEFAULT_REPLICATES["quick" if quick else "full"]
    budget = QUICK_BUDGET_S if budget_s is None and quick else budget_s
    most = first * GROWTH if max_replicates is None else max(max_replicates, first)
    return Policy(first=first, most=most, budget_s=budget)


def forecast(est: stats.Estimate, edges: list[float]) -> tuple[str, int | None]:
    """Why an interval straddling `edges` is undecided, and the replicates that would likely decide it."""
    why = f"the interval straddles {units.format_number(edges[0])}"
    forecasts = [stats.replicates_to_decide(est, e) for e in edges]
    needed = None if None in forecasts else max(forecasts)
    if needed is None:
        return f"{why}: too close to it to decide at this noise", None
    if est.replicates == 1:
        return f"{why}: one process cannot decide it; about {needed} replicates would", needed
    return f"{why}: about {needed} replicates would likely decide it ({est.replicates} ran)", needed


# ---------------------------------------------------------------- the first round, planned


@dataclass(frozen=True)
class Known:
    """What the ledger knows of a hypothesis: its standing fit measurement, its record unchanged since."""

    run_id: str
    verdict: str
    value: float
    spread: float  # standard deviation of its unit estimates (log scale when `log`)
    log: bool
    replicates: int
    edges: tuple[float | None, float | None]  # the (at least, at most) the claim compares it with
    between: float = 0.5  # share of a replicate estimate's variance that lies between processes
    counts: dict[str, int] = field(default_factory=dict)  # the sample counts it was measured with
    measurements: int = 1  # how many latest measurements `value` is the median of


@dataclass(frozen=True)
class Cost:
    """What one replicate of an execution cost when it was last measured: its set-up, then its measuring."""

    setup_s: float
    measure_s: float
    counts: dict[str, int] = field(default_factory=dict)  # the sample counts it was measured with

    def at(self, counts: dict[str, int]) -> float:
        """Seconds a replicate takes with these sample counts: its measuring in proportion to them."""
        if not self.counts:
            return self.setup_s + self.measure_s
        ratios = [counts.get(name, n) / n for name, n in self.counts.items() if n > 0]
        return self.setup_s + self.measure_s * (sum(ratios) / len(ratios) if ratios else 1.0)


@dataclass(frozen=True)
class Choice:
    """A hypothesis's part of the first round: replicates, sample counts, their cost and why."""

    replicates: int
    counts: dict[str, int]
    seconds: float  # its executions' replicates, in all
    why: str
    decides: bool  # the forecast says this decides it (False: a pilot, or too close to its bound)
    odds: float = 0.0  # how likely the plan decides it, as the budget weighs it (ODDS)


def edges_to_clear(value: float, edges: tuple[float | None, float | None]) -> list[float]:
    """The edges an interval around `value` must clear to decide (as `kinds.base.bounds` reads them)."""
    at_least, at_most = edges
    if at_least is not None and value < at_least:
        return [at_least]
    if at_most is not None and value > at_most:
        return [at_most]
    return [e for e in (at_least, at_most) if e is not None]


def _distance(known: Known, edge: float) -> float | None:
    if known.log:
        return abs(math.log(known.value / edge)) if known.value > 0 and edge > 0 else None
    return abs(known.value - edge)


def _sample_grid(ranges: dict[str, tuple[int, int]], base: dict[str, int]) -> list[dict[str, int]]:
    """Candidate sample counts: every range scaled together by factors from its low to its high end."""
    if not ranges:
        return [{}]
    factors = {1.0}
    for name, (low, high) in ranges.items():
        start = base.get(name, low)
        steps = 12
        factors |= {(low * (high / low) ** (i / steps)) / start for i in range(steps + 1)}
    out = []
    for f in sorted(factors):
        counts = {n: min(hi, max(lo, round(base.get(n, lo) * f))) for n, (lo, hi) in ranges.items()}
        if counts not in out:
            out.append(counts)
    return out


def pilot_counts(ranges: dict[str, tuple[int, int]], given: dict[str, int]) -> dict[str, int]:
    """The sample counts a hypothesis with no measurement starts from: the record's own, else mid-range."""
    return {n: given.get(n) or round(math.sqrt(lo * hi)) for n, (lo, hi) in ranges.items()}


def replicates_for(known: Known, spread: float, confidence: float, *, first: int, most: int) -> int | None:
    """The fewest replicates (from `first` to `most`) whose interval at this spread clears every edge
    with MARGIN to spare; None when even `most` would not."""
    distances = [_distance(known, e) for e in edges_to_clear(known.value, known.edges)]
    if not distances or any(d is None or d <= 0 for d in distances):
        return None
    for r in range(max(first, 2), most + 1):
        if stats.t_quantile(0.5 + confidence / 2.0, r - 1) * spread / math.sqrt(r) < MARGIN * min(distances):
            return r
    return None


def choose(
    policy: Policy,
    known: Known | None,
    costs: list[Cost],
    *,
    ranges: dict[str, tuple[int, int]],
    given: dict[str, int],
    confidence: float,
) -> Choice:
    """The replicates and sample counts that decide a hypothesis in the fewest seconds, by its forecast.

    `costs`: a replicate of each execution it reads, as last measured (empty: unknown). A unit
    estimate's variance is the between-process part plus the within part, which shrinks as 1/n with
    the sample count n; a replicate costs its set-up plus n samples. So where processes differ little
    and set-up is dear, more samples per process decide soonest; where they differ, more processes.
    """
    pilot = pilot_counts(ranges, given)

    def seconds(counts: dict[str, int], r: int) -> float:
        return r * sum(c.at(counts) for c in costs)

    if known is None or not math.isfinite(known.spread):
        return Choice(
            policy.first, pilot, seconds(pilot, policy.first), "a pilot: the ledger has no measurement of it yet", False
        )
    base = {n: known.counts.get(n, pilot[n]) for n in ranges}
    best: tuple[float, int, dict[str, int]] | None = None
    for counts in _sample_grid(ranges, base):
        scale = sum(base[n] / counts[n] for n in ranges) / len(ranges) if ranges else 1.0  # n0 / n
        spread = known.spread * math.sqrt(known.between + (1.0 - known.between) * scale)
        r = replicates_for(known, spread, confidence, first=policy.first, most=policy.most)
        if r is not None and (best is None or (seconds(counts, r), -r) < (best[0], -best[1])):
            best = (seconds(counts, r), r, counts)
    shown = units.format_number(known.value)
    if known.measurements > 1:  # the forecast's value is not the last run's alone: say whose it is
        shown = f"median {shown} of the {known.measurements} latest measurements"
    if best is None:
        cheapest = {n: lo for n, (lo, _) in ranges.items()}
        edge = ", ".join(units.format_number(e) for e in edges_to_clear(known.value, known.edges))
        return Choice(
            policy.first,
            cheapest,
            seconds(cheapest, policy.first),
            f"{shown} sits too close to {edge} to decide within {policy.most} replicates; the minimum",
            False,
            ODDS["on its bound"],
        )
    cost, r, counts = best
    if known.verdict in (Verdict.CONFIRMED.value, Verdict.REFUTED.value):
        why = f"{known.verdict} last run at {known.replicates} ({shown})"
    else:
        edge = ", ".join(units.format_number(e) for e in edges_to_clear(known.value, known.edges))
        why = f"last interval straddled {edge} ({shown} measured at {known.replicates})"
    decided = known.verdict in (Verdict.CONFIRMED.value, Verdict.REFUTED.value) and r <= max(
        policy.first, known.replicates
    )
    return Choice(r, counts, cost, why, True, ODDS["decided" if decided else "forecast"])
